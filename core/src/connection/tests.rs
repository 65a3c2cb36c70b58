//! The connection's rules with plain bytes: messages in, Chat requests and events out.

use super::*;
use serde_json::json;

const SSE: &str = "text/event-stream";

fn settings() -> Arc<Settings> {
    Arc::new(Settings::default())
}

fn limits() -> Limits {
    Limits {
        max_message_bytes: 64 * 1024,
        max_context_bytes: 1 << 20,
    }
}

fn connection() -> Connection {
    Connection::new(settings(), limits(), ReasoningEvents::Spec)
}

/// The time of an input: these tests do not look at timing (the driver's tests do).
/// The headers of an answer that has none worth reading.
fn no_headers() -> [(&'static str, &'static str); 0] {
    []
}

fn at() -> Instant {
    Instant::now()
}

fn meta(seed: u128) -> Meta {
    Meta {
        now: 1_700_000_000,
        id_seed: seed,
    }
}

fn create(body: serde_json::Value) -> Vec<u8> {
    let mut body = body;
    body["type"] = json!("response.create");
    serde_json::to_vec(&body).unwrap()
}

/// A Chat stream that says `text` and stops.
fn chat_stream(text: &str) -> String {
    let chunk = |delta: serde_json::Value, finish: Option<&str>| {
        format!(
            "data: {}\n\n",
            json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut s = chunk(json!({"role": "assistant", "content": text}), None);
    s.push_str(&chunk(json!({}), Some("stop")));
    s.push_str("data: [DONE]\n\n");
    s
}

fn forward(conn: &mut Connection, message: &[u8], seed: u128) -> UpstreamRequest {
    match conn.on_text(message, meta(seed), at()) {
        Start::Forward(up) => up,
        Start::Reject(r) => panic!("rejected: {}", String::from_utf8_lossy(&r.frame)),
        Start::Answered(_) => panic!("answered without the upstream"),
    }
}

fn reject(conn: &mut Connection, message: &[u8]) -> serde_json::Value {
    match conn.on_text(message, meta(9), at()) {
        Start::Reject(r) => serde_json::from_slice(&r.frame).unwrap(),
        Start::Forward(up) => panic!("forwarded: {}", String::from_utf8_lossy(&up.body)),
        Start::Answered(_) => panic!("answered instead of refused"),
    }
}

fn events(frames: &Frames) -> Vec<serde_json::Value> {
    frames
        .messages
        .iter()
        .map(|m| serde_json::from_slice(m).expect("each message is one JSON object"))
        .collect()
}

/// Runs one response to its end with a stream that says `text`; returns its events.
fn answer(conn: &mut Connection, text: &str) -> Vec<serde_json::Value> {
    let head = conn.upstream_head(200, SSE, no_headers, 1, at());
    assert!(head.messages.is_empty() && !head.done);
    let frames = conn.upstream_body(chat_stream(text).as_bytes(), true, 2, at());
    assert!(frames.done, "the stream ended");
    assert!(!conn.in_flight());
    events(&frames)
}

fn code(frame: &serde_json::Value) -> &str {
    frame["error"]["code"].as_str().unwrap_or("")
}

#[test]
fn a_create_streams_events_as_messages_numbered_from_zero() {
    let mut conn = connection();
    let up = forward(&mut conn, &create(json!({"model": "m", "input": "hi"})), 1);
    assert!(up.stream, "every response on a socket is streamed");
    let chat: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
    assert_eq!(chat["stream"], json!(true));
    assert_eq!(chat["messages"], json!([{"role": "user", "content": "hi"}]));
    assert!(conn.in_flight());

    let events = answer(&mut conn, "Hello");
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"response.created"));
    assert_eq!(types.last(), Some(&"response.completed"));
    assert!(types.contains(&"response.output_text.delta"));
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], json!(i), "{e}");
    }
    // The next response numbers its events from 0 again.
    forward(
        &mut conn,
        &create(json!({"model": "m", "input": "again"})),
        2,
    );
    assert_eq!(answer(&mut conn, "x")[0]["sequence_number"], json!(0));
}

