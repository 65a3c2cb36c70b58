//! What an upstream's failure tells the client: one mapping, from the upstream's status,
//! headers and body (or an error object inside its Chat stream) to the OpenResponses error.
//!
//! Clients act on what an error says: the OpenAI SDKs back off for as long as `retry-after`
//! / `retry-after-ms` say, Codex and agent frameworks compact or trim on
//! `context_length_exceeded`, a user fixes a name on `model_not_found`. Model servers say
//! these things each their own way (tests/fixtures/upstream_errors/ records them, with their
//! sources); this module says them OpenAI's way:
//!
//! - a context overflow, from any server, is 400 `invalid_request_error`
//!   `context_length_exceeded` (`param: "input"`), the upstream's message kept, and its token
//!   counts where it gave them as fields (llama.cpp's `n_prompt_tokens`, `n_ctx`);
//! - every other failure gets a word code: the upstream's own when it is one (bounded: a
//!   short lowercase identifier), else one by status, never a bare number;
//! - the headers a client needs to retry (`retry-after`, `retry-after-ms`, `x-ratelimit-*`)
//!   are kept ([`kept_headers`]); nothing else of the upstream's head is.
//!
//! No I/O, no state: the exchange calls [`classify`] for answers and the stream translator
//! [`classify_stream`] for error frames.

use serde_json::Value;

use crate::openresponses::{ApiError, Code, ContextTokens, ErrorCode};

/// Why a call the core asked for brought no whole answer: one type for the calls of every
/// machine (an exchange's compaction, a connection's turns), each reported by its `CallId` (`crate::call`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFailure<'m> {
    /// No answer, or not all of it (refused, reset, a read error): `message` says what, for
    /// the client.
    Failed(&'m str),
    /// The answer's head had no `:status` ([`AnswerHead::status`]): it is no answer, and the
    /// host resets the call.
    NoStatus,
    /// The call's deadline passed: the core's own timer (its machine's `handle_timeout`), or
    /// a host's transport that gave up on time.
    TimedOut,
}

impl CallFailure<'_> {
    /// What the client is told of it.
    pub fn message(&self) -> &str {
        match self {
            CallFailure::Failed(message) => message,
            CallFailure::NoStatus => "The upstream's answer had no status: the call was reset.",
            CallFailure::TimedOut => "The upstream did not answer in time.",
        }
    }
}

/// The head of a call's answer as a host reports it to the machine that made the call (the
/// driver or a connection): its status, a lookup of its headers by lowercase name, and every
/// header, read only of an answer that is not a success (the error made of it keeps some, see
/// [`kept_headers`]).
#[derive(Clone, Copy)]
pub struct ReportedHead<'a, 'h> {
    pub status: u16,
    pub header: &'a dyn Fn(&str) -> Option<&'h str>,
    pub every: &'a dyn Fn() -> Vec<(&'h str, &'h str)>,
}

impl<'h> ReportedHead<'_, 'h> {
    /// Its `content-type` (empty when it has none).
    pub fn content_type(&self) -> &'h str {
        (self.header)("content-type").unwrap_or_default()
    }
}

/// The head of a call's answer as a host hands it over: its headers as name-value pairs, in
/// whatever case the host keeps them.
#[derive(Debug, Clone, Copy)]
pub struct AnswerHead<'h>(pub &'h [(&'h str, &'h str)]);

impl<'h> AnswerHead<'h> {
    /// A header by its lowercase name.
    pub fn header(&self, name: &str) -> Option<&'h str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }

    /// Its `:status`. A host always gives one: an answer without one (or with one that is no
    /// number) is no answer ([`CallFailure::NoStatus`]).
    pub fn status(&self) -> Result<u16, CallFailure<'static>> {
        self.header(":status")
            .and_then(|s| s.parse().ok())
            .ok_or(CallFailure::NoStatus)
    }

    /// Every header, for the error made of an answer that is not a success.
    pub fn every(&self) -> impl Iterator<Item = (&'h str, &'h str)> + 'h {
        self.0.iter().copied()
    }

    /// `report` given this head as a machine takes it, with its `status`.
    pub fn report<R>(&self, status: u16, report: impl FnOnce(ReportedHead) -> R) -> R {
        let header = |name: &str| self.header(name);
        let every = || self.every().collect();
        report(ReportedHead {
            status,
            header: &header,
            every: &every,
        })
    }
}

