use super::*;
use opentelemetry::trace::{Span as _, Tracer as _, TracerProvider as _};
use opentelemetry_sdk::error::OTelSdkError;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tokio::sync::Semaphore;

/// An exporter that waits for a permit per export, then succeeds or fails.
#[derive(Debug, Clone)]
struct Gated {
    permits: Arc<Semaphore>,
    exported: Arc<Mutex<usize>>,
    fail: bool,
}

impl Gated {
    fn new(permits: usize, fail: bool) -> Self {
        Gated {
            permits: Arc::new(Semaphore::new(permits)),
            exported: Arc::default(),
            fail,
        }
    }
}

impl SpanExporter for Gated {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        if let Ok(permit) = self.permits.acquire().await {
            permit.forget();
        }
        if self.fail {
            return Err(OTelSdkError::InternalFailure("refused".into()));
        }
        *self.exported.lock().unwrap() += batch.len();
        Ok(())
    }
}

fn limits(max_queue: usize, max_batch: usize, delay_ms: u64) -> Limits {
    Limits {
        max_queue,
        max_batch,
        delay: Duration::from_millis(delay_ms),
        export_timeout: Duration::from_secs(10),
    }
}

/// Ends `n` sampled spans through a provider with `processor`.
fn end_spans(processor: BatchExport, n: usize) -> SdkTracerProvider {
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .build();
    let tracer = provider.tracer("test");
    for _ in 0..n {
        tracer.start("exchange").end();
    }
    provider
}

fn sample(m: &Metrics, name: &str) -> f64 {
    let text = m.render();
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..400 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("{what}");
}

#[tokio::test]
async fn a_full_queue_drops_and_counts_without_waiting() {
    let metrics = Arc::new(Metrics::new(Default::default(), None));
    let exporter = Gated::new(0, false);
    let (processor, handle) =
        BatchExport::start(exporter.clone(), limits(2, 1, 5), Some(metrics.clone()));
    // Six spans end before the export task runs at all: two fit in the queue.
    let _provider = end_spans(processor, 6);
    let dropped = "responses_extproc_spans_dropped_total{reason=\"queue_full\"}";
    assert_eq!(sample(&metrics, dropped), 4.0);
    // The collector answers again: what was queued is exported, one span per batch.
    exporter.permits.add_permits(10);
    until("two spans exported", || {
        *exporter.exported.lock().unwrap() == 2
    })
    .await;
    until("counted", || {
        sample(&metrics, "responses_extproc_spans_exported_total") == 2.0
    })
    .await;
    handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn failed_exports_count_their_spans() {
    let metrics = Arc::new(Metrics::new(Default::default(), None));
    let (processor, handle) = BatchExport::start(
        Gated::new(10, true),
        limits(16, 2, 5),
        Some(metrics.clone()),
    );
    let _provider = end_spans(processor, 3);
    let dropped = "responses_extproc_spans_dropped_total{reason=\"export_failed\"}";
    until("three failed spans", || sample(&metrics, dropped) == 3.0).await;
    assert_eq!(
        sample(&metrics, "responses_extproc_spans_exported_total"),
        0.0
    );
    handle.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn shutdown_exports_what_is_queued() {
    let exporter = Gated::new(10, false);
    // Batches would wait 60 s: only the shutdown sends these.
    let (processor, handle) = BatchExport::start(exporter.clone(), limits(16, 8, 60_000), None);
    let _provider = end_spans(processor, 3);
    tokio::task::yield_now().await;
    assert_eq!(*exporter.exported.lock().unwrap(), 0);
    handle.shutdown(Duration::from_secs(1)).await;
    assert_eq!(*exporter.exported.lock().unwrap(), 3);
}
