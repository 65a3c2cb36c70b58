//! Traces end to end: `envoy/examples/tracing.yaml` spliced into the shipped config (Envoy's
//! OpenTelemetry tracer), the processor run with `--otlp-endpoint`, both exporting to an OTLP
//! receiver in the test (the opentelemetry-proto crate's generated gRPC server, decoding every
//! span). For a JSON, a streamed, a failed, a refused and a WebSocket exchange the processor's
//! span is the child of Envoy's span (the ext_proc stream's, or the upgrade's) in the
//! client's trace, and each of its attributes equals what the client got. With the collector
//! gone, or hanging, the exchanges still succeed and the dropped spans are counted.
//!
//! The processor's tests are skipped in module mode (`RESPONSES_E2E_MODE=module`): there the
//! module exports no spans of its own but tags Envoy's span for the request, and
//! `the_module_tags_envoys_request_span_with_the_answers_values` checks those tags for a JSON, a
//! streamed and a failed exchange (it is skipped in ext_proc mode).

use crate::common;

use std::hash::BuildHasher;
use std::path::PathBuf;
use std::time::Duration;

use common::examples::{piece, splice};
use common::otlp::{Attr, OtlpReceiver, ReceiverTls, RecordedSpan};
use common::sse::parse_sse_json;
use common::websocket::Socket;
use common::{
    client, free_port, only_ext_proc, repo_root, Envoy, Processor, Reply, ScriptedUpstream,
};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};

const WAIT: Duration = Duration::from_secs(20);
/// Why these tests do not run in module mode.
const SKIP: &str = "the processor's spans (the module exports none: it tags Envoy's)";
/// OTLP span kinds.
const SERVER: i32 = 2;
/// OTLP status code of an error.
const ERROR: i32 = 2;

/// A random id of `bytes` bytes, in hex.
fn random_hex(bytes: usize) -> String {
    let state = std::collections::hash_map::RandomState::new();
    (0..bytes.div_ceil(8))
        .map(|i| format!("{:016x}", state.hash_one(i)))
        .collect::<String>()[..bytes * 2]
        .to_owned()
}

/// The client's own span: a W3C `traceparent` (sampled) and its trace and span ids.
struct ClientSpan {
    trace_id: String,
    span_id: String,
}

impl ClientSpan {
    fn new() -> ClientSpan {
        ClientSpan {
            trace_id: random_hex(16),
            span_id: random_hex(8),
        }
    }

    fn traceparent(&self) -> String {
        format!("00-{}-{}-01", self.trace_id, self.span_id)
    }
}

/// The receiver, the upstream, the processor (WebSocket listener and metrics on) and Envoy
/// with the shipped config plus `envoy/examples/tracing.yaml`.
struct TracedStack {
    // Drop order: Envoy, the processor, then the servers they talk to.
    envoy: Envoy,
    processor: Processor,
    metrics: String,
    upstream: ScriptedUpstream,
    receiver: OtlpReceiver,
}

impl TracedStack {
    /// `extra_args`, `extra_env`: more flags and environment for the processor.
    fn start(extra_args: &[&str], extra_env: &[(&str, &str)]) -> TracedStack {
        let receiver = OtlpReceiver::start();
        let upstream = ScriptedUpstream::start();
        let listener = free_port();
        let ws = free_port();
        let calls = free_port();
        let metrics = format!("127.0.0.1:{}", free_port());
        let endpoint = receiver.endpoint();
        let ws_listen = format!("127.0.0.1:{ws}");
        let ws_upstream = format!("http://127.0.0.1:{calls}");
        let mut args = vec![
            "--otlp-endpoint",
            &endpoint,
            "--metrics-listen",
            &metrics,
            "--ws-listen",
            &ws_listen,
            "--ws-upstream",
            &ws_upstream,
        ];
        args.extend_from_slice(extra_args);
        // Batches leave within 50 ms rather than the standard 5 s.
        let mut env = vec![("OTEL_BSP_SCHEDULE_DELAY", "50")];
        env.extend_from_slice(extra_env);
        let processor = Processor::start_with_env(&args, &env);
        let config = std::fs::read_to_string(repo_root().join("envoy/envoy.yaml")).unwrap();
        let config = common::envoy::substitute_ports(
            &config,
            "envoy/envoy.yaml",
            common::envoy::Ports {
                upstream: upstream.port(),
                extproc: processor.port(),
                listener,
                ws,
                calls,
                otlp: 1,
            },
        );
        // The listener the processor's own Chat requests enter traces them too.
        let config = splice(
            config,
            "          stat_prefix: responses_calls\n",
            &piece(
                &std::fs::read_to_string(repo_root().join("envoy/examples/tracing.yaml")).unwrap(),
                "hcm_tracing",
                10,
            ),
            false,
        );
        let envoy = Envoy::start_with_config(&traced_config(config, receiver.port()));
        TracedStack {
            envoy,
            processor,
            metrics: format!("http://{metrics}/metrics"),
            upstream,
            receiver,
        }
    }

