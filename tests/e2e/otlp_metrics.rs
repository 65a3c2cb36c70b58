//! Metrics pushed over OTLP, through the real Envoy, to a real OTLP receiver
//! (`tests/common/otlp.rs`): the processor's own push (`--otlp-endpoint`, ext_proc mode), or
//! Envoy's OpenTelemetry stat sink as `envoy/envoy-module.yaml` configures it (module mode).
//! Either way the four GenAI semantic conventions' instruments arrive under their names, with
//! their attributes, and with the values the client saw: the usage of a JSON answer, a stream
//! and a WebSocket turn, and their timings, which the upstream's scripted pauses bound from
//! below and the client's own clock from above.
//!
//! What differs by mode, and is checked as such: the processor sends the conventions' units
//! (seconds, `{token}`) and their bucket boundaries, and leaves out an attribute with no value
//! (`error.type` of an answer that went well); Envoy's sink sends no unit, the durations in
//! whole microseconds with the schema's microsecond bounds, Envoy's histogram sums as its
//! bins' midpoints (two significant digits), and every tag, empty ones included.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::envoy::{self, Ports};
use common::otlp::{OtlpReceiver, Point, RecordedPoint};
use common::websocket::recv;
use common::{
    client, free_port, repo_root, Envoy, Mode, Processor, Reply, ScriptedUpstream, Stack,
};
use futures_util::SinkExt;
use responses_core::metrics::Metric;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// The upstream's pause between two chunks: each stream's first output comes one pause after
/// its first chunk, and its last chunk three pauses after that.
const PAUSE: Duration = Duration::from_millis(150);
/// How long the exports may take to show every exchange.
const WAIT: Duration = Duration::from_secs(30);

const TOKEN_USAGE: &str = "gen_ai.client.token.usage";
const REQUEST_DURATION: &str = "gen_ai.server.request.duration";
const TIME_TO_FIRST_TOKEN: &str = "gen_ai.server.time_to_first_token";
const TIME_PER_OUTPUT_TOKEN: &str = "gen_ai.server.time_per_output_token";

/// A translating Envoy pushing its metrics to `receiver`, in `mode`, with the WebSocket
/// transport.
struct Pushed {
    mode: Mode,
    // Drop order: Envoy (and the processor), then the upstream and the receiver.
    stack: Stack,
    upstream: ScriptedUpstream,
    receiver: OtlpReceiver,
}

impl Pushed {
    fn start(mode: Mode, receiver: OtlpReceiver) -> Pushed {
        let upstream = ScriptedUpstream::start();
        let stack = match mode {
            Mode::ExtProc => {
                let (listener, ws, calls) = (free_port(), free_port(), free_port());
                let ws_listen = format!("127.0.0.1:{ws}");
                // The processor's own Chat requests enter Envoy's listener responses_calls.
                let ws_upstream = format!("http://127.0.0.1:{calls}");
                let endpoint = receiver.endpoint();
                let mut env = vec![("OTEL_METRIC_EXPORT_INTERVAL", "250")];
                if receiver.is_http() {
                    env.push(("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"));
                }
                let processor = Processor::start_with_env(
                    &[
                        "--ws-listen",
                        &ws_listen,
                        "--ws-upstream",
                        &ws_upstream,
                        "--otlp-endpoint",
                        &endpoint,
                    ],
                    &env,
                );
                let config = std::fs::read_to_string(repo_root().join("envoy/envoy.yaml"))
                    .expect("envoy/envoy.yaml");
                let config = envoy::substitute_ports(
                    &config,
                    "envoy/envoy.yaml",
                    Ports {
                        upstream: upstream.port(),
                        extproc: processor.port(),
                        listener,
                        ws,
                        calls,
                        otlp: 1,
                    },
                );
                Stack {
                    envoy: Envoy::start_with_config(&config),
                    processor: Some(processor),
                }
            }
            Mode::Module => {
                let config = common::stack::module_bootstrap(
                    "{}",
                    Ports {
                        upstream: upstream.port(),
                        extproc: 0,
                        listener: 0,
                        ws: 1,
                        calls: 0,
                        otlp: receiver.port(),
                    },
                );
                // Envoy's stats flush (and so the sink's export) every second, not every 5.
                assert!(!config.contains("stats_flush_interval"));
                let config = config + "stats_flush_interval: 1s\n";
                Stack {
                    envoy: Envoy::start_with_config(&config),
                    processor: None,
                }
            }
        };
        Pushed {
            mode,
            stack,
            upstream,
            receiver,
        }
    }
}

