//! What a filter (an HTTP exchange or a WebSocket connection) tells Envoy besides its answer:
//! the core's metrics as Envoy's stats, its log lines, the attributes on a span.

use responses_core::exchange;
use responses_core::life::Timing;
use responses_core::log;
use responses_core::metrics::{Kind, Metric, Recorder};
use responses_core::telemetry::{self, Transport};

use crate::config::Metrics;
use crate::host::{Host, Level, SpanRef};

/// One of the core's log lines, as Envoy's (formatted only when Envoy logs its level).
pub(crate) fn log_line(host: &impl Host, line: &log::Line<'_>, request_id: &str) {
    let level = match line.level {
        log::Level::Debug => Level::Debug,
        log::Level::Info => Level::Info,
        log::Level::Warn => Level::Warn,
    };
    if host.log_enabled(level) {
        let request_id = log::Logged(request_id);
        host.log(level, &format!("{line} request_id={request_id}"));
    }
}

/// The core's metrics calls, onto Envoy's stats.
pub(crate) struct Stats<'a, H> {
    pub(crate) host: &'a mut H,
    pub(crate) metrics: &'a Metrics,
}

impl<H: Host> Recorder for Stats<'_, H> {
    fn record(&mut self, metric: Metric, labels: &[&str], value: u64) {
        let id = self.metrics.id(metric);
        match metric.family().kind {
            Kind::Counter => self.host.count(id, labels, value),
            Kind::Histogram => self.host.observe(id, labels, value),
            Kind::Gauge => debug_assert!(false, "{metric:?} is a gauge"),
        }
    }

    fn gauge_add(&mut self, metric: Metric, delta: i64) {
        self.host.gauge_add(self.metrics.id(metric), delta);
    }
}

/// A span gets the exchange's attributes, the transport and the exchange's name.
pub(crate) fn tag_span(
    host: &mut impl Host,
    span: SpanRef,
    s: &exchange::Summary,
    timing: &Timing,
    transport: Transport,
) {
    let attributes = telemetry::attributes(s, timing);
    let texts: Vec<_> = attributes.iter().map(|a| a.value.text()).collect();
    let mut tags: Vec<(&str, &str)> = attributes
        .iter()
        .zip(&texts)
        .map(|(a, text)| (a.key, text.as_ref()))
        .collect();
    tags.push((telemetry::key::TRANSPORT, transport.as_str()));
    host.tag_span(span, &tags);
    if s.model.is_some() {
        host.rename_span(span, &telemetry::span_name(s));
    }
}

/// A log line, formatted only when Envoy logs that level.
pub(crate) fn log(host: &impl Host, level: Level, message: impl FnOnce() -> String) {
    if host.log_enabled(level) {
        host.log(level, &message());
    }
}
