//! Automatic compaction (`context_management`) through the real Envoy, in both modes: the
//! translator's own summarising call back through Envoy (the processor's, through Envoy's
//! listener (`--ws-upstream`) under `override_message_timeout`; the module's, a callout to its
//! internal listener), with the client's credentials, then the turn on the compacted window,
//! the `compaction` item leading the output (JSON and SSE); a side call that fails, hangs or
//! answers garbage ends the exchange with its envelope; bad entries are 400s naming the
//! param.

use std::time::{Duration, Instant};

use crate::common::sse::parse_sse_json;
use crate::common::{client, mode, Gate, Mode, Reply, ScriptedUpstream, Stack};
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(60);
/// The summarising request's system prompt starts so (`translate::compact::PROMPT`).
const PROMPT_START: &str = "You compress conversations.";
const CONTEXT_PREFIX: &str = "Summary of the earlier part of this conversation";

/// A history of three user turns, over a threshold of 50 estimated tokens.
fn long(stream: bool, threshold: u64) -> Value {
    json!({
        "model": "m",
        "stream": stream,
        "store": false,
        "context_management": [{"type": "compaction", "compact_threshold": threshold}],
        "input": [
            {"role": "user", "content": "Tell me about cats, at length, with every detail you know."},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Cats are small carnivorous mammals.", "annotations": []}]},
            {"role": "user", "content": "And their whiskers?"},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Whiskers sense the air around them.", "annotations": []}]},
            {"role": "user", "content": "Now dogs."}
        ]
    })
}

fn summary_body() -> String {
    json!({"id": "s", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "The user asked about cats and whiskers."}}],
        "usage": {"prompt_tokens": 90, "completion_tokens": 9, "total_tokens": 99}})
    .to_string()
}

fn summary() -> Reply {
    Reply::raw(200, "application/json", summary_body())
}

fn answer() -> Reply {
    Reply::json(
        200,
        &json!({"id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Dogs are loyal."}}],
            "usage": {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34}}),
    )
}

fn streamed_answer() -> Reply {
    Reply::sse([
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Dogs are loyal.\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":4,\"total_tokens\":34}}\n\n",
        "data: [DONE]\n\n",
    ])
}

