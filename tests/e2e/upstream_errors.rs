//! Every recorded upstream failure (tests/fixtures/upstream_errors/: vLLM, SGLang, llama.cpp's
//! server, TGI, Ollama, LM Studio, LiteLLM, OpenAI, Envoy) answered by a scripted upstream,
//! through the real Envoy and the translator (both modes: `RESPONSES_E2E_MODE=module`): the
//! client gets OpenAI's status, type, code, param and the upstream's message, for a JSON
//! request and a streamed one alike (no stream has started when the error status arrives);
//! an error inside the Chat stream ends the client's stream with `response.failed` carrying
//! the same code. The envelope keeps the upstream's `retry-after`, `retry-after-ms` and
//! `x-ratelimit-*` headers (and no other of its headers); on the WebSocket transport the
//! `error` event carries the same error and those headers as fields. core/tests/upstream_errors.rs
//! checks the same mapping without Envoy.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::recorded::{fixtures, Fixture};
use common::sse::parse_sse;
use common::websocket::recv;
use common::{ScriptedUpstream, Stack};
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

const TIMEOUT: Duration = Duration::from_secs(30);

struct Answer {
    status: u16,
    content_type: String,
    /// Every response header, by (lowercase) name.
    headers: BTreeMap<String, String>,
    body: String,
}

