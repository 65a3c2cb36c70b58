//! The WebSocket transport of `/v1/responses` through the real Envoy, in both modes: in
//! ext_proc mode (`envoy/envoy.yaml`) Envoy upgrades the socket to the processor's WebSocket
//! listener, whose Chat requests go back through Envoy; in module mode
//! (`envoy/envoy-module.yaml`) the module answers the upgrade itself and sends each Chat
//! request into Envoy's internal listener, with no process beside Envoy. Either way the
//! requests reach a scripted upstream that records what it gets. Plain frames
//! (tokio-tungstenite): creates, continuations, sequential responses, bad messages, the size
//! limit from both sides, a client gone mid-response, an upstream failing mid-stream, the
//! connection limits and a drain on SIGTERM.
//!
//! The same table of cases runs against the core's connection (`core/src/connection/tests.rs`,
//! plain bytes), the module's carrying of it (`module/src/socket/tests.rs`, the fake Envoy)
//! and here through Envoy. What differs by mode is said where it does: the process a SIGTERM
//! drains, and what only one mode has (HTTP/2's extended CONNECT, a panic's 1011: the module).
//! openai-python's `responses.connect()` is driven in `e2e_clients.rs`.

use crate::common;

use std::time::Duration;

use common::websocket::{recv, Socket};
use common::{Gate, Reply, ScriptedUpstream, Stack};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};

pub(super) const TIMEOUT: Duration = Duration::from_secs(30);

pub(super) async fn connect(stack: &Stack) -> Socket {
    let mut request = stack.ws_url().into_client_request().expect("request");
    request
        .headers_mut()
        .insert("authorization", "Bearer sk-test".parse().unwrap());
    let (socket, response) = tokio_tungstenite::connect_async(request)
        .await
        .unwrap_or_else(|e| panic!("WebSocket upgrade through Envoy failed: {e}"));
    assert_eq!(response.status(), 101);
    socket
}

/// Sends a `response.create` with this body.
pub(super) async fn ask(socket: &mut Socket, body: Value) {
    socket.send(create(body)).await.expect("send");
}

pub(super) fn create(body: Value) -> Message {
    let mut body = body;
    body["type"] = json!("response.create");
    Message::text(body.to_string())
}

/// Messages up to a terminal event (`response.completed`/`failed`/`incomplete`) or an
/// `error` event without a sequence number (a refused request).
pub(super) async fn response(socket: &mut Socket) -> Vec<Value> {
    let mut events = Vec::new();
    loop {
        let event = recv(socket).await;
        let kind = event["type"].as_str().unwrap_or_default().to_owned();
        events.push(event);
        let refused = kind == "error" && events.len() == 1;
        if refused
            || matches!(
                kind.as_str(),
                "response.completed" | "response.failed" | "response.incomplete"
            )
        {
            return events;
        }
    }
}

/// How the socket ends: its close code (None: closed without a close frame).
pub(super) async fn closed(socket: &mut Socket) -> Option<CloseCode> {
    loop {
        match tokio::time::timeout(TIMEOUT, socket.next())
            .await
            .expect("the socket ends in time")
        {
            Some(Ok(Message::Close(frame))) => return frame.map(|f| f.code),
            Some(Ok(Message::Text(text))) => panic!("unexpected message: {text}"),
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => return None,
        }
    }
}

pub(super) fn chat_sse(text: &str) -> Reply {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    Reply::sse([
        chunk(json!({"role": "assistant", "content": text}), Value::Null),
        chunk(json!({}), json!("stop")),
        "data: [DONE]\n\n".to_owned(),
    ])
}

/// Reads one response to its end and asserts it completed; returns the response object.
pub(super) async fn completed(socket: &mut Socket) -> Value {
    let events = response(socket).await;
    let last = last_response(&events).clone();
    assert_eq!(last["status"], "completed", "{last}");
    last
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

pub(super) fn last_response(events: &[Value]) -> &Value {
    &events.last().expect("events")["response"]
}

#[track_caller]
pub(super) fn error_code(event: &Value) -> &str {
    assert_eq!(event["type"], "error", "{event}");
    event["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn create_then_continue_with_previous_response_id() {
    let upstream = ScriptedUpstream::with_replies([chat_sse("Hello Ada."), chat_sse("42.")]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut ws = connect(&stack).await;

    ask(
        &mut ws,
        json!({"model": "m", "instructions": "Be brief.", "input": "I am Ada."}),
    )
    .await;
    let first = response(&mut ws).await;
    assert_eq!(types(&first).first(), Some(&"response.created"));
    assert_eq!(last_response(&first)["status"], "completed");
    for (i, e) in first.iter().enumerate() {
        assert_eq!(e["sequence_number"], json!(i), "{e}");
        common::schema::assert_valid_event(e);
    }
    let id = last_response(&first)["id"].as_str().unwrap().to_owned();

    ask(
        &mut ws,
        json!({"model": "m", "previous_response_id": id,
        "input": [{"role": "user", "content": "My number?"}]}),
    )
    .await;
    let second = response(&mut ws).await;
    assert_eq!(last_response(&second)["status"], "completed");
    assert_eq!(last_response(&second)["previous_response_id"], json!(id));
    assert_eq!(second[0]["sequence_number"], 0);

    // No prompt or completion text in the translator's log (without --log-content).
    let logs = stack.translator_logs();
    assert!(logs.contains("translated request"), "{logs}");
    assert!(
        !logs.contains("I am Ada") && !logs.contains("Hello Ada"),
        "{logs}"
    );
    // What the upstream got: Chat requests through Envoy's Chat route, the second with the
    // whole context and the client's credentials. Both translators name the model in the
    // model header, and Envoy keeps it: the processor's request enters through the loopback
    // listener responses_calls, the module's through the internal listener (routed by model).
    let requests = upstream.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].path, "/v1/chat/completions");
    assert_eq!(requests[1].header("authorization"), Some("Bearer sk-test"));
    assert_eq!(requests[1].header("x-responses-model"), Some("m"));
    let chat = requests[1].json();
    assert_eq!(chat["stream"], true);
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "user", "content": "I am Ada."},
            {"role": "assistant", "content": "Hello Ada."},
            {"role": "user", "content": "My number?"}
        ])
    );
}

