//! The sans-IO translation core: bytes of one API in, bytes of the other out.
//!
//! Nothing here knows about gRPC, Envoy or an async runtime. The caller supplies the
//! clock and the randomness ([`Meta`]), so every translation is deterministic and can be
//! tested and fuzzed with plain bytes.
//!
//! One [`ResponsePlan`] is made per request by [`request::translate`]; it carries what the
//! response path needs (ids, echoed parameters, options) to [`response`] for JSON answers
//! and to [`stream::StreamTranslator`] for SSE answers.
//!
//! Dependencies point one way (every module also uses this one's types):
//!
//! ```text
//! compact    → request, response, compaction
//! stream     → response, compaction, calls
//! response   → compaction, calls
//! request    → compaction, calls, fields, json
//! compaction → sealing, fields
//! sealing    → seal, fields
//! ```
//!
//! `compact` (the `/v1/responses/compact` endpoint) is on top: it uses the request side and
//! the answer side. `compaction` (sealing and opening `compaction` items) is a leaf both
//! sides share; `request`'s submodules `body`, `input` and `summary` hold what a compact
//! request checks and builds like any other.

mod calls;
pub mod compact;
mod compaction;
mod fields;
pub(crate) use fields::{into_items, Obj};
pub mod json;
pub mod request;
pub mod response;
pub mod seal;
mod sealing;
pub mod stream;

use crate::chat;
use serde::{Deserialize, Serialize};

use crate::openresponses::{
    CompactionItem, Echo, IncompleteDetails, OutputItem, ResponseError, ResponseResource,
    ResponseState, Status, Usage,
};

pub(crate) use calls::{flat_name, OfferedTool, ToolKind};

pub use fields::is_client_bookkeeping;
pub use request::translate as translate_request;

/// Which event names carry reasoning text in one exchange's stream: chosen per exchange from
/// the policy ([`crate::client::ReasoningEventsPolicy`]) and the client's headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningEvents {
    /// `response.reasoning.delta` / `.done`, as the OpenResponses specification names them.
    #[default]
    Spec,
    /// `response.reasoning_text.delta` / `.done`, as OpenAI's API names them.
    OpenAi,
}

/// What `developer` messages (and `instructions`) become upstream (`--developer-role`, the
/// module's `developer_role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", value(rename_all = "lowercase"))]
pub enum DeveloperRole {
    /// What open-weight chat templates understand.
    #[default]
    System,
    /// For upstreams whose templates know the role.
    Developer,
}

/// What happens to hosted tools (`web_search`, `file_search`, ...) a Chat upstream cannot run
/// (`--hosted-tools`, the module's `hosted_tools`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
#[cfg_attr(feature = "clap", value(rename_all = "lowercase"))]
pub enum HostedTools {
    /// Left out of the upstream request and of the echoed `tools`.
    #[default]
    Drop,
    /// 400 `unsupported_tool`.
    Reject,
}

/// Default caps: the one source of the CLI defaults (`config`) and of [`Options::default`].
pub mod limits {
    /// Largest `/v1/responses` body: 16 MiB (a few photos as data URLs).
    pub const MAX_REQUEST_BYTES: usize = 16 << 20;
    /// Most `input` items.
    pub const MAX_INPUT_ITEMS: usize = 4096;
    /// Largest content part: as large as a whole request may be, so that one image
    /// filling the request is accepted (the part cap is there to be lowered).
    pub const MAX_PART_BYTES: usize = MAX_REQUEST_BYTES;
    /// Largest upstream SSE event held while incomplete.
    pub const MAX_SSE_FRAME_BYTES: usize = 1 << 20;
    /// Largest text + arguments accumulated for one response.
    pub const MAX_OUTPUT_BYTES: usize = 16 << 20;
    /// Bytes of a Chat request per estimated token (automatic compaction).
    pub const COMPACTION_BYTES_PER_TOKEN: u32 = 4;
}

