//! The request mapping's properties that a snapshot cannot state: sealed items that must open
//! again on a later turn (and never show their text), and the caps and drops that must hold
//! across a whole stream. Every exact input → output pair, valid or refused, is a snapshot in
//! `core/tests/snapshots/request/` (run by `core/tests/snapshots.rs`).

use crate::common;

use common::schema::assert_valid;
use responses_core::openresponses::ApiError;
use responses_core::translate::request::Translated;
use responses_core::translate::response::completion;
use responses_core::translate::seal::Keyring;
use responses_core::translate::stream::StreamTranslator;
use responses_core::translate::{translate_request, Meta, Options};
use serde_json::{json, Value};
use std::sync::Arc;

const NOW: u64 = 1_700_000_000;

fn meta() -> Meta {
    Meta {
        now: NOW,
        id_seed: 0xfeed,
    }
}

fn run(req: &Value, options: &Options) -> Result<Translated, ApiError> {
    translate_request(req.to_string().as_bytes(), options, meta())
}

/// Options with reasoning keys, as the binary always has.
fn keyed() -> Options {
    Options {
        keyring: Some(Arc::new(Keyring::single("k1", [7; 32]).unwrap())),
        ..Options::default()
    }
}

/// The `messages` of the Chat body for `input`.
#[track_caller]
fn messages(input: Value) -> Value {
    let t = run(&json!({"model": "m", "input": input}), &keyed())
        .unwrap_or_else(|e| panic!("expected {input} to translate, got {e}"));
    let chat: Value = serde_json::from_slice(&t.body).expect("the Chat body is JSON");
    chat["messages"].clone()
}

#[track_caller]
fn error_raw(body: &[u8], options: &Options) -> ApiError {
    match translate_request(body, options, meta()) {
        Ok(t) => panic!(
            "expected an error for {}, got the Chat body {}",
            String::from_utf8_lossy(body),
            String::from_utf8_lossy(&t.body)
        ),
        Err(e) => e,
    }
}

#[track_caller]
fn error(req: Value) -> ApiError {
    error_raw(req.to_string().as_bytes(), &Options::default())
}

/// The status and the envelope's `error` object, as the client gets them.
fn wire(e: &ApiError) -> (u16, Value) {
    let body: Value = serde_json::from_slice(&e.to_body()).expect("the envelope is JSON");
    (e.status, body["error"].clone())
}

/// Asserts a 400 `invalid_request_error` with exactly this param and code.
#[track_caller]
fn assert_400(e: &ApiError, param: Option<&str>, code: &str) {
    let (status, error) = wire(e);
    assert_eq!(status, 400, "{e}");
    assert_eq!(error["type"], "invalid_request_error", "{e}");
    assert_eq!(error["param"], json!(param), "{e}");
    assert_eq!(error["code"], code, "{e}");
}

/// A request with `input` and `extra` fields added.
fn with(extra: Value) -> Value {
    let mut req = json!({"model": "m", "input": "hi"});
    for (k, v) in extra.as_object().expect("extra is an object") {
        req[k] = v.clone();
    }
    req
}

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]},
           "strict": true})
}

fn time_tool() -> Value {
    json!({"type": "function", "name": "get_time"})
}

