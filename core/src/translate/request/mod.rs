//! `POST /v1/responses` body → Chat Completions request body.
//!
//! The body is read once, borrowed (`translate::json::document`): containers the
//! translation reads become fields in document order, and everything it carries over
//! (texts, arguments, tool schemas, the fields it forwards) stays the token it came as. The
//! fields are consumed one by one: every known field is removed as it is validated and
//! mapped, so what is left at the end is exactly the set of unknown fields, forwarded as they
//! came (vLLM's `top_k`, `chat_template_kwargs`, ...) or rejected in strict mode. The Chat
//! request borrows its texts from the body and is written straight into one buffer; what
//! the response echoes is copied once, as JSON.
//!
//! Split by concern: this file maps the request's parameters and drives the rest; `tools`
//! maps `tools` and `tool_choice`; `input` maps `input` items into Chat messages; `body`
//! checks the body as a whole; `summary` builds a compaction's summarising messages. `body`,
//! `input` and `summary` serve `/v1/responses/compact` too ([`super::compact`]).

mod body;
mod context;
mod input;
mod params;
mod summary;
mod tools;

pub(crate) use body::{leftover_fields, parse_request, reject_stateful};
pub(crate) use input::{check_part_size, input_messages, merge_leading_system, system_message};
use params::Params;
pub(crate) use summary::summarising_messages;
pub use summary::{PROMPT, REQUEST};
use tools::{tool_choice, tools, Declared};

use std::borrow::Cow;

use bytes::Bytes;
use serde_json::value::RawValue;

use super::fields::{bad_value, index, join, missing, wrong_type, Obj, Path};
use super::json::document::{self, Fields, Node, Str};
use super::{Meta, Options, ResponsePlan};
use crate::chat;
use crate::chat::request::{Piece, ResponseFormat, Text};
use crate::openresponses::{ApiError, Echo, EchoFormat, EchoReasoning, EchoText, ErrorCode};

/// A translated request: the Chat body to send upstream and the state for the way back.
#[derive(Debug)]
pub struct Translated {
    pub body: Bytes,
    pub plan: ResponsePlan,
    /// The model the Chat body names when the model map changed it (`None`: the requested
    /// one, `plan.model()`).
    pub chat_model: Option<String>,
    /// The request asks for automatic compaction (`context_management`) and its estimate
    /// crossed the threshold, with something to compact: the turn is compacted first
    /// ([`Window::Summarise`], then [`Window::Compacted`]) instead of sending `body`.
    pub compaction_due: Option<Due>,
}

/// An automatic compaction that is due: the turn's estimated input tokens (the Chat body's
/// bytes over `compaction_bytes_per_token`) and the threshold they crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Due {
    pub estimate: u64,
    pub threshold: u64,
}

/// The estimated tokens of a Chat body of `bytes` bytes: no tokenizer (Chat has none), a
/// ratio (docs/compaction.md compares it with llama-server's count).
pub fn estimate_tokens(bytes: usize, bytes_per_token: u32) -> u64 {
    (bytes as u64).div_ceil(u64::from(bytes_per_token.max(1)))
}

/// Which Chat request a translation makes of the request's `input` (automatic compaction,
/// `translate::request::context`).
#[derive(Debug, Clone)]
pub enum Window {
    /// The turn as the client sent it (what stands behind the latest compaction item left
    /// out).
    Turn,
    /// The summarising request of an automatic compaction: the turn's window, summarised as
    /// `/v1/responses/compact` does it; not streamed, no tools, no format, no output cap.
    Summarise,
    /// The turn after an automatic compaction: this sealed `compaction` item (its
    /// `encrypted_content`), then the items kept verbatim.
    Compacted(String),
}

/// [`translate`] with a [`Window`], for a body read before (within the size cap: `capped`
/// checks it again).
pub fn translate_window(
    body: &[u8],
    capped: bool,
    options: &Options,
    meta: Meta,
    window: Window,
) -> Result<Translated, ApiError> {
    let req = if capped {
        parse_request(body, options)?
    } else {
        body::read(body)?
    };
    translate_fields(req, body.len(), options, meta, window)
}

