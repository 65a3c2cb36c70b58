//! No object or event this server writes has a key twice: every body, event and WebSocket
//! frame of a set of exchanges that covers each output kind is read with the core's own
//! duplicate-rejecting JSON reader (`translate::json::parse`), as a strict client would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use responses_core::call::{AnswerHead, CallAction};
use responses_core::connection::{Connection, Limits};
use responses_core::environment::System;
use responses_core::exchange::{
    BodyStep, Exchange, HeadStep, Operation, RequestStep, ResponseHead, Settings,
};
use responses_core::translate::json::{parse, ParseError};
use responses_core::translate::seal::Keyring;
use responses_core::translate::{Meta, Options};
use serde_json::{json, Value};

const SSE: &str = "text/event-stream";
const JSON: &str = "application/json";

fn settings() -> Arc<Settings> {
    Arc::new(Settings {
        options: Options {
            keyring: Some(Arc::new(Keyring::single("k1", [3; 32]).unwrap())),
            ..Options::default()
        },
        ..Settings::default()
    })
}

fn meta() -> Meta {
    Meta {
        now: 1_700_000_000,
        id_seed: 0xabc,
    }
}

/// Fails naming the document and the key if `bytes` has a key twice.
#[track_caller]
fn check(bytes: &[u8], what: &str) -> Value {
    match parse(bytes) {
        Ok(v) => v,
        Err(ParseError::Duplicate(path)) => panic!(
            "{what}: key '{path}' written twice in {}",
            String::from_utf8_lossy(bytes)
        ),
        Err(ParseError::Syntax(e)) => {
            panic!("{what}: not JSON ({e}): {}", String::from_utf8_lossy(bytes))
        }
    }
}

/// Every `data:` line of an SSE body (but `[DONE]`), checked; returns the events.
#[track_caller]
fn check_sse(body: &[u8], what: &str) -> Vec<Value> {
    let text = std::str::from_utf8(body).expect("UTF-8 events");
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| check(d.as_bytes(), what))
        .collect()
}

/// A Chat stream from its chunks' `choices[0]` (delta, finish_reason), then usage and [DONE].
fn chat_stream(choices: &[Value]) -> String {
    let mut s = String::new();
    for c in choices {
        s.push_str(&format!(
            "data: {}\n\n",
            json!({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [c]})
        ));
    }
    s.push_str(&format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [],
               "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}})
    ));
    s.push_str("data: [DONE]\n\n");
    s
}

/// One HTTP exchange through the core: `request` in, the upstream answer `(content type,
/// body)` in; every byte the client gets is checked. Returns the client's JSON documents.
fn exchange(op: Operation, request: &Value, content_type: &str, answer: &[u8]) -> Vec<Value> {
    let what = format!("{request}");
    let mut ex = Exchange::new(settings(), op);
    let body = serde_json::to_vec(request).unwrap();
    match ex.request_body(&body, true, meta()) {
        RequestStep::Forward(up) => {
            check(&up.body, "the upstream request");
        }
        RequestStep::Reply(reply) => return vec![check(&reply.body, &what)],
        RequestStep::Hold => panic!("held a whole body"),
        RequestStep::Call(_) => panic!("no context_management here"),
        RequestStep::Work(_) => panic!("not offloaded"),
    }
    let head = ResponseHead {
        status: 200,
        content_type,
        end_of_stream: false,
    };
    match ex.response_head(head, 1) {
        HeadStep::Stream => match ex.response_body(answer, true, 2) {
            BodyStep::Send(bytes) => check_sse(&bytes, &what),
            BodyStep::Reply(reply) => vec![check(reply.body(), &what)],
            BodyStep::Hold => panic!("held a stream"),
        },
        HeadStep::Gather => match ex.response_body(answer, true, 2) {
            BodyStep::Reply(reply) if reply.content_type() == SSE => check_sse(reply.body(), &what),
            BodyStep::Reply(reply) => vec![check(reply.body(), &what)],
            other => panic!("{what}: gathered answer not replied: {other:?}"),
        },
        HeadStep::Reply(reply) => vec![check(reply.body(), &what)],
    }
}

fn completion(message: Value) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"id": "c", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}}),
    )
    .unwrap()
}

/// The tools of every kind, so that each kind of call can come back.
fn tools() -> Value {
    json!([
        {"type": "function", "name": "f", "parameters": {"type": "object"}},
        {"type": "custom", "name": "c"},
        {"type": "namespace", "name": "ns", "description": "d",
         "tools": [{"type": "function", "name": "g"}, {"type": "custom", "name": "h"}]},
        {"type": "shell"}, {"type": "local_shell"}, {"type": "apply_patch"},
    ])
}

