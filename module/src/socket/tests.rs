//! The WebSocket transport against the fake Envoy: upgrade sessions replayed with plain bytes
//! (the client's frames in, the filter's frames out, callouts scripted), each rule of the
//! connection seen through the module's carrying of it. The same cases run against the core
//! (`core/src/connection/tests.rs`) and through the real Envoy in both modes
//! (`tests/e2e/websocket.rs`).

use std::time::Duration;

use responses_core::metrics::Metric;
use serde_json::{json, Value};

use crate::fake::{
    self, client_frame, client_text, server_frames, FakeEnvoy, FakeSpan, ServerFrame, SocketStep,
};
use crate::host::{CalloutRefused, CalloutReset, Host, Side};
use crate::status::BodyStatus;
use responses_core::connection::TRANSMIT_BYTES;

const SSE: &str = "text/event-stream";

fn envoy(json: &str) -> FakeEnvoy {
    FakeEnvoy::new(fake::config(json))
}

/// An accepted socket (default settings, and `json`'s).
fn socket(json: &str) -> FakeEnvoy {
    let mut e = envoy(json);
    e.upgrade(&[("authorization", "Bearer sk-1"), ("cookie", "secret")]);
    assert!(e.filter.is_socket());
    e
}

fn create(body: Value) -> Vec<u8> {
    let mut body = body;
    body["type"] = json!("response.create");
    client_text(&body.to_string())
}

/// A Chat stream that says `text` and stops.
fn chat_stream(text: &str) -> String {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    [
        chunk(json!({"role": "assistant", "content": text}), Value::Null),
        chunk(json!({}), json!("stop")),
        "data: [DONE]\n\n".to_owned(),
    ]
    .concat()
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The events the client got since `from`.
fn events_since(e: &FakeEnvoy, from: usize) -> Vec<Value> {
    e.events().split_off(from)
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|v| v["type"].as_str().unwrap()).collect()
}

/// Answers the last callout with a stream that says `text`, whole; returns the events it made.
fn answer(e: &mut FakeEnvoy, text: &str) -> Vec<Value> {
    let from = e.events().len();
    let (id, live) = e.last_callout().expect("a callout");
    assert!(live);
    e.callout_headers(id, 200, &[("content-type", SSE)], false);
    e.callout_data(id, chat_stream(text).as_bytes(), true);
    e.callout_complete(id);
    events_since(e, from)
}

fn counter(e: &FakeEnvoy, metric: Metric, labels: &[&str]) -> u64 {
    let labels: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
    e.host
        .counters
        .get(&(metric.index(), labels))
        .copied()
        .unwrap_or(0)
}

fn gauge(e: &FakeEnvoy, metric: Metric) -> i64 {
    e.host.gauges.get(&metric.index()).copied().unwrap_or(0)
}

