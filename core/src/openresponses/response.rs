//! `ResponseResource` and its output items, as the client receives them.
//!
//! The resource is serialised by reference: the request-constant part (`Echo`) is built
//! once per request, and `output` borrows the items the translator accumulated, so the
//! terminal stream event costs one serialisation and no copies.

use serde::ser::SerializeStruct;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

/// Lifecycle of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    InProgress,
    Completed,
    Incomplete,
    Failed,
}

/// Lifecycle of one output item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    InProgress,
    Completed,
    Incomplete,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputItem {
    Message(MessageItem),
    FunctionCall(FunctionCallItem),
    Reasoning(ReasoningItem),
    /// A call of a `custom` tool (free-text input; OpenAI's extension, which Codex uses for
    /// `apply_patch`). Not in the OpenResponses schema: only clients that declared a custom
    /// tool can get one.
    CustomToolCall(CustomToolCallItem),
    /// A call of the client-executed `shell` tool (OpenAI's built-in; only clients that
    /// declared one get it).
    ShellCall(ShellCallItem),
    /// A call of the client-executed `local_shell` tool (OpenAI's built-in).
    LocalShellCall(LocalShellCallItem),
    /// A call of the client-executed `apply_patch` tool (OpenAI's built-in).
    ApplyPatchCall(ApplyPatchCallItem),
    /// The sealed summary of a `compaction_trigger` request: its only output item.
    Compaction(CompactionItem),
}

impl OutputItem {
    pub fn id(&self) -> &str {
        match self {
            OutputItem::Message(m) => &m.id,
            OutputItem::FunctionCall(f) => &f.id,
            OutputItem::Reasoning(r) => &r.id,
            OutputItem::CustomToolCall(c) => &c.id,
            OutputItem::ShellCall(c) => &c.id,
            OutputItem::LocalShellCall(c) => &c.id,
            OutputItem::ApplyPatchCall(c) => &c.id,
            OutputItem::Compaction(c) => &c.id,
        }
    }
}

/// What an assistant message is: talk on the way to tool calls, or the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// A message followed by tool calls in the same response.
    Commentary,
    /// Any other message.
    FinalAnswer,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageItem {
    pub id: String,
    pub status: ItemStatus,
    /// Always `assistant` on output.
    pub role: String,
    pub content: Vec<OutputContent>,
    /// Known once the message ends (a Chat upstream does not say in advance whether tool
    /// calls follow): absent on a streamed message's `response.output_item.added`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OutputContent {
    OutputText {
        text: String,
        /// Chat upstreams have no citations; the schema still requires the list.
        annotations: Vec<Value>,
        logprobs: Vec<LogProb>,
    },
    Refusal {
        refusal: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCallItem {
    pub id: String,
    pub call_id: String,
    pub name: String,
    /// The `namespace` tool this function belongs to, as the client declared it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub arguments: String,
    pub status: ItemStatus,
}

/// OpenAI's `custom_tool_call` item (openai-python's `ResponseCustomToolCall`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CustomToolCallItem {
    pub id: String,
    pub call_id: String,
    pub name: String,
    /// The `namespace` tool this custom tool belongs to, as the client declared it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The tool's free-text input.
    pub input: String,
}

/// OpenAI's `shell_call` item (openai-python's `ResponseFunctionShellToolCall`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShellCallItem {
    pub id: String,
    pub call_id: String,
    pub action: ShellAction,
    pub status: ItemStatus,
}

/// The commands of a `shell_call`, and their limits.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShellAction {
    pub commands: Vec<String>,
    pub timeout_ms: Option<u64>,
    pub max_output_length: Option<u64>,
}

/// OpenAI's `local_shell_call` item (openai-python's `LocalShellCall`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LocalShellCallItem {
    pub id: String,
    pub call_id: String,
    pub action: LocalShellAction,
    pub status: ItemStatus,
}

/// The command of a `local_shell_call` (`type: "exec"`, its only kind).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename = "exec")]
pub struct LocalShellAction {
    pub command: Vec<String>,
    pub env: std::collections::BTreeMap<String, String>,
    pub timeout_ms: Option<u64>,
    pub user: Option<String>,
    pub working_directory: Option<String>,
}

/// OpenAI's `apply_patch_call` item (openai-python's `ResponseApplyPatchToolCall`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApplyPatchCallItem {
    pub id: String,
    pub call_id: String,
    pub operation: ApplyPatchOperation,
    pub status: ApplyPatchStatus,
}

/// One file operation of an `apply_patch_call`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ApplyPatchOperation {
    CreateFile { path: String, diff: String },
    UpdateFile { path: String, diff: String },
    DeleteFile { path: String },
}

