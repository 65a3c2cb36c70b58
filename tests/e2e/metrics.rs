//! Metrics end to end, through the real Envoy: the same exchanges (JSON, a stream, an upstream
//! error, a refused request, a cap, a compaction, a model past the label bound, a WebSocket
//! connection with one response, closed by the client) in either mode show the same families
//! (`responses_core::metrics`: the GenAI conventions' instruments and ours), under the mode's
//! prefix: the processor's Prometheus endpoint (`--metrics-listen`, `responses_extproc_*`), or
//! Envoy's own stats in module mode (`/stats/prometheus`, `envoy_responses_module_*`). What
//! the same instruments push over OTLP is `tests/e2e/otlp_metrics.rs`.
//!
//! Then both modes side by side: the two exports carry the same families with the same types,
//! label names, buckets, counts and token sums; and the Grafana dashboard
//! (`deploy/grafana/responses.json`) answers on both in a real Prometheus scraping them.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;
use std::time::Duration;

use common::prom::Export;
use common::prometheus::{Prometheus, Target};
use common::websocket::recv;
use common::{client, free_port, wait_until, Mode, Reply, ScriptedUpstream, Stack};
use futures_util::{SinkExt, StreamExt};
use responses_core::metrics::{prometheus_name, Kind, Metric};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

/// The shared settings of every run here: few input items (a cap to hit) and two model
/// names as label values (a third is `other`).
const ARGS: &[&str] = &["--max-input-items", "4", "--metrics-max-models", "2"];

/// The prefix of the schema's families in a mode's export.
fn prefix(mode: Mode) -> &'static str {
    match mode {
        Mode::ExtProc => responses_extproc::metrics::PREFIX,
        // Envoy's `envoy_`, then the filter's metrics_namespace (envoy/envoy-module.yaml).
        Mode::Module => "envoy_responses_module_",
    }
}

fn chat(model: &str, usage: Value) -> Value {
    json!({"id": "c1", "object": "chat.completion", "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "yo"}}],
        "usage": usage})
}

/// A stack in one mode, with a scripted upstream, that runs the exchanges of this file.
struct Running {
    mode: Mode,
    // Drop order: Envoy (and the processor), then the upstream.
    stack: Stack,
    upstream: ScriptedUpstream,
    /// The processor's metrics listener (ext_proc mode).
    metrics_port: u16,
}

/// How many exchanges one round makes over HTTP (then one over the WebSocket transport).
const ROUND: usize = 7;

impl Running {
    fn start(mode: Mode) -> Running {
        let upstream = ScriptedUpstream::start();
        let metrics_port = free_port();
        let listen = format!("127.0.0.1:{metrics_port}");
        let mut args = ARGS.to_vec();
        if mode == Mode::ExtProc {
            args.extend(["--metrics-listen", &listen]);
        }
        // The WebSocket transport too: the processor's listener, or the module alone.
        let stack = Stack::with_websocket_in(mode, upstream.port(), &args, |c| c);
        Running {
            mode,
            stack,
            upstream,
            metrics_port,
        }
    }

    /// Where the mode's export is scraped: (port, path).
    fn target(&self) -> (u16, &'static str) {
        match self.mode {
            Mode::ExtProc => (self.metrics_port, "/metrics"),
            Mode::Module => (self.stack.envoy.admin_port(), "/stats/prometheus"),
        }
    }

    fn fetch(&self) -> String {
        let (port, path) = self.target();
        let (status, text) = common::envoy::http_get(port, path).expect("the export answers");
        assert_eq!(status, 200, "{path}");
        text
    }