#[test]
fn the_filter_answers_the_upgrade_and_each_create_is_a_callout_into_envoy() {
    let _alone = fake::sockets_alone();
    let mut e = socket("{}");
    let head = e.host.answer.headers.clone().expect("the filter's head");
    assert_eq!(header(&head, ":status"), Some("101"));
    assert_eq!(
        header(&head, "sec-websocket-accept"),
        Some("s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
    );
    assert!(e.upstream.headers.is_none(), "the router never sees it");
    assert!(e.host.drain_watched, "the socket hears Envoy's drain");
    assert_eq!(gauge(&e, Metric::WebsocketConnections), 1);

    e.client(&create(
        json!({"model": "m", "instructions": "Be brief.", "input": "I am Ada."}),
    ));
    let (id, _) = e.last_callout().expect("a callout");
    let c = e.host.callouts[&id].clone();
    assert_eq!(c.cluster, "responses_loopback");
    assert_eq!(
        c.timeout, None,
        "the route's timeouts apply where it loops back"
    );
    for (name, value) in [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        (":authority", "gateway.example"),
        ("content-type", "application/json"),
        ("accept", "text/event-stream"),
        ("x-responses-model", "m"),
        ("x-responses-upstream-model", "m"),
        ("authorization", "Bearer sk-1"),
        ("x-request-id", "ws-1"),
    ] {
        assert_eq!(header(&c.headers, name), Some(value), "{name}");
    }
    assert_eq!(
        header(&c.headers, "cookie"),
        None,
        "the handshake's cookies stay"
    );
    assert_eq!(
        header(&c.headers, "content-length"),
        Some(c.body.len().to_string().as_str())
    );
    let events = answer(&mut e, "Hello Ada.");
    assert_eq!(types(&events).first(), Some(&"response.created"));
    assert_eq!(types(&events).last(), Some(&"response.completed"));
    for (i, event) in events.iter().enumerate() {
        assert_eq!(event["sequence_number"], json!(i));
    }
    let first_id = events.last().unwrap()["response"]["id"].clone();

    // The continuation: the whole context goes upstream, the id is echoed.
    e.client(&create(
        json!({"model": "m", "previous_response_id": first_id,
        "input": [{"role": "user", "content": "My name?"}]}),
    ));
    let (second, _) = e.last_callout().unwrap();
    let chat: Value = serde_json::from_slice(&e.host.callouts[&second].body).unwrap();
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "user", "content": "I am Ada."},
            {"role": "assistant", "content": "Hello Ada."},
            {"role": "user", "content": "My name?"}
        ])
    );
    let events = answer(&mut e, "Ada.");
    assert_eq!(
        events.last().unwrap()["response"]["previous_response_id"],
        first_id
    );
    assert_eq!(
        counter(&e, Metric::Exchanges, &["create", "true", "translated", ""]),
        2
    );

    // The client closes: its close is echoed and the answer ends; Envoy is done.
    e.client(&client_frame(0x8, &1000u16.to_be_bytes()));
    assert_eq!(
        e.frames().last(),
        Some(&ServerFrame::Close(1000, String::new()))
    );
    assert!(e.host.answer.ended && e.completed);
    assert_eq!(gauge(&e, Metric::WebsocketConnections), 0);
    assert_eq!(counter(&e, Metric::WebsocketCloses, &["1000"]), 1);
    let logs = e.host.logs.borrow();
    assert!(
        logs.iter()
            .any(|(_, l)| l.contains("request_id=ws-1") && l.contains("translated request")),
        "{logs:?}"
    );
    assert!(
        !logs.iter().any(|(_, l)| l.contains("I am Ada")),
        "no prompt in the logs"
    );
}

