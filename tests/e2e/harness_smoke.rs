//! Proves the end-to-end harness itself: schema validation, SSE parsing, the scripted upstream,
//! and the repository's Envoy config with an in-process passthrough ext_proc server and the
//! built-in demo upstream. In module mode (`tests/common/stack.rs`) the wiring tests run
//! against `envoy/envoy-module.yaml` instead: other traffic passes as it does beside ext_proc.

use crate::common;

use std::time::{Duration, Instant};

use common::envoy::with_model_route;
use common::schema::{assert_valid, assert_valid_sse, errors, event_schema_names};
use common::sse::{parse_sse, parse_sse_json};
use common::{
    client, DemoUpstream, Envoy, Gate, Mode, PassthroughProcessor, Reply, ScriptedUpstream, Stack,
};
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(10);

/// The smallest response object the OpenResponses schema accepts (every field it requires).
fn minimal_response() -> Value {
    json!({
        "id": "resp_1",
        "object": "response",
        "created_at": 1_700_000_000,
        "completed_at": 1_700_000_001,
        "status": "completed",
        "incomplete_details": null,
        "model": "m",
        "previous_response_id": null,
        "instructions": null,
        "output": [{
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "hi", "annotations": [], "logprobs": []}]
        }],
        "error": null,
        "tools": [],
        "tool_choice": "auto",
        "truncation": "disabled",
        "parallel_tool_calls": true,
        "text": {"format": {"type": "text"}},
        "top_p": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "top_logprobs": 0,
        "temperature": 1.0,
        "reasoning": null,
        "usage": {
            "input_tokens": 1,
            "output_tokens": 1,
            "total_tokens": 2,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0}
        },
        "max_output_tokens": null,
        "max_tool_calls": null,
        "store": false,
        "background": false,
        "service_tier": "default",
        "metadata": {},
        "safety_identifier": null,
        "prompt_cache_key": null
    })
}

#[test]
fn schema_accepts_a_minimal_response_and_rejects_a_broken_one() {
    assert_valid("ResponseResource", &minimal_response());

    let mut missing_output = minimal_response();
    missing_output.as_object_mut().unwrap().remove("output");
    let errs = errors("ResponseResource", &missing_output);
    assert!(
        errs.iter().any(|e| e.contains("output")),
        "expected an error about `output`, got {errs:?}"
    );

    let mut bad_usage = minimal_response();
    bad_usage["usage"]["input_tokens_details"] = json!({});
    assert!(!errors("ResponseResource", &bad_usage).is_empty());
}

#[test]
#[should_panic(expected = "not a valid ResponseResource")]
fn assert_valid_panics_with_the_errors() {
    assert_valid("ResponseResource", &json!({"object": "response"}));
}

#[test]
fn every_streaming_event_schema_is_mapped_by_its_type() {
    let map = event_schema_names();
    assert_eq!(map.len(), 24, "{map:?}");
    assert_eq!(map["response.created"], "ResponseCreatedStreamingEvent");
    assert_eq!(
        map["response.output_text.delta"],
        "ResponseOutputTextDeltaStreamingEvent"
    );
    assert_eq!(
        map["response.reasoning_summary_text.delta"],
        "ResponseReasoningSummaryDeltaStreamingEvent"
    );
    assert_eq!(map["error"], "ErrorStreamingEvent");
}

#[test]
fn fixture_is_the_shared_openapi_document() {
    let shared = common::repo_root().join("../shared/openresponses/openapi.json");
    let Ok(shared) = std::fs::read(&shared) else {
        return; // not beside the shared folder: nothing to compare with
    };
    let fixture =
        std::fs::read(common::repo_root().join("tests/fixtures/openresponses/openapi.json"))
            .unwrap();
    assert!(
        fixture == shared,
        "tests/fixtures/openresponses/openapi.json differs from ../shared/openresponses/openapi.json: copy it again"
    );
}

