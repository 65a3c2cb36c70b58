use super::*;
use responses_core::exchange::{Operation, Outcome, Summary};
use responses_core::life::Finished;
use responses_core::openresponses::{ErrorCode, Usage};
use std::time::Duration;

fn finished(model: &str, outcome: Outcome, code: Option<ErrorCode>, timing: Timing) -> Event {
    Event::Finished(Box::new(Finished {
        summary: Summary {
            operation: Operation::Create,
            response_id: Some("resp_1".into()),
            model: Some(model.into()),
            stream: true,
            outcome,
            status: Some(200),
            error_code: code.map(Into::into),
            usage: Some(Usage {
                input_tokens: 7,
                output_tokens: 11,
                total_tokens: 18,
                ..Usage::default()
            }),
            upstream_model: Some("upstream-m".into()),
            finish_reason: Some("stop".into()),
            params: Default::default(),
            streamed_output: true,
            compaction: None,
        },
        timing,
        cut: false,
    }))
}

fn line<'a>(text: &'a str, name: &str, labels: &[&str]) -> Option<&'a str> {
    text.lines()
        .find(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
}

#[test]
fn the_schema_is_exported_under_the_prefix() {
    let m = Metrics::new(LabelPolicy::default(), None);
    let timing = Timing {
        total: Duration::from_millis(1200),
        first_output: Some(Duration::from_millis(200)),
        translation: Duration::from_micros(80),
    };
    m.tell(&Event::StreamOpened);
    m.tell(&finished("m1", Outcome::Translated, None, timing));
    let text = m.render();
    // A family is exported once it has a series (as in Envoy's): no cap was hit, no
    // WebSocket closed, nothing compacted.
    let unseen = [
        Metric::CapsHit,
        Metric::WebsocketCloses,
        Metric::Compactions,
    ];
    for metric in Metric::ALL.into_iter().filter(|m| !unseen.contains(m)) {
        let f = metric.family();
        let kind = format!("# TYPE {PREFIX}{} {}", f.name, f.kind.as_str());
        assert!(text.contains(&kind), "{kind}\n{text}");
    }
    let out = line(
        &text,
        "responses_extproc_tokens_total",
        &[
            "gen_ai_token_type=\"output\"",
            "gen_ai_request_model=\"m1\"",
            "gen_ai_response_model=\"upstream-m\"",
        ],
    )
    .unwrap();
    assert!(out.ends_with(" 11"), "{out}");
    let ttft = line(
        &text,
        "responses_extproc_time_to_first_token_milliseconds_sum",
        &[],
    )
    .unwrap();
    assert!(ttft.ends_with(" 200"), "{ttft}");
    // The schema's buckets, in its unit.
    let bucket = line(
        &text,
        "responses_extproc_time_to_first_token_milliseconds_bucket",
        &["le=\"250\""],
    )
    .unwrap();
    assert!(bucket.ends_with(" 1"), "{bucket}");
    let tpot = line(
        &text,
        "responses_extproc_time_per_output_token_microseconds_sum",
        &[],
    )
    .unwrap();
    assert!(tpot.ends_with(" 100000"), "{tpot}");
    // The conventions' instruments, their attributes with `_` for `.`.
    let usage = line(
        &text,
        "responses_extproc_gen_ai_client_token_usage_sum",
        &[
            "gen_ai_operation_name=\"chat\"",
            "gen_ai_provider_name=\"openai\"",
            "gen_ai_token_type=\"output\"",
            "gen_ai_request_model=\"m1\"",
        ],
    )
    .unwrap();
    assert!(usage.ends_with(" 11"), "{usage}");
    let ttft = line(
        &text,
        "responses_extproc_gen_ai_server_time_to_first_token_microseconds_sum",
        &["gen_ai_response_model=\"upstream-m\""],
    )
    .unwrap();
    assert!(ttft.ends_with(" 200000"), "{ttft}");
    let duration = line(
        &text,
        "responses_extproc_gen_ai_server_request_duration_microseconds_bucket",
        &["error_type=\"\"", "le=\"1280000\""],
    )
    .unwrap();
    assert!(duration.ends_with(" 1"), "{duration}");
    let in_flight = line(&text, "responses_extproc_streams_in_flight", &[]).unwrap();
    assert!(in_flight.ends_with(" 1"), "{in_flight}");
}

#[test]
fn failures_count_their_code_and_caps() {
    let m = Metrics::new(LabelPolicy::default(), None);
    let code = Some(ErrorCode::ResponseTooLarge);
    m.tell(&finished("m", Outcome::Failed, code, Timing::default()));
    m.tell(&finished("m", Outcome::Open, None, Timing::default()));
    let text = m.render();
    assert!(
        line(
            &text,
            "responses_extproc_exchanges_total",
            &["outcome=\"failed\"", "error_code=\"response_too_large\""]
        )
        .is_some(),
        "{text}"
    );
    assert!(line(
        &text,
        "responses_extproc_exchanges_total",
        &["outcome=\"cut\""]
    )
    .is_some());
    let cap = line(
        &text,
        "responses_extproc_caps_hit_total",
        &["cap=\"response_too_large\""],
    )
    .unwrap();
    assert!(cap.ends_with(" 1"), "{cap}");
}