/// Operator choices that shape translation. Defaults are the documented behaviour.
#[derive(Debug, Clone)]
pub struct Options {
    /// Reject `store: true` and unknown top-level fields instead of serving/forwarding them.
    pub strict: bool,
    pub reasoning_events: ReasoningEvents,
    pub developer_role: DeveloperRole,
    pub hosted_tools: HostedTools,
    /// Largest accepted request body (bytes): 413 beyond.
    pub max_request_bytes: usize,
    /// Most items accepted in `input`.
    pub max_input_items: usize,
    /// Largest single content part (text, image or file data, tool output), in bytes.
    pub max_part_bytes: usize,
    /// Keys that seal reasoning into `encrypted_content` and open it again. `None`: the
    /// feature is off and such requests get a 400.
    pub keyring: Option<std::sync::Arc<seal::Keyring>>,
    /// The tenant this exchange's sealed items are bound to (per exchange, from the operator's
    /// tenant header; [`seal::Tenant::Unbound`] when there is none).
    pub tenant: seal::Tenant,
    /// With a tenant: blobs sealed bound to no tenant (before the tenant header was set)
    /// still open (`seal_accept_unbound`, a migration window).
    pub accept_unbound_seals: bool,
    /// The names the Chat request sends in place of requested ones (`model_map`).
    pub model_map: std::sync::Arc<crate::model_map::ModelMap>,
    /// Largest SSE event the stream translator holds while waiting for its end.
    pub max_sse_frame_bytes: usize,
    /// Largest total of text and arguments accumulated for one response's output.
    pub max_output_bytes: usize,
    /// Bytes of a Chat request per token, for the estimate automatic compaction compares with
    /// `context_management`'s threshold.
    pub compaction_bytes_per_token: u32,
    /// The host can make the summarising call of an automatic compaction (`context_management`):
    /// both shipped hosts can; a library host that cannot refuses a request whose compaction
    /// is due rather than skipping it.
    pub automatic_compaction: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            strict: false,
            reasoning_events: ReasoningEvents::default(),
            developer_role: DeveloperRole::default(),
            hosted_tools: HostedTools::default(),
            max_request_bytes: limits::MAX_REQUEST_BYTES,
            max_input_items: limits::MAX_INPUT_ITEMS,
            max_part_bytes: limits::MAX_PART_BYTES,
            keyring: None,
            tenant: seal::Tenant::Unbound,
            accept_unbound_seals: false,
            model_map: Default::default(),
            max_sse_frame_bytes: limits::MAX_SSE_FRAME_BYTES,
            max_output_bytes: limits::MAX_OUTPUT_BYTES,
            compaction_bytes_per_token: limits::COMPACTION_BYTES_PER_TOKEN,
            automatic_compaction: true,
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

/// The generation parameters a request set, as sent upstream (`None`: not set, the upstream's
/// default applies), for logs and traces: the GenAI conventions' request attributes.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Params {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// `max_output_tokens` (`max_completion_tokens` upstream).
    pub max_output_tokens: Option<u64>,
}

impl Params {
    /// The values of a Chat request, as sent (read by their Chat keys: what the table of
    /// request fields sends under those keys is what is traced).
    fn sent(chat: &chat::Request<'_>) -> Params {
        use chat::request::Param;
        let number = |key| match chat.param(key) {
            Some(Param::Number(x)) => Some(*x),
            Some(Param::Integer(n)) => Some(*n as f64),
            _ => None,
        };
        Params {
            temperature: number("temperature"),
            top_p: number("top_p"),
            presence_penalty: number("presence_penalty"),
            frequency_penalty: number("frequency_penalty"),
            max_output_tokens: match chat.param("max_completion_tokens") {
                Some(Param::Integer(n)) => Some(*n),
                _ => None,
            },
        }
    }
}

/// The plan of one answer: everything the response path needs to know about the request it
/// answers (ids, echoed parameters, options). Made by [`request::translate`], read by
/// [`response`] and [`stream::StreamTranslator`]; the exchange's life is
/// [`crate::exchange::Exchange`]'s.
#[derive(Debug, Clone)]
pub struct ResponsePlan {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) created_at: u64,
    pub(crate) stream: bool,
    pub(crate) id_seed: u128,
    pub(crate) echo: Echo,
    /// The client asked for `message.output_text.logprobs`.
    pub(crate) logprobs: bool,
    /// The client asked for `reasoning.encrypted_content` (and a keyring is configured).
    pub(crate) seal_reasoning: bool,
    /// The tools offered upstream whose calls need more than their name to come back
    /// (in a `namespace`, `custom`, built-in): their calls become the client's own items.
    pub(crate) tools: Vec<OfferedTool>,
    /// A `compaction_trigger` request: the output is one sealed `compaction` item.
    pub(crate) compaction: bool,
    pub(crate) options: Options,
    /// A `/v1/responses/compact` request: what its answer keeps verbatim.
    pub(crate) compact: Option<Box<Kept>>,
    /// The turn after an automatic compaction: its `compaction` item leads the output.
    pub(crate) lead: Option<Box<Lead>>,
    /// The generation parameters the request set.
    pub(crate) params: Params,
}

impl ResponsePlan {
    /// A plan for a request already known valid (tests, benches, fuzzing).
    pub fn new(model: &str, stream: bool, meta: Meta, options: Options) -> Self {
        ResponsePlan {
            id: hex_id("resp", meta.id_seed, None),
            model: model.to_owned(),
            created_at: meta.now,
            stream,
            id_seed: meta.id_seed,
            echo: Echo::default(),
            logprobs: false,
            seal_reasoning: false,
            tools: Vec::new(),
            compaction: false,
            options,
            compact: None,
            lead: None,
            params: Params::default(),
        }
    }

    /// The turn after an automatic compaction: `item` leads its output (index 0, the turn's
    /// items after it), `usage` (the summarising request's) adds to the turn's.
    pub fn set_lead(&mut self, item: CompactionItem, usage: Option<Usage>) {
        self.lead = Some(Box::new(Lead { item, usage }));
    }