fn stream_body() -> String {
    let mut created = json!({"type": "response.created", "sequence_number": 0,
        "response": minimal_response()});
    created["response"]["status"] = json!("in_progress");
    created["response"]["output"] = json!([]);
    let delta = json!({"type": "response.output_text.delta", "sequence_number": 1,
        "item_id": "msg_1", "output_index": 0, "content_index": 0, "delta": "hi", "logprobs": []});
    let completed =
        json!({"type": "response.completed", "sequence_number": 2, "response": minimal_response()});
    [created, delta, completed]
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .chain(["data: [DONE]\n\n".to_string()])
        .collect()
}

#[test]
fn sse_helpers_parse_and_validate_a_stream() {
    let body = stream_body();
    let events = assert_valid_sse(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "response.created",
            "response.output_text.delta",
            "response.completed"
        ]
    );
    assert_eq!(parse_sse_json(&body).len(), 3);

    let raw = parse_sse(": comment\r\nevent: x\r\ndata: a\r\ndata: b\r\n\r\ndata: c\n\nevent: unterminated\ndata: d");
    assert_eq!(raw.len(), 2);
    assert_eq!(raw[0].event.as_deref(), Some("x"));
    assert_eq!(raw[0].data, "a\nb");
    assert_eq!(raw[0].data_lines, 2);
    assert_eq!(raw[1].event, None);
    assert_eq!(raw[1].data, "c");
}

#[test]
#[should_panic(expected = "ResponseOutputTextDeltaStreamingEvent")]
fn sse_validation_rejects_an_invalid_event() {
    let bad = json!({"type": "response.output_text.delta", "sequence_number": 1});
    assert_valid_sse(&format!("data: {bad}\n\n"));
}

#[test]
#[should_panic(expected = "sequence_number")]
fn sse_validation_rejects_decreasing_sequence_numbers() {
    let body = stream_body().replace("\"sequence_number\":2", "\"sequence_number\":0");
    assert_valid_sse(&body);
}

