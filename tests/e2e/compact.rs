//! `POST /v1/responses/compact` through the real Envoy and the translator of either mode
//! (`tests/common/stack.rs`): with the demo upstream (compact, then a new chain from its
//! output), and against a scripted upstream that records what it gets (failures become
//! envelopes, the request limits of /v1/responses hold, nothing raw reaches the upstream).
//! openai-python's `responses.compact()` is driven in `e2e_clients.rs`.

use crate::common;

use std::time::Duration;

use common::websocket::{recv, Socket};
use common::{client, tenant, DemoUpstream, Envoy, Reply, ScriptedUpstream, Stack, TempDir};
use futures_util::SinkExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};

const TIMEOUT: Duration = Duration::from_secs(60);

/// Status, content type and JSON body of a request to Envoy.
async fn send(envoy: &Envoy, method: &str, path: &str, body: String) -> (u16, String, Value) {
    send_with(envoy, method, path, &[], body).await
}

/// [`send`] with these request headers too.
async fn send_with(
    envoy: &Envoy,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: String,
) -> (u16, String, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
    let mut request = client().request(method, envoy.url(path));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request
        .header("content-type", "application/json")
        .body(body)
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
    let bytes = response.bytes().await.expect("body");
    let text = String::from_utf8_lossy(&bytes);
    let value = common::json::parse_strict(&text)
        .unwrap_or_else(|e| panic!("not strict JSON ({e}): {text}"));
    (status, content_type, value)
}

async fn compact(envoy: &Envoy, body: &Value) -> (u16, String, Value) {
    send(envoy, "POST", "/v1/responses/compact", body.to_string()).await
}

/// Asserts an envelope with this status and code; returns its `error`.
#[track_caller]
fn envelope(answer: &(u16, String, Value), status: u16, code: &str) -> Value {
    let (s, content_type, v) = answer;
    assert_eq!(
        (*s, content_type.as_str()),
        (status, "application/json"),
        "{v}"
    );
    assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    v["error"].clone()
}

