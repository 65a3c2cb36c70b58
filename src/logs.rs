//! The core's log lines (`responses_core::log`) as `tracing` events: one call site per level,
//! every field of a line (absent ones are left out), so that the text and the JSON formats
//! carry the same fields for every transport.

use responses_core::log::{Level, Line, Logged};

/// Emits `line`; `request_id`: the client's `x-request-id` (escaped and cut like every client
/// string).
pub fn emit(line: &Line<'_>, transport: &'static str, request_id: &str) {
    let request_id = Logged(request_id);
    macro_rules! event {
        ($level:expr) => {
            tracing::event!(
                $level,
                transport,
                request_id = %request_id,
                response_id = line.response_id,
                model = line.model.map(tracing::field::display),
                operation = line.operation,
                stream = line.stream,
                outcome = line.outcome,
                status = line.status,
                code = line.code,
                body_bytes = line.body_bytes,
                "{}",
                line.message
            )
        };
    }
    match line.level {
        Level::Debug => event!(tracing::Level::DEBUG),
        Level::Info => event!(tracing::Level::INFO),
        Level::Warn => event!(tracing::Level::WARN),
    }
}
