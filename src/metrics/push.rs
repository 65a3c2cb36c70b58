//! The metrics over OTLP (`--otlp-endpoint`, the traces' settings: `crate::otlp`): every
//! family of the schema as an OpenTelemetry instrument, recorded beside its Prometheus series,
//! collected by a `ManualReader` and exported by one task on the processor's runtime every
//! `OTEL_METRIC_EXPORT_INTERVAL` (60 s), cumulative unless
//! `OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE` says otherwise.
//!
//! The four GenAI families are the semantic conventions' instruments (their name, unit,
//! attributes and bucket boundaries: `gen_ai.server.request.duration` in seconds); ours are
//! `responses_extproc.<name>`, in their own unit, as the module's arrive from Envoy's stat sink
//! (`<metrics_namespace>.<name>`). A label with an empty value (`error.type` of an exchange
//! that went well, a `gen_ai.response.model` the upstream did not name) is no attribute.
//!
//! Why not the SDK's `PeriodicReader`: it exports from a thread of its own with a blocking
//! executor, where the async OTLP clients (tonic, reqwest, hyper) have no runtime. An export
//! the collector refuses or does not answer within `OTEL_METRIC_EXPORT_TIMEOUT` (30 s) is
//! logged (once, until one succeeds again); the next one carries the totals anyway.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use opentelemetry::metrics::{Counter, Histogram, MeterProvider as _, UpDownCounter};
use opentelemetry::{InstrumentationScope, Key, KeyValue};
use opentelemetry_otlp::MetricExporter;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::reader::MetricReader;
use opentelemetry_sdk::metrics::{
    InstrumentKind, ManualReader, Pipeline, SdkMeterProvider, Temporality,
};
use responses_core::metrics::{Kind, Metric};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::otlp::{self, Destination, Protocol, Signal};

/// The name of our own families over OTLP: `responses_extproc.<name>`.
const NAMESPACE: &str = "responses_extproc";

/// One family, as an instrument.
#[derive(Debug)]
enum Instrument {
    Counter(Counter<u64>),
    Gauge(UpDownCounter<i64>),
    Histogram(Histogram<f64>),
}

/// The push of the metrics: the instruments, and the task that exports them.
#[derive(Debug)]
pub struct Push {
    /// By [`Metric::index`].
    instruments: Vec<Instrument>,
    provider: SdkMeterProvider,
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Push {
    /// The push `config` asks for (the traces' endpoint settings, `crate::otlp`), its export
    /// task started on the current tokio runtime; `None` when it is off (no endpoint, or
    /// `OTEL_METRICS_EXPORTER=none`, or `OTEL_SDK_DISABLED=true`).
    pub fn start(config: &Config) -> Result<Option<Push>, String> {
        let Some(to) =
            Destination::resolve(config.otlp_endpoint.as_deref(), Signal::Metrics, otlp::env)?
        else {
            return Ok(None);
        };
        let exporter = build_exporter(&to)?;
        let reader = Arc::new(
            ManualReader::builder()
                .with_temporality(exporter.temporality())
                .build(),
        );
        let provider = SdkMeterProvider::builder()
            .with_resource(otlp::resource())
            .with_reader(Shared(reader.clone()))
            .build();
        let meter = provider.meter_with_scope(
            InstrumentationScope::builder(env!("CARGO_PKG_NAME"))
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        );
        let instruments = Metric::ALL
            .iter()
            .map(|m| {
                let f = m.family();
                let (name, unit): (Cow<'static, str>, &'static str) = match f.semconv {
                    Some(i) => (i.name.into(), i.unit),
                    None => (format!("{NAMESPACE}.{}", f.name).into(), f.unit),
                };
                match f.kind {
                    Kind::Counter => Instrument::Counter(
                        meter
                            .u64_counter(name)
                            .with_unit(unit)
                            .with_description(f.help)
                            .build(),
                    ),
                    Kind::Gauge => Instrument::Gauge(
                        meter
                            .i64_up_down_counter(name)
                            .with_unit(unit)
                            .with_description(f.help)
                            .build(),
                    ),
                    Kind::Histogram => Instrument::Histogram(
                        meter
                            .f64_histogram(name)
                            .with_unit(unit)
                            .with_description(f.help)
                            .with_boundaries(f.otlp_buckets())
                            .build(),
                    ),
                }
            })
            .collect();
        let interval = millis("OTEL_METRIC_EXPORT_INTERVAL", 60_000);
        let timeout = millis("OTEL_METRIC_EXPORT_TIMEOUT", 30_000);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(reader, exporter, interval, timeout, stopped));
        tracing::info!(
            endpoint = %to.used,
            protocol = ?to.protocol,
            tls = to.describe_tls(),
            interval_ms = interval.as_millis() as u64,
            "exporting metrics over OTLP"
        );
        Ok(Some(Push {
            instruments,
            provider,
            stop,
            task: Mutex::new(Some(task)),
        }))
    }