/// What the upstream says in each scenario, as one JSON message and as a stream.
fn scenarios() -> Vec<(&'static str, Value, Vec<Value>)> {
    let call = |id: &str, name: &str, args: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}});
    let streamed_call = |i: u32, id: &str, name: &str, args: &str| {
        json!({"index": 0, "delta": {"tool_calls": [{"index": i, "id": id, "type": "function",
               "function": {"name": name, "arguments": args}}]}, "finish_reason": null})
    };
    vec![
        (
            "text",
            json!({"role": "assistant", "content": "hi"}),
            vec![
                json!({"index": 0, "delta": {"role": "assistant", "content": "hi"}, "finish_reason": null}),
                json!({"index": 0, "delta": {}, "finish_reason": "stop"}),
            ],
        ),
        (
            "reasoning, refusal and every call kind",
            json!({"role": "assistant", "reasoning_content": "think", "content": "let me see",
                   "refusal": "no", "tool_calls": [call("a", "f", "{}"), call("b", "c", "{\"input\":\"x\"}"),
                   call("d", "ns__g", "{}")]}),
            vec![
                json!({"index": 0, "delta": {"reasoning_content": "think"}, "finish_reason": null}),
                json!({"index": 0, "delta": {"content": "let me see"}, "finish_reason": null}),
                json!({"index": 0, "delta": {"refusal": "no"}, "finish_reason": null}),
                streamed_call(0, "a", "f", "{}"),
                streamed_call(1, "b", "c", "{\"input\":\"x\"}"),
                streamed_call(2, "d", "ns__g", "{}"),
                json!({"index": 0, "delta": {}, "finish_reason": "tool_calls"}),
            ],
        ),
        (
            "built-in calls and a namespaced custom call",
            json!({"role": "assistant", "content": null, "tool_calls": [
                call("s", "shell", "{\"commands\":[\"ls\"]}"),
                call("l", "local_shell", "{\"command\":[\"ls\"]}"),
                call("p", "apply_patch", "{\"type\":\"delete_file\",\"path\":\"a\"}"),
                call("x", "apply_patch", "not json"),
                call("h", "ns__h", "{\"input\":\"x\"}")]}),
            vec![
                streamed_call(0, "s", "shell", "{\"commands\":[\"ls\"]}"),
                streamed_call(1, "l", "local_shell", "{\"command\":[\"ls\"]}"),
                streamed_call(
                    2,
                    "p",
                    "apply_patch",
                    "{\"type\":\"delete_file\",\"path\":\"a\"}",
                ),
                streamed_call(3, "x", "apply_patch", "not json"),
                streamed_call(4, "h", "ns__h", "{\"input\":\"x\"}"),
                json!({"index": 0, "delta": {}, "finish_reason": "tool_calls"}),
            ],
        ),
    ]
}

#[test]
fn responses_and_events_have_no_duplicate_keys() {
    let mut seen = 0;
    for (name, message, chunks) in scenarios() {
        for previous in [None, Some("resp_prev")] {
            let mut req = json!({"model": "m", "input": "hi", "tools": tools(),
                "include": ["reasoning.encrypted_content", "message.output_text.logprobs"],
                "metadata": {"k": "v"}, "instructions": "be brief"});
            if let Some(p) = previous {
                // Only the WebSocket transport echoes one; over HTTP it is a 400 (checked too).
                req["previous_response_id"] = json!(p);
            }
            let json_answer = exchange(Operation::Create, &req, JSON, &completion(message.clone()));
            req["stream"] = json!(true);
            let events = exchange(
                Operation::Create,
                &req,
                SSE,
                chat_stream(&chunks).as_bytes(),
            );
            seen += json_answer.len() + events.len();
            assert!(!events.is_empty(), "{name}");
        }
    }
    assert!(seen > 20, "the scenarios produced {seen} documents");
}

