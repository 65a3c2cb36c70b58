//! What a filter (an HTTP exchange or a WebSocket connection) tells Envoy besides its answer:
//! the core's metrics as Envoy's stats, its log lines, the attributes on a span.

use responses_core::connection;
use responses_core::exchange;
use responses_core::life::{self, Timing};
use responses_core::log;
use responses_core::metrics::{self, Kind, Metric, Recorder};
use responses_core::telemetry::{self, Transport};

use crate::config::{FilterConfig, Metrics};
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

/// An exchange's event, into Envoy's stats.
pub(crate) fn count(host: &mut impl Host, config: &FilterConfig, event: &life::Event) {
    let metrics = &config.metrics;
    metrics::record(&mut Stats { host, metrics }, &config.labels, event);
}

/// A WebSocket connection's event, into Envoy's stats.
pub(crate) fn count_socket(host: &mut impl Host, config: &FilterConfig, event: &connection::Event) {
    let metrics = &config.metrics;
    metrics::record_socket(&mut Stats { host, metrics }, &config.labels, event);
}

/// The core's metrics calls, onto Envoy's stats.
struct Stats<'a, H> {
    host: &'a mut H,
    metrics: &'a Metrics,
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
    tag_attributes(host, span, &telemetry::attributes(s, timing), transport);
    if s.model.is_some() {
        host.rename_span(span, &telemetry::span_name(s));
    }
}

/// A span gets these attributes of the core's and the transport.
pub(crate) fn tag_attributes(
    host: &mut impl Host,
    span: SpanRef,
    attributes: &[telemetry::Attribute<'_>],
    transport: Transport,
) {
    let texts: Vec<_> = attributes.iter().map(|a| a.value.text()).collect();
    let mut tags: Vec<(&str, &str)> = attributes
        .iter()
        .zip(&texts)
        .map(|(a, text)| (a.key, text.as_ref()))
        .collect();
    tags.push((telemetry::key::TRANSPORT, transport.as_str()));
    host.tag_span(span, &tags);
}

/// A log line, formatted only when Envoy logs that level.
pub(crate) fn log(host: &impl Host, level: Level, message: impl FnOnce() -> String) {
    if host.log_enabled(level) {
        host.log(level, &message());
    }
}
