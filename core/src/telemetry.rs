//! What an exchange's span says, as plain data: its name, its attributes and its event, as the
//! OpenTelemetry GenAI semantic conventions name them (docs/operations.md, "Traces").
//!
//! Written once, here, for every adapter: the processor turns these into OpenTelemetry
//! attributes on a span of its own (`src/traces`), the in-process module into tags on Envoy's
//! span for the request (`module/`, Envoy's tags are strings: [`Value::text`]). No tracing
//! library here: keys, typed values and the rules that pick them.
//!
//! Prompts and completions are never among these attributes.

use std::borrow::Cow;

use crate::exchange::{Compaction, Outcome, Summary};
use crate::life::{CallTiming, Timing};

/// `gen_ai.operation.name`: a Responses request is answered by a chat completion.
pub const OPERATION: &str = "chat";
/// `gen_ai.provider.name`: the upstream speaks OpenAI's Chat Completions (the conventions'
/// "best knowledge" of the instrumentation; `gen_ai.response.model` tells the actual model).
pub const PROVIDER: &str = "openai";
/// The span event at the first output sent to the client.
pub const FIRST_TOKEN_EVENT: &str = "first_token";
/// The span event of an automatic compaction's summarising call, at its end (the processor's
/// span: stamped at its start, with [`call_attributes`]).
pub const COMPACTION_EVENT: &str = "compaction";

/// The attribute keys.
pub mod key {
    pub const OPERATION_NAME: &str = "gen_ai.operation.name";
    pub const PROVIDER_NAME: &str = "gen_ai.provider.name";
    pub const REQUEST_MODEL: &str = "gen_ai.request.model";
    pub const REQUEST_STREAM: &str = "gen_ai.request.stream";
    pub const TEMPERATURE: &str = "gen_ai.request.temperature";
    pub const TOP_P: &str = "gen_ai.request.top_p";
    pub const PRESENCE_PENALTY: &str = "gen_ai.request.presence_penalty";
    pub const FREQUENCY_PENALTY: &str = "gen_ai.request.frequency_penalty";
    pub const MAX_TOKENS: &str = "gen_ai.request.max_tokens";
    pub const RESPONSE_ID: &str = "gen_ai.response.id";
    pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
    pub const FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    pub const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    pub const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    pub const CACHED_TOKENS: &str = "gen_ai.usage.cache_read.input_tokens";
    pub const REASONING_TOKENS: &str = "gen_ai.usage.reasoning.output_tokens";
    pub const TIME_TO_FIRST_CHUNK: &str = "gen_ai.response.time_to_first_chunk";
    pub const STATUS_CODE: &str = "http.response.status_code";
    pub const ERROR_TYPE: &str = "error.type";
    pub const OUTCOME: &str = "responses_extproc.outcome";
    pub const OPERATION: &str = "responses_extproc.operation";
    pub const TRANSPORT: &str = "responses_extproc.transport";
    pub const TRANSLATION_DURATION: &str = "responses_extproc.translation.duration";
    pub const COMPACTION_OUTCOME: &str = "responses_extproc.compaction.outcome";
    pub const COMPACTION_ESTIMATE: &str = "responses_extproc.compaction.estimated_tokens";
    pub const COMPACTION_THRESHOLD: &str = "responses_extproc.compaction.threshold";
    pub const COMPACTION_INPUT_TOKENS: &str = "responses_extproc.compaction.input_tokens";
    pub const COMPACTION_OUTPUT_TOKENS: &str = "responses_extproc.compaction.output_tokens";
    pub const COMPACTION_DURATION: &str = "responses_extproc.compaction.duration";
}

/// An attribute's value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Str(&'a str),
    Bool(bool),
    Int(i64),
    F64(f64),
    /// An array of strings (`gen_ai.response.finish_reasons`).
    Strs(&'a [String]),
}

impl Value<'_> {
    /// The value as text, for tracers whose tags are strings (Envoy's): numbers in decimal,
    /// booleans as `true`/`false`, an array as a JSON array (OpenTelemetry's rule for
    /// exporters without arrays).
    pub fn text(&self) -> Cow<'_, str> {
        match *self {
            Value::Str(s) => Cow::Borrowed(s),
            Value::Bool(b) => Cow::Borrowed(if b { "true" } else { "false" }),
            Value::Int(n) => Cow::Owned(n.to_string()),
            Value::F64(x) => Cow::Owned(x.to_string()),
            Value::Strs(items) => {
                Cow::Owned(serde_json::to_string(items).unwrap_or_else(|_| "[]".to_owned()))
            }
        }
    }
}

