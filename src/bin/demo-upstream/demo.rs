//! A built-in, deterministic Chat Completions server ("demo upstream").
//!
//! It lets people try the whole chain (client → Envoy → processor → upstream) without a model:
//! `demo-upstream --listen 127.0.0.1:18080`. The answers depend only on the
//! request, so tests can assert on them:
//!
//! * the request has `tools` and the last message is a `user` message → one call to the first
//!   tool (or the one named by `tool_choice`), id [`TOOL_CALL_ID`], arguments filling every
//!   `required` property of the tool's parameter schema with a fixed value
//!   ([`FIXED_STRING_ARG`] for strings), `finish_reason: "tool_calls"`; the functions that
//!   stand for the client-executed built-ins get fixed, meaningful arguments instead
//!   ([`builtin_arguments`]: `shell` runs `echo hello`, `apply_patch` creates `hello.txt`);
//! * the last message is a `tool` message → `The tool returned: <content>`;
//! * the first message is the processor's summarising instruction (a
//!   `/v1/responses/compact` request) → `Summary of the conversation: the user said: <each
//!   user text, joined by " / ">`;
//! * otherwise → `Hello! This is the demo upstream. You said: <last user text>`.
//!
//! Echoed text is cut to [`MAX_ECHO_CHARS`] characters, and whitespace is normalised to single
//! spaces so that the streamed words add up to exactly the non-streamed text. "Tokens" are
//! whitespace-separated words. `max_completion_tokens` (or the legacy `max_tokens`) cuts a text
//! answer and turns `finish_reason` into `"length"`. With `"stream": true` the answer is a real
//! `chat.completion.chunk` SSE stream, one word per chunk, [`CHUNK_DELAY`] apart.
//!
//! The server never logs message content.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::DefaultBodyLimit;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Map, Value};

/// The only model the demo lists in `GET /v1/models`. Requests may name any model: it is echoed.
pub const MODEL_ID: &str = "demo";
/// The id of the (only) tool call the demo makes.
pub const TOOL_CALL_ID: &str = "call_demo_1";
/// The value given to every required string argument of a tool call.
pub const FIXED_STRING_ARG: &str = "San Francisco, CA";
/// Echoed user or tool text is cut to this many characters.
pub const MAX_ECHO_CHARS: usize = 200;
/// The pause between two SSE chunks, so that streaming is visible to a person.
pub const CHUNK_DELAY: Duration = Duration::from_millis(20);
/// Largest accepted request body (image parts may be inline base64).
const BODY_LIMIT: usize = 16 * 1024 * 1024;
/// Tool-call arguments are streamed in fragments of at most this many characters.
const ARGUMENT_FRAGMENT_CHARS: usize = 8;

/// What the demo answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// An assistant text message.
    Text(String),
    /// One function tool call.
    ToolCall { name: String, arguments: String },
}

/// The complete, deterministic outcome of one Chat Completions request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The model name echoed back (`demo` when the request names none).
    pub model: String,
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    pub answer: Answer,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: &'static str,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
}