    /// All spans of a trace, once `our_spans` of the processor's and `envoy_spans` of Envoy's
    /// arrived.
    fn trace(&self, trace_id: &str, our_spans: usize, envoy_spans: usize) -> Trace {
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let spans: Vec<RecordedSpan> = self
                .receiver
                .spans()
                .into_iter()
                .filter(|s| s.trace_id == trace_id)
                .collect();
            let ours = spans
                .iter()
                .filter(|s| s.service == "responses-extproc")
                .count();
            let envoys = spans.iter().filter(|s| s.service == "envoy").count();
            if ours >= our_spans && envoys >= envoy_spans {
                return Trace { spans };
            }
            assert!(
                std::time::Instant::now() < deadline,
                "trace {trace_id}: {ours} processor and {envoys} Envoy spans after {WAIT:?}: \
                 {spans:#?}\nprocessor log:\n{}",
                self.processor.logs()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

/// The shipped bootstrap with the tracing example's pieces, exporting to `collector_port`,
/// and Envoy's tracer flushing each span at once (its default waits for 5 spans or 5 s).
fn traced_config(config: String, collector_port: u16) -> String {
    let example = std::fs::read_to_string(repo_root().join("envoy/examples/tracing.yaml")).unwrap();
    let config = splice(
        config,
        "          stat_prefix: responses\n",
        &piece(&example, "hcm_tracing", 10),
        false,
    );
    let cluster = piece(&example, "cluster", 2);
    assert_eq!(cluster.matches("port_value: 4317").count(), 1);
    let config = splice(
        config,
        "  # The Chat Completions server",
        &cluster.replace("port_value: 4317", &format!("port_value: {collector_port}")),
        true,
    );
    assert!(!config.contains("layered_runtime"));
    config
        + "layered_runtime:\n  layers:\n  - name: static\n    static_layer:\n      \
           tracing.opentelemetry.min_flush_spans: 1\n      \
           tracing.opentelemetry.flush_interval_ms: 50\n"
}

struct Trace {
    spans: Vec<RecordedSpan>,
}

impl Trace {
    /// The one span of `service` whose parent is `parent`.
    fn child_of(&self, service: &str, parent: &str) -> &RecordedSpan {
        let found: Vec<&RecordedSpan> = self
            .spans
            .iter()
            .filter(|s| s.service == service && s.parent_span_id == parent)
            .collect();
        assert_eq!(
            found.len(),
            1,
            "one {service} span with parent {parent}: {:#?}",
            self.spans
        );
        found[0]
    }

    /// The processor's one span.
    fn ours(&self) -> &RecordedSpan {
        let ours: Vec<&RecordedSpan> = self
            .spans
            .iter()
            .filter(|s| s.service == "responses-extproc")
            .collect();
        assert_eq!(ours.len(), 1, "one processor span: {:#?}", self.spans);
        ours[0]
    }

    /// Envoy's span for the request (its parent is the client's span), the span of the
    /// ext_proc stream Envoy opened under it, and the processor's span, which must be that
    /// stream's child.
    fn ext_proc_chain(&self, client: &ClientSpan) -> (&RecordedSpan, &RecordedSpan, &RecordedSpan) {
        let request = self.child_of("envoy", &client.span_id);
        let stream = self.child_of("envoy", &request.span_id);
        assert!(
            stream
                .name
                .contains("envoy.service.ext_proc.v3.ExternalProcessor.Process"),
            "Envoy's span under the request is the ext_proc stream's: {stream:#?}"
        );
        let ours = self.ours();
        assert_eq!(
            ours.parent_span_id, stream.span_id,
            "the processor's span is a child of Envoy's ext_proc stream span: {:#?}",
            self.spans
        );
        (request, stream, ours)
    }
}

/// Checks the attributes every exchange span has, and its name and kind.
fn common_attributes(span: &RecordedSpan, model: Option<&str>, operation: &str) {
    assert_eq!(span.kind, SERVER, "{span:#?}");
    assert_eq!(span.str("gen_ai.operation.name"), "chat");
    assert_eq!(span.str("gen_ai.provider.name"), "openai");
    assert_eq!(span.str("responses_extproc.operation"), operation);
    match model {
        Some(m) => {
            assert_eq!(span.name, format!("chat {m}"));
            assert_eq!(span.str("gen_ai.request.model"), m);
        }
        None => {
            assert_eq!(span.name, "chat");
            assert_eq!(span.attr("gen_ai.request.model"), None);
        }
    }
    assert!(span.end_unix_nano >= span.start_unix_nano, "{span:#?}");
    assert!(
        matches!(span.attr("responses_extproc.translation.duration"), Some(Attr::F64(x)) if *x > 0.0),
        "{span:#?}"
    );
}

/// Each usage attribute (or tag) and the field of the client's `usage` it equals.
fn usage_fields(usage: &Value) -> [(&'static str, &Value); 4] {
    [
        ("gen_ai.usage.input_tokens", &usage["input_tokens"]),
        ("gen_ai.usage.output_tokens", &usage["output_tokens"]),
        (
            "gen_ai.usage.cache_read.input_tokens",
            &usage["input_tokens_details"]["cached_tokens"],
        ),
        (
            "gen_ai.usage.reasoning.output_tokens",
            &usage["output_tokens_details"]["reasoning_tokens"],
        ),
    ]
}

/// The usage attributes equal the usage the client got.
fn usage_attributes(span: &RecordedSpan, usage: &Value) {
    for (attr, field) in usage_fields(usage) {
        assert_eq!(
            Some(span.int(attr)),
            field.as_i64(),
            "{attr} against {usage}"
        );
    }
}

/// Whether `inner` lies within `outer` (Envoy and the processor share the machine's clock).
fn within(inner: &RecordedSpan, outer: &RecordedSpan) -> bool {
    inner.start_unix_nano >= outer.start_unix_nano && inner.end_unix_nano <= outer.end_unix_nano
}

async fn post(stack: &TracedStack, client_span: &ClientSpan, body: Value) -> (u16, String) {
    let response = client()
        .post(stack.envoy.url("/v1/responses"))
        .header("traceparent", client_span.traceparent())
        .json(&body)
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

fn completion(model: &str) -> Value {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "Hello there."}}],
        "usage": {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30,
            "prompt_tokens_details": {"cached_tokens": 16},
            "completion_tokens_details": {"reasoning_tokens": 4}}})
}

fn chunk(delta: Value, finish: Value) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "c2", "object": "chat.completion.chunk", "model": "llama-3-8b",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    )
}

fn stream_reply() -> Reply {
    Reply::sse([
        chunk(json!({"role": "assistant"}), Value::Null),
        chunk(json!({"content": "Hel"}), Value::Null),
        chunk(json!({"content": "lo"}), json!("length")),
        "data: {\"id\":\"c2\",\"object\":\"chat.completion.chunk\",\"model\":\"llama-3-8b\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n".to_owned(),
        "data: [DONE]\n\n".to_owned(),
    ])
}

/// A request whose estimate crosses its `compact_threshold`.
fn compacting() -> Value {
    json!({"model": "m", "context_management": [{"type": "compaction", "compact_threshold": 10}],
        "input": [
            {"role": "user", "content": "Tell me a long story about cats and their whiskers."},
            {"role": "assistant", "content": "Once upon a time there was a cat."},
            {"role": "user", "content": "Go on."}]})
}

