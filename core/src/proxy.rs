//! What an adapter inside an HTTP proxy changes around an exchange, as plain data: the header
//! edits of each step, the names its replies carry, and its summary as metadata.
//!
//! The driver ([`crate::driver`]) hands the edits to both Envoy adapters (the ext_proc service
//! and the in-process module) with its actions; each applies them in its own form (protobuf
//! mutations, ABI calls), so the rules are written once. Nothing here does I/O.

use std::borrow::Cow;

use crate::exchange::{
    self, AbortStep, Answer, Exchange, Outcome, Settings, Summary, UpstreamRequest,
};
use crate::openresponses::ErrorCode;
use crate::request_encoding;

/// The namespace of the exchange's dynamic metadata in Envoy (docs/operations.md): the
/// access log and the token rate limit read it by this name.
pub const METADATA_NAMESPACE: &str = "responses_extproc";

/// Envoy's response code details of a reply to a request we refused: they name us in its
/// access logs and let its `local_reply_config` tell our envelopes from Envoy's own replies.
pub const DETAILS_REQUEST: &str = "responses_extproc_invalid_request";
/// The details of an error envelope in place of an upstream's answer.
pub const DETAILS_ANSWER: &str = "responses_extproc_upstream_error";

/// One edit of a header map. Owned, so that the driver's actions do not borrow it; the names
/// and values are static but for the configured ones (the model header, the Chat path) and the
/// lengths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderEdit {
    /// Replace every value of the header with this one.
    Set(Cow<'static, str>, Cow<'static, str>),
    Remove(&'static str),
}

/// Header edits, in order: a fixed set, or one made for the step.
pub type Edits = Cow<'static, [HeaderEdit]>;

/// A header set to a static value.
const fn set(name: &'static str, value: &'static str) -> HeaderEdit {
    Set(Cow::Borrowed(name), Cow::Borrowed(value))
}

use HeaderEdit::{Remove, Set};

/// The request head of an exchange that is ours: the upstream must answer in plain bytes we
/// can parse.
pub const REQUEST_HEAD_EDITS: &[HeaderEdit] = &[Remove("accept-encoding")];

/// The request head once the body is translated: the Chat path (the route is computed again:
/// adapters clear Envoy's route cache), the new body's type and length (plain: a compressed
/// body was decoded by the exchange), the model for routes.
pub fn forward_edits(settings: &Settings, up: &UpstreamRequest) -> [HeaderEdit; 5] {
    [
        Set(
            Cow::Borrowed(":path"),
            Cow::Owned(settings.chat_path.clone()),
        ),
        set("content-type", exchange::JSON),
        Set(
            Cow::Borrowed("content-length"),
            Cow::Owned(up.body.len().to_string()),
        ),
        Remove(request_encoding::HEADER),
        Set(
            Cow::Owned(settings.model_header.clone()),
            Cow::Owned(up.model.clone()),
        ),
    ]
}

/// The answer's head when a stream is translated as it comes (`HeadStep::Stream`), or when a
/// stream without a body is replaced whole (an event stream [`Answer`]): a translated answer
/// is a 200 whatever 2xx the upstream chose.
pub const STREAM_HEAD_EDITS: &[HeaderEdit] = &[
    set(":status", "200"),
    set("content-type", exchange::EVENT_STREAM),
    set("cache-control", "no-cache"),
    Remove("content-length"),
];

/// The answer's head while its body is gathered (`HeadStep::Gather`): the length changes.
pub const GATHER_HEAD_EDITS: &[HeaderEdit] = &[Remove("content-length")];

/// The answer's head when a translated answer replaces the upstream's whole: a stream's
/// ([`STREAM_HEAD_EDITS`]), or the answer's status (200, whatever 2xx the upstream chose),
/// type and length.
pub fn answer_edits(a: &Answer) -> Edits {
    if a.content_type == exchange::EVENT_STREAM {
        return Cow::Borrowed(STREAM_HEAD_EDITS);
    }
    Cow::Owned(vec![
        Set(Cow::Borrowed(":status"), Cow::Owned(a.status.to_string())),
        set("content-type", a.content_type),
        Set(
            Cow::Borrowed("content-length"),
            Cow::Owned(a.body.len().to_string()),
        ),
    ])
}

/// How an exchange ends after a panic in it: whatever can still be sent.
pub fn abort_after_panic(ex: &mut Exchange, now: u64) -> AbortStep {
    ex.abort(
        ErrorCode::InternalError,
        "responses-extproc failed while translating this exchange.",
        now,
    )
}

/// The name of an outcome in metadata and logs.
pub fn outcome_name(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Open => "open",
        Outcome::Translated => "translated",
        Outcome::Failed => "failed",
    }
}

/// The outcome label of an exchange in metrics, once it is recorded: `cut` for one still open
/// (Envoy ended it first: client gone, upstream reset, a timeout).
pub fn recorded_outcome(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Open => "cut",
        other => outcome_name(other),
    }
}

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
        ("outcome", Str(outcome_name(s.outcome).to_owned())),
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
    fields
}
