use super::*;
use crate::otlp::Signal;
use std::collections::HashMap;

fn env(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| vars.get(name).cloned()
}

#[test]
fn wrong_files_are_refused_at_startup_naming_the_variable() {
    let dir = std::env::temp_dir().join(format!("otlp-tls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let not_pem = dir.join("not.pem");
    std::fs::write(&not_pem, "not a certificate\n").unwrap();
    let not_pem = not_pem.to_str().unwrap();
    let err = ExportTls::from_env(
        Signal::Traces,
        env(&[("OTEL_EXPORTER_OTLP_CERTIFICATE", not_pem)]),
    )
    .unwrap_err();
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_CERTIFICATE") && err.contains("no PEM certificate"),
        "{err}"
    );
    let err = ExportTls::from_env(
        Signal::Traces,
        env(&[(
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "/nonexistent/ca.pem",
        )]),
    )
    .unwrap_err();
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE=/nonexistent/ca.pem"),
        "{err}"
    );
    let err = ExportTls::from_env(
        Signal::Traces,
        env(&[("OTEL_EXPORTER_OTLP_CLIENT_KEY", not_pem)]),
    )
    .unwrap_err();
    assert!(err.contains("needs its key"), "{err}");
    // Metrics read their own variables first, then the shared ones; never the traces'.
    let err = ExportTls::from_env(
        Signal::Metrics,
        env(&[
            (
                "OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE",
                "/nonexistent/m.pem",
            ),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", not_pem),
        ]),
    )
    .unwrap_err();
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_METRICS_CERTIFICATE=/nonexistent/m.pem"),
        "{err}"
    );
    let err = ExportTls::from_env(
        Signal::Metrics,
        env(&[
            (
                "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
                "/nonexistent/t.pem",
            ),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", not_pem),
        ]),
    )
    .unwrap_err();
    assert!(
        err.contains("OTEL_EXPORTER_OTLP_CERTIFICATE") && err.contains("no PEM certificate"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