/// An `apply_patch_call`'s status has no `incomplete` (OpenAI's type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyPatchStatus {
    InProgress,
    Completed,
}

/// A `compaction` item: a summary of the conversation so far, sealed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactionItem {
    pub id: String,
    pub encrypted_content: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReasoningItem {
    pub id: String,
    pub summary: Vec<SummaryText>,
    pub content: Vec<ReasoningText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_content: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename = "summary_text")]
pub struct SummaryText {
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename = "reasoning_text")]
pub struct ReasoningText {
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LogProb {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u32>,
    pub top_logprobs: Vec<TopLogProb>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogProb {
    pub token: String,
    pub logprob: f64,
    pub bytes: Vec<u32>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub total_tokens: u64,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens_details: OutputTokensDetails,
}

impl Usage {
    /// Two requests' usage together.
    pub fn plus(&self, other: &Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens + other.input_tokens,
            output_tokens: self.output_tokens + other.output_tokens,
            total_tokens: self.total_tokens + other.total_tokens,
            input_tokens_details: InputTokensDetails {
                cached_tokens: self.input_tokens_details.cached_tokens
                    + other.input_tokens_details.cached_tokens,
                cache_write_tokens: self.input_tokens_details.cache_write_tokens
                    + other.input_tokens_details.cache_write_tokens,
            },
            output_tokens_details: OutputTokensDetails {
                reasoning_tokens: self.output_tokens_details.reasoning_tokens
                    + other.output_tokens_details.reasoning_tokens,
            },
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputTokensDetails {
    pub cached_tokens: u64,
    /// Not in the OpenResponses schema, but OpenAI's SDKs type it as required; Chat
    /// upstreams do not report cache writes, so it is 0.
    pub cache_write_tokens: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputTokensDetails {
    pub reasoning_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IncompleteDetails {
    pub reason: String,
}

/// `ResponseResource.error`: what made a response fail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseError {
    pub code: super::Code,
    pub message: String,
}

/// The request parameters a response echoes, with the spec's defaults filled in.
/// Built once per request by the request translator; [`ResponseResource`] borrows its fields.
/// What the client wrote that is echoed as written (its instructions, tool schemas,
/// metadata) is a copy of its JSON, made once: the response writes it out as it came.
#[derive(Debug, Clone)]
pub struct Echo {
    /// The client's string, as JSON.
    pub instructions: Option<Box<RawValue>>,
    /// Function tools in Responses form (`type`, `name`, `description`, `parameters`, `strict`).
    pub tools: Vec<EchoTool>,
    pub tool_choice: EchoToolChoice,
    pub truncation: &'static str,
    pub parallel_tool_calls: bool,
    pub text: EchoText,
    pub top_p: f64,
    pub presence_penalty: f64,
    pub frequency_penalty: f64,
    pub top_logprobs: u64,
    pub temperature: f64,
    pub reasoning: Option<EchoReasoning>,
    pub max_output_tokens: Option<u64>,
    pub max_tool_calls: Option<u64>,
    pub store: bool,
    pub background: bool,
    pub service_tier: String,
    /// The client's object, as JSON (`None`: `{}`).
    pub metadata: Option<Box<RawValue>>,
    pub safety_identifier: Option<String>,
    pub prompt_cache_key: Option<String>,
    /// The response this one continues (WebSocket transport, connection-local context).
    pub previous_response_id: Option<String>,
    /// The request's other plain parameters, by name, each with its value or its default
    /// (the translation's table of fields says which): echoed after the keys above.
    pub params: Vec<(&'static str, Scalar)>,
}

/// A plain parameter's value, as echoed.
#[derive(Debug, Clone, PartialEq)]
pub enum Scalar {
    Null,
    Bool(bool),
    Number(f64),
    Integer(u64),
    Name(&'static str),
    Text(String),
}

impl Serialize for Scalar {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Scalar::Null => s.serialize_unit(),
            Scalar::Bool(b) => s.serialize_bool(*b),
            Scalar::Number(x) => s.serialize_f64(*x),
            Scalar::Integer(n) => s.serialize_u64(*n),
            Scalar::Name(name) => s.serialize_str(name),
            Scalar::Text(text) => s.serialize_str(text),
        }
    }
}

impl Default for Echo {
    fn default() -> Self {
        Echo {
            instructions: None,
            tools: Vec::new(),
            tool_choice: EchoToolChoice::Mode("auto"),
            truncation: "disabled",
            parallel_tool_calls: true,
            text: EchoText::default(),
            top_p: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            top_logprobs: 0,
            temperature: 1.0,
            reasoning: None,
            max_output_tokens: None,
            max_tool_calls: None,
            store: false,
            background: false,
            service_tier: "default".into(),
            metadata: None,
            safety_identifier: None,
            prompt_cache_key: None,
            previous_response_id: None,
            params: Vec::new(),
        }
    }
}

/// A function tool as the response echoes it.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename = "function")]
pub struct EchoTool {
    pub name: String,
    /// The client's string, as JSON.
    pub description: Option<Box<RawValue>>,
    /// The client's schema, as JSON.
    pub parameters: Option<Box<RawValue>>,
    pub strict: Option<bool>,
}

/// `tool_choice` as the response echoes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EchoToolChoice {
    /// `auto`, `none` or `required`.
    Mode(&'static str),
    /// `{"type": "function" | "custom", "name": ...}`.
    Named { kind: &'static str, name: String },
    /// `{"type": "allowed_tools", "mode": ..., "tools": [{"type": "function", "name": ...}]}`.
    AllowedTools {
        mode: &'static str,
        tools: Vec<String>,
    },
    /// A client-executed built-in tool by its type: `{"type": "shell"}`.
    Builtin(&'static str),
}

impl Serialize for EchoToolChoice {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        #[derive(Serialize)]
        struct Function<'a> {
            r#type: &'static str,
            name: &'a str,
        }
        match self {
            EchoToolChoice::Mode(mode) => s.serialize_str(mode),
            EchoToolChoice::Named { kind, name } => Function { r#type: kind, name }.serialize(s),
            EchoToolChoice::AllowedTools { mode, tools } => {
                let mut m = s.serialize_map(Some(3))?;
                m.serialize_entry("type", "allowed_tools")?;
                m.serialize_entry("mode", mode)?;
                let tools: Vec<Function<'_>> = tools
                    .iter()
                    .map(|name| Function {
                        r#type: "function",
                        name,
                    })
                    .collect();
                m.serialize_entry("tools", &tools)?;
                m.end()
            }
            EchoToolChoice::Builtin(kind) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("type", kind)?;
                m.end()
            }
        }
    }
}

/// `text` as the response echoes it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EchoText {
    pub format: EchoFormat,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<&'static str>,
}

/// `text.format` as the response echoes it.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EchoFormat {
    #[default]
    Text,
    JsonObject,
    JsonSchema {
        name: String,
        description: Option<String>,
        /// The client's schema, as JSON.
        schema: Box<RawValue>,
        strict: bool,
    },
}

/// `reasoning` as the response echoes it.
#[derive(Debug, Clone, Serialize)]
pub struct EchoReasoning {
    pub effort: Option<String>,
    pub summary: Option<&'static str>,
}

/// The response object. Borrowing keeps the hot path free of copies.
///
/// Serialised key by key, in one fixed order: each key is written once by
/// [`ResponseState`]'s part or by the echo's ([`EchoJson`] holds the latter serialised, for
/// the events of a stream that repeat it). No `#[serde(flatten)]`: it once wrote
/// `previous_response_id` twice, once from the resource and once from the echo.
#[derive(Debug, Clone, Copy)]
pub struct ResponseResource<'a> {
    pub state: ResponseState<'a>,
    /// The request's parameters, echoed.
    pub echo: &'a Echo,
}

/// The parts of a response that change as it progresses (the rest is the request's echo).
#[derive(Debug, Clone, Copy)]
pub struct ResponseState<'a> {
    pub id: &'a str,
    pub created_at: u64,
    pub completed_at: Option<u64>,
    pub status: Status,
    pub incomplete_details: Option<&'a IncompleteDetails>,
    pub model: &'a str,
    pub output: &'a [OutputItem],
    pub error: Option<&'a ResponseError>,
    pub usage: Option<&'a Usage>,
}

impl<'a> ResponseResource<'a> {
    /// A response in `state`, echoing the request's parameters.
    pub fn new(state: ResponseState<'a>, echo: &'a Echo) -> Self {
        ResponseResource { state, echo }
    }

