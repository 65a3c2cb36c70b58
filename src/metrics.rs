//! The processor's Prometheus metrics: the core's schema (`responses_core::metrics`, the same
//! families, labels and buckets the module records in Envoy's stats) under the prefix
//! [`PREFIX`], plus what only the processor has (its WebSocket connections, its span
//! exporter). Adapters hand the driver's events to [`Metrics::tell`]; `/metrics` renders the
//! registry ([`Metrics::render`]).

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use responses_core::driver::Event;
use responses_core::metrics::{self, Kind, LabelPolicy, Labels, Metric, Recorder};

/// Where the schema's families are in the processor's export: `responses_extproc_<name>`
/// (the module's are `envoy_<metrics_namespace>_<name>`).
pub const PREFIX: &str = "responses_extproc_";

/// How long and how fast one exchange was, measured by its adapter (the core's plain data,
/// shared with the spans).
pub use responses_core::telemetry::Timing;

/// One family of the schema, registered.
#[derive(Debug)]
enum Series {
    Counter(IntCounterVec),
    Gauge(IntGauge),
    Histogram(HistogramVec),
}

/// The processor's metrics, registered once.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// The schema's families, by [`Metric::index`].
    schema: Vec<Series>,
    labels: Labels,
    websocket_connections: IntGauge,
    spans_exported: IntCounter,
    spans_dropped: IntCounterVec,
}

impl Metrics {
    pub fn new(labels: LabelPolicy) -> Self {
        let registry = Registry::new();
        let register = |c: Box<dyn prometheus::core::Collector>| {
            registry.register(c).expect("registered once");
        };
        let schema = Metric::ALL
            .iter()
            .map(|m| {
                let f = m.family();
                let opts = Opts::new(format!("{PREFIX}{}", f.name), f.help);
                let series = match f.kind {
                    Kind::Counter => {
                        Series::Counter(IntCounterVec::new(opts, f.labels).expect("valid counter"))
                    }
                    Kind::Gauge => Series::Gauge(IntGauge::with_opts(opts).expect("valid gauge")),
                    Kind::Histogram => Series::Histogram(
                        HistogramVec::new(
                            HistogramOpts::from(opts).buckets(f.buckets.to_vec()),
                            f.labels,
                        )
                        .expect("valid histogram"),
                    ),
                };
                match &series {
                    Series::Counter(c) => register(Box::new(c.clone())),
                    Series::Gauge(g) => register(Box::new(g.clone())),
                    Series::Histogram(h) => register(Box::new(h.clone())),
                }
                series
            })
            .collect();
        let websocket_connections = IntGauge::new(
            format!("{PREFIX}websocket_connections"),
            "Open WebSocket connections (the WebSocket transport; 0 while it is not enabled).",
        )
        .expect("valid gauge");
        register(Box::new(websocket_connections.clone()));
        // Traces (--otlp-endpoint): what the exporter sent and what it had to drop.
        let spans_exported = IntCounter::new(
            format!("{PREFIX}spans_exported_total"),
            "Spans the OTLP exporter delivered to the collector (traces, --otlp-endpoint).",
        )
        .expect("valid counter");
        register(Box::new(spans_exported.clone()));
        let spans_dropped = IntCounterVec::new(
            Opts::new(
                format!("{PREFIX}spans_dropped_total"),
                "Spans dropped instead of exported: queue_full (the collector is slower than the exchanges), export_failed (the collector refused or did not answer), shutdown.",
            ),
            &["reason"],
        )
        .expect("valid counter");
        register(Box::new(spans_dropped.clone()));
        Metrics {
            registry,
            schema,
            labels: Labels::new(labels),
            websocket_connections,
            spans_exported,
            spans_dropped,
        }
    }

    /// Records what the driver told of an exchange (every event: the core picks).
    pub fn tell(&self, event: &Event) {
        let mut recorder = self;
        metrics::record(&mut recorder, &self.labels, event);
    }

    /// The gauge a WebSocket adapter keeps: +1 on accept, -1 on close.
    pub fn websocket_connections(&self) -> &IntGauge {
        &self.websocket_connections
    }

    /// Spans the trace exporter delivered.
    pub fn spans_exported(&self, n: u64) {
        self.spans_exported.inc_by(n);
    }

    /// Spans the trace exporter dropped, and why (`queue_full`, `export_failed`, `shutdown`).
    pub fn spans_dropped(&self, reason: &str, n: u64) {
        self.spans_dropped.with_label_values(&[reason]).inc_by(n);
    }

    /// The exposition text of every metric (`text/plain; version=0.0.4`).
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding our own registry into memory cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

/// The registry's handles are shared (atomics): recording needs no `&mut`.
impl Recorder for &Metrics {
    fn record(&mut self, metric: Metric, labels: &[&str], value: u64) {
        match &self.schema[metric.index()] {
            Series::Counter(c) => c.with_label_values(labels).inc_by(value),
            // Integers in the family's unit, as the module records them in Envoy.
            Series::Histogram(h) => h.with_label_values(labels).observe(value as f64),
            Series::Gauge(_) => debug_assert!(false, "{metric:?} is a gauge"),
        }
    }

    fn gauge_add(&mut self, metric: Metric, delta: i64) {
        if let Series::Gauge(g) = &self.schema[metric.index()] {
            g.add(delta);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use responses_core::driver::Finished;
    use responses_core::exchange::{Operation, Outcome, Summary};
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
        let m = Metrics::new(LabelPolicy::default());
        let timing = Timing {
            total: Duration::from_millis(1200),
            first_output: Some(Duration::from_millis(200)),
            translation: Duration::from_micros(80),
        };
        m.tell(&Event::StreamOpened);
        m.tell(&finished("m1", Outcome::Translated, None, timing));
        let text = m.render();
        // A family is exported once it has a series (as in Envoy's): no cap was hit.
        for metric in Metric::ALL.into_iter().filter(|m| *m != Metric::CapsHit) {
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
        let in_flight = line(&text, "responses_extproc_streams_in_flight", &[]).unwrap();
        assert!(in_flight.ends_with(" 1"), "{in_flight}");
    }

    #[test]
    fn failures_count_their_code_and_caps() {
        let m = Metrics::new(LabelPolicy::default());
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
}