#[test]
fn a_continuation_sends_the_whole_context_and_echoes_the_id() {
    let mut conn = connection();
    forward(
        &mut conn,
        &create(json!({"model": "m", "instructions": "be brief", "input": "first question"})),
        1,
    );
    let done = answer(&mut conn, "first answer");
    let id = done.last().unwrap()["response"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(conn.context_bytes() > 0);

    let next = create(json!({"model": "m", "previous_response_id": id,
        "input": [{"role": "user", "content": "second question"}]}));
    let up = forward(&mut conn, &next, 2);
    let chat: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
    // Instructions are not carried over (as over HTTP, each request gives its own).
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "first answer"},
            {"role": "user", "content": "second question"}
        ])
    );
    let events = answer(&mut conn, "second answer");
    let last = events.last().unwrap();
    assert_eq!(last["response"]["previous_response_id"], json!(id));

    // The continuation is now the context: a third turn sees all three.
    let second = last["response"]["id"].as_str().unwrap().to_owned();
    let up = forward(
        &mut conn,
        &create(json!({"model": "m", "previous_response_id": second, "input": "third"})),
        3,
    );
    let chat: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
    assert_eq!(chat["messages"].as_array().unwrap().len(), 5);
}

#[test]
fn only_the_last_response_can_be_continued() {
    let mut conn = connection();
    forward(&mut conn, &create(json!({"model": "m", "input": "one"})), 1);
    let first = answer(&mut conn, "a").last().unwrap()["response"]["id"].clone();
    forward(&mut conn, &create(json!({"model": "m", "input": "two"})), 2);
    answer(&mut conn, "b");
    let frame = reject(
        &mut conn,
        &create(json!({"model": "m", "previous_response_id": first, "input": "x"})),
    );
    assert_eq!(code(&frame), "previous_response_not_found");
    assert_eq!(frame["status"], json!(400));
    assert_eq!(frame["type"], json!("error"));
    assert_eq!(frame["error"]["param"], json!("previous_response_id"));
}

#[test]
fn an_unknown_id_leaves_the_context_in_place() {
    let mut conn = connection();
    forward(&mut conn, &create(json!({"model": "m", "input": "one"})), 1);
    let id = answer(&mut conn, "a").last().unwrap()["response"]["id"].clone();
    let frame = reject(
        &mut conn,
        &create(json!({"model": "m", "previous_response_id": "resp_other", "input": "x"})),
    );
    assert_eq!(code(&frame), "previous_response_not_found");
    forward(
        &mut conn,
        &create(json!({"model": "m", "previous_response_id": id, "input": "x"})),
        2,
    );
}

#[test]
fn a_failed_continuation_evicts_the_context() {
    // Failing upstream (an error status), failing translation (a 400) and a failed stream
    // each evict what they continued.
    let failures: [fn(&mut Connection, &str) -> Frames; 4] = [
        // The official suite's `websocket-failed-continuation-evicts-cache`: an output whose
        // call is in neither the kept context nor the request.
        |conn, id| {
            let bad = create(json!({"model": "m", "previous_response_id": id, "input": [
                {"type": "function_call_output", "call_id": "call_openresponses_missing",
                 "output": "No matching tool call exists in the previous response."}]}));
            match conn.on_text(&bad, meta(2), at()) {
                Start::Reject(r) => {
                    let frame: serde_json::Value = serde_json::from_slice(&r.frame).unwrap();
                    assert_eq!(frame["error"]["param"], "input[2].call_id", "{frame}");
                    assert!(frame["error"]["message"]
                        .as_str()
                        .unwrap()
                        .starts_with("No tool call found for function call output with call_id call_openresponses_missing."));
                    Frames {
                        messages: vec![r.frame],
                        done: true,
                    }
                }
                Start::Forward(_) | Start::Answered(_) => {
                    panic!("an output without its call was not refused")
                }
            }
        },
        |conn, id| {
            forward(
                conn,
                &create(json!({"model": "m", "previous_response_id": id, "input": "x"})),
                2,
            );
            conn.upstream_head(500, "application/json", no_headers, 1, at());
            conn.upstream_body(br#"{"error":{"message":"boom"}}"#, true, 1, at())
        },
        |conn, id| {
            let bad = create(
                json!({"model": "m", "previous_response_id": id, "input": "x",
                "temperature": "hot"}),
            );
            match conn.on_text(&bad, meta(2), at()) {
                Start::Reject(r) => Frames {
                    messages: vec![r.frame],
                    done: true,
                },
                Start::Forward(_) | Start::Answered(_) => {
                    panic!("a bad temperature was not refused")
                }
            }
        },
        |conn, id| {
            forward(
                conn,
                &create(json!({"model": "m", "previous_response_id": id, "input": "x"})),
                2,
            );
            conn.upstream_head(200, SSE, no_headers, 1, at());
            conn.upstream_body(
                b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"par\"}}]}\n\n",
                false,
                1,
                at(),
            );
            conn.upstream_failed(ErrorCode::UpstreamUnavailable, "reset", 1, at())
        },
    ];
    for fail in failures {
        let mut conn = connection();
        forward(&mut conn, &create(json!({"model": "m", "input": "one"})), 1);
        let id = answer(&mut conn, "a").last().unwrap()["response"]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let frames = fail(&mut conn, &id);
        assert!(frames.done);
        let last: serde_json::Value =
            serde_json::from_slice(frames.messages.last().unwrap()).unwrap();
        assert!(
            last["type"] == "error" || last["type"] == "response.failed",
            "{last}"
        );
        let frame = reject(
            &mut conn,
            &create(json!({"model": "m", "previous_response_id": id, "input": "x"})),
        );
        assert_eq!(code(&frame), "previous_response_not_found", "{frame}");
        assert_eq!(conn.context_bytes(), 0);
    }
}

/// The kept context counts as the request's items: an output may answer a call the kept
/// response made.
#[test]
fn an_output_may_answer_a_call_of_the_kept_context() {
    let mut conn = connection();
    forward(
        &mut conn,
        &create(json!({"model": "m", "input": "weather?",
                       "tools": [{"type": "function", "name": "get_weather"}]})),
        1,
    );
    conn.upstream_head(200, SSE, no_headers, 1, at());
    let call = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,",
        "\"id\":\"call_w\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",",
        "\"arguments\":\"{}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n"
    );
    let frames = conn.upstream_body(call.as_bytes(), true, 2, at());
    let id = events(&frames).last().unwrap()["response"]["id"].clone();
    let up = forward(
        &mut conn,
        &create(json!({"model": "m", "previous_response_id": id, "input": [
            {"type": "function_call_output", "call_id": "call_w", "output": "sunny"}]})),
        2,
    );
    let chat: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
    assert_eq!(
        chat["messages"][2],
        json!({"role": "tool", "tool_call_id": "call_w", "content": "sunny"})
    );
}