    /// The resource's JSON into `out`, its echo copied from `echo` (made from the same
    /// [`Echo`]): the bytes of `serde_json::to_writer(out, self)`, at the cost of the parts
    /// that change.
    pub fn write_with(&self, out: &mut Vec<u8>, echo: &EchoJson) {
        // Writing our own typed values into memory cannot fail.
        let _ = serde_json::to_writer(&mut *out, &Head(self));
        // `{…,"usage":…}` continues with the echo's keys, which bring the closing brace.
        out.pop();
        out.push(b',');
        out.extend_from_slice(&echo.0);
    }

    /// The keys before the echo's: the response's own, and `previous_response_id`.
    fn head_fields<M: SerializeStruct>(&self, m: &mut M) -> Result<(), M::Error> {
        let s = &self.state;
        m.serialize_field("id", s.id)?;
        m.serialize_field("object", "response")?;
        m.serialize_field("created_at", &s.created_at)?;
        m.serialize_field("completed_at", &s.completed_at)?;
        m.serialize_field("status", &s.status)?;
        m.serialize_field("incomplete_details", &s.incomplete_details)?;
        m.serialize_field("model", s.model)?;
        m.serialize_field(
            "previous_response_id",
            &self.echo.previous_response_id.as_deref(),
        )?;
        m.serialize_field("output", s.output)?;
        m.serialize_field("error", &s.error)?;
        m.serialize_field("usage", &s.usage)
    }
}

/// Keys of the resource: those of [`ResponseResource::head_fields`], then those of
/// [`echo_fields`].
const RESOURCE_KEYS: usize = 31;

impl Serialize for ResponseResource<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("ResponseResource", RESOURCE_KEYS)?;
        self.head_fields(&mut m)?;
        echo_fields(self.echo, &mut m)?;
        m.end()
    }
}

