//! The `code` of an error: every code this project emits ([`ErrorCode`], a closed list the
//! compiler checks and the docs and metrics are derived from), or an upstream's own ([`Code`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Every error code the project emits, in an error envelope (`error.code`), a stream's
/// `error` event and `response.failed`, a WebSocket `error` event, the access log, the
/// metrics' `error_code` label and the span's `error.type`. The wire form is the snake_case
/// name ([`ErrorCode::as_str`]).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::IntoStaticStr,
    strum::EnumString,
    strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
pub enum ErrorCode {
    // The request (400 unless said otherwise).
    /// The body is not a JSON object.
    InvalidJson,
    /// A field is given twice in one object.
    DuplicateKey,
    /// The request has no body.
    MissingBody,
    MissingRequiredParameter,
    InvalidType,
    InvalidValue,
    /// Strict mode: a field outside the OpenResponses API.
    UnknownParameter,
    /// A parameter this stateless server cannot honour (`background`, `conversation`, ...).
    UnsupportedParameter,
    /// A hosted tool with `--hosted-tools reject`.
    UnsupportedTool,
    /// `previous_response_id` on HTTP, or one the WebSocket connection does not hold.
    PreviousResponseNotFound,
    /// Sealed reasoning or a compaction item that does not open with this server's keys.
    InvalidEncryptedContent,
    /// Compaction asked of a server without sealing keys.
    CompactionUnavailable,
    /// 403: the request seals or opens `encrypted_content`, which the operator binds to a
    /// tenant (`seal_tenant_header`), and it carries no tenant.
    MissingTenant,
    /// 413: the body is over `--max-request-bytes` (or Envoy's buffer limit), or decoding it
    /// over the work budget (`request_encoding`). A cap.
    RequestTooLarge,
    /// A content part is over `--max-part-bytes`. A cap.
    ContentTooLarge,
    /// `input` has more items than `--max-input-items`. A cap.
    TooManyInputItems,
    /// 415: the request's `content-encoding` names a coding this server does not decode, or
    /// more than `request_encoding::MAX_CODINGS`.
    UnsupportedContentEncoding,
    /// The body is not what its `content-encoding` says (cut short, corrupt, more after its
    /// end).
    InvalidEncodedBody,

    // The WebSocket transport.
    /// A binary message (the protocol is JSON text).
    InvalidMessage,
    /// A message `type` other than `response.create`.
    UnknownEventType,
    /// A `response.create` that would open a lane (`stream_id`) beyond the connection's
    /// [`crate::connection::MAX_LANES`].
    TooManyLanes,
    /// The WebSocket connection has reached its maximum age (`--ws-max-age`).
    WebsocketConnectionLimitReached,
    /// At the handshake: 503, the host holds as many connections as it accepts; 429, the
    /// caller holds its quota.
    WebsocketConnectionsExhausted,
    /// 503 at the handshake: the host is draining.
    ServerShuttingDown,
    /// 403 at the handshake: an `Origin` outside `ws_allowed_origins`.
    OriginNotAllowed,

    // The upstream's answer.
    /// 502: a success the translation cannot read (not a Chat Completion, the wrong content
    /// type, no summary to compact).
    UpstreamInvalidResponse,
    /// A stream event that is not a `chat.completion.chunk`.
    UpstreamInvalidChunk,
    /// The stream ended before its `finish_reason` or `[DONE]`.
    UpstreamStreamTruncated,
    /// 502: a gathered answer over `--max-body-bytes`. A cap.
    UpstreamResponseTooLarge,
    /// One SSE event over `--max-sse-frame-bytes`. A cap.
    UpstreamEventTooLarge,
    /// A response's text, arguments and tool calls over `--max-output-bytes` (see
    /// `translate::stream::CALL_SLOT_BYTES`), or more at once than the transport reads. A cap.
    ResponseTooLarge,

    // An upstream's failure, as OpenAI's API words it (`upstream_failure`): the upstream's
    // own code when it is a word, else one of these.
    /// 400: the input does not fit the model's context, from any server's wording.
    ContextLengthExceeded,
    /// An upstream's 4xx without a code of its own (other than those below).
    InvalidRequestError,
    /// An upstream's 401.
    InvalidApiKey,
    /// An upstream's 403.
    PermissionDenied,
    /// An upstream's 404 that speaks of a model.
    ModelNotFound,
    /// An upstream's other 404.
    NotFound,
    /// An upstream's 429.
    RateLimitExceeded,
    /// An upstream's 5xx (other than 502, 503, 504) without a code of its own, or its
    /// mid-stream error without one.
    ServerError,
    /// An upstream's 502.
    BadGateway,
    /// An upstream's 503 with a JSON error body: a model server overloaded or loading; or too
    /// many costly request bodies waiting for the host's work threads.
    ServerIsOverloaded,
    /// An upstream's 503 without one (Envoy's own: no healthy upstream, connection refused),
    /// or an upstream the WebSocket transport cannot reach.
    UpstreamUnavailable,
    /// An upstream's 504.
    UpstreamTimeout,