fn response_of(t: &Translated, chat_answer: Value) -> Value {
    let out = completion(&t.plan, chat_answer.to_string().as_bytes(), NOW).unwrap();
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn the_exchange_knows_the_model_and_whether_it_streams() {
    let t = run(&with(json!({"stream": true})), &Options::default()).unwrap();
    assert!(t.plan.is_stream());
    assert_eq!(t.plan.model(), "m");
    let t = run(&with(json!({"stream": false})), &Options::default()).unwrap();
    assert!(!t.plan.is_stream());
}

#[test]
fn sealed_reasoning_round_trips_and_tampering_is_rejected() {
    let req = json!({"model": "m", "input": "2+2?", "include": ["reasoning.encrypted_content"]});
    let t = run(&req, &keyed()).unwrap();
    let r = response_of(
        &t,
        json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"reasoning": "two plus two is four", "content": "4"}}]}),
    );
    assert_valid("ResponseResource", &r);
    let sealed = r["output"][0]["encrypted_content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!sealed.contains("four"));

    // The next turn carries the reasoning item back: the upstream sees the text again.
    let mut reasoning = r["output"][0].clone();
    reasoning["content"] = json!([]);
    let history = json!([{"role": "user", "content": "2+2?"}, reasoning, r["output"][1].clone(),
                         {"role": "user", "content": "and 3+3?"}]);
    let m = messages(history.clone());
    assert_eq!(m[1]["reasoning_content"], "two plus two is four");
    assert_eq!(m[1]["content"], "4");

    // Without the include, no blob.
    let plain = run(&json!({"model": "m", "input": "x"}), &keyed()).unwrap();
    let r2 = response_of(
        &plain,
        json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"reasoning": "t", "content": "4"}}]}),
    );
    assert!(r2["output"][0].get("encrypted_content").is_none());

    // Tampered, foreign, or sealed under a key we do not have: 400, no plaintext anywhere.
    let mut bytes = sealed.into_bytes();
    let last = bytes.len() - 1;
    bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
    for blob in [String::from_utf8(bytes).unwrap(), "opaque".to_owned()] {
        let mut item = reasoning.clone();
        item["encrypted_content"] = json!(blob);
        let e = error_raw(
            json!({"model": "m", "input": [item, {"role": "user", "content": "q"}]})
                .to_string()
                .as_bytes(),
            &keyed(),
        );
        assert_400(
            &e,
            Some("input[0].encrypted_content"),
            "invalid_encrypted_content",
        );
        assert!(!wire(&e).1.to_string().contains("four"));
    }
    let other_key = Options {
        keyring: Some(Arc::new(Keyring::single("k2", [9; 32]).unwrap())),
        ..Options::default()
    };
    let e = error_raw(
        json!({"model": "m", "input": history})
            .to_string()
            .as_bytes(),
        &other_key,
    );
    assert_400(
        &e,
        Some("input[1].encrypted_content"),
        "invalid_encrypted_content",
    );
    // No keys at all: asking for sealed reasoning is a clear 400.
    assert_400(&error(req), Some("include"), "unsupported_parameter");
}

#[test]
fn a_compaction_triggers_answer_is_one_sealed_compaction_item_that_opens_later() {
    let req = json!({"model": "m", "input": [
        {"type": "message", "role": "user", "content": "I am Ada"},
        {"type": "compaction_trigger"}]});
    let t = run(&req, &keyed()).unwrap();
    let r = response_of(
        &t,
        json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"content": "The user is Ada.", "reasoning_content": "hmm"}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}),
    );
    assert_eq!(r["status"], "completed");
    let out = r["output"].as_array().unwrap();
    assert_eq!(out.len(), 1, "{r}");
    assert_eq!(out[0]["type"], "compaction");
    assert!(out[0]["id"].as_str().unwrap().starts_with("cmp_"));
    assert_eq!(r["usage"]["output_tokens"], 4);
    // The item goes back like /v1/responses/compact's: its summary heads the conversation.
    let next = messages(json!([out[0].clone(), {"role": "user", "content": "Who am I?"}]));
    assert_eq!(
        next[0]["content"],
        format!(
            "{}The user is Ada.",
            responses_core::translate::compact::CONTEXT_PREFIX
        )
    );
    // No summary: 502.
    let out = completion(
        &t.plan,
        json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": " "}}]})
            .to_string()
            .as_bytes(),
        NOW,
    )
    .unwrap_err();
    let (status, error) = wire(&out);
    assert_eq!(
        (status, &error["code"]),
        (502, &json!("upstream_invalid_response"))
    );
}

