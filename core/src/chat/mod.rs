//! Wire types of the Chat Completions API: the request we send ([`Request`]) and the answers
//! the upstream sends.
//!
//! In answers every field is optional and unknown fields are ignored: upstreams differ (vLLM
//! adds `prompt_token_ids`, llama.cpp adds `timings`), and a missing field must never be a
//! parse failure when the rest of the answer is usable.

pub mod request;

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

pub use request::{Request, StreamOptions};

/// Parses an upstream answer (a completion, a stream's chunk). The body is checked as UTF-8
/// once, whole: serde_json then reads its strings without checking each again (`from_str`),
/// and the answer borrows those without escapes. `None`: not UTF-8 or not that JSON.
pub fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Option<T> {
    let text = std::str::from_utf8(body).ok()?;
    serde_json::from_str(text).ok()
}

/// `null` where a list or object is expected means "absent" (vLLM sends `"tool_calls": null`).
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A non-streaming `chat.completion` object.
///
/// Answers borrow their text from the body they are parsed from (`Cow`: borrowed unless the
/// JSON string has escapes): a stream parses one of these per frame, and only what is kept
/// is copied.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Completion<'a> {
    #[serde(borrow)]
    pub model: Option<Cow<'a, str>>,
    #[serde(borrow, deserialize_with = "null_as_default")]
    pub choices: Vec<Choice<'a>>,
    pub usage: Option<Usage>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Choice<'a> {
    pub index: u32,
    #[serde(borrow, deserialize_with = "null_as_default")]
    pub message: Message<'a>,
    #[serde(borrow)]
    pub finish_reason: Option<Cow<'a, str>>,
    pub logprobs: Option<Logprobs>,
}

/// The assistant message of a completion, or the delta of a chunk: the same fields, whole or
/// in pieces.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Message<'a> {
    #[serde(borrow)]
    pub content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub refusal: Option<Cow<'a, str>>,
    /// llama.cpp, DeepSeek and older vLLM.
    #[serde(borrow)]
    pub reasoning_content: Option<Cow<'a, str>>,
    /// vLLM 0.32 and later.
    #[serde(borrow)]
    pub reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, deserialize_with = "null_as_default")]
    pub tool_calls: Vec<ToolCall<'a>>,
}

impl Message<'_> {
    pub fn reasoning_text(&self) -> Option<&str> {
        self.reasoning_content
            .as_deref()
            .or(self.reasoning.as_deref())
            .filter(|s| !s.is_empty())
    }
}

/// A tool call of a message, or a piece of one in a delta (`index` says which call it
/// continues; a completion's calls leave it 0).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ToolCall<'a> {
    pub index: u32,
    #[serde(borrow)]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow, deserialize_with = "null_as_default")]
    pub function: FunctionCall<'a>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct FunctionCall<'a> {
    #[serde(borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub arguments: Option<Cow<'a, str>>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: Option<u64>,
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    pub completion_tokens_details: Option<CompletionTokensDetails>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub struct PromptTokensDetails {
    pub cached_tokens: Option<u64>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub struct CompletionTokensDetails {
    pub reasoning_tokens: Option<u64>,
}

/// `choices[].logprobs` of a completion or a chunk.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Logprobs {
    pub content: Option<Vec<TokenLogprob>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Option<Vec<u32>>,
    #[serde(deserialize_with = "null_as_default")]
    pub top_logprobs: Vec<TopLogprob>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct TopLogprob {
    pub token: String,
    pub logprob: f64,
    pub bytes: Option<Vec<u32>>,
}

/// One `chat.completion.chunk` of a stream, or an error frame some servers send mid-stream.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Chunk<'a> {
    #[serde(borrow)]
    pub model: Option<Cow<'a, str>>,
    #[serde(borrow, deserialize_with = "null_as_default")]
    pub choices: Vec<ChunkChoice<'a>>,
    pub usage: Option<Usage>,
    /// `data: {"error": {...}}`: vLLM and llama.cpp report failures this way after the 200.
    pub error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ChunkChoice<'a> {
    pub index: u32,
    #[serde(borrow, deserialize_with = "null_as_default")]
    pub delta: Delta<'a>,
    #[serde(borrow)]
    pub finish_reason: Option<Cow<'a, str>>,
    pub logprobs: Option<Logprobs>,
}

/// A chunk's delta has the fields of a message.
pub type Delta<'a> = Message<'a>;