/// [`translate`] for a request read already: a WebSocket `response.create`, its transport's
/// fields taken off and its kept context put at the head of `input` (the size cap was the
/// message's; `request_bytes`: about the size of what was read).
pub(crate) fn translate_read(
    req: Obj<'_, '_>,
    request_bytes: usize,
    options: &Options,
    meta: Meta,
) -> Result<Translated, ApiError> {
    translate_fields(req, request_bytes, options, meta, Window::Turn)
}

const INCLUDE_VALUES: &[&str] = &[
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
    // The outputs of hosted tools and of stored images: this server's responses have no
    // such items, so there is nothing to include (accepted, not an error: a client asking
    // for them with every request still gets its answer).
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "code_interpreter_call.outputs",
];
const LOGPROBS_INCLUDE: &str = "message.output_text.logprobs";
const ENCRYPTED_INCLUDE: &str = "reasoning.encrypted_content";

/// Validates a Responses request and maps it to Chat Completions.
pub fn translate(body: &[u8], options: &Options, meta: Meta) -> Result<Translated, ApiError> {
    let req = parse_request(body, options)?;
    translate_fields(req, body.len(), options, meta, Window::Turn)
}

/// A string of the request as a Chat text: its token as it came where it has one.
pub(crate) fn text(s: Str<'_>) -> Text<'_> {
    match s.escaped_text() {
        Some(escaped) => Text::One(Piece::Json(escaped)),
        None => Text::One(Piece::Plain(s.into_cow())),
    }
}

pub use crate::model_map::MAX_MODEL_BYTES;

/// The request's `model`, checked to be sendable as a header value before anything is sent: not
/// empty, at most [`MAX_MODEL_BYTES`], without control characters (Envoy refuses a header
/// holding CR, LF or NUL; HTTP allows none but tab). 400 `invalid_value` naming `model`.
pub(crate) fn model<'a>(req: &mut Obj<'a, '_>) -> Result<Str<'a>, ApiError> {
    let model = req.required_string("model")?;
    if model.is_empty() {
        return Err(bad_value("model", "Invalid 'model': must not be empty."));
    }
    // A token's raw length bounds its text's: the scan only for long ones.
    if model.len_bound() > MAX_MODEL_BYTES && model.len() > MAX_MODEL_BYTES {
        return Err(bad_value(
            "model",
            format!("Invalid 'model': longer than {MAX_MODEL_BYTES} bytes."),
        ));
    }
    if let Some(c) = model
        .as_str()
        .chars()
        .find(|c| c.is_ascii_control() && *c != '\t')
    {
        return Err(bad_value(
            "model",
            format!(
                "Invalid 'model': it holds the control character U+{:04X}, which a model name \
                 cannot (it is sent as a request header).",
                u32::from(c)
            ),
        ));
    }
    Ok(model)
}

/// The Chat request's `model`: the model map's name for the requested one, else the requested
/// one as it came; and the mapped name, if any. The response keeps the requested name
/// (`ResponsePlan::model`): clients compare it with what they asked (Codex warns that its
/// request was rerouted to another model when the names differ).
pub(crate) fn chat_model<'a>(model: Str<'a>, options: &Options) -> (Text<'a>, Option<String>) {
    match options.model_map.resolve(&model.as_str()) {
        Some(mapped) => (Text::plain(mapped.to_owned()), Some(mapped.to_owned())),
        None => (text(model), None),
    }
}

/// The Chat body's buffer: the request's size (its texts carry over) and room for the
/// messages' own keys.
fn body_capacity(request_bytes: usize) -> usize {
    request_bytes + request_bytes / 8 + 512
}