/// One attribute of the span.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attribute<'a> {
    pub key: &'static str,
    pub value: Value<'a>,
}

fn attr<'a>(key: &'static str, value: Value<'a>) -> Attribute<'a> {
    Attribute { key, value }
}

/// Which adapter served the exchange (`responses_extproc.transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// The processor, over Envoy's ext_proc.
    ExtProc,
    /// The processor's WebSocket transport.
    WebSocket,
    /// The in-process module, inside Envoy.
    Module,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::ExtProc => "ext_proc",
            Transport::WebSocket => "websocket",
            Transport::Module => "module",
        }
    }
}

/// The span's name: `chat {model}`, or `chat` when the request was refused before its model
/// was read.
pub fn span_name(s: &Summary) -> Cow<'static, str> {
    match &s.model {
        Some(model) => Cow::Owned(format!("{OPERATION} {model}")),
        None => Cow::Borrowed(OPERATION),
    }
}

/// OTLP integers are signed 64-bit.
fn int(n: u64) -> Value<'static> {
    Value::Int(i64::try_from(n).unwrap_or(i64::MAX))
}

/// The span's attributes for what the exchange reported (the table in docs/operations.md,
/// less the transport and the processor's opt-in bodies).
pub fn attributes<'a>(s: &'a Summary, timing: &Timing) -> Vec<Attribute<'a>> {
    let mut a = Vec::with_capacity(24);
    a.push(attr(key::OPERATION_NAME, Value::Str(OPERATION)));
    a.push(attr(key::PROVIDER_NAME, Value::Str(PROVIDER)));
    a.push(attr(key::OPERATION, Value::Str(s.operation.as_str())));
    if let Some(model) = &s.model {
        a.push(attr(key::REQUEST_MODEL, Value::Str(model)));
        a.push(attr(key::REQUEST_STREAM, Value::Bool(s.stream)));
    }
    let p = &s.params;
    for (key, value) in [
        (key::TEMPERATURE, p.temperature),
        (key::TOP_P, p.top_p),
        (key::PRESENCE_PENALTY, p.presence_penalty),
        (key::FREQUENCY_PENALTY, p.frequency_penalty),
    ] {
        if let Some(v) = value {
            a.push(attr(key, Value::F64(v)));
        }
    }
    if let Some(n) = p.max_output_tokens {
        a.push(attr(key::MAX_TOKENS, int(n)));
    }
    if let Some(id) = &s.response_id {
        a.push(attr(key::RESPONSE_ID, Value::Str(id)));
    }
    if let Some(model) = &s.upstream_model {
        a.push(attr(key::RESPONSE_MODEL, Value::Str(model)));
    }
    if let Some(reason) = &s.finish_reason {
        a.push(attr(
            key::FINISH_REASONS,
            Value::Strs(std::slice::from_ref(reason)),
        ));
    }
    if let Some(u) = &s.usage {
        a.push(attr(key::INPUT_TOKENS, int(u.input_tokens)));
        a.push(attr(key::OUTPUT_TOKENS, int(u.output_tokens)));
        a.push(attr(
            key::CACHED_TOKENS,
            int(u.input_tokens_details.cached_tokens),
        ));
        a.push(attr(
            key::REASONING_TOKENS,
            int(u.output_tokens_details.reasoning_tokens),
        ));
    }
    if let Some(first) = timing.first_output {
        a.push(attr(
            key::TIME_TO_FIRST_CHUNK,
            Value::F64(first.as_secs_f64()),
        ));
    }
    if let Some(status) = s.status {
        a.push(attr(key::STATUS_CODE, Value::Int(i64::from(status))));
    }
    a.push(attr(key::OUTCOME, Value::Str(s.outcome.recorded())));
    if let Some(error) = error_type(s) {
        a.push(attr(key::ERROR_TYPE, Value::Str(error)));
    }
    a.push(attr(
        key::TRANSLATION_DURATION,
        Value::F64(timing.translation.as_secs_f64()),
    ));
    if let Some(c) = &s.compaction {
        a.extend(compaction_attributes(c));
    }
    a
}