/// Parses a Chat Completions request body and decides the answer.
///
/// The error is a message fit for an OpenAI-style 400 error body (it never quotes the prompt).
pub fn plan(body: &[u8]) -> Result<Completion, String> {
    let request: Value = serde_json::from_slice(body)
        .map_err(|e| format!("We could not parse the JSON body of your request: {e}"))?;
    let request = request
        .as_object()
        .ok_or("The request body must be a JSON object.")?;
    let messages = match request.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        _ => return Err("'messages' must be a non-empty array.".to_string()),
    };
    if let Some((i, _)) = messages
        .iter()
        .enumerate()
        .find(|(_, m)| m.get("role").and_then(Value::as_str).is_none())
    {
        return Err(format!("'messages[{i}].role' must be a string."));
    }

    let model = request
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(MODEL_ID)
        .to_string();
    let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
    let include_usage = request
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true);
    let max_tokens = request
        .get("max_completion_tokens")
        .or_else(|| request.get("max_tokens"))
        .and_then(Value::as_u64);

    let prompt_tokens = messages.iter().map(message_words).sum();
    let last = &messages[messages.len() - 1];
    let last_role = last.get("role").and_then(Value::as_str).unwrap_or("");

    let tool = match last_role {
        "user" => choose_tool(request.get("tools"), request.get("tool_choice")),
        _ => None,
    };
    if let Some(tool) = tool {
        let name = tool_name(tool).unwrap_or("tool").to_string();
        let arguments = builtin_arguments(&name)
            .unwrap_or_else(|| fill_required_arguments(tool_parameters(tool)))
            .to_string();
        let completion_tokens = word_count(&arguments).max(1);
        return Ok(Completion {
            model,
            stream,
            include_usage,
            answer: Answer::ToolCall { name, arguments },
            finish_reason: "tool_calls",
            prompt_tokens,
            completion_tokens,
        });
    }

    let summarising = messages[0]
        .get("content")
        .and_then(Value::as_str)
        .is_some_and(|c| c.starts_with(responses_core::translate::compact::PROMPT));
    let text = if summarising {
        // All user messages but the last, which is the processor's request to summarise.
        let said: Vec<String> = messages[..messages.len() - 1]
            .iter()
            .filter(|m| m.get("role").and_then(Value::as_str) == Some("user"))
            .map(|m| content_text(m.get("content")).0)
            .collect();
        let said = said.join(" / ");
        format!(
            "Summary of the conversation: the user said: {}",
            truncate_chars(&said, MAX_ECHO_CHARS)
        )
    } else if last_role == "tool" {
        let (content, _) = content_text(last.get("content"));
        format!(
            "The tool returned: {}",
            truncate_chars(&content, MAX_ECHO_CHARS)
        )
    } else {
        let user = messages
            .iter()
            .rev()
            .find(|m| m.get("role").and_then(Value::as_str) == Some("user"));
        let (content, images) = content_text(user.and_then(|m| m.get("content")));
        let mut text = format!(
            "Hello! This is the demo upstream. You said: {}",
            truncate_chars(&content, MAX_ECHO_CHARS)
        );
        match images {
            0 => {}
            1 => text.push_str(" (and 1 image)"),
            n => text.push_str(&format!(" (and {n} images)")),
        }
        text
    };
    let mut words: Vec<&str> = text.split_whitespace().collect();
    let mut finish_reason = "stop";
    if let Some(max) = max_tokens {
        if words.len() as u64 > max {
            words.truncate(usize::try_from(max).unwrap_or(usize::MAX));
            finish_reason = "length";
        }
    }
    Ok(Completion {
        model,
        stream,
        include_usage,
        completion_tokens: words.len() as u64,
        answer: Answer::Text(words.join(" ")),
        finish_reason,
        prompt_tokens,
    })
}

fn word_count(s: &str) -> u64 {
    s.split_whitespace().count() as u64
}

/// Words of a message: its text content plus its tool calls' arguments.
fn message_words(message: &Value) -> u64 {
    let (text, _) = content_text(message.get("content"));
    let calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map(|calls| {
            calls
                .iter()
                .filter_map(|c| c.pointer("/function/arguments").and_then(Value::as_str))
                .map(word_count)
                .sum()
        })
        .unwrap_or(0);
    word_count(&text) + calls
}

/// The text of a message content (a string, or the `text` parts of an array joined by
/// spaces) and the number of image parts.
fn content_text(content: Option<&Value>) -> (String, usize) {
    match content {
        Some(Value::String(s)) => (s.clone(), 0),
        Some(Value::Array(parts)) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter_map(|p| match p.get("type").and_then(Value::as_str) {
                    Some("text") | None => p.get("text").and_then(Value::as_str),
                    _ => None,
                })
                .collect();
            let images = parts
                .iter()
                .filter(|p| {
                    matches!(
                        p.get("type").and_then(Value::as_str),
                        Some("image_url") | Some("input_image") | Some("image")
                    )
                })
                .count();
            (texts.join(" "), images)
        }
        _ => (String::new(), 0),
    }
}