fn translate_fields(
    mut req: Obj<'_, '_>,
    request_bytes: usize,
    options: &Options,
    meta: Meta,
    window: Window,
) -> Result<Translated, ApiError> {
    reject_stateful(&mut req)?;
    // Codex sends its installation/session ids here: client bookkeeping, not for the model.
    req.skip_object("client_metadata")?;
    let threshold = openai_platform_options(&mut req)?;
    if threshold.is_some() && options.keyring.is_none() {
        // Its summary could only travel sealed: refused whatever the estimate, so that a
        // client learns it at once rather than at the turn that crosses the threshold.
        return Err(bad_value(
            "context_management",
            "Automatic compaction is not available: this server has no keys configured to seal compaction items (--reasoning-keys-file or RESPONSES_EXTPROC_REASONING_KEYS).",
        )
        .with_code(ErrorCode::CompactionUnavailable));
    }

    let model = model(&mut req)?;
    let summarise = matches!(window, Window::Summarise);
    // The summarising request is sealed whole: one JSON answer.
    let stream = req.bool("stream")?.unwrap_or(false) && !summarise;
    let store = req.bool("store")?.unwrap_or(false);
    if store && options.strict {
        return Err(bad_value(
            "store",
            "This server is stateless and does not store responses: set 'store' to false or omit it.",
        )
        .with_code(ErrorCode::UnsupportedParameter));
    }
    if let Some(so) = req.object("stream_options")? {
        let mut so = Obj {
            fields: so,
            path: Path::Text("stream_options"),
        };
        so.bool("include_obfuscation")?;
    }

    let mut echo = Echo::default();
    let model_name = model.as_str().into_owned();
    let (chat_model_name, mapped) = chat_model(model, options);
    let mut chat = chat::Request {
        model: chat_model_name,
        ..chat::Request::default()
    };

    // Messages: instructions first, then the input items in order.
    let instructions = req.string("instructions")?;
    if let Some(i) = &instructions {
        check_part_size("instructions", i, options)?;
    }
    let input = req.take("input").ok_or_else(|| missing("input"))?;
    // Only a turn that may be compacted looks for something to compact.
    let compactable =
        threshold.is_some() && matches!(window, Window::Turn) && context::compactable(&input);
    let input = match window {
        Window::Compacted(blob) => context::compacted(input, blob),
        _ => input,
    };
    let mut input = input_messages(input, options)?;
    let compaction = input.compaction_trigger || summarise;
    let additional_tools = std::mem::take(&mut input.tools);
    let configured = std::mem::take(&mut input.configuration);
    echo.instructions = instructions.as_ref().map(Str::to_json);
    let instructions = instructions.map(text);
    chat.messages = if compaction {
        // Codex's remote compaction: a summarising request, answered with a sealed summary.
        summarising_messages(instructions, input, options)
    } else {
        let mut messages = Vec::with_capacity(input.messages.len() + input.context.len() + 1);
        if let Some(i) = instructions {
            messages.push(system_message(i, options));
        }
        messages.append(&mut input.context);
        messages.append(&mut input.messages);
        merge_leading_system(messages)
    };

    // Tools (the request's, then those `additional_tools` items declared) and how the model
    // may use them.
    let mut offered = Vec::new();
    let mut declared: Vec<Declared<'_>> = req
        .array("tools")?
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, tool)| Declared {
            path: index("tools", i),
            tool,
        })
        .collect();
    declared.extend(additional_tools);
    let tools = tools(declared, &mut echo, &mut offered, options)?;
    let tool_names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    let choice = match req.take("tool_choice") {
        Some(c) => Some(tool_choice(c, &tool_names)?),
        None => None,
    };
    let mut chat_tools = tools;
    if let Some((chat_choice, allowed, echoed)) = choice {
        if let Some(allowed) = allowed {
            chat_tools.retain(|t| allowed.iter().any(|a| *a == t.name));
        }
        if chat_tools.is_empty() {
            // Chat servers (vLLM) reject a `tool_choice` without `tools`; with no tools
            // 'auto' and 'none' both mean "answer in text", but 'required' cannot be met.
            if chat_choice == chat::request::ToolChoice::Mode("required") {
                return Err(bad_value(
                    "tool_choice",
                    "Invalid 'tool_choice': 'required' needs at least one function in 'tools'.",
                ));
            }
        } else {
            chat.tool_choice = Some(chat_choice);
        }
        echo.tool_choice = echoed;
    }
    chat.tools = chat_tools;
    if let Some(p) = req.bool("parallel_tool_calls")? {
        // Like `tool_choice`, only meaningful (and accepted by strict servers) with tools.
        if !chat.tools.is_empty() {
            chat.parallel_tool_calls = Some(p);
        }
        echo.parallel_tool_calls = p;
    }

    // The plain fields (`params::FIELDS`), read in the table's order between the others.
    let mut params = Params::default();
    params.read_until(&mut req, "include")?;
    // Output shape.
    let include = include(&mut req)?;
    params.read_until(&mut req, "text")?;
    let top_logprobs = params.get("top_logprobs").and_then(|v| v.integer());
    let logprobs = include.contains(&LOGPROBS_INCLUDE) || top_logprobs.is_some_and(|n| n > 0);
    if logprobs {
        chat.logprobs = Some(true);
        chat.top_logprobs = top_logprobs;
    }
    let seal_reasoning = include.contains(&ENCRYPTED_INCLUDE);
    if seal_reasoning && options.keyring.is_none() {
        return Err(bad_value(
            "include",
            "'reasoning.encrypted_content' is not available: this server has no reasoning keys configured.",
        )
        .with_code(ErrorCode::UnsupportedParameter));
    }
    if seal_reasoning {
        super::sealing::require_tenant(options)?;
    }
    if let Some(text) = req.object("text")? {
        text_format(text, &mut chat, &mut echo)?;
    }
    if let Some(reasoning) = req.object("reasoning")? {
        let mut r = Obj {
            fields: reasoning,
            path: Path::Text("reasoning"),
        };
        // Any effort is forwarded: the upstream knows which its model supports (`minimal`,
        // `max`, and whatever comes next), and says so when it does not.
        let effort = r.string("effort")?;
        let summary = r.enumeration("summary", &["auto", "concise", "detailed"])?;
        r.enumeration("generate_summary", &["auto", "concise", "detailed"])?;
        // Which earlier reasoning the model keeps (`context`) and OpenAI's reasoning modes
        // (`mode`): OpenAI's own serving choices, with no Chat equivalent; the reasoning that
        // comes back in `input` is given to the upstream either way.
        r.enumeration("context", &["auto", "current_turn", "all_turns"])?;
        r.string("mode")?;
        r.deny_unknown()?;
        echo.reasoning = Some(EchoReasoning {
            effort: effort.as_ref().map(|e| e.as_str().into_owned()),
            summary,
        });
        chat.reasoning_effort = effort.map(text);
    }
    // What the `configuration_update` items of `input` set wins over the request's own
    // `reasoning.effort` and `text.format` for this turn: OpenAI's mid-conversation changes
    // keep the request-level values as the conversation's baseline (unchanged, for its
    // prompt cache) and put each change in `input`, where it "applies from that point onward
    // and stays in effect until the next update" (the reasoning guide's "change reasoning
    // mid-conversation", as OpenRouter's GPT-6 Astra migration guide relays it;
    // openai-python 3.57's `ResponseConfigurationUpdateItemParam`: "Each setting stays in
    // effect until a later update replaces it"). The response echoes the request's own
    // values (the baseline), as it echoes every request parameter.
    if let Some(effort) = configured.effort {
        chat.reasoning_effort = Some(text(effort));
    }
    if let Some(format) = configured.format {
        chat.response_format = format.into_chat();
    }

    params.read_until(&mut req, "metadata")?;
    if let Some(m) = req.take("metadata") {
        echo.metadata = Some(metadata(m)?);
    }
    params.read_rest(&mut req)?;
    params.apply(&mut chat, &mut echo);

    if stream {
        chat.stream = Some(true);
        chat.stream_options = Some(chat::StreamOptions {
            include_usage: true,
        });
    }

    chat.extra = leftover_fields(&mut req, options)?;
    if summarise {
        // The client's cap is on its answer, not on the summary of its conversation.
        chat.params
            .retain(|(key, _)| *key != "max_completion_tokens");
        chat.stream = Some(false);
    }
    if compaction {
        // A summary is plain text: no tools to call, no format, no logprobs.
        chat.tools.clear();
        chat.tool_choice = None;
        chat.parallel_tool_calls = None;
        chat.response_format = None;
        chat.logprobs = None;
        chat.top_logprobs = None;
        if options.keyring.is_none() {
            return Err(bad_value(
                "input",
                "Compaction is not available: this server has no keys configured to seal compaction items (--reasoning-keys-file or RESPONSES_EXTPROC_REASONING_KEYS).",
            )
            .with_code(ErrorCode::CompactionUnavailable));
        }
        super::sealing::require_tenant(options)?;
    }

    echo.store = false;
    let mut plan = ResponsePlan::new(&model_name, stream, meta, options.clone());
    plan.echo = echo;
    plan.logprobs = logprobs && !compaction;
    plan.seal_reasoning = seal_reasoning;
    plan.tools = offered;
    plan.compaction = compaction;
    plan.params = super::Params::sent(&chat);
    let body = Bytes::from(chat.encode(body_capacity(request_bytes)));
    let compaction_due = threshold
        .filter(|_| compactable && !compaction)
        .and_then(|threshold| {
            let estimate = estimate_tokens(body.len(), options.compaction_bytes_per_token);
            (estimate > threshold).then_some(Due {
                estimate,
                threshold,
            })
        });
    if compaction_due.is_some() && !options.automatic_compaction {
        // Never a compaction silently skipped: the client learns it the turn one is due.
        return Err(bad_value(
            "context_management",
            "Automatic compaction (context_management) is not available from this host (it makes no summarising calls), and this request's estimate crossed its compact_threshold: compact with POST /v1/responses/compact.",
        )
        .with_code(ErrorCode::UnsupportedParameter));
    }
    Ok(Translated {
        body,
        plan,
        chat_model: mapped,
        compaction_due,
    })
}

