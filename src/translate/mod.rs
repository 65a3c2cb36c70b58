//! The sans-IO translation core: bytes of one API in, bytes of the other out.
//!
//! Nothing here knows about gRPC, Envoy or an async runtime. The caller supplies the
//! clock and the randomness ([`Meta`]), so every translation is deterministic and can be
//! tested and fuzzed with plain bytes.
//!
//! One [`Exchange`] is made per request by [`request::translate`]; it carries what the
//! response path needs (ids, echoed parameters, options) to [`response`] for JSON answers
//! and to [`stream::StreamTranslator`] for SSE answers.

mod fields;
pub mod request;
pub mod response;
pub mod seal;
pub mod stream;

use crate::openresponses::{
    Echo, IncompleteDetails, OutputItem, ResponseError, ResponseResource, Status, Usage,
};

pub use request::translate as translate_request;

/// Which event names carry reasoning text in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningEvents {
    /// `response.reasoning.delta` / `.done`, as the OpenResponses specification names them.
    #[default]
    Spec,
    /// `response.reasoning_text.delta` / `.done`, as OpenAI's API names them.
    OpenAi,
}

/// Operator choices that shape translation. Defaults are the documented behaviour.
#[derive(Debug, Clone)]
pub struct Options {
    /// Reject `store: true` and unknown top-level fields instead of serving/forwarding them.
    pub strict: bool,
    pub reasoning_events: ReasoningEvents,
    /// Largest SSE event the stream translator holds while waiting for its end.
    pub max_sse_frame_bytes: usize,
    /// Largest total of text and arguments accumulated for one response's output.
    pub max_output_bytes: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            strict: false,
            reasoning_events: ReasoningEvents::Spec,
            max_sse_frame_bytes: 1 << 20,
            max_output_bytes: 16 << 20,
        }
    }
}

/// What the caller knows and the core must not look up itself.
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    /// Unix time in seconds: becomes `created_at`.
    pub now: u64,
    /// Random bits from which the response and item ids are derived.
    pub id_seed: u128,
}

/// Everything the response path needs to know about the request it answers.
#[derive(Debug, Clone)]
pub struct Exchange {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) created_at: u64,
    pub(crate) stream: bool,
    pub(crate) id_seed: u128,
    pub(crate) echo: Echo,
    /// The client asked for `message.output_text.logprobs`.
    pub(crate) logprobs: bool,
    pub(crate) options: Options,
}

impl Exchange {
    /// An exchange for a request already known valid (tests, benches, fuzzing).
    pub fn new(model: &str, stream: bool, meta: Meta, options: Options) -> Self {
        Exchange {
            id: format!("resp_{:032x}", meta.id_seed),
            model: model.to_owned(),
            created_at: meta.now,
            stream,
            id_seed: meta.id_seed,
            echo: Echo::default(),
            logprobs: false,
            options,
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// The client asked for a stream (`"stream": true`).
    pub fn is_stream(&self) -> bool {
        self.stream
    }

    /// The id of the `n`th output item, with the prefix of its type (`msg`, `fc`, `rs`).
    pub(crate) fn item_id(&self, prefix: &str, n: usize) -> String {
        format!("{prefix}_{:032x}{n:04x}", self.id_seed)
    }

    pub(crate) fn resource<'a>(
        &'a self,
        state: &'a Outcome,
        output: &'a [OutputItem],
    ) -> ResponseResource<'a> {
        ResponseResource {
            id: &self.id,
            object: "response",
            created_at: self.created_at,
            completed_at: state.completed_at,
            status: state.status,
            incomplete_details: state.incomplete.as_ref(),
            model: &self.model,
            previous_response_id: None,
            output,
            error: state.error.as_ref(),
            usage: state.usage.as_ref(),
            echo: &self.echo,
        }
    }
}

/// The parts of a response that change as it progresses.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    pub status: Status,
    pub completed_at: Option<u64>,
    pub incomplete: Option<IncompleteDetails>,
    pub error: Option<ResponseError>,
    pub usage: Option<Usage>,
}

impl Outcome {
    pub fn in_progress() -> Self {
        Outcome {
            status: Status::InProgress,
            completed_at: None,
            incomplete: None,
            error: None,
            usage: None,
        }
    }
}

/// How a Chat `finish_reason` ends a response.
pub(crate) fn finish_status(finish_reason: Option<&str>) -> (Status, Option<IncompleteDetails>) {
    let incomplete = |reason: &str| {
        (
            Status::Incomplete,
            Some(IncompleteDetails {
                reason: reason.to_owned(),
            }),
        )
    };
    match finish_reason {
        Some("length") => incomplete("max_output_tokens"),
        Some("content_filter") => incomplete("content_filter"),
        _ => (Status::Completed, None),
    }
}

/// Chat usage → Responses usage; absent details count as 0 as the schema requires numbers.
pub(crate) fn usage(u: &crate::chat::Usage) -> Usage {
    Usage {
        input_tokens: u.prompt_tokens,
        output_tokens: u.completion_tokens,
        total_tokens: u
            .total_tokens
            .unwrap_or(u.prompt_tokens + u.completion_tokens),
        input_tokens_details: crate::openresponses::InputTokensDetails {
            cached_tokens: u
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
        },
        output_tokens_details: crate::openresponses::OutputTokensDetails {
            reasoning_tokens: u
                .completion_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        },
    }
}

/// Chat logprobs → Responses logprobs (`bytes` is required there; derive it when absent).
pub(crate) fn logprobs(lp: Option<&crate::chat::Logprobs>) -> Vec<crate::openresponses::LogProb> {
    use crate::openresponses::{LogProb, TopLogProb};
    let bytes_of = |token: &str, given: &Option<Vec<u32>>| {
        given
            .clone()
            .unwrap_or_else(|| token.bytes().map(u32::from).collect())
    };
    lp.and_then(|l| l.content.as_ref())
        .map(|tokens| {
            tokens
                .iter()
                .map(|t| LogProb {
                    token: t.token.clone(),
                    logprob: t.logprob,
                    bytes: bytes_of(&t.token, &t.bytes),
                    top_logprobs: t
                        .top_logprobs
                        .iter()
                        .map(|top| TopLogProb {
                            token: top.token.clone(),
                            logprob: top.logprob,
                            bytes: bytes_of(&top.token, &top.bytes),
                        })
                        .collect(),
                })
                .collect()
        })
        .unwrap_or_default()
}
