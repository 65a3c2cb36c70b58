//! Metrics end to end, through the real Envoy: the same exchanges (JSON, a stream, an upstream
//! error, a refused request, a cap, a compaction, a model past the label bound) in either mode
//! show the same families (`responses_core::metrics`), under the mode's prefix: the
//! processor's Prometheus endpoint (`--metrics-listen`, `responses_extproc_*`), or Envoy's own
//! stats in module mode (`/stats/prometheus`, `envoy_responses_module_*`).
//!
//! Then both modes side by side, in one test: the two exports carry the same families with
//! the same types, label names, buckets, counts and token sums; and every metric the Grafana
//! dashboard (`deploy/grafana/responses.json`) queries is in both.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;
use std::time::Duration;

use common::prom::Export;
use common::{client, free_port, wait_until, Mode, Reply, ScriptedUpstream, Stack};
use responses_core::metrics::{Kind, Metric};
use serde_json::{json, Value};

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

/// Runs the exchanges through a fresh stack in `mode`; returns its export once every
/// exchange is in it.
async fn exchanges(mode: Mode) -> Export {
    let upstream = ScriptedUpstream::start();
    let metrics_port = free_port();
    let listen = format!("127.0.0.1:{metrics_port}");
    let mut args = ARGS.to_vec();
    if mode == Mode::ExtProc {
        args.extend(["--metrics-listen", &listen]);
    }
    let stack = Stack::start_in(mode, upstream.port(), &args, |c| c);
    let envoy = &stack.envoy;

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

    let p = prefix(mode);
    let fetch = || match mode {
        Mode::ExtProc => {
            let (status, text) = common::envoy::http_get(metrics_port, "/metrics")
                .expect("the metrics listener answers");
            assert_eq!(status, 200);
            text
        }
        Mode::Module => {
            common::envoy::http_get(envoy.admin_port(), "/stats/prometheus")
                .expect("the admin API answers")
                .1
        }
    };
    // Envoy's histograms reach its admin output at its stats flush (every 5 s by default).
    wait_until(
        "every exchange in the export",
        Duration::from_secs(20),
        || {
            let export = Export::parse(&fetch());
            let count = |name: &str| export.series(name).map(|s| s.value).sum::<f64>();
            let done = count(&format!("{p}translation_microseconds_count")) == 7.0
                && count(&format!("{p}time_to_first_token_milliseconds_count")) == 1.0;
            done.then_some(export)
        },
    )
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
    // JSON 21 + stream 5 in; 9 + 2 out; cached and reasoning from the JSON answer only; the
    // compaction's 3 and 1.
    assert_eq!(
        (
            tokens("m", "input"),
            tokens("m", "output"),
            tokens("m", "cached"),
            tokens("m", "reasoning")
        ),
        (29.0, 12.0, 16.0, 4.0)
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
    assert_eq!(
        exchanges(&[&translated[..], &[("stream", "true")]].concat()),
        1.0
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
    // The stream's first token, once; none in flight now.
    assert_eq!(
        export.value(
            &name("time_to_first_token_milliseconds_count"),
            &[("gen_ai_request_model", "m")]
        ),
        1.0
    );
    assert_eq!(
        export.value(&name("time_per_output_token_microseconds_count"), &[]),
        1.0
    );
    assert_eq!(export.value(&name("streams_in_flight"), &[]), 0.0);
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
    // The schema's buckets, whichever mode (Envoy's from the bootstrap).
    let le: BTreeSet<String> = export
        .series(&name("request_duration_milliseconds_bucket"))
        .map(|s| s.labels["le"].clone())
        .collect();
    let mut expected: BTreeSet<String> = Metric::RequestDuration
        .family()
        .buckets
        .iter()
        .map(|b| b.to_string())
        .collect();
    expected.insert("+Inf".into());
    assert_eq!(le, expected);
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
    for metric in Metric::ALL {
        let f = metric.family();
        let e = family(extproc, pe, f.name).unwrap_or_else(|| panic!("ext_proc: no {}", f.name));
        let m = family(module, pm, f.name).unwrap_or_else(|| panic!("module: no {}", f.name));
        assert_eq!(e.kind, f.kind.as_str(), "{}", f.name);
        for series in e.series.keys() {
            let mut names: Vec<&str> = series.keys().map(String::as_str).collect();
            names.sort_unstable();
            let mut schema = f.labels.to_vec();
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
    assert_eq!(module.families(pm), schema);
    let own: BTreeSet<String> = extproc.families(pe).difference(&schema).cloned().collect();
    let processor_only = [
        "websocket_connections",
        "spans_exported_total",
        "spans_dropped_total",
    ];
    assert!(
        own.iter().all(|f| processor_only.contains(&f.as_str())),
        "{own:?}"
    );
}

/// The metric names a PromQL expression of the dashboard uses, less its `${prefix}`.
fn queried(expr: &str) -> Vec<String> {
    expr.split("${prefix}")
        .skip(1)
        .map(|rest| {
            rest.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

#[test]
fn the_dashboards_queries_work_on_both_exports() {
    if common::mode() == Mode::Module {
        eprintln!("skipped in module mode: the ext_proc run checks both modes");
        return;
    }
    let text = std::fs::read_to_string(common::repo_root().join("deploy/grafana/responses.json"))
        .expect("deploy/grafana/responses.json");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(target["expr"].as_str().expect("a PromQL expr").to_owned());
        }
    }
    assert!(exprs.len() >= 10, "{exprs:?}");
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("variables");
    let query = |name: &str| {
        let v = variables
            .iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("a variable {name}"));
        (
            v["query"]["query"].as_str().unwrap().to_owned(),
            v["regex"].clone(),
        )
    };
    let (model, _) = query("model");
    exprs.push(model);
    let (extproc, module) = both();
    // `prefix` is what precedes the one name ending in streams_in_flight, in either export.
    let (anchor, regex) = query("prefix");
    assert_eq!(
        (anchor.as_str(), regex.as_str()),
        (
            "metrics(streams_in_flight$)",
            Some("/^(.*)streams_in_flight$/")
        )
    );
    for (mode, export) in [(Mode::ExtProc, extproc), (Mode::Module, module)] {
        let prefixes: Vec<&str> = export
            .types
            .keys()
            .filter_map(|name| name.strip_suffix("streams_in_flight"))
            .collect();
        assert_eq!(prefixes, [prefix(mode)], "{mode:?}");
    }
    for expr in &exprs {
        let names = queried(expr);
        assert!(!names.is_empty(), "{expr}: no ${{prefix}} metric");
        for name in names {
            for (mode, export) in [(Mode::ExtProc, extproc), (Mode::Module, module)] {
                let full = format!("{}{name}", prefix(mode));
                assert!(
                    export.series(&full).next().is_some(),
                    "{expr}: {full} is not in the {mode:?} export"
                );
            }
        }
    }
}