/// Options of OpenAI's own platform that openai-python and openai-node type on a request
/// (not in the OpenResponses schema), read here rather than forwarded to a Chat server as
/// unknown fields. Prompt caching (`prompt_cache_retention`, `prompt_cache_options`), access
/// programs, background-mode options (`background` itself is refused when true) and
/// image-context compression are serving choices a Chat upstream makes its own way: validated
/// and ignored. Automatic compaction (`context_management`) is run here: its threshold, if any
/// (see [`context`]). `moderation` asks for content to be scored or blocked, which this server
/// cannot do: refused rather than silently not done. `user` (the SDKs' older name of
/// `safety_identifier`) is Chat's `user`.
fn openai_platform_options(req: &mut Obj<'_, '_>) -> Result<Option<u64>, ApiError> {
    req.string("prompt_cache_retention")?;
    req.skip_object("prompt_cache_options")?;
    req.skip_object("access_programs")?;
    req.skip_object("background_options")?;
    let threshold = match req.array("context_management")? {
        Some(entries) => context::compact_threshold(entries)?,
        None => None,
    };
    req.skip_object("image")?;
    if req.has("moderation") {
        return Err(bad_value(
            "moderation",
            "Moderation runs on OpenAI's platform; this server cannot score or block content: omit 'moderation'.",
        )
        .with_code(ErrorCode::UnsupportedParameter));
    }
    Ok(threshold)
}

