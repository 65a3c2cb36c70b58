//! Wire types of the Chat Completions API, as the upstream sends them.
//!
//! Only the response side is typed: requests are built as JSON maps so that fields the
//! upstream understands but we do not (vLLM's `top_k`, ...) can be forwarded verbatim.
//! Every field is optional and unknown fields are ignored: upstreams differ (vLLM adds
//! `prompt_token_ids`, llama.cpp adds `timings`), and a missing field must never be a parse
//! failure when the rest of the answer is usable.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// `null` where a list or object is expected means "absent" (vLLM sends `"tool_calls": null`).
fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A non-streaming `chat.completion` object.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Completion {
    pub id: Option<String>,
    pub object: Option<String>,
    pub model: Option<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub choices: Vec<Choice>,
    pub usage: Option<Usage>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Choice {
    pub index: u32,
    #[serde(deserialize_with = "null_as_default")]
    pub message: Message,
    pub finish_reason: Option<String>,
    pub logprobs: Option<Logprobs>,
}

/// The assistant message of a completion.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Message {
    pub content: Option<String>,
    pub refusal: Option<String>,
    /// llama.cpp, DeepSeek and older vLLM.
    pub reasoning_content: Option<String>,
    /// vLLM 0.32 and later.
    pub reasoning: Option<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub tool_calls: Vec<ToolCall>,
}

impl Message {
    pub fn reasoning_text(&self) -> Option<&str> {
        self.reasoning_content
            .as_deref()
            .or(self.reasoning.as_deref())
            .filter(|s| !s.is_empty())
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ToolCall {
    pub id: Option<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub function: FunctionCall,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct FunctionCall {
    pub name: Option<String>,
    pub arguments: Option<String>,
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
pub struct Chunk {
    pub id: Option<String>,
    pub model: Option<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub choices: Vec<ChunkChoice>,
    pub usage: Option<Usage>,
    /// `data: {"error": {...}}`: vLLM and llama.cpp report failures this way after the 200.
    pub error: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ChunkChoice {
    pub index: u32,
    #[serde(deserialize_with = "null_as_default")]
    pub delta: Delta,
    pub finish_reason: Option<String>,
    pub logprobs: Option<Logprobs>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct Delta {
    pub content: Option<String>,
    pub refusal: Option<String>,
    pub reasoning_content: Option<String>,
    pub reasoning: Option<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub tool_calls: Vec<ToolCallDelta>,
}

impl Delta {
    pub fn reasoning_text(&self) -> Option<&str> {
        self.reasoning_content
            .as_deref()
            .or(self.reasoning.as_deref())
            .filter(|s| !s.is_empty())
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct ToolCallDelta {
    pub index: u32,
    pub id: Option<String>,
    #[serde(deserialize_with = "null_as_default")]
    pub function: FunctionCall,
}
