use super::*;
use responses_core::exchange::Operation;
use responses_core::openresponses::{ErrorCode, Usage};
use responses_core::translate::Params;

fn get<'a>(a: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    a.iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

/// The core's attributes (its own tests check their values) keep their types as
/// OpenTelemetry values: integers, doubles, booleans, an array of strings.
#[test]
fn attributes_keep_their_types() {
    let mut usage = Usage {
        input_tokens: 21,
        ..Usage::default()
    };
    usage.output_tokens_details.reasoning_tokens = 4;
    let summary = Summary {
        operation: Operation::Create,
        response_id: Some("resp_1".into()),
        model: Some("m".into()),
        stream: true,
        outcome: Outcome::Failed,
        status: Some(502),
        error_code: Some(ErrorCode::UpstreamStreamTruncated.into()),
        usage: Some(usage),
        upstream_model: Some("llama".into()),
        finish_reason: Some("length".into()),
        params: Params {
            temperature: Some(0.5),
            max_output_tokens: Some(64),
            ..Params::default()
        },
        streamed_output: true,
        compaction: None,
    };
    let timing = Timing {
        total: Duration::from_millis(900),
        first_output: Some(Duration::from_millis(250)),
        translation: Duration::from_micros(40),
    };
    let a = attributes(&summary, &timing);
    assert_eq!(a.len(), telemetry::attributes(&summary, &timing).len());
    assert_eq!(get(&a, "gen_ai.request.model"), Some(&Value::from("m")));
    assert_eq!(get(&a, "gen_ai.request.stream"), Some(&Value::Bool(true)));
    assert_eq!(get(&a, "gen_ai.usage.input_tokens"), Some(&Value::I64(21)));
    assert_eq!(
        get(&a, "gen_ai.usage.reasoning.output_tokens"),
        Some(&Value::I64(4))
    );
    assert_eq!(
        get(&a, "gen_ai.response.finish_reasons"),
        Some(&Value::Array(Array::String(vec!["length".into()])))
    );
    assert_eq!(
        get(&a, "gen_ai.request.temperature"),
        Some(&Value::F64(0.5))
    );
    assert_eq!(get(&a, "gen_ai.request.max_tokens"), Some(&Value::I64(64)));
    assert_eq!(
        get(&a, "gen_ai.response.time_to_first_chunk"),
        Some(&Value::F64(0.25))
    );
    assert_eq!(get(&a, "http.response.status_code"), Some(&Value::I64(502)));
    assert_eq!(
        get(&a, "error.type"),
        Some(&Value::from("upstream_stream_truncated"))
    );
}

#[test]
fn off_by_default() {
    let config = Config::default();
    assert!(config.otlp_endpoint.is_none() && !config.trace_content);
    let standard = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ];
    if standard.iter().all(|v| std::env::var_os(v).is_none()) {
        // No tracer, no exporter task (this test has no runtime to spawn one on).
        assert!(matches!(Traces::start(&config, None), Ok(None)));
    }
    // http:// and https:// only (https: tests/e2e/tracing.rs).
    let other = Config {
        otlp_endpoint: Some("collector:4317".into()),
        ..Config::default()
    };
    let err = Traces::start(&other, None).unwrap_err();
    assert!(
        err.contains("--otlp-endpoint collector:4317: expected http://host:port or https://"),
        "{err}"
    );
}

/// The table of the span's attributes in `docs/operations.md` lists exactly the
/// attributes set here.
#[test]
fn the_docs_list_every_attribute() {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .expect("docs/operations.md");
    let section = page
        .split("\n## Traces\n")
        .nth(1)
        .expect("a 'Traces' section in docs/operations.md");
    let listed: std::collections::BTreeSet<String> = section
        .lines()
        .skip_while(|l| !l.starts_with("| attribute | value |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .flat_map(|row| {
            let first = row.trim_matches('|').split('|').next().unwrap_or_default();
            first
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    let full = Summary {
        operation: Operation::Create,
        response_id: Some("resp_1".into()),
        model: Some("m".into()),
        stream: true,
        outcome: Outcome::Failed,
        status: Some(502),
        error_code: Some(ErrorCode::UpstreamStreamTruncated.into()),
        usage: Some(Usage::default()),
        upstream_model: Some("u".into()),
        finish_reason: Some("stop".into()),
        params: Params {
            temperature: Some(1.0),
            top_p: Some(1.0),
            presence_penalty: Some(0.0),
            frequency_penalty: Some(0.0),
            max_output_tokens: Some(1),
        },
        streamed_output: true,
        compaction: Some(responses_core::exchange::Compaction {
            outcome: responses_core::exchange::CompactionOutcome::Compacted,
            estimate: 2,
            threshold: 1,
            usage: Some(Usage::default()),
        }),
    };
    let timing = Timing {
        first_output: Some(Duration::from_millis(1)),
        ..Timing::default()
    };
    let mut set: std::collections::BTreeSet<String> = attributes(&full, &timing)
        .into_iter()
        .map(|kv| kv.key.as_str().to_owned())
        .collect();
    set.extend([key::TRANSPORT, REQUEST_BODY_ATTR, RESPONSE_BODY_ATTR].map(str::to_owned));
    assert_eq!(listed, set);
}

#[test]
fn content_is_cut() {
    let long = vec![b'x'; MAX_CONTENT_BYTES + 10];
    let t = text(&long);
    assert!(t.starts_with("xxx") && t.ends_with(&format!("[cut: {} bytes in all]", long.len())));
}
