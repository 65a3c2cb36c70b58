//! Wire types of the Chat Completions API: the request we send ([`Request`]) and the answers
//! the upstream sends.
//!
//! In answers every field is optional and unknown fields are ignored: upstreams differ (vLLM
//! adds `prompt_token_ids`, llama.cpp adds `timings`), and a missing field must never be a
//! parse failure when the rest of the answer is usable.

pub mod request;

use std::borrow::Cow;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// A Chat Completions request, as sent upstream. The fields the translation sets are typed;
/// `extra` carries the client's fields outside the Responses API (vLLM's `top_k`,
/// `chat_template_kwargs`, ...), forwarded verbatim, but never in place of one set here.
#[derive(Debug, Default, Serialize)]
pub struct Request {
    pub model: String,
    /// Chat messages (system, user, assistant with tool calls, tool).
    pub messages: Vec<request::Message>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<request::Tool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verbosity: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_effort: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct StreamOptions {
    /// Usage arrives in a trailing chunk only when asked for.
    pub include_usage: bool,
}

impl Request {
    /// The JSON body. An `extra` field named like one set here is dropped: ours win (the
    /// client's `messages`, say, would otherwise appear twice).
    pub fn encode(mut self) -> Vec<u8> {
        let set = [
            ("model", true),
            ("messages", true),
            ("tools", !self.tools.is_empty()),
            ("tool_choice", self.tool_choice.is_some()),
            ("parallel_tool_calls", self.parallel_tool_calls.is_some()),
            (
                "max_completion_tokens",
                self.max_completion_tokens.is_some(),
            ),
            ("temperature", self.temperature.is_some()),
            ("top_p", self.top_p.is_some()),
            ("presence_penalty", self.presence_penalty.is_some()),
            ("frequency_penalty", self.frequency_penalty.is_some()),
            ("logprobs", self.logprobs.is_some()),
            ("top_logprobs", self.top_logprobs.is_some()),
            ("response_format", self.response_format.is_some()),
            ("verbosity", self.verbosity.is_some()),
            ("reasoning_effort", self.reasoning_effort.is_some()),
            ("user", self.user.is_some()),
            ("stream", self.stream.is_some()),
            ("stream_options", self.stream_options.is_some()),
        ];
        self.extra
            .retain(|k, _| !set.iter().any(|(name, is_set)| *is_set && name == k));
        // Strings, numbers and JSON values into memory: serialising cannot fail.
        serde_json::to_vec(&self).unwrap_or_default()
    }
}

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

#[cfg(test)]
mod request_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn extra_fields_ride_along_but_never_replace_ours() {
        let mut extra = Map::new();
        for (k, v) in [
            ("top_k", json!(20)),
            ("messages", json!("not ours")),
            ("stream_options", json!({"include_usage": false})),
            ("user", json!("client-user")),
        ] {
            extra.insert(k.into(), v);
        }
        let request = Request {
            model: "m".into(),
            messages: vec![request::Message::User {
                content: request::Content::Text("hi".into()),
            }],
            stream: Some(true),
            stream_options: Some(StreamOptions {
                include_usage: true,
            }),
            extra,
            ..Request::default()
        };
        let body: Value = serde_json::from_slice(&request.encode()).unwrap();
        assert_eq!(
            body,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "stream": true, "stream_options": {"include_usage": true},
                   // Not set by us: the client's fields pass.
                   "top_k": 20, "user": "client-user"})
        );
    }
}