async fn post(stack: &Stack, body: &Value) -> (u16, String, String) {
    let response = client()
        .post(stack.envoy.url("/v1/responses"))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-client")
        .header("cookie", "session=secret")
        .body(body.to_string())
        .timeout(TIMEOUT)
        .send()
        .await
        .expect("request");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let text = response.text().await.expect("body");
    (status, content_type, text)
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The Chat messages' texts of a request the upstream got.
fn texts(chat: &Value) -> String {
    chat["messages"].to_string()
}

#[tokio::test]
async fn over_the_threshold_json_and_sse_start_with_the_compaction_item() {
    let upstream =
        ScriptedUpstream::with_replies([summary(), answer(), summary(), streamed_answer()]);
    let metrics = format!("127.0.0.1:{}", crate::common::free_port());
    let stack = match mode() {
        Mode::ExtProc => Stack::with_websocket(upstream.port(), &["--metrics-listen", &metrics]),
        Mode::Module => Stack::with_websocket(upstream.port(), &[]),
    };

    // JSON.
    let (status, content_type, text) = post(&stack, &long(false, 50)).await;
    assert_eq!(
        (status, content_type.as_str()),
        (200, "application/json"),
        "{text}"
    );
    let v = json_of(&text);
    let output = v["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{v}");
    assert_eq!(output[0]["type"], "compaction");
    assert!(output[0]["encrypted_content"].as_str().unwrap().len() > 20);
    assert_eq!(output[1]["content"][0]["text"], "Dogs are loyal.");
    // Both calls were spent.
    assert_eq!(v["usage"]["input_tokens"], 120, "{v}");
    assert_eq!(v["usage"]["output_tokens"], 13, "{v}");

    let got = upstream.requests();
    assert_eq!(got.len(), 2);
    // The summarising call: through Envoy, with the client's credentials (not its cookie),
    // the whole window, not streamed.
    let side = &got[0];
    assert_eq!(side.path, "/v1/chat/completions");
    assert_eq!(side.header("authorization"), Some("Bearer sk-client"));
    assert_eq!(side.header("cookie"), None);
    let chat = side.json();
    assert_eq!(chat["stream"], false);
    assert!(chat["messages"][0]["content"]
        .as_str()
        .unwrap()
        .starts_with(PROMPT_START));
    assert!(texts(&chat).contains("whiskers"));
    // The turn: the summary, the latest user message; the earlier turns are not sent.
    let turn = &got[1];
    assert_eq!(turn.header("authorization"), Some("Bearer sk-client"));
    let chat = turn.json();
    let sent = texts(&chat);
    assert!(
        sent.contains(CONTEXT_PREFIX) && sent.contains("cats and whiskers"),
        "{sent}"
    );
    assert!(
        sent.contains("Now dogs.") && !sent.contains("whiskers?"),
        "{sent}"
    );

    // SSE: the compaction item's events lead the stream.
    let (status, content_type, text) = post(&stack, &long(true, 50)).await;
    assert_eq!(
        (status, content_type.as_str()),
        (200, "text/event-stream"),
        "{text}"
    );
    let events = parse_sse_json(&text);
    let order: Vec<String> = events
        .iter()
        .map(|(name, e)| match e.get("item") {
            Some(item) => format!("{name} {}", item["type"].as_str().unwrap_or_default()),
            None => name.clone(),
        })
        .collect();
    assert_eq!(
        &order[..6],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added compaction",
            "response.compaction.compacting",
            "response.output_item.done compaction",
            "response.output_item.added message",
        ],
        "{order:?}"
    );
    assert_eq!(order.last().unwrap(), "response.completed");
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["output"][0]["type"], "compaction");
    assert_eq!(completed["usage"]["input_tokens"], 120, "{completed}");
    let got = upstream.requests();
    assert_eq!(got.len(), 4);
    assert_eq!(got[2].json()["stream"], false);
    assert_eq!(got[3].json()["stream"], true);
    // Counted by outcome, once each exchange ended: the processor's export, or Envoy's stats
    // (its `envoy_` prefix, then the module's metrics namespace).
    let (url, series) = match mode() {
        Mode::ExtProc => (
            format!("http://{metrics}/metrics"),
            "responses_extproc_compactions_total{outcome=\"compacted\"} 2",
        ),
        Mode::Module => (
            stack.envoy.admin_url("/stats/prometheus"),
            "envoy_responses_module_compactions_total{outcome=\"compacted\"} 2",
        ),
    };
    let exported = client()
        .get(url)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    assert!(exported.lines().any(|l| l == series), "{exported}");

    // The client carries the item on: its history with the output appended, under a
    // threshold it no longer crosses, reaches the upstream as the compacted window.
    upstream.push(answer());
    let mut next = long(false, 100_000);
    let items = next["input"].as_array_mut().unwrap();
    items.extend(output.iter().cloned());
    items.push(json!({"role": "user", "content": "And birds?"}));
    let (status, _, text) = post(&stack, &next).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(json_of(&text)["output"][0]["type"], "message");
    let got = upstream.requests();
    assert_eq!(got.len(), 5, "no compaction below the threshold");
    let sent = texts(&got[4].json());
    assert!(
        sent.contains("cats and whiskers") && sent.contains("And birds?"),
        "{sent}"
    );
    assert!(
        !sent.contains("whiskers?"),
        "what the compaction stands for stays behind: {sent}"
    );
}