fn include(req: &mut Obj<'_, '_>) -> Result<Vec<&'static str>, ApiError> {
    let Some(list) = req.array("include")? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, v) in list.into_iter().enumerate() {
        let path = index("include", i);
        match v {
            Node::Str(s) => {
                let s = s.as_str();
                match INCLUDE_VALUES.iter().find(|known| **known == s) {
                    Some(known) => out.push(*known),
                    None => {
                        return Err(bad_value(
                            &path,
                            format!(
                                "Invalid value for '{path}': '{s}'. Supported values are: {}.",
                                INCLUDE_VALUES.join(", ")
                            ),
                        ))
                    }
                }
            }
            other => return Err(wrong_type(&path, "a string", &other)),
        }
    }
    Ok(out)
}

/// `metadata`, checked, as the JSON the response echoes (a copy of the client's).
fn metadata(value: Node<'_>) -> Result<Box<RawValue>, ApiError> {
    if !value.is_object() {
        return Err(wrong_type("metadata", "an object", &value));
    }
    let echoed = match &value {
        Node::Kept(raw, _) => document::echoed(raw),
        other => document::owned_json(other),
    };
    let fields = Obj::new(value, Path::Text("metadata"))?.fields;
    if fields.len() > 16 {
        return Err(bad_value(
            "metadata",
            "Invalid 'metadata': at most 16 key-value pairs are allowed.",
        ));
    }
    for (k, v) in &fields {
        let path = join("metadata", k);
        if k.chars().count() > 64 {
            return Err(bad_value(
                &path,
                "Invalid 'metadata': keys are at most 64 characters.",
            ));
        }
        match v {
            Node::Str(s) if s.as_str().chars().count() <= 512 => {}
            Node::Str(_) => {
                return Err(bad_value(
                    &path,
                    "Invalid 'metadata': values are at most 512 characters.",
                ))
            }
            other => return Err(wrong_type(&path, "a string", other)),
        }
    }
    Ok(echoed)
}

