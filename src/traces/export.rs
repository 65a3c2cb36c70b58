//! Ended spans to the OTLP exporter: a bounded queue and one task on the service's runtime
//! that sends them in batches. An exchange only ever offers its span to the queue (never
//! waits): when the collector is slow or gone, the queue fills and further spans are dropped
//! and counted, like the spans of a failed export (`responses_extproc_spans_dropped_total`).
//!
//! Why not the SDK's `BatchSpanProcessor`: it exports from a thread of its own with a blocking
//! executor, where the async OTLP clients (tonic, reqwest) have no runtime, and it keeps its
//! drop count to itself. The limits are the standard `OTEL_BSP_*` variables all the same.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::metrics::Metrics;

/// The batching limits (the standard `OTEL_BSP_*` variables, with the specification's
/// defaults).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Spans waiting for export at most (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048).
    pub max_queue: usize,
    /// Spans per export at most (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, 512).
    pub max_batch: usize,
    /// Longest a span waits for a batch to fill (`OTEL_BSP_SCHEDULE_DELAY`, 5000 ms).
    pub delay: Duration,
    /// Longest one export may take before its spans count as dropped
    /// (`OTEL_BSP_EXPORT_TIMEOUT`, 30000 ms).
    pub export_timeout: Duration,
}

impl Limits {
    pub fn from_env() -> Limits {
        let var = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|n| *n > 0)
                .unwrap_or(default)
        };
        let max_queue = usize::try_from(var("OTEL_BSP_MAX_QUEUE_SIZE", 2048)).unwrap_or(2048);
        let max_batch = usize::try_from(var("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512))
            .unwrap_or(512)
            .min(max_queue);
        Limits {
            max_queue,
            max_batch,
            delay: Duration::from_millis(var("OTEL_BSP_SCHEDULE_DELAY", 5000)),
            export_timeout: Duration::from_millis(var("OTEL_BSP_EXPORT_TIMEOUT", 30_000)),
        }
    }
}

/// Where dropped and exported spans are counted (the metrics, when they are on) and logged.
#[derive(Debug)]
struct Counts {
    metrics: Option<Arc<Metrics>>,
    /// A queue-full drop was logged (once, until an export succeeds again).
    full_logged: AtomicBool,
}

impl Counts {
    fn dropped(&self, reason: &'static str, n: usize) {
        if let Some(m) = &self.metrics {
            m.spans_dropped(reason, n as u64);
        }
    }
}

/// The span processor: offers ended spans to the queue.
#[derive(Debug)]
pub struct BatchExport {
    queue: mpsc::Sender<SpanData>,
    counts: Arc<Counts>,
}

/// Stops the export task ([`Handle::shutdown`]).
#[derive(Debug)]
pub struct Handle {
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl BatchExport {
    /// The processor and its export task (spawned on the current tokio runtime).
    pub fn start<E>(exporter: E, limits: Limits, metrics: Option<Arc<Metrics>>) -> (Self, Handle)
    where
        E: SpanExporter + 'static,
    {
        let (queue, spans) = mpsc::channel(limits.max_queue);
        let (stop, stopped) = watch::channel(false);
        let counts = Arc::new(Counts {
            metrics,
            full_logged: AtomicBool::new(false),
        });
        let task = tokio::spawn(run(exporter, spans, stopped, limits, counts.clone()));
        (
            BatchExport { queue, counts },
            Handle {
                stop,
                task: Mutex::new(Some(task)),
            },
        )
    }
}

impl SpanProcessor for BatchExport {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if !span.span_context.is_sampled() {
            return;
        }
        match self.queue.try_send(span) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                if !self.counts.full_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "the trace export queue is full (the collector is slow or unreachable): \
                         dropping spans (counted in responses_extproc_spans_dropped_total)"
                    );
                }
                self.counts.dropped("queue_full", 1);
            }
            // The exporter has stopped (shutting down).
            Err(mpsc::error::TrySendError::Closed(_)) => self.counts.dropped("shutdown", 1),
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    /// The export task is stopped by [`Handle::shutdown`] (async, on the runtime); the
    /// provider's own shutdown has nothing left to do.
    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

impl Handle {
    /// Exports what is queued (for at most `timeout`), then stops.
    pub async fn shutdown(&self, timeout: Duration) {
        let _ = self.stop.send(true);
        let task = self.task.lock().ok().and_then(|mut t| t.take());
        if let Some(task) = task {
            if tokio::time::timeout(timeout, task).await.is_err() {
                tracing::warn!("trace export did not finish in time; the last spans are lost");
            }
        }
    }
}

/// The export task: fills a batch from the queue, sends it when it is full or `delay` after
/// the last export, one export at a time.
async fn run<E: SpanExporter>(
    exporter: E,
    mut spans: mpsc::Receiver<SpanData>,
    mut stop: watch::Receiver<bool>,
    limits: Limits,
    counts: Arc<Counts>,
) {
    let mut batch = Vec::with_capacity(limits.max_batch);
    let mut failing = false;
    let mut tick = tokio::time::interval(limits.delay);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            span = spans.recv() => match span {
                Some(span) => {
                    batch.push(span);
                    if batch.len() < limits.max_batch {
                        continue;
                    }
                }
                None => break,
            },
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
        if !batch.is_empty() {
            export(&exporter, &mut batch, &limits, &counts, &mut failing).await;
            tick.reset();
        }
    }
    // Shutting down: what is queued now, in batches.
    spans.close();
    while let Ok(span) = spans.try_recv() {
        batch.push(span);
        if batch.len() == limits.max_batch {
            export(&exporter, &mut batch, &limits, &counts, &mut failing).await;
        }
    }
    if !batch.is_empty() {
        export(&exporter, &mut batch, &limits, &counts, &mut failing).await;
    }
    let _ = exporter.shutdown();
}

async fn export<E: SpanExporter>(
    exporter: &E,
    batch: &mut Vec<SpanData>,
    limits: &Limits,
    counts: &Counts,
    failing: &mut bool,
) {
    let spans = std::mem::replace(batch, Vec::with_capacity(limits.max_batch));
    let n = spans.len();
    let error = match tokio::time::timeout(limits.export_timeout, exporter.export(spans)).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!(
            "no answer within {} ms (OTEL_BSP_EXPORT_TIMEOUT)",
            limits.export_timeout.as_millis()
        )),
    };
    match error {
        None => {
            if let Some(m) = &counts.metrics {
                m.spans_exported(n as u64);
            }
            if std::mem::take(failing) {
                tracing::info!("trace export works again");
            }
            counts.full_logged.store(false, Ordering::Relaxed);
        }
        Some(e) => {
            // Logged when exports start failing, not for every batch after that.
            if !std::mem::replace(failing, true) {
                tracing::warn!(
                    error = %e,
                    spans = n,
                    "trace export failed; dropping the spans (counted in \
                     responses_extproc_spans_dropped_total) until the collector answers"
                );
            } else {
                tracing::debug!(error = %e, spans = n, "trace export failed");
            }
            counts.dropped("export_failed", n);
        }
    }
}

#[cfg(test)]
mod tests;