/// A compaction (Codex's `compaction_trigger`) replaces what it summarised: continuing it
/// sends the sealed summary, not the window again.
#[test]
fn the_context_of_a_compaction_is_its_summary() {
    let settings = Arc::new(Settings {
        options: crate::translate::Options {
            keyring: Some(Arc::new(
                crate::translate::seal::Keyring::single("k1", [9; 32]).unwrap(),
            )),
            ..crate::translate::Options::default()
        },
        ..Settings::default()
    });
    let mut conn = Connection::new(settings, limits(), ReasoningEvents::Spec);
    forward(
        &mut conn,
        &create(json!({"model": "m", "input": [
            {"role": "user", "content": "I am Ada"}, {"type": "compaction_trigger"}]})),
        1,
    );
    let done = answer(&mut conn, "The user is Ada.");
    let last = done.last().unwrap();
    assert_eq!(last["response"]["output"][0]["type"], "compaction");
    let id = last["response"]["id"].clone();
    let up = forward(
        &mut conn,
        &create(json!({"model": "m", "previous_response_id": id, "input": "Who am I?"})),
        2,
    );
    let chat: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "system", "content": format!("{}The user is Ada.", crate::translate::compact::CONTEXT_PREFIX)},
            {"role": "user", "content": "Who am I?"}
        ])
    );
}

#[test]
fn a_failed_fresh_response_keeps_the_context() {
    let mut conn = connection();
    forward(&mut conn, &create(json!({"model": "m", "input": "one"})), 1);
    let id = answer(&mut conn, "a").last().unwrap()["response"]["id"].clone();
    forward(&mut conn, &create(json!({"model": "m", "input": "two"})), 2);
    conn.upstream_head(503, "application/json", no_headers, 1, at());
    let frames = conn.upstream_body(b"{}", true, 1, at());
    let frame: serde_json::Value = serde_json::from_slice(&frames.messages[0]).unwrap();
    assert_eq!(frame["type"], json!("error"));
    assert_eq!(frame["status"], json!(503));
    forward(
        &mut conn,
        &create(json!({"model": "m", "previous_response_id": id, "input": "x"})),
        3,
    );
}

