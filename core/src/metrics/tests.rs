use super::*;
use crate::exchange::Operation;
use crate::life::Finished;
use crate::openresponses::ErrorCode;

/// What a recorder was asked to do, in order.
#[derive(Debug, Default)]
struct Calls(Vec<(Metric, Vec<String>, i64)>);

impl Recorder for Calls {
    fn record(&mut self, metric: Metric, labels: &[&str], value: u64) {
        assert_eq!(
            labels.len(),
            metric.family().labels.len(),
            "{metric:?}: one value per label"
        );
        let labels = labels.iter().map(|l| l.to_string()).collect();
        self.0.push((metric, labels, i64::try_from(value).unwrap()));
    }

    fn gauge_add(&mut self, metric: Metric, delta: i64) {
        assert_eq!(metric.family().kind, Kind::Gauge);
        self.0.push((metric, Vec::new(), delta));
    }
}

impl Calls {
    fn of(&self, metric: Metric) -> Vec<(Vec<&str>, i64)> {
        self.0
            .iter()
            .filter(|(m, ..)| *m == metric)
            .map(|(_, labels, v)| (labels.iter().map(String::as_str).collect(), *v))
            .collect()
    }
}

fn summary(model: Option<&str>, stream: bool, outcome: Outcome) -> Summary {
    let mut usage = Usage {
        input_tokens: 7,
        output_tokens: 11,
        total_tokens: 18,
        ..Usage::default()
    };
    usage.input_tokens_details.cached_tokens = 3;
    Summary {
        operation: Operation::Create,
        response_id: Some("resp_1".into()),
        model: model.map(Into::into),
        stream,
        outcome,
        status: Some(200),
        error_code: None,
        usage: Some(usage),
        upstream_model: Some("upstream-m".into()),
        finish_reason: Some("stop".into()),
        params: Default::default(),
        streamed_output: stream,
        compaction: None,
    }
}