/// An automatic compaction's attributes (on the span, and on its event): its outcome, the
/// estimate that crossed the threshold, its summarising request's tokens.
fn compaction_attributes(c: &Compaction) -> Vec<Attribute<'static>> {
    let mut a = vec![
        attr(key::COMPACTION_OUTCOME, Value::Str(c.outcome.recorded())),
        attr(key::COMPACTION_ESTIMATE, int(c.estimate)),
        attr(key::COMPACTION_THRESHOLD, int(c.threshold)),
    ];
    if let Some(u) = &c.usage {
        a.push(attr(key::COMPACTION_INPUT_TOKENS, int(u.input_tokens)));
        a.push(attr(key::COMPACTION_OUTPUT_TOKENS, int(u.output_tokens)));
    }
    a
}

/// The attributes of [`COMPACTION_EVENT`]: the call's duration, and the compaction's.
pub fn call_attributes(timing: &CallTiming) -> Vec<Attribute<'static>> {
    let mut a = vec![attr(
        key::COMPACTION_DURATION,
        Value::F64(timing.took.as_secs_f64()),
    )];
    if let Some(c) = &timing.compaction {
        a.extend(compaction_attributes(c));
    }
    a
}

/// `error.type` of an exchange that did not end translated: its error code, `_OTHER` (the
/// conventions' fallback) when it has none, `cut` when Envoy ended it first.
pub fn error_type(s: &Summary) -> Option<&str> {
    match (s.outcome, &s.error_code) {
        (Outcome::Translated, _) => None,
        (Outcome::Failed, Some(code)) => Some(code.as_str()),
        (Outcome::Failed, None) => Some("_OTHER"),
        (Outcome::Open, _) => Some("cut"),
    }
}

/// The span of a message refused before it became an exchange (a WebSocket message that is
/// not a valid `response.create`): its status and error code only.
pub fn refused_attributes(status: u16, code: &str) -> [Attribute<'_>; 5] {
    [
        attr(key::OPERATION_NAME, Value::Str(OPERATION)),
        attr(key::PROVIDER_NAME, Value::Str(PROVIDER)),
        attr(key::STATUS_CODE, Value::Int(i64::from(status))),
        attr(key::OUTCOME, Value::Str(Outcome::Failed.recorded())),
        attr(key::ERROR_TYPE, Value::Str(code)),
    ]
}