/// The upstream's answers to [`compacting`]: the summary (50 input tokens), then the turn.
fn compaction_answers(upstream: &ScriptedUpstream) {
    let summary = json!({"id": "s", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "A summary."}}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 3, "total_tokens": 53}});
    upstream.push(Reply::json(200, &summary));
    upstream.push(Reply::json(200, &completion("m")));
}

/// An automatic compaction (`context_management`): the processor's span has a `compaction`
/// event at its summarising call and the compaction's attributes, and the call's own Envoy
/// span (back through Envoy's listener) is the processor span's child.
#[tokio::test]
async fn a_compactions_side_call_is_an_event_and_a_child_span() {
    if !only_ext_proc(SKIP) {
        return;
    }
    let stack = TracedStack::start(&[], &[]);
    compaction_answers(&stack.upstream);
    let client_span = ClientSpan::new();
    let (status, body) = post(&stack, &client_span, compacting()).await;
    assert_eq!(status, 200, "{body}");
    // Envoy: the request, its ext_proc stream, the side call's request.
    let trace = stack.trace(&client_span.trace_id, 1, 3);
    let (_, _, span) = trace.ext_proc_chain(&client_span);
    assert_eq!(
        span.str("responses_extproc.compaction.outcome"),
        "compacted"
    );
    assert_eq!(span.int("responses_extproc.compaction.threshold"), 10);
    assert_eq!(span.int("responses_extproc.compaction.input_tokens"), 50);
    let (name, at) = &span.events[0];
    assert_eq!(name, "compaction", "{span:#?}");
    assert!(
        (span.start_unix_nano..=span.end_unix_nano).contains(at),
        "{span:#?}"
    );
    let side = trace.child_of("envoy", &span.span_id);
    assert!(within(side, span), "{side:#?}");
    let requests = stack.upstream.requests();
    assert_eq!(requests.len(), 2);
    assert!(requests[0]
        .header("traceparent")
        .is_some_and(|t| t.contains(&client_span.trace_id)));
}

/// Module mode: an automatic compaction is a `compaction` event on Envoy's span for the
/// request, and its side call (a callout into the internal listener) carries that span's
/// context, so Envoy's span for it is the request span's child, as in ext_proc mode the call
/// is the processor span's.
#[tokio::test]
async fn the_modules_side_call_is_a_child_of_envoys_request_span() {
    if !common::only_module("the module's side call (ext_proc: the processor's span)") {
        return;
    }
    let stack = TracedModule::start();
    compaction_answers(&stack.upstream);
    let client_span = ClientSpan::new();
    let (status, body) = stack.post(&client_span, compacting()).await;
    assert_eq!(status, 200, "{body}");
    let request = stack.request_span(&client_span);
    assert!(
        request.events.iter().any(|(name, _)| name == "compaction"),
        "{request:#?}"
    );
    let side = stack
        .receiver
        .wait_for("Envoy's span for the side call", WAIT, |s| {
            s.parent_span_id == request.span_id
        });
    assert_eq!(side.trace_id, client_span.trace_id);
    let requests = stack.upstream.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[0].header("traceparent"),
        Some(format!("00-{}-{}-01", client_span.trace_id, side.span_id).as_str()),
        "the summarising request continues Envoy's span for it"
    );
}