#[test]
fn streams_seal_reasoning_and_cap_tool_calls_too() {
    let req = with(
        json!({"stream": true, "include": ["reasoning.encrypted_content"],
                          "tools": [weather_tool(), time_tool()], "max_tool_calls": 1}),
    );
    let t = run(&req, &keyed()).unwrap();
    let mut s = StreamTranslator::new(t.plan);
    let body = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hmm\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[",
        "{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{}\"}},",
        "{\"index\":1,\"id\":\"c2\",\"function\":{\"name\":\"get_time\",\"arguments\":\"{}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n"
    );
    let mut out = s.push(body.as_bytes(), NOW).to_vec();
    out.extend_from_slice(&s.finish(NOW));
    let text = String::from_utf8(out).unwrap();
    let completed: Value = text
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("event: response.completed\ndata: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .next()
        .expect("a completed event");
    let output = completed["response"]["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "reasoning + one call: {output:?}");
    assert!(output[0]["encrypted_content"]
        .as_str()
        .is_some_and(|b| !b.contains("hmm")));
    assert_eq!(output[1]["call_id"], "c1");
    assert!(
        !text.contains(r#""call_id":"c2""#),
        "the dropped call never reaches the client"
    );
}

#[test]
fn streamed_logprobs_count_toward_the_output_cap() {
    let tight = Options {
        max_output_bytes: 2_000,
        ..keyed()
    };
    let t = run(
        &with(
            json!({"stream": true, "include": ["message.output_text.logprobs"], "top_logprobs": 5}),
        ),
        &tight,
    )
    .unwrap();
    let mut s = StreamTranslator::new(t.plan);
    let top: Vec<Value> = (0..5)
        .map(|i| json!({"token": format!("tok{i}"), "logprob": -1.0}))
        .collect();
    let frame = json!({"choices": [{"index": 0, "delta": {"content": "a"},
        "logprobs": {"content": [{"token": "a", "logprob": -0.1, "top_logprobs": top}]}}]});
    let mut out = Vec::new();
    for _ in 0..200 {
        out.extend_from_slice(&s.push(format!("data: {frame}\n\n").as_bytes(), NOW));
    }
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("event: response.failed"),
        "tiny text, large logprobs: capped"
    );
    assert!(text.contains("response_too_large"));
    // The first deltas did carry their logprobs.
    assert!(text.contains(r#""logprobs":[{"token":"a""#));
}

/// A `model` is sent on as a request header (the model header Envoy routes on): one that
/// cannot be a header value is refused with a 400 naming `model` before anything is sent, on
/// both endpoints and however the JSON wrote it (escaped or not). Tab is a header's own
/// character; the length cap is counted on the text, escapes decoded.
#[test]
fn a_model_that_cannot_be_a_header_value_is_refused() {
    use responses_core::translate::compact;
    use responses_core::translate::request::MAX_MODEL_BYTES;

    let compact_error = |model: &Value| match compact::translate(
        json!({"model": model, "input": "hi"})
            .to_string()
            .as_bytes(),
        &keyed(),
        meta(),
    ) {
        Ok(_) => panic!("expected /compact to refuse {model}"),
        Err(e) => e,
    };
    for model in ["m\nx-evil: 1", "m\r", "m\u{0}", "\u{1f}m", "m\u{7f}"] {
        let e = error(json!({"model": model, "input": "hi"}));
        assert_400(&e, Some("model"), "invalid_value");
        assert!(e.to_string().contains("control character U+"), "{e}");
        assert_400(
            &compact_error(&json!(model)),
            Some("model"),
            "invalid_value",
        );
    }
    // Written raw in the body rather than escaped by serde_json: the same answer.
    let raw = br#"{"model": "m\u000ax", "input": "hi"}"#;
    assert_400(
        &error_raw(raw, &Options::default()),
        Some("model"),
        "invalid_value",
    );

    // At the cap (multi-byte characters count in bytes; escapes as the text they stand for).
    let at_cap = format!("{}é", "m".repeat(MAX_MODEL_BYTES - 2));
    assert_eq!(at_cap.len(), MAX_MODEL_BYTES);
    let t = run(
        &json!({"model": at_cap, "input": "hi"}),
        &Options::default(),
    )
    .unwrap();
    assert_eq!(t.plan.model(), at_cap);
    let escaped = format!(
        r#"{{"model": "{}\u00e9", "input": "hi"}}"#,
        "m".repeat(MAX_MODEL_BYTES - 2)
    );
    translate_request(escaped.as_bytes(), &Options::default(), meta()).unwrap();
    let tab = run(
        &json!({"model": "m\tq", "input": "hi"}),
        &Options::default(),
    )
    .unwrap();
    assert_eq!(tab.plan.model(), "m\tq");
    // One byte over; far over.
    for over in [format!("{at_cap}m"), "m".repeat(1 << 20)] {
        let e = error(json!({"model": over, "input": "hi"}));
        assert_400(&e, Some("model"), "invalid_value");
        assert!(e.to_string().contains("longer than 1024 bytes"), "{e}");
        assert_400(&compact_error(&json!(over)), Some("model"), "invalid_value");
    }
}