#[tokio::test]
async fn compact_with_the_demo_then_a_new_chain() {
    let demo = DemoUpstream::start();
    let stack = Stack::start(demo.port(), &[]);
    let envoy = &stack.envoy;

    let window = json!({"model": "demo-model", "input": [
        {"role": "user", "content": "My name is Ada."},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello Ada.", "annotations": []}]},
        {"role": "user", "content": "Remember 42."}
    ]});
    let (status, content_type, answer) = compact(envoy, &window).await;
    assert_eq!(
        (status, content_type.as_str()),
        (200, "application/json"),
        "{answer}"
    );
    assert_eq!(answer["object"], "response.compaction", "{answer}");
    assert!(answer["id"].as_str().unwrap().starts_with("resp_"));
    assert!(answer["created_at"].as_u64().unwrap() > 0);
    assert!(answer["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let output = answer["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "{answer}");
    assert_eq!(
        output[0]["content"],
        json!([{"type": "input_text", "text": "Remember 42."}])
    );
    assert_eq!(output[1]["type"], "compaction");
    assert!(!output[1]["encrypted_content"]
        .as_str()
        .unwrap()
        .contains("Ada"));

    // A new chain from the compacted window.
    let mut input = output.clone();
    input.push(json!({"role": "user", "content": "Which number?"}));
    let (status, _, response) = send(
        envoy,
        "POST",
        "/v1/responses",
        json!({"model": "demo-model", "input": input}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(
        response["output"][0]["content"][0]["text"],
        "Hello! This is the demo upstream. You said: Which number?"
    );

    // Only POST: other methods are Envoy's 405 envelope.
    let answer = send(envoy, "GET", "/v1/responses/compact", String::new()).await;
    envelope(&answer, 405, "method_not_allowed");
}

#[tokio::test]
async fn compact_failures_are_envelopes_and_nothing_raw_reaches_the_upstream() {
    let upstream = ScriptedUpstream::with_replies([
        Reply::json(503, &json!({"error": {"message": "overloaded"}})),
        Reply::raw(200, "text/event-stream", "data: [DONE]\n\n"),
    ]);
    let stack = Stack::start(upstream.port(), &["--max-request-bytes", "65536"]);
    let envoy = &stack.envoy;
    let ok = json!({"model": "m", "input": "hi"});

    // The upstream fails: its status class in an envelope (a model server's JSON 503 is an
    // overload, which clients retry).
    envelope(&compact(envoy, &ok).await, 503, "server_is_overloaded");
    // The upstream answers with a stream: a summary is sealed from one JSON answer only.
    envelope(&compact(envoy, &ok).await, 502, "upstream_invalid_response");

    // Refused by the processor, the upstream never asked:
    // a stream (the compaction object is not streamable),
    let stream = json!({"model": "m", "input": "hi", "stream": true});
    let error = envelope(&compact(envoy, &stream).await, 400, "unsupported_parameter");
    assert_eq!(error["param"], "stream");
    // an item that does not open,
    let forged = json!({"model": "m", "input": [
        {"type": "compaction", "encrypted_content": "AQJrMQ"}, {"role": "user", "content": "hi"}]});
    envelope(
        &compact(envoy, &forged).await,
        400,
        "invalid_encrypted_content",
    );
    // the same size limit as /v1/responses.
    let big = json!({"model": "m", "input": "x".repeat(70_000)});
    for path in ["/v1/responses/compact", "/v1/responses"] {
        let answer = send(envoy, "POST", path, big.to_string()).await;
        let error = envelope(&answer, 413, "request_too_large");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("--max-request-bytes"),
            "{error}"
        );
    }

    // Only the two translated summarising requests reached the upstream.
    let received = upstream.requests();
    assert_eq!(
        received.iter().map(|r| r.path.as_str()).collect::<Vec<_>>(),
        ["/v1/chat/completions", "/v1/chat/completions"]
    );
    for r in &received {
        let chat = r.json();
        assert!(
            chat["messages"][0]["content"]
                .as_str()
                .unwrap()
                .starts_with(responses_core::translate::compact::PROMPT),
            "{chat}"
        );
        assert_eq!(
            chat["messages"][1],
            json!({"role": "user", "content": "hi"})
        );
    }
}

/// `docs/compaction.md` states the exact texts the upstream gets.
#[test]
fn the_docs_state_the_prompt_and_the_context_prefix() {
    use responses_core::translate::compact::{CONTEXT_PREFIX, PROMPT, REQUEST};
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/compaction.md"))
        .expect("docs/compaction.md");
    for text in [PROMPT, REQUEST, CONTEXT_PREFIX.trim_end()] {
        assert!(page.contains(text), "docs/compaction.md lacks: {text}");
    }
}

/// Codex's remote compaction (v2): a `compaction_trigger` at the end of an ordinary
/// `/v1/responses` request, streamed or not. The upstream gets the summarising request (no
/// tools, even though the client sent its own); the client gets exactly one sealed
/// `compaction` item, then the completion.
#[tokio::test]
async fn a_compaction_trigger_is_answered_with_one_sealed_item() {
    let chat = |text: &str| {
        Reply::json(
            200,
            &json!({"id": "c", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 40, "completion_tokens": 6, "total_tokens": 46}}),
        )
    };
    let stream = Reply::sse([
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"The user \"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"is Ada.\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":6,\"total_tokens\":46}}\n\n",
        "data: [DONE]\n\n",
    ]);
    let upstream = ScriptedUpstream::with_replies([chat("The user is Ada."), stream]);
    // A key file, so that a second translator (the stack of the next turn) opens the item.
    let keys = TempDir::new("compact-keys");
    let key_file = keys.path().join("keys");
    std::fs::write(
        &key_file,
        "k:BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\n",
    )
    .expect("write the key file");
    let key_args = ["--reasoning-keys-file", key_file.to_str().expect("UTF-8")];
    let stack = Stack::start(upstream.port(), &key_args);
    let envoy = &stack.envoy;
    let mut request = json!({"model": "m", "instructions": "You are Codex.",
        "tools": [{"type": "function", "name": "shell"}], "parallel_tool_calls": true,
        "input": [{"role": "user", "content": "I am Ada."},
                  {"role": "assistant", "content": "Hello Ada.", "phase": "final_answer"},
                  {"type": "compaction_trigger"}]});

    let (status, _, response) = send(envoy, "POST", "/v1/responses", request.to_string()).await;
    assert_eq!(status, 200, "{response}");
    let output = response["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{response}");
    assert_eq!(output[0]["type"], "compaction");
    assert_eq!(response["status"], "completed");
    assert_eq!(response["usage"]["output_tokens"], 6);

    request["stream"] = json!(true);
    let answer = client()
        .post(envoy.url("/v1/responses"))
        .json(&request)
        .timeout(TIMEOUT)
        .send()
        .await
        .expect("stream");
    assert_eq!(answer.status(), 200);
    // (OpenAI's `compaction` item is not in the OpenResponses schema: parsed, not validated.)
    let events = common::sse::parse_sse_json(&answer.text().await.expect("events"));
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.compaction.compacting",
            "response.output_item.done",
            "response.completed"
        ]
    );
    // Added empty, done with the sealed summary; the progress event names the item.
    let id = &events[2].1["item"]["id"];
    assert_eq!(events[2].1["item"]["encrypted_content"], "");
    assert_eq!(
        events[3].1,
        json!({"type": "response.compaction.compacting", "item_id": id, "output_index": 0,
               "sequence_number": 3})
    );
    assert_eq!(&events[4].1["item"]["id"], id);
    let completed = &events[5].1["response"];
    assert_eq!(completed["output"][0], events[4].1["item"]);
    assert_eq!(completed["output"][0]["type"], "compaction");
    assert_eq!(completed["usage"]["output_tokens"], 6);

    // What the upstream got, twice: the summarising request, without tools.
    for r in upstream.requests() {
        let chat = r.json();
        let messages = chat["messages"].as_array().unwrap();
        assert!(
            messages[0]["content"]
                .as_str()
                .unwrap()
                .starts_with(responses_core::translate::compact::PROMPT),
            "{chat}"
        );
        assert_eq!(
            messages.last().unwrap()["content"],
            responses_core::translate::compact::REQUEST
        );
        assert_eq!(messages[1], json!({"role": "user", "content": "I am Ada."}));
        assert!(chat.get("tools").is_none(), "{chat}");
        assert!(chat.get("parallel_tool_calls").is_none(), "{chat}");
    }

    // The item continues the conversation, as /v1/responses/compact's does.
    let item = output[0].clone();
    let upstream_next = DemoUpstream::start();
    let next = Stack::start(upstream_next.port(), &key_args);
    let (status, _, response) = send(
        &next.envoy,
        "POST",
        "/v1/responses",
        json!({"model": "m", "input": [item, {"role": "user", "content": "Who am I?"}]})
            .to_string(),
    )
    .await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(
        response["output"][0]["content"][0]["text"],
        "Hello! This is the demo upstream. You said: Who am I?"
    );
}

