//! An exchange's summary as Envoy's dynamic metadata (docs/operations.md): what the access
//! log and the token rate limit read, written once for both Envoy adapters; a WebSocket
//! turn's the same, with its socket's id, on a request of its own ([`record`]).

use crate::exchange::Summary;

/// The namespace of the exchange's dynamic metadata in Envoy (docs/operations.md): the
/// access log and the token rate limit read it by this name.
pub const METADATA_NAMESPACE: &str = "responses_extproc";

/// A value of Envoy's dynamic metadata.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataValue {
    Str(String),
    Num(f64),
    Bool(bool),
}

/// An exchange's summary as dynamic metadata (under [`METADATA_NAMESPACE`]): operation,
/// stream, outcome, ids, models, status, error code and token counts.
pub fn metadata(s: &Summary) -> Vec<(&'static str, MetadataValue)> {
    use MetadataValue::{Bool, Num, Str};
    let mut fields = vec![
        ("operation", Str(s.operation.as_str().to_owned())),
        ("stream", Bool(s.stream)),
        ("outcome", Str(s.outcome.as_str().to_owned())),
    ];
    let text = |v: &Option<String>| v.clone().map(Str);
    for (key, value) in [
        ("response_id", text(&s.response_id)),
        ("model", text(&s.model)),
        ("upstream_model", text(&s.upstream_model)),
        (
            "error_code",
            s.error_code.as_ref().map(|c| Str(c.to_string())),
        ),
        ("status", s.status.map(|n| Num(f64::from(n)))),
    ] {
        if let Some(v) = value {
            fields.push((key, v));
        }
    }
    if let Some(u) = &s.usage {
        // u64 token counts as JSON numbers (f64): exact up to 2^53.
        for (key, n) in [
            ("input_tokens", u.input_tokens),
            ("output_tokens", u.output_tokens),
            ("total_tokens", u.total_tokens),
            ("cached_tokens", u.input_tokens_details.cached_tokens),
            ("reasoning_tokens", u.output_tokens_details.reasoning_tokens),
        ] {
            fields.push((key, Num(n as f64)));
        }
    }
    // An automatic compaction: how it went, the estimate that crossed the threshold, its
    // summarising request's tokens (also counted in the token counts above).
    if let Some(c) = &s.compaction {
        fields.push(("compaction", Str(c.outcome.as_str().to_owned())));
        fields.push(("compaction_estimated_tokens", Num(c.estimate as f64)));
        if let Some(u) = &c.usage {
            fields.push(("compaction_input_tokens", Num(u.input_tokens as f64)));
            fields.push(("compaction_output_tokens", Num(u.output_tokens as f64)));
        }
    }
    fields
}

/// Key of a WebSocket turn's socket: the upgrade's `x-request-id`, the same on each of the
/// socket's turns.
pub const SOCKET_ID: &str = "socket_id";

/// A WebSocket turn's summary as dynamic metadata: [`metadata`]'s keys, and the socket's id
/// ([`SOCKET_ID`]) that groups a socket's turns.
pub fn turn(s: &Summary, socket_id: &str) -> Vec<(&'static str, MetadataValue)> {
    let mut fields = metadata(s);
    fields.push((SOCKET_ID, MetadataValue::Str(socket_id.to_owned())));
    fields
}

pub mod record;