/// Response headers kept on a translated error, by exact (lowercase) name.
pub const KEPT_HEADERS: [&str; 2] = ["retry-after", "retry-after-ms"];
/// Response headers kept on a translated error, by (lowercase) prefix: OpenAI's
/// `x-ratelimit-limit-requests`, `-remaining-tokens`, `-reset-requests`, ... and the same
/// names from proxies (LiteLLM) and Envoy's own rate limit filters.
pub const KEPT_HEADER_PREFIX: &str = "x-ratelimit-";
/// At most this many headers are kept, each value at most [`MAX_KEPT_VALUE`] bytes: a
/// misbehaving upstream cannot make the error reply large.
pub const MAX_KEPT_HEADERS: usize = 16;
pub const MAX_KEPT_VALUE: usize = 256;

/// The longest upstream code kept as is (longer ones are replaced by the status's code).
pub const MAX_WORD: usize = 64;

/// A response header an upstream's error keeps for the client (name lowercase).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptHeader {
    pub name: String,
    pub value: String,
}

impl KeptHeader {
    pub fn new(name: &str, value: &str) -> Self {
        KeptHeader {
            name: name.to_owned(),
            value: value.to_owned(),
        }
    }
}

/// Whether the headers of an answer with this status are read for the error made of it: it
/// is not a success (a success's rate-limit headers, which OpenAI sends on every answer, are
/// not read at all).
pub fn keeps_headers(status: u16) -> bool {
    !(200..300).contains(&status)
}

/// Whether a response header (lowercase name) is kept on a translated error.
pub fn is_kept_header(name: &str) -> bool {
    KEPT_HEADERS.contains(&name) || name.starts_with(KEPT_HEADER_PREFIX)
}

/// The headers of an upstream answer's head that its translated error keeps, in order
/// (names lowercased; bounded by [`MAX_KEPT_HEADERS`] and [`MAX_KEPT_VALUE`]).
pub fn kept_headers<'h>(headers: impl IntoIterator<Item = (&'h str, &'h str)>) -> Vec<KeptHeader> {
    headers
        .into_iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim()))
        .filter(|(name, value)| {
            is_kept_header(name) && !value.is_empty() && value.len() <= MAX_KEPT_VALUE
        })
        .take(MAX_KEPT_HEADERS)
        .map(|(name, value)| KeptHeader {
            name,
            value: value.to_owned(),
        })
        .collect()
}

/// Maps a non-success answer (the upstream's, or an Envoy reply in its place) to the client's
/// error. The status class is kept (4xx stay 4xx, 429 stays 429, 5xx stay 5xx, anything
/// else is 502), except a context overflow, which is always 400, and a 424. The headers it
/// keeps are [`kept_headers`]' of the same answer.
pub fn classify(status: u16, body: &[u8]) -> ApiError {
    let status = match status {
        // Failed Dependency: TGI's failure while generating (a shard down, out of memory). The
        // server failed, not the request: a 500, which SDKs retry as they retry OpenAI's own.
        424 => 500,
        400..=599 => status,
        _ => 502,
    };
    let json = serde_json::from_slice::<Value>(body).ok();
    let fields = json.as_ref().map(Fields::of).unwrap_or_default();
    let message = fields
        .message
        .clone()
        .unwrap_or_else(|| plain_message(status, body));
    if overflow_status(status) && fields.is_context_overflow() {
        let mut error = context_overflow(message);
        error.tokens = fields.tokens();
        return error;
    }
    let code = fields
        .word_code()
        .unwrap_or_else(|| status_code(status, fields.is_error(), &message).into());
    let mut error = ApiError::server(status, code, message);
    error.param = fields.param;
    error
}

