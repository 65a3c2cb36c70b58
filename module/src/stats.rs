//! The filter's labelled stats: queued by the workers, made on Envoy's main thread.
//!
//! A labelled stat call costs Envoy about 4 k instructions: Envoy 1.40 resolves the label
//! values into a stat name on every call, and its ABI gives an HTTP filter no handle to
//! resolve them once (only cluster extensions have one). An exchange makes five to seven such
//! calls. So the worker that serves it only queues them ([`Queue::push`]: a lock and one copy
//! of the label values), and the first push after a flush schedules the next one on Envoy's
//! main thread (the config's scheduler), which makes the calls ([`Queue::flush`]), the
//! counters of one series added up. Operators see the same series and values, one turn of the
//! main thread later (histograms reach the admin output only at Envoy's stats flush anyway).
//! The gauge of streams in flight is moved by the worker itself: a call without labels is
//! cheap.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use responses_core::metrics::{Kind, Metric, MAX_LABELS};

use crate::config::Metrics;
use crate::host::MetricId;

/// Where the queued calls are made: Envoy's stats, on the main thread (the host layer), or a
/// fake.
pub trait Sink {
    fn count(&mut self, metric: MetricId, labels: &[&str], by: u64);
    fn observe(&mut self, metric: MetricId, labels: &[&str], value: u64);
}

/// Has Envoy run a flush on its main thread, soon.
pub trait Schedule: Send + Sync + std::fmt::Debug {
    fn schedule(&self);
}

/// One queued call; its label values are pieces of the queue's text, the `n`th ending at
/// `ends[n]`.
#[derive(Debug, Clone, Copy)]
struct Call {
    metric: Metric,
    value: u64,
    start: usize,
    ends: [usize; MAX_LABELS],
    labels: usize,
}

/// Calls, their label values in one buffer (reused from flush to flush: no allocation per
/// call).
#[derive(Debug, Default)]
struct Calls {
    text: String,
    calls: Vec<Call>,
}

impl Calls {
    fn push(&mut self, metric: Metric, labels: &[&str], value: u64) {
        let start = self.text.len();
        let mut ends = [start; MAX_LABELS];
        for (end, label) in ends.iter_mut().zip(labels) {
            self.text.push_str(label);
            *end = self.text.len();
        }
        self.calls.push(Call {
            metric,
            value,
            start,
            ends,
            labels: labels.len().min(MAX_LABELS),
        });
    }

    fn labels(&self, call: &Call) -> [&str; MAX_LABELS] {
        let mut labels = [""; MAX_LABELS];
        let mut start = call.start;
        for (label, &end) in labels.iter_mut().zip(&call.ends[..call.labels]) {
            *label = &self.text[start..end];
            start = end;
        }
        labels
    }

    fn clear(&mut self) {
        self.text.clear();
        self.calls.clear();
    }
}

#[derive(Debug, Default)]
struct Pending {
    queued: Calls,
    /// A flush is scheduled and has not run yet.
    scheduled: bool,
}

/// The calls the workers queued since the last flush.
#[derive(Debug, Default)]
pub struct Queue {
    pending: Mutex<Pending>,
    /// Envoy's scheduler for this config (none for a fake host, which flushes itself).
    scheduler: OnceLock<Box<dyn Schedule>>,
}

