//! What an adapter inside an HTTP proxy changes around an exchange, as plain data: the header
//! edits of each step, the names its replies carry, and its summary as metadata.
//!
//! Both Envoy adapters (the ext_proc service and the in-process module) apply these, each in
//! its own form (protobuf mutations, ABI calls), so the rules are written once. Nothing here
//! does I/O.

use std::borrow::Cow;

use crate::exchange::{
    self, AbortStep, Exchange, Outcome, Reply, Settings, Summary, UpstreamRequest,
};
use crate::openresponses::{ErrorCode, Usage};

/// The namespace of the exchange's dynamic metadata in Envoy (docs/operations.md): the
/// access log and the token rate limit read it by this name.
pub const METADATA_NAMESPACE: &str = "responses_extproc";

/// Envoy's response code details of a reply to a request we refused: they name us in its
/// access logs and let its `local_reply_config` tell our envelopes from Envoy's own replies.
pub const DETAILS_REQUEST: &str = "responses_extproc_invalid_request";
/// The details of an error envelope in place of an upstream's answer.
pub const DETAILS_ANSWER: &str = "responses_extproc_upstream_error";

/// One edit of a header map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderEdit<'a> {
    /// Replace every value of the header with this one.
    Set(&'a str, Cow<'a, str>),
    Remove(&'a str),
}

use HeaderEdit::{Remove, Set};

/// The request head of an exchange that is ours: the upstream must answer in plain bytes we
/// can parse.
pub fn request_head_edits() -> [HeaderEdit<'static>; 1] {
    [Remove("accept-encoding")]
}

/// The request head once the body is translated: the Chat path (the route is computed again:
/// adapters clear Envoy's route cache), the new body's type and length, the model for routes.
pub fn forward_edits<'a>(settings: &'a Settings, up: &UpstreamRequest) -> [HeaderEdit<'a>; 4] {
    [
        Set(":path", Cow::Borrowed(&settings.chat_path)),
        Set("content-type", Cow::Borrowed(exchange::JSON)),
        Set("content-length", Cow::Owned(up.body.len().to_string())),
        Set(&settings.model_header, Cow::Owned(up.model.clone())),
    ]
}

/// The answer's head when a stream is translated as it comes (`HeadStep::Stream`), or when a
/// stream without a body is replaced whole (a translated `HeadStep::Reply`): a translated
/// answer is a 200 whatever 2xx the upstream chose.
pub fn stream_head_edits() -> [HeaderEdit<'static>; 4] {
    [
        Set(":status", Cow::Borrowed("200")),
        Set("content-type", Cow::Borrowed(exchange::EVENT_STREAM)),
        Set("cache-control", Cow::Borrowed("no-cache")),
        Remove("content-length"),
    ]
}

/// The answer's head while its body is gathered (`HeadStep::Gather`): the length changes.
pub fn gather_head_edits() -> [HeaderEdit<'static>; 1] {
    [Remove("content-length")]
}

/// The answer's head when a gathered answer is replaced by its translation (its status is the
/// reply's, 200, whatever 2xx the upstream chose).
pub fn translated_reply_edits(r: &Reply) -> [HeaderEdit<'static>; 3] {
    [
        Set(":status", Cow::Owned(r.status.to_string())),
        Set("content-type", Cow::Borrowed(r.content_type)),
        Set("content-length", Cow::Owned(r.body.len().to_string())),
    ]
}

/// How an adapter ends an exchange after a panic in it: whatever can still be sent.
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

/// The token counts of an exchange's usage, by the label metrics give them.
pub fn token_counts(u: &Usage) -> [(&'static str, u64); 4] {
    [
        ("input", u.input_tokens),
        ("output", u.output_tokens),
        ("cached", u.input_tokens_details.cached_tokens),
        ("reasoning", u.output_tokens_details.reasoning_tokens),
    ]
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