/// W3C's `traceparent` for a span a host knows by its ids (lowercase hex: 32 for the trace, 16
/// for the span, neither all zeros), sampled: the header a call carries so that the spans made
/// for it are the span's children. `None` for ids of another form (another tracer's).
pub fn traceparent(trace_id: &str, span_id: &str) -> Option<String> {
    let hex = |id: &str, len: usize| {
        id.len() == len
            && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
            && id.bytes().any(|b| b != b'0')
    };
    (hex(trace_id, 32) && hex(span_id, 16)).then(|| format!("00-{trace_id}-{span_id}-01"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exchange::Operation;
    use crate::openresponses::Usage;
    use crate::translate::Params;
    use std::time::Duration;

    #[test]
    fn a_traceparent_is_made_of_w3c_ids_only() {
        let trace = "0af7651916cd43dd8448eb211c80319c";
        assert_eq!(
            traceparent(trace, "b7ad6b7169203331").as_deref(),
            Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        );
        for (t, s) in [
            (trace, "b7ad6b716920333"),
            (trace, "B7AD6B7169203331"),
            (trace, "0000000000000000"),
            ("0".repeat(32).as_str(), "b7ad6b7169203331"),
            ("123", "b7ad6b7169203331"),
        ] {
            assert_eq!(traceparent(t, s), None, "{t} {s}");
        }
    }

    fn get<'a>(a: &'a [Attribute<'a>], key: &str) -> Option<Value<'a>> {
        a.iter().find(|kv| kv.key == key).map(|kv| kv.value)
    }

    fn summary() -> Summary {
        let mut usage = Usage {
            input_tokens: 21,
            output_tokens: 9,
            total_tokens: 30,
            ..Usage::default()
        };
        usage.input_tokens_details.cached_tokens = 16;
        usage.output_tokens_details.reasoning_tokens = 4;
        Summary {
            operation: Operation::Create,
            response_id: Some("resp_1".into()),
            model: Some("m".into()),
            stream: true,
            outcome: Outcome::Translated,
            status: Some(200),
            error_code: None,
            usage: Some(usage),
            upstream_model: Some("llama".into()),
            finish_reason: Some("length".into()),
            params: Params {
                temperature: Some(0.5),
                max_output_tokens: Some(64),
                ..Params::default()
            },
            streamed_output: true,
            compaction: None,
        }
    }

    #[test]
    fn attributes_carry_what_the_exchange_reported() {
        let s = summary();
        let timing = Timing {
            total: Duration::from_millis(900),
            first_output: Some(Duration::from_millis(250)),
            translation: Duration::from_micros(40),
        };
        let a = attributes(&s, &timing);
        assert_eq!(get(&a, key::REQUEST_MODEL), Some(Value::Str("m")));
        assert_eq!(get(&a, key::REQUEST_STREAM), Some(Value::Bool(true)));
        assert_eq!(get(&a, key::RESPONSE_MODEL), Some(Value::Str("llama")));
        assert_eq!(get(&a, key::RESPONSE_ID), Some(Value::Str("resp_1")));
        assert_eq!(get(&a, key::INPUT_TOKENS), Some(Value::Int(21)));
        assert_eq!(get(&a, key::OUTPUT_TOKENS), Some(Value::Int(9)));
        assert_eq!(get(&a, key::CACHED_TOKENS), Some(Value::Int(16)));
        assert_eq!(get(&a, key::REASONING_TOKENS), Some(Value::Int(4)));
        assert_eq!(
            get(&a, key::FINISH_REASONS),
            Some(Value::Strs(&["length".to_owned()]))
        );
        assert_eq!(get(&a, key::TEMPERATURE), Some(Value::F64(0.5)));
        assert_eq!(get(&a, key::MAX_TOKENS), Some(Value::Int(64)));
        // Parameters the request did not set are absent, not their defaults.
        assert_eq!(get(&a, key::TOP_P), None);
        assert_eq!(get(&a, key::TIME_TO_FIRST_CHUNK), Some(Value::F64(0.25)));
        assert_eq!(
            get(&a, key::TRANSLATION_DURATION),
            Some(Value::F64(0.00004))
        );
        assert_eq!(get(&a, key::STATUS_CODE), Some(Value::Int(200)));
        assert_eq!(get(&a, key::ERROR_TYPE), None);
        assert_eq!(get(&a, key::OUTCOME), Some(Value::Str("translated")));
        assert_eq!(span_name(&s), "chat m");
        // Each key once.
        let mut keys: Vec<_> = a.iter().map(|kv| kv.key).collect();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), a.len());
    }

    #[test]
    fn failures_and_cuts_have_an_error_type() {
        let mut s = Summary {
            operation: Operation::Create,
            response_id: None,
            model: None,
            stream: false,
            outcome: Outcome::Failed,
            status: Some(400),
            error_code: Some(crate::openresponses::ErrorCode::InvalidJson.into()),
            usage: None,
            upstream_model: None,
            finish_reason: None,
            params: Params::default(),
            streamed_output: false,
            compaction: None,
        };
        let a = attributes(&s, &Timing::default());
        assert_eq!(get(&a, key::ERROR_TYPE), Some(Value::Str("invalid_json")));
        assert_eq!(get(&a, key::STATUS_CODE), Some(Value::Int(400)));
        assert_eq!(get(&a, key::OUTCOME), Some(Value::Str("failed")));
        // No model read: no model attributes, and no stream flag to speak of.
        assert_eq!(get(&a, key::REQUEST_MODEL), None);
        assert_eq!(get(&a, key::REQUEST_STREAM), None);
        assert_eq!(span_name(&s), "chat");
        s.error_code = None;
        let a = attributes(&s, &Timing::default());
        assert_eq!(get(&a, key::ERROR_TYPE), Some(Value::Str("_OTHER")));
        s.outcome = Outcome::Open;
        let a = attributes(&s, &Timing::default());
        assert_eq!(get(&a, key::ERROR_TYPE), Some(Value::Str("cut")));
        assert_eq!(get(&a, key::OUTCOME), Some(Value::Str("cut")));
        let refused = refused_attributes(400, "invalid_request");
        assert_eq!(
            get(&refused, key::ERROR_TYPE),
            Some(Value::Str("invalid_request"))
        );
        assert_eq!(get(&refused, key::OUTCOME), Some(Value::Str("failed")));
    }

    #[test]
    fn values_as_text() {
        assert_eq!(Value::Str("a b").text(), "a b");
        assert_eq!(Value::Bool(false).text(), "false");
        assert_eq!(Value::Int(-3).text(), "-3");
        assert_eq!(Value::F64(0.25).text(), "0.25");
        assert_eq!(Value::F64(1.0).text(), "1");
        assert_eq!(
            Value::Strs(&["stop".to_owned(), "a\"b".to_owned()]).text(),
            r#"["stop","a\"b"]"#
        );
    }
}
