use super::*;
use std::collections::HashMap;

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| vars.get(name).cloned()
}

fn resolve(flag: Option<&str>, signal: Signal, vars: &[(&str, &str)]) -> Option<Destination> {
    Destination::resolve(flag, signal, env(vars)).unwrap()
}

/// One endpoint turns both signals on; each has its own variables and its own off switch.
#[test]
fn one_endpoint_for_both_signals_each_with_its_own_variables() {
    for signal in [Signal::Traces, Signal::Metrics] {
        assert!(resolve(None, signal, &[]).is_none());
        let to = resolve(Some("http://collector:4317"), signal, &[]).unwrap();
        assert_eq!(
            (to.protocol, to.used.as_str()),
            (Protocol::Grpc, "http://collector:4317")
        );
        let all = [("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")];
        assert_eq!(resolve(None, signal, &all).unwrap().used, "http://c:4318");
        // Off for everything, or for this signal.
        let off = [("OTEL_SDK_DISABLED", "true")];
        assert!(resolve(Some("http://c:4317"), signal, &off).is_none());
    }
    let metrics_only = [("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:4317")];
    assert!(resolve(None, Signal::Traces, &metrics_only).is_none());
    assert_eq!(
        resolve(None, Signal::Metrics, &metrics_only).unwrap().used,
        "http://m:4317"
    );
    let no_metrics = [("OTEL_METRICS_EXPORTER", "none")];
    assert!(resolve(Some("http://c:4317"), Signal::Metrics, &no_metrics).is_none());
    assert!(resolve(Some("http://c:4317"), Signal::Traces, &no_metrics).is_some());
    // Each signal's protocol, then the shared one; OTLP/HTTP posts under the base URL.
    let http = [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL", "http/protobuf"),
    ];
    let to = resolve(Some("http://c:4318/"), Signal::Metrics, &http).unwrap();
    assert_eq!(to.protocol, Protocol::HttpProtobuf);
    assert_eq!(to.http_url().as_deref(), Some("http://c:4318/v1/metrics"));
    let traces = resolve(Some("http://c:4318"), Signal::Traces, &http).unwrap();
    assert_eq!(traces.protocol, Protocol::Grpc);
    assert_eq!(
        traces.http_url().as_deref(),
        Some("http://c:4318/v1/traces")
    );
    // Without the flag the exporter finds its URL itself.
    assert_eq!(
        resolve(None, Signal::Metrics, &metrics_only)
            .unwrap()
            .http_url(),
        None
    );
}

#[test]
fn bad_settings_are_refused_naming_them() {
    let err = Destination::resolve(Some("collector:4317"), Signal::Metrics, env(&[])).unwrap_err();
    assert!(
        err.contains("--otlp-endpoint collector:4317: expected http://host:port or https://"),
        "{err}"
    );
    let err = Destination::resolve(
        None,
        Signal::Metrics,
        env(&[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "ftp://c")]),
    )
    .unwrap_err();
    assert!(
        err.starts_with("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT ftp://c"),
        "{err}"
    );
    let err = Destination::resolve(
        Some("http://c:4317"),
        Signal::Metrics,
        env(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")]),
    )
    .unwrap_err();
    assert!(
        err.contains("exports metrics over grpc or http/protobuf"),
        "{err}"
    );
}