#[test]
fn refused_upgrades_get_an_envelope_and_never_a_socket() {
    let _alone = fake::sockets_alone();
    let reply = |e: &FakeEnvoy| {
        assert!(!e.filter.is_socket());
        assert!(e.host.answer.headers.is_none(), "no 101");
        let r = e.client.reply.clone().expect("a local reply");
        let body: Value = serde_json::from_slice(&r.body).expect("an envelope");
        (
            r.status,
            body["error"]["code"].as_str().unwrap_or("").to_owned(),
            r.headers,
        )
    };
    // A version other than 13: 426 naming it.
    let mut head = fake::UPGRADE.to_vec();
    head.retain(|(k, _)| *k != "sec-websocket-version");
    head.push(("sec-websocket-version", "8"));
    let mut e = envoy("{}");
    e.request_headers(&head, false);
    let (status, code, headers) = reply(&e);
    assert_eq!((status, code.as_str()), (426, "invalid_value"));
    assert!(headers.contains(&("sec-websocket-version".into(), "13".into())));
    // No key on HTTP/1.1: 400; the same on HTTP/2 (Envoy's rewritten extended CONNECT): 101
    // without an accept.
    let mut head = fake::UPGRADE.to_vec();
    head.retain(|(k, _)| *k != "sec-websocket-key");
    let mut e = envoy("{}");
    e.request_headers(&head, false);
    assert_eq!(reply(&e).0, 400);
    let mut e = envoy("{}");
    e.host.protocol = Some("HTTP/2".into());
    e.request_headers(&head, false);
    assert!(e.filter.is_socket());
    let answer = e.host.answer.headers.clone().unwrap();
    assert_eq!(header(&answer, ":status"), Some("101"));
    assert_eq!(header(&answer, "sec-websocket-accept"), None);
    e.complete();
    // While Envoy drains: 503 server_shutting_down.
    let mut e = envoy("{}");
    e.host.draining = true;
    e.upgrade(&[]);
    assert_eq!(reply(&e).0, 503);
    assert_eq!(reply(&e).1, "server_shutting_down");
    // Beyond ws_max_connections, across every stream of the config: 503; the place comes
    // back when a socket ends.
    let config = fake::config(r#"{"ws_max_connections": 1}"#);
    let mut first = FakeEnvoy::new(config.clone());
    first.upgrade(&[]);
    assert!(first.filter.is_socket());
    let mut e = FakeEnvoy::new(config.clone());
    e.upgrade(&[]);
    assert_eq!(
        (reply(&e).0, reply(&e).1.as_str()),
        (503, "websocket_connections_exhausted")
    );
    first.complete();
    assert_eq!(config.socket.admission().open(), 0);
    let mut again = FakeEnvoy::new(config.clone());
    again.upgrade(&[]);
    assert!(again.filter.is_socket());
    // A filter Envoy destroys without the stream's end gives its place back too.
    drop(again);
    assert_eq!(config.socket.admission().open(), 0);
    // One address's quota (ws_max_connections_per_address, by the address Envoy gives,
    // whatever credentials it sends): 429; another address still gets in. An origin not
    // allowed: 403.
    let config = fake::config(
        r#"{"ws_max_connections_per_address": 1, "ws_allowed_origins": ["https://app.example"]}"#,
    );
    let from = |address: &str| {
        let mut e = FakeEnvoy::new(config.clone());
        e.host.address = Some(address.into());
        e
    };
    let mut alice = from("10.0.0.1:40000");
    alice.upgrade(&[("authorization", "Bearer alice")]);
    assert!(alice.filter.is_socket());
    let mut e = from("10.0.0.1:40001");
    e.upgrade(&[("authorization", "Bearer another")]);
    assert_eq!(
        (reply(&e).0, reply(&e).1.as_str()),
        (429, "websocket_connections_exhausted")
    );
    let mut bob = from("10.0.0.2:40000");
    bob.upgrade(&[("authorization", "Bearer alice")]);
    assert!(bob.filter.is_socket());
    let mut e = from("10.0.0.3:40000");
    e.upgrade(&[("origin", "https://evil.example")]);
    assert_eq!(
        (reply(&e).0, reply(&e).1.as_str()),
        (403, "origin_not_allowed")
    );
    alice.complete();
    bob.complete();
    // A key header the operator names (one Envoy sets after verifying the caller): a quota of
    // its own per value. With no origin listed, a browser's handshake is refused.
    let config = fake::config(r#"{"ws_max_connections_per_key": 1, "ws_key_header": "x-caller"}"#);
    let mut carol = FakeEnvoy::new(config.clone());
    carol.upgrade(&[("x-caller", "carol")]);
    assert!(carol.filter.is_socket());
    let mut e = FakeEnvoy::new(config.clone());
    e.upgrade(&[("x-caller", "carol")]);
    assert_eq!(
        (reply(&e).0, reply(&e).1.as_str()),
        (429, "websocket_connections_exhausted")
    );
    let mut e = FakeEnvoy::new(config.clone());
    e.upgrade(&[("x-caller", "dave"), ("origin", "https://app.example")]);
    assert_eq!(
        (reply(&e).0, reply(&e).1.as_str()),
        (403, "origin_not_allowed")
    );
    carol.complete();
    // A plain GET on the path is not the socket's: it passes to the route (its 405).
    let mut e = envoy("{}");
    e.request_headers(&[(":method", "GET"), (":path", "/v1/responses")], true);
    assert!(!e.filter.is_socket() && e.client.reply.is_none());
    assert!(e.upstream.headers.is_some());
}

#[test]
fn failed_calls_end_their_response_and_the_socket_goes_on() {
    let _alone = fake::sockets_alone();
    let mut e = socket("{}");
    // Envoy refuses the callout (no such cluster): an error event at once.
    e.host.refuse_callouts = Some(CalloutRefused::NoCluster);
    e.client(&create(json!({"model": "m", "input": "x"})));
    let events = e.events();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "error");
    assert!(events[0]["error"]["message"]
        .as_str()
        .unwrap()
        .contains("responses_loopback"));
    e.host.refuse_callouts = None;
    // The upstream goes mid-stream: error and response.failed.
    e.client(&create(json!({"model": "m", "input": "y"})));
    let (id, _) = e.last_callout().unwrap();
    e.callout_headers(id, 200, &[("content-type", SSE)], false);
    let half = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"half\"}}]}\n\n";
    e.callout_data(id, half.as_bytes(), false);
    let from = e.events().len();
    e.callout_reset(id, CalloutReset::ConnectionTermination);
    let events = events_since(&e, from);
    assert!(
        types(&events).ends_with(&["error", "response.failed"]),
        "{events:?}"
    );
    // An error answer: its envelope as the error event, retry headers kept.
    e.client(&create(json!({"model": "m", "input": "z"})));
    let (id, _) = e.last_callout().unwrap();
    let from = e.events().len();
    e.callout_headers(
        id,
        429,
        &[("content-type", "application/json"), ("retry-after", "7")],
        false,
    );
    e.callout_data(id, br#"{"error":{"message":"slow down"}}"#, true);
    e.callout_complete(id);
    let events = events_since(&e, from);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["status"], 429);
    assert_eq!(events[0]["headers"]["retry-after"], "7");
    // And the socket goes on.
    e.client(&create(json!({"model": "m", "input": "again"})));
    assert_eq!(
        types(&answer(&mut e, "fine")).last(),
        Some(&"response.completed")
    );
    e.complete();
    e.assert_socket_sound("/v1/chat/completions");
}

#[test]
fn a_client_gone_mid_response_resets_its_call() {
    let _alone = fake::sockets_alone();
    let mut e = socket("{}");
    e.client(&create(json!({"model": "m", "input": "x"})));
    let (id, _) = e.last_callout().unwrap();
    e.callout_headers(id, 200, &[("content-type", SSE)], false);
    // The client closes mid-response: the call is reset, its late news ignored.
    e.client(&client_frame(0x8, &4000u16.to_be_bytes()));
    assert!(e.host.callout_resets.contains(&id));
    assert!(e.completed);
    assert_eq!(
        counter(&e, Metric::Exchanges, &["create", "true", "cut", ""]),
        1
    );
    // Envoy ends the stream under a call (the client's connection went): reset too.
    let mut e = socket("{}");
    e.client(&create(json!({"model": "m", "input": "x"})));
    let (id, _) = e.last_callout().unwrap();
    e.complete();
    assert!(e.host.callout_resets.contains(&id));
    assert_eq!(counter(&e, Metric::WebsocketCloses, &["1006"]), 1);
    e.assert_socket_sound("/v1/chat/completions");
}

#[test]
fn the_connections_timers_run_on_the_modules_timer() {
    let _alone = fake::sockets_alone();
    // Idle: a close (1000), then the client's close frame is awaited a moment before the
    // stream ends.
    let mut e = socket(r#"{"ws_idle_timeout": 5}"#);
    let armed = e.host.timer.expect("the idle timer");
    e.wait(Duration::from_secs(4));
    assert_eq!(e.host.timer, Some(armed));
    assert!(e.fire_timer());
    assert_eq!(
        e.frames(),
        [ServerFrame::Close(1000, "idle timeout".into())]
    );
    assert!(!e.host.answer.ended, "the client's close is awaited");
    assert!(e.fire_timer(), "the linger timer");
    assert!(e.host.answer.ended && e.completed);
    // Maximum age: after the response in flight, an error event and 1000.
    let mut e = socket(r#"{"ws_max_age": 60}"#);
    e.client(&create(json!({"model": "m", "input": "x"})));
    e.wait(Duration::from_secs(61));
    assert!(e.fire_timer());
    let events = answer(&mut e, "done");
    assert_eq!(types(&events).last(), Some(&"error"));
    assert_eq!(
        events.last().unwrap()["error"]["code"],
        "websocket_connection_limit_reached"
    );
    assert_eq!(
        e.frames().last(),
        Some(&ServerFrame::Close(1000, "maximum connection age".into()))
    );
    e.complete();
}

#[test]
fn a_drain_lets_the_response_finish_then_closes_with_1001() {
    let _alone = fake::sockets_alone();
    let mut e = socket("{}");
    e.client(&create(json!({"model": "m", "input": "x"})));
    e.drain();
    assert!(!e
        .frames()
        .iter()
        .any(|f| matches!(f, ServerFrame::Close(..))));
    let events = answer(&mut e, "finished");
    assert_eq!(types(&events).last(), Some(&"response.completed"));
    assert_eq!(
        e.frames().last(),
        Some(&ServerFrame::Close(1001, "server shutting down".into()))
    );
    e.client(&client_frame(0x8, &1001u16.to_be_bytes()));
    assert!(e.host.answer.ended);
    // Past the drain time, the response in flight fails, then 1001.
    let mut e = socket("{}");
    e.client(&create(json!({"model": "m", "input": "x"})));
    let (id, _) = e.last_callout().unwrap();
    e.callout_headers(id, 200, &[("content-type", SSE)], false);
    e.drain();
    e.wait(crate::drain::drain_time());
    assert!(e.fire_timer());
    let events = e.events();
    assert_eq!(events.last().unwrap()["type"], "response.failed");
    assert_eq!(
        events.last().unwrap()["response"]["error"]["code"],
        "server_shutting_down"
    );
    assert!(e.host.callout_resets.contains(&id));
    assert_eq!(
        e.frames().last(),
        Some(&ServerFrame::Close(1001, "server shutting down".into()))
    );
    e.complete();
    e.assert_socket_sound("/v1/chat/completions");
}

#[test]
fn bytes_the_connection_does_not_want_yet_wait_in_envoys_buffer() {
    let _alone = fake::sockets_alone();
    let mut e = socket("{}");
    // Twenty creates in one piece while the first is in flight: the queue takes eight, the
    // rest stays in Envoy's buffer (whose watermark stops the reading of the client).
    let piece: Vec<u8> = (0..20)
        .flat_map(|i| create(json!({"model": "m", "input": format!("turn {i}")})))
        .collect();
    e.host.received[0] = piece.clone();
    e.host.in_body_hook[0] = true;
    let status = e.filter.request_body(&mut e.host, false);
    e.host.in_body_hook[0] = false;
    assert_eq!(status, BodyStatus::Keep);
    let kept = std::mem::take(&mut e.host.received[0]);
    assert!(!kept.is_empty() && piece.ends_with(&kept));
    e.host.buffered_request = kept;
    // Each response that ends makes room: all twenty are answered, in order.
    for i in 0..20 {
        let (id, _) = e.last_callout().expect("a call");
        let chat: Value = serde_json::from_slice(&e.host.callouts[&id].body).unwrap();
        assert_eq!(chat["messages"][0]["content"], format!("turn {i}"));
        answer(&mut e, "ok");
    }
    assert!(e.host.buffered_request.is_empty());
    assert_eq!(e.host.callouts.len(), 20);
    e.complete();
}

#[test]
fn a_client_that_does_not_read_is_closed_with_1008() {
    let _alone = fake::sockets_alone();
    let mut e = socket(r#"{"ws_max_unread_bytes": 2048}"#);
    e.client(&create(json!({"model": "m", "input": "x"})));
    let (id, _) = e.last_callout().unwrap();
    e.callout_headers(id, 200, &[("content-type", SSE)], false);
    e.watermark(true);
    let chunk = format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"content": "x".repeat(300)}}]})
    );
    for _ in 0..10 {
        e.callout_data(id, chunk.as_bytes(), false);
    }
    assert!(e.host.callout_resets.contains(&id), "the call is stopped");
    let frames = e.frames();
    assert_eq!(
        frames.last(),
        Some(&ServerFrame::Close(1008, "client too slow".into()))
    );
    assert!(e.host.answer.ended);
    assert_eq!(counter(&e, Metric::WebsocketCloses, &["1008"]), 1);
    // A reader that catches up is never cut.
    let mut e = socket(r#"{"ws_max_unread_bytes": 2048}"#);
    e.client(&create(json!({"model": "m", "input": "x"})));
    let (id, _) = e.last_callout().unwrap();
    e.callout_headers(id, 200, &[("content-type", SSE)], false);
    // (The response's opening events come with its first piece.)
    e.callout_data(id, chunk.as_bytes(), false);
    for _ in 0..10 {
        e.watermark(true);
        e.callout_data(id, chunk.as_bytes(), false);
        e.watermark(false);
    }
    assert!(!e.host.answer.ended, "{:?}", e.frames().last());
    e.complete();
}

