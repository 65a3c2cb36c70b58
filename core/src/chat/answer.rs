//! The answers of a Chat Completions upstream: a `chat.completion` object and the
//! `chat.completion.chunk`s of a stream, parsed once, borrowing from the body.
//!
//! Every field is optional and unknown fields are skipped (serde's `IgnoredAny`: validated,
//! not kept): upstreams differ (vLLM adds `prompt_token_ids`, llama.cpp adds `timings`), and a
//! missing field must never be a parse failure when the rest of the answer is usable. A
//! field of the wrong type, or a known field given twice, is one.
//!
//! A stream parses one chunk per frame, so the types hold nothing they do not need: texts
//! are `Cow`s borrowed from the body (owned only when the JSON string has escapes), and what
//! only an error frame has is boxed, so that a chunk stays small to move. (Measured with
//! callgrind, the parse of a 215-byte vLLM chunk is about 5,600 instructions, of which 3,200
//! are serde_json reading the JSON at all: what `IgnoredAny` costs for the same frame.)

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Parses an upstream answer (a completion, a stream's chunk). The body is checked as UTF-8
/// once, whole: serde_json then reads its strings without checking each again (`from_str`),
/// and the answer borrows those without escapes. `None`: not UTF-8 or not that JSON.
pub fn parse<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Option<T> {
    let text = std::str::from_utf8(body).ok()?;
    serde_json::from_str(text).ok()
}

/// A JSON string, or `null`, borrowed from the body unless it has escapes. (serde borrows a
/// `Cow<str>` field only when it is not inside an `Option`: an `Option<Cow<str>>` would be a
/// new `String` for every text of every chunk.)
fn text<'de: 'a, 'a, D: Deserializer<'de>>(d: D) -> Result<Option<Cow<'a, str>>, D::Error> {
    #[derive(Deserialize)]
    struct Text<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Option::<Text<'a>>::deserialize(d)?.map(|t| t.0))
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
#[derive(Debug, Default, Deserialize)]
pub struct Completion<'a> {
    #[serde(borrow, default, deserialize_with = "text")]
    pub model: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "null_as_default")]
    pub choices: Vec<Choice<'a>>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

#[derive(Debug, Default, Deserialize)]
pub struct Choice<'a> {
    #[serde(default)]
    pub index: u32,
    #[serde(borrow, default, deserialize_with = "null_as_default")]
    pub message: Message<'a>,
    #[serde(borrow, default, deserialize_with = "text")]
    pub finish_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    pub logprobs: Option<Logprobs>,
}

/// The assistant message of a completion, or the delta of a chunk: the same fields, whole or
/// in pieces.
#[derive(Debug, Default, Deserialize)]
pub struct Message<'a> {
    #[serde(borrow, default, deserialize_with = "text")]
    pub content: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "text")]
    pub refusal: Option<Cow<'a, str>>,
    /// llama.cpp, DeepSeek and older vLLM.
    #[serde(borrow, default, deserialize_with = "text")]
    pub reasoning_content: Option<Cow<'a, str>>,
    /// vLLM 0.32 and later.
    #[serde(borrow, default, deserialize_with = "text")]
    pub reasoning: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "null_as_default")]
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
pub struct ToolCall<'a> {
    #[serde(default)]
    pub index: u32,
    #[serde(borrow, default, deserialize_with = "text")]
    pub id: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "null_as_default")]
    pub function: FunctionCall<'a>,
}

#[derive(Debug, Default, Deserialize)]
pub struct FunctionCall<'a> {
    #[serde(borrow, default, deserialize_with = "text")]
    pub name: Option<Cow<'a, str>>,
    /// JSON text, as the model wrote it (in pieces, in a stream).
    #[serde(borrow, default, deserialize_with = "text")]
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

/// `choices[].logprobs` of a completion or a chunk (only read when the client asked for
/// them: owned, they are few).
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
pub struct Chunk<'a> {
    #[serde(borrow, default, deserialize_with = "text")]
    pub model: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "null_as_default")]
    pub choices: Vec<ChunkChoice<'a>>,
    #[serde(default)]
    pub usage: Option<Usage>,
    /// `data: {"error": {...}}`: vLLM and llama.cpp report failures this way after the 200.
    /// Boxed: only an error frame has one, and every chunk would carry its size.
    #[serde(default)]
    pub error: Option<Box<Value>>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ChunkChoice<'a> {
    #[serde(default)]
    pub index: u32,
    #[serde(borrow, default, deserialize_with = "null_as_default")]
    pub delta: Delta<'a>,
    #[serde(borrow, default, deserialize_with = "text")]
    pub finish_reason: Option<Cow<'a, str>>,
    #[serde(default)]
    pub logprobs: Option<Logprobs>,
}

/// A chunk's delta has the fields of a message.
pub type Delta<'a> = Message<'a>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_borrow_from_the_body_unless_escaped() {
        let body = br#"{"choices":[{"index":0,"delta":{"content":"plain","refusal":"a\nb"}}]}"#;
        let chunk: Chunk<'_> = parse(body).unwrap();
        let delta = &chunk.choices[0].delta;
        assert!(matches!(delta.content, Some(Cow::Borrowed("plain"))));
        assert!(matches!(&delta.refusal, Some(Cow::Owned(s)) if s == "a\nb"));
    }
}
