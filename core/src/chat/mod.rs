//! Wire types of the Chat Completions API: the request we send ([`Request`]) and the answers
//! the upstream sends ([`answer`]).

pub mod answer;
pub mod request;

use serde::Serialize;
use serde_json::{Map, Value};

pub use answer::{
    parse, Choice, Chunk, ChunkChoice, Completion, CompletionTokensDetails, Delta, FunctionCall,
    Logprobs, Message, PromptTokensDetails, TokenLogprob, ToolCall, TopLogprob, Usage,
};

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
