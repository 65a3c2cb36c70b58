//! WebSocket turns' records in module mode (`responses_core::metadata::record`): the one
//! ledger the sockets file their turns' records in and the filter on the record's route takes
//! them from. The socket and that filter are different streams, on different listeners (the
//! client's, the internal one the record loops back through), each with its own filter config:
//! the ledger is the module's, process-wide, as the drain is (`crate::drain`).

use std::sync::LazyLock;
use std::time::Duration;

use responses_core::metadata::record::Ledger;

/// The records filed and not taken yet.
pub static RECORDS: LazyLock<Ledger> = LazyLock::new(Ledger::default);

/// How long a record's callout may take: Envoy answers it itself (a direct 204).
pub const RECORD_TIMEOUT: Duration = Duration::from_secs(10);