#[test]
fn compaction_and_errors_have_no_duplicate_keys() {
    let docs = exchange(
        Operation::Compact,
        &json!({"model": "m", "input": [{"role": "user", "content": "hi", "phase": null}]}),
        JSON,
        &completion(json!({"role": "assistant", "content": "a summary"})),
    );
    assert_eq!(docs[0]["object"], "response.compaction");
    // Codex's remote compaction: one sealed item, as JSON and as a stream.
    let mut trigger = json!({"model": "m", "input": [{"role": "user", "content": "hi"},
                                                     {"type": "compaction_trigger"}]});
    let docs = exchange(
        Operation::Create,
        &trigger,
        JSON,
        &completion(json!({"role": "assistant", "content": "a summary"})),
    );
    assert_eq!(docs[0]["output"][0]["type"], "compaction");
    trigger["stream"] = json!(true);
    let events = exchange(
        Operation::Create,
        &trigger,
        SSE,
        chat_stream(&[
            json!({"index": 0, "delta": {"content": "a summary"}, "finish_reason": "stop"}),
        ])
        .as_bytes(),
    );
    // created, in_progress, the item added, compaction.compacting, the item done, completed.
    assert_eq!(events.len(), 6, "{events:?}");
    assert_eq!(events[3]["type"], "response.compaction.compacting");
    // An upstream error, a stream that fails, a refused request.
    for (content_type, answer) in [
        (JSON, &b"{\"error\":{\"message\":\"x\",\"code\":\"y\"}}"[..]),
        (SSE, &b"data: {\"error\":{\"message\":\"boom\"}}\n\n"[..]),
        (SSE, &b"data: not json\n\n"[..]),
    ] {
        let docs = exchange(
            Operation::Create,
            &json!({"model": "m", "input": "hi", "stream": content_type == SSE}),
            content_type,
            answer,
        );
        assert!(!docs.is_empty());
    }
    exchange(Operation::Create, &json!({"model": 1}), JSON, b"");
}

/// A masked client text frame (RFC 6455 §5.3), in its shortest length form.
fn client_text(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x81];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n => {
            f.push(0x80 | 126);
            f.extend((n as u16).to_be_bytes());
        }
    }
    let key = [1, 2, 3, 4];
    f.extend(key);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    f
}

/// The payloads of the server's text frames.
fn server_texts(mut bytes: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (len, at) = match bytes[1] & 0x7f {
            126 => (u16::from_be_bytes([bytes[2], bytes[3]]) as usize, 4),
            127 => (
                u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
                10,
            ),
            n => (n as usize, 2),
        };
        assert_eq!(bytes[0], 0x81, "a text frame");
        out.push(Bytes::copy_from_slice(&bytes[at..at + len]));
        bytes = &bytes[at + len..];
    }
    out
}

#[test]
fn websocket_frames_have_no_duplicate_keys() {
    let limits = Limits {
        max_message_bytes: 1 << 20,
        max_context_bytes: 1 << 20,
        idle_timeout: Duration::from_secs(60),
        max_age: Duration::from_secs(600),
        max_unread_bytes: 1 << 20,
        max_socket_bytes: 64 << 20,
    };
    let openai = |name: &str| (name == "x-stainless-lang").then_some("python");
    let now = Instant::now();
    let mut conn = Connection::new(settings(), limits, System, openai, now);
    let mut frames = Vec::new();
    fn take(conn: &mut Connection, frames: &mut Vec<Bytes>) {
        while let Some(bytes) = conn.poll_transmit() {
            frames.extend(server_texts(&bytes));
        }
    }
    // The call started (the last response's record, which this suite does not look at, may
    // come first).
    let call = |conn: &mut Connection| loop {
        match conn.poll_call() {
            Some(CallAction::Start(call)) => break call.id,
            Some(CallAction::Record(_)) => continue,
            other => panic!("no call started: {other:?}"),
        }
    };
    let first = json!({"type": "response.create", "model": "m", "input": "hi"});
    conn.handle_bytes(now, &client_text(first.to_string().as_bytes()));
    let id = call(&mut conn);
    let sse = [("content-type", SSE)];
    AnswerHead(&sse).report(200, |head| conn.handle_call_head(now, id, head));
    let stream =
        chat_stream(&[json!({"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"})]);
    conn.handle_call_data(now, id, stream.as_bytes());
    conn.handle_call_end(now, id);
    take(&mut conn, &mut frames);
    let response_id = check(frames.last().unwrap(), "terminal event")["response"]["id"].clone();
    // A continuation echoes `previous_response_id` (once).
    let next = json!({"type": "response.create", "model": "m", "previous_response_id": response_id,
                      "input": "again"});
    conn.handle_bytes(now, &client_text(next.to_string().as_bytes()));
    let id = call(&mut conn);
    AnswerHead(&sse).report(200, |head| conn.handle_call_head(now, id, head));
    conn.handle_call_data(now, id, stream.as_bytes());
    conn.handle_call_end(now, id);
    take(&mut conn, &mut frames);
    let last = check(frames.last().unwrap(), "continuation terminal");
    assert_eq!(last["response"]["previous_response_id"], response_id);
    // A refused message.
    let before = frames.len();
    conn.handle_bytes(now, &client_text(b"{\"type\":\"response.create\"}"));
    take(&mut conn, &mut frames);
    assert_eq!(frames.len(), before + 1);
    assert_eq!(check(frames.last().unwrap(), "error")["type"], "error");
    for f in &frames {
        check(f, "a WebSocket frame");
    }
}
