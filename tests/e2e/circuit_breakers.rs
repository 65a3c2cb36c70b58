//! The clusters' circuit breakers (docs/limits-and-failures.md, docs/deploying.md: "the
//! 1,025th concurrent exchange" over Envoy's default gets a 503), through the real Envoy with
//! the shipped thresholds lowered to 1: one exchange held open fills the cluster, the next one
//! overflows and gets an envelope, never reaching the upstream; once the first ends, exchanges
//! pass again.

use super::websocket::chat_sse;
use std::time::Duration;

use crate::common::{client, mode, Gate, Mode, Reply, ScriptedUpstream, Stack};
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(30);
const SHIPPED: &str = "        max_connections: 8192
        max_pending_requests: 8192
        max_requests: 8192
";
const ONE: &str = "        max_connections: 1
        max_pending_requests: 1
        max_requests: 1
";

/// `config` with the circuit breakers of `cluster` (a `  - name: <cluster>` block) at 1.
fn breakers_of_one(config: String, cluster: &str) -> String {
    let start = config
        .find(&format!("\n  - name: {cluster}\n"))
        .unwrap_or_else(|| panic!("no cluster {cluster}"));
    let at = start
        + config[start..]
            .find(SHIPPED)
            .unwrap_or_else(|| panic!("cluster {cluster} has not the shipped breakers"));
    let next = config[start + 1..]
        .find("\n  - name: ")
        .map_or(config.len(), |i| start + 1 + i);
    assert!(at < next, "the breakers found are {cluster}'s");
    format!("{}{ONE}{}", &config[..at], &config[at + SHIPPED.len()..])
}

fn completion() -> Reply {
    Reply::json(
        200,
        &json!({"id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "ok"}}]}),
    )
}

async fn post(stack: &Stack, stream: bool) -> reqwest::Response {
    client()
        .post(stack.envoy.url("/v1/responses"))
        .header("content-type", "application/json")
        .body(json!({"model": "m", "input": "x", "stream": stream}).to_string())
        .timeout(TIMEOUT)
        .send()
        .await
        .expect("request")
}

/// The value of one of Envoy's counters or gauges (`/stats?filter=`), once it reads `want`.
async fn wait_stat(stack: &Stack, name: &str, want: u64) {
    let started = std::time::Instant::now();
    loop {
        let text = client()
            .get(stack.envoy.admin_url(&format!("/stats?filter=^{name}$")))
            .send()
            .await
            .expect("stats")
            .text()
            .await
            .expect("stats text");
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: ")))
            .and_then(|v| v.trim().parse::<u64>().ok());
        if value == Some(want) {
            return;
        }
        assert!(started.elapsed() < TIMEOUT, "{name} never {want}: {text}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One cluster at 1: a stream held at the upstream fills it; over the pending places the
/// `queued` exchanges wait (HTTP/1.1: a request waits for a connection), the next one gets
/// `(status, code)` and the upstream does not see it; after the stream ends the queued ones
/// and a new one pass.
async fn overflow(cluster: &str, queued: usize, status: u16, code: &str) {
    let gate = Gate::new();
    let upstream = ScriptedUpstream::with_replies([chat_sse("held").pause_after(1, &gate)]);
    upstream.set_default(completion);
    let cluster_name = cluster.to_owned();
    let stack = Stack::start_with(upstream.port(), &[], move |c| {
        breakers_of_one(c, &cluster_name)
    });
    let held = post(&stack, true).await;
    assert_eq!(held.status(), 200);
    gate.wait_reached(TIMEOUT).await;
    let stack = std::sync::Arc::new(stack);
    let mut waiting = Vec::new();
    for _ in 0..queued {
        let stack = stack.clone();
        waiting.push(tokio::spawn(async move {
            post(&stack, false).await.status().as_u16()
        }));
    }
    if queued > 0 {
        wait_stat(
            &stack,
            &format!("cluster.{cluster}.upstream_rq_pending_active"),
            queued as u64,
        )
        .await;
    }

    let over = post(&stack, false).await;
    let got_status = over.status().as_u16();
    let body: Value = over.json().await.expect("an envelope");
    assert_eq!(
        (got_status, body["error"]["code"].as_str()),
        (status, Some(code)),
        "{cluster}: {body}"
    );
    assert_eq!(
        upstream.requests().len(),
        1,
        "{cluster}: the overflow is not sent"
    );

    gate.release();
    let text = held.text().await.expect("the held stream");
    assert!(text.contains("response.completed"), "{text}");
    for w in waiting {
        assert_eq!(
            w.await.expect("a queued exchange"),
            200,
            "{cluster}: queued"
        );
    }
    let after = post(&stack, false).await;
    assert_eq!(after.status(), 200, "{cluster}: a free place again");
    assert_eq!(upstream.requests().len(), 2 + queued);
}

/// The upstream's breaker (both modes): with its connection busy, an exchange waits among the
/// pending requests; past them, Envoy's 503 overflow, as the translation's
/// `upstream_unavailable` envelope.
#[tokio::test]
async fn a_full_upstream_cluster_queues_then_answers_503() {
    overflow("upstream", 1, 503, "upstream_unavailable").await;
}

/// The processor's breaker (ext_proc mode): HTTP/2, so nothing waits for a connection; the
/// exchange past `max_requests` cannot open its gRPC stream, and Envoy's answer is the
/// `processor_unavailable` envelope (a 500).
#[tokio::test]
async fn a_full_extproc_cluster_answers_the_next_exchange_with_the_processor_envelope() {
    if mode() == Mode::Module {
        eprintln!("skipped in module mode: no extproc cluster");
        return;
    }
    overflow("extproc", 0, 500, "processor_unavailable").await;
}