/// Clients that do not read: Envoy's buffer toward each stops at its watermark (and one
/// piece), what comes after waits in the connection, and what Envoy holds counts in the
/// config's budget at its buffer limit from then on, so that such clients cannot take more
/// than it. A client that only pings piles up nothing: one pong for the pings of each piece.
#[test]
fn clients_that_do_not_read_are_charged_for_envoys_buffer() {
    let _alone = fake::sockets_alone();
    let limit = 1 << 20;
    let config = fake::config(r#"{"ws_max_total_bytes": 2500000}"#);
    let budget = config.socket.admission().budget();
    let client = |i: u32| {
        let mut e = FakeEnvoy::new(config.clone());
        e.host.address = Some(format!("10.0.0.{i}:40000"));
        e.host.block_past = Some(limit);
        e.upgrade(&[]);
        assert!(e.filter.is_socket());
        e
    };
    // 2 MiB of pings, in pieces of 100: a pong for the last of each piece.
    let mut pinger = client(9);
    let pings: Vec<u8> = (0..100)
        .flat_map(|_| client_frame(0x9, &[b'p'; 125]))
        .collect();
    for _ in 0..160 {
        pinger.client(&pings);
    }
    assert!(!pinger.host.write_blocked);
    assert_eq!(pinger.frames().len(), 160, "one pong a piece");
    assert!(budget.used() < 1000, "{} counted", budget.used());
    // Creates answered at once (generate: false), until Envoy's buffer is full.
    let creates: Vec<u8> = (0..10)
        .flat_map(|i| {
            create(json!({"model": "m", "input": format!("turn {i}"), "generate": false}))
        })
        .collect();
    let flood = |e: &mut FakeEnvoy| {
        for _ in 0..1000 {
            if e.host.answer.ended || e.host.write_blocked {
                break;
            }
            e.client(&creates);
        }
    };
    let mut a = client(1);
    flood(&mut a);
    assert!(a.host.write_blocked);
    let held = a.host.answer.body.len();
    assert!(
        held > limit && held <= limit + TRANSMIT_BYTES,
        "Envoy holds {held} bytes"
    );
    assert!(!a.host.answer.ended);
    assert!(budget.used() > limit, "{} counted", budget.used());
    let mut b = client(2);
    flood(&mut b);
    assert!(
        !b.host.answer.ended,
        "just under the budget: {}",
        budget.used()
    );
    // A third takes the total past the budget: it closes (1013), the others go on.
    let mut c = client(3);
    flood(&mut c);
    assert_eq!(
        c.frames().last(),
        Some(&ServerFrame::Close(1013, "server memory limit".into()))
    );
    assert!(c.host.answer.ended && !a.host.answer.ended && !b.host.answer.ended);
    drop(c);
    // The first client reads: Envoy's buffer drains, what waited follows, and it goes on.
    let read = a.host.answer.body.len();
    a.host.block_past = None;
    a.watermark(false);
    assert!(budget.used() < 2 * limit, "{} counted", budget.used());
    a.client(&create(
        json!({"model": "m", "input": "awake", "generate": false}),
    ));
    let after = server_frames(&a.host.answer.body[read..]);
    assert!(
        matches!(after.last(), Some(ServerFrame::Text(v)) if v["type"] == "response.completed"),
        "{after:?}"
    );
    a.complete();
}

#[test]
fn a_panic_fails_that_connection_only_with_1011() {
    let _alone = fake::sockets_alone();
    let mut e = socket("{}");
    e.client(&create(json!({"model": "m", "input": "x"})));
    let (id, _) = e.last_callout().unwrap();
    e.callout_headers(id, 200, &[("content-type", SSE)], false);
    e.panic();
    assert_eq!(
        e.frames().last(),
        Some(&ServerFrame::Close(1011, "internal error".into()))
    );
    assert!(e.host.answer.ended && e.completed);
    assert!(e.host.callout_resets.contains(&id));
    assert_eq!(counter(&e, Metric::WebsocketCloses, &["1011"]), 1);
    assert_eq!(gauge(&e, Metric::WebsocketConnections), 0);
    assert_eq!(gauge(&e, Metric::StreamsInFlight), 0);
    // Nothing reaches the poisoned connection afterwards.
    e.callout_data(id, b"data: late\n\n", false);
    e.client(&create(json!({"model": "m", "input": "y"})));
    assert_eq!(e.host.callouts.len(), 1);
    // Another socket is untouched.
    let mut other = socket("{}");
    other.client(&create(json!({"model": "m", "input": "x"})));
    assert_eq!(
        types(&answer(&mut other, "fine")).last(),
        Some(&"response.completed")
    );
    other.complete();
}

#[test]
fn each_response_is_a_child_of_envoys_span_and_its_call_continues_it() {
    let _alone = fake::sockets_alone();
    let mut e = envoy("{}");
    e.host.span = Some(FakeSpan::default());
    e.upgrade(&[(
        "traceparent",
        "00-11111111111111111111111111111111-2222222222222222-01",
    )]);
    e.client(&create(
        json!({"model": "m", "input": "x", "temperature": 0.5}),
    ));
    let (id, _) = e.last_callout().unwrap();
    assert_eq!(
        header(&e.host.callouts[&id].headers, "traceparent"),
        Some("00-0af7651916cd43dd8448eb211c80319c-0000000000000001-01"),
        "the call continues the response's span"
    );
    let events = answer(&mut e, "hi");
    e.client(&create(
        json!({"model": "m", "input": [{"type": "nonsense"}]}),
    ));
    e.complete();
    let children = &e.host.children;
    assert_eq!(children.len(), 2, "{children:?}");
    let response = &children[0];
    assert!(response.finished);
    assert_eq!(response.name.as_deref(), Some("chat m"));
    assert_eq!(response.tags["responses_extproc.transport"], "websocket");
    assert_eq!(
        response.tags["gen_ai.response.id"],
        events.last().unwrap()["response"]["id"].as_str().unwrap()
    );
    assert_eq!(response.tags["gen_ai.request.temperature"], "0.5");
    assert_eq!(response.events, ["first_token"]);
    let refused = &children[1];
    assert!(refused.finished);
    assert_eq!(refused.tags["http.response.status_code"], "400");
    assert_eq!(refused.tags["responses_extproc.outcome"], "failed");
    let stream = e.host.span.as_ref().unwrap();
    assert_eq!(
        stream.tag_calls, 0,
        "Envoy's span for the upgrade is left as Envoy made it"
    );
}

#[test]
fn scripted_sessions_stay_sound() {
    // A few hand-written sessions through the fuzz target's script runner, and its decoding.
    let messages = fake::socket_messages();
    let answered = vec![
        SocketStep::Client(messages[0].clone()),
        SocketStep::Head {
            status: 200,
            content_type: SSE,
            end: false,
        },
        SocketStep::Data {
            bytes: chat_stream("x").into_bytes(),
            end: true,
        },
        SocketStep::CalloutComplete,
        SocketStep::Client(messages[7].clone()),
    ];
    let e = fake::run_socket_script(&answered);
    assert_eq!(
        e.frames().last(),
        Some(&ServerFrame::Close(1000, String::new()))
    );
    for steps in [
        vec![SocketStep::Panic],
        vec![
            SocketStep::Client(messages[0].clone()),
            SocketStep::Drain,
            SocketStep::Timer,
        ],
        vec![
            SocketStep::Client(messages[0].clone()),
            SocketStep::CalloutReset,
        ],
        vec![
            SocketStep::Client(b"\x81\xff".to_vec()),
            SocketStep::ClientEnd,
        ],
        vec![
            SocketStep::Client(messages[0].clone()),
            SocketStep::Watermark(true),
            SocketStep::Head {
                status: 500,
                content_type: "application/json",
                end: true,
            },
        ],
    ] {
        fake::run_socket_script(&steps);
    }
    for data in [
        &b""[..],
        b"\x00\x00\x04\x01\x05\x02\x06\xc1",
        b"\x00\x87\x05\x0a\x00",
    ] {
        fake::run_socket_script(&fake::socket_script(data));
    }
}

#[test]
fn a_request_piece_the_filter_keeps_is_read_before_the_next() {
    // What Envoy kept comes first in the next hook's body, and both are drained once read.
    let _alone = fake::sockets_alone();
    let mut e = socket("{}");
    let whole = create(json!({"model": "m", "input": "x"}));
    e.host.buffered_request = whole[..10].to_vec();
    e.client(&whole[10..]);
    assert!(e.last_callout().is_some(), "one message, read across both");
    assert!(e.host.buffered_request.is_empty() && e.host.received[0].is_empty());
    assert_eq!(e.host.body(Side::Request).len(), 0);
    e.complete();
}

#[test]
fn each_ended_turn_is_recorded_through_the_internal_listener_before_the_stream_ends() {
    use responses_core::metadata::MetadataValue::{Num, Str};
    let _alone = fake::sockets_alone();
    let mut e = envoy("{}");
    e.upgrade(&[("authorization", "Bearer sk-1"), ("x-client-id", "alice")]);
    e.client(&create(json!({"model": "m", "input": "x"})));
    assert!(e.host.records.is_empty(), "none while the turn runs");
    let (id, _) = e.last_callout().unwrap();
    e.callout_headers(id, 200, &[("content-type", SSE)], false);
    let usage = json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
        "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18}});
    let stream =
        chat_stream("hi").replace("data: [DONE]", &format!("data: {usage}\n\ndata: [DONE]"));
    e.callout_data(id, stream.as_bytes(), true);
    e.callout_complete(id);
    let response_id = e.events().last().unwrap()["response"]["id"].clone();
    assert_eq!(e.host.records.len(), 1);
    let record = e.host.records[0].clone();
    let path = header(&record.headers, ":path").unwrap();
    assert!(path.starts_with("/v1/responses/turns/"), "{path}");
    for (name, value) in [
        (":method", "POST"),
        (":authority", "gateway.example"),
        ("content-length", "0"),
        ("x-responses-model", "m"),
        ("authorization", "Bearer sk-1"),
        ("x-client-id", "alice"),
    ] {
        assert_eq!(header(&record.headers, name), Some(value), "{name}");
    }
    // The filter on the records' route took the turn's summary, with the socket's id.
    let fields = record.fields.expect("filed, and taken");
    let field = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(field("total_tokens"), Some(Num(18.0)));
    assert_eq!(
        field("response_id"),
        response_id.as_str().map(|id| Str(id.into()))
    );
    assert_eq!(field("socket_id"), Some(Str("ws-1".into())));
    assert!(crate::record::RECORDS.take(0).is_none());

    // A refused turn (the Chat route's rate limit): recorded as failed, the socket goes on.
    e.client(&create(json!({"model": "m", "input": "y"})));
    let (id, _) = e.last_callout().unwrap();
    e.callout_headers(id, 429, &[("x-envoy-ratelimited", "true")], true);
    let event = e.events().last().unwrap().clone();
    assert_eq!(event["error"]["code"], "rate_limit_exceeded", "{event}");
    let fields = e.host.records[1].fields.clone().expect("taken");
    let field = |key: &str| {
        fields
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(field("error_code"), Some(Str("rate_limit_exceeded".into())));
    assert_eq!(field("total_tokens"), None);
    e.client(&create(json!({"model": "m", "input": "z"})));
    // The client closes after its last turn: the stream ends once that turn's record is
    // sent (Envoy resets a filter's callouts with its stream).
    e.host.hold_records = true;
    assert_eq!(
        types(&answer(&mut e, "ok")).last(),
        Some(&"response.completed")
    );
    assert_eq!(e.host.records.len(), 3);
    e.client(&client_frame(0x8, &1000u16.to_be_bytes()));
    assert!(matches!(
        e.frames().last(),
        Some(ServerFrame::Close(1000, _))
    ));
    assert!(!e.host.answer.ended, "the stream waits for the record");
    e.release_records();
    assert!(e.host.answer.ended);
    assert!(e.host.records[2].fields.is_some());
    e.complete();
    e.assert_socket_sound("/v1/chat/completions");
}

#[test]
fn a_record_envoy_does_not_take_is_a_warning() {
    use crate::host::Level;
    let _alone = fake::sockets_alone();
    let mut e = socket("{}");
    e.host.hold_records = true;
    e.client(&create(json!({"model": "m", "input": "x"})));
    answer(&mut e, "hi");
    // No filter on its route took it (another config): Envoy's route answers 404.
    e.host.records[0].fields = None;
    e.release_records();
    let warned = e.host.logs.borrow().iter().any(|(level, line)| {
        *level == Level::Warn && line.contains("record was not taken") && line.contains("404")
    });
    assert!(warned, "{:?}", e.host.logs.borrow());
    e.complete();
    e.assert_socket_sound("/v1/chat/completions");
}