/// An object of the request as JSON to write out: borrowed where it was kept as it came.
pub(crate) fn object_json(node: Node<'_>) -> Result<Cow<'_, RawValue>, Node<'_>> {
    match node {
        Node::Kept(raw, _) if raw.get().starts_with('{') => Ok(Cow::Borrowed(raw)),
        node @ Node::Object(_) => Ok(Cow::Owned(document::owned_json(&node))),
        other => Err(other),
    }
}

/// `text.format` → `response_format`; the Responses form is echoed as given.
fn text_format<'a>(
    text_param: Fields<'a>,
    chat: &mut chat::Request<'a>,
    echo: &mut Echo,
) -> Result<(), ApiError> {
    const TEXT: Path<'static> = Path::Text("text");
    let mut t = Obj {
        fields: text_param,
        path: TEXT,
    };
    let verbosity = t.enumeration("verbosity", &["low", "medium", "high"])?;
    let mut echoed = EchoText::default();
    if let Some(fields) = t.object("format")? {
        let format = Format::read(fields, Path::Key(&TEXT, "format"), Format::REQUEST)?;
        echoed.format = format.echoed();
        chat.response_format = format.into_chat();
    }
    if let Some(v) = verbosity {
        echoed.verbosity = Some(v);
        chat.verbosity = Some(v);
    }
    t.deny_unknown()?;
    echo.text = echoed;
    Ok(())
}

/// A `text.format`, read: the request's own, or a `configuration_update` item's.
#[derive(Debug)]
pub(crate) enum Format<'a> {
    /// Plain text, Chat's default.
    Text,
    JsonObject,
    JsonSchema {
        name: Str<'a>,
        description: Option<Str<'a>>,
        schema: Cow<'a, RawValue>,
        strict: Option<bool>,
    },
}

impl<'a> Format<'a> {
    /// The types a request's `text.format` takes.
    pub(crate) const REQUEST: &'static [&'static str] = &["text", "json_object", "json_schema"];
    /// The types a `configuration_update` item's `text.format` takes (openai-python 3.57's
    /// `ResponseConfigurationUpdateItemParam.Text.format`: text or a JSON schema).
    pub(crate) const UPDATE: &'static [&'static str] = &["text", "json_schema"];

    /// Reads the format object at `path`, whose `type` must be one of `types`.
    pub(crate) fn read(
        fields: Fields<'a>,
        path: Path<'_>,
        types: &[&'static str],
    ) -> Result<Self, ApiError> {
        let mut f = Obj { fields, path };
        let kind = f
            .enumeration("type", types)?
            .ok_or_else(|| missing(Path::Key(&path, "type")))?;
        let format = match kind {
            "text" => Format::Text,
            "json_object" => Format::JsonObject,
            _ => {
                let name = f.required_string("name")?;
                let schema = match f.take("schema").map(object_json) {
                    Some(Ok(schema)) => schema,
                    Some(Err(other)) => {
                        return Err(wrong_type(Path::Key(&path, "schema"), "an object", &other))
                    }
                    None => return Err(missing(Path::Key(&path, "schema"))),
                };
                Format::JsonSchema {
                    name,
                    description: f.string("description")?,
                    schema,
                    strict: f.bool("strict")?,
                }
            }
        };
        f.deny_unknown()?;
        Ok(format)
    }

    /// As the response echoes it.
    fn echoed(&self) -> EchoFormat {
        match self {
            Format::Text => EchoFormat::Text,
            Format::JsonObject => EchoFormat::JsonObject,
            Format::JsonSchema {
                name,
                description,
                schema,
                strict,
            } => EchoFormat::JsonSchema {
                name: name.as_str().into_owned(),
                description: description.as_ref().map(|d| d.as_str().into_owned()),
                schema: document::echoed(schema),
                strict: strict.unwrap_or(false),
            },
        }
    }

    /// Chat's `response_format` (none for plain text).
    pub(crate) fn into_chat(self) -> Option<ResponseFormat<'a>> {
        match self {
            Format::Text => None,
            Format::JsonObject => Some(ResponseFormat::JsonObject),
            Format::JsonSchema {
                name,
                description,
                schema,
                strict,
            } => Some(ResponseFormat::JsonSchema {
                name: text(name),
                description: description.map(text),
                schema,
                strict,
            }),
        }
    }
}
