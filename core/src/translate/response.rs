//! Upstream answers that are not streams: a `chat.completion` → `ResponseResource` (anything
//! that is not a success is `crate::upstream_failure`'s).

use std::borrow::Cow;

use bytes::Bytes;

use super::{finish_status, logprobs, usage, Progress, ResponsePlan};
use crate::chat;
use crate::openresponses::{
    ApiError, ErrorCode, ItemStatus, MessageItem, OutputContent, OutputItem, Phase, ReasoningItem,
    ReasoningText, Status, Usage,
};

/// Translates a 2xx Chat Completions JSON body into the `ResponseResource` JSON body.
pub fn completion(plan: &ResponsePlan, body: &[u8], now: u64) -> Result<Bytes, ApiError> {
    translate_completion(plan, body, now).map(|c| c.body)
}

/// A translated JSON answer and what it reports, for logs, metrics and Envoy's metadata.
#[derive(Debug, Clone)]
pub struct Completed {
    pub body: Bytes,
    pub usage: Option<Usage>,
    /// The model the upstream says answered.
    pub upstream_model: Option<String>,
    /// The upstream's `finish_reason` (`stop`, `length`, `tool_calls`, ...).
    pub finish_reason: Option<String>,
}

/// [`completion`], with the usage and the upstream's model.
pub fn translate_completion(
    plan: &ResponsePlan,
    body: &[u8],
    now: u64,
) -> Result<Completed, ApiError> {
    let completion: chat::Completion<'_> = chat::parse(body).ok_or_else(not_a_completion)?;
    let choice = completion
        .choices
        .into_iter()
        .find(|c| c.index == 0)
        .ok_or_else(not_a_completion)?;
    let (status, incomplete) = finish_status(choice.finish_reason.as_deref());
    let finish_reason = choice.finish_reason;
    let item_status = if status == Status::Incomplete {
        ItemStatus::Incomplete
    } else {
        ItemStatus::Completed
    };

    // After an automatic compaction its item comes first, the turn's after it.
    let mut output = plan.lead_output();
    let message = choice.message;
    if plan.compaction {
        // A `compaction_trigger` request: the summary, sealed, is the only output item.
        let summary = message
            .content
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(super::compaction::no_summary)?;
        let item = super::compaction::sealed(plan, 0, &summary).ok_or_else(|| {
            ApiError::server(
                500,
                ErrorCode::InternalError,
                "no keys to seal the compaction",
            )
        })?;
        output.push(OutputItem::Compaction(item));
    } else {
        answer_items(
            plan,
            message,
            choice.logprobs.as_ref(),
            item_status,
            &mut output,
        );
    }
    let progress = Progress {
        status,
        completed_at: Some(now),
        incomplete,
        error: None,
        usage: plan.usage(completion.usage.as_ref().map(usage)),
    };
    let resource = plan.resource(&progress, &output);
    // Written into one buffer sized for the answer's text and the object around it (about
    // 1 KB, more with echoed tools), instead of one grown from nothing.
    let mut out = Vec::with_capacity(body.len() + 2048);
    serde_json::to_writer(&mut out, &resource).map_err(|e| {
        ApiError::server(
            500,
            ErrorCode::InternalError,
            format!("could not encode the response: {e}"),
        )
    })?;
    Ok(Completed {
        body: Bytes::from(out),
        usage: progress.usage,
        upstream_model: completion.model.map(Cow::into_owned),
        finish_reason: finish_reason.map(Cow::into_owned),
    })
}

/// The output items of one Chat answer: its reasoning, its message (text and refusal), its
/// tool calls (up to `max_tool_calls`), as the client declared the tools.
fn answer_items(
    plan: &ResponsePlan,
    message: chat::Message<'_>,
    lp: Option<&chat::Logprobs>,
    item_status: ItemStatus,
    output: &mut Vec<OutputItem>,
) {
    if let Some(reasoning) = message.reasoning_text() {
        let n = output.len();
        output.push(OutputItem::Reasoning(ReasoningItem {
            id: plan.item_id("rs", n),
            summary: Vec::new(),
            content: vec![ReasoningText {
                text: reasoning.to_owned(),
            }],
            encrypted_content: plan.seal(n, reasoning),
        }));
    }
    let mut content = Vec::new();
    let text = message.content.filter(|t| !t.is_empty());
    let refusal = message.refusal.filter(|r| !r.is_empty());
    // An answer with nothing else still gets its (empty) text, so `output` is never empty.
    if text.is_some() || (refusal.is_none() && message.tool_calls.is_empty()) {
        let logprobs = if plan.logprobs {
            logprobs(lp)
        } else {
            Vec::new()
        };
        content.push(OutputContent::OutputText {
            text: text.map(Cow::into_owned).unwrap_or_default(),
            annotations: Vec::new(),
            logprobs,
        });
    }
    if let Some(refusal) = refusal {
        content.push(OutputContent::Refusal {
            refusal: refusal.into_owned(),
        });
    }
    if !content.is_empty() {
        output.push(OutputItem::Message(MessageItem {
            id: plan.item_id("msg", output.len()),
            status: item_status,
            role: "assistant".into(),
            content,
            // Talk on the way to tool calls, or the answer.
            phase: Some(if message.tool_calls.is_empty() {
                Phase::FinalAnswer
            } else {
                Phase::Commentary
            }),
        }));
    }
    for (calls, call) in message.tool_calls.into_iter().enumerate() {
        // `max_tool_calls`: calls beyond the limit are dropped (a Chat upstream cannot be told).
        if plan.over_tool_call_limit(calls) {
            break;
        }
        let n = output.len();
        let name = call.function.name.map(Cow::into_owned).unwrap_or_default();
        let arguments = call.function.arguments.map(Cow::into_owned);
        output.push(plan.call_item(
            n,
            call.id.map(Cow::into_owned),
            name,
            arguments.unwrap_or_default(),
            item_status,
        ));
    }
}