fn truncate_chars(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((end, _)) => &s[..end],
        None => s,
    }
}

/// The tool to call: none when there are no function tools or `tool_choice` is `"none"`;
/// the named one for `{"type":"function","function":{"name":...}}` (if it exists); else the
/// first function tool.
fn choose_tool<'a>(tools: Option<&'a Value>, tool_choice: Option<&Value>) -> Option<&'a Value> {
    let tools: Vec<&Value> = tools?
        .as_array()?
        .iter()
        .filter(|t| tool_name(t).is_some())
        .collect();
    if tool_choice.and_then(Value::as_str) == Some("none") {
        return None;
    }
    let wanted = tool_choice.and_then(|c| {
        c.pointer("/function/name")
            .or_else(|| c.get("name"))
            .and_then(Value::as_str)
    });
    wanted
        .and_then(|w| tools.iter().copied().find(|t| tool_name(t) == Some(w)))
        .or_else(|| tools.first().copied())
}

/// Chat tools are `{"type":"function","function":{"name":...,"parameters":...}}`; the flat
/// Responses-style `{"type":"function","name":...}` is accepted too.
fn tool_name(tool: &Value) -> Option<&str> {
    tool.pointer("/function/name")
        .or_else(|| tool.get("name"))
        .and_then(Value::as_str)
}

fn tool_parameters(tool: &Value) -> Option<&Value> {
    tool.pointer("/function/parameters")
        .or_else(|| tool.get("parameters"))
}

/// The arguments of a call of the function that stands for a client-executed built-in tool
/// (the processor names it after the tool's type): a command or a patch a client can run.
pub fn builtin_arguments(name: &str) -> Option<Value> {
    Some(match name {
        "shell" => json!({"commands": ["echo hello"]}),
        "local_shell" => json!({"command": ["echo", "hello"]}),
        "apply_patch" => json!({"type": "create_file", "path": "hello.txt", "diff": "+hello\n"}),
        _ => return None,
    })
}

/// A JSON object with a fixed value for every `required` property of a parameter schema.
pub fn fill_required_arguments(schema: Option<&Value>) -> Value {
    let mut args = Map::new();
    let Some(schema) = schema else {
        return Value::Object(args);
    };
    let required = schema.get("required").and_then(Value::as_array);
    for name in required.into_iter().flatten().filter_map(Value::as_str) {
        let property = schema.get("properties").and_then(|p| p.get(name));
        args.insert(name.to_string(), fixed_value(property));
    }
    Value::Object(args)
}

fn fixed_value(property: Option<&Value>) -> Value {
    if let Some(first) = property
        .and_then(|p| p.get("enum"))
        .and_then(Value::as_array)
        .and_then(|e| e.first())
    {
        return first.clone();
    }
    let ty = property.and_then(|p| match p.get("type") {
        Some(Value::String(t)) => Some(t.as_str()),
        // e.g. ["string", "null"]: the first non-null type
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null"),
        _ => None,
    });
    match ty {
        Some("integer") | Some("number") => json!(1),
        Some("boolean") => json!(true),
        Some("array") => json!([]),
        Some("object") => json!({}),
        _ => json!(FIXED_STRING_ARG),
    }
}

fn usage_json(c: &Completion) -> Value {
    json!({
        "prompt_tokens": c.prompt_tokens,
        "completion_tokens": c.completion_tokens,
        "total_tokens": c.prompt_tokens + c.completion_tokens,
    })
}