/// What the client saw of one exchange: the usage it got, and its own clock's bounds on the
/// server's times.
#[derive(Debug)]
struct Seen {
    model: &'static str,
    upstream_model: &'static str,
    input_tokens: u64,
    output_tokens: u64,
    /// From sending the request to the end of the answer, on the client's clock.
    total: Duration,
    /// Streams: from sending the request to the first output event.
    first_output: Option<Duration>,
    /// The least the server's times can be: the upstream's pauses.
    least_total: Duration,
    least_first: Duration,
}

impl Seen {
    /// A [`paused_stream`] the client saw: the usage of its completed response, its clocks.
    fn stream(
        model: &'static str,
        upstream_model: &'static str,
        usage: &Value,
        total: Duration,
        first_output: Option<Duration>,
    ) -> Seen {
        Seen {
            model,
            upstream_model,
            input_tokens: usage["input_tokens"].as_u64().unwrap(),
            output_tokens: usage["output_tokens"].as_u64().unwrap(),
            total,
            first_output,
            // The terminal event comes after `[DONE]`, five pauses after the first chunk.
            least_total: PAUSE * 5,
            least_first: PAUSE,
        }
    }
}

fn chunk(model: &str, delta: Value, finish: Value) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    )
}

/// A stream whose first output comes one [`PAUSE`] after its first chunk (the role), and
/// whose end three more pauses later: "Hel", "lo" and the finish, then the usage and
/// `[DONE]`.
fn paused_stream(model: &str, input: u64, output: u64) -> Reply {
    Reply::sse([
        chunk(model, json!({"role": "assistant"}), Value::Null),
        chunk(model, json!({"content": "Hel"}), Value::Null),
        chunk(model, json!({"content": "lo"}), Value::Null),
        chunk(model, json!({}), json!("stop")),
        format!(
            "data: {}\n\n",
            json!({"id": "c", "object": "chat.completion.chunk", "model": model, "choices": [],
                "usage": {"prompt_tokens": input, "completion_tokens": output,
                          "total_tokens": input + output}})
        ),
        "data: [DONE]\n\n".to_owned(),
    ])
    .with_delay(PAUSE)
}

