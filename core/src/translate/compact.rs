//! `POST /v1/responses/compact`: a Responses input window → a Chat request asking the
//! upstream to summarise it → a `response.compaction` object whose `compaction` item seals
//! the summary; and the way back, a `compaction` item in a later `input` → its summary as
//! context for the upstream.
//!
//! Stateless like the rest: the summary lives only inside the sealed item, sealed with the
//! operator keys of sealed reasoning (see `translate::compaction`, which seals and opens the
//! items; [`super::request`] builds the summarising messages).

use std::borrow::Cow;

use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Value};

pub use super::compaction::CONTEXT_PREFIX;
pub use super::request::{PROMPT, REQUEST};

use super::compaction::{no_summary, sealed};
use super::fields::{bad_value, missing};
use super::json::document::Node;
use super::request::{
    chat_model, check_part_size, input_messages, leftover_fields, model, parse_request,
    reject_stateful, summarising_messages, text, Translated,
};
use super::response::Completed;
use super::{usage, Kept, Meta, Options, ResponsePlan};
use crate::chat;
use crate::openresponses::{ApiError, CompactionItem, ErrorCode, Usage};

/// Validates a compact request and builds the summarising Chat request.
pub fn translate(body: &[u8], options: &Options, meta: Meta) -> Result<Translated, ApiError> {
    let mut req = parse_request(body, options)?;
    if options.keyring.is_none() {
        // The summary can only travel sealed; without keys there is nothing to answer with.
        return Err(ApiError::invalid_body(
            "Compaction is not available: this server has no keys configured to seal compaction items (--reasoning-keys-file or RESPONSES_EXTPROC_REASONING_KEYS).",
        )
        .with_code(ErrorCode::CompactionUnavailable));
    }
    // Every compaction is sealed, for the request's tenant.
    super::sealing::require_tenant(options)?;
    reject_stateful(&mut req)?;
    req.skip_object("client_metadata")?;
    let model = model(&mut req)?;
    if req.bool("stream")? == Some(true) {
        return Err(bad_value(
            "stream",
            "POST /v1/responses/compact answers with one JSON object and does not stream: omit 'stream' or set it to false.",
        )
        .with_code(ErrorCode::UnsupportedParameter));
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
        check_part_size("instructions", i, options)?;
    }
    let input = req.take("input").ok_or_else(|| missing("input"))?;
    let kept = latest_user_message(&input);
    // A `compaction_trigger` asks for what this endpoint does anyway.
    let window = input_messages(input, options)?;
    let messages = summarising_messages(instructions.map(text), window, options);

    let model_name = model.as_str().into_owned();
    let (chat_model_name, mapped) = chat_model(model, options);
    let mut chat = chat::Request {
        model: chat_model_name,
        messages,
        // Always one JSON answer: the summary is sealed whole.
        stream: Some(false),
        ..chat::Request::default()
    };
    // Like /v1/responses: unknown fields are the upstream's (vLLM's `chat_template_kwargs`).
    chat.extra = leftover_fields(&mut req, options)?;

    let mut plan = ResponsePlan::new(&model_name, false, meta, options.clone());
    plan.compact = Some(Box::new(Kept { message: kept }));
    Ok(Translated {
        body: Bytes::from(chat.encode(body.len() + PROMPT.len() + 1024)),
        plan,
        chat_model: mapped,
        compaction_due: None,
    })
}

/// The window's latest user message, as an output message item.
fn latest_user_message(input: &Node<'_>) -> Option<Value> {
    let is_str = |node: Option<&Node<'_>>, want: &str| match node {
        Some(Node::Str(s)) => *s == *want,
        _ => false,
    };
    let mut item = match input {
        Node::Str(s) => json!({"role": "user", "content": s.as_str()}),
        Node::Array(items) => {
            let found = items.iter().rev().find(|it| {
                let Node::Object(fields) = it else {
                    return false;
                };
                let get = |key: &str| fields.iter().find(|(k, _)| k == key).map(|(_, v)| v);
                is_str(get("role"), "user")
                    && match get("type") {
                        Some(Node::Str(t)) => *t == *"message",
                        _ => true,
                    }
            })?;
            serde_json::to_value(found).ok()?
        }
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

/// The exchange cannot seal (a library caller without keys).
fn cannot_seal() -> ApiError {
    ApiError::server(
        500,
        ErrorCode::InternalError,
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

/// The summary an upstream answered a summarising request with, and what it reported.
#[derive(Debug, Clone)]
pub struct Summarised {
    pub summary: String,
    pub usage: Option<Usage>,
    /// The model the upstream says answered.
    pub upstream_model: Option<String>,
    pub finish_reason: Option<String>,
}

/// A summarising request's 2xx answer (a Chat Completion) → its summary; 502
/// `upstream_invalid_response` when it is not one, or has no text.
pub fn summarised(body: &[u8]) -> Result<Summarised, ApiError> {
    let invalid = || {
        ApiError::server(
            502,
            ErrorCode::UpstreamInvalidResponse,
            "The upstream's answer to the summarising request is not a Chat Completion.",
        )
    };
    let completion: chat::Completion<'_> = chat::parse(body).ok_or_else(invalid)?;
    let choice = completion
        .choices
        .into_iter()
        .find(|c| c.index == 0)
        .ok_or_else(invalid)?;
    let summary = choice
        .message
        .content
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(no_summary)?;
    Ok(Summarised {
        summary: summary.into_owned(),
        usage: completion.usage.as_ref().map(usage),
        upstream_model: completion.model.map(Cow::into_owned),
        finish_reason: choice.finish_reason.map(Cow::into_owned),
    })
}

/// An automatic compaction's summary, sealed into the `compaction` item that leads the turn's
/// output (index 0 of the response `meta` makes); `None` without keys.
pub fn seal_lead(options: &Options, meta: Meta, summary: &str) -> Option<CompactionItem> {
    let plan = ResponsePlan::new("", false, meta, options.clone());
    sealed(&plan, 0, summary)
}

/// The upstream's summary (a 2xx Chat Completion) → the `response.compaction` JSON body.
pub fn answer(plan: &ResponsePlan, body: &[u8]) -> Result<Completed, ApiError> {
    let Summarised {
        summary,
        usage,
        upstream_model,
        finish_reason,
    } = summarised(body)?;
    let Some(kept) = &plan.compact else {
        return Err(ApiError::server(
            500,
            ErrorCode::InternalError,
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
            ErrorCode::InternalError,
            format!("could not encode the compaction: {e}"),
        )
    })?;
    Ok(Completed {
        body,
        usage,
        upstream_model,
        finish_reason,
    })
}
