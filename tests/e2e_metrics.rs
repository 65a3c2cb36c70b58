//! Metrics end to end: the translator behind the real Envoy serves a JSON, a streamed and two
//! failed exchanges; then the metrics show the token counts the upstream reported, the
//! outcomes, the time to first output of the stream and no stream left in flight. ext_proc
//! mode: the processor's Prometheus endpoint (`--metrics-listen`). Module mode: Envoy's own
//! stats (`/stats/prometheus` on the admin port), which the module defines and records.

mod common;

use common::{client, free_port, wait_until, Mode, Reply, ScriptedUpstream, Stack};
use serde_json::{json, Value};
use std::time::Duration;

/// The value of the one sample of `name` whose labels include all of `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    let matching: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|x| l.contains(x)))
        .collect();
    assert_eq!(matching.len(), 1, "{name} {labels:?}: {matching:?}\n{text}");
    matching[0].rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn metrics_show_tokens_outcomes_and_stream_timings() {
    let upstream = ScriptedUpstream::start();
    let metrics_port = free_port();
    let listen = format!("127.0.0.1:{metrics_port}");
    let args: &[&str] = match common::mode() {
        Mode::ExtProc => &["--metrics-listen", &listen],
        Mode::Module => &[],
    };
    let stack = Stack::start(upstream.port(), args);
    let envoy = &stack.envoy;

    upstream.push(Reply::json(
        200,
        &json!({"id": "c1", "object": "chat.completion", "model": "llama-3-8b",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "yo"}}],
            "usage": {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30,
                "prompt_tokens_details": {"cached_tokens": 16},
                "completion_tokens_details": {"reasoning_tokens": 4}}}),
    ));
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "c2", "object": "chat.completion.chunk", "model": "llama-3-8b",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    upstream.push(Reply::sse([
        chunk(json!({"content": "Hel"}), Value::Null),
        chunk(json!({"content": "lo"}), json!("stop")),
        "data: {\"id\":\"c2\",\"object\":\"chat.completion.chunk\",\"model\":\"llama-3-8b\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n".to_owned(),
        "data: [DONE]\n\n".to_owned(),
    ]));
    upstream.push(Reply::json(
        429,
        &json!({"error": {"message": "slow down", "code": "rate_limited"}}),
    ));

    for (body, status) in [
        (json!({"model": "m", "input": "hi"}), 200),
        (json!({"model": "m", "input": "hi", "stream": true}), 200),
        (json!({"model": "m", "input": "hi"}), 429),
        (json!({"model": "m"}), 400),
    ] {
        let response = client()
            .post(envoy.url("/v1/responses"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), status, "{body}");
        response.bytes().await.unwrap();
    }

    if common::mode() == Mode::Module {
        return module_stats(&stack);
    }
    let response = client()
        .get(format!("http://{listen}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = response.text().await.unwrap();

    let tokens = |kind: &str| {
        sample(
            &text,
            "gen_ai_client_token_usage_sum",
            &[
                &format!("gen_ai_token_type=\"{kind}\""),
                "gen_ai_request_model=\"m\"",
                "gen_ai_response_model=\"llama-3-8b\"",
            ],
        )
    };
    // JSON 21 + stream 5 in; 9 + 2 out; cached and reasoning from the JSON answer only.
    assert_eq!(
        (
            tokens("input"),
            tokens("output"),
            tokens("cached"),
            tokens("reasoning")
        ),
        (26.0, 11.0, 16.0, 4.0)
    );
    let exchanges = |labels: &[&str]| sample(&text, "responses_extproc_exchanges_total", labels);
    assert_eq!(
        exchanges(&["stream=\"false\"", "outcome=\"translated\""]),
        1.0
    );
    assert_eq!(
        exchanges(&["stream=\"true\"", "outcome=\"translated\""]),
        1.0
    );
    assert_eq!(
        exchanges(&["outcome=\"failed\"", "error_code=\"rate_limited\""]),
        1.0
    );
    assert_eq!(
        exchanges(&[
            "outcome=\"failed\"",
            "error_code=\"missing_required_parameter\""
        ]),
        1.0
    );
    // The stream's first token, once; none in flight now.
    assert_eq!(
        sample(
            &text,
            "gen_ai_server_time_to_first_token_seconds_count",
            &["gen_ai_request_model=\"m\""]
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            "gen_ai_server_time_per_output_token_seconds_count",
            &[]
        ),
        1.0
    );
    assert_eq!(
        sample(&text, "responses_extproc_streams_in_flight", &[]),
        0.0
    );
    assert_eq!(
        sample(
            &text,
            "gen_ai_server_request_duration_seconds_count",
            &["stream=\"false\"", "outcome=\"failed\""]
        ),
        1.0,
        "the 429 has a model; the 400 without one is not in the model-labelled metrics"
    );
    assert_eq!(
        sample(
            &text,
            "responses_extproc_translation_seconds_count",
            &["stream=\"false\""]
        ),
        3.0
    );
}

/// Module mode: the same exchanges in Envoy's stats (`<metrics_namespace>.<name>`, labels as
/// tags: `envoy_responses_module_*` in Prometheus form).
fn module_stats(stack: &Stack) {
    let text = |path: &str| {
        common::envoy::http_get(stack.envoy.admin_port(), path)
            .expect("the admin API answers")
            .1
    };
    let stats = text("/stats/prometheus");
    let counter =
        |labels: &[&str]| sample(&stats, "envoy_responses_module_exchanges_total", labels);
    assert_eq!(
        counter(&["stream=\"false\"", "outcome=\"translated\""]),
        1.0
    );
    assert_eq!(counter(&["stream=\"true\"", "outcome=\"translated\""]), 1.0);
    // The upstream's 429 and the refused request (no error-code label: codes come from
    // upstreams too, and Envoy stats have no bound on label values).
    assert_eq!(counter(&["stream=\"false\"", "outcome=\"failed\""]), 2.0);
    let tokens = |kind: &str| {
        sample(
            &stats,
            "envoy_responses_module_tokens_total",
            &[&format!("type=\"{kind}\"")],
        )
    };
    assert_eq!(
        (
            tokens("input"),
            tokens("output"),
            tokens("cached"),
            tokens("reasoning")
        ),
        (26.0, 11.0, 16.0, 4.0)
    );
    assert_eq!(
        sample(&stats, "envoy_responses_module_streams_in_flight", &[]),
        0.0
    );
    // Histograms reach the admin output at Envoy's stats flush (every 5 s by default).
    let stats = wait_until("the module's histograms", Duration::from_secs(15), || {
        let stats = text("/stats/prometheus");
        stats
            .lines()
            .any(|l| l == "envoy_responses_module_time_to_first_output_ms_count{} 1")
            .then_some(stats)
    });
    assert_eq!(
        sample(
            &stats,
            "envoy_responses_module_translation_us_count",
            &["stream=\"false\""]
        ),
        3.0
    );
    assert_eq!(
        sample(
            &stats,
            "envoy_responses_module_request_duration_ms_count",
            &["stream=\"true\"", "outcome=\"translated\""]
        ),
        1.0
    );
}