/// The exchanges: a JSON answer (its body in two writes, a pause apart), a stream, a 429,
/// a WebSocket turn; each with its own model name, so that each is its own series.
async fn exchanges(p: &Pushed) -> Vec<Seen> {
    let envoy = &p.stack.envoy;
    let mut seen = Vec::new();

    // JSON.
    let body = json!({"id": "c1", "object": "chat.completion", "model": "up-json",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "yo"}}],
        "usage": {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30}})
    .to_string();
    let (head, tail) = body.split_at(body.len() / 2);
    p.upstream.push(
        Reply::sse([head.to_owned(), tail.to_owned()])
            .header("content-type", "application/json")
            .with_delay(PAUSE),
    );
    let started = Instant::now();
    let response = client()
        .post(envoy.url("/v1/responses"))
        .json(&json!({"model": "json-m", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let got: Value = response.json().await.unwrap();
    let total = started.elapsed();
    seen.push(Seen {
        model: "json-m",
        upstream_model: "up-json",
        input_tokens: got["usage"]["input_tokens"].as_u64().unwrap(),
        output_tokens: got["usage"]["output_tokens"].as_u64().unwrap(),
        total,
        first_output: None,
        least_total: PAUSE,
        least_first: Duration::ZERO,
    });

    // SSE.
    p.upstream.push(paused_stream("up-sse", 5, 4));
    let started = Instant::now();
    let mut response = client()
        .post(envoy.url("/v1/responses"))
        .json(&json!({"model": "sse-m", "input": "hi", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut text = String::new();
    let mut first_output = None;
    while let Some(bytes) = response.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&bytes).unwrap());
        if first_output.is_none() && text.contains("response.output_text.delta") {
            first_output = Some(started.elapsed());
        }
    }
    let total = started.elapsed();
    let completed = text
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("event: response.completed\ndata: "))
        .next()
        .unwrap_or_else(|| panic!("a response.completed event: {text}"));
    let completed: Value = serde_json::from_str(completed).unwrap();
    let usage = &completed["response"]["usage"];
    seen.push(Seen::stream("sse-m", "up-sse", usage, total, first_output));

    // An upstream's refusal: its duration, with its error.
    p.upstream.push(Reply::json(
        429,
        &json!({"error": {"message": "slow down", "code": "rate_limited"}}),
    ));
    let response = client()
        .post(envoy.url("/v1/responses"))
        .json(&json!({"model": "err-m", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 429);

    // A WebSocket turn.
    p.upstream.push(paused_stream("up-ws", 7, 3));
    let (mut socket, response) = tokio_tungstenite::connect_async(p.stack.ws_url())
        .await
        .unwrap_or_else(|e| panic!("{:?}: the upgrade failed: {e}", p.mode));
    assert_eq!(response.status(), 101);
    let create = json!({"type": "response.create", "model": "ws-m", "input": "hi"});
    let started = Instant::now();
    socket
        .send(Message::text(create.to_string()))
        .await
        .unwrap();
    let mut first_output = None;
    let completed = loop {
        let event = recv(&mut socket).await;
        match event["type"].as_str().unwrap_or("") {
            "response.output_text.delta" if first_output.is_none() => {
                first_output = Some(started.elapsed());
            }
            "response.completed" => break event,
            "response.failed" | "response.incomplete" | "error" => panic!("{event}"),
            _ => {}
        }
    };
    let total = started.elapsed();
    let usage = &completed["response"]["usage"];
    seen.push(Seen::stream("ws-m", "up-ws", usage, total, first_output));
    socket.close(None).await.unwrap();
    seen
}

/// The latest point of `metric` for this request model (and token type), once there is one.
fn point(
    receiver: &OtlpReceiver,
    metric: &str,
    model: &str,
    token_type: Option<&str>,
) -> Option<RecordedPoint> {
    receiver.latest(metric).into_iter().find(|p| {
        p.str("gen_ai.request.model") == Some(model)
            && token_type.is_none_or(|t| p.str("gen_ai.token.type") == Some(t))
    })
}

/// A histogram point's one observation, in the conventions' unit (the module's durations
/// arrive in microseconds).
fn observed(p: &RecordedPoint, mode: Mode, seconds: bool) -> f64 {
    let (count, sum) = p.histogram();
    assert_eq!(count, 1, "one observation: {p:#?}");
    if mode == Mode::Module && seconds {
        sum / 1e6
    } else {
        sum
    }
}

/// Whether `value` (from the server) is within `[least, most]`: exactly in ext_proc mode, and
/// within Envoy's resolution in module mode (a sum is its bin's midpoint: two significant
/// digits, 5% at most). Above, [`LATE`] more: the server's clock stops after it sent the last
/// bytes, the client's once it read them, and on a busy machine the server may be scheduled
/// last (seen: 1 ms more than the client's).
fn within(mode: Mode, value: f64, least: f64, most: f64) -> bool {
    let slack = if mode == Mode::Module { 0.05 } else { 0.0 };
    value >= least * (1.0 - slack) && value <= most * (1.0 + slack) + LATE.as_secs_f64()
}

/// What the server's times may exceed the client's by (a tenth of a [`PAUSE`]: a server that
/// missed a pause, or counted one twice, is still told).
const LATE: Duration = Duration::from_millis(15);

/// Every attribute the instrument's points carry: the conventions', the empty ones aside
/// (the processor leaves them out, Envoy sends them empty).
fn keys(p: &RecordedPoint) -> BTreeSet<&str> {
    p.attributes
        .iter()
        .filter(|(_, v)| v.str() != Some(""))
        .map(|(k, _)| k.as_str())
        .collect()
}

fn check(p: &Pushed, seen: &[Seen]) {
    let mode = p.mode;
    let receiver = &p.receiver;
    // Every exchange's points, once the exports carry them all.
    receiver.wait_for_points("every exchange's GenAI points", WAIT, |r| {
        let mut ready = point(r, REQUEST_DURATION, "other", None).is_some();
        for s in seen {
            ready &= point(r, REQUEST_DURATION, s.model, None).is_some()
                && point(r, TOKEN_USAGE, s.model, Some("output")).is_some();
            if s.first_output.is_some() {
                ready &= point(r, TIME_PER_OUTPUT_TOKEN, s.model, None).is_some();
            }
        }
        ready.then_some(())
    });

    let server = [
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "gen_ai.response.model",
    ];
    let with = |extra: &'static str| {
        let mut k: BTreeSet<&str> = server.into_iter().collect();
        k.insert(extra);
        k
    };
    let (unit_s, unit_token) = match mode {
        Mode::ExtProc => ("s", "{token}"),
        // Envoy's sink sends no unit.
        Mode::Module => ("", ""),
    };
    for s in seen {
        let what = format!("{mode:?} {}", s.model);
        for (token_type, tokens) in [("input", s.input_tokens), ("output", s.output_tokens)] {
            let usage = point(receiver, TOKEN_USAGE, s.model, Some(token_type)).unwrap();
            assert_eq!(keys(&usage), with("gen_ai.token.type"), "{what}");
            assert_eq!(usage.unit, unit_token, "{what}");
            assert_eq!(usage.str("gen_ai.operation.name"), Some("chat"), "{what}");
            assert_eq!(usage.str("gen_ai.provider.name"), Some("openai"), "{what}");
            assert_eq!(usage.str("gen_ai.response.model"), Some(s.upstream_model));
            let got = observed(&usage, mode, false);
            let t = tokens as f64;
            assert!(
                within(mode, got, t, t),
                "{what}: {token_type} tokens {got}, the client saw {tokens}: {usage:#?}"
            );
            assert_bucket(&usage, mode, Metric::TokenUsage, tokens);
        }

        let duration = point(receiver, REQUEST_DURATION, s.model, None).unwrap();
        assert_eq!(keys(&duration), server.into_iter().collect(), "{what}");
        assert_eq!(duration.unit, unit_s, "{what}");
        if mode == Mode::Module {
            // Envoy's tag, empty: no error.
            assert_eq!(duration.str("error.type"), Some(""), "{what}");
        }
        let got = observed(&duration, mode, true);
        assert!(
            within(
                mode,
                got,
                s.least_total.as_secs_f64(),
                s.total.as_secs_f64()
            ),
            "{what}: request duration {got} s, not within the upstream's pauses ({:?}) and \
             the client's {:?}",
            s.least_total,
            s.total
        );

        let first = point(receiver, TIME_TO_FIRST_TOKEN, s.model, None);
        let per_token = point(receiver, TIME_PER_OUTPUT_TOKEN, s.model, None);
        let Some(client_first) = s.first_output else {
            assert!(
                first.is_none() && per_token.is_none(),
                "{what}: not a stream"
            );
            continue;
        };
        let first = first.unwrap_or_else(|| panic!("{what}: a time to first token"));
        assert_eq!(keys(&first), server.into_iter().collect(), "{what}");
        assert_eq!(first.unit, unit_s, "{what}");
        let ttft = observed(&first, mode, true);
        assert!(
            within(
                mode,
                ttft,
                s.least_first.as_secs_f64(),
                client_first.as_secs_f64()
            ),
            "{what}: time to first token {ttft} s, not within {:?} and the client's {:?}",
            s.least_first,
            client_first
        );
        // (total - first) / (output tokens - 1): at least the three pauses after the first
        // output over them, at most what the client saw between its first output and its end.
        let per_token = per_token.unwrap();
        assert_eq!(keys(&per_token), server.into_iter().collect(), "{what}");
        let tpot = observed(&per_token, mode, true);
        let after_first = (s.output_tokens - 1) as f64;
        let least = (PAUSE * 3).as_secs_f64() / after_first;
        let most = (s.total - s.least_first).as_secs_f64() / after_first;
        assert!(
            within(mode, tpot, least, most),
            "{what}: time per output token {tpot} s, not within {least} and {most}"
        );
    }

    // The upstream's 429: its error type; no tokens, no stream times. No model answered its
    // name, so the name is `other` (the label bounds, docs/operations.md).
    let failed = point(receiver, REQUEST_DURATION, "other", None).unwrap();
    assert_eq!(failed.str("error.type"), Some("rate_limited"));
    // No model answered: no gen_ai.response.model.
    let mut failed_keys = with("error.type");
    failed_keys.remove("gen_ai.response.model");
    assert_eq!(keys(&failed), failed_keys);
    assert!(point(receiver, TOKEN_USAGE, "other", Some("input")).is_none());

    // Our own families come along, under the mode's namespace.
    let own = match mode {
        Mode::ExtProc => "responses_extproc.exchanges_total",
        Mode::Module => "responses_module.exchanges_total",
    };
    let exchanges: f64 = receiver
        .latest(own)
        .iter()
        .map(|p| match p.point {
            Point::Sum { value, .. } => value,
            ref other => panic!("{own} is a sum: {other:?}"),
        })
        .sum();
    assert_eq!(exchanges, 4.0, "{own}");
}

/// The histogram's bounds are the schema's (the conventions' in the processor's push, in
/// their unit), and the one observation is in the bucket of `value`.
fn assert_bucket(p: &RecordedPoint, mode: Mode, metric: Metric, value: u64) {
    let Point::Histogram { bounds, counts, .. } = &p.point else {
        panic!("{} is a histogram", p.metric);
    };
    let f = metric.family();
    let want = match mode {
        Mode::ExtProc => f.otlp_buckets(),
        Mode::Module => f.buckets.to_vec(),
    };
    assert_eq!(bounds, &want, "{}", p.metric);
    let at = f
        .buckets
        .iter()
        .position(|b| value as f64 <= *b)
        .unwrap_or(f.buckets.len());
    let mut expected = vec![0; f.buckets.len() + 1];
    expected[at] = 1;
    assert_eq!(counts, &expected, "{} of {value}", p.metric);
}

/// The four instruments through the real Envoy in this run's mode, over OTLP/gRPC.
#[tokio::test(flavor = "multi_thread")]
async fn the_genai_instruments_arrive_over_otlp_with_what_the_client_saw() {
    let mode = common::mode();
    let pushed = Pushed::start(mode, OtlpReceiver::start());
    let seen = exchanges(&pushed).await;
    let pushed = tokio::task::spawn_blocking(move || {
        check(&pushed, &seen);
        pushed
    })
    .await
    .unwrap();
    drop(pushed);
}

/// The processor's push over OTLP/HTTP (`OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf`): the same
/// instruments at `/v1/metrics` under `--otlp-endpoint`.
#[tokio::test(flavor = "multi_thread")]
async fn the_processor_pushes_over_otlp_http_too() {
    if !common::only_ext_proc("the processor's own exporter (Envoy's sink speaks gRPC here)") {
        return;
    }
    let pushed = Pushed::start(Mode::ExtProc, OtlpReceiver::start_http());
    let seen = exchanges(&pushed).await;
    tokio::task::spawn_blocking(move || check(&pushed, &seen))
        .await
        .unwrap();
}

/// The processor's last export, at its shutdown: with an interval far longer than the test, a
/// JSON exchange's token usage reaches the receiver only because SIGTERM exports what is left.
#[tokio::test(flavor = "multi_thread")]
async fn the_processor_exports_what_is_left_when_it_stops() {
    if !common::only_ext_proc("the processor's own push") {
        return;
    }
    let receiver = OtlpReceiver::start();
    let upstream = ScriptedUpstream::start();
    let endpoint = receiver.endpoint();
    let mut processor = Processor::start_with_env(
        &["--otlp-endpoint", &endpoint, "--drain-seconds", "1"],
        &[("OTEL_METRIC_EXPORT_INTERVAL", "600000")],
    );
    let envoy = Envoy::start(upstream.port(), processor.port());
    upstream.push(Reply::json(
        200,
        &json!({"id": "c1", "object": "chat.completion", "model": "up",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "yo"}}],
            "usage": {"prompt_tokens": 13, "completion_tokens": 2, "total_tokens": 15}}),
    ));
    let response = client()
        .post(envoy.url("/v1/responses"))
        .json(&json!({"model": "last-m", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    // Ten minutes to the first export: nothing yet.
    assert!(receiver.latest(TOKEN_USAGE).is_empty());
    let status = std::process::Command::new("kill")
        .args(["-TERM", &processor.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    tokio::task::spawn_blocking(move || {
        common::wait_until("the processor to stop", WAIT, || {
            (!processor.is_running()).then_some(())
        });
        let input = point(&receiver, TOKEN_USAGE, "last-m", Some("input"))
            .unwrap_or_else(|| panic!("no token usage at the shutdown: {:?}", receiver.points()));
        assert_eq!(input.histogram(), (1, 13.0));
    })
    .await
    .unwrap();
}