/// An error object the upstream sent inside a Chat stream (`data: {"error": ...}`, after its
/// 200): the code and message of the stream's `response.failed`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamFailure {
    pub code: Code,
    pub message: String,
}

/// The status a stream folded into one JSON answer fails with: the failure is the request's
/// (400) for a context overflow, else the upstream's (502).
pub fn folded_status(code: &Code) -> u16 {
    if *code == ErrorCode::ContextLengthExceeded {
        400
    } else {
        502
    }
}

/// Maps the `error` member of a stream frame (an object, or a bare message) to the stream's
/// failure, with the same rules as [`classify`]: a context overflow is
/// `context_length_exceeded`, a numeric code (vLLM and llama.cpp put the HTTP status there)
/// becomes the word of that status, a word code is kept.
pub fn classify_stream(error: &Value) -> StreamFailure {
    let fields = Fields::of(&serde_json::json!({ "error": error }));
    let message = fields
        .message
        .clone()
        .unwrap_or_else(|| "The upstream reported an error mid-stream.".to_owned());
    if fields.is_context_overflow() {
        return StreamFailure {
            code: ErrorCode::ContextLengthExceeded.into(),
            message,
        };
    }
    let code = fields.word_code().unwrap_or_else(|| {
        let status = fields.status.filter(|s| (400..=599).contains(s));
        status
            .map_or(ErrorCode::ServerError, |s| status_code(s, true, &message))
            .into()
    });
    StreamFailure { code, message }
}

/// The client's error for a context overflow.
fn context_overflow(message: String) -> ApiError {
    ApiError::invalid("input", message).with_code(ErrorCode::ContextLengthExceeded)
}

/// Statuses under which servers report a context overflow: refusals of the request (not
/// authentication, not a missing model, not a rate limit).
fn overflow_status(status: u16) -> bool {
    matches!(status, 400..=499) && !matches!(status, 401 | 403 | 404 | 429)
}

/// The code of a failure whose upstream gave none that is a word. `said`: the body was a JSON
/// error (a model server's own), not a proxy's plain or HTML reply.
fn status_code(status: u16, said: bool, message: &str) -> ErrorCode {
    match status {
        401 => ErrorCode::InvalidApiKey,
        403 => ErrorCode::PermissionDenied,
        404 if message.to_ascii_lowercase().contains("model") => ErrorCode::ModelNotFound,
        404 => ErrorCode::NotFound,
        413 => ErrorCode::RequestTooLarge,
        429 => ErrorCode::RateLimitExceeded,
        400..=499 => ErrorCode::InvalidRequestError,
        502 => ErrorCode::BadGateway,
        // A model server saying it is unavailable is overloaded or loading: Codex retries
        // `server_is_overloaded`. Without a JSON body it is Envoy's own 503 (no healthy
        // upstream, connection refused): the upstream cannot be reached.
        503 if said => ErrorCode::ServerIsOverloaded,
        503 => ErrorCode::UpstreamUnavailable,
        504 => ErrorCode::UpstreamTimeout,
        _ => ErrorCode::ServerError,
    }
}

/// The message of a body that says none: its text when short, else the status alone.
fn plain_message(status: u16, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    if text.is_empty() || text.len() > 512 {
        format!("The upstream answered with HTTP status {status}.")
    } else {
        format!("The upstream answered with HTTP status {status}: {text}")
    }
}

/// The error fields of a body in any of the shapes upstreams use: OpenAI's
/// `{"error":{"message","type","param","code"}}` (vLLM, llama.cpp, Ollama, LiteLLM),
/// `{"object":"error","message",...}` (SGLang, older vLLM), `{"error":"text"}` (TGI, LM
/// Studio, Ollama's native API), FastAPI's `{"detail":...}`.
#[derive(Debug, Default)]
struct Fields {
    message: Option<String>,
    /// `type` (llama.cpp's `exceed_context_size_error`, ...).
    kind: Option<String>,
    /// A string `code`.
    code: Option<String>,
    /// A numeric `code` (vLLM, SGLang and llama.cpp put the HTTP status there).
    status: Option<u16>,
    param: Option<String>,
    n_prompt_tokens: Option<u64>,
    n_ctx: Option<u64>,
}

