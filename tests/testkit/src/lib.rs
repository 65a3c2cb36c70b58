//! What the tests of every layer check the translation's output against, in one place:
//!
//! * [`stream_rules`]: the rules every translated event stream obeys;
//! * [`answers`]: the fail-closed rule for whatever a client may see (an envelope, a translated
//!   answer, translated events), which the module's fake Envoy applies to every exchange;
//! * [`schema`]: validation against the official OpenResponses OpenAPI document
//!   (`tests/fixtures/openresponses/openapi.json`);
//! * [`json`]: the JSON reader every body and event goes through, which refuses duplicate keys;
//! * [`sse`]: SSE body parsing.
//!
//! Used by the core's suites (`core/tests/`), the end-to-end harness (`tests/common/`) and the
//! module's fake Envoy (`module/src/fake.rs`, feature `testkit`); never by a production build.

pub mod answers;
pub mod json;
pub mod schema;
pub mod sse;
pub mod stream_rules;

use std::path::{Path, PathBuf};

/// The repository root (two floors above `tests/testkit/`): the fixtures are shared.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("tests/testkit/ is inside the repository")
        .to_path_buf()
}