/// A `model` that cannot be a header value (the transport's Chat request carries it in the
/// model header) is refused as over HTTP, before anything is sent; the socket goes on.
#[tokio::test]
async fn a_model_that_cannot_be_a_header_is_refused_and_the_socket_goes_on() {
    use responses_core::translate::request::MAX_MODEL_BYTES;

    let upstream = ScriptedUpstream::with_replies([chat_sse("fine")]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut ws = connect(&stack).await;
    for model in ["m\nx-evil: 1".to_owned(), "m".repeat(MAX_MODEL_BYTES + 1)] {
        ask(&mut ws, json!({"model": model, "input": "x"})).await;
        let refused = recv(&mut ws).await;
        assert_eq!(error_code(&refused), "invalid_value");
        assert_eq!(refused["error"]["param"], "model", "{refused}");
        assert_eq!(refused["status"], 400);
    }
    assert!(upstream.requests().is_empty(), "nothing went upstream");
    ask(&mut ws, json!({"model": "m", "input": "x"})).await;
    completed(&mut ws).await;
}

/// The model map on the WebSocket: each response's Chat request names the mapped model (a
/// name the map does not match passes unchanged), every event names the model asked for, and
/// a continuation too. The Chat request reaches the upstream with both model headers, the name
/// asked for and the name sent, as the HTTP path does (ext_proc: through Envoy's listener
/// responses_calls, or sent straight to the upstream).
#[tokio::test]
async fn the_model_map_renames_the_chat_model_and_the_events_keep_the_asked_one() {
    let demo = common::RecordingDemo::start();
    let args = ["--model-map", "gpt-5.4=qwen3-coder,gpt-*=qwen3"];
    let stack = Stack::with_websocket(demo.port(), &args);
    let mut ws = connect(&stack).await;
    let mut previous = None;
    for (asked, sent) in [
        ("gpt-5.4", "qwen3-coder"),
        ("gpt-5.4", "qwen3-coder"),
        ("gpt-4o", "qwen3"),
        ("m", "m"),
    ] {
        let mut body = json!({"model": asked, "input": "hi"});
        if let Some(id) = previous.take() {
            body["previous_response_id"] = json!(id);
        }
        ask(&mut ws, body).await;
        let events = response(&mut ws).await;
        assert_eq!(last_response(&events)["status"], "completed", "{events:?}");
        let models: Vec<&Value> = events
            .iter()
            .filter_map(|e| e.get("response").map(|r| &r["model"]))
            .collect();
        assert!(
            models.len() >= 2 && models.iter().all(|m| *m == asked),
            "{models:?}"
        );
        previous = last_response(&events)["id"].as_str().map(str::to_owned);
        let request = demo.requests().pop().expect("a Chat request");
        assert_eq!(request.json()["model"], sent, "{asked}");
        assert_eq!(request.header("x-responses-model"), Some(asked));
        assert_eq!(request.header("x-responses-upstream-model"), Some(sent));
    }
    if common::mode() == common::Mode::Module {
        return;
    }

    // The processor's own Chat request, sent straight to the upstream (and so is each turn's
    // record, which no Envoy takes here: only the Chat requests are looked at).
    let ws_port = common::free_port();
    let ws_listen = format!("127.0.0.1:{ws_port}");
    let ws_upstream = format!("http://127.0.0.1:{}", demo.port());
    let processor = common::Processor::start(&[
        "--ws-listen",
        &ws_listen,
        "--ws-upstream",
        &ws_upstream,
        args[0],
        args[1],
    ]);
    let (mut direct, _) =
        tokio_tungstenite::connect_async(format!("ws://{ws_listen}/v1/responses"))
            .await
            .expect("the processor's WebSocket listener");
    for (asked, sent) in [("gpt-5.4", "qwen3-coder"), ("llama", "llama")] {
        ask(&mut direct, json!({"model": asked, "input": "hi"})).await;
        completed(&mut direct).await;
        let request = demo
            .requests()
            .into_iter()
            .rfind(|r| r.path == "/v1/chat/completions")
            .expect("a Chat request");
        assert_eq!(request.json()["model"], sent);
        assert_eq!(request.header("x-responses-model"), Some(asked));
        assert_eq!(request.header("x-responses-upstream-model"), Some(sent));
    }
    // No Envoy took the turns' records (the upstream answered them 404): the processor says
    // so, since their access log lines and charges are lost.
    common::wait_until("the records' warning", TIMEOUT, || {
        processor
            .logs()
            .contains("a turn's record was not taken")
            .then_some(())
    });
    drop(processor);
}

#[tokio::test]
async fn unknown_and_evicted_ids_are_previous_response_not_found() {
    let upstream = ScriptedUpstream::with_replies([
        chat_sse("one"),
        Reply::json(500, &json!({"error": {"message": "upstream broke"}})),
    ]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut ws = connect(&stack).await;

    ask(
        &mut ws,
        json!({"model": "m", "previous_response_id": "resp_unknown", "input": "x"}),
    )
    .await;
    let refused = recv(&mut ws).await;
    assert_eq!(error_code(&refused), "previous_response_not_found");
    assert_eq!(refused["status"], 400);
    assert!(upstream.requests().is_empty(), "nothing went upstream");

    ask(&mut ws, json!({"model": "m", "input": "one"})).await;
    let id = last_response(&response(&mut ws).await)["id"].clone();
    // The continuation fails upstream: the context it named is evicted.
    ask(
        &mut ws,
        json!({"model": "m", "previous_response_id": id, "input": "two"}),
    )
    .await;
    let failed = recv(&mut ws).await;
    assert_eq!(failed["type"], "error", "{failed}");
    assert_eq!(failed["status"], 500);
    ask(
        &mut ws,
        json!({"model": "m", "previous_response_id": id, "input": "three"}),
    )
    .await;
    assert_eq!(
        error_code(&recv(&mut ws).await),
        "previous_response_not_found"
    );
    assert_eq!(upstream.requests().len(), 2);
}

/// The official suite's `websocket-failed-continuation-evicts-cache`: a continuation whose
/// tool output answers no call of the kept context fails (OpenAI's message), and the id it
/// named is gone; an output answering a call of the kept response continues.
#[tokio::test]
async fn an_output_without_its_call_fails_the_continuation_and_evicts_the_context() {
    let call = Reply::sse([
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_w\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{}\"}}]},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n",
    ]);
    let upstream = ScriptedUpstream::with_replies([chat_sse("one"), call, chat_sse("sunny")]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut ws = connect(&stack).await;

    ask(
        &mut ws,
        json!({"model": "m", "store": false, "input": "one"}),
    )
    .await;
    let id = last_response(&response(&mut ws).await)["id"].clone();
    ask(
        &mut ws,
        json!({"model": "m", "store": false, "previous_response_id": id, "input": [
            {"type": "function_call_output", "call_id": "call_openresponses_missing",
             "output": "No matching tool call exists in the previous response."}]}),
    )
    .await;
    let failed = recv(&mut ws).await;
    assert_eq!(failed["type"], "error", "{failed}");
    assert_eq!(failed["status"], 400);
    assert_eq!(failed["error"]["param"], "input[2].call_id", "{failed}");
    assert!(
        failed["error"]["message"].as_str().unwrap().starts_with(
            "No tool call found for function call output with call_id call_openresponses_missing."
        ),
        "{failed}"
    );
    ask(
        &mut ws,
        json!({"model": "m", "store": false, "previous_response_id": id, "input": "stale"}),
    )
    .await;
    assert_eq!(
        error_code(&recv(&mut ws).await),
        "previous_response_not_found"
    );
    assert_eq!(
        upstream.requests().len(),
        1,
        "the failed turn never went upstream"
    );

    // A call of the kept response is answered by an output in the continuation.
    ask(
        &mut ws,
        json!({"model": "m", "input": "weather?",
               "tools": [{"type": "function", "name": "get_weather"}]}),
    )
    .await;
    let id = last_response(&response(&mut ws).await)["id"].clone();
    ask(
        &mut ws,
        json!({"model": "m", "previous_response_id": id, "input": [
            {"type": "function_call_output", "call_id": "call_w", "output": "sunny"}]}),
    )
    .await;
    assert_eq!(
        types(&response(&mut ws).await).last(),
        Some(&"response.completed")
    );
    let chat = upstream.requests()[2].json();
    assert_eq!(
        chat["messages"][2],
        json!({"role": "tool", "tool_call_id": "call_w", "content": "sunny"})
    );
}

#[tokio::test]
async fn responses_sent_back_to_back_are_answered_in_order() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_sse("ok"));
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut ws = connect(&stack).await;
    for i in 0..4 {
        ask(&mut ws, json!({"model": "m", "input": format!("turn {i}")})).await;
    }
    let mut ids = Vec::new();
    for _ in 0..4 {
        let events = response(&mut ws).await;
        // One response's events, whole and not interleaved with another's.
        let id = &events[0]["response"]["id"];
        assert!(events
            .iter()
            .filter(|e| e.get("response").is_some())
            .all(|e| &e["response"]["id"] == id));
        assert_eq!(types(&events).last(), Some(&"response.completed"));
        ids.push(id.clone());
    }
    let inputs: Vec<Value> = upstream
        .requests()
        .iter()
        .map(|r| r.json()["messages"][0]["content"].clone())
        .collect();
    assert_eq!(
        inputs,
        vec![
            json!("turn 0"),
            json!("turn 1"),
            json!("turn 2"),
            json!("turn 3")
        ]
    );
    ids.dedup();
    assert_eq!(ids.len(), 4);
}

#[tokio::test]
async fn bad_messages_get_error_events_and_the_socket_stays_usable() {
    let upstream = ScriptedUpstream::with_replies([chat_sse("fine")]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut ws = connect(&stack).await;
    for (message, code) in [
        (Message::text("{nope"), "invalid_json"),
        (
            Message::text(r#"{"type":"response.cancel"}"#),
            "unknown_event_type",
        ),
        (Message::binary(b"\x00\x01".to_vec()), "invalid_message"),
        (
            create(json!({"model": "m", "input": "x", "stream": false})),
            "unsupported_parameter",
        ),
        (
            create(json!({"model": "m", "input": "x", "background": true})),
            "unsupported_parameter",
        ),
        (
            create(json!({"model": "m", "input": [{"type": "nonsense"}]})),
            "",
        ),
    ] {
        ws.send(message).await.unwrap();
        let event = recv(&mut ws).await;
        let got = error_code(&event);
        if !code.is_empty() {
            assert_eq!(got, code, "{event}");
        }
        assert_eq!(event["status"], 400, "{event}");
    }
    ask(&mut ws, json!({"model": "m", "input": "x"})).await;
    completed(&mut ws).await;
    assert_eq!(
        upstream.requests().len(),
        1,
        "only the good one went upstream"
    );
}

#[tokio::test]
async fn the_message_size_limit_from_both_sides() {
    const LIMIT: usize = 64 * 1024;
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_sse("ok"));
    let limit = LIMIT.to_string();
    let stack = Stack::with_websocket(upstream.port(), &["--max-request-bytes", &limit]);
    let message = |size: usize| {
        let base = json!({"type": "response.create", "model": "m", "input": ""}).to_string();
        let text = "a".repeat(size - base.len());
        let m = json!({"type": "response.create", "model": "m", "input": text}).to_string();
        assert_eq!(m.len(), size);
        Message::text(m)
    };
    // Just under and at the limit: answered.
    let mut ws = connect(&stack).await;
    for size in [LIMIT - 1, LIMIT] {
        ws.send(message(size)).await.unwrap();
        completed(&mut ws).await;
    }
    // Just over and at twice the limit: a 413 error event, and the socket goes on (the
    // message was read whole and refused).
    for size in [LIMIT + 1, 2 * LIMIT] {
        ws.send(message(size)).await.unwrap();
        let event = recv(&mut ws).await;
        assert_eq!(error_code(&event), "request_too_large");
        assert_eq!(event["status"], 413);
    }
    ask(&mut ws, json!({"model": "m", "input": "still here"})).await;
    completed(&mut ws).await;
    // Far over (beyond twice the limit): refused from its frame header, unread, so memory
    // stays bounded, and the socket ends (1009). The 413 event comes first, unless the reset
    // of the client's unread bytes overtakes it through Envoy: either way nothing is served.
    let mut ws = connect(&stack).await;
    ws.send(message(4 * LIMIT)).await.unwrap();
    match tokio::time::timeout(TIMEOUT, ws.next())
        .await
        .expect("an answer in time")
    {
        Some(Ok(Message::Text(text))) => {
            let event: Value = common::json::strict(&text);
            assert_eq!(error_code(&event), "request_too_large");
            let end = closed(&mut ws).await;
            assert!(matches!(end, Some(CloseCode::Size) | None), "{end:?}");
        }
        Some(Ok(Message::Close(frame))) => {
            assert_eq!(frame.map(|f| f.code), Some(CloseCode::Size));
        }
        Some(Ok(other)) => panic!("unexpected {other:?}"),
        Some(Err(_)) | None => {}
    }
    assert_eq!(
        upstream.requests().len(),
        3,
        "nothing over the limit went upstream"
    );
}

#[tokio::test]
async fn a_client_gone_mid_response_cancels_the_upstream_request() {
    let gate = Gate::new();
    let upstream = ScriptedUpstream::with_replies([chat_sse("first part").pause_after(1, &gate)]);
    upstream.set_default(|| chat_sse("after"));
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut ws = connect(&stack).await;
    ask(&mut ws, json!({"model": "m", "input": "x"})).await;
    // Events of the first chunk arrive, then the client goes.
    loop {
        if recv(&mut ws).await["type"] == "response.output_text.delta" {
            break;
        }
    }
    drop(ws);
    gate.wait_reached(TIMEOUT).await;
    // The translator drops its Chat request (the processor its HTTP request, the module its
    // callout): Envoy sees that downstream go and closes the upstream connection with the
    // request still active.
    let stat = "cluster.upstream.upstream_cx_destroy_local_with_active_rq";
    common::wait_until("the upstream request to be cancelled", TIMEOUT, || {
        let (_, stats) =
            common::envoy::http_get(stack.envoy.admin_port(), &format!("/stats?filter={stat}"))?;
        stats.contains(&format!("{stat}: 1")).then_some(())
    });
    gate.release();
    // The translator is fine: a new connection is answered.
    let mut ws = connect(&stack).await;
    ask(&mut ws, json!({"model": "m", "input": "y"})).await;
    completed(&mut ws).await;
}

#[tokio::test]
async fn an_upstream_failing_mid_stream_ends_with_response_failed() {
    let upstream = ScriptedUpstream::with_replies([Reply::close_mid_body(
        200,
        "text/event-stream",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"half\"}}]}\n\n",
    )]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut ws = connect(&stack).await;
    ask(&mut ws, json!({"model": "m", "input": "x"})).await;
    let events = response(&mut ws).await;
    let kinds = types(&events);
    assert_eq!(kinds.last(), Some(&"response.failed"), "{kinds:?}");
    assert!(kinds.contains(&"error"));
    assert!(kinds.contains(&"response.output_text.delta"));
    for e in &events {
        common::schema::assert_valid_event(e);
    }
}

#[tokio::test]
async fn an_unreachable_upstream_is_an_error_event() {
    // Envoy's upstream cluster points at a closed port: its 503 becomes the error event.
    let dead = common::free_port();
    let stack = Stack::with_websocket(dead, &[]);
    let mut ws = connect(&stack).await;
    ask(&mut ws, json!({"model": "m", "input": "x"})).await;
    let event = recv(&mut ws).await;
    assert_eq!(event["type"], "error", "{event}");
    assert_eq!(event["status"], 503, "{event}");
}

#[tokio::test]
async fn connections_over_the_cap_are_refused_with_an_envelope() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_sse("ok"));
    let stack = Stack::with_websocket(upstream.port(), &["--ws-max-connections", "1"]);
    let _first = connect(&stack).await;
    let refused = tokio_tungstenite::connect_async(stack.ws_url()).await;
    let Err(tokio_tungstenite::tungstenite::Error::Http(response)) = refused else {
        panic!("the second connection was not refused: {refused:?}");
    };
    assert_eq!(response.status(), 503);
    let body: Value = serde_json::from_slice(response.body().as_deref().unwrap_or_default())
        .expect("an error envelope");
    assert_eq!(body["error"]["code"], "websocket_connections_exhausted");
    drop(_first);
    // The slot is free again once the first is gone.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while tokio_tungstenite::connect_async(stack.ws_url())
        .await
        .is_err()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot was never released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Opens a socket with these handshake headers; the refusal's status and error code if refused.
async fn open_with(
    stack: &Stack,
    headers: &[(&str, &str)],
) -> Result<
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    (u16, String),
> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut request = stack.ws_url().into_client_request().unwrap();
    for (name, value) in headers {
        let name = axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap();
        request.headers_mut().insert(name, value.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(request).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let body: Value =
                serde_json::from_slice(response.body().as_deref().unwrap_or_default())
                    .expect("an error envelope");
            Err((
                response.status().as_u16(),
                body["error"]["code"].as_str().unwrap_or("").to_owned(),
            ))
        }
        Err(e) => panic!("not an HTTP refusal: {e}"),
    }
}

#[tokio::test]
async fn one_caller_cannot_take_every_connection_and_origins_can_be_limited() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_sse("ok"));
    // Callers told apart by a header Envoy would set after verifying them (x-caller here);
    // by address, websocket_bounds.rs.
    let stack = Stack::with_websocket(
        upstream.port(),
        &[
            "--ws-max-connections",
            "4",
            "--ws-key-header",
            "x-caller",
            "--ws-max-connections-per-key",
            "2",
            "--ws-allowed-origins",
            "https://app.example",
        ],
    );
    let alice = [("x-caller", "alice")];
    let _a1 = open_with(&stack, &alice).await.unwrap();
    let _a2 = open_with(&stack, &alice).await.unwrap();
    assert_eq!(
        open_with(&stack, &alice).await.err(),
        Some((429, "websocket_connections_exhausted".into()))
    );
    // Another caller still gets in; the global count still holds.
    let bob = [("x-caller", "bob")];
    let mut b1 = open_with(&stack, &bob).await.unwrap();
    ask(&mut b1, json!({"model": "m", "input": "x"})).await;
    completed(&mut b1).await;
    let _b2 = open_with(&stack, &bob).await.unwrap();
    assert_eq!(
        open_with(&stack, &[("x-caller", "carol")]).await.err(),
        Some((503, "websocket_connections_exhausted".into()))
    );
    // A browser page from elsewhere is refused before any slot is taken.
    assert_eq!(
        open_with(
            &stack,
            &[("x-caller", "dave"), ("origin", "https://evil.example")]
        )
        .await
        .err(),
        Some((403, "origin_not_allowed".into()))
    );
    drop(_a1);
    // Alice's place is free again once her socket is gone.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while open_with(
        &stack,
        &[("x-caller", "alice"), ("origin", "https://app.example")],
    )
    .await
    .is_err()
    {
        assert!(tokio::time::Instant::now() < deadline, "never released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_connection_that_holds_too_much_is_closed_and_the_others_go_on() {
    let upstream = ScriptedUpstream::start();
    // Slow answers: the responses stay in flight while messages queue behind them.
    upstream.set_default(|| chat_sse("ok"));
    let stack = Stack::with_websocket(
        upstream.port(),
        &[
            "--ws-max-socket-bytes",
            "300000",
            "--ws-max-total-bytes",
            "1000000",
        ],
    );
    let mut greedy = connect(&stack).await;
    let mut modest = connect(&stack).await;
    // A context of ~100 KB (counted at its size: it is kept as the text it came as), then a
    // message that takes the connection over its limit.
    ask(
        &mut greedy,
        json!({"model": "m", "input": "x".repeat(100_000)}),
    )
    .await;
    let id = completed(&mut greedy).await["response"]["id"].clone();
    ask(
        &mut greedy,
        json!({"model": "m", "previous_response_id": id, "input": "y".repeat(220_000)}),
    )
    .await;
    assert_eq!(
        closed(&mut greedy).await,
        Some(CloseCode::Policy),
        "the connection's own limit: 1008"
    );
    ask(&mut modest, json!({"model": "m", "input": "still served"})).await;
    completed(&mut modest).await;
}

#[tokio::test]
async fn the_maximum_age_ends_with_websocket_connection_limit_reached() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_sse("ok"));
    let stack = Stack::with_websocket(upstream.port(), &["--ws-max-age", "2"]);
    let mut ws = connect(&stack).await;
    ask(&mut ws, json!({"model": "m", "input": "x"})).await;
    completed(&mut ws).await;
    let event = recv(&mut ws).await;
    assert_eq!(error_code(&event), "websocket_connection_limit_reached");
    assert_eq!(closed(&mut ws).await, Some(CloseCode::Normal));
}