fn not_a_completion() -> ApiError {
    ApiError::server(
        502,
        ErrorCode::UpstreamInvalidResponse,
        "The upstream answered with a body that is not a Chat Completion.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openresponses::Code;
    use crate::translate::{Meta, Options};
    use serde_json::Value;

    fn plan() -> ResponsePlan {
        ResponsePlan::new(
            "m",
            false,
            Meta {
                now: 100,
                id_seed: 7,
            },
            Options::default(),
        )
    }

    fn translate(body: Value) -> Value {
        let out = completion(&plan(), body.to_string().as_bytes(), 123).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn text_answer_becomes_one_message_with_usage() {
        let r = translate(serde_json::json!({
            "object": "chat.completion", "choices": [{"index": 0, "finish_reason": "stop",
              "message": {"role": "assistant", "content": "Hi there"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                      "prompt_tokens_details": {"cached_tokens": 3}}}));
        assert_eq!(r["status"], "completed");
        assert_eq!(r["completed_at"], 123);
        assert_eq!(r["created_at"], 100);
        assert_eq!(r["object"], "response");
        assert_eq!(r["store"], false);
        assert!(r["id"].as_str().unwrap().starts_with("resp_"));
        let out = r["output"].as_array().unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["type"], "message");
        assert!(out[0]["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(out[0]["content"][0]["text"], "Hi there");
        assert_eq!(out[0]["content"][0]["annotations"], serde_json::json!([]));
        assert_eq!(r["usage"]["input_tokens"], 5);
        assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 3);
        assert_eq!(r["usage"]["output_tokens_details"]["reasoning_tokens"], 0);
    }

    #[test]
    fn reasoning_under_either_name_and_tool_calls() {
        for key in ["reasoning", "reasoning_content"] {
            let r = translate(
                serde_json::json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
                "message": {key: "think", "content": null, "tool_calls": [
                  {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}},
                  {"id": "call_b", "type": "function", "function": {"name": "g", "arguments": "{}"}}]}}]}),
            );
            let out = r["output"].as_array().unwrap();
            let types: Vec<&str> = out.iter().map(|i| i["type"].as_str().unwrap()).collect();
            assert_eq!(types, ["reasoning", "function_call", "function_call"]);
            assert_eq!(
                out[0]["content"][0],
                serde_json::json!({"type": "reasoning_text", "text": "think"})
            );
            assert_eq!(out[1]["call_id"], "call_a");
            assert_eq!(out[2]["name"], "g");
            assert!(out[1]["id"].as_str().unwrap().starts_with("fc_"));
            assert_ne!(out[1]["id"], out[2]["id"]);
            assert_eq!(r["usage"], Value::Null);
        }
    }

    #[test]
    fn length_and_content_filter_are_incomplete() {
        for (finish, reason) in [
            ("length", "max_output_tokens"),
            ("content_filter", "content_filter"),
        ] {
            let r = translate(
                serde_json::json!({"choices": [{"index": 0, "finish_reason": finish,
                "message": {"content": "abc"}}]}),
            );
            assert_eq!(r["status"], "incomplete");
            assert_eq!(r["incomplete_details"]["reason"], reason);
            assert_eq!(r["output"][0]["status"], "incomplete");
        }
    }

    #[test]
    fn refusal_is_a_refusal_part() {
        let r = translate(
            serde_json::json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"content": null, "refusal": "no"}}]}),
        );
        assert_eq!(
            r["output"][0]["content"],
            serde_json::json!([{"type": "refusal", "refusal": "no"}])
        );
    }

    #[test]
    fn non_completion_bodies_are_502() {
        for body in [&b"not json"[..], b"{}", b"{\"choices\": []}", b"[1]"] {
            let e = completion(&plan(), body, 1).unwrap_err();
            assert_eq!(e.status, 502);
            assert_eq!(
                e.code.as_ref().map(Code::as_str),
                Some("upstream_invalid_response")
            );
        }
    }
}