#[tokio::test]
async fn below_the_threshold_or_without_the_field_nothing_changes() {
    let upstream = ScriptedUpstream::with_replies([answer(), answer()]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut without = long(false, 50);
    without
        .as_object_mut()
        .unwrap()
        .remove("context_management");
    for body in [long(false, 100_000), without] {
        let (status, _, text) = post(&stack, &body).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(json_of(&text)["output"][0]["type"], "message");
    }
    let got = upstream.requests();
    assert_eq!(got.len(), 2);
    for r in &got {
        assert!(texts(&r.json()).contains("whiskers?"));
    }
    assert_eq!(
        got[0].body, got[1].body,
        "the field changes nothing below its threshold"
    );
}

/// The side call fails closed: the exchange ends with the envelope of what went wrong,
/// naming the compaction step, and the turn is never sent.
#[tokio::test]
async fn a_failing_hanging_or_garbage_side_call_ends_with_its_envelope() {
    let gate = Gate::new();
    let too_long = json!({"error": {"message": "the request exceeds the available context size (512 tokens)",
        "type": "exceed_context_size_error", "code": 400}});
    let reply = |what: &str| match what {
        "500" => Reply::json(500, &json!({"error": {"message": "boom"}})),
        "garbage" => Reply::raw(200, "application/json", "{not json"),
        "not json" => Reply::raw(200, "text/plain", "hello"),
        "context too long" => Reply::json(400, &too_long),
        "reset" => Reply::close_mid_body(200, "application/json", "{\"choices\":"),
        // The head, then nothing until after the test.
        _ => Reply::sse(["{"])
            .pause_after(0, &gate)
            .header("content-type", "application/json"),
    };
    let cases = [
        ("500", 500, "server_error"),
        ("garbage", 502, "upstream_invalid_response"),
        ("not json", 502, "upstream_invalid_response"),
        ("context too long", 400, "context_length_exceeded"),
        ("reset", 503, "upstream_unavailable"),
        ("hang", 504, "upstream_timeout"),
    ];
    for stream in [false, true] {
        for (what, status, code) in cases {
            let upstream = ScriptedUpstream::with_replies([reply(what)]);
            upstream.set_default(answer);
            // Over Envoy's delayed_close_timeout (1 s), after which a reset reaches us.
            let stack = Stack::with_websocket(upstream.port(), &["--compaction-timeout", "3"]);
            let started = Instant::now();
            let (got_status, content_type, text) = post(&stack, &long(stream, 50)).await;
            let took = started.elapsed();
            assert_eq!(
                (got_status, content_type.as_str()),
                (status, "application/json"),
                "{what} stream={stream}: {text}"
            );
            let v = json_of(&text);
            assert_eq!(v["error"]["code"], code, "{what}: {v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("context_management"),
                "{what}: {v}"
            );
            assert!(took < Duration::from_secs(10), "{what}: {took:?}");
            assert_eq!(upstream.requests().len(), 1, "{what}: the turn is not sent");
        }
    }
    gate.release();
}

#[tokio::test]
async fn bad_entries_are_refused_naming_the_param() {
    let upstream = ScriptedUpstream::start();
    let stack = Stack::start(upstream.port(), &[]);
    for (entries, param) in [
        (json!([{"type": "auto"}]), "context_management[0].type"),
        (
            json!([{"type": "compaction", "compact_threshold": 0}]),
            "context_management[0].compact_threshold",
        ),
        (
            json!([{"type": "compaction", "compact_threshold": "9"}]),
            "context_management[0].compact_threshold",
        ),
        (json!({"type": "compaction"}), "context_management"),
    ] {
        let mut body = long(false, 50);
        body["context_management"] = entries.clone();
        let (status, _, text) = post(&stack, &body).await;
        assert_eq!(status, 400, "{entries}: {text}");
        assert_eq!(json_of(&text)["error"]["param"], param, "{entries}: {text}");
    }
    assert!(upstream.requests().is_empty());
}

/// The WebSocket transport (the processor's, or the module's own): the same compaction before the response's own
/// call, the item leading its events; the next response continues with
/// `previous_response_id` on the compacted context.
#[tokio::test]
async fn on_the_websocket_the_compaction_leads_the_response() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;
    let upstream =
        ScriptedUpstream::with_replies([summary(), streamed_answer(), streamed_answer()]);
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let mut request = stack.ws_url().into_client_request().expect("request");
    request
        .headers_mut()
        .insert("authorization", "Bearer sk-ws".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request)
        .await
        .expect("upgrade");
    let mut ask = long(false, 50);
    ask["type"] = json!("response.create");
    ask.as_object_mut().unwrap().remove("stream");
    ask.as_object_mut().unwrap().remove("store");
    ws.send(Message::text(ask.to_string())).await.expect("send");
    let mut events = Vec::new();
    loop {
        let event = crate::common::websocket::recv(&mut ws).await;
        let kind = event["type"].as_str().unwrap_or_default().to_owned();
        events.push(event);
        if kind == "response.completed" || kind == "response.failed" || kind == "error" {
            break;
        }
    }
    let order: Vec<String> = events
        .iter()
        .map(|e| {
            let item = e["item"]["type"].as_str().unwrap_or_default();
            format!("{} {item}", e["type"].as_str().unwrap())
        })
        .collect();
    assert_eq!(
        order[..5],
        [
            "response.created ",
            "response.in_progress ",
            "response.output_item.added compaction",
            "response.compaction.compacting ",
            "response.output_item.done compaction",
        ],
        "{order:?}"
    );
    assert_eq!(order.last().unwrap(), "response.completed ");
    let id = events.last().unwrap()["response"]["id"].clone();
    let got = upstream.requests();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].header("authorization"), Some("Bearer sk-ws"));
    assert_eq!(got[0].json()["stream"], false);
    // The next response continues the compacted context.
    let next = json!({"type": "response.create", "model": "m", "previous_response_id": id,
        "input": [{"role": "user", "content": "And birds?"}]});
    ws.send(Message::text(next.to_string()))
        .await
        .expect("send");
    loop {
        let event = crate::common::websocket::recv(&mut ws).await;
        if event["type"] == "response.completed" {
            break;
        }
        assert_ne!(event["type"], "error", "{event}");
    }
    let got = upstream.requests();
    assert_eq!(got.len(), 3);
    let sent = texts(&got[2].json());
    assert!(
        sent.contains("cats and whiskers") && sent.contains("And birds?"),
        "{sent}"
    );
    assert!(!sent.contains("whiskers?"), "{sent}");
}