#[tokio::test]
async fn an_idle_connection_is_closed_cleanly() {
    let upstream = ScriptedUpstream::start();
    let stack = Stack::with_websocket(upstream.port(), &["--ws-idle-timeout", "1"]);
    let mut ws = connect(&stack).await;
    assert_eq!(closed(&mut ws).await, Some(CloseCode::Normal));
    // Pings keep nothing alive: a client that only pings is closed as on time.
    let mut pinging = connect(&stack).await;
    let started = std::time::Instant::now();
    let ended = loop {
        pinging
            .send(Message::Ping(b"here".to_vec().into()))
            .await
            .ok();
        match tokio::time::timeout(Duration::from_millis(200), pinging.next()).await {
            Ok(Some(Ok(Message::Close(frame)))) => break frame.map(|f| f.code),
            Ok(Some(Ok(Message::Pong(_)))) | Err(_) => {}
            Ok(other) => panic!("{other:?}"),
        }
        assert!(started.elapsed() < TIMEOUT, "pings kept the socket open");
    };
    assert_eq!(ended, Some(CloseCode::Normal));
}

#[tokio::test]
async fn sigterm_lets_the_response_in_flight_finish_then_closes() {
    let gate = Gate::new();
    let upstream = ScriptedUpstream::with_replies([chat_sse("drained").pause_after(1, &gate)]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut ws = connect(&stack).await;
    ask(&mut ws, json!({"model": "m", "input": "x"})).await;
    // Nothing reaches the client before the gate but the response's first events; whatever
    // else does (a failure) is shown with the logs, rather than a wait for the gate to time out.
    tokio::select! {
        () = gate.wait_reached(TIMEOUT) => {}
        message = async {
            loop {
                match ws.next().await {
                    Some(Ok(Message::Text(text))) if !text.contains("failed")
                        && !text.contains(r#""type":"error""#) => {}
                    other => break other,
                }
            }
        } => panic!(
            "before the upstream reached the gate: {message:?}\n{}\n{}",
            stack.translator_logs(),
            stack.envoy.logs()
        ),
    }
    // The processor (ext_proc), Envoy itself (module: the module's bootstrap extension tells
    // the socket, and Envoy waits for it).
    let pid = stack.socket_server_pid().to_string();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    tokio::time::sleep(Duration::from_millis(300)).await;
    gate.release();
    let events = response(&mut ws).await;
    assert_eq!(last_response(&events)["status"], "completed");
    assert_eq!(closed(&mut ws).await, Some(CloseCode::Away));
}

/// Codex 0.169's socket, as captured: its handshake headers, a prewarm `response.create`
/// with `generate: false` (and `stream: true`), then the turn continuing it. The prewarm is
/// answered without the upstream; the turn reaches it with the preloaded items first.
#[tokio::test]
async fn codex_shaped_prewarm_then_turn() {
    let upstream = ScriptedUpstream::with_replies([chat_sse("hi")]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut request = stack.ws_url().into_client_request().expect("request");
    for (name, value) in [
        ("authorization", "Bearer x"),
        ("originator", "codex_exec"),
        ("openai-beta", "responses_websockets=2026-02-06"),
        (
            "user-agent",
            "codex_exec/0.169.0 (Debian 12.0.0; x86_64) xterm (codex_exec; 0.169.0)",
        ),
    ] {
        request
            .headers_mut()
            .insert(name, value.parse().expect("header"));
    }
    let (mut ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgrade");
    let common = json!({
        "model": "gpt-5.5", "stream": true, "tool_choice": "auto", "parallel_tool_calls": true,
        "reasoning": {"effort": "medium"}, "store": false,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "thread-1",
        "text": {"verbosity": "low"}, "client_metadata": {"session_id": "thread-1"},
        "instructions": "You are Codex.",
    });
    let mut prewarm = common.clone();
    prewarm["generate"] = json!(false);
    prewarm["input"] = json!([{"type": "message", "role": "developer",
        "content": [{"type": "input_text", "text": "<permissions>read-only</permissions>"}]}]);
    ask(&mut ws, prewarm).await;
    let preloaded = completed(&mut ws).await;
    assert_eq!(preloaded["output"], json!([]));
    assert!(
        upstream.requests().is_empty(),
        "the prewarm never reaches the upstream"
    );

    let mut turn = common;
    turn["previous_response_id"] = preloaded["id"].clone();
    turn["input"] = json!([{"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "say hi"}]}]);
    ask(&mut ws, turn).await;
    let answered = completed(&mut ws).await;
    assert_eq!(answered["previous_response_id"], preloaded["id"]);
    let requests = upstream.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].json()["messages"],
        json!([
            {"role": "system", "content": "You are Codex.\n\n<permissions>read-only</permissions>"},
            {"role": "user", "content": [{"type": "text", "text": "say hi"}]}
        ])
    );
}

/// More messages than the queue reads ahead (8, or one maximum message's worth of bytes),
/// sent while the first response is held: reading pauses, nothing is lost, all are answered
/// in order.
/// Codex 0.171 with `openai_base_url` (it believes it talks to OpenAI), its second connection
/// replayed byte for byte with its handshake's headers (`OpenAI-Beta:
/// responses_websockets=2026-02-06`, ...): the turn (`internal_chat_message_metadata_passthrough`
/// on every item) gets the demo's call of Codex's `exec`, the continuation naming it (the id
/// this run gave, as Codex names the id it received) with the tool's output gets a text; the
/// upstream gets the Chat requests the snapshot states, none of Codex's bookkeeping in them.
#[tokio::test]
async fn codex_0_171_openai_mode_turn_and_continuation() {
    let demo = common::RecordingDemo::start();
    let stack = Stack::with_websocket(demo.port(), &[]);
    let mut request = stack.ws_url().into_client_request().expect("request");
    for (k, v) in common::codex::headers("websocket.head") {
        let name: tokio_tungstenite::tungstenite::http::HeaderName = k.parse().expect("a name");
        request
            .headers_mut()
            .insert(name, v.parse().expect("a value"));
    }
    let (mut ws, response) = tokio_tungstenite::connect_async(request)
        .await
        .expect("the upgrade with Codex's headers");
    assert_eq!(response.status(), 101);

    let turn = String::from_utf8(common::codex::body("websocket-turn.json")).unwrap();
    ws.send(Message::text(turn)).await.expect("send");
    let first = completed(&mut ws).await;
    let call = &first["output"][0];
    assert_eq!(call["type"], "custom_tool_call", "{first}");
    assert_eq!(call["name"], "exec");
    assert_eq!(call["namespace"], "functions");

    let recorded = String::from_utf8(common::codex::body("websocket-tool-output.json")).unwrap();
    let named: Value = serde_json::from_str(&recorded).unwrap();
    let named = named["previous_response_id"]
        .as_str()
        .expect("a continuation");
    let continuation = recorded.replacen(named, first["id"].as_str().unwrap(), 1);
    ws.send(Message::text(continuation)).await.expect("send");
    let second = completed(&mut ws).await;
    let text = second["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.starts_with("The tool returned: Script failed"),
        "{second}"
    );

    // Beside the bookkeeping, any other unknown field of an item is still refused, naming it.
    ask(
        &mut ws,
        json!({"model": "gpt-6.2-sol", "input": [{"type": "message", "role": "user", "content": "hi",
               "internal_chat_message_metadata_passthrough": {"turn_id": "t1"}, "turn_id": "t1"}]}),
    )
    .await;
    let refused = recv(&mut ws).await;
    assert_eq!(error_code(&refused), "unknown_parameter");
    assert_eq!(refused["error"]["param"], "input[0].turn_id", "{refused}");

    let chats: Vec<Value> = demo
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .map(|r| r.json())
        .collect();
    let snapshot = common::codex::snapshot("websocket-turn");
    assert_eq!(chats.len(), 2, "{chats:?}");
    for (i, chat) in chats.iter().enumerate() {
        assert!(!common::codex::has_bookkeeping(chat), "message {i}: {chat}");
        assert!(
            *chat == snapshot["messages"][i]["chat"],
            "message {i}: the upstream got another Chat request than the snapshot's"
        );
    }
}

#[tokio::test]
async fn messages_beyond_the_read_ahead_queue_wait_and_are_all_answered_in_order() {
    const LIMIT: usize = 64 * 1024;
    const N: usize = 20;
    let gate = Gate::new();
    let upstream = ScriptedUpstream::with_replies([chat_sse("first").pause_after(1, &gate)]);
    upstream.set_default(|| chat_sse("ok"));
    let limit = LIMIT.to_string();
    let stack = Stack::with_websocket(upstream.port(), &["--max-request-bytes", &limit]);
    let mut ws = connect(&stack).await;
    // Each a quarter of the limit: the byte bound pauses reading after four.
    let pad = "p".repeat(LIMIT / 4 - 100);
    for i in 0..N {
        ask(
            &mut ws,
            json!({"model": "m", "input": format!("turn {i} {pad}")}),
        )
        .await;
    }
    gate.wait_reached(TIMEOUT).await;
    gate.release();
    for _ in 0..N {
        completed(&mut ws).await;
    }
    let turns: Vec<String> = upstream
        .requests()
        .iter()
        .map(|r| {
            let content = r.json()["messages"][0]["content"]
                .as_str()
                .unwrap()
                .to_owned();
            content.split(' ').take(2).collect::<Vec<_>>().join(" ")
        })
        .collect();
    let expected: Vec<String> = (0..N).map(|i| format!("turn {i}")).collect();
    assert_eq!(turns, expected);
}

/// `--ws-max-context-bytes` from both sides: a context under the cap is continued; one over
/// it is not kept, and naming it is `previous_response_not_found` saying why (the upstream is
/// not asked).
#[tokio::test]
async fn the_context_cap_from_both_sides() {
    const CAP: usize = 8 * 1024;
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_sse("ok"));
    let cap = CAP.to_string();
    let stack = Stack::with_websocket(upstream.port(), &["--ws-max-context-bytes", &cap]);
    let mut ws = connect(&stack).await;
    // Under: a short turn is kept and continued.
    ask(&mut ws, json!({"model": "m", "input": "short"})).await;
    let small = completed(&mut ws).await;
    ask(
        &mut ws,
        json!({"model": "m", "previous_response_id": small["id"], "input": "next"}),
    )
    .await;
    completed(&mut ws).await;
    assert_eq!(upstream.requests().len(), 2);
    // Over: a turn whose input alone is over the cap is answered but not kept.
    ask(&mut ws, json!({"model": "m", "input": "x".repeat(CAP)})).await;
    let large = completed(&mut ws).await;
    ask(
        &mut ws,
        json!({"model": "m", "previous_response_id": large["id"], "input": "next"}),
    )
    .await;
    let event = recv(&mut ws).await;
    assert_eq!(error_code(&event), "previous_response_not_found");
    let message = event["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("larger than this server keeps"),
        "{message}"
    );
    assert_eq!(
        upstream.requests().len(),
        3,
        "the refused continuation never went upstream"
    );
}

/// `configuration_update` items on every transport: over HTTP (JSON and SSE) and on the
/// socket the latest update of each setting wins over the request's own `reasoning.effort` and
/// `text.format`, and no item goes upstream; on the socket a continuation's kept context holds
/// the earlier updates, so they stay in effect until a newer one replaces them.
#[tokio::test]
async fn configuration_updates_set_the_turn_on_every_transport_and_across_continuations() {
    let json_reply = Reply::json(
        200,
        &json!({"id": "c", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "{}"},
                             "finish_reason": "stop"}]}),
    );
    let upstream = ScriptedUpstream::with_replies([
        json_reply,
        chat_sse("{}"),
        chat_sse("{}"),
        chat_sse("{}"),
        chat_sse("{}"),
    ]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let schema = json!({"type": "json_schema", "name": "plan", "schema": {"type": "object"}});
    let input = json!([
        {"role": "user", "content": "Plan it."},
        {"type": "configuration_update", "id": null, "reasoning": {"effort": "high"},
         "text": {"format": schema}},
        {"role": "assistant", "content": "{}"},
        {"role": "user", "content": "Shorter."},
        {"type": "configuration_update", "reasoning": {"effort": "minimal"}, "text": null}
    ]);
    let body = json!({"model": "m", "reasoning": {"effort": "low"}, "input": input});
    let expected_format = json!({"type": "json_schema",
        "json_schema": {"name": "plan", "schema": {"type": "object"}}});
    let check = |chat: &Value, effort: &str, what: &str| {
        assert_eq!(chat["reasoning_effort"], effort, "{what}: {chat}");
        assert_eq!(chat["response_format"], expected_format, "{what}: {chat}");
        let messages = chat["messages"].as_array().expect("messages");
        assert!(
            messages
                .iter()
                .all(|m| m.get("configuration_update").is_none() && m["role"] != "system"),
            "{what}: {chat}"
        );
    };

    // HTTP: JSON, then SSE.
    for stream in [false, true] {
        let mut body = body.clone();
        body["stream"] = json!(stream);
        let answer = common::client()
            .post(stack.envoy.url("/v1/responses"))
            .json(&body)
            .timeout(TIMEOUT)
            .send()
            .await
            .expect("send");
        assert_eq!(answer.status(), 200);
        let text = answer.text().await.expect("body");
        let response = if stream {
            let events = common::sse::parse_sse_json(&text);
            events.last().expect("events").1["response"].clone()
        } else {
            serde_json::from_str(&text).expect("JSON")
        };
        assert_eq!(response["status"], "completed", "{text}");
        // The request's own settings are echoed.
        assert_eq!(response["reasoning"]["effort"], "low", "{response}");
        assert_eq!(response["text"]["format"]["type"], "text", "{response}");
    }

    // The socket: the same request, then continuations.
    let mut ws = connect(&stack).await;
    ask(&mut ws, body.clone()).await;
    let id = completed(&mut ws).await["id"].as_str().unwrap().to_owned();
    // A newer update of the effort only: the format of the kept context's update holds.
    ask(
        &mut ws,
        json!({"model": "m", "reasoning": {"effort": "low"}, "previous_response_id": id,
               "input": [{"role": "user", "content": "Again."},
                         {"type": "configuration_update", "reasoning": {"effort": "medium"}}]}),
    )
    .await;
    let id = completed(&mut ws).await["id"].as_str().unwrap().to_owned();
    // No update of its own: both settings from the kept context's latest updates.
    ask(
        &mut ws,
        json!({"model": "m", "reasoning": {"effort": "low"}, "previous_response_id": id,
               "input": [{"role": "user", "content": "Once more."}]}),
    )
    .await;
    completed(&mut ws).await;

    let requests = upstream.requests();
    assert_eq!(requests.len(), 5);
    let chats: Vec<Value> = requests.iter().map(|r| r.json()).collect();
    check(&chats[0], "minimal", "HTTP JSON");
    assert_eq!(chats[0].get("stream"), None);
    check(&chats[1], "minimal", "HTTP SSE");
    assert_eq!(chats[1]["stream"], true);
    check(&chats[2], "minimal", "WebSocket");
    check(&chats[3], "medium", "WebSocket continuation with an update");
    check(&chats[4], "medium", "WebSocket continuation without one");
    assert_eq!(
        chats[4]["messages"].as_array().map(Vec::len),
        Some(7),
        "the whole kept conversation: {}",
        chats[4]
    );
}

/// Routing by model: with the shipped config's route by `x-responses-model` enabled
/// (`big-model` to a second upstream), a WebSocket response for `big-model` reaches that
/// upstream in module mode, as an HTTP exchange does (its Chat request enters Envoy's internal
/// listener, which keeps the model headers), and in ext_proc mode (the processor's enters the
/// loopback listener responses_calls, which keeps them too: docs/deploying.md, routing by
/// model).
#[tokio::test]
async fn websocket_responses_are_routed_by_model() {
    let small = ScriptedUpstream::start();
    small.set_default(|| chat_sse("small"));
    let big = ScriptedUpstream::start();
    big.set_default(|| chat_sse("big"));
    let big_port = big.port();
    let stack = Stack::with_websocket_in(common::mode(), small.port(), &[], move |config| {
        common::envoy::with_model_route(config, big_port)
    });
    let mut ws = connect(&stack).await;
    ask(&mut ws, json!({"model": "big-model", "input": "hi"})).await;
    let big_answer = completed(&mut ws).await;
    ask(&mut ws, json!({"model": "small-model", "input": "hi"})).await;
    let small_answer = completed(&mut ws).await;
    let text = |r: &Value| r["output"][0]["content"][0]["text"].clone();
    assert_eq!(text(&small_answer), "small");
    assert_eq!(text(&big_answer), "big");
    let at_big = big.requests();
    assert_eq!(at_big.len(), 1);
    assert_eq!(at_big[0].header("x-responses-model"), Some("big-model"));
    assert_eq!(small.requests().len(), 1);
    // A client's own model header on the upgrade steers nothing.
    let mut request = stack.ws_url().into_client_request().expect("request");
    request
        .headers_mut()
        .insert("x-responses-model", "big-model".parse().unwrap());
    let (mut forged, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgrade");
    ask(&mut forged, json!({"model": "small-model", "input": "hi"})).await;
    assert_eq!(text(&completed(&mut forged).await), "small");
}

/// SIGTERM with a response that outlasts the drain time: it ends with `response.failed`
/// (`server_shutting_down`), then the socket closes with 1001, within the drain time and two
/// seconds. The drain time is the processor's `--drain-seconds` (ext_proc), the module's
/// bootstrap extension's `drain_seconds` (module).
#[tokio::test]
async fn sigterm_ends_a_response_that_outlasts_the_drain_time_then_closes() {
    const DRAIN_SECONDS: u64 = 2;
    let gate = Gate::new();
    let upstream = ScriptedUpstream::with_replies([chat_sse("never").pause_after(1, &gate)]);
    let seconds = DRAIN_SECONDS.to_string();
    let stack = match common::mode() {
        common::Mode::ExtProc => {
            Stack::with_websocket(upstream.port(), &["--drain-seconds", &seconds])
        }
        common::Mode::Module => {
            Stack::with_websocket_in(common::Mode::Module, upstream.port(), &[], |config| {
                let drain = "    extension_name: drain\n";
                assert_eq!(config.matches(drain).count(), 1, "the drain extension");
                config.replace(
                    drain,
                    &format!(
                        "{drain}    extension_config:\n      \"@type\": type.googleapis.com/google.protobuf.StringValue\n      value: '{{\"drain_seconds\": {DRAIN_SECONDS}}}'\n"
                    ),
                )
            })
        }
    };
    let mut ws = connect(&stack).await;
    ask(&mut ws, json!({"model": "m", "input": "x"})).await;
    gate.wait_reached(TIMEOUT).await;
    let pid = stack.socket_server_pid().to_string();
    let started = std::time::Instant::now();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(status.success());
    let events = response(&mut ws).await;
    let failed = last_response(&events);
    assert_eq!(failed["status"], "failed", "{events:?}");
    assert_eq!(failed["error"]["code"], "server_shutting_down");
    assert_eq!(closed(&mut ws).await, Some(CloseCode::Away));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(DRAIN_SECONDS * 1000 - 100)
            && took <= Duration::from_secs(DRAIN_SECONDS + 2),
        "{took:?}"
    );
    gate.release();
}

/// Module mode: Envoy's graceful drain (`POST /drain_listeners?graceful`, as in a hot restart)
/// reaches the socket through the module's bootstrap extension: the response in flight
/// finishes, then 1001. (The processor drains on its own SIGTERM; it hears nothing of
/// Envoy's.)
#[tokio::test]
async fn envoys_drain_lets_the_response_finish_then_closes() {
    if !common::only_module("Envoy's drain reaches the module's sockets only") {
        return;
    }
    let gate = Gate::new();
    let upstream = ScriptedUpstream::with_replies([chat_sse("drained").pause_after(1, &gate)]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut ws = connect(&stack).await;
    let mut idle = connect(&stack).await;
    ask(&mut ws, json!({"model": "m", "input": "x"})).await;
    gate.wait_reached(TIMEOUT).await;
    let (status, _) = common::envoy::http_post(
        stack.envoy.admin_port(),
        "/drain_listeners?graceful&skip_exit",
    )
    .expect("admin answers");
    assert_eq!(status, 200);
    // A socket with nothing in flight closes at once.
    assert_eq!(closed(&mut idle).await, Some(CloseCode::Away));
    gate.release();
    let events = response(&mut ws).await;
    assert_eq!(last_response(&events)["status"], "completed");
    assert_eq!(closed(&mut ws).await, Some(CloseCode::Away));
}

/// Module mode: a panic while serving a socket (the core panics on a marker in the upstream's
/// answer: test builds have `fault-injection`) closes that socket with 1011; another socket,
/// open meanwhile, and HTTP exchanges go on: Envoy did not crash.
#[tokio::test]
async fn a_panic_fails_that_socket_only() {
    if !common::only_module("the module's containment (the processor's task ends its socket)") {
        return;
    }
    let marker = responses_core::fault::PANIC_MARKER;
    let upstream = ScriptedUpstream::with_replies([chat_sse(marker)]);
    upstream.set_default(|| chat_sse("fine"));
    let mut stack = Stack::with_websocket(upstream.port(), &[]);
    let mut other = connect(&stack).await;
    let mut ws = connect(&stack).await;
    ask(&mut ws, json!({"model": "m", "input": "x"})).await;
    let end = loop {
        match tokio::time::timeout(TIMEOUT, ws.next())
            .await
            .expect("the socket ends in time")
        {
            Some(Ok(Message::Close(frame))) => break frame.map(|f| f.code),
            Some(Ok(Message::Text(text))) => assert!(!text.contains(marker), "{text}"),
            Some(Ok(_)) => continue,
            Some(Err(e)) => panic!("no close frame: {e}"),
            None => panic!("no close frame"),
        }
    };
    assert_eq!(end, Some(CloseCode::Error));
    ask(&mut other, json!({"model": "m", "input": "y"})).await;
    completed(&mut other).await;
    let http = common::client()
        .post(stack.envoy.url("/v1/responses"))
        .json(&json!({"model": "m", "input": "z", "stream": true}))
        .send()
        .await
        .expect("Envoy answers");
    assert_eq!(http.status(), 200);
    assert!(stack.translator_running(), "Envoy is alive");
    assert!(stack.translator_logs().contains("panic"));
}

/// Module mode: HTTP/2's extended CONNECT (RFC 8441), a WebSocket over an HTTP/2 stream: Envoy
/// hands the module the HTTP/1.1 form of the upgrade (without a key), answers its 101 with
/// HTTP/2's 200, and a response runs over it as over HTTP/1.1. (The processor's listener
/// takes HTTP/1.1 upgrades; envoy/envoy.yaml does not allow the extended CONNECT.)
#[tokio::test]
async fn a_response_over_http2_extended_connect() {
    if !common::only_module("envoy/envoy-module.yaml allows HTTP/2's extended CONNECT") {
        return;
    }
    let upstream = ScriptedUpstream::with_replies([chat_sse("over h2")]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", stack.envoy.port()))
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !client.is_extended_connect_protocol_enabled() {
        assert!(tokio::time::Instant::now() < deadline, "Envoy's settings");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let request = http::Request::builder()
        .method("CONNECT")
        .uri(format!(
            "http://127.0.0.1:{}/v1/responses",
            stack.envoy.port()
        ))
        .header("sec-websocket-version", "13")
        .extension(h2::ext::Protocol::from_static("websocket"))
        .body(())
        .expect("request");
    let (response, mut send) = client.send_request(request, false).expect("send");
    let response = tokio::time::timeout(TIMEOUT, response)
        .await
        .expect("an answer in time")
        .expect("an answer");
    assert_eq!(response.status(), 200);
    let message = json!({"type": "response.create", "model": "m", "input": "hi"}).to_string();
    let mask = [7u8, 1, 9, 3];
    let mut frame = vec![0x81, 0x80 | 126];
    frame.extend((message.len() as u16).to_be_bytes());
    frame.extend(mask);
    frame.extend(message.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    send.send_data(bytes::Bytes::from(frame), false)
        .expect("data");
    // The server's frames (unmasked text), until the terminal event.
    let mut body = response.into_body();
    let mut buffer = Vec::new();
    let mut events: Vec<Value> = Vec::new();
    while !events
        .last()
        .is_some_and(|e| e["type"] == "response.completed")
    {
        let data = tokio::time::timeout(TIMEOUT, body.data())
            .await
            .expect("data in time")
            .expect("a data frame")
            .expect("readable");
        let _ = body.flow_control().release_capacity(data.len());
        buffer.extend_from_slice(&data);
        while buffer.len() >= 2 {
            let (len, at) = match buffer[1] & 0x7f {
                126 if buffer.len() >= 4 => {
                    (usize::from(u16::from_be_bytes([buffer[2], buffer[3]])), 4)
                }
                127 if buffer.len() >= 10 => (
                    u64::from_be_bytes(buffer[2..10].try_into().unwrap()) as usize,
                    10,
                ),
                126 | 127 => break,
                n => (usize::from(n), 2),
            };
            if buffer.len() < at + len {
                break;
            }
            assert_eq!(buffer[0], 0x81, "a text frame");
            events.push(common::json::strict(
                std::str::from_utf8(&buffer[at..at + len]).unwrap(),
            ));
            buffer.drain(..at + len);
        }
    }
    assert_eq!(events[0]["type"], "response.created");
    assert_eq!(
        events.last().unwrap()["response"]["output"][0]["content"][0]["text"],
        "over h2"
    );
}

#[tokio::test]
async fn three_sockets_sending_the_gzipped_arrays_shape_are_refused_within_the_json_budget() {
    // The body of compression.rs's three arrays, as one message on each of three sockets (a
    // socket's messages are not compressed): the same 400, worded without a tree of the
    // message, and the peak memory of the process serving the sockets raised by less than
    // the same bound.
    const ZEROS: usize = 8_300_000;
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_sse("ok"));
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let pid = stack.socket_server_pid();
    let text = crate::compression::zeros_then_a_byte(ZEROS);
    let text = String::from_utf8(text).expect("JSON text");
    let mut sockets = Vec::new();
    for _ in 0..3 {
        sockets.push(connect(&stack).await);
    }
    // Warm: one socket's first message allocates what later ones reuse.
    sockets[0].send(Message::text(text.clone())).await.unwrap();
    assert_eq!(error_code(&recv(&mut sockets[0]).await), "invalid_json");
    let reset = common::memory::reset_peak(pid);
    let before = common::memory::resident(pid, "VmHWM:");
    let sent = sockets
        .iter_mut()
        .map(|ws| ws.send(Message::text(text.clone())));
    for sent in futures_util::future::join_all(sent).await {
        sent.expect("sent");
    }
    let mut events = Vec::new();
    for ws in &mut sockets {
        events.push(recv(ws).await);
    }
    let after = common::memory::resident(pid, "VmHWM:");
    println!(
        "three messages of {} bytes at once: peak memory {} -> {} (+{}; peak reset: {reset})",
        text.len(),
        common::memory::mib(before),
        common::memory::mib(after),
        common::memory::mib(after.saturating_sub(before))
    );
    let column = format!("trailing characters at line 1 column {}", text.len());
    for event in &events {
        assert_eq!(error_code(event), "invalid_json", "{event}");
        assert_eq!(event["status"], 400, "{event}");
        let message = event["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(&column), "{message}");
    }
    assert!(
        after.saturating_sub(before) < crate::compression::THREE_AT_ONCE,
        "peak memory grew by {}",
        common::memory::mib(after - before)
    );
    // The sockets go on.
    ask(
        &mut sockets[1],
        json!({"model": "m", "input": "still here"}),
    )
    .await;
    completed(&mut sockets[1]).await;
    assert_eq!(
        upstream.requests().len(),
        1,
        "only the last request went upstream"
    );
}

/// The lane cap and the steer cap from both sides, through Envoy: 8 named lanes (each keeping
/// a preloaded context, `generate: false`) are served, the 9th and a 20th are refused on their
/// own lane (`too_many_lanes`, nothing sent upstream), the lanes that exist and the lane
/// without a name go on; a response in flight takes 4 steers and refuses the 5th
/// (`too_many_pending_steers`), then completes and its successor carries the 4 inputs upstream.
#[tokio::test]
async fn the_lane_and_steer_caps_from_both_sides() {
    let held = Gate::new();
    let upstream = ScriptedUpstream::with_replies([
        chat_sse("in flight").pause_after(1, &held),
        chat_sse("successor"),
        chat_sse("unnamed"),
    ]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut ws = connect(&stack).await;
    let lane =
        |name: &str| json!({"model": "m", "input": "x", "generate": false, "stream_id": name});
    for i in 0..8 {
        ask(&mut ws, lane(&format!("l{i}"))).await;
        let events = response(&mut ws).await;
        assert_eq!(
            types(&events).last(),
            Some(&"response.completed"),
            "lane {i}"
        );
        assert!(events.iter().all(|e| e["stream_id"] == format!("l{i}")));
    }
    for name in ["l8", "l19"] {
        ask(&mut ws, lane(name)).await;
        let refused = response(&mut ws).await;
        assert_eq!(error_code(&refused[0]), "too_many_lanes", "{refused:?}");
        assert_eq!(refused[0]["stream_id"], name);
        assert_eq!(refused[0]["status"], 400);
    }
    assert!(
        upstream.requests().is_empty(),
        "nothing refused or preloaded went upstream"
    );

    // A lane that exists runs a response; it is held upstream while steers come.
    ask(
        &mut ws,
        json!({"model": "m", "input": "write", "stream_id": "l0"}),
    )
    .await;
    let created = recv(&mut ws).await;
    assert_eq!(created["type"], "response.created");
    let id = created["response"]["id"].as_str().unwrap().to_owned();
    let steer = |text: &str| {
        Message::text(
            json!({"type": "response.steer", "previous_response_id": id, "input": text})
                .to_string(),
        )
    };
    let mut steered = 0;
    for i in 0..5 {
        ws.send(steer(&format!("steer {i}"))).await.unwrap();
        let answer = loop {
            let event = recv(&mut ws).await;
            if event["type"]
                .as_str()
                .unwrap_or_default()
                .starts_with("response.steer.")
            {
                break event;
            }
        };
        assert_eq!(answer["stream_id"], "l0");
        if i < 4 {
            assert_eq!(answer["type"], "response.steer.accepted", "{answer}");
            steered += 1;
        } else {
            assert_eq!(answer["type"], "response.steer.failed", "{answer}");
            assert_eq!(answer["error"]["code"], "too_many_pending_steers");
            assert_eq!(answer["steer"]["input"], "steer 4");
        }
    }
    assert_eq!(steered, 4);
    held.release();
    let first = response(&mut ws).await;
    assert_eq!(types(&first).last(), Some(&"response.completed"));
    let successor = response(&mut ws).await;
    assert_eq!(successor[0]["type"], "response.created");
    assert_eq!(successor[0]["response"]["previous_response_id"], json!(id));
    assert_eq!(types(&successor).last(), Some(&"response.completed"));
    let sent = upstream.requests()[1].json();
    let contents: Vec<Value> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].clone())
        .collect();
    assert_eq!(
        contents[contents.len() - 4..],
        [
            json!("steer 0"),
            json!("steer 1"),
            json!("steer 2"),
            json!("steer 3")
        ],
        "{sent}"
    );

    // The lane without a name is not counted among the 8.
    ask(&mut ws, json!({"model": "m", "input": "plain"})).await;
    let plain = response(&mut ws).await;
    assert_eq!(types(&plain).last(), Some(&"response.completed"));
    assert!(plain.iter().all(|e| e.get("stream_id").is_none()));
}
