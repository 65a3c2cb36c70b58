//! The processor's drain on SIGTERM (ext_proc mode; the module drains with Envoy,
//! `websocket.rs`), through the real Envoy: an HTTP exchange in flight finishes, a new one is
//! refused with the `processor_unavailable` envelope and never reaches the upstream; the health
//! service reports NOT_SERVING for the overall status (`""`, what the manifests' probes ask) as
//! for the ext_proc service; a WebSocket upgrade gets the `server_shutting_down` envelope
//! (docs/configuration.md `--drain-seconds`, docs/operations.md health, docs/websocket.md drain).

use super::websocket::chat_sse;
use std::time::{Duration, Instant};

use crate::common::sse::parse_sse_json;
use crate::common::{client, only_ext_proc, Gate, ScriptedUpstream, Stack};
use serde_json::{json, Value};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

const TIMEOUT: Duration = Duration::from_secs(30);
const EXT_PROC: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

fn sigterm(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

async fn post(stack: &Stack, body: &Value) -> reqwest::Response {
    client()
        .post(stack.envoy.url("/v1/responses"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(TIMEOUT)
        .send()
        .await
        .expect("request")
}

#[tokio::test]
async fn sigterm_lets_an_exchange_in_flight_finish_and_refuses_new_ones() {
    if !only_ext_proc("the processor's own drain") {
        return;
    }
    let gate = Gate::new();
    let upstream = ScriptedUpstream::with_replies([chat_sse("drained").pause_after(1, &gate)]);
    let mut stack = Stack::start(upstream.port(), &["--drain-seconds", "20"]);
    let in_flight = post(&stack, &json!({"model": "m", "input": "x", "stream": true})).await;
    assert_eq!(in_flight.status(), 200);
    gate.wait_reached(TIMEOUT).await;
    let processor = stack.processor.as_mut().expect("a processor");
    sigterm(processor.pid());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(processor.is_running(), "the drain holds the process");

    // A new exchange is not taken: Envoy's answer is the processor_unavailable envelope, and
    // the upstream never sees it.
    let refused = post(&stack, &json!({"model": "m", "input": "new"})).await;
    let status = refused.status().as_u16();
    let body: Value = refused.json().await.expect("an envelope");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (500, Some("processor_unavailable")),
        "{body}"
    );
    assert_eq!(upstream.requests().len(), 1);

    // The exchange in flight finishes, then the process exits, long before the drain time.
    gate.release();
    let text = in_flight.text().await.expect("the rest of the stream");
    let events = parse_sse_json(&text);
    let (last, response) = events.last().expect("events");
    assert_eq!(last, "response.completed", "{text}");
    assert_eq!(response["response"]["status"], "completed");
    let started = Instant::now();
    let processor = stack.processor.as_mut().expect("a processor");
    while processor.is_running() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the processor did not exit once drained"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The health service's overall status (`""`, the one a Kubernetes `grpc` probe without a
/// `service` asks for, as the shipped manifests' do) and the ext_proc service's both turn
/// NOT_SERVING when the drain starts, on a watch opened before it.
#[tokio::test]
async fn draining_reports_not_serving_overall_and_for_ext_proc() {
    if !only_ext_proc("the processor's health service") {
        return;
    }
    let upstream = ScriptedUpstream::start();
    let stack = Stack::start(upstream.port(), &["--drain-seconds", "3"]);
    let port = stack.processor().port();
    let channel = tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("a URL")
        .connect()
        .await
        .expect("connect to the processor");
    let mut health = HealthClient::new(channel);
    let mut watches = Vec::new();
    for service in ["", EXT_PROC] {
        let mut watch = health
            .watch(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("watch")
            .into_inner();
        let first = watch.message().await.expect("a status").expect("open");
        assert_eq!(first.status(), ServingStatus::Serving, "{service:?}");
        watches.push((service, watch));
    }
    sigterm(stack.processor().pid());
    for (service, mut watch) in watches {
        let next = tokio::time::timeout(TIMEOUT, watch.message())
            .await
            .expect("a status in time")
            .expect("a status")
            .expect("still open");
        assert_eq!(next.status(), ServingStatus::NotServing, "{service:?}");
    }
}

/// docs/websocket.md, drain: "no new upgrades are accepted (503)", as the documented
/// `server_shutting_down` envelope (docs/limits-and-failures.md), not Envoy's own 503 for a
/// closed port; the socket open before goes on with its response.
#[tokio::test]
async fn an_upgrade_during_the_drain_gets_the_shutting_down_envelope() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{Error, Message};
    if !only_ext_proc("the processor's own drain (module: Envoy's, websocket.rs)") {
        return;
    }
    let gate = Gate::new();
    let upstream = ScriptedUpstream::with_replies([chat_sse("drained").pause_after(1, &gate)]);
    let stack = Stack::with_websocket(upstream.port(), &["--drain-seconds", "20"]);
    let (mut ws, _) = tokio_tungstenite::connect_async(stack.ws_url())
        .await
        .expect("upgrade");
    let ask = json!({"type": "response.create", "model": "m", "input": "x"});
    ws.send(Message::text(ask.to_string())).await.expect("send");
    gate.wait_reached(TIMEOUT).await;
    sigterm(stack.processor().pid());
    tokio::time::sleep(Duration::from_millis(300)).await;

    let refused = tokio_tungstenite::connect_async(stack.ws_url()).await;
    let Err(Error::Http(response)) = refused else {
        panic!("the upgrade was not refused with an HTTP answer: {refused:?}");
    };
    let body: Value = serde_json::from_slice(response.body().as_deref().unwrap_or_default())
        .unwrap_or_else(|e| panic!("not an envelope ({e}): {response:?}"));
    assert_eq!(
        (response.status().as_u16(), body["error"]["code"].as_str()),
        (503, Some("server_shutting_down")),
        "{body}"
    );

    gate.release();
    loop {
        let frame = tokio::time::timeout(TIMEOUT, ws.next())
            .await
            .expect("an event in time")
            .expect("open")
            .expect("a frame");
        let Message::Text(text) = frame else { continue };
        let event: Value = serde_json::from_str(&text).expect("JSON");
        if event["type"] == "response.completed" {
            break;
        }
        assert_ne!(event["type"], "response.failed", "{event}");
    }
}
