//! The messages of a Chat request, typed: what the translation builds is what is sent, and
//! the rules that look at messages again (merging leading system messages, adding a tool
//! call to the assistant turn before it) match on variants instead of reading JSON back.

use serde::Serialize;
use serde_json::{Map, Value};

/// One Chat message. `role` is the tag; the fields follow in the order Chat servers show them.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    System {
        content: String,
    },
    /// What `developer` input and `instructions` become with `--developer-role developer`.
    Developer {
        content: String,
    },
    User {
        content: Content,
    },
    Assistant(Assistant),
    Tool {
        tool_call_id: String,
        content: String,
    },
}

/// An assistant turn of the history: text, a refusal, tool calls, and the reasoning that
/// preceded it (`reasoning_content`, the name vLLM and llama.cpp read back).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Assistant {
    /// `null` when the turn is only tool calls.
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
}

/// A user message's content: a string, or parts (text, images, files, video).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    Text { text: String },
    ImageUrl { image_url: ImageUrl },
    File { file: File },
    VideoUrl { video_url: VideoUrl },
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ImageUrl {
    pub url: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// Inline file data or a URL (exactly one), and its name.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct File {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_data: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub filename: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VideoUrl {
    pub url: String,
}

/// A tool call of an assistant turn (always a function call on the Chat side).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolCall {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    pub function: Function,
}

/// The only tool call type of Chat Completions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FunctionKind {
    Function,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Function {
    pub name: String,
    /// JSON text, as the model wrote it.
    pub arguments: String,
}

impl Message {
    /// The text of a system or developer message.
    pub fn system_text(&self) -> Option<&str> {
        match self {
            Message::System { content } | Message::Developer { content } => Some(content),
            _ => None,
        }
    }
}

/// A tool offered to the model: always a function on the Chat side (custom and namespaced
/// tools are mapped to functions).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Tool {
    #[serde(rename = "type")]
    pub kind: FunctionKind,
    pub function: ToolFunction,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolFunction {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// JSON Schema, passed through as the client wrote it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}