/// docs/compaction.md: the summarising call carries `x-responses-model`, "so Envoy's routes
/// ... apply to it as to the turn". A turn routed by model to a second upstream gets its
/// summary from that upstream too (ext_proc: the processor's call enters through the loopback
/// listener `responses_calls`, which keeps the model headers; the module's through its
/// internal listener), and the catch-all upstream gets nothing.
#[tokio::test]
async fn the_summarising_call_takes_the_turns_route_by_model() {
    let small = ScriptedUpstream::start();
    let big = ScriptedUpstream::with_replies([summary(), answer()]);
    let big_port = big.port();
    let stack = Stack::with_websocket_edited(small.port(), &[], move |c| {
        crate::common::envoy::with_model_route(c, big_port)
    });
    let mut body = long(false, 50);
    body["model"] = json!("big-model");
    let (status, _, text) = post(&stack, &body).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(json_of(&text)["output"][0]["type"], "compaction", "{text}");
    assert!(small.requests().is_empty(), "{:?}", small.requests());
    let got = big.requests();
    assert_eq!(got.len(), 2, "the summarising call and the turn");
    for r in &got {
        assert_eq!(r.header("x-responses-model"), Some("big-model"));
    }
    assert!(texts(&got[0].json()).contains(PROMPT_START));
}

/// The processor asks Envoy for `--compaction-timeout` + 2 s on the request body
/// (`override_message_timeout`) and Envoy grants it up to `max_message_timeout`: a summary
/// slower than the shipped `message_timeout` still compacts (without the grant, Envoy's 504
/// `processor_timeout`). The module has no message clock: the same summary compacts there.
#[tokio::test]
async fn a_summary_slower_than_the_message_timeout_still_compacts() {
    let config = std::fs::read_to_string(crate::common::repo_root().join("envoy/envoy.yaml"))
        .expect("envoy/envoy.yaml");
    let message_timeout: u64 = config
        .lines()
        .find_map(|l| l.trim().strip_prefix("message_timeout: "))
        .and_then(|v| v.strip_suffix('s')?.parse().ok())
        .expect("envoy/envoy.yaml's message_timeout in seconds");
    let (head, tail) = {
        let whole = summary_body();
        let (a, b) = whole.split_at(whole.len() / 2);
        (a.to_owned(), b.to_owned())
    };
    let slow = Reply::sse([head, tail])
        .with_delay(Duration::from_secs(message_timeout + 1))
        .header("content-type", "application/json");
    let upstream = ScriptedUpstream::with_replies([slow, answer()]);
    let stack = Stack::with_websocket(upstream.port(), &["--compaction-timeout", "10"]);
    let started = Instant::now();
    let (status, _, text) = post(&stack, &long(false, 50)).await;
    let took = started.elapsed();
    assert_eq!(status, 200, "{text}");
    assert!(
        took > Duration::from_secs(message_timeout),
        "the summary outlasted message_timeout: {took:?}"
    );
    let v = json_of(&text);
    assert_eq!(v["output"][0]["type"], "compaction", "{v}");
    assert_eq!(v["output"][1]["content"][0]["text"], "Dogs are loyal.");
    assert_eq!(upstream.requests().len(), 2);
}

/// docs/deploying.md, keeping the client's credentials from the processor: with the four
/// credential lines deleted from `forward_rules`, the processor never gets them, the turn
/// still reaches the upstream with the client's `authorization` (Envoy's header map) and the
/// summarising call carries none.
#[tokio::test]
async fn without_the_credentials_forwarded_the_summarising_call_carries_none() {
    if !crate::common::only_ext_proc("forward_rules: what Envoy sends the processor") {
        return;
    }
    let upstream = ScriptedUpstream::with_replies([summary(), answer()]);
    let stack = Stack::with_websocket_edited(upstream.port(), &[], |config| {
        let mut config = config;
        for header in [
            "authorization",
            "x-api-key",
            "openai-organization",
            "openai-project",
        ] {
            let line = format!("                  - exact: \"{header}\"\n");
            assert_eq!(config.matches(&line).count(), 1, "{line}");
            config = config.replace(&line, "");
        }
        config
    });
    let (status, _, text) = post(&stack, &long(false, 50)).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(json_of(&text)["output"][0]["type"], "compaction", "{text}");
    let got = upstream.requests();
    assert_eq!(got.len(), 2);
    assert!(texts(&got[0].json()).contains(PROMPT_START));
    assert_eq!(got[0].header("authorization"), None, "the summarising call");
    assert_eq!(got[1].header("authorization"), Some("Bearer sk-client"));
}