fn finished(s: Summary, timing: Timing) -> Event {
    Event::Finished(Box::new(Finished {
        summary: s,
        timing,
        cut: false,
    }))
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn a_json_exchange_counts_once_with_its_tokens_and_times() {
    let labels = Labels::default();
    let mut calls = Calls::default();
    let timing = Timing {
        total: ms(1234),
        first_output: None,
        translation: Duration::from_micros(80),
    };
    let s = summary(Some("m1"), false, Outcome::Translated);
    record(&mut calls, &labels, &finished(s, timing));
    assert_eq!(
        calls.of(Metric::Exchanges),
        [(vec!["create", "false", "translated", ""], 1)]
    );
    assert_eq!(calls.of(Metric::Translation), [(vec!["false"], 80)]);
    assert_eq!(
        calls.of(Metric::ServerRequestDuration),
        [(vec!["chat", "openai", "m1", "upstream-m", ""], 1_234_000)]
    );
    assert_eq!(
        calls.of(Metric::RequestDuration),
        [(vec!["m1", "upstream-m", "false", "translated"], 1234)]
    );
    // The conventions' token usage: input and output, one observation each.
    assert_eq!(
        calls.of(Metric::TokenUsage),
        [
            (vec!["chat", "openai", "m1", "upstream-m", "input"], 7),
            (vec!["chat", "openai", "m1", "upstream-m", "output"], 11),
        ]
    );
    // Reasoning tokens: none reported, nothing added.
    assert_eq!(
        calls.of(Metric::Tokens),
        [
            (vec!["m1", "upstream-m", "input"], 7),
            (vec!["m1", "upstream-m", "output"], 11),
            (vec!["m1", "upstream-m", "cached"], 3),
        ]
    );
    for none in [
        Metric::CapsHit,
        Metric::TimeToFirstToken,
        Metric::TimePerOutputToken,
        Metric::ServerTimeToFirstToken,
        Metric::ServerTimePerOutputToken,
        Metric::StreamsInFlight,
    ] {
        assert!(calls.of(none).is_empty(), "{none:?}");
    }
}

#[test]
fn a_stream_is_in_flight_and_has_its_token_times() {
    let labels = Labels::default();
    let mut calls = Calls::default();
    let timing = Timing {
        total: ms(1200),
        first_output: Some(ms(200)),
        translation: Duration::from_micros(300),
    };
    let s = summary(Some("m"), true, Outcome::Translated);
    for event in [
        Event::Claimed { elapsed: ms(0) },
        Event::StreamOpened,
        Event::FirstOutput { elapsed: ms(200) },
        Event::StreamClosed,
        finished(s.clone(), timing),
    ] {
        record(&mut calls, &labels, &event);
    }
    assert_eq!(
        calls.of(Metric::StreamsInFlight),
        [(vec![], 1), (vec![], -1)]
    );
    assert_eq!(
        calls.of(Metric::TimeToFirstToken),
        [(vec!["m", "upstream-m"], 200)]
    );
    assert_eq!(
        calls.of(Metric::ServerTimeToFirstToken),
        [(vec!["chat", "openai", "m", "upstream-m"], 200_000)]
    );
    // (1200 ms - 200 ms) over the 10 output tokens after the first.
    assert_eq!(
        calls.of(Metric::TimePerOutputToken),
        [(vec!["m", "upstream-m"], 100_000)]
    );
    assert_eq!(
        calls.of(Metric::ServerTimePerOutputToken),
        [(vec!["chat", "openai", "m", "upstream-m"], 100_000)]
    );
    // A cut stream has a first token, but no time per token: its count is not final; its
    // duration says `cut`.
    let mut calls = Calls::default();
    let cut = summary(Some("m"), true, Outcome::Open);
    record(&mut calls, &labels, &finished(cut, timing));
    assert_eq!(calls.of(Metric::TimeToFirstToken).len(), 1);
    assert_eq!(calls.of(Metric::ServerTimeToFirstToken).len(), 1);
    assert!(calls.of(Metric::TimePerOutputToken).is_empty());
    assert!(calls.of(Metric::ServerTimePerOutputToken).is_empty());
    assert_eq!(
        calls.of(Metric::ServerRequestDuration),
        [(vec!["chat", "openai", "m", "upstream-m", "cut"], 1_200_000)]
    );
    assert_eq!(
        calls.of(Metric::Exchanges),
        [(vec!["create", "true", "cut", ""], 1)]
    );
}

#[test]
fn failures_count_their_code_and_caps() {
    let labels = Labels::default();
    let mut calls = Calls::default();
    let mut s = summary(Some("m"), false, Outcome::Failed);
    s.usage = None;
    s.error_code = Some(ErrorCode::ResponseTooLarge.into());
    record(&mut calls, &labels, &finished(s.clone(), Timing::default()));
    s.error_code = Some(ErrorCode::RateLimitExceeded.into());
    record(&mut calls, &labels, &finished(s, Timing::default()));
    assert_eq!(
        calls.of(Metric::Exchanges),
        [
            (vec!["create", "false", "failed", "response_too_large"], 1),
            (vec!["create", "false", "failed", "rate_limit_exceeded"], 1),
        ]
    );
    assert_eq!(calls.of(Metric::CapsHit), [(vec!["response_too_large"], 1)]);
    assert!(calls.of(Metric::Tokens).is_empty());
    assert!(calls.of(Metric::TokenUsage).is_empty());
    // error.type: the code, an upstream's bounded as error_code; `_OTHER` without one.
    let error_types = |calls: &Calls| -> Vec<String> {
        calls
            .of(Metric::ServerRequestDuration)
            .iter()
            .map(|(l, _)| l[4].to_owned())
            .collect()
    };
    assert_eq!(
        error_types(&calls),
        ["response_too_large", "rate_limit_exceeded"]
    );
    let mut calls = Calls::default();
    let bounded = Labels::default();
    for i in 0..=MAX_UPSTREAM_CODES {
        let mut s = summary(Some("m"), false, Outcome::Failed);
        s.error_code = Some(Code::upstream(&format!("code_{i}")));
        record(&mut calls, &bounded, &finished(s, Timing::default()));
    }
    let mut s = summary(Some("m"), false, Outcome::Failed);
    s.error_code = None;
    record(&mut calls, &bounded, &finished(s, Timing::default()));
    let got = error_types(&calls);
    assert_eq!(got[0], "code_0");
    assert_eq!(got[MAX_UPSTREAM_CODES], OTHER);
    assert_eq!(got[MAX_UPSTREAM_CODES + 1], "_OTHER");
}

#[test]
fn a_request_refused_before_its_model_counts_only_as_an_exchange() {
    let labels = Labels::default();
    let mut calls = Calls::default();
    let mut s = summary(None, false, Outcome::Failed);
    s.error_code = Some(ErrorCode::InvalidJson.into());
    record(&mut calls, &labels, &finished(s, Timing::default()));
    let families: Vec<Metric> = calls.0.iter().map(|(m, ..)| *m).collect();
    assert_eq!(families, [Metric::Exchanges, Metric::Translation]);
    // A token count of 0 is an observation of the conventions' histogram (not of the counter).
    let mut calls = Calls::default();
    let mut s = summary(Some("m"), false, Outcome::Translated);
    s.usage = Some(Usage {
        input_tokens: 5,
        ..Usage::default()
    });
    record(&mut calls, &labels, &finished(s, Timing::default()));
    let usage: Vec<(&str, i64)> = calls
        .of(Metric::TokenUsage)
        .iter()
        .map(|(l, n)| (l[4], *n))
        .collect();
    assert_eq!(usage, [("input", 5), ("output", 0)]);
    assert_eq!(
        calls.of(Metric::Tokens),
        [(vec!["m", "upstream-m", "input"], 5)]
    );
}

/// The model labels of one finished exchange, as recorded.
fn recorded_models(labels: &Labels, s: Summary) -> (String, String) {
    let mut calls = Calls::default();
    record(&mut calls, labels, &finished(s, Timing::default()));
    let [(l, _)] = &calls.of(Metric::RequestDuration)[..] else {
        panic!("one duration: {calls:?}");
    };
    (l[0].to_owned(), l[1].to_owned())
}

/// An exchange the upstream refused (vLLM's 404 `model_not_found` for a name it does not
/// serve): no model answered.
fn refused(model: &str) -> Summary {
    let mut s = summary(Some(model), false, Outcome::Failed);
    s.usage = None;
    s.upstream_model = None;
    s.status = Some(404);
    s.error_code = Some(Code::upstream("model_not_found"));
    s
}

#[test]
fn label_values_from_outside_are_bounded() {
    // The first two model names the upstream answered, then `other`; the request's and the
    // upstream's share the bound.
    let labels = Labels::new(LabelPolicy {
        allowed_models: None,
        max_models: 2,
    });
    let mut calls = Calls::default();
    for i in 0..5 {
        let s = summary(Some(&format!("model-{i}")), false, Outcome::Translated);
        record(&mut calls, &labels, &finished(s, Timing::default()));
    }
    let models: HashSet<(&str, &str)> = calls
        .of(Metric::RequestDuration)
        .iter()
        .map(|(l, _)| (l[0], l[1]))
        .collect();
    assert_eq!(
        models,
        HashSet::from([("model-0", "upstream-m"), (OTHER, "upstream-m")])
    );
    // An allow-list keeps those only, answered or not; an upstream that names no model is
    // empty, whatever the bound.
    let allow = Labels::new(LabelPolicy {
        allowed_models: Some(vec!["a".into()]),
        max_models: 0,
    });
    let mut s = refused("a");
    assert_eq!(recorded_models(&allow, s.clone()), ("a".into(), "".into()));
    s.model = Some("b".into());
    assert_eq!(recorded_models(&allow, s), (OTHER.into(), "".into()));
    // Upstreams' own codes are bounded; ours never are.
    let labels = Labels::default();
    for i in 0..MAX_UPSTREAM_CODES {
        let code = Code::upstream(&format!("code_{i}"));
        assert_eq!(labels.code(&code), format!("code_{i}"));
    }
    assert_eq!(labels.code(&Code::upstream("one_more")), OTHER);
    assert_eq!(labels.code(&Code::upstream("code_3")), "code_3");
    for ours in ErrorCode::all() {
        assert_eq!(labels.code(&Code::Ours(*ours)), ours.as_str());
    }
}

/// 1,000 distinct garbage model names, none of which reached a model, take no label: the
/// models the upstream answered keep theirs, before and after, and so do the listed ones.
#[test]
fn garbage_model_names_cannot_squat_the_labels() {
    let labels = Labels::new(LabelPolicy {
        allowed_models: None,
        max_models: 4,
    });
    let served = |model: &str| summary(Some(model), false, Outcome::Translated);
    assert_eq!(
        recorded_models(&labels, served("gpt-5.4")),
        ("gpt-5.4".into(), "upstream-m".into())
    );
    for i in 0..1000 {
        let garbage = format!("garbage-{i}\n{}", "x".repeat(i % 7));
        assert_eq!(
            recorded_models(&labels, refused(&garbage)),
            (OTHER.into(), "".into()),
            "{garbage}"
        );
        // Refused before the upstream (a 400 of ours, with the model read): no place either.
        let mut ours = refused(&garbage);
        ours.error_code = Some(ErrorCode::InvalidValue.into());
        assert_eq!(recorded_models(&labels, ours).0, OTHER);
    }
    // The real models keep their labels; one first answered now still finds a place (two
    // were left); an exchange of an admitted name that fails keeps its name.
    assert_eq!(recorded_models(&labels, served("gpt-5.4")).0, "gpt-5.4");
    assert_eq!(recorded_models(&labels, served("qwen3")).0, "qwen3");
    assert_eq!(recorded_models(&labels, refused("qwen3")).0, "qwen3");
    // A stream the host cut before the end, whose upstream named its model: answered.
    let mut cut = summary(Some("llama"), true, Outcome::Open);
    cut.upstream_model = Some("llama".into());
    assert_eq!(
        recorded_models(&labels, cut),
        ("llama".into(), "llama".into())
    );
    // The places are taken now: a fifth model is `other`, however it was answered.
    assert_eq!(recorded_models(&labels, served("mistral")).0, OTHER);

    // With `metrics_models`, only those, whatever comes.
    let listed = Labels::new(LabelPolicy {
        allowed_models: Some(vec!["gpt-5.4".into(), "upstream-m".into()]),
        max_models: 0,
    });
    for i in 0..1000 {
        assert_eq!(recorded_models(&listed, served(&format!("g{i}"))).0, OTHER);
    }
    assert_eq!(
        recorded_models(&listed, served("gpt-5.4")),
        ("gpt-5.4".into(), "upstream-m".into())
    );
}

/// A Prometheus metric or label name.
fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether `x` is a whole number with at most two significant digits (1, 25, 5000, ...).
fn two_digits(x: f64) -> bool {
    if x < 1.0 || x.fract() != 0.0 {
        return false;
    }
    let mut n = x as u64;
    while n >= 100 {
        if n % 10 != 0 {
            return false;
        }
        n /= 10;
    }
    true
}

#[test]
fn the_schema_is_well_formed() {
    let mut names = HashSet::new();
    for (i, metric) in Metric::ALL.iter().enumerate() {
        assert_eq!(metric.index(), i);
        let f = metric.family();
        assert!(names.insert(f.name), "{} twice", f.name);
        assert!(is_name(f.name), "{}", f.name);
        assert_eq!(
            f.kind == Kind::Counter,
            f.name.ends_with("_total"),
            "{}",
            f.name
        );
        let labels: HashSet<_> = f.labels.iter().map(|l| prometheus_name(l)).collect();
        assert_eq!(labels.len(), f.labels.len(), "{}: a label twice", f.name);
        assert!(labels.iter().all(|l| is_name(l) && l != "le"));
        if f.kind == Kind::Histogram {
            assert!(f.buckets.windows(2).all(|w| w[0] < w[1]), "{}", f.name);
            // Ours have two significant digits; the conventions' are theirs.
            if f.semconv.is_none() {
                assert!(f.buckets.iter().copied().all(two_digits), "{}", f.name);
            }
            let unit = f.name.rsplit('_').next().unwrap();
            let named = match unit {
                "milliseconds" => "ms",
                "microseconds" => "us",
                // An annotation ({token}) is no unit: Prometheus names carry none.
                _ if f.unit.starts_with('{') => f.unit,
                other => panic!(
                    "{}: a histogram's name ends with its unit, not {other}",
                    f.name
                ),
            };
            assert_eq!(f.unit, named, "{}", f.name);
        } else {
            assert!(f.buckets.is_empty(), "{}", f.name);
        }
        if let Some(semconv) = f.semconv {
            // The Prometheus name is the instrument's, with its unit when it is scaled.
            assert!(
                f.name.starts_with(&prometheus_name(semconv.name)),
                "{}",
                f.name
            );
            assert!(semconv.name.starts_with("gen_ai."), "{}", f.name);
        }
        if let Some(new) = f.replaced_by {
            assert!(new.family().semconv.is_some(), "{}", f.name);
            assert!(f.help.starts_with("Deprecated, replaced by "), "{}", f.name);
            assert!(f.help.contains(new.family().name), "{}", f.name);
        }
    }
    assert!(!two_digits(1280.0) && two_digits(2500.0) && !two_digits(0.5));
}

/// The GenAI families are the conventions' instruments: their names, units, attributes and
/// bucket boundaries as the OpenTelemetry semantic conventions give them.
#[test]
fn the_genai_families_are_the_conventions_instruments() {
    let server = [
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "gen_ai.response.model",
    ];
    let with = |extra: &'static str| {
        let mut l = server.to_vec();
        l.push(extra);
        l
    };
    for (metric, name, unit, labels, bounds) in [
        (
            Metric::TokenUsage,
            "gen_ai.client.token.usage",
            "{token}",
            with("gen_ai.token.type"),
            &[
                1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
                4194304.0, 16777216.0, 67108864.0,
            ][..],
        ),
        (
            Metric::ServerRequestDuration,
            "gen_ai.server.request.duration",
            "s",
            with("error.type"),
            &[
                0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96,
                81.92,
            ][..],
        ),
        (
            Metric::ServerTimeToFirstToken,
            "gen_ai.server.time_to_first_token",
            "s",
            server.to_vec(),
            &[
                0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0,
            ][..],
        ),
        (
            Metric::ServerTimePerOutputToken,
            "gen_ai.server.time_per_output_token",
            "s",
            server.to_vec(),
            &[
                0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
            ][..],
        ),
    ] {
        let f = metric.family();
        let semconv = f.semconv.expect("a conventions' instrument");
        assert_eq!((semconv.name, semconv.unit), (name, unit));
        assert_eq!(f.kind, Kind::Histogram);
        assert_eq!(f.labels, labels, "{name}");
        assert_eq!(f.otlp_buckets(), bounds, "{name}");
    }
    let genai: Vec<_> = Metric::ALL
        .iter()
        .filter(|m| m.family().semconv.is_some())
        .collect();
    assert_eq!(genai.len(), 4);
    assert_eq!(
        prometheus_name("gen_ai.request.model"),
        "gen_ai_request_model"
    );
    let seconds = Metric::ServerRequestDuration.family().semconv.unwrap();
    assert_eq!(seconds.value(1_280_000), 1.28);
    assert_eq!(seconds.value(80_000), 0.08);
}