impl Fields {
    fn of(v: &Value) -> Fields {
        let obj = match v.get("error") {
            Some(Value::String(s)) => {
                return Fields {
                    message: Some(s.clone()),
                    ..Fields::default()
                }
            }
            Some(e @ Value::Object(_)) => e,
            _ => v,
        };
        // LiteLLM writes absent fields as the string "None".
        let text = |key: &str| match obj.get(key) {
            Some(Value::String(s)) if !s.is_empty() && s != "None" => Some(s.clone()),
            _ => None,
        };
        let message = text("message").or_else(|| match v.get("detail") {
            Some(Value::String(s)) => Some(s.clone()),
            Some(d @ (Value::Array(_) | Value::Object(_))) => Some(d.to_string()),
            _ => None,
        });
        let count = |key: &str| obj.get(key).and_then(Value::as_u64);
        Fields {
            message,
            kind: text("type"),
            code: text("code"),
            status: count("code").and_then(|c| u16::try_from(c).ok()),
            param: text("param"),
            n_prompt_tokens: count("n_prompt_tokens"),
            n_ctx: count("n_ctx"),
        }
    }

    /// The body said something of an error (a model server's own JSON, not a proxy's
    /// plain or HTML reply).
    fn is_error(&self) -> bool {
        self.message.is_some() || self.code.is_some() || self.status.is_some()
    }

    /// The upstream's code, when it is a word a client can branch on and a metric can count:
    /// a short lowercase identifier (`model_not_found`, `insufficient_quota`), not a number
    /// (`"400"`) or prose.
    fn word_code(&self) -> Option<Code> {
        self.code
            .as_deref()
            .filter(|c| is_word(c))
            .map(Code::upstream)
    }

    fn is_context_overflow_code(&self) -> bool {
        self.code.as_deref() == Some(ErrorCode::ContextLengthExceeded.as_str())
            || self.kind.as_deref() == Some("exceed_context_size_error")
    }

    fn is_context_overflow(&self) -> bool {
        if self.is_context_overflow_code() {
            return true;
        }
        let Some(message) = &self.message else {
            return false;
        };
        let message = message.to_ascii_lowercase();
        OVERFLOW_WORDINGS.iter().any(|w| message.contains(w))
    }

    fn tokens(&self) -> Option<ContextTokens> {
        (self.n_prompt_tokens.is_some() || self.n_ctx.is_some()).then_some(ContextTokens {
            n_prompt_tokens: self.n_prompt_tokens,
            n_ctx: self.n_ctx,
        })
    }
}

/// How servers word a context overflow (lowercase), each from a fixture in
/// tests/fixtures/upstream_errors/ that names its source.
const OVERFLOW_WORDINGS: [&str; 11] = [
    // OpenAI's Chat API, vLLM, and every proxy that passes either on (LiteLLM, OpenRouter).
    "maximum context length",
    // OpenAI's Responses API.
    "exceeds the context window",
    // SGLang.
    "longer than the model's context length",
    // llama.cpp's server: before the answer, and mid-stream when the context fills.
    "exceeds the available context size",
    "context size has been exceeded",
    // TGI: `inputs` tokens + `max_new_tokens` must be <= N; `inputs` must have less than N tokens.
    "`inputs` tokens + `max_new_tokens` must be",
    "`inputs` must have less than",
    // Ollama.
    "longer than the context length",
    // LiteLLM's exception name, whatever the provider's words behind it.
    "contextwindowexceedederror",
    // LM Studio: "Trying to keep the first N tokens when context the overflows".
    "when context the overflows",
    // Proxies that put the code in the text.
    "context_length_exceeded",
];

