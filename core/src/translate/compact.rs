//! `POST /v1/responses/compact`: a Responses input window → a Chat request asking the
//! upstream to summarise it → a `response.compaction` object whose `compaction` item seals
//! the summary; and the way back, a `compaction` item in a later `input` → its summary as
//! context for the upstream.
//!
//! Stateless like the rest: the summary lives only inside the sealed item, sealed with the
//! operator keys of sealed reasoning ([`seal::Purpose::Compaction`], so that neither kind of
//! blob opens as the other).

use std::borrow::Cow;

use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Value};

use super::fields::{bad_value, missing};
use super::request::{
    check_part_size, input_messages, leftover_fields, merge_leading_system, parse_body,
    reject_stateful, system_message, Input, Translated,
};
use super::response::Completed;
use super::seal::{self, Purpose};
use super::{usage, Meta, Options, ResponsePlan};
use crate::chat;
use crate::openresponses::{ApiError, CompactionItem, Usage};

/// The system instruction of the summarising request (the first system message, merged with
/// the summaries of earlier compactions when the window carries some).
pub const PROMPT: &str = "You compress conversations. The messages that follow are a conversation between a user and an AI assistant, with its tool calls and their results. Write a summary that lets the assistant continue the conversation without the original messages: the user's goals and requests, decisions made, facts and results established (names, identifiers, numbers, code, tool results that matter), what has been done and what remains open. Be concise but complete. Write only the summary, in plain text, with no preamble.";

/// The last user message of the summarising request, so that a model does not answer the
/// conversation's own last question instead.
pub const REQUEST: &str =
    "Summarise the conversation above now, as instructed. Do not answer or continue it.";

/// Before the upstream's view of the instructions the client gave the compacted exchange.
const INSTRUCTIONS_NOTE: &str =
    "The assistant was following these instructions, which it will be given again (do not repeat them in the summary):\n";

/// How an opened summary is given to the upstream in a later request: a system message at
/// the head of the conversation (after the instructions), this prefix, then the summary.
pub const CONTEXT_PREFIX: &str =
    "Summary of the earlier part of this conversation (compacted; the original messages are not repeated):\n";

/// What the answer of a compact request keeps verbatim.
#[derive(Debug, Clone)]
pub struct Kept {
    /// The window's latest user message, as the client sent it (string content as one
    /// `input_text` part).
    message: Option<Value>,
}

/// The system message text of an opened summary.
pub(crate) fn context_text(summary: &str) -> String {
    let mut text = String::with_capacity(CONTEXT_PREFIX.len() + summary.len());
    text.push_str(CONTEXT_PREFIX);
    text.push_str(summary);
    text
}

/// Opens a `compaction` item's `encrypted_content`.
pub(crate) fn open(blob: &str, path: &str, options: &Options) -> Result<String, ApiError> {
    let keyring = options.keyring.as_ref().ok_or_else(|| {
        bad_value(
            path,
            format!("Invalid '{path}': this server has no keys configured to open compaction items (--reasoning-keys-file or RESPONSES_EXTPROC_REASONING_KEYS)."),
        )
        .with_code("invalid_encrypted_content")
    })?;
    keyring.open_for(Purpose::Compaction, blob).map_err(|e| {
        bad_value(
            path,
            format!("Invalid '{path}': it cannot be opened ({e}). Send compaction items back unchanged, to the server that produced them."),
        )
        .with_code("invalid_encrypted_content")
    })
}

/// Validates a compact request and builds the summarising Chat request.
pub fn translate(body: &[u8], options: &Options, meta: Meta) -> Result<Translated, ApiError> {
    let mut req = parse_body(body, options)?;
    if options.keyring.is_none() {
        // The summary can only travel sealed; without keys there is nothing to answer with.
        return Err(ApiError::invalid_body(
            "Compaction is not available: this server has no keys configured to seal compaction items (--reasoning-keys-file or RESPONSES_EXTPROC_REASONING_KEYS).",
        )
        .with_code("compaction_unavailable"));
    }
    reject_stateful(&mut req)?;
    req.object("client_metadata")?;
    let model = req.required_string("model")?;
    if model.is_empty() {
        return Err(bad_value("model", "Invalid 'model': must not be empty."));
    }
    if req.bool("stream")? == Some(true) {
        return Err(bad_value(
            "stream",
            "POST /v1/responses/compact answers with one JSON object and does not stream: omit 'stream' or set it to false.",
        )
        .with_code("unsupported_parameter"));
    }
    req.bool("store")?;
    // Accepted for compatibility with OpenAI's compact parameters; nothing to do with them.
    for key in [
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        "service_tier",
        "safety_identifier",
    ] {
        req.take(key);
    }

    let instructions = req.string("instructions")?;
    if let Some(i) = &instructions {
        check_part_size("instructions", i.len(), options)?;
    }
    let input = req.take("input").ok_or_else(|| missing("input"))?;
    let kept = latest_user_message(&input);
    // A `compaction_trigger` asks for what this endpoint does anyway.
    let window = input_messages(input, options)?;
    let messages = summarising_messages(instructions.as_deref(), window, options);

    let mut chat = chat::Request {
        model: model.clone(),
        messages,
        // Always one JSON answer: the summary is sealed whole.
        stream: Some(false),
        ..chat::Request::default()
    };
    // Like /v1/responses: unknown fields are the upstream's (vLLM's `chat_template_kwargs`).
    chat.extra = leftover_fields(&mut req, options)?;

    let mut plan = ResponsePlan::new(&model, false, meta, options.clone());
    plan.compact = Some(Box::new(Kept { message: kept }));
    Ok(Translated {
        body: Bytes::from(chat.encode()),
        plan,
    })
}