#[tokio::test]
async fn scripted_upstream_records_and_replies() {
    let upstream = ScriptedUpstream::with_replies([
        Reply::json(201, &json!({"ok": true})).header("x-test", "1")
    ]);
    let response = client()
        .post(upstream.url("/v1/chat/completions?x=1"))
        .header("content-type", "application/json")
        .body(r#"{"a":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(response.headers()["x-test"], "1");
    assert_eq!(response.json::<Value>().await.unwrap(), json!({"ok": true}));

    // script used up: 500
    let response = client()
        .get(upstream.url("/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    upstream.set_default(|| Reply::raw(200, "text/plain", "plain"));
    for _ in 0..2 {
        let response = client().get(upstream.url("/x")).send().await.unwrap();
        assert_eq!(response.text().await.unwrap(), "plain");
    }

    let requests = upstream.requests();
    assert_eq!(requests.len(), 4);
    assert_eq!(requests[0].method, "POST");
    assert_eq!(requests[0].path, "/v1/chat/completions?x=1");
    assert_eq!(requests[0].header("content-type"), Some("application/json"));
    assert_eq!(requests[0].json(), json!({"a": 1}));
    assert_eq!(requests[1].method, "GET");
}

#[tokio::test]
async fn scripted_upstream_pauses_at_the_gate_and_closes_mid_body() {
    let gate = Gate::new();
    let upstream = ScriptedUpstream::with_replies([
        Reply::sse(["data: 1\n\n", "data: 2\n\n", "data: 3\n\n"]).pause_after(2, &gate),
        Reply::close_mid_body(200, "application/json", r#"{"partial":"#),
    ]);
    let mut response = client()
        .post(upstream.url("/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    let mut got = String::new();
    while got.matches("\n\n").count() < 2 {
        let chunk = tokio::time::timeout(TIMEOUT, response.chunk())
            .await
            .expect("early chunks")
            .unwrap()
            .expect("more body");
        got.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    gate.wait_reached(TIMEOUT).await;
    assert_eq!(got, "data: 1\n\ndata: 2\n\n");
    gate.release();
    let rest = tokio::time::timeout(TIMEOUT, response.text())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rest, "data: 3\n\n");

    let response = client()
        .post(upstream.url("/v1/chat/completions"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(
        response.text().await.is_err(),
        "the body should end with an error"
    );
}

/// The shipped Envoy of this mode for wiring tests: ext_proc, `envoy/envoy.yaml` with an
/// in-process passthrough processor (it changes nothing and records what it is sent); module,
/// `envoy/envoy-module.yaml` with the module.
fn wiring(upstream_port: u16) -> (Envoy, Option<PassthroughProcessor>) {
    match common::mode() {
        Mode::ExtProc => {
            let extproc = PassthroughProcessor::start();
            (Envoy::start(upstream_port, extproc.port()), Some(extproc))
        }
        Mode::Module => (Stack::start(upstream_port, &[]).envoy, None),
    }
}

#[tokio::test]
async fn envoy_passes_requests_through_a_passthrough_processor_to_the_demo() {
    let demo = DemoUpstream::start();
    let (envoy, extproc) = wiring(demo.port());

    let models: Value = client()
        .get(envoy.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "demo");

    let answer: Value = client()
        .post(envoy.url("/v1/chat/completions"))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "Hello! This is the demo upstream. You said: hi"
    );
    // Other traffic never reaches the processor: ext_proc is disabled on its route.
    if let Some(extproc) = extproc {
        assert!(extproc.seen().is_empty(), "{:?}", extproc.seen());
    }
}

/// Second line of defence: a Responses request the translator did not rewrite (here a
/// processor that changes nothing; in module mode, the module configured for another
/// `responses_path`, so that it lets these requests pass) never reaches the upstream; Envoy
/// answers with an error envelope itself; the same for /v1/responses/compact. Other methods
/// on the paths get 405.
#[tokio::test]
async fn untranslated_responses_requests_never_reach_the_upstream() {
    let upstream = ScriptedUpstream::start();
    let (envoy, extproc) = match common::mode() {
        Mode::ExtProc => {
            let extproc = PassthroughProcessor::start();
            (Envoy::start(upstream.port(), extproc.port()), Some(extproc))
        }
        Mode::Module => (
            Stack::start(upstream.port(), &["--responses-path", "/v1/elsewhere"]).envoy,
            None,
        ),
    };
    let paths = [
        "/v1/responses",
        "/v1/responses?x=1",
        "/v1/responses/compact",
        "/v1/responses/compact?x=1",
    ];
    for path in paths {
        let response = client()
            .post(envoy.url(path))
            .json(&json!({"model": "m", "input": "hi"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 500);
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "application/json"
        );
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "untranslated_request", "{body}");
    }
    if let Some(extproc) = &extproc {
        assert_eq!(
            extproc.seen(),
            ["request_headers", "request_body", "response_headers"].repeat(paths.len())
        );
    }
    for path in ["/v1/responses", "/v1/responses/compact"] {
        let response = client().get(envoy.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 405);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
    }
    // Stored-response endpoints: nothing is stored, and an upstream's own /v1/responses must
    // not answer in our place.
    for (method, path) in [
        (reqwest::Method::GET, "/v1/responses/resp_1"),
        (reqwest::Method::DELETE, "/v1/responses/resp_1"),
        (reqwest::Method::POST, "/v1/responses/resp_1/cancel"),
        (
            reqwest::Method::GET,
            "/v1/responses/resp_1/input_items?limit=2",
        ),
    ] {
        let response = client()
            .request(method.clone(), envoy.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404, "{method} {path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(
            body["error"]["code"], "not_found",
            "{method} {path}: {body}"
        );
    }
    if let Some(extproc) = &extproc {
        assert_eq!(
            extproc.seen().len(),
            3 * paths.len(),
            "only the POSTs consulted the processor"
        );
    }
    assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());
}

#[tokio::test]
async fn envoy_streams_sse_as_it_arrives() {
    let gate = Gate::new();
    let upstream = ScriptedUpstream::with_replies([Reply::sse([
        "data: {\"n\":1}\n\n",
        "data: {\"n\":2}\n\n",
        "data: [DONE]\n\n",
    ])
    .pause_after(1, &gate)]);
    let (envoy, _extproc) = wiring(upstream.port());

    let mut response = client()
        .post(envoy.url("/v1/chat/completions"))
        .json(&json!({"stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let first = tokio::time::timeout(TIMEOUT, response.chunk())
        .await
        .expect("the first event should arrive while the upstream is paused")
        .unwrap()
        .unwrap();
    assert_eq!(&first[..], b"data: {\"n\":1}\n\n");
    assert!(gate.is_reached());
    gate.release();
    let rest = response.text().await.unwrap();
    assert_eq!(rest, "data: {\"n\":2}\n\ndata: [DONE]\n\n");
    assert_eq!(upstream.requests()[0].json(), json!({"stream": true}));
}

#[tokio::test]
async fn demo_stream_through_envoy_is_incremental() {
    let demo = DemoUpstream::start();
    let (envoy, _extproc) = wiring(demo.port());
    let started = Instant::now();
    let mut response = client()
        .post(envoy.url("/v1/chat/completions"))
        .json(
            &json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap();
    let mut reads = 0;
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.unwrap() {
        reads += 1;
        body.extend_from_slice(&chunk);
    }
    let body = String::from_utf8(body).unwrap();
    assert!(body.ends_with("data: [DONE]\n\n"));
    assert!(reads > 3, "the stream came in {reads} read(s)");
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn a_dead_processor_fails_responses_requests_only() {
    if !common::only_ext_proc("no processor on the HTTP path in module mode") {
        return;
    }
    // failure_mode_allow: false: without the processor no Responses request reaches the
    // upstream (an envelope instead); other traffic does not need the processor.
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| Reply::json(200, &json!({"object": "list", "data": []})));
    let envoy = Envoy::start(upstream.port(), common::free_port());
    let response = client()
        .post(envoy.url("/v1/responses"))
        .json(&json!({"model": "m", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 500);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "processor_unavailable", "{body}");
    assert!(upstream.requests().is_empty());
    let response = client().get(envoy.url("/v1/models")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.requests().len(), 1);
}

#[tokio::test]
async fn request_bodies_over_envoys_16_mib_buffer_get_413() {
    if !common::only_ext_proc(
        "module mode has no Envoy buffer for request bodies; the module's own 16 MiB cap is \
         checked by e2e_limits::request_sizes_around_the_request_limit",
    ) {
        return;
    }
    let upstream = ScriptedUpstream::start();
    let extproc = PassthroughProcessor::start();
    let envoy = Envoy::start(upstream.port(), extproc.port());
    let response = client()
        .post(envoy.url("/v1/responses"))
        .header("content-type", "application/json")
        .body(vec![b' '; 17 * 1024 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 413);
    assert!(upstream.requests().is_empty());
}

/// A Chat completion whose text names the upstream that answered.
fn answer_from(who: &str) -> Value {
    json!({"id": "c", "object": "chat.completion", "model": who, "choices": [{"index": 0,
        "finish_reason": "stop", "message": {"role": "assistant", "content": who}}]})
}

/// The commented "route by x-responses-model" example in the shipped config works as
/// documented: ext_proc, when a processor sets the header in its answer to the request body
/// (route_cache_action: CLEAR; a passthrough processor that sets it, so the answer is the
/// upstream's own); module, with the module, which sets it and clears the route cache.
#[tokio::test]
async fn the_model_routing_example_works() {
    let small = ScriptedUpstream::start();
    small.set_default(move || Reply::json(200, &answer_from("small")));
    let big = ScriptedUpstream::start();
    big.set_default(move || Reply::json(200, &answer_from("big")));
    let big_port = big.port();
    let uncomment = move |shipped: String| with_model_route(shipped, big_port);
    let (envoy, _extproc) = match common::mode() {
        Mode::ExtProc => {
            // A processor that does what ours does to the request headers: the model header,
            // and the Chat path (else the request would stay on the Responses route).
            let extproc = PassthroughProcessor::with_request_headers(&[
                ("x-responses-model", "big-model"),
                (":path", "/v1/chat/completions"),
            ]);
            let config = uncomment(common::envoy::test_config(small.port(), extproc.port()));
            (Envoy::start_with_config(&config), Some(extproc))
        }
        Mode::Module => (Stack::start_with(small.port(), &[], uncomment).envoy, None),
    };

    let answer: Value = client()
        .post(envoy.url("/v1/responses"))
        .json(&json!({"model": "big-model", "input": "hi"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = match common::mode() {
        Mode::ExtProc => &answer["choices"][0]["message"]["content"],
        Mode::Module => &answer["output"][0]["content"][0]["text"],
    };
    assert_eq!(text, "big", "{answer}");
    assert_eq!(
        big.requests()[0].header("x-responses-model"),
        Some("big-model")
    );
    assert!(small.requests().is_empty());
}

/// The routing header is ours: with the shipped config and its model route, a client's own
/// `x-responses-model` steers nothing. A direct Chat request (and any other request the
/// translator does not handle) that forges it takes the route it would without it, and
/// reaches its upstream without it; a Responses request that forges it is routed by the
/// model it asks for. Only what the translator sets routes (the real processor, or the
/// module).
#[tokio::test]
async fn a_forged_model_header_does_not_change_a_requests_route() {
    let small = ScriptedUpstream::start();
    small.set_default(move || Reply::json(200, &answer_from("small")));
    let big = ScriptedUpstream::start();
    big.set_default(move || Reply::json(200, &answer_from("big")));
    let big_port = big.port();
    let stack = Stack::start_with(small.port(), &[], move |c| with_model_route(c, big_port));
    let envoy = &stack.envoy;
    let forged = ("x-responses-model", "big-model");

    // A direct Chat request naming the big model in the header: routed as without it.
    let chat: Value = client()
        .post(envoy.url("/v1/chat/completions"))
        .header(forged.0, forged.1)
        .json(&json!({"model": "small-model", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(chat["choices"][0]["message"]["content"], "small", "{chat}");
    // Any other request, whatever its method and path.
    let models = client()
        .get(envoy.url("/v1/models"))
        .header(forged.0, forged.1)
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
    // A Responses request for the small model with the big one in the header: the
    // translator's header, the request's model, decides.
    let answer: Value = client()
        .post(envoy.url("/v1/responses"))
        .header(forged.0, forged.1)
        .json(&json!({"model": "small-model", "input": "hi"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["output"][0]["content"][0]["text"], "small",
        "{answer}"
    );

    let at_small = small.requests();
    assert_eq!(at_small.len(), 3, "{at_small:?}");
    assert_eq!(at_small[0].path, "/v1/chat/completions");
    assert_eq!(at_small[0].header("x-responses-model"), None);
    assert_eq!(at_small[1].path, "/v1/models");
    assert_eq!(at_small[1].header("x-responses-model"), None);
    assert_eq!(at_small[2].path, "/v1/chat/completions");
    assert_eq!(at_small[2].header("x-responses-model"), Some("small-model"));
    assert!(big.requests().is_empty(), "{:?}", big.requests());

    // The model route itself still works: the translator's header routes.
    let answer: Value = client()
        .post(envoy.url("/v1/responses"))
        .json(&json!({"model": "big-model", "input": "hi"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["output"][0]["content"][0]["text"], "big", "{answer}");
    assert_eq!(
        big.requests()[0].header("x-responses-model"),
        Some("big-model")
    );
}

/// The model map (`--model-map`, `model_map`) through the real Envoy, with the shipped
/// config's model route matching the upstream model header instead: a request for `gpt-5.4`
/// reaches the demo upstream the route picks as the mapped name, with both model headers (the
/// name asked for, the name sent); another `gpt-*` name takes the pattern's; a name the map
/// does not match passes unchanged. The answers (JSON, and every event of a stream) name the
/// model asked for, though the demo answers with the name it was sent. A client's own upstream
/// model header steers nothing.
#[tokio::test]
async fn the_model_map_sends_the_mapped_name_and_routes_on_the_upstream_header() {
    let small = common::RecordingDemo::start();
    let big = common::RecordingDemo::start();
    let big_port = big.port();
    let route_on_the_sent_name = move |shipped: String| {
        let config = with_model_route(shipped, big_port);
        let (header, value) = (
            "- name: x-responses-model\n",
            "string_match: {exact: \"big-model\"}",
        );
        assert_eq!(config.matches(header).count(), 1, "the example's header");
        assert_eq!(config.matches(value).count(), 1, "the example's value");
        config
            .replace(header, "- name: x-responses-upstream-model\n")
            .replace(value, "string_match: {exact: \"qwen3-coder\"}")
    };
    let stack = Stack::start_with(
        small.port(),
        &["--model-map", "gpt-5.4=qwen3-coder,gpt-*=qwen3"],
        route_on_the_sent_name,
    );
    let envoy = &stack.envoy;

    // (asked, sent, the upstream that gets it)
    for (asked, sent, to_big) in [
        ("gpt-5.4", "qwen3-coder", true),
        ("gpt-4o-mini", "qwen3", false),
        ("llama", "llama", false),
    ] {
        for stream in [false, true] {
            let (big_before, small_before) = (big.requests().len(), small.requests().len());
            let response = client()
                .post(envoy.url("/v1/responses"))
                .json(&json!({"model": asked, "input": "hi", "stream": stream}))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{asked}");
            let text = response.text().await.unwrap();
            let models: Vec<Value> = if stream {
                parse_sse_json(&text)
                    .into_iter()
                    .filter_map(|(_, e)| e.get("response").map(|r| r["model"].clone()))
                    .collect()
            } else {
                let answer: Value = serde_json::from_str(&text).unwrap();
                assert_valid("ResponseResource", &answer);
                vec![answer["model"].clone()]
            };
            assert!(!models.is_empty(), "{text}");
            assert!(models.iter().all(|m| m == asked), "{asked}: {models:?}");

            let (got, other) = if to_big {
                (&big, &small)
            } else {
                (&small, &big)
            };
            let requests = got.requests();
            let before = if to_big { big_before } else { small_before };
            assert_eq!(
                requests.len(),
                before + 1,
                "{asked}: routed by the name sent"
            );
            assert_eq!(
                other.requests().len(),
                if to_big { small_before } else { big_before }
            );
            let request = requests.last().unwrap();
            assert_eq!(request.json()["model"], sent, "{asked}");
            assert_eq!(request.header("x-responses-model"), Some(asked));
            assert_eq!(request.header("x-responses-upstream-model"), Some(sent));
        }
    }

    // A direct Chat request forging the upstream model header: routed as without it, and the
    // header does not reach the upstream.
    let chat = client()
        .post(envoy.url("/v1/chat/completions"))
        .header("x-responses-upstream-model", "qwen3-coder")
        .json(&json!({"model": "small", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(chat.status(), 200);
    let last = small.requests().last().cloned().unwrap();
    assert_eq!(last.json()["model"], "small");
    assert_eq!(last.header("x-responses-upstream-model"), None);
    assert_eq!(big.requests().len(), 2, "only the two gpt-5.4 requests");
}

// ---- with the real translator (the `responses-extproc` binary, or the module) ----

#[tokio::test]
async fn untranslated_requests_pass_through_envoy_and_the_processor_unchanged() {
    let models = json!({"object": "list", "data": [{"id": "x", "object": "model"}]});
    let upstream = ScriptedUpstream::with_replies([Reply::json(200, &models)]);
    let stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;

    let response = client()
        .get(envoy.url("/v1/models?limit=5"))
        .header("authorization", "Bearer secret")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.json::<Value>().await.unwrap(), models);

    let requests = upstream.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].method, "GET");
    assert_eq!(requests[0].path, "/v1/models?limit=5");
    assert_eq!(requests[0].header("authorization"), Some("Bearer secret"));
    assert_eq!(requests[0].header("x-responses-model"), None);
    assert!(requests[0].body.is_empty());
}

#[tokio::test]
async fn the_demo_answers_a_responses_request_through_envoy_and_the_processor() {
    let demo = DemoUpstream::start();
    let stack = Stack::start(demo.port(), &[]);
    let envoy = &stack.envoy;

    let response = client()
        .post(envoy.url("/v1/responses"))
        .json(&json!({"model": "m", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_valid("ResponseResource", &body);
    assert_eq!(
        body["output"][0]["content"][0]["text"],
        "Hello! This is the demo upstream. You said: hi"
    );

    let response = client()
        .post(envoy.url("/v1/responses"))
        .json(&json!({"model": "m", "input": "hi", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let events = assert_valid_sse(&response.text().await.unwrap());
    assert_eq!(events.first().unwrap().0, "response.created");
    assert_eq!(events.last().unwrap().0, "response.completed");
}
