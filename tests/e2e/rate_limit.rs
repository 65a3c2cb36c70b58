//! Token-based rate limiting with a stock Envoy filter, from the translator's usage metadata
//! (either mode), over HTTP and the WebSocket transport alike:
//! `envoy/examples/token-rate-limit.yaml` spliced into the shipped config, with a rate limit
//! service in the test that keeps a token budget per client. A client whose answers used up
//! its tokens is refused, over HTTP with 429 (an error envelope) and on its socket with a
//! `rate_limit_exceeded` error event (the socket stays open), whichever transport spent them;
//! a refused request or turn never reaches the upstream; another client is not refused; each
//! charge is the answer's, or the turn's, total tokens.

use crate::common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::examples::{piece, splice, splice_first};
use common::websocket::{recv, Socket};
use common::{client, repo_root, wait_until, Reply, ScriptedUpstream, ServerThread, Stack};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};

/// Tokens each client may use.
const BUDGET: u64 = 30;
/// Tokens each answer of the upstream reports.
const PER_ANSWER: u64 = 18;

/// A rate limit service keeping a token count per `client` descriptor: a call with hits 0
/// checks (over the budget → OVER_LIMIT), a call with hits > 0 charges them.
#[derive(Clone, Default)]
struct TokenBudget {
    used: Arc<Mutex<HashMap<String, u64>>>,
    /// Every (client, hits) the service was asked about, in order.
    calls: Arc<Mutex<Vec<(String, u64)>>>,
}

#[tonic::async_trait]
impl RateLimitService for TokenBudget {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let request = request.into_inner();
        let mut over = false;
        for d in &request.descriptors {
            let client = d
                .entries
                .iter()
                .find(|e| e.key == "client")
                .map(|e| e.value.clone())
                .unwrap_or_default();
            // The charge after the answer carries its tokens as the descriptor's hits; the
            // check before the request has none.
            let hits = d.hits_addend.as_ref().map_or(0, |h| h.value);
            self.calls.lock().unwrap().push((client.clone(), hits));
            let mut used = self.used.lock().unwrap();
            let spent = used.entry(client).or_default();
            if hits == 0 {
                over |= *spent >= BUDGET;
            } else {
                *spent += hits;
            }
        }
        let code = if over { Code::OverLimit } else { Code::Ok };
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: code as i32,
            ..Default::default()
        }))
    }
}

/// A socket of `client_id`'s (its handshake carries the header the descriptors read).
async fn connect(stack: &Stack, client_id: &str) -> Socket {
    let mut request = stack.ws_url().into_client_request().unwrap();
    request
        .headers_mut()
        .insert("x-client-id", client_id.parse().unwrap());
    let (socket, response) = tokio_tungstenite::connect_async(request)
        .await
        .unwrap_or_else(|e| panic!("WebSocket upgrade through Envoy failed: {e}"));
    assert_eq!(response.status(), 101);
    socket
}

/// One `response.create` on the socket: its events, up to its terminal event or its error.
async fn turn(socket: &mut Socket) -> Vec<Value> {
    let create = json!({"type": "response.create", "model": "m", "input": "hi"});
    socket
        .send(Message::text(create.to_string()))
        .await
        .unwrap();
    let mut events = Vec::new();
    loop {
        let event = recv(socket).await;
        let kind = event["type"].as_str().unwrap_or_default().to_owned();
        events.push(event);
        if kind == "error"
            || matches!(
                kind.as_str(),
                "response.completed" | "response.failed" | "response.incomplete"
            )
        {
            return events;
        }
    }
}

/// The upstream's answer to a turn's (streamed) Chat request: PER_ANSWER tokens.
fn streamed_answer() -> Reply {
    Reply::sse([
        format!(
            "data: {}\n\n",
            json!({"id": "c", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"},
                    "finish_reason": "stop"}]})
        ),
        format!(
            "data: {}\n\n",
            json!({"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [],
                "usage": {"prompt_tokens": 10, "completion_tokens": PER_ANSWER - 10,
                    "total_tokens": PER_ANSWER}})
        ),
        "data: [DONE]\n\n".to_owned(),
    ])
}

/// A turn refused by the rate limit: one error event, 429 `rate_limit_exceeded`.
fn assert_refused(events: &[Value]) {
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "error", "{events:?}");
    assert_eq!(events[0]["status"], 429, "{events:?}");
    assert_eq!(
        events[0]["error"]["code"], "rate_limit_exceeded",
        "{events:?}"
    );
}