    /// 500: a bug contained, or calls out of order.
    InternalError,
}

impl ErrorCode {
    /// The wire form (`request_too_large`).
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// An exchange that ends with this code reached one of the size caps (the metric
    /// `caps_hit_total` counts them by code).
    pub fn is_cap(self) -> bool {
        matches!(
            self,
            ErrorCode::RequestTooLarge
                | ErrorCode::ContentTooLarge
                | ErrorCode::TooManyInputItems
                | ErrorCode::UpstreamResponseTooLarge
                | ErrorCode::UpstreamEventTooLarge
                | ErrorCode::ResponseTooLarge
        )
    }

    /// Every code, in declaration order.
    pub fn all() -> &'static [ErrorCode] {
        <ErrorCode as strum::VariantArray>::VARIANTS
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        ErrorCode::from_str(&s)
            .map_err(|_| serde::de::Error::custom(format_args!("unknown error code `{s}`")))
    }
}

/// The `code` of an error as the client gets it: one of ours, or the one an upstream's
/// error body gave, passed on as it came (an upstream's code that is one of ours is ours:
/// it means the same, and counts as a cap the same).
///
/// An upstream's code is free text: whoever makes a metric label of it bounds it (the
/// processor's `Bounded` label set); [`Code::ours`] is the bounded part.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Code {
    Ours(ErrorCode),
    Upstream(Box<str>),
}

impl Code {
    /// An upstream's own code.
    pub fn upstream(code: &str) -> Self {
        match ErrorCode::from_str(code) {
            Ok(ours) => Code::Ours(ours),
            Err(_) => Code::Upstream(code.into()),
        }
    }

    /// The wire form.
    pub fn as_str(&self) -> &str {
        match self {
            Code::Ours(c) => c.as_str(),
            Code::Upstream(s) => s,
        }
    }

    /// The code, when it is one of ours.
    pub fn ours(&self) -> Option<ErrorCode> {
        match self {
            Code::Ours(c) => Some(*c),
            Code::Upstream(_) => None,
        }
    }

    /// See [`ErrorCode::is_cap`].
    pub fn is_cap(&self) -> bool {
        self.ours().is_some_and(ErrorCode::is_cap)
    }
}

impl From<ErrorCode> for Code {
    fn from(c: ErrorCode) -> Self {
        Code::Ours(c)
    }
}

impl PartialEq<ErrorCode> for Code {
    fn eq(&self, other: &ErrorCode) -> bool {
        *self == Code::Ours(*other)
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Code {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        Ok(Code::upstream(&s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_form_is_the_snake_case_name_both_ways() {
        assert_eq!(
            ErrorCode::TooManyInputItems.as_str(),
            "too_many_input_items"
        );
        assert_eq!(
            ErrorCode::WebsocketConnectionLimitReached.as_str(),
            "websocket_connection_limit_reached"
        );
        for &c in ErrorCode::all() {
            let wire = serde_json::to_string(&c).unwrap();
            assert_eq!(wire, format!("\"{}\"", c.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&wire).unwrap(), c);
            assert_eq!(Code::upstream(c.as_str()), c);
            assert_eq!(serde_json::to_string(&Code::from(c)).unwrap(), wire);
        }
        assert!(serde_json::from_str::<ErrorCode>("\"insufficient_quota\"").is_err());
    }

    #[test]
    fn an_upstreams_code_is_kept_as_it_came() {
        for given in ["insufficient_quota", "503", "Rate Limited"] {
            let c: Code = serde_json::from_str(&serde_json::to_string(given).unwrap()).unwrap();
            assert_eq!((c.as_str(), c.ours(), c.is_cap()), (given, None, false));
        }
        // One of ours, from an upstream, means the same.
        assert!(Code::upstream("request_too_large").is_cap());
    }

    #[test]
    fn the_caps_are_the_codes_of_size_limits() {
        let caps: Vec<&str> = ErrorCode::all()
            .iter()
            .filter(|c| c.is_cap())
            .map(|c| c.as_str())
            .collect();
        assert_eq!(
            caps,
            [
                "request_too_large",
                "content_too_large",
                "too_many_input_items",
                "upstream_response_too_large",
                "upstream_event_too_large",
                "response_too_large",
            ]
        );
    }
}