    /// The turn's usage, with the compaction's when there was one: both were spent.
    pub(crate) fn usage(&self, turn: Option<Usage>) -> Option<Usage> {
        match (turn, self.lead.as_ref().and_then(|l| l.usage)) {
            (Some(turn), Some(compaction)) => Some(turn.plus(&compaction)),
            (turn, _) => turn,
        }
    }

    /// The output a response starts with: its lead `compaction` item, if any.
    pub(crate) fn lead_output(&self) -> Vec<OutputItem> {
        let mut output = Vec::new();
        if let Some(lead) = &self.lead {
            output.push(OutputItem::Compaction(lead.item.clone()));
        }
        output
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn model(&self) -> &str {
        &self.model
    }

    /// A `/v1/responses/compact` request, answered with a compaction object.
    pub fn is_compact(&self) -> bool {
        self.compact.is_some()
    }

    /// The client asked for a stream (`"stream": true`).
    pub fn is_stream(&self) -> bool {
        self.stream
    }

    /// The generation parameters the request set.
    pub fn params(&self) -> Params {
        self.params
    }

    /// The id of the `n`th output item, with the prefix of its type (`msg`, `fc`, `rs`).
    pub(crate) fn item_id(&self, prefix: &str, n: usize) -> String {
        hex_id(prefix, self.id_seed, Some(n))
    }

    /// Seals reasoning text for `encrypted_content`, when the client asked for it.
    pub(crate) fn seal(&self, n: usize, text: &str) -> Option<String> {
        let nonce = seal::nonce(self.id_seed, n as u64);
        self.seal_reasoning
            .then(|| sealing::seal(&self.options, seal::Purpose::Reasoning, text, nonce))
            .flatten()
    }

    /// Whether the `n`th function call (0-based) is over `max_tool_calls` and must be dropped.
    pub(crate) fn over_tool_call_limit(&self, calls_so_far: usize) -> bool {
        self.echo
            .max_tool_calls
            .is_some_and(|max| calls_so_far as u64 >= max)
    }

    pub(crate) fn resource<'a>(
        &'a self,
        state: &'a Progress,
        output: &'a [OutputItem],
    ) -> ResponseResource<'a> {
        ResponseResource::new(
            ResponseState {
                id: &self.id,
                created_at: self.created_at,
                completed_at: state.completed_at,
                status: state.status,
                incomplete_details: state.incomplete.as_ref(),
                model: &self.model,
                output,
                error: state.error.as_ref(),
                usage: state.usage.as_ref(),
            },
            &self.echo,
        )
    }
}

/// `{prefix}_{seed:032x}` and, for an item, `{n:04x}` after it: written digit by digit (the
/// formatter pads a `u128` one character at a time).
fn hex_id(prefix: &str, seed: u128, n: Option<usize>) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut id = String::with_capacity(prefix.len() + 1 + 32 + 8);
    id.push_str(prefix);
    id.push('_');
    for shift in (0..32).rev() {
        id.push(char::from(DIGITS[((seed >> (shift * 4)) & 0xf) as usize]));
    }
    if let Some(n) = n {
        let width = (usize::BITS - n.leading_zeros()).div_ceil(4).max(4);
        for shift in (0..width).rev() {
            id.push(char::from(DIGITS[(n >> (shift * 4)) & 0xf]));
        }
    }
    id
}

/// The `compaction` item an automatic compaction made, leading the turn's output.
#[derive(Debug, Clone)]
pub(crate) struct Lead {
    pub(crate) item: CompactionItem,
    /// The summarising request's usage.
    pub(crate) usage: Option<Usage>,
}

/// What the answer of a compact request keeps verbatim.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    /// The window's latest user message, as the client sent it (string content as one
    /// `input_text` part).
    pub(crate) message: Option<serde_json::Value>,
}

/// The parts of a response that change as it progresses (its status, error and usage so
/// far); how the whole exchange ended is [`crate::exchange::Outcome`].
#[derive(Debug, Clone)]
pub(crate) struct Progress {
    pub status: Status,
    pub completed_at: Option<u64>,
    pub incomplete: Option<IncompleteDetails>,
    pub error: Option<ResponseError>,
    pub usage: Option<Usage>,
}

impl Progress {
    pub fn in_progress() -> Self {
        Progress {
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
            cache_write_tokens: 0,
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

#[cfg(test)]
mod tests {
    use super::hex_id;

    #[test]
    fn ids_are_the_formatters_hex() {
        for seed in [
            0u128,
            0xfeed,
            u128::MAX,
            0x0123_4567_89ab_cdef_0011_2233_4455_6677,
        ] {
            assert_eq!(hex_id("resp", seed, None), format!("resp_{seed:032x}"));
            for n in [0usize, 1, 0xabc, 0xffff, 0x1_0000, 0x12_3456, usize::MAX] {
                assert_eq!(
                    hex_id("fc", seed, Some(n)),
                    format!("fc_{seed:032x}{n:04x}")
                );
            }
        }
    }
}