#[tokio::test]
async fn http_exchanges_are_spans_under_envoys_ext_proc_span_with_the_answers_values() {
    if !only_ext_proc(SKIP) {
        return;
    }
    let stack = TracedStack::start(&[], &[]);

    // A JSON exchange, with generation parameters set.
    stack
        .upstream
        .push(Reply::json(200, &completion("llama-3-8b")));
    let json_client = ClientSpan::new();
    let (status, body) = post(
        &stack,
        &json_client,
        json!({"model": "m", "input": "hi", "temperature": 0.25, "top_p": 0.5,
            "max_output_tokens": 64}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    let trace = stack.trace(&json_client.trace_id, 1, 2);
    let (request, stream, span) = trace.ext_proc_chain(&json_client);
    common_attributes(span, Some("m"), "create");
    assert_eq!(span.attr("gen_ai.request.stream"), Some(&Attr::Bool(false)));
    assert_eq!(
        span.str("gen_ai.response.id"),
        answer["id"].as_str().unwrap()
    );
    assert_eq!(span.str("gen_ai.response.model"), "llama-3-8b");
    assert_eq!(
        span.attr("gen_ai.response.finish_reasons"),
        Some(&Attr::Strs(vec!["stop".into()]))
    );
    usage_attributes(span, &answer["usage"]);
    assert_eq!(
        span.attr("gen_ai.request.temperature"),
        Some(&Attr::F64(answer["temperature"].as_f64().unwrap()))
    );
    assert_eq!(
        span.attr("gen_ai.request.top_p"),
        Some(&Attr::F64(answer["top_p"].as_f64().unwrap()))
    );
    assert_eq!(
        Some(span.int("gen_ai.request.max_tokens")),
        answer["max_output_tokens"].as_i64()
    );
    // Parameters the request did not set are not reported.
    assert_eq!(span.attr("gen_ai.request.presence_penalty"), None);
    assert_eq!(span.int("http.response.status_code"), 200);
    assert_eq!(span.str("responses_extproc.outcome"), "translated");
    assert_eq!(span.attr("error.type"), None);
    assert_eq!(span.status.0, 0, "status unset: {span:#?}");
    // No first-token event for an answer sent whole.
    assert!(span.events.is_empty(), "{span:#?}");
    // Prompts and completions stay off the spans without --trace-content.
    for body in [
        "responses_extproc.request.body",
        "responses_extproc.response.body",
    ] {
        assert_eq!(span.attr(body), None, "{body}");
    }
    assert!(within(span, request), "inside Envoy's request span");
    assert!(stream.start_unix_nano <= span.start_unix_nano);
    // The upstream got Envoy's request span's context: the Chat request is in the trace too.
    let upstream_request = stack.upstream.requests().pop().unwrap();
    assert_eq!(
        upstream_request.header("traceparent"),
        Some(format!("00-{}-{}-01", json_client.trace_id, request.span_id).as_str())
    );

    // A streamed exchange.
    stack.upstream.push(stream_reply());
    let stream_client = ClientSpan::new();
    let (status, body) = post(
        &stack,
        &stream_client,
        json!({"model": "m", "input": "hi", "stream": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let events = parse_sse_json(&body);
    let (last, terminal) = events.last().unwrap();
    assert_eq!(last, "response.incomplete", "{body}");
    let trace = stack.trace(&stream_client.trace_id, 1, 2);
    let (request, _, span) = trace.ext_proc_chain(&stream_client);
    common_attributes(span, Some("m"), "create");
    assert_eq!(span.attr("gen_ai.request.stream"), Some(&Attr::Bool(true)));
    assert_eq!(
        span.str("gen_ai.response.id"),
        terminal["response"]["id"].as_str().unwrap()
    );
    assert_eq!(span.str("gen_ai.response.model"), "llama-3-8b");
    assert_eq!(
        span.attr("gen_ai.response.finish_reasons"),
        Some(&Attr::Strs(vec!["length".into()]))
    );
    usage_attributes(span, &terminal["response"]["usage"]);
    for unset in [
        "gen_ai.request.temperature",
        "gen_ai.request.top_p",
        "gen_ai.request.max_tokens",
    ] {
        assert_eq!(span.attr(unset), None, "{unset}");
    }
    assert_eq!(span.str("responses_extproc.outcome"), "translated");
    // The first output: an event between the span's start and end, and its delay.
    assert_eq!(span.events.len(), 1, "{span:#?}");
    let (name, at) = &span.events[0];
    assert_eq!(name, "first_token");
    assert!(
        span.start_unix_nano < *at && *at <= span.end_unix_nano,
        "{span:#?}"
    );
    let Some(Attr::F64(ttfc)) = span.attr("gen_ai.response.time_to_first_chunk") else {
        panic!("no time to first chunk: {span:#?}");
    };
    let event_delay = (*at - span.start_unix_nano) as f64 / 1e9;
    assert!((ttfc - event_delay).abs() < 1e-3, "{ttfc} vs {event_delay}");
    assert!(within(span, request), "inside Envoy's request span");

    // An upstream error: the span fails with the envelope's code.
    stack.upstream.push(Reply::json(
        429,
        &json!({"error": {"message": "slow down", "type": "rate_limit_error", "code": "rate_limited"}}),
    ));
    let error_client = ClientSpan::new();
    let (status, body) = post(&stack, &error_client, json!({"model": "m", "input": "hi"})).await;
    assert_eq!(status, 429, "{body}");
    let envelope: Value = serde_json::from_str(&body).unwrap();
    let code = envelope["error"]["code"].as_str().unwrap();
    let trace = stack.trace(&error_client.trace_id, 1, 2);
    let (_, _, span) = trace.ext_proc_chain(&error_client);
    common_attributes(span, Some("m"), "create");
    assert_eq!(span.str("error.type"), code);
    assert_eq!(span.status, (ERROR, code.to_owned()));
    assert_eq!(span.int("http.response.status_code"), 429);
    assert_eq!(span.str("responses_extproc.outcome"), "failed");
    assert_eq!(span.attr("gen_ai.usage.input_tokens"), None);

    // A request refused before its model was read: no model, the envelope's code.
    let refused_client = ClientSpan::new();
    let (status, body) = post(&stack, &refused_client, json!(["not", "an", "object"])).await;
    assert_eq!(status, 400, "{body}");
    let envelope: Value = serde_json::from_str(&body).unwrap();
    let trace = stack.trace(&refused_client.trace_id, 1, 2);
    let (_, _, span) = trace.ext_proc_chain(&refused_client);
    common_attributes(span, None, "create");
    assert_eq!(
        span.str("error.type"),
        envelope["error"]["code"].as_str().unwrap()
    );
    assert_eq!(span.int("http.response.status_code"), 400);
    assert_eq!(span.attr("gen_ai.response.id"), None);

    // Every span was exported (counted once the collector answered), none dropped.
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let metrics = client()
            .get(&stack.metrics)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(
            !metrics.contains("responses_extproc_spans_dropped_total{"),
            "{metrics}"
        );
        if metrics.contains("responses_extproc_spans_exported_total 4\n") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{metrics}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Messages up to the response's terminal event.
async fn ws_response(socket: &mut Socket) -> Vec<Value> {
    let mut events = Vec::new();
    loop {
        let message = tokio::time::timeout(Duration::from_secs(30), socket.next())
            .await
            .expect("a message in time")
            .expect("the socket is open")
            .expect("a readable message");
        let Message::Text(text) = message else {
            continue;
        };
        let event: Value = serde_json::from_str(&text).unwrap();
        let kind = event["type"].as_str().unwrap_or_default().to_owned();
        events.push(event);
        // A refused or failed request is one `error` event.
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

#[tokio::test]
async fn websocket_responses_are_spans_under_envoys_upgrade_and_their_chat_requests_continue_the_trace(
) {
    if !only_ext_proc(SKIP) {
        return;
    }
    // With --trace-content: the bodies are on the spans too; exported gzipped (the standard
    // variable).
    let stack = TracedStack::start(
        &["--trace-content"],
        &[("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")],
    );
    stack.upstream.push(stream_reply());
    stack.upstream.push(Reply::json(
        503,
        &json!({"error": {"message": "overloaded", "code": "overloaded"}}),
    ));
    let client_span = ClientSpan::new();
    let mut request = format!("ws://127.0.0.1:{}/v1/responses", stack.envoy.port())
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("traceparent", client_span.traceparent().parse().unwrap());
    let (mut socket, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(response.status(), 101);
    let first_message =
        json!({"type": "response.create", "model": "m", "input": "hi", "temperature": 0.5})
            .to_string();
    socket
        .send(Message::text(first_message.clone()))
        .await
        .unwrap();
    let first = ws_response(&mut socket).await;
    let terminal = first.last().unwrap();
    assert_eq!(terminal["type"], "response.incomplete", "{first:?}");
    socket
        .send(Message::text(
            json!({"type": "response.create", "model": "m", "input": "again"}).to_string(),
        ))
        .await
        .unwrap();
    let second = ws_response(&mut socket).await;
    assert_eq!(second.last().unwrap()["type"], "error", "{second:?}");
    // Envoy ends (and exports) its span for the upgrade when the socket closes.
    socket.close(None).await.unwrap();
    drop(socket);

    // Envoy's upgrade span (a child of the client's), then the two responses' spans, then
    // Envoy's span of each Chat request the processor sent back through it.
    let trace = stack.trace(&client_span.trace_id, 2, 3);
    let upgrade = trace.child_of("envoy", &client_span.span_id);
    let ours: Vec<&RecordedSpan> = trace
        .spans
        .iter()
        .filter(|s| s.service == "responses-extproc")
        .collect();
    for span in &ours {
        assert_eq!(span.parent_span_id, upgrade.span_id, "{:#?}", trace.spans);
        assert_eq!(span.str("responses_extproc.transport"), "websocket");
        common_attributes(span, Some("m"), "create");
    }
    let completed = ours
        .iter()
        .find(|s| s.str("responses_extproc.outcome") == "translated")
        .expect("the first response's span");
    assert_eq!(
        completed.str("gen_ai.response.id"),
        terminal["response"]["id"].as_str().unwrap()
    );
    usage_attributes(completed, &terminal["response"]["usage"]);
    assert_eq!(
        completed.attr("gen_ai.request.temperature"),
        Some(&Attr::F64(0.5))
    );
    assert_eq!(
        completed.attr("gen_ai.response.finish_reasons"),
        Some(&Attr::Strs(vec!["length".into()]))
    );
    assert_eq!(completed.events.len(), 1, "{completed:#?}");
    // --trace-content: the message as sent, and the terminal event as received.
    assert_eq!(
        completed.str("responses_extproc.request.body"),
        first_message
    );
    let recorded: Value =
        serde_json::from_str(completed.str("responses_extproc.response.body")).unwrap();
    assert_eq!(&recorded, terminal);
    let failed = ours
        .iter()
        .find(|s| s.str("responses_extproc.outcome") == "failed")
        .expect("the second response's span");
    let error = &second.last().unwrap()["error"];
    assert_eq!(failed.str("error.type"), error["code"].as_str().unwrap());
    assert_eq!(failed.int("http.response.status_code"), 503);
    let recorded: Value =
        serde_json::from_str(failed.str("responses_extproc.response.body")).unwrap();
    assert_eq!(&recorded, second.last().unwrap());
    // Each Chat request continues its response's trace: Envoy's span for it is the child of
    // the response's span, and the upstream got that span's context.
    let requests = stack.upstream.requests();
    assert_eq!(requests.len(), 2);
    for (span, request) in [completed, failed].into_iter().zip(&requests) {
        let chat = trace.child_of("envoy", &span.span_id);
        assert_eq!(
            request.header("traceparent"),
            Some(format!("00-{}-{}-01", client_span.trace_id, chat.span_id).as_str()),
            "{chat:#?}"
        );
        assert!(
            chat.start_unix_nano >= span.start_unix_nano,
            "{chat:#?} {span:#?}"
        );
    }
}

/// The processor's `responses_extproc_spans_dropped_total{reason=...}`, 0 when absent.
async fn dropped(metrics: &str, reason: &str) -> f64 {
    let text = client()
        .get(metrics)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| {
            l.starts_with(&format!(
                "responses_extproc_spans_dropped_total{{reason=\"{reason}\"}}"
            ))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn without_a_collector_exchanges_succeed_and_the_dropped_spans_are_counted() {
    if !only_ext_proc(SKIP) {
        return;
    }
    // One collector that is not there (connection refused), one that accepts connections
    // and never answers.
    let absent = format!("http://127.0.0.1:{}", free_port());
    let hanging = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hanging_endpoint = format!("http://{}", hanging.local_addr().unwrap());
    for (endpoint, reason, env) in [
        (absent.as_str(), "export_failed", vec![]),
        (
            hanging_endpoint.as_str(),
            "queue_full",
            // One span at a time, each export waiting up to 10 s: the queue fills at once.
            vec![
                ("OTEL_BSP_MAX_QUEUE_SIZE", "1"),
                ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "1"),
                ("OTEL_BSP_EXPORT_TIMEOUT", "10000"),
            ],
        ),
    ] {
        let upstream = ScriptedUpstream::start();
        upstream.set_default(|| Reply::json(200, &completion("llama-3-8b")));
        let metrics_listen = format!("127.0.0.1:{}", free_port());
        let metrics = format!("http://{metrics_listen}/metrics");
        let mut env = env;
        env.push(("OTEL_BSP_SCHEDULE_DELAY", "50"));
        let processor = Processor::start_with_env(
            &[
                "--otlp-endpoint",
                endpoint,
                "--metrics-listen",
                &metrics_listen,
            ],
            &env,
        );
        let envoy = Envoy::start(upstream.port(), processor.port());
        for i in 0..6 {
            let started = std::time::Instant::now();
            let response = client()
                .post(envoy.url("/v1/responses"))
                .json(&json!({"model": "m", "input": format!("hi {i}")}))
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{endpoint}");
            let body: Value = response.json().await.unwrap();
            assert_eq!(body["status"], "completed");
            // Not held up by the collector (its exports time out after 10 s).
            assert!(started.elapsed() < Duration::from_secs(5), "{endpoint}");
        }
        let deadline = std::time::Instant::now() + WAIT;
        while dropped(&metrics, reason).await < 1.0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no {reason} drop counted with {endpoint}:\n{}",
                processor.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(hanging);
}

#[tokio::test]
async fn the_standard_otlp_variables_turn_traces_on_over_http() {
    if !only_ext_proc(SKIP) {
        return;
    }
    // No --otlp-endpoint: OTEL_EXPORTER_OTLP_TRACES_ENDPOINT (used as is) and the protocol
    // and service name from the standard variables; Envoy does not trace here, so the span
    // starts a trace of its own.
    let receiver = OtlpReceiver::start_http();
    let upstream = ScriptedUpstream::start();
    upstream.push(Reply::json(200, &completion("llama-3-8b")));
    let endpoint = format!("{}/v1/traces", receiver.endpoint());
    let processor = Processor::start_with_env(
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_SERVICE_NAME", "llm-gateway"),
            ("OTEL_BSP_SCHEDULE_DELAY", "50"),
        ],
    );
    let envoy = Envoy::start(upstream.port(), processor.port());
    let response = client()
        .post(envoy.url("/v1/responses"))
        .json(&json!({"model": "m", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    let span = receiver.wait_for("the processor's span over OTLP/HTTP", WAIT, |s| {
        s.service == "llm-gateway"
    });
    assert_eq!(span.name, "chat m");
    assert_eq!(span.parent_span_id, "", "a root span: {span:#?}");
    assert_eq!(span.str("gen_ai.response.id"), body["id"].as_str().unwrap());
    usage_attributes(&span, &body["usage"]);
}

/// Module mode: Envoy with the module (`envoy/envoy-module.yaml`) and its OpenTelemetry tracer
/// (the same example pieces), exporting to the receiver. No processor: Envoy's span for the
/// request is the exchange's, and the module tags it.
struct TracedModule {
    envoy: Envoy,
    upstream: ScriptedUpstream,
    receiver: OtlpReceiver,
}

impl TracedModule {
    fn start() -> TracedModule {
        let receiver = OtlpReceiver::start();
        let upstream = ScriptedUpstream::start();
        let config = common::stack::module_bootstrap(
            "{}",
            common::envoy::Ports {
                upstream: upstream.port(),
                extproc: 0,
                listener: 0,
                ws: 1,
                calls: 0,
                otlp: 1,
            },
        );
        // The internal listener the module's own Chat requests enter traces them too.
        let config = common::examples::splice(
            config,
            "          stat_prefix: responses_loopback\n",
            &piece(
                &std::fs::read_to_string(repo_root().join("envoy/examples/tracing.yaml")).unwrap(),
                "hcm_tracing",
                10,
            ),
            false,
        );
        let envoy = Envoy::start_with_config(&traced_config(config, receiver.port()));
        TracedModule {
            envoy,
            upstream,
            receiver,
        }
    }

    /// Envoy's span for the request of `client` (its child), once exported.
    fn request_span(&self, client: &ClientSpan) -> RecordedSpan {
        let span = self.receiver.wait_for("Envoy's request span", WAIT, |s| {
            s.trace_id == client.trace_id && s.parent_span_id == client.span_id
        });
        assert_eq!(span.service, "envoy");
        assert_eq!(span.kind, SERVER, "{span:#?}");
        span
    }

    async fn post(&self, client_span: &ClientSpan, body: Value) -> (u16, String) {
        let response = client()
            .post(self.envoy.url("/v1/responses"))
            .header("traceparent", client_span.traceparent())
            .json(&body)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.text().await.unwrap())
    }
}

/// A tag of Envoy's span parsed as a number (Envoy's tags are strings).
fn number<T: std::str::FromStr>(span: &RecordedSpan, key: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    span.str(key)
        .parse()
        .unwrap_or_else(|e| panic!("{key}: {e:?} in {span:#?}"))
}

/// The tags of every exchange on Envoy's span.
fn module_common_tags(span: &RecordedSpan) {
    assert_eq!(span.name, "chat m", "renamed: {span:#?}");
    assert_eq!(span.str("gen_ai.operation.name"), "chat");
    assert_eq!(span.str("gen_ai.provider.name"), "openai");
    assert_eq!(span.str("gen_ai.request.model"), "m");
    assert_eq!(span.str("responses_extproc.operation"), "create");
    assert_eq!(span.str("responses_extproc.transport"), "module");
    assert!(number::<f64>(span, "responses_extproc.translation.duration") > 0.0);
}

/// The usage tags equal the usage the client got.
fn module_usage_tags(span: &RecordedSpan, usage: &Value) {
    for (tag, field) in usage_fields(usage) {
        assert_eq!(
            Some(number::<i64>(span, tag)),
            field.as_i64(),
            "{tag} against {usage}"
        );
    }
}

#[tokio::test]
async fn the_module_tags_envoys_request_span_with_the_answers_values() {
    if !common::only_module("the module's tags on Envoy's span (ext_proc: the processor's span)") {
        return;
    }
    let stack = TracedModule::start();

    // A JSON exchange, with generation parameters set.
    stack
        .upstream
        .push(Reply::json(200, &completion("llama-3-8b")));
    let json_client = ClientSpan::new();
    let (status, body) = stack
        .post(
            &json_client,
            json!({"model": "m", "input": "a secret prompt", "temperature": 0.25,
                "top_p": 0.5, "max_output_tokens": 64}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    let span = stack.request_span(&json_client);
    module_common_tags(&span);
    assert_eq!(span.str("gen_ai.request.stream"), "false");
    assert_eq!(
        span.str("gen_ai.response.id"),
        answer["id"].as_str().unwrap()
    );
    assert_eq!(span.str("gen_ai.response.model"), "llama-3-8b");
    assert_eq!(span.str("gen_ai.response.finish_reasons"), r#"["stop"]"#);
    module_usage_tags(&span, &answer["usage"]);
    assert_eq!(
        Some(number::<f64>(&span, "gen_ai.request.temperature")),
        answer["temperature"].as_f64()
    );
    assert_eq!(
        Some(number::<f64>(&span, "gen_ai.request.top_p")),
        answer["top_p"].as_f64()
    );
    assert_eq!(
        Some(number::<i64>(&span, "gen_ai.request.max_tokens")),
        answer["max_output_tokens"].as_i64()
    );
    assert_eq!(span.attr("gen_ai.request.presence_penalty"), None);
    assert_eq!(span.str("http.response.status_code"), "200");
    assert_eq!(span.str("responses_extproc.outcome"), "translated");
    assert_eq!(span.attr("error.type"), None);
    assert_eq!(span.attr("gen_ai.response.time_to_first_chunk"), None);
    assert!(span.events.is_empty(), "{span:#?}");
    // Never the prompt or the completion.
    for (key, value) in &span.attributes {
        let text = format!("{value:?}");
        assert!(
            !text.contains("secret prompt") && !text.contains("Hello there"),
            "{key}: {text}"
        );
    }
    // The upstream's request continues Envoy's span.
    let upstream_request = stack.upstream.requests().pop().unwrap();
    assert_eq!(
        upstream_request.header("traceparent"),
        Some(format!("00-{}-{}-01", json_client.trace_id, span.span_id).as_str())
    );

    // A streamed exchange.
    stack.upstream.push(stream_reply());
    let stream_client = ClientSpan::new();
    let (status, body) = stack
        .post(
            &stream_client,
            json!({"model": "m", "input": "hi", "stream": true}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let events = parse_sse_json(&body);
    let (last, terminal) = events.last().unwrap();
    assert_eq!(last, "response.incomplete", "{body}");
    let span = stack.request_span(&stream_client);
    module_common_tags(&span);
    assert_eq!(span.str("gen_ai.request.stream"), "true");
    assert_eq!(
        span.str("gen_ai.response.id"),
        terminal["response"]["id"].as_str().unwrap()
    );
    assert_eq!(span.str("gen_ai.response.finish_reasons"), r#"["length"]"#);
    module_usage_tags(&span, &terminal["response"]["usage"]);
    assert_eq!(span.str("responses_extproc.outcome"), "translated");
    let ttfc: f64 = number(&span, "gen_ai.response.time_to_first_chunk");
    let duration = (span.end_unix_nano - span.start_unix_nano) as f64 / 1e9;
    assert!(
        ttfc > 0.0 && ttfc <= duration,
        "{ttfc} in {duration}: {span:#?}"
    );
    // The first output, as an event Envoy stamped when the module saw it.
    assert_eq!(span.events.len(), 1, "{span:#?}");
    let (name, at) = &span.events[0];
    assert_eq!(name, "first_token");
    assert!(
        span.start_unix_nano < *at && *at <= span.end_unix_nano,
        "{span:#?}"
    );
    let event_delay = (*at - span.start_unix_nano) as f64 / 1e9;
    assert!((ttfc - event_delay).abs() < 0.05, "{ttfc} vs {event_delay}");

    // An upstream error: the envelope's code.
    stack.upstream.push(Reply::json(
        429,
        &json!({"error": {"message": "slow down", "type": "rate_limit_error", "code": "rate_limited"}}),
    ));
    let error_client = ClientSpan::new();
    let (status, body) = stack
        .post(&error_client, json!({"model": "m", "input": "hi"}))
        .await;
    assert_eq!(status, 429, "{body}");
    let envelope: Value = serde_json::from_str(&body).unwrap();
    let span = stack.request_span(&error_client);
    module_common_tags(&span);
    assert_eq!(
        span.str("error.type"),
        envelope["error"]["code"].as_str().unwrap()
    );
    assert_eq!(span.str("http.response.status_code"), "429");
    assert_eq!(span.str("responses_extproc.outcome"), "failed");
    assert_eq!(span.attr("gen_ai.usage.input_tokens"), None);
}

/// A processor exporting to `endpoint` with `env` (and its metrics on), Envoy in front, one
/// translated JSON exchange through them; returns the processor (alive), Envoy and the
/// metrics URL after checking the answer.
async fn export_one(
    endpoint: &str,
    env: &[(&str, &str)],
    upstream: &ScriptedUpstream,
) -> (Processor, Envoy, String, Value) {
    let metrics_listen = format!("127.0.0.1:{}", free_port());
    let mut env = env.to_vec();
    env.push(("OTEL_BSP_SCHEDULE_DELAY", "50"));
    let processor = Processor::start_with_env(
        &[
            "--otlp-endpoint",
            endpoint,
            "--metrics-listen",
            &metrics_listen,
        ],
        &env,
    );
    let envoy = Envoy::start(upstream.port(), processor.port());
    let response = client()
        .post(envoy.url("/v1/responses"))
        .json(&json!({"model": "m", "input": "hi"}))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "{endpoint} {env:?}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["status"], "completed");
    (
        processor,
        envoy,
        format!("http://{metrics_listen}/metrics"),
        body,
    )
}

#[tokio::test]
async fn spans_go_to_an_https_collector_verified_by_the_standard_variables() {
    if !only_ext_proc(SKIP) {
        return;
    }
    let pki = common::pki::Pki::new();
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| Reply::json(200, &completion("llama-3-8b")));
    let ca = pki.arg("ca.pem");
    let (client_cert, client_key) = (pki.arg("envoy-client.pem"), pki.arg("envoy-client.key"));

    // OTLP/gRPC to a collector that asks for a client certificate (mTLS): the CA and the
    // client certificate from the standard variables.
    let receiver = OtlpReceiver::start_tls(&ReceiverTls {
        cert: pki.path("server.pem"),
        key: pki.path("server.key"),
        client_ca: Some(pki.path("ca.pem")),
    });
    assert!(receiver.endpoint().starts_with("https://"));
    let (processor, _envoy, _, body) = export_one(
        &receiver.endpoint(),
        &[
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str()),
            (
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                client_cert.as_str(),
            ),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", client_key.as_str()),
        ],
        &upstream,
    )
    .await;
    let id = body["id"].as_str().unwrap().to_owned();
    let span = receiver.wait_for("the span over gRPC and mTLS", WAIT, |s| {
        s.attr("gen_ai.response.id").and_then(Attr::str) == Some(id.as_str())
    });
    assert_eq!(
        (span.service.as_str(), span.name.as_str()),
        ("responses-extproc", "chat m")
    );
    usage_attributes(&span, &body["usage"]);
    let logs = processor.logs();
    assert!(
        logs.contains("CA from OTEL_EXPORTER_OTLP_CERTIFICATE, client certificate from OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"),
        "{logs}"
    );

    // OTLP/HTTP over TLS, the CA from the traces-only variable.
    let receiver = OtlpReceiver::start_http_tls(&ReceiverTls {
        cert: pki.path("server.pem"),
        key: pki.path("server.key"),
        client_ca: None,
    });
    let (_processor, _envoy, _, body) = export_one(
        &receiver.endpoint(),
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE", ca.as_str()),
        ],
        &upstream,
    )
    .await;
    let id = body["id"].as_str().unwrap().to_owned();
    let span = receiver.wait_for("the span over OTLP/HTTP and TLS", WAIT, |s| {
        s.attr("gen_ai.response.id").and_then(Attr::str) == Some(id.as_str())
    });
    assert_eq!(span.name, "chat m");
    usage_attributes(&span, &body["usage"]);
}

#[tokio::test]
async fn a_collector_the_processor_cannot_verify_costs_dropped_spans_never_exchanges() {
    if !only_ext_proc(SKIP) {
        return;
    }
    let pki = common::pki::Pki::new();
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| Reply::json(200, &completion("llama-3-8b")));
    let other_ca = pki.arg("other-ca.pem");
    let ca = pki.arg("ca.pem");
    let server = |client_ca: Option<PathBuf>| ReceiverTls {
        cert: pki.path("server.pem"),
        key: pki.path("server.key"),
        client_ca,
    };
    for (what, receiver, env) in [
        (
            "gRPC, the collector's certificate from another CA",
            OtlpReceiver::start_tls(&server(None)),
            vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", other_ca.as_str())],
        ),
        (
            "gRPC, the collector asks for a client certificate we do not have",
            OtlpReceiver::start_tls(&server(Some(pki.path("ca.pem")))),
            vec![("OTEL_EXPORTER_OTLP_CERTIFICATE", ca.as_str())],
        ),
        (
            "OTLP/HTTP, the collector's certificate from another CA",
            OtlpReceiver::start_http_tls(&server(None)),
            vec![
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", other_ca.as_str()),
            ],
        ),
    ] {
        let started = std::time::Instant::now();
        let (processor, envoy, metrics, _) =
            export_one(&receiver.endpoint(), &env, &upstream).await;
        // More exchanges, all answered in time.
        for _ in 0..3 {
            let response = client()
                .post(envoy.url("/v1/responses"))
                .json(&json!({"model": "m", "input": "again"}))
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200, "{what}");
        }
        let deadline = std::time::Instant::now() + WAIT;
        while dropped(&metrics, "export_failed").await < 1.0 {
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: no failed export counted:\n{}",
                processor.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(started.elapsed() < WAIT, "{what}");
        assert!(
            receiver.spans().is_empty(),
            "{what}: {:#?}",
            receiver.spans()
        );
        let logs = processor.logs();
        assert!(logs.contains("trace export failed"), "{what}: {logs}");
    }
}

/// Module mode: each WebSocket response is a span of its own, a child of Envoy's span for the
/// upgrade (the ABI's child spans), with the exchange's attributes; a refused message too,
/// saying why. Each response's Chat request carries its span's context, so Envoy's span for
/// it, on the internal listener it enters, is that span's child.
#[tokio::test]
async fn the_modules_websocket_responses_are_child_spans_of_envoys_upgrade_span() {
    if !common::only_module("the module's child spans (ext_proc: the processor's spans)") {
        return;
    }
    let stack = TracedModule::start();
    stack.upstream.push(stream_reply());
    let client_span = ClientSpan::new();
    let mut request = format!("ws://127.0.0.1:{}/v1/responses", stack.envoy.port())
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("traceparent", client_span.traceparent().parse().unwrap());
    let (mut socket, response) = tokio_tungstenite::connect_async(request).await.unwrap();
    assert_eq!(response.status(), 101);
    socket
        .send(Message::text(
            json!({"type": "response.create", "model": "m", "input": "a secret prompt",
                   "temperature": 0.5})
            .to_string(),
        ))
        .await
        .unwrap();
    let first = ws_response(&mut socket).await;
    let terminal = first.last().unwrap();
    assert_eq!(terminal["type"], "response.incomplete", "{first:?}");
    socket
        .send(Message::text(r#"{"type":"response.cancel"}"#))
        .await
        .unwrap();
    let refused = ws_response(&mut socket).await;
    assert_eq!(refused.last().unwrap()["type"], "error");
    socket.close(None).await.unwrap();
    drop(socket);

    let upgrade = stack.request_span(&client_span);
    let response_span = stack.receiver.wait_for("the response's span", WAIT, |s| {
        s.parent_span_id == upgrade.span_id && s.name == "chat m"
    });
    assert_eq!(response_span.trace_id, client_span.trace_id);
    module_common_tags_as(&response_span, "websocket");
    assert_eq!(
        response_span.str("gen_ai.response.id"),
        terminal["response"]["id"].as_str().unwrap()
    );
    module_usage_tags(&response_span, &terminal["response"]["usage"]);
    assert_eq!(
        Some(number::<f64>(&response_span, "gen_ai.request.temperature")),
        Some(0.5)
    );
    assert_eq!(response_span.events.len(), 1, "{response_span:#?}");
    assert_eq!(response_span.events[0].0, "first_token");
    for (key, value) in &response_span.attributes {
        assert!(!format!("{value:?}").contains("secret prompt"), "{key}");
    }
    let refused_span = stack
        .receiver
        .wait_for("the refused message's span", WAIT, |s| {
            s.parent_span_id == upgrade.span_id && s.name == "chat"
        });
    assert_eq!(refused_span.str("error.type"), "unknown_event_type");
    assert_eq!(refused_span.str("http.response.status_code"), "400");
    // Envoy's span for the Chat request, on the internal listener, continues the response's.
    let chat = stack
        .receiver
        .wait_for("Envoy's span for the Chat request", WAIT, |s| {
            s.parent_span_id == response_span.span_id
        });
    assert_eq!(chat.trace_id, client_span.trace_id);
    assert_eq!(
        stack.upstream.requests()[0].header("traceparent"),
        Some(format!("00-{}-{}-01", client_span.trace_id, chat.span_id).as_str())
    );
}

/// [`module_common_tags`] for a transport.
fn module_common_tags_as(span: &RecordedSpan, transport: &str) {
    assert_eq!(span.str("gen_ai.operation.name"), "chat");
    assert_eq!(span.str("gen_ai.provider.name"), "openai");
    assert_eq!(span.str("gen_ai.request.model"), "m");
    assert_eq!(span.str("responses_extproc.operation"), "create");
    assert_eq!(span.str("responses_extproc.transport"), transport);
}