/// A short lowercase identifier: `[a-z][a-z0-9_]*`, at most [`MAX_WORD`] bytes.
fn is_word(code: &str) -> bool {
    let bytes = code.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_WORD
        && bytes[0].is_ascii_lowercase()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openresponses::ErrorKind;

    #[test]
    fn an_answer_head_without_a_numeric_status_is_no_answer() {
        let head = [(":status", "204"), ("Content-Type", "application/json")];
        let head = AnswerHead(&head);
        assert_eq!(head.status(), Ok(204));
        assert_eq!(head.header("content-type"), Some("application/json"));
        for pairs in [&[][..], &[(":status", "ok")][..], &[("x", "1")][..]] {
            assert_eq!(AnswerHead(pairs).status(), Err(CallFailure::NoStatus));
        }
    }

    fn of(status: u16, body: &str) -> ApiError {
        classify(status, body.as_bytes())
    }

    fn code_of(e: &ApiError) -> Option<&str> {
        e.code.as_ref().map(Code::as_str)
    }

    #[test]
    fn numeric_codes_become_the_word_of_their_status() {
        for (status, code) in [
            (400, "invalid_request_error"),
            (422, "invalid_request_error"),
            (429, "rate_limit_exceeded"),
            (500, "server_error"),
            (503, "server_is_overloaded"),
        ] {
            let body =
                format!(r#"{{"error":{{"message":"m","type":"X","param":null,"code":{status}}}}}"#);
            let e = of(status, &body);
            assert_eq!((e.status, code_of(&e)), (status, Some(code)), "{status}");
        }
        let e = of(400, r#"{"error":{"message":"m","code":"400"}}"#);
        assert_eq!(code_of(&e), Some("invalid_request_error"));
    }

    #[test]
    fn word_codes_are_kept_and_bounded() {
        let e = of(
            429,
            r#"{"error":{"message":"m","code":"insufficient_quota"}}"#,
        );
        assert_eq!(code_of(&e), Some("insufficient_quota"));
        for not_a_word in [
            "Rate Limited",
            "x".repeat(MAX_WORD + 1).as_str(),
            "9abc",
            "a-b",
            "",
        ] {
            let body = serde_json::json!({"error": {"message": "m", "code": not_a_word}});
            let e = of(429, &body.to_string());
            assert_eq!(code_of(&e), Some("rate_limit_exceeded"), "{not_a_word}");
        }
    }

    #[test]
    fn the_message_is_found_in_every_shape_servers_use() {
        for body in [
            r#"{"error":{"message":"slow down","type":"rate_limit","code":"rate"}}"#,
            r#"{"object":"error","message":"slow down","type":"BadRequestError","code":429}"#,
            r#"{"error":"slow down"}"#,
            r#"{"detail":"slow down"}"#,
        ] {
            assert_eq!(of(429, body).message, "slow down", "{body}");
        }
        let e = of(422, r#"{"detail":[{"loc":["body"],"msg":"x"}]}"#);
        assert_eq!(e.message, r#"[{"loc":["body"],"msg":"x"}]"#);
        assert_eq!(
            code_of(&of(429, r#"{"error":{"message":"m","code":"rate"}}"#)),
            Some("rate")
        );
    }

    #[test]
    fn a_404_names_the_model_when_the_upstream_speaks_of_one() {
        let e = of(
            404,
            r#"{"error":{"message":"The model `foo` does not exist."}}"#,
        );
        assert_eq!(
            (code_of(&e), e.kind),
            (Some("model_not_found"), ErrorKind::NotFound)
        );
        let e = of(404, "Not Found");
        assert_eq!(code_of(&e), Some("not_found"));
    }

    #[test]
    fn envoys_own_503_is_unavailable_a_servers_is_overloaded() {
        let e = of(503, "no healthy upstream");
        assert_eq!((e.status, code_of(&e)), (503, Some("upstream_unavailable")));
        assert_eq!(
            e.message,
            "The upstream answered with HTTP status 503: no healthy upstream"
        );
        let e = of(503, r#"{"error":{"message":"Loading model","code":503}}"#);
        assert_eq!(code_of(&e), Some("server_is_overloaded"));
    }

    #[test]
    fn statuses_outside_the_error_classes_are_502() {
        let e = of(200, "");
        assert_eq!((e.status, code_of(&e)), (502, Some("bad_gateway")));
    }

    #[test]
    fn a_failed_dependency_is_the_servers_failure() {
        let e = of(
            424,
            r#"{"error":"Request failed during generation: boom","error_type":"generation"}"#,
        );
        assert_eq!((e.status, code_of(&e)), (500, Some("server_error")));
        assert_eq!(e.message, "Request failed during generation: boom");
    }

    #[test]
    fn overflow_wording_counts_only_where_a_request_is_refused() {
        let body = r#"{"error":{"message":"This model's maximum context length is 10 tokens."}}"#;
        assert_eq!(code_of(&of(400, body)), Some("context_length_exceeded"));
        // A rate limit that speaks of tokens is a rate limit.
        assert_eq!(code_of(&of(429, body)), Some("rate_limit_exceeded"));
        assert_eq!(code_of(&of(500, body)), Some("server_error"));
    }

    #[test]
    fn an_overflow_is_400_with_the_counts_the_upstream_gave() {
        let f = of(
            413,
            r#"{"error":{"code":400,"message":"request (9 tokens) exceeds the available context size (8 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9,"n_ctx":8}}"#,
        );
        assert_eq!(f.status, 400);
        assert_eq!(f.param.as_deref(), Some("input"));
        let body: Value = serde_json::from_slice(&f.to_body()).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": {
                "message": "request (9 tokens) exceeds the available context size (8 tokens), try increasing it",
                "type": "invalid_request_error", "param": "input",
                "code": "context_length_exceeded", "n_prompt_tokens": 9, "n_ctx": 8}})
        );
        // Without counts as fields, the envelope is the usual four.
        let f = of(
            400,
            r#"{"error":{"message":"m","code":"context_length_exceeded"}}"#,
        );
        let body: Value = serde_json::from_slice(&f.to_body()).unwrap();
        assert_eq!(body["error"].as_object().unwrap().len(), 4);
    }

    #[test]
    fn only_retry_headers_are_kept_bounded() {
        let long = "9".repeat(MAX_KEPT_VALUE + 1);
        let kept = kept_headers([
            ("Retry-After", " 7 "),
            ("content-type", "application/json"),
            ("x-ratelimit-remaining-requests", "0"),
            ("retry-after-ms", "7000"),
            ("set-cookie", "a=b"),
            ("x-ratelimit-reset-tokens", long.as_str()),
            ("x-ratelimit-limit-tokens", ""),
        ]);
        assert_eq!(
            kept,
            [
                KeptHeader::new("retry-after", "7"),
                KeptHeader::new("x-ratelimit-remaining-requests", "0"),
                KeptHeader::new("retry-after-ms", "7000"),
            ]
        );
        let many: Vec<(String, String)> = (0..40)
            .map(|i| (format!("x-ratelimit-n{i}"), "1".to_owned()))
            .collect();
        let kept = kept_headers(many.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        assert_eq!(kept.len(), MAX_KEPT_HEADERS);
    }

    #[test]
    fn stream_errors_get_the_same_words() {
        let f = classify_stream(&serde_json::json!({"message": "boom", "code": 500}));
        assert_eq!(
            (f.code.as_str(), f.message.as_str()),
            ("server_error", "boom")
        );
        let f = classify_stream(&serde_json::json!({"message": "slow", "code": "slow_down"}));
        assert_eq!(f.code.as_str(), "slow_down");
        let f = classify_stream(&serde_json::json!("Context size has been exceeded."));
        assert_eq!(f.code, ErrorCode::ContextLengthExceeded);
        let f = classify_stream(&serde_json::json!("Request failed during generation"));
        assert_eq!(f.code, ErrorCode::ServerError);
        let f = classify_stream(&serde_json::json!({"type": "exceed_context_size_error"}));
        assert_eq!(f.code, ErrorCode::ContextLengthExceeded);
        assert_eq!(f.message, "The upstream reported an error mid-stream.");
        assert_eq!(folded_status(&f.code), 400);
        assert_eq!(folded_status(&ErrorCode::ServerError.into()), 502);
    }
}