    /// One round of the exchanges, each answered as expected.
    async fn round(&self) {
        let (mode, envoy, upstream) = (self.mode, &self.stack.envoy, &self.upstream);
        upstream.push(Reply::json(
            200,
            &chat(
                "llama-3-8b",
                json!({"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30,
                    "prompt_tokens_details": {"cached_tokens": 16},
                    "completion_tokens_details": {"reasoning_tokens": 4}}),
            ),
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
        upstream.push(Reply::json(
            200,
            &chat(
                "llama-3-8b",
                json!({"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}),
            ),
        ));
        upstream.push(Reply::json(
            200,
            &chat(
                "llama-3-8b",
                json!({"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150}),
            ),
        ));

        let five_items =
            json!(["a", "b", "c", "d", "e"].map(|t| json!({"role": "user", "content": t})));
        for (path, body, status) in [
            ("/v1/responses", json!({"model": "m", "input": "hi"}), 200),
            (
                "/v1/responses",
                json!({"model": "m", "input": "hi", "stream": true}),
                200,
            ),
            ("/v1/responses", json!({"model": "m", "input": "hi"}), 429),
            ("/v1/responses", json!({"model": "m"}), 400),
            (
                "/v1/responses",
                json!({"model": "m", "input": five_items}),
                400,
            ),
            (
                "/v1/responses/compact",
                json!({"model": "m", "input": "hi"}),
                200,
            ),
            // A third model name: past the bound of two, its label is `other`.
            ("/v1/responses", json!({"model": "z", "input": "hi"}), 200),
        ] {
            let response = client()
                .post(envoy.url(path))
                .json(&body)
                .send()
                .await
                .unwrap();
            let got = response.status();
            let text = response.text().await.unwrap();
            assert_eq!(got, status, "{mode:?} {path} {body}: {text}");
        }
        self.socket_round().await;
    }

    /// A WebSocket connection: one response, then the client's close (1000).
    async fn socket_round(&self) {
        self.upstream.push(Reply::sse([
            format!(
                "data: {}\n\n",
                json!({"id": "c3", "object": "chat.completion.chunk", "model": "llama-3-8b",
                    "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}],
                    "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})
            ),
            "data: [DONE]\n\n".to_owned(),
        ]));
        let (mut socket, response) = tokio_tungstenite::connect_async(self.stack.ws_url())
            .await
            .unwrap_or_else(|e| panic!("{:?}: the upgrade failed: {e}", self.mode));
        assert_eq!(response.status(), 101);
        let create = json!({"type": "response.create", "model": "m", "input": "hi"});
        socket
            .send(Message::text(create.to_string()))
            .await
            .unwrap();
        loop {
            let event = recv(&mut socket).await;
            if event["type"] == "response.completed" {
                break;
            }
            assert!(
                !["response.failed", "response.incomplete", "error"]
                    .contains(&event["type"].as_str().unwrap_or("")),
                "{:?}: {event}",
                self.mode
            );
        }
        socket.close(None).await.unwrap();
        // The server's close frame answers the client's: the connection is over both ways.
        while let Some(Ok(message)) = socket.next().await {
            if matches!(message, Message::Close(_)) {
                break;
            }
        }
    }

    /// The export once `rounds` rounds are in it.
    fn export_after(&self, rounds: usize) -> Export {
        let p = prefix(self.mode);
        // Each round: its HTTP exchanges, one of them a stream; the socket's response, a
        // stream too; the socket's close.
        let (all, streams) = (((ROUND + 1) * rounds) as f64, (2 * rounds) as f64);
        // Envoy's histograms reach its admin output at its stats flush (every 5 s by default).
        wait_until(
            "every exchange in the export",
            Duration::from_secs(20),
            || {
                let export = Export::parse(&self.fetch());
                let count = |name: &str| export.series(name).map(|s| s.value).sum::<f64>();
                let done = count(&format!("{p}translation_microseconds_count")) == all
                    && count(&format!("{p}time_to_first_token_milliseconds_count")) == streams
                    && count(&format!("{p}websocket_closes_total")) == rounds as f64;
                done.then_some(export)
            },
        )
    }
}

/// Runs the exchanges through a fresh stack in `mode`; returns its export once every
/// exchange is in it.
async fn exchanges(mode: Mode) -> Export {
    let running = Running::start(mode);
    running.round().await;
    running.export_after(1)
}

#[tokio::test]
async fn metrics_count_tokens_outcomes_and_stream_timings() {
    let mode = common::mode();
    let export = exchanges(mode).await;
    let p = prefix(mode);
    let name = |n: &str| format!("{p}{n}");

    let tokens = |model: &str, kind: &str| {
        export.value(
            &name("tokens_total"),
            &[
                ("gen_ai_request_model", model),
                ("gen_ai_response_model", "llama-3-8b"),
                ("gen_ai_token_type", kind),
            ],
        )
    };
    // JSON 21 + stream 5 + socket 7 in; 9 + 2 + 3 out; cached and reasoning from the JSON
    // answer only; the compaction's 3 and 1.
    assert_eq!(
        (
            tokens("m", "input"),
            tokens("m", "output"),
            tokens("m", "cached"),
            tokens("m", "reasoning")
        ),
        (36.0, 15.0, 16.0, 4.0)
    );
    // The third model name, bounded.
    assert_eq!(tokens("other", "input"), 100.0);
    let exchanges = |labels: &[(&str, &str)]| export.value(&name("exchanges_total"), labels);
    let translated = [("outcome", "translated"), ("error_code", "")];
    assert_eq!(
        exchanges(
            &[
                &translated[..],
                &[("operation", "create"), ("stream", "false")]
            ]
            .concat()
        ),
        2.0
    );
    // The HTTP stream and the socket's response.
    assert_eq!(
        exchanges(&[&translated[..], &[("stream", "true")]].concat()),
        2.0
    );
    assert_eq!(
        exchanges(&[&translated[..], &[("operation", "compact")]].concat()),
        1.0
    );
    for code in [
        "rate_limited",
        "missing_required_parameter",
        "too_many_input_items",
    ] {
        assert_eq!(
            exchanges(&[("outcome", "failed"), ("error_code", code)]),
            1.0,
            "{code}"
        );
    }
    assert_eq!(
        export.value(&name("caps_hit_total"), &[("cap", "too_many_input_items")]),
        1.0
    );
    // Each stream's first token, once; none in flight now.
    assert_eq!(
        export.value(
            &name("time_to_first_token_milliseconds_count"),
            &[("gen_ai_request_model", "m")]
        ),
        2.0
    );
    assert_eq!(
        export.value(&name("time_per_output_token_microseconds_count"), &[]),
        2.0
    );
    assert_eq!(export.value(&name("streams_in_flight"), &[]), 0.0);
    // The socket: closed by its client (1000), none open now.
    assert_eq!(
        export.value(&name("websocket_closes_total"), &[("code", "1000")]),
        1.0
    );
    assert_eq!(export.value(&name("websocket_connections"), &[]), 0.0);
    assert_eq!(
        export.value(
            &name("request_duration_milliseconds_count"),
            &[
                ("stream", "false"),
                ("outcome", "failed"),
                ("gen_ai_response_model", "")
            ]
        ),
        1.0,
        "the 429 has a model; the 400s were refused before theirs was read: they are not in \
         the model-labelled metrics"
    );
    assert_eq!(
        export.value(
            &name("translation_microseconds_count"),
            &[("stream", "false")]
        ),
        6.0
    );
    // The conventions' instruments: one token observation per type and exchange with usage
    // (JSON, stream, compaction, the third model, the socket: 5 each), the 429's error type on
    // its duration, each stream's first token and time per token.
    let genai = |family: &str, labels: &[(&str, &str)]| -> f64 {
        export
            .series(&name(family))
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    };
    for kind in ["input", "output"] {
        assert_eq!(
            genai(
                "gen_ai_client_token_usage_count",
                &[
                    ("gen_ai_token_type", kind),
                    ("gen_ai_operation_name", "chat"),
                    ("gen_ai_provider_name", "openai"),
                ]
            ),
            5.0,
            "{kind}"
        );
    }
    assert_eq!(
        genai(
            "gen_ai_server_request_duration_microseconds_count",
            &[("error_type", "rate_limited")]
        ),
        1.0
    );
    assert_eq!(
        genai(
            "gen_ai_server_request_duration_microseconds_count",
            &[("error_type", "")]
        ),
        5.0
    );
    assert_eq!(
        genai(
            "gen_ai_server_time_to_first_token_microseconds_count",
            &[("gen_ai_request_model", "m")]
        ),
        2.0
    );
    assert_eq!(
        genai(
            "gen_ai_server_time_per_output_token_microseconds_count",
            &[]
        ),
        2.0
    );
    // The schema's buckets, whichever mode (Envoy's from the bootstrap).
    for metric in [Metric::RequestDuration, Metric::ServerRequestDuration] {
        let f = metric.family();
        let le: BTreeSet<String> = export
            .series(&name(&format!("{}_bucket", f.name)))
            .map(|s| s.labels["le"].clone())
            .collect();
        let mut expected: BTreeSet<String> = f.buckets.iter().map(|b| b.to_string()).collect();
        expected.insert("+Inf".into());
        assert_eq!(le, expected, "{}", f.name);
    }
}

/// Garbage model names cannot squat the labels: 60 distinct made-up names, which the upstream
/// answers 404 `model_not_found` (as vLLM does), sent before a real model, take none of the
/// two places (`--metrics-max-models 2`); the real model and the name its upstream answers
/// with take them, and the garbage is `other`.
#[tokio::test]
async fn garbage_model_names_do_not_take_the_labels_of_real_ones() {
    const GARBAGE: usize = 60;
    let mode = common::mode();
    let upstream = ScriptedUpstream::start();
    let metrics_port = free_port();
    let listen = format!("127.0.0.1:{metrics_port}");
    let mut args = vec!["--metrics-max-models", "2"];
    if mode == Mode::ExtProc {
        args.extend(["--metrics-listen", &listen]);
    }
    let stack = Stack::start(upstream.port(), &args);
    let not_served = json!({"error": {"message": "The model does not exist.",
        "type": "NotFoundError", "param": null, "code": 404}});
    for i in 0..GARBAGE {
        upstream.push(Reply::json(404, &not_served));
        let response = client()
            .post(stack.envoy.url("/v1/responses"))
            .json(&json!({"model": format!("garbage-{i}-\u{202e}x"), "input": "hi"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 404);
    }
    upstream.push(Reply::json(
        200,
        &chat(
            "served-model",
            json!({"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}),
        ),
    ));
    let response = client()
        .post(stack.envoy.url("/v1/responses"))
        .json(&json!({"model": "gpt-5.4", "input": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);

    let p = prefix(mode);
    let count = format!("{p}request_duration_milliseconds_count");
    let (port, path) = match mode {
        Mode::ExtProc => (metrics_port, "/metrics"),
        Mode::Module => (stack.envoy.admin_port(), "/stats/prometheus"),
    };
    let export = wait_until(
        "every exchange in the export",
        Duration::from_secs(20),
        || {
            let (status, text) = common::envoy::http_get(port, path)?;
            assert_eq!(status, 200, "{path}");
            let export = Export::parse(&text);
            let all: f64 = export.series(&count).map(|s| s.value).sum();
            (all == (GARBAGE + 1) as f64).then_some(export)
        },
    );
    let models: BTreeMap<(String, String), f64> = export
        .series(&count)
        .filter(|s| s.value > 0.0)
        .map(|s| {
            let label = |l: &str| s.labels.get(l).cloned().unwrap_or_default();
            (
                (
                    label("gen_ai_request_model"),
                    label("gen_ai_response_model"),
                ),
                s.value,
            )
        })
        .fold(BTreeMap::new(), |mut m, (k, v)| {
            *m.entry(k).or_insert(0.0) += v;
            m
        });
    assert_eq!(
        models,
        BTreeMap::from([
            (("gpt-5.4".into(), "served-model".into()), 1.0),
            (("other".into(), "".into()), GARBAGE as f64),
        ]),
        "{mode:?}"
    );
}

/// Both modes' exports after the same exchanges (one run: the module's shared object must
/// be built, as `deploy/test.sh` does).
fn both() -> &'static (Export, Export) {
    static BOTH: OnceLock<(Export, Export)> = OnceLock::new();
    BOTH.get_or_init(|| {
        let runtime = tokio::runtime::Runtime::new().expect("a runtime");
        runtime.block_on(async {
            (
                exchanges(Mode::ExtProc).await,
                exchanges(Mode::Module).await,
            )
        })
    })
}

/// One family of an export, as far as the two modes must agree: its type, its series by
/// their labels (`le` apart) with the values that must be equal (counters' and gauges'
/// values, histograms' counts), and its histogram buckets.
#[derive(Debug, PartialEq)]
struct Family {
    kind: String,
    series: BTreeMap<BTreeMap<String, String>, f64>,
    buckets: BTreeSet<String>,
}

fn family(export: &Export, prefix: &str, name: &str) -> Option<Family> {
    let full = format!("{prefix}{name}");
    let kind = export.types.get(&full)?.clone();
    let values = if kind == "histogram" {
        format!("{full}_count")
    } else {
        full.clone()
    };
    let series = export
        .series(&values)
        .map(|s| (s.labels.clone(), s.value))
        .collect();
    let buckets = export
        .series(&format!("{full}_bucket"))
        .map(|s| s.labels["le"].clone())
        .collect();
    Some(Family {
        kind,
        series,
        buckets,
    })
}

#[test]
fn both_modes_export_the_same_families() {
    if common::mode() == Mode::Module {
        // It starts both modes itself: once is enough.
        eprintln!("skipped in module mode: the ext_proc run compares both modes");
        return;
    }
    let (extproc, module) = both();
    let (pe, pm) = (prefix(Mode::ExtProc), prefix(Mode::Module));
    // Only an automatic compaction records this one, which these exchanges do not make (both
    // modes' are checked by tests/e2e/context_management.rs).
    let unrecorded = [Metric::Compactions];
    for metric in Metric::ALL.into_iter().filter(|m| !unrecorded.contains(m)) {
        let f = metric.family();
        let e = family(extproc, pe, f.name).unwrap_or_else(|| panic!("ext_proc: no {}", f.name));
        let m = family(module, pm, f.name).unwrap_or_else(|| panic!("module: no {}", f.name));
        assert_eq!(e.kind, f.kind.as_str(), "{}", f.name);
        for series in e.series.keys() {
            let mut names: Vec<&str> = series.keys().map(String::as_str).collect();
            names.sort_unstable();
            // `gen_ai.request.model` is `gen_ai_request_model` in both exports.
            let mut schema: Vec<String> = f.labels.iter().map(|l| prometheus_name(l)).collect();
            schema.sort_unstable();
            assert_eq!(names, schema, "{}: the schema's labels", f.name);
        }
        if f.kind == Kind::Histogram {
            assert_eq!(e.buckets.len(), f.buckets.len() + 1, "{}", f.name);
        }
        assert_eq!(e, m, "{}: ext_proc, then module", f.name);
    }
    // Nothing else under the module's prefix; the processor's own families besides.
    let schema: BTreeSet<String> = Metric::ALL
        .iter()
        .map(|m| m.family().name.to_owned())
        .collect();
    let recorded: BTreeSet<String> = Metric::ALL
        .iter()
        .filter(|m| !unrecorded.contains(m))
        .map(|m| m.family().name.to_owned())
        .collect();
    assert_eq!(module.families(pm), recorded);
    let own: BTreeSet<String> = extproc.families(pe).difference(&schema).cloned().collect();
    let processor_only = ["spans_exported_total", "spans_dropped_total"];
    assert!(
        own.iter().all(|f| processor_only.contains(&f.as_str())),
        "{own:?}"
    );
}

/// The dashboard's queries: every panel's, and its variables' (name → query, regex).
struct Dashboard {
    panels: Vec<(String, String)>,
    variables: BTreeMap<String, (String, Value)>,
}

fn dashboard() -> Dashboard {
    let text = std::fs::read_to_string(common::repo_root().join("deploy/grafana/responses.json"))
        .expect("deploy/grafana/responses.json");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut panels = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("a PromQL expr").to_owned();
            panels.push((panel["title"].as_str().unwrap_or("").to_owned(), expr));
        }
    }
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_owned(),
                (
                    v["query"]["query"].as_str().unwrap().to_owned(),
                    v["regex"].clone(),
                ),
            )
        })
        .collect();
    Dashboard { panels, variables }
}

/// The dashboard against a real Prometheus scraping both modes' exports at once: its
/// variables find each mode's prefix and the models, and every panel's query, with Grafana's
/// variables filled in as Grafana fills them, answers for each mode with values (rates above
/// zero, finite quantiles). Two rounds of the exchanges, a scrape between them, so that rates
/// have an increase to see.
#[test]
fn the_dashboard_answers_in_prometheus_on_both_exports() {
    if common::mode() == Mode::Module {
        eprintln!("skipped in module mode: the ext_proc run checks both modes");
        return;
    }
    let dashboard = dashboard();
    assert!(dashboard.panels.len() >= 10, "{:?}", dashboard.panels);
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    runtime.block_on(async {
        let modes = [Running::start(Mode::ExtProc), Running::start(Mode::Module)];
        let targets: Vec<Target<'_>> = modes
            .iter()
            .map(|r| {
                let (port, path) = r.target();
                Target {
                    job: prefix(r.mode).trim_end_matches('_'),
                    port,
                    path,
                }
            })
            .collect();
        let alerts = common::repo_root().join("deploy/prometheus/alerts.yaml");
        let prometheus = Prometheus::start_with_rules(&targets, &[&alerts]);
        for rounds in 1..=2 {
            for running in &modes {
                running.round().await;
                running.export_after(rounds);
            }
            // Scraped, in both modes, once each export holds this round.
            for running in &modes {
                let expr = format!(
                    "sum({}translation_microseconds_count)",
                    prefix(running.mode)
                );
                let want = ((ROUND + 1) * rounds) as f64;
                let mut scraped = false;
                for _ in 0..100 {
                    let samples = prometheus.query(&expr).await;
                    if samples.first().is_some_and(|s| s.value == want) {
                        scraped = true;
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                assert!(scraped, "{expr} never {want}:\n{}", prometheus.logs());
            }
        }

        // `prefix`: what precedes each name ending in streams_in_flight.
        let (anchor, regex) = &dashboard.variables["prefix"];
        assert_eq!(
            (anchor.as_str(), regex.as_str()),
            (
                "metrics(streams_in_flight$)",
                Some("/^(.*)streams_in_flight$/")
            )
        );
        let prefixes: BTreeSet<String> = prometheus
            .label_values("__name__", None)
            .await
            .iter()
            .filter_map(|n| n.strip_suffix("streams_in_flight").map(str::to_owned))
            .collect();
        let want: BTreeSet<String> = modes.iter().map(|r| prefix(r.mode).to_owned()).collect();
        assert_eq!(prefixes, want);

        let (models, _) = &dashboard.variables["model"];
        let (metric, label) = models
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .and_then(|q| q.split_once(", "))
            .unwrap_or_else(|| panic!("label_values(metric, label): {models}"));
        for p in &prefixes {
            let found = prometheus
                .label_values(label, Some(&metric.replace("${prefix}", p)))
                .await;
            assert_eq!(found, ["m", "other"], "{p}: {models}");
        }

        for p in &prefixes {
            for (title, expr) in &dashboard.panels {
                // A multi-value variable at "All" is its allValue; the rate interval is the
                // window Grafana picks for a short range at this scrape interval or more.
                let filled = expr
                    .replace("${prefix}", p)
                    .replace("$model", ".*")
                    .replace("$__rate_interval", "1m");
                assert!(
                    !filled.contains('$'),
                    "{title}: a variable left in {filled}"
                );
                let samples = prometheus.query(&filled).await;
                assert!(!samples.is_empty(), "{title}: no answer to {filled}");
                if filled.contains("streams_in_flight") {
                    assert!(
                        samples.iter().all(|s| s.value == 0.0),
                        "{title}: {samples:?}"
                    );
                } else {
                    assert!(
                        samples.iter().any(|s| s.value.is_finite() && s.value > 0.0),
                        "{title}: {filled} answers no value above zero: {samples:?}"
                    );
                }
            }
        }

        // The alert rules (deploy/prometheus/alerts.yaml): each evaluated without error, and
        // each name it selects in both exports.
        let jobs: BTreeSet<String> = targets.iter().map(|t| t.job.to_owned()).collect();
        let mut evaluated = Vec::new();
        for _ in 0..100 {
            evaluated = prometheus.rules().await;
            if !evaluated.is_empty()
                && evaluated.iter().all(|r| {
                    !r["lastEvaluation"]
                        .as_str()
                        .unwrap_or("")
                        .starts_with("0001")
                })
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(evaluated.len() >= 6, "{evaluated:?}");
        for rule in &evaluated {
            let name = rule["name"].as_str().unwrap_or("");
            assert_eq!(rule["health"], "ok", "{name}: {rule}");
            let query = rule["query"].as_str().expect("a query");
            let names: Vec<&str> = query
                .split("__name__=~\"")
                .skip(1)
                .map(|rest| rest.split('"').next().unwrap())
                .collect();
            assert!(!names.is_empty(), "{name}: {query}");
            for pattern in names {
                let found: BTreeSet<String> = prometheus
                    .query(&format!("count by (job) ({{__name__=~\"{pattern}\"}})"))
                    .await
                    .iter()
                    .filter_map(|s| s.labels.get("job")?.as_str().map(str::to_owned))
                    .collect();
                assert_eq!(found, jobs, "{name}: {pattern}");
            }
        }
    });
}