#[test]
fn an_upstream_error_event_carries_its_kept_headers_and_token_counts() {
    let mut conn = connection();
    forward(&mut conn, &create(json!({"model": "m", "input": "one"})), 1);
    let head = [
        ("content-type", "application/json"),
        ("retry-after", "1"),
        ("x-ratelimit-remaining-requests", "0"),
        ("set-cookie", "a=b"),
    ];
    conn.upstream_head(429, "application/json", || head, 1, at());
    let frames = conn.upstream_body(br#"{"error":{"message":"slow down"}}"#, true, 1, at());
    let frame: serde_json::Value = serde_json::from_slice(&frames.messages[0]).unwrap();
    let kept = json!({"retry-after": "1", "x-ratelimit-remaining-requests": "0"});
    assert_eq!(
        frame,
        json!({"type": "error", "status": 429, "headers": kept, "error": {
            "type": "rate_limit_error", "code": "rate_limit_exceeded", "message": "slow down",
            "param": null, "headers": kept}})
    );
    // A context overflow with the counts as fields (llama.cpp): 400, the counts in `error`.
    forward(&mut conn, &create(json!({"model": "m", "input": "two"})), 2);
    conn.upstream_head(400, "application/json", no_headers, 1, at());
    let frames = conn.upstream_body(
        br#"{"error":{"code":400,"message":"request (9 tokens) exceeds the available context size (8 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9,"n_ctx":8}}"#,
        true,
        1,
        at(),
    );
    let frame: serde_json::Value = serde_json::from_slice(&frames.messages[0]).unwrap();
    assert_eq!(
        frame,
        json!({"type": "error", "status": 400, "error": {
            "type": "invalid_request_error", "code": "context_length_exceeded",
            "message": "request (9 tokens) exceeds the available context size (8 tokens), try increasing it",
            "param": "input", "n_prompt_tokens": 9, "n_ctx": 8}})
    );
    // A success's headers are not read.
    forward(
        &mut conn,
        &create(json!({"model": "m", "input": "three"})),
        3,
    );
    conn.upstream_head(
        200,
        SSE,
        || -> [(&str, &str); 0] { panic!("a success's headers read") },
        1,
        at(),
    );
}

#[test]
fn transport_fields_are_rejected_unless_they_agree_with_the_socket() {
    for (field, value) in [
        ("stream", json!(false)),
        ("stream", json!("yes")),
        ("background", json!(true)),
        ("stream_options", json!({})),
        ("stream_options", json!({"include_obfuscation": false})),
    ] {
        let mut conn = connection();
        let mut body = json!({"model": "m", "input": "x"});
        body[field] = value.clone();
        let frame = reject(&mut conn, &create(body));
        assert_eq!(code(&frame), "unsupported_parameter", "{field}: {value}");
        assert_eq!(frame["error"]["param"], json!(field));
        assert_eq!(frame["status"], json!(400));
    }
    // What Codex sends on its sockets: accepted, the transport streams anyway.
    let mut conn = connection();
    let up = forward(
        &mut conn,
        &create(json!({"model": "m", "input": "x", "stream": true, "background": false})),
        1,
    );
    let chat: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
    assert_eq!(chat["stream"], json!(true));
    // A client's dump of its own request: every transport field `null`, which is absent.
    let mut conn = connection();
    let up = forward(
        &mut conn,
        &create(
            json!({"model": "m", "input": "x", "stream": null, "background": null,
                       "stream_options": null, "stream_id": null, "generate": null,
                       "previous_response_id": null}),
        ),
        1,
    );
    let chat: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
    assert_eq!(chat["stream"], json!(true));
}

#[test]
fn generate_false_preloads_a_context_without_the_upstream() {
    let mut conn = connection();
    let prewarm = create(json!({"model": "m", "instructions": "be brief",
        "input": [{"role": "user", "content": "context"}], "generate": false}));
    let Start::Answered(frames) = conn.on_text(&prewarm, meta(1), at()) else {
        panic!("generate: false went upstream");
    };
    assert!(frames.done && !conn.in_flight());
    let events = events(&frames);
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "response.created",
            "response.in_progress",
            "response.completed"
        ]
    );
    let response = &events[2]["response"];
    assert_eq!(response["output"], json!([]));
    assert_eq!(response["instructions"], json!("be brief"));
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], json!(i));
    }
    // The next request continues it with only its new items.
    let id = response["id"].as_str().unwrap();
    let up = forward(
        &mut conn,
        &create(json!({"model": "m", "previous_response_id": id, "input": "question"})),
        2,
    );
    let chat: serde_json::Value = serde_json::from_slice(&up.body).unwrap();
    assert_eq!(
        chat["messages"],
        json!([{"role": "user", "content": "context"}, {"role": "user", "content": "question"}])
    );
    // generate must be a boolean.
    let frame = reject(
        &mut connection(),
        &create(json!({"model": "m", "input": "x", "generate": "no"})),
    );
    assert_eq!(code(&frame), "invalid_type");
}