/// A turn that completed with PER_ANSWER tokens.
fn assert_completed(events: &[Value]) {
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.completed", "{events:?}");
    assert_eq!(last["response"]["usage"]["total_tokens"], PER_ANSWER);
}

#[tokio::test]
async fn clients_are_refused_once_their_answers_or_turns_used_up_their_tokens() {
    let budget = TokenBudget::default();
    let service = budget.clone();
    let (_rls, rls_port) = ServerThread::spawn("ratelimit", move |listener| async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(service))
            .serve_with_incoming(incoming)
            .await;
    });
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| {
        Reply::json(
            200,
            &json!({"id": "c", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": PER_ANSWER - 10,
                    "total_tokens": PER_ANSWER}}),
        )
    });
    let example =
        std::fs::read_to_string(repo_root().join("envoy/examples/token-rate-limit.yaml")).unwrap();
    // The example spliced into either mode's shipped config: the metadata is the same.
    let stack = Stack::with_websocket_edited(upstream.port(), &[], |mut config| {
        // The client's listener's chain (module mode: the internal listener shares it).
        config = splice_first(
            config,
            "          - name: envoy.filters.http.router\n",
            &piece(&example, "http_filter", 10),
            true,
        );
        config = splice(
            config,
            "                # Translated requests arrive here with the filter already in their chain (it\n",
            &piece(&example, "route_rate_limits", 16),
            true,
        );
        config = splice(
            config,
            "                  # A turn's token charge: envoy/examples/token-rate-limit.yaml, record_rate_limits.\n",
            &piece(&example, "record_rate_limits", 18),
            false,
        );
        splice(
            config,
            "  # The Chat Completions server",
            &piece(&example, "cluster", 2)
                .replace("port_value: 8081", &format!("port_value: {rls_port}")),
            true,
        )
    });
    let envoy = &stack.envoy;

    let ask = |client_id: &'static str| {
        let url = envoy.url("/v1/responses");
        async move {
            let response = client()
                .post(url)
                .header("x-client-id", client_id)
                .json(&json!({"model": "m", "input": "hi"}))
                .timeout(Duration::from_secs(30))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap();
            (status, body)
        }
    };
    // Waits until the service was charged `n` times for `client`.
    let charged = |client_id: &str, n: usize| {
        let calls = budget.calls.clone();
        let client_id = client_id.to_owned();
        wait_until("the token charge", Duration::from_secs(10), move || {
            let c = calls.lock().unwrap();
            (c.iter()
                .filter(|(id, hits)| *id == client_id && *hits > 0)
                .count()
                >= n)
                .then_some(())
        })
    };

    // 18 tokens, then 36: over the budget of 30 after the second answer.
    for n in 1..=2 {
        let (status, body) = ask("alice").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["usage"]["total_tokens"], PER_ANSWER);
        charged("alice", n);
    }
    let (status, body) = ask("alice").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    // The refused request never reached the upstream.
    assert_eq!(upstream.requests().len(), 2);

    // Refused over HTTP, refused on a socket: each turn gets its error event, the socket
    // stays open, and nothing reaches the upstream.
    let mut alice = connect(&stack, "alice").await;
    for _ in 0..2 {
        assert_refused(&turn(&mut alice).await);
    }
    assert_eq!(upstream.requests().len(), 2);

    // The other way round: turns use up carol's tokens, then her next turn and her HTTP
    // request are refused.
    let mut carol = connect(&stack, "carol").await;
    for n in 1..=2 {
        upstream.push(streamed_answer());
        assert_completed(&turn(&mut carol).await);
        charged("carol", n);
    }
    assert_refused(&turn(&mut carol).await);
    let (status, body) = ask("carol").await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    assert_eq!(upstream.requests().len(), 4);
    let turn_calls = upstream.requests().split_off(2);
    for r in &turn_calls {
        assert_eq!(
            r.header("x-client-id"),
            Some("carol"),
            "the handshake's identity"
        );
    }

    // Another client has its own budget, on either transport.
    let (status, body) = ask("bob").await;
    assert_eq!(status, 200, "{body}");
    charged("bob", 1);
    let mut bob = connect(&stack, "bob").await;
    upstream.push(streamed_answer());
    assert_completed(&turn(&mut bob).await);
    charged("bob", 2);

    let calls = budget.calls.lock().unwrap().clone();
    assert_eq!(
        calls
            .iter()
            .filter(|(_, hits)| *hits > 0)
            .map(|(_, h)| *h)
            .collect::<Vec<_>>(),
        vec![PER_ANSWER; 6],
        "each answer and each turn charged its total tokens: {calls:?}"
    );
}