/// An automatic compaction counts once by its outcome, a cut one as `cut`; the same summary
/// carries it into the metadata and the span (one source: `Summary::compaction`).
#[test]
fn a_compaction_counts_by_outcome_and_shows_in_metadata_and_span() {
    use crate::exchange::{Compaction, CompactionOutcome};
    use crate::metadata::{metadata, MetadataValue};
    use crate::telemetry::{attributes, call_attributes, key, Value as Attr};
    let labels = Labels::default();
    for (outcome, label) in [
        (CompactionOutcome::Compacted, "compacted"),
        (CompactionOutcome::Failed, "failed"),
        (CompactionOutcome::Running, "cut"),
    ] {
        let mut s = summary(Some("m1"), false, Outcome::Translated);
        s.compaction = Some(Compaction {
            outcome,
            estimate: 1200,
            threshold: 1000,
            usage: Some(Usage {
                input_tokens: 900,
                output_tokens: 40,
                total_tokens: 940,
                ..Usage::default()
            }),
        });
        let mut calls = Calls::default();
        record(&mut calls, &labels, &finished(s.clone(), Timing::default()));
        assert_eq!(calls.of(Metric::Compactions), [(vec![label], 1)]);

        let md = metadata(&s);
        let get = |k: &str| md.iter().find(|(n, _)| *n == k).map(|(_, v)| v.clone());
        assert_eq!(
            get("compaction"),
            Some(MetadataValue::Str(outcome.as_str().into()))
        );
        assert_eq!(
            get("compaction_estimated_tokens"),
            Some(MetadataValue::Num(1200.0))
        );
        assert_eq!(
            get("compaction_input_tokens"),
            Some(MetadataValue::Num(900.0))
        );
        let span = attributes(&s, &Timing::default());
        let attr = |k: &str| span.iter().find(|a| a.key == k).map(|a| a.value);
        assert_eq!(attr(key::COMPACTION_OUTCOME), Some(Attr::Str(label)));
        assert_eq!(attr(key::COMPACTION_THRESHOLD), Some(Attr::Int(1000)));
        let event = call_attributes(&crate::life::CallTiming {
            started: ms(2),
            took: ms(1500),
            compaction: s.compaction,
        });
        let got = |k: &str| event.iter().find(|a| a.key == k).map(|a| a.value);
        assert_eq!(got(key::COMPACTION_DURATION), Some(Attr::F64(1.5)));
        assert_eq!(got(key::COMPACTION_OUTPUT_TOKENS), Some(Attr::Int(40)));
    }
    // Without a compaction: no series.
    let mut calls = Calls::default();
    let s = summary(Some("m1"), false, Outcome::Translated);
    record(&mut calls, &labels, &finished(s, Timing::default()));
    assert!(calls.of(Metric::Compactions).is_empty());
}