/// The non-streaming `chat.completion` object.
pub fn completion_json(c: &Completion, id: &str, created: u64) -> Value {
    let message = match &c.answer {
        Answer::Text(text) => json!({"role": "assistant", "content": text}),
        Answer::ToolCall { name, arguments } => json!({
            "role": "assistant",
            "content": null,
            "tool_calls": [{
                "id": TOOL_CALL_ID,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }],
        }),
    };
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": c.model,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": c.finish_reason,
        }],
        "usage": usage_json(c),
    })
}

/// The SSE frames (`data: ...\n\n`) of the streaming answer, ending with `data: [DONE]`.
pub fn stream_frames(c: &Completion, id: &str, created: u64) -> Vec<String> {
    let chunk = |delta: Value, finish_reason: Option<&str>| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": c.model,
            "choices": [{
                "index": 0,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
        })
    };
    let mut chunks = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    match &c.answer {
        Answer::Text(text) => {
            for (i, word) in text.split(' ').filter(|w| !w.is_empty()).enumerate() {
                let piece = if i == 0 {
                    word.to_string()
                } else {
                    format!(" {word}")
                };
                chunks.push(chunk(json!({"content": piece}), None));
            }
        }
        Answer::ToolCall { name, arguments } => {
            chunks.push(chunk(
                json!({"tool_calls": [{
                    "index": 0,
                    "id": TOOL_CALL_ID,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }]}),
                None,
            ));
            let chars: Vec<char> = arguments.chars().collect();
            for fragment in chars.chunks(ARGUMENT_FRAGMENT_CHARS) {
                let fragment: String = fragment.iter().collect();
                chunks.push(chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}),
                    None,
                ));
            }
        }
    }
    chunks.push(chunk(json!({}), Some(c.finish_reason)));
    if c.include_usage {
        chunks.push(json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": c.model,
            "choices": [],
            "usage": usage_json(c),
        }));
    }
    let mut frames: Vec<String> = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    frames.push("data: [DONE]\n\n".to_string());
    frames
}

/// An OpenAI-style error body.
pub fn error_json(message: &str, code: Option<&str>) -> Value {
    json!({
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": null,
            "code": code,
        }
    })
}

/// The demo server's routes: `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`.
pub fn router() -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
}

/// Serves [`router`] on `listener` until the process ends (or the future is dropped).
pub async fn serve(listener: tokio::net::TcpListener) -> std::io::Result<()> {
    axum::serve(listener, router()).await
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn chat_completions(body: Bytes) -> Response {
    let completion = match plan(&body) {
        Ok(c) => c,
        Err(message) => {
            tracing::debug!("demo upstream: rejected a request (400)");
            return (StatusCode::BAD_REQUEST, Json(error_json(&message, None))).into_response();
        }
    };
    let id = format!("chatcmpl-demo-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let created = unix_now();
    tracing::debug!(
        stream = completion.stream,
        finish_reason = completion.finish_reason,
        prompt_tokens = completion.prompt_tokens,
        completion_tokens = completion.completion_tokens,
        "demo upstream: answered a chat completion"
    );
    if !completion.stream {
        return Json(completion_json(&completion, &id, created)).into_response();
    }
    let frames = stream_frames(&completion, &id, created).into_iter();
    let body = futures_util::stream::unfold((frames, true), |(mut frames, first)| async move {
        let frame = frames.next()?;
        if !first {
            tokio::time::sleep(CHUNK_DELAY).await;
        }
        Some((Ok::<_, Infallible>(Bytes::from(frame)), (frames, false)))
    });
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(body),
    )
        .into_response()
}

async fn models() -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "responses-extproc"}],
    }))
}

async fn health() -> &'static str {
    "ok"
}

async fn not_found() -> Response {
    (
        StatusCode::NOT_FOUND,
        Json(error_json(
            "The demo upstream serves only POST /v1/chat/completions, GET /v1/models and GET /health.",
            Some("not_found"),
        )),
    )
        .into_response()
}