    /// Adds to a counter or observes in a histogram, as the Prometheus series.
    pub fn record(&self, metric: Metric, labels: &[&str], value: u64) {
        let f = metric.family();
        let attributes: Vec<KeyValue> = f
            .labels
            .iter()
            .zip(labels)
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| KeyValue::new(Key::from_static_str(k), (*v).to_owned()))
            .collect();
        match &self.instruments[metric.index()] {
            Instrument::Counter(c) => c.add(value, &attributes),
            Instrument::Histogram(h) => {
                let value = f.semconv.map_or(value as f64, |i| i.value(value));
                h.record(value, &attributes);
            }
            Instrument::Gauge(_) => debug_assert!(false, "{metric:?} is a gauge"),
        }
    }

    /// Moves a gauge.
    pub fn gauge_add(&self, metric: Metric, delta: i64) {
        if let Instrument::Gauge(g) = &self.instruments[metric.index()] {
            g.add(delta, &[]);
        }
    }

    /// Exports what was recorded (for at most `timeout`) and stops.
    pub async fn shutdown(&self, timeout: Duration) {
        let _ = self.stop.send(true);
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            if tokio::time::timeout(timeout, task).await.is_err() {
                tracing::warn!("the last metrics export did not finish in time");
            }
        }
        let _ = self.provider.shutdown();
    }
}

/// A variable in milliseconds (positive), or `default`.
fn millis(name: &str, default: u64) -> Duration {
    let ms = otlp::env(name)
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default);
    Duration::from_millis(ms)
}

/// The OTLP exporter, as the traces' (`src/traces`): the standard variables (headers,
/// compression, timeout, temporality, the endpoint without the flag) are read by
/// opentelemetry-otlp itself; over HTTP it posts to `/v1/metrics` under `--otlp-endpoint`.
fn build_exporter(to: &Destination) -> Result<MetricExporter, String> {
    let built = match to.protocol {
        Protocol::Grpc => to.grpc(MetricExporter::builder().with_tonic()).build(),
        Protocol::HttpProtobuf => to.http(MetricExporter::builder().with_http())?.build(),
    };
    built.map_err(|e| {
        format!("the OTLP metrics exporter (--otlp-endpoint, OTEL_EXPORTER_OTLP_*): {e}")
    })
}

/// The export task: every `interval`, collects and exports; at the stop, once more.
async fn run(
    reader: Arc<ManualReader>,
    exporter: MetricExporter,
    interval: Duration,
    timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        export(&reader, &exporter, timeout, &mut failing).await;
    }
    export(&reader, &exporter, timeout, &mut failing).await;
    let _ = exporter.shutdown();
}

async fn export(
    reader: &ManualReader,
    exporter: &MetricExporter,
    timeout: Duration,
    failing: &mut bool,
) {
    let mut metrics = ResourceMetrics::default();
    if let Err(e) = reader.collect(&mut metrics) {
        tracing::debug!(error = %e, "collecting the metrics failed");
        return;
    }
    let error = match tokio::time::timeout(timeout, exporter.export(&metrics)).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!(
            "no answer within {} ms (OTEL_METRIC_EXPORT_TIMEOUT)",
            timeout.as_millis()
        )),
    };
    match error {
        None => {
            if std::mem::take(failing) {
                tracing::info!("metrics export works again");
            }
        }
        // Logged when exports start failing, not for every one after that.
        Some(e) if !std::mem::replace(failing, true) => {
            tracing::warn!(error = %e, "metrics export failed; retrying at the next interval");
        }
        Some(e) => tracing::debug!(error = %e, "metrics export failed"),
    }
}

/// The reader, shared by the provider (which registers its pipeline) and the export task
/// (which collects from it).
#[derive(Debug)]
struct Shared(Arc<ManualReader>);

impl MetricReader for Shared {
    fn register_pipeline(&self, pipeline: Weak<Pipeline>) {
        self.0.register_pipeline(pipeline);
    }

    fn collect(&self, rm: &mut ResourceMetrics) -> OTelSdkResult {
        self.0.collect(rm)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn temporality(&self, kind: InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}