/// What newer versions of the official suite check of the compaction endpoint: the response
/// schema of `response.compaction`, and a request without `model` refused.
#[tokio::test]
async fn compact_needs_a_model_and_answers_the_compaction_schema() {
    let demo = DemoUpstream::start();
    let stack = Stack::start(demo.port(), &[]);
    let envoy = &stack.envoy;
    let error = envelope(
        &compact(envoy, &json!({"input": "hi"})).await,
        400,
        "missing_required_parameter",
    );
    assert_eq!(error["param"], "model");
    let (status, _, answer) = compact(envoy, &json!({"model": "m", "input": "hi"})).await;
    assert_eq!(status, 200);
    // Every field of the compaction object, each of its type.
    let fields: Vec<&str> = answer
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(fields, ["id", "object", "created_at", "output", "usage"]);
    assert_eq!(answer["object"], "response.compaction");
    assert!(answer["created_at"].is_u64());
    for key in ["input_tokens", "output_tokens", "total_tokens"] {
        assert!(answer["usage"][key].is_u64(), "{answer}");
    }
    let output = answer["output"].as_array().unwrap();
    assert_eq!(output.last().unwrap()["type"], "compaction");
    for item in output {
        assert!(item["id"].is_string(), "{item}");
    }
}

/// The key file of the tenant tests, and the settings binding sealed items to the tenant header
/// Envoy sets from a token (`tests/common/tenant.rs`).
fn tenant_settings(keys: &TempDir) -> Vec<String> {
    let key_file = keys.path().join("keys");
    std::fs::write(
        &key_file,
        "k:BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\n",
    )
    .expect("write the key file");
    [
        "--reasoning-keys-file",
        key_file.to_str().expect("UTF-8"),
        "--seal-tenant-header",
        tenant::HEADER,
    ]
    .map(str::to_owned)
    .to_vec()
}