/// The headers a fixture's error must keep.
fn expected_headers(f: &Fixture) -> BTreeMap<String, String> {
    f.expect["headers"]
        .as_object()
        .map(|h| {
            h.iter()
                .map(|(k, v)| (k.clone(), v.as_str().expect("a header value").to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

/// The response headers of the kind an error keeps.
fn retry_headers(headers: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    headers
        .iter()
        .filter(|(k, _)| k.starts_with("retry-after") || k.starts_with("x-ratelimit-"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The members of the client's error that must be the fixture's, on HTTP and on the
/// WebSocket (the token counts where the upstream gave them, else absent on both sides).
const ERROR_KEYS: [&str; 6] = [
    "type",
    "code",
    "param",
    "message",
    "n_prompt_tokens",
    "n_ctx",
];

async fn post(port: u16, stream: bool) -> Answer {
    let response = common::client()
        .post(format!("http://127.0.0.1:{port}/v1/responses"))
        .json(&json!({"model": "m", "input": "hi", "stream": stream}))
        .timeout(TIMEOUT)
        .send()
        .await
        .expect("an answer");
    let status = response.status().as_u16();
    let headers: BTreeMap<String, String> = response
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_owned()))
        .collect();
    let content_type = headers.get("content-type").cloned().unwrap_or_default();
    let body = response.text().await.expect("a body");
    Answer {
        status,
        content_type,
        headers,
        body,
    }
}

/// The client's envelope for `f`, checked against the fixture's expectation.
#[track_caller]
fn check_envelope(f: &Fixture, answer: &Answer, stream: bool) {
    let name = format!("{} (stream: {stream})", f.name);
    let e = &f.expect;
    assert_eq!(
        u64::from(answer.status),
        e["status"],
        "{name}: {}",
        answer.body
    );
    assert_eq!(answer.content_type, "application/json", "{name}");
    let v = common::json::parse_strict(&answer.body)
        .unwrap_or_else(|err| panic!("{name}: not strict JSON ({err}): {}", answer.body));
    let error = &v["error"];
    for key in ERROR_KEYS {
        assert_eq!(error[key], e[key], "{name}: {key}: {v}");
    }
    assert_eq!(
        retry_headers(&answer.headers),
        expected_headers(f),
        "{name}: the headers kept: {:?}",
        answer.headers
    );
    // None of the upstream's other headers.
    for (header, _) in &f.headers {
        let kept = expected_headers(f).contains_key(header) || header == "content-type";
        assert!(
            kept || !answer.headers.contains_key(header),
            "{name}: {header} passed"
        );
    }
}

/// The client's stream for `f`: text, then `error` and `response.failed` with the code.
#[track_caller]
fn check_failed_stream(f: &Fixture, answer: &Answer) {
    let name = &f.name;
    assert_eq!(answer.status, 200, "{name}: {}", answer.body);
    assert_eq!(answer.content_type, "text/event-stream", "{name}");
    let events: Vec<Value> = parse_sse(&answer.body)
        .iter()
        .filter(|e| e.data != "[DONE]")
        .map(|e| serde_json::from_str(&e.data).expect("an event is JSON"))
        .collect();
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "response.output_text.delta"),
        "{name}: the text before the error reached the client: {}",
        answer.body
    );
    let error = events
        .iter()
        .find(|e| e["type"] == "error")
        .unwrap_or_else(|| panic!("{name}: no error event: {}", answer.body));
    assert_eq!(error["error"]["code"], f.expect["code"], "{name}");
    let last = events.last().expect("events");
    assert_eq!(last["type"], "response.failed", "{name}");
    assert_eq!(
        last["response"]["error"]["code"], f.expect["code"],
        "{name}"
    );
    assert_eq!(
        last["response"]["error"]["message"], f.expect["message"],
        "{name}"
    );
    assert!(answer.body.ends_with("data: [DONE]\n\n"), "{name}");
}

#[tokio::test]
async fn every_recorded_upstream_failure_reaches_the_client_in_openais_words() {
    let upstream = ScriptedUpstream::start();
    let stack = Stack::start(upstream.port(), &[]);
    let port = stack.envoy.port();
    let all = fixtures();
    let mut sent = 0;
    for f in &all {
        if f.is_stream() {
            upstream.push(f.reply());
            check_failed_stream(f, &post(port, true).await);
            sent += 1;
            continue;
        }
        for stream in [false, true] {
            upstream.push(f.reply());
            check_envelope(f, &post(port, stream).await, stream);
            sent += 1;
        }
    }
    // Each answer came from the upstream (none was made up before it was asked).
    let requests = upstream.wait_for_requests(sent, TIMEOUT).await;
    assert_eq!(requests.len(), sent);
    assert!(requests.iter().all(|r| r.path == "/v1/chat/completions"));
}

/// A stream that a JSON client asked for in one piece (folded) and that fails with a context
/// overflow inside it is the request's fault: 400 `context_length_exceeded`, as before a
/// stream.
#[tokio::test]
async fn a_folded_stream_that_overflows_is_a_400() {
    let f = fixtures()
        .into_iter()
        .find(|f| f.name == "llamacpp-mid-stream-context")
        .expect("the fixture");
    let upstream = ScriptedUpstream::with_replies([f.reply()]);
    let stack = Stack::start(upstream.port(), &[]);
    let answer = post(stack.envoy.port(), false).await;
    assert_eq!(answer.status, 400, "{}", answer.body);
    let v: Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
    assert_eq!(v["error"]["message"], f.expect["message"], "{v}");
}

/// The same failures on the WebSocket transport: one `error` event each with the envelope's
/// status, type, code, param, message and token counts, and the kept headers as fields
/// (`headers`, and `error.headers`); an error inside the Chat stream ends the response with
/// `error` and `response.failed` and its code.
#[tokio::test]
async fn every_recorded_upstream_failure_reaches_a_websocket_client() {
    let upstream = ScriptedUpstream::start();
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let (mut socket, _) = tokio_tungstenite::connect_async(stack.ws_url())
        .await
        .expect("the WebSocket upgrade");
    for f in fixtures() {
        let (name, e) = (&f.name, &f.expect);
        upstream.push(f.reply());
        let create = json!({"type": "response.create", "model": "m", "input": "hi"});
        socket
            .send(Message::text(create.to_string()))
            .await
            .expect("send");
        let event = loop {
            let event = recv(&mut socket).await;
            if event["type"] == "error" {
                break event;
            }
            assert!(f.is_stream(), "{name}: {event}");
        };
        if f.is_stream() {
            assert_eq!(event["error"]["code"], e["code"], "{name}: {event}");
            let last = recv(&mut socket).await;
            assert_eq!(last["type"], "response.failed", "{name}: {last}");
            assert_eq!(last["response"]["error"]["code"], e["code"], "{name}");
            continue;
        }
        assert_eq!(event["status"], e["status"], "{name}: {event}");
        for key in ERROR_KEYS {
            assert_eq!(event["error"][key], e[key], "{name}: {key}: {event}");
        }
        let headers = expected_headers(&f);
        let expected = if headers.is_empty() {
            Value::Null
        } else {
            json!(headers)
        };
        assert_eq!(event["headers"], expected, "{name}: {event}");
        assert_eq!(event["error"]["headers"], expected, "{name}: {event}");
    }
}

/// A real llama.cpp server with a 512-token context (`deploy/install-llama-server.sh` builds it
/// and fetches SmolLM2-135M; `RESPONSES_E2E_LLAMA_SERVER` and `RESPONSES_E2E_LLAMA_MODEL`
/// name others): a longer input is its `exceed_context_size_error`, and the client gets 400
/// `context_length_exceeded` with the server's message and token counts, for a JSON request,
/// a streamed one and on the WebSocket transport.
#[tokio::test]
async fn a_real_llama_server_overflow_is_context_length_exceeded() {
    let llama = common::llama::LlamaServer::start(512).await;
    let stack = Stack::with_websocket(llama.port(), &[]);
    let input = "word ".repeat(800);
    let check = |error: &Value, what: &str| {
        assert_eq!(error["type"], "invalid_request_error", "{what}: {error}");
        assert_eq!(error["code"], "context_length_exceeded", "{what}: {error}");
        assert_eq!(error["param"], "input", "{what}: {error}");
        assert_eq!(error["n_ctx"], 512, "{what}: {error}");
        let tokens = error["n_prompt_tokens"].as_u64().unwrap_or(0);
        assert!(tokens > 512, "{what}: {error}");
        let message = format!(
            "request ({tokens} tokens) exceeds the available context size (512 tokens), try increasing it"
        );
        assert_eq!(error["message"], message, "{what}: {error}");
    };
    for stream in [false, true] {
        let answer = common::client()
            .post(stack.envoy.url("/v1/responses"))
            .json(&json!({"model": "smollm2", "input": input, "stream": stream}))
            .timeout(TIMEOUT)
            .send()
            .await
            .expect("an answer");
        assert_eq!(answer.status(), 400, "stream: {stream}");
        let v: Value = answer.json().await.expect("an envelope");
        println!("llama-server's overflow, as the client gets it (stream: {stream}): {v}");
        check(&v["error"], &format!("stream: {stream}"));
    }
    let (mut socket, _) = tokio_tungstenite::connect_async(stack.ws_url())
        .await
        .expect("the WebSocket upgrade");
    let create = json!({"type": "response.create", "model": "smollm2", "input": input});
    socket
        .send(Message::text(create.to_string()))
        .await
        .expect("send");
    let event = recv(&mut socket).await;
    assert_eq!(
        (&event["type"], &event["status"]),
        (&json!("error"), &json!(400))
    );
    check(&event["error"], "websocket");
}