/// The resource without the echo's keys (for [`ResponseResource::write_with`]).
struct Head<'r, 'a>(&'r ResponseResource<'a>);

impl Serialize for Head<'_, '_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("ResponseResource", RESOURCE_KEYS)?;
        self.0.head_fields(&mut m)?;
        m.end()
    }
}

/// The request's parameters as every response object of an exchange echoes them, serialised
/// once: the echo's keys and the resource's closing brace (`"instructions":…}`). A stream's
/// `response.created`, `.in_progress` and terminal event each copy it instead of serialising
/// the echo again (the tools' schemas and the instructions of an agent turn: tens of KB).
#[derive(Debug, Clone)]
pub struct EchoJson(Vec<u8>);

impl EchoJson {
    pub fn new(echo: &Echo) -> EchoJson {
        struct Keys<'a>(&'a Echo);
        impl Serialize for Keys<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut m = s.serialize_struct("ResponseResource", RESOURCE_KEYS)?;
                echo_fields(self.0, &mut m)?;
                m.end()
            }
        }
        // `{"instructions":…}`: our own typed values, cannot fail.
        let mut json = serde_json::to_vec(&Keys(echo)).unwrap_or_default();
        json.remove(0);
        EchoJson(json)
    }
}

/// The echo's keys, after the response's own.
fn echo_fields<M: SerializeStruct>(e: &Echo, m: &mut M) -> Result<(), M::Error> {
    m.serialize_field("instructions", &e.instructions.as_deref())?;
    m.serialize_field("tools", &e.tools)?;
    m.serialize_field("tool_choice", &e.tool_choice)?;
    m.serialize_field("truncation", e.truncation)?;
    m.serialize_field("parallel_tool_calls", &e.parallel_tool_calls)?;
    m.serialize_field("text", &e.text)?;
    m.serialize_field("top_p", &e.top_p)?;
    m.serialize_field("presence_penalty", &e.presence_penalty)?;
    m.serialize_field("frequency_penalty", &e.frequency_penalty)?;
    m.serialize_field("top_logprobs", &e.top_logprobs)?;
    m.serialize_field("temperature", &e.temperature)?;
    m.serialize_field("reasoning", &e.reasoning)?;
    m.serialize_field("max_output_tokens", &e.max_output_tokens)?;
    m.serialize_field("max_tool_calls", &e.max_tool_calls)?;
    m.serialize_field("store", &e.store)?;
    m.serialize_field("background", &e.background)?;
    m.serialize_field("service_tier", &e.service_tier)?;
    m.serialize_field("metadata", &ObjectOrEmpty(e.metadata.as_deref()))?;
    m.serialize_field("safety_identifier", &e.safety_identifier)?;
    m.serialize_field("prompt_cache_key", &e.prompt_cache_key)?;
    for (key, value) in &e.params {
        m.serialize_field(key, value)?;
    }
    Ok(())
}

/// An echoed object, or `{}` when the request had none.
struct ObjectOrEmpty<'a>(Option<&'a RawValue>);

impl Serialize for ObjectOrEmpty<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Some(raw) => raw.serialize(s),
            None => {
                use serde::ser::SerializeMap;
                s.serialize_map(Some(0))?.end()
            }
        }
    }
}
