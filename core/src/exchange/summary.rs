//! What is known of an exchange, for logs, metrics and metadata: its summary and outcome.

use super::*;

use crate::openresponses::{Code, Usage};
use crate::translate::Params;

/// How an exchange ended, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Still running.
    Open,
    /// A translated answer was delivered (JSON, or a stream to its terminal event).
    Translated,
    /// Answered with an error envelope, or a stream that ended in `response.failed`.
    Failed,
}

impl Outcome {
    /// Its name in metadata and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Open => "open",
            Outcome::Translated => "translated",
            Outcome::Failed => "failed",
        }
    }

    /// Its label once the exchange is recorded (metrics, spans): `cut` for one still open,
    /// which the host ended first (client gone, upstream reset, a timeout).
    pub fn recorded(self) -> &'static str {
        match self {
            Outcome::Open => "cut",
            other => other.as_str(),
        }
    }
}

/// What is known about an exchange, for logs and metrics.
#[derive(Debug, Clone)]
pub struct Summary {
    pub operation: Operation,
    pub response_id: Option<String>,
    pub model: Option<String>,
    pub stream: bool,
    pub outcome: Outcome,
    /// The HTTP status answered, once known.
    pub status: Option<u16>,
    /// The error code of a failed exchange.
    pub error_code: Option<Code>,
    /// Token usage, when the upstream reported it.
    pub usage: Option<Usage>,
    /// The model the upstream says answered.
    pub upstream_model: Option<String>,
    /// The upstream's `finish_reason` (`stop`, `length`, `tool_calls`, ...), once it came.
    pub finish_reason: Option<String>,
    /// An automatic compaction, when the request's estimate crossed its threshold.
    pub compaction: Option<Compaction>,
    /// The generation parameters the request set (once it was translated).
    pub params: Params,
    /// A stream has sent output (text, reasoning or a tool call) to the client: set by the
    /// call whose bytes carried the first of it (see [`Exchange::has_output`]).
    pub streamed_output: bool,
}