impl Queue {
    /// The scheduler flushes run with (set once, by the host layer, when it hands the
    /// config to Envoy).
    pub fn set_scheduler(&self, scheduler: Box<dyn Schedule>) {
        let _ = self.scheduler.set(scheduler);
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a counter's increment or a histogram's value (any thread).
    pub fn push(&self, metric: Metric, labels: &[&str], value: u64) {
        debug_assert!(labels.len() <= MAX_LABELS && metric.family().kind != Kind::Gauge);
        let first = {
            let mut pending = self.pending();
            pending.queued.push(metric, labels, value);
            !std::mem::replace(&mut pending.scheduled, true)
        };
        if first {
            if let Some(scheduler) = self.scheduler.get() {
                scheduler.schedule();
            }
        }
    }

    /// Makes every queued call into `sink` (the main thread), each counter's increments of one
    /// series as one call; pushes from now on schedule the next flush.
    pub fn flush(&self, metrics: &Metrics, sink: &mut impl Sink) {
        let mut queued = {
            let mut pending = self.pending();
            pending.scheduled = false;
            std::mem::take(&mut pending.queued)
        };
        // Counters by series, in the order they first came.
        let mut sums: Vec<(Metric, [&str; MAX_LABELS], usize, u64)> = Vec::new();
        let mut index: HashMap<(Metric, [&str; MAX_LABELS]), usize> = HashMap::new();
        for call in &queued.calls {
            let labels = queued.labels(call);
            match call.metric.family().kind {
                Kind::Counter => match index.get(&(call.metric, labels)) {
                    Some(&i) => sums[i].3 += call.value,
                    None => {
                        index.insert((call.metric, labels), sums.len());
                        sums.push((call.metric, labels, call.labels, call.value));
                    }
                },
                Kind::Histogram => {
                    sink.observe(metrics.id(call.metric), &labels[..call.labels], call.value)
                }
                Kind::Gauge => {}
            }
        }
        for (metric, labels, n, sum) in sums {
            sink.count(metrics.id(metric), &labels[..n], sum);
        }
        drop(index);
        // The buffers back, for the next calls, unless some came meanwhile.
        queued.clear();
        let mut pending = self.pending();
        if pending.queued.calls.is_empty() {
            pending.queued = queued;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[derive(Debug, Default)]
    struct Calls(Vec<(&'static str, usize, Vec<String>, u64)>);

    impl Sink for Calls {
        fn count(&mut self, metric: MetricId, labels: &[&str], by: u64) {
            let labels = labels.iter().map(|l| l.to_string()).collect();
            self.0.push(("count", metric.0, labels, by));
        }
        fn observe(&mut self, metric: MetricId, labels: &[&str], value: u64) {
            let labels = labels.iter().map(|l| l.to_string()).collect();
            self.0.push(("observe", metric.0, labels, value));
        }
    }

    #[derive(Debug, Default)]
    struct Scheduled(Arc<AtomicUsize>);

    impl Schedule for Scheduled {
        fn schedule(&self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn metrics() -> Metrics {
        let mut next = 0;
        Metrics::define(&mut |_, _, _| {
            next += 1;
            Some(MetricId(next - 1))
        })
        .unwrap()
    }

    #[test]
    fn calls_are_queued_then_made_with_each_counters_series_added_up() {
        let metrics = metrics();
        let queue = Queue::default();
        let scheduled = Arc::new(AtomicUsize::new(0));
        queue.set_scheduler(Box::new(Scheduled(scheduled.clone())));
        let tokens = |model: &'static str, kind: &'static str| [model, "up", kind];
        queue.push(Metric::Tokens, &tokens("m", "input"), 7);
        queue.push(Metric::Translation, &["false"], 80);
        queue.push(Metric::Tokens, &tokens("m", "input"), 5);
        // Not the same series: the label values differ, though their text joined is the same.
        queue.push(Metric::Tokens, &["mu", "p", "input"], 1);
        queue.push(Metric::Translation, &["false"], 90);
        // One flush scheduled for all of them.
        assert_eq!(scheduled.load(Ordering::SeqCst), 1);
        let mut calls = Calls::default();
        queue.flush(&metrics, &mut calls);
        let tokens_id = metrics.id(Metric::Tokens).0;
        let translation_id = metrics.id(Metric::Translation).0;
        let strings = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            calls.0,
            [
                ("observe", translation_id, strings(&["false"]), 80),
                ("observe", translation_id, strings(&["false"]), 90),
                ("count", tokens_id, strings(&["m", "up", "input"]), 12),
                ("count", tokens_id, strings(&["mu", "p", "input"]), 1),
            ]
        );
        // Flushed: nothing left, and the next push schedules again.
        let mut again = Calls::default();
        queue.flush(&metrics, &mut again);
        assert!(again.0.is_empty());
        queue.push(Metric::Exchanges, &["create", "false", "translated", ""], 1);
        assert_eq!(scheduled.load(Ordering::SeqCst), 2);
    }
}