fn chat_json(text: &str) -> Reply {
    Reply::json(
        200,
        &json!({"id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": text}}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 6, "total_tokens": 46}}),
    )
}

fn chat_sse(text: &str) -> Reply {
    Reply::sse([
        format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]})
        ),
        "data: [DONE]\n\n".to_owned(),
    ])
}

/// The `compaction` item of an output.
#[track_caller]
fn compaction_item(response: &Value) -> Value {
    let items = response["output"].as_array().expect("output");
    let found: Vec<&Value> = items.iter().filter(|i| i["type"] == "compaction").collect();
    assert_eq!(found.len(), 1, "{response}");
    found[0].clone()
}

/// Sealed items bound to the tenant Envoy sets from the caller's token (`--seal-tenant-header`;
/// docs/compaction.md): what one tenant's `/compact` sealed opens for that tenant only, on
/// `/v1/responses` and `/compact`; another tenant's request is 400 `invalid_encrypted_content`
/// and the upstream never hears of it; a request that would seal or open something without a
/// tenant is 403 `missing_tenant`, one that does neither is served; a client's own tenant
/// header counts for nothing (Envoy removes it).
#[tokio::test]
async fn sealed_items_are_bound_to_the_tenant_envoy_sets() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_json("The user is Ada."));
    let keys = TempDir::new("tenant-keys");
    let settings = tenant_settings(&keys);
    let args: Vec<&str> = settings.iter().map(String::as_str).collect();
    let stack = Stack::start_with(upstream.port(), &args, tenant::from_jwt);
    let envoy = &stack.envoy;
    let (a, b) = (tenant::of("team-a"), tenant::of("team-b"));

    let compacted = send_with(
        envoy,
        "POST",
        "/v1/responses/compact",
        &[("authorization", a.as_str())],
        json!({"model": "m", "input": "I am Ada."}).to_string(),
    )
    .await;
    assert_eq!(compacted.0, 200, "{}", compacted.2);
    let item = compaction_item(&compacted.2);
    assert_eq!(upstream.requests().len(), 1);
    // The upstream sees the tenant Envoy set (and never the token's signature for it).
    assert_eq!(
        upstream.requests()[0].header(tenant::HEADER),
        Some("team-a")
    );

    let next = json!({"model": "m", "input": [item, {"role": "user", "content": "Who am I?"}]})
        .to_string();
    let (status, _, response) = send_with(
        envoy,
        "POST",
        "/v1/responses",
        &[("authorization", a.as_str())],
        next.clone(),
    )
    .await;
    assert_eq!(status, 200, "{response}");
    let chat = upstream.requests()[1].json();
    assert!(
        chat["messages"][0]["content"]
            .as_str()
            .unwrap()
            .ends_with("The user is Ada."),
        "{chat}"
    );

    // Another tenant, with or without a header of its own naming team-a: refused, unsent.
    for headers in [
        vec![("authorization", b.as_str())],
        vec![("authorization", b.as_str()), (tenant::HEADER, "team-a")],
    ] {
        for path in ["/v1/responses", "/v1/responses/compact"] {
            let answer = send_with(envoy, "POST", path, &headers, next.clone()).await;
            let error = envelope(&answer, 400, "invalid_encrypted_content");
            assert_eq!(error["param"], "input[0].encrypted_content", "{path}");
            assert!(
                error["message"]
                    .as_str()
                    .unwrap()
                    .contains("another tenant"),
                "{error}"
            );
        }
    }
    assert_eq!(
        upstream.requests().len(),
        2,
        "nothing refused reached the upstream"
    );

    // No tenant (no token, a token without the claim, only the client's own header): 403
    // wherever something would be sealed or opened.
    let no_claim = tenant::bearer(json!({"sub": "someone"}));
    for headers in [
        vec![],
        vec![("authorization", no_claim.as_str())],
        vec![(tenant::HEADER, "team-a")],
    ] {
        for (path, body) in [
            ("/v1/responses", next.clone()),
            (
                "/v1/responses/compact",
                json!({"model": "m", "input": "hi"}).to_string(),
            ),
            (
                "/v1/responses",
                json!({"model": "m", "input": "hi", "include": ["reasoning.encrypted_content"]})
                    .to_string(),
            ),
        ] {
            let answer = send_with(envoy, "POST", path, &headers, body).await;
            let error = envelope(&answer, 403, "missing_tenant");
            assert_eq!(error["type"], "permission_error", "{error}");
        }
    }
    assert_eq!(
        upstream.requests().len(),
        2,
        "nothing refused reached the upstream"
    );
    // ... and what seals nothing needs no tenant.
    let (status, _, response) = send(
        envoy,
        "POST",
        "/v1/responses",
        json!({"model": "m", "input": "hi"}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(upstream.requests().len(), 3);
    assert_eq!(upstream.requests()[2].header(tenant::HEADER), None);
}

async fn connect_as(stack: &Stack, headers: &[(&'static str, &str)]) -> Socket {
    let mut request = stack.ws_url().into_client_request().expect("request");
    for (name, value) in headers {
        request
            .headers_mut()
            .insert(*name, value.parse().expect("a header value"));
    }
    let (socket, response) = tokio_tungstenite::connect_async(request)
        .await
        .unwrap_or_else(|e| panic!("WebSocket upgrade through Envoy failed: {e}"));
    assert_eq!(response.status(), 101);
    socket
}

/// One `response.create` on the socket: its terminal event, or the `error` refusing it.
async fn ask(socket: &mut Socket, body: Value) -> Value {
    let mut body = body;
    body["type"] = json!("response.create");
    socket
        .send(Message::text(body.to_string()))
        .await
        .expect("send");
    loop {
        let event = recv(socket).await;
        let kind = event["type"].as_str().unwrap_or_default();
        if kind == "error" || kind == "response.completed" || kind == "response.failed" {
            return event;
        }
    }
}

/// The WebSocket transport binds a socket's sealed items to its upgrade request's tenant (the
/// header Envoy sets on the upgrade): a compaction sealed on team-a's socket opens on team-a's
/// HTTP requests (in module mode: sealed by the processor's socket, opened by the module),
/// not on team-b's socket; a socket without a tenant cannot seal but answers what seals
/// nothing.
#[tokio::test]
async fn a_sockets_sealed_items_are_bound_to_its_upgrades_tenant() {
    let upstream = ScriptedUpstream::start();
    let keys = TempDir::new("tenant-ws-keys");
    let settings = tenant_settings(&keys);
    let args: Vec<&str> = settings.iter().map(String::as_str).collect();
    let stack = Stack::with_websocket_edited(upstream.port(), &args, tenant::from_jwt);
    let (a, b) = (tenant::of("team-a"), tenant::of("team-b"));

    let mut socket = connect_as(&stack, &[("authorization", &a)]).await;
    upstream.push(chat_sse("The user is Ada."));
    let done = ask(
        &mut socket,
        json!({"model": "m", "input": [{"role": "user", "content": "I am Ada."},
                                       {"type": "compaction_trigger"}]}),
    )
    .await;
    assert_eq!(done["type"], "response.completed", "{done}");
    let item = compaction_item(&done["response"]);
    assert_eq!(upstream.requests().len(), 1);
    let next = json!({"model": "m", "input": [item, {"role": "user", "content": "Who am I?"}]});

    upstream.push(chat_json("Ada."));
    let (status, _, response) = send_with(
        &stack.envoy,
        "POST",
        "/v1/responses",
        &[("authorization", &a)],
        next.to_string(),
    )
    .await;
    assert_eq!(status, 200, "{response}");
    let chat = upstream.requests()[1].json();
    assert!(
        chat["messages"][0]["content"]
            .as_str()
            .unwrap()
            .ends_with("The user is Ada."),
        "{chat}"
    );

    let mut other = connect_as(&stack, &[("authorization", &b), (tenant::HEADER, "team-a")]).await;
    let refused = ask(&mut other, next.clone()).await;
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(refused["status"], 400, "{refused}");
    assert_eq!(refused["error"]["code"], "invalid_encrypted_content");
    assert_eq!(refused["error"]["param"], "input[0].encrypted_content");

    let mut none = connect_as(&stack, &[(tenant::HEADER, "team-a")]).await;
    for body in [
        next,
        json!({"model": "m", "input": [{"role": "user", "content": "hi"},
                                       {"type": "compaction_trigger"}]}),
    ] {
        let refused = ask(&mut none, body).await;
        assert_eq!(refused["status"], 403, "{refused}");
        assert_eq!(refused["error"]["code"], "missing_tenant", "{refused}");
    }
    assert_eq!(
        upstream.requests().len(),
        2,
        "nothing refused reached the upstream"
    );
    upstream.push(chat_sse("Hello."));
    let done = ask(&mut none, json!({"model": "m", "input": "hi"})).await;
    assert_eq!(done["type"], "response.completed", "{done}");
    assert_eq!(upstream.requests().len(), 3);
}

/// Turning the binding on (docs/compaction.md): a `compaction` item sealed before, bound to no
/// tenant, is refused by a server that binds them, and opens for any tenant during the
/// migration window (`--seal-accept-unbound`), where what is sealed anew is bound.
#[tokio::test]
async fn blobs_sealed_before_the_binding_open_only_while_migrating() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_json("The user is Ada."));
    let keys = TempDir::new("tenant-migration-keys");
    let settings = tenant_settings(&keys);
    let args: Vec<&str> = settings.iter().map(String::as_str).collect();
    let (a, b) = (tenant::of("team-a"), tenant::of("team-b"));
    let compact_as = |envoy: &Envoy, auth: &str| {
        let headers = [("authorization", auth.to_owned())];
        let envoy = envoy.url("/v1/responses/compact");
        async move {
            let mut request = client().post(envoy);
            for (name, value) in headers {
                request = request.header(name, value);
            }
            let answer: Value = request
                .json(&json!({"model": "m", "input": "I am Ada."}))
                .timeout(TIMEOUT)
                .send()
                .await
                .expect("compact")
                .json()
                .await
                .expect("JSON");
            compaction_item(&answer)
        }
    };
    let next = |item: Value| {
        json!({"model": "m", "input": [item, {"role": "user", "content": "Who am I?"}]}).to_string()
    };

    // Sealed by a server with the same keys that bound nothing (the first two flags).
    let before = Stack::start_with(upstream.port(), &args[..2], tenant::from_jwt);
    let old = compact_as(&before.envoy, &a).await;
    drop(before);

    let bound = Stack::start_with(upstream.port(), &args, tenant::from_jwt);
    let answer = send_with(
        &bound.envoy,
        "POST",
        "/v1/responses",
        &[("authorization", a.as_str())],
        next(old.clone()),
    )
    .await;
    let error = envelope(&answer, 400, "invalid_encrypted_content");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("before this server bound"),
        "{error}"
    );
    drop(bound);
    let sent = upstream.requests().len();

    let mut migrating = args.clone();
    migrating.push("--seal-accept-unbound");
    let stack = Stack::start_with(upstream.port(), &migrating, tenant::from_jwt);
    let envoy = &stack.envoy;
    for auth in [&a, &b] {
        let (status, _, response) = send_with(
            envoy,
            "POST",
            "/v1/responses",
            &[("authorization", auth.as_str())],
            next(old.clone()),
        )
        .await;
        assert_eq!(status, 200, "{response}");
    }
    assert_eq!(upstream.requests().len(), sent + 2);
    let chat = upstream.requests()[sent].json();
    assert!(
        chat["messages"][0]["content"]
            .as_str()
            .unwrap()
            .ends_with("The user is Ada."),
        "{chat}"
    );
    // Still 403 without a tenant; what is sealed now is team-a's only.
    let answer = send(envoy, "POST", "/v1/responses", next(old)).await;
    envelope(&answer, 403, "missing_tenant");
    let new = compact_as(envoy, &a).await;
    let answer = send_with(
        envoy,
        "POST",
        "/v1/responses",
        &[("authorization", b.as_str())],
        next(new),
    )
    .await;
    envelope(&answer, 400, "invalid_encrypted_content");
}