#[test]
fn bad_messages_get_error_events() {
    let mut conn = connection();
    for (message, expected) in [
        (&b"{not json"[..], "invalid_json"),
        (br#"[1,2]"#, "invalid_json"),
        (br#"{"type":"response.cancel"}"#, "unknown_event_type"),
        (
            br#"{"model":"m","input":"x"}"#,
            "missing_required_parameter",
        ),
        (
            br#"{"type":"response.create","model":"m"}"#,
            "missing_required_parameter",
        ),
        (
            br#"{"type":"response.create","type":"response.create","model":"m","input":"x"}"#,
            "duplicate_key",
        ),
        (
            br#"{"type":"response.create","model":"m","input":"x","stream_id":"a"}"#,
            "unsupported_parameter",
        ),
    ] {
        let frame = reject(&mut conn, message);
        assert_eq!(
            code(&frame),
            expected,
            "{}",
            String::from_utf8_lossy(message)
        );
        assert!(!conn.in_flight());
    }
    let frame: serde_json::Value = serde_json::from_slice(&conn.on_binary()).unwrap();
    assert_eq!(code(&frame), "invalid_message");
    let frame: serde_json::Value = serde_json::from_slice(&conn.on_oversize()).unwrap();
    assert_eq!(
        (code(&frame), frame["status"].as_u64()),
        ("request_too_large", Some(413))
    );
}

#[test]
fn the_message_size_limit_from_both_sides() {
    let limit = limits().max_message_bytes;
    let message = |size: usize| {
        let base = create(json!({"model": "m", "input": ""}));
        let pad = size - base.len();
        create(json!({"model": "m", "input": "a".repeat(pad)}))
    };
    let mut conn = connection();
    assert_eq!(message(limit).len(), limit);
    forward(&mut conn, &message(limit), 1);
    let mut conn = connection();
    let frame = reject(&mut conn, &message(limit + 1));
    assert_eq!(
        (code(&frame), frame["status"].as_u64()),
        ("request_too_large", Some(413))
    );
}

#[test]
fn a_context_over_its_cap_is_not_kept_and_says_so() {
    let small = Limits {
        max_message_bytes: 64 * 1024,
        max_context_bytes: 2048,
    };
    let mut conn = Connection::new(settings(), small, ReasoningEvents::Spec);
    forward(
        &mut conn,
        &create(json!({"model": "m", "input": "x".repeat(1500)})),
        1,
    );
    let id = answer(&mut conn, "a").last().unwrap()["response"]["id"].clone();
    assert_eq!(conn.context_bytes(), 0);
    let frame = reject(
        &mut conn,
        &create(json!({"model": "m", "previous_response_id": id, "input": "x"})),
    );
    assert_eq!(code(&frame), "previous_response_not_found");
    let message = frame["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("larger than this server keeps"),
        "{message}"
    );
}

#[test]
fn an_upstream_failure_mid_stream_ends_with_response_failed() {
    let mut conn = connection();
    forward(&mut conn, &create(json!({"model": "m", "input": "x"})), 1);
    conn.upstream_head(200, SSE, no_headers, 1, at());
    let part = conn.upstream_body(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"half\"}}]}\n\n",
        false,
        1,
        at(),
    );
    assert!(!part.done);
    let end = conn.upstream_failed(ErrorCode::UpstreamUnavailable, "reset", 2, at());
    assert!(end.done);
    let types: Vec<String> = events(&end)
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(types.last().map(String::as_str), Some("response.failed"));
    assert!(types.iter().any(|t| t == "error"));
}

#[test]
fn an_upstream_that_never_answers_ends_with_an_error_event() {
    let mut conn = connection();
    forward(&mut conn, &create(json!({"model": "m", "input": "x"})), 1);
    let end = conn.upstream_failed(
        ErrorCode::UpstreamUnavailable,
        "connection refused",
        1,
        at(),
    );
    assert!(end.done);
    let frame: serde_json::Value = serde_json::from_slice(&end.messages[0]).unwrap();
    assert_eq!(frame["type"], json!("error"));
    assert_eq!(code(&frame), "upstream_unavailable");
    assert!(!conn.in_flight());
}

#[test]
fn sse_output_splits_into_zero_copy_messages() {
    let sse = Bytes::from_static(
        b"event: a\ndata: {\"x\":1}\n\nevent: b\ndata: {\"y\":\"data: no\"}\n\ndata: [DONE]\n\n",
    );
    let messages = event_messages(&sse);
    assert_eq!(
        messages,
        vec![
            Bytes::from_static(b"{\"x\":1}"),
            Bytes::from_static(b"{\"y\":\"data: no\"}")
        ]
    );
    // Slices of the same buffer.
    assert!(messages
        .iter()
        .all(|m| sse.as_ptr_range().contains(&m.as_ptr())));
}

/// Every event due at `at`.
fn told(conn: &mut Connection, at: Instant) -> Vec<Event> {
    std::iter::from_fn(|| conn.poll_event(at)).collect()
}

#[test]
fn each_response_is_told_once_with_its_time() {
    use crate::life::Finished;
    use std::time::Duration;
    let t0 = Instant::now();
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let finished = |events: &[Event]| -> Vec<Finished> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::Finished(f) => Some((**f).clone()),
                _ => None,
            })
            .collect()
    };
    let mut conn = connection();
    // A refused message is not a response: nothing to tell.
    let bad = conn.on_text(b"{}", meta(1), ms(0));
    assert!(matches!(bad, Start::Reject(_)));
    assert!(told(&mut conn, ms(0)).is_empty());
    // A response: its first output, then its end, with the time since its message.
    let Start::Forward(_) = conn.on_text(
        &create(json!({"model": "m", "input": "hi"})),
        meta(2),
        ms(10),
    ) else {
        panic!("not forwarded")
    };
    assert!(told(&mut conn, ms(11)).is_empty());
    conn.upstream_head(200, SSE, no_headers, 1, ms(20));
    let events = told(&mut conn, ms(20));
    assert!(matches!(&events[..], [Event::StreamOpened]), "{events:?}");
    let stream = chat_stream("Hi");
    let (first, rest) = stream.split_at(stream.find("\n\n").unwrap() + 2);
    conn.upstream_body(first.as_bytes(), false, 1, ms(30));
    let events = told(&mut conn, ms(31));
    assert!(
        matches!(&events[..], [Event::FirstOutput { elapsed }] if *elapsed == Duration::from_millis(21)),
        "{events:?}"
    );
    let frames = conn.upstream_body(rest.as_bytes(), true, 1, ms(40));
    assert!(frames.done);
    let events = told(&mut conn, ms(42));
    assert!(
        matches!(&events[..], [Event::StreamClosed, Event::Finished(_)]),
        "{events:?}"
    );
    let f = finished(&events);
    assert_eq!(f.len(), 1, "{events:?}");
    assert!(!f[0].cut);
    assert_eq!(f[0].summary.outcome, Outcome::Translated);
    assert_eq!(f[0].timing.total, Duration::from_millis(32));
    assert_eq!(f[0].timing.first_output, Some(Duration::from_millis(21)));
    // Busy from each input to its last poll: 1 ms after the message, 1 after the first
    // piece, 2 after the last.
    assert_eq!(f[0].timing.translation, Duration::from_millis(4));
    assert!(told(&mut conn, ms(50)).is_empty(), "once");
    // `generate: false`: answered at once, told at once.
    let preload = create(json!({"model": "m", "input": "hi", "generate": false}));
    assert!(matches!(
        conn.on_text(&preload, meta(3), ms(60)),
        Start::Answered(_)
    ));
    let f = finished(&told(&mut conn, ms(61)));
    assert_eq!((f.len(), f[0].cut), (1, false));
    // Cut by the socket's close mid-stream: told as cut, its outcome still open.
    forward(
        &mut conn,
        &create(json!({"model": "m", "input": "again"})),
        4,
    );
    conn.upstream_head(200, SSE, no_headers, 1, ms(70));
    conn.closed(ms(90));
    let f = finished(&told(&mut conn, ms(90)));
    assert_eq!(f.len(), 1);
    assert!(f[0].cut);
    assert_eq!(f[0].summary.outcome, Outcome::Open);
    conn.closed(ms(95));
    assert!(told(&mut conn, ms(95)).is_empty(), "once");
}
