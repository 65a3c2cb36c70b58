//! The whole answers an exchange gives: a translated answer, or an error envelope.

use bytes::Bytes;

use crate::openresponses::{ApiError, Events};
use crate::upstream_failure::KeptHeader;

/// A complete answer for the client, replacing whatever the upstream sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The translation: a response (or compaction) object, or a whole event stream.
    Answer(Answer),
    /// An OpenResponses error envelope.
    Error(ErrorReply),
}

/// A translated answer, whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// 200, whatever 2xx the upstream chose.
    pub status: u16,
    pub body: Body,
}

/// The body of a whole answer, as it is framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// One JSON object: a response, a compaction.
    Json(Bytes),
    /// A whole event stream (one that ended as soon as it began).
    Events(Events),
}

/// The body's bytes.
impl std::ops::Deref for Body {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

impl Body {
    pub fn content_type(&self) -> &'static str {
        match self {
            Body::Json(_) => JSON,
            Body::Events(_) => EVENT_STREAM,
        }
    }

    pub fn bytes(&self) -> &Bytes {
        match self {
            Body::Json(b) => b,
            Body::Events(e) => e.bytes(),
        }
    }

    /// The JSON object that stands for the answer: the object itself, or a stream's last
    /// (terminal) event (`--trace-content` records it).
    pub fn last_object(&self) -> Option<Bytes> {
        match self {
            Body::Json(b) => Some(b.clone()),
            Body::Events(e) => e.last(),
        }
    }
}

/// An error envelope: its JSON body, its error for transports that frame it their own way
/// (the WebSocket `error` event), and the headers it keeps from an upstream's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    pub error: ApiError,
    pub body: Bytes,
    /// Response headers to send with it: those an upstream's error keeps for the client
    /// (`retry-after`, `retry-after-ms`, `x-ratelimit-*`; see [`upstream_failure`]).
    pub headers: Vec<KeptHeader>,
}

pub const JSON: &str = "application/json";
pub const EVENT_STREAM: &str = "text/event-stream";

impl ErrorReply {
    pub fn new(error: ApiError) -> Self {
        ErrorReply {
            body: error.to_body(),
            error,
            headers: Vec::new(),
        }
    }

    pub fn status(&self) -> u16 {
        self.error.status
    }

    /// Always JSON.
    pub fn content_type(&self) -> &'static str {
        JSON
    }
}

impl Reply {
    pub fn status(&self) -> u16 {
        match self {
            Reply::Answer(a) => a.status,
            Reply::Error(e) => e.status(),
        }
    }

    pub fn content_type(&self) -> &'static str {
        match self {
            Reply::Answer(a) => a.body.content_type(),
            Reply::Error(e) => e.content_type(),
        }
    }

    pub fn body(&self) -> &Bytes {
        match self {
            Reply::Answer(a) => a.body.bytes(),
            Reply::Error(e) => &e.body,
        }
    }
}