/// The Chat messages of a summarising request: the prompt (and the client's instructions,
/// as a note), the window's earlier summaries, the window, and the request to summarise it.
pub(crate) fn summarising_messages(
    instructions: Option<&str>,
    window: Input,
    options: &Options,
) -> Vec<chat::request::Message> {
    let mut prompt = PROMPT.to_owned();
    if let Some(instructions) = instructions {
        prompt.push_str("\n\n");
        prompt.push_str(INSTRUCTIONS_NOTE);
        prompt.push_str(instructions);
    }
    let Input {
        messages: mut conversation,
        mut context,
        ..
    } = window;
    let mut messages = vec![system_message(prompt, options)];
    messages.append(&mut context);
    messages.append(&mut conversation);
    messages.push(chat::request::Message::User {
        content: chat::request::Content::Text(REQUEST.to_owned()),
    });
    merge_leading_system(messages)
}

/// The window's latest user message, as an output message item.
fn latest_user_message(input: &Value) -> Option<Value> {
    let mut item = match input {
        Value::String(s) => json!({"role": "user", "content": s}),
        Value::Array(items) => items
            .iter()
            .rev()
            .find(|it| {
                it.get("role").and_then(Value::as_str) == Some("user")
                    && it
                        .get("type")
                        .and_then(Value::as_str)
                        .is_none_or(|t| t == "message")
            })?
            .clone(),
        _ => return None,
    };
    if let Some(text) = item.get("content").and_then(Value::as_str) {
        item["content"] = json!([{"type": "input_text", "text": text}]);
    }
    item["type"] = "message".into();
    item["status"] = "completed".into();
    Some(item)
}

#[derive(Debug, Serialize)]
#[serde(untagged)]
enum OutputItem {
    /// A kept message, verbatim.
    Message(Value),
    Compaction(crate::openresponses::OutputItem),
}

/// The summary `summary`, sealed into the `compaction` item that is output item `n` of
/// `plan` (`None` without keys: the request was refused then).
pub(crate) fn sealed(plan: &ResponsePlan, n: usize, summary: &str) -> Option<CompactionItem> {
    let keyring = plan.options.keyring.as_ref()?;
    Some(CompactionItem {
        id: plan.item_id("cmp", n),
        encrypted_content: keyring.seal_for(
            Purpose::Compaction,
            summary,
            seal::nonce(plan.id_seed, n as u64),
        ),
    })
}

/// The upstream answered a summarising request without a summary.
pub(crate) fn no_summary() -> ApiError {
    ApiError::server(
        502,
        "upstream_invalid_response",
        "The upstream's answer to the summarising request has no text.",
    )
}

/// The exchange cannot seal (a library caller without keys).
fn cannot_seal() -> ApiError {
    ApiError::server(
        500,
        "internal_error",
        "The exchange could not be completed: no keys to seal the compaction.",
    )
}

#[derive(Debug, Serialize)]
struct Compaction<'a> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    output: Vec<OutputItem>,
    usage: Usage,
}

/// The upstream's summary (a 2xx Chat Completion) → the `response.compaction` JSON body.
pub fn answer(plan: &ResponsePlan, body: &[u8]) -> Result<Completed, ApiError> {
    let invalid = |what: &str| {
        ApiError::server(
            502,
            "upstream_invalid_response",
            format!("The upstream's answer to the summarising request {what}."),
        )
    };
    let completion: chat::Completion<'_> =
        chat::parse(body).ok_or_else(|| invalid("is not a Chat Completion"))?;
    let choice = completion
        .choices
        .into_iter()
        .find(|c| c.index == 0)
        .ok_or_else(|| invalid("is not a Chat Completion"))?;
    let finish_reason = choice.finish_reason;
    let summary = choice
        .message
        .content
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(no_summary)?;
    let Some(kept) = &plan.compact else {
        return Err(ApiError::server(
            500,
            "internal_error",
            "The exchange could not be completed: not a compact request.",
        ));
    };
    let mut output = Vec::new();
    if let Some(mut message) = kept.message.clone() {
        if message.get("id").is_none_or(Value::is_null) {
            message["id"] = plan.item_id("msg", 0).into();
        }
        output.push(OutputItem::Message(message));
    }
    let item = sealed(plan, output.len(), &summary).ok_or_else(cannot_seal)?;
    output.push(OutputItem::Compaction(
        crate::openresponses::OutputItem::Compaction(item),
    ));
    let usage = completion.usage.as_ref().map(usage);
    let object = Compaction {
        id: &plan.id,
        object: "response.compaction",
        created_at: plan.created_at,
        output,
        usage: usage.unwrap_or_default(),
    };
    let body = serde_json::to_vec(&object).map(Bytes::from).map_err(|e| {
        ApiError::server(
            500,
            "internal_error",
            format!("could not encode the compaction: {e}"),
        )
    })?;
    Ok(Completed {
        body,
        usage,
        upstream_model: completion.model.map(Cow::into_owned),
        finish_reason: finish_reason.map(Cow::into_owned),
    })
}
