//! The processor's metrics: the core's schema (`responses_core::metrics`, the same families,
//! labels and buckets the module records in Envoy's stats) as Prometheus series under the
//! prefix [`PREFIX`], plus what only the processor has (its span exporter's counts); and,
//! with `--otlp-endpoint`, the same families pushed over OTLP ([`Push`]). Adapters hand the
//! driver's events to [`Metrics::tell`]; `/metrics` renders the registry
//! ([`Metrics::render`]).

mod push;

pub use push::Push;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

use responses_core::connection;
use responses_core::life::Event;
use responses_core::metrics::{self, prometheus_name, Kind, LabelPolicy, Labels, Metric, Recorder};

/// Where the schema's families are in the processor's export: `responses_extproc_<name>`
/// (the module's are `envoy_<metrics_namespace>_<name>`).
pub const PREFIX: &str = "responses_extproc_";

/// How long and how fast one exchange was, measured by its adapter (the core's plain data,
/// shared with the spans).
pub use responses_core::life::Timing;

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
    spans_exported: IntCounter,
    spans_dropped: IntCounterVec,
    /// `--otlp-endpoint`: the same calls, onto OpenTelemetry instruments.
    push: Option<Push>,
}

impl Metrics {
    /// The registry, and the OTLP push if there is one.
    pub fn new(labels: LabelPolicy, push: Option<Push>) -> Self {
        let registry = Registry::new();
        let register = |c: Box<dyn prometheus::core::Collector>| {
            registry.register(c).expect("registered once");
        };
        let schema = Metric::ALL
            .iter()
            .map(|m| {
                let f = m.family();
                let opts = Opts::new(format!("{PREFIX}{}", f.name), f.help);
                // `gen_ai.request.model` is `gen_ai_request_model` here, as in Envoy's output.
                let labels: Vec<String> = f.labels.iter().map(|l| prometheus_name(l)).collect();
                let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
                let series = match f.kind {
                    Kind::Counter => {
                        Series::Counter(IntCounterVec::new(opts, &labels).expect("valid counter"))
                    }
                    Kind::Gauge => Series::Gauge(IntGauge::with_opts(opts).expect("valid gauge")),
                    Kind::Histogram => Series::Histogram(
                        HistogramVec::new(
                            HistogramOpts::from(opts).buckets(f.buckets.to_vec()),
                            &labels,
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
            spans_exported,
            spans_dropped,
            push,
        }
    }

    /// Exports what the push holds (for at most `timeout`) and stops it.
    pub async fn shutdown(&self, timeout: std::time::Duration) {
        if let Some(push) = &self.push {
            push.shutdown(timeout).await;
        }
    }

    /// Records what the driver told of an exchange (every event: the core picks).
    pub fn tell(&self, event: &Event) {
        let mut recorder = self;
        metrics::record(&mut recorder, &self.labels, event);
    }

    /// Records what a WebSocket connection told (every event: the core picks).
    pub fn tell_socket(&self, event: &connection::Event) {
        let mut recorder = self;
        metrics::record_socket(&mut recorder, &self.labels, event);
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
        if let Some(push) = &self.push {
            push.record(metric, labels, value);
        }
    }

    fn gauge_add(&mut self, metric: Metric, delta: i64) {
        if let Series::Gauge(g) = &self.schema[metric.index()] {
            g.add(delta);
        }
        if let Some(push) = &self.push {
            push.gauge_add(metric, delta);
        }
    }
}

#[cfg(test)]
mod tests;
