//! Prometheus metrics: OpenTelemetry GenAI semantic-convention names (as Envoy AI Gateway and
//! agentgateway export them) plus the processor's own. Adapters record one exchange at its
//! end ([`Metrics::record`]); `/metrics` renders the registry ([`Metrics::render`]).
//!
//! Label values from clients are untrusted: model names and error codes go through
//! [`Bounded`], which keeps the first `max` distinct values (or an allow-list) and files the
//! rest under `other`, so a client cannot grow the series without bound.

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use responses_core::exchange::{Outcome, Summary};
use responses_core::openresponses::Code;
use responses_core::proxy;

// `gen_ai_operation_name`: the spans' `gen_ai.operation.name`.
use responses_core::telemetry::OPERATION;
/// The label value for everything past a [`Bounded`] cap.
pub const OTHER: &str = "other";

/// How long and how fast one exchange was, measured by its adapter (the core's plain data,
/// shared with the spans).
pub use responses_core::telemetry::Timing;

/// Which metric labels to keep for untrusted values.
#[derive(Debug, Clone)]
pub struct LabelPolicy {
    /// Model names kept as labels: these only, if set; else the first `max_models` seen.
    pub allowed_models: Option<Vec<String>>,
    pub max_models: usize,
}

impl Default for LabelPolicy {
    fn default() -> Self {
        LabelPolicy {
            allowed_models: None,
            max_models: 64,
        }
    }
}

/// A label whose values come from outside: at most `max` distinct values, the rest `other`.
#[derive(Debug)]
pub struct Bounded {
    allowed: Option<HashSet<String>>,
    seen: Mutex<HashSet<String>>,
    max: usize,
}

impl Bounded {
    pub fn new(allowed: Option<Vec<String>>, max: usize) -> Self {
        Bounded {
            allowed: allowed.map(|a| a.into_iter().collect()),
            seen: Mutex::new(HashSet::new()),
            max,
        }
    }

    /// The label value to use for `value`.
    pub fn label<'a>(&self, value: &'a str) -> &'a str {
        if let Some(allowed) = &self.allowed {
            return if allowed.contains(value) {
                value
            } else {
                OTHER
            };
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(value) {
            value
        } else if seen.len() < self.max {
            seen.insert(value.to_owned());
            value
        } else {
            OTHER
        }
    }
}

/// The processor's metrics, registered once.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    token_usage: HistogramVec,
    request_duration: HistogramVec,
    time_to_first_token: HistogramVec,
    time_per_output_token: HistogramVec,
    exchanges: IntCounterVec,
    caps_hit: IntCounterVec,
    translation: HistogramVec,
    streams_in_flight: IntGauge,
    websocket_connections: IntGauge,
    spans_exported: IntCounterVec,
    spans_dropped: IntCounterVec,
    models: Bounded,
    error_codes: Bounded,
}

impl Metrics {
    pub fn new(labels: LabelPolicy) -> Self {
        let registry = Registry::new();
        let model_labels = &[
            "gen_ai_operation_name",
            "gen_ai_request_model",
            "gen_ai_response_model",
        ];
        let with = |extra: &[&'static str]| -> Vec<&'static str> {
            model_labels
                .iter()
                .copied()
                .chain(extra.iter().copied())
                .collect()
        };
        // Buckets of the OTel GenAI semantic conventions' advice.
        let tokens = vec![
            1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
            4194304.0, 16777216.0, 67108864.0,
        ];
        let seconds = vec![
            0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
        ];
        let per_token = vec![
            0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
        ];
        let histogram = |name: &str, help: &str, buckets: &[f64], labels: &[&str]| {
            let h = HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                labels,
            )
            .expect("valid histogram");
            registry
                .register(Box::new(h.clone()))
                .expect("registered once");
            h
        };
        let token_usage = histogram(
            "gen_ai_client_token_usage",
            "Tokens per exchange, as the upstream reported them, by gen_ai_token_type (input, output, and this processor's cached and reasoning).",
            &tokens,
            &with(&["gen_ai_token_type"]),
        );
        let request_duration = histogram(
            "gen_ai_server_request_duration_seconds",
            "Time from the request to the end of its answer (streams: to the terminal event).",
            &seconds,
            &with(&["stream", "outcome"]),
        );
        let time_to_first_token = histogram(
            "gen_ai_server_time_to_first_token_seconds",
            "Streams: time from the request to the first output event sent to the client.",
            &seconds,
            &with(&[]),
        );
        let time_per_output_token = histogram(
            "gen_ai_server_time_per_output_token_seconds",
            "Streams: time per output token after the first.",
            &per_token,
            &with(&[]),
        );
        let translation = histogram(
            "responses_extproc_translation_seconds",
            "Time spent in the translation core per exchange (validation, mapping, events), excluding waits.",
            &[0.00001, 0.00003, 0.0001, 0.0003, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0],
            &["stream"],
        );
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid counter");
            registry
                .register(Box::new(c.clone()))
                .expect("registered once");
            c
        };
        let exchanges = counter(
            "responses_extproc_exchanges_total",
            "Exchanges by how they ended: translated, failed (with the error code) or cut (Envoy ended them first).",
            &["stream", "outcome", "error_code"],
        );
        let caps_hit = counter(
            "responses_extproc_caps_hit_total",
            "Exchanges that ended at a size cap, by the cap's error code.",
            &["cap"],
        );
        // Traces (--otlp-endpoint): what the exporter sent and what it had to drop.
        let spans_exported = counter(
            "responses_extproc_spans_exported_total",
            "Spans the OTLP exporter delivered to the collector (traces, --otlp-endpoint).",
            &[],
        );
        let spans_dropped = counter(
            "responses_extproc_spans_dropped_total",
            "Spans dropped instead of exported: queue_full (the collector is slower than the exchanges), export_failed (the collector refused or did not answer), shutdown.",
            &["reason"],
        );
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid gauge");
            registry
                .register(Box::new(g.clone()))
                .expect("registered once");
            g
        };
        let streams_in_flight = gauge(
            "responses_extproc_streams_in_flight",
            "Streamed answers being translated now.",
        );
        let websocket_connections = gauge(
            "responses_extproc_websocket_connections",
            "Open WebSocket connections (the WebSocket transport; 0 while it is not enabled).",
        );
        Metrics {
            registry,
            token_usage,
            request_duration,
            time_to_first_token,
            time_per_output_token,
            exchanges,
            caps_hit,
            translation,
            streams_in_flight,
            websocket_connections,
            spans_exported,
            spans_dropped,
            models: Bounded::new(labels.allowed_models, labels.max_models),
            // Our codes are a fixed set; an upstream's own codes are not.
            error_codes: Bounded::new(None, 64),
        }
    }

    /// A stream started (its head went to the client); pair with [`Metrics::stream_ended`].
    pub fn stream_started(&self) {
        self.streams_in_flight.inc();
    }

    pub fn stream_ended(&self) {
        self.streams_in_flight.dec();
    }

    /// The gauge a WebSocket adapter keeps: +1 on accept, -1 on close.
    pub fn websocket_connections(&self) -> &IntGauge {
        &self.websocket_connections
    }

    /// Spans the trace exporter delivered.
    pub fn spans_exported(&self, n: u64) {
        self.spans_exported.with_label_values::<&str>(&[]).inc_by(n);
    }

    /// Spans the trace exporter dropped, and why (`queue_full`, `export_failed`, `shutdown`).
    pub fn spans_dropped(&self, reason: &str, n: u64) {
        self.spans_dropped.with_label_values(&[reason]).inc_by(n);
    }

    /// Records one finished (or cut) exchange.
    pub fn record(&self, summary: &Summary, timing: Timing) {
        let stream = if summary.stream { "true" } else { "false" };
        let outcome = proxy::recorded_outcome(summary.outcome);
        let code = summary.error_code.as_ref().map(Code::as_str).unwrap_or("");
        self.exchanges
            .with_label_values(&[stream, outcome, self.error_codes.label(code)])
            .inc();
        if summary.error_code.as_ref().is_some_and(Code::is_cap) {
            self.caps_hit.with_label_values(&[code]).inc();
        }
        self.translation
            .with_label_values(&[stream])
            .observe(timing.translation.as_secs_f64());
        // Requests refused before a model was read have no model to speak of.
        let Some(model) = summary.model.as_deref() else {
            return;
        };
        let request_model = self.models.label(model);
        let response_model = self
            .models
            .label(summary.upstream_model.as_deref().unwrap_or(""));
        let models = [OPERATION, request_model, response_model];
        self.request_duration
            .with_label_values(&[&models[..], &[stream, outcome]].concat())
            .observe(timing.total.as_secs_f64());
        if let Some(usage) = &summary.usage {
            for (kind, n) in proxy::token_counts(usage) {
                self.token_usage
                    .with_label_values(&[&models[..], &[kind]].concat())
                    .observe(n as f64);
            }
        }
        if let (true, Some(first)) = (summary.stream, timing.first_output) {
            self.time_to_first_token
                .with_label_values(&models)
                .observe(first.as_secs_f64());
            let output_tokens = summary.usage.map_or(0, |u| u.output_tokens);
            if output_tokens > 1 && summary.outcome == Outcome::Translated {
                let after_first = timing.total.saturating_sub(first).as_secs_f64();
                self.time_per_output_token
                    .with_label_values(&models)
                    .observe(after_first / (output_tokens - 1) as f64);
            }
        }
    }

    /// The exposition text of every metric (`text/plain; version=0.0.4`).
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        // Encoding our own registry into memory cannot fail.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use responses_core::exchange::Operation;
    use responses_core::openresponses::{ErrorCode, Usage};
    use std::time::Duration;

    fn summary(model: &str, outcome: Outcome, code: Option<ErrorCode>) -> Summary {
        Summary {
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
        }
    }

    fn line<'a>(text: &'a str, name: &str, labels: &[&str]) -> Option<&'a str> {
        text.lines()
            .find(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
    }

    #[test]
    fn an_exchange_is_counted_with_its_tokens_and_times() {
        let m = Metrics::new(LabelPolicy::default());
        let timing = Timing {
            total: Duration::from_millis(1200),
            first_output: Some(Duration::from_millis(200)),
            translation: Duration::from_micros(80),
        };
        m.record(&summary("m1", Outcome::Translated, None), timing);
        let text = m.render();
        let out = line(
            &text,
            "gen_ai_client_token_usage_sum",
            &[
                "gen_ai_token_type=\"output\"",
                "gen_ai_request_model=\"m1\"",
                "gen_ai_response_model=\"upstream-m\"",
            ],
        )
        .unwrap();
        assert!(out.ends_with(" 11"), "{out}");
        let input = line(
            &text,
            "gen_ai_client_token_usage_sum",
            &["gen_ai_token_type=\"input\""],
        )
        .unwrap();
        assert!(input.ends_with(" 7"), "{input}");
        let ttft = line(&text, "gen_ai_server_time_to_first_token_seconds_sum", &[]).unwrap();
        assert!(ttft.ends_with(" 0.2"), "{ttft}");
        // (1.2 s - 0.2 s) / 10 tokens after the first.
        let tpot = line(
            &text,
            "gen_ai_server_time_per_output_token_seconds_sum",
            &[],
        )
        .unwrap();
        assert!(tpot.ends_with(" 0.1"), "{tpot}");
        let n = line(
            &text,
            "responses_extproc_exchanges_total",
            &["outcome=\"translated\""],
        )
        .unwrap();
        assert!(n.ends_with(" 1"), "{n}");
    }

    #[test]
    fn failures_count_their_code_and_caps() {
        let m = Metrics::new(LabelPolicy::default());
        m.record(
            &summary("m", Outcome::Failed, Some(ErrorCode::ResponseTooLarge)),
            Timing::default(),
        );
        m.record(&summary("m", Outcome::Open, None), Timing::default());
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
        assert!(
            line(
                &text,
                "responses_extproc_exchanges_total",
                &["outcome=\"cut\""]
            )
            .is_some(),
            "{text}"
        );
        let cap = line(
            &text,
            "responses_extproc_caps_hit_total",
            &["cap=\"response_too_large\""],
        )
        .unwrap();
        assert!(cap.ends_with(" 1"), "{cap}");
    }

    #[test]
    fn model_labels_are_bounded() {
        let m = Metrics::new(LabelPolicy {
            allowed_models: None,
            max_models: 2,
        });
        for i in 0..50 {
            m.record(
                &summary(&format!("model-{i}"), Outcome::Translated, None),
                Timing::default(),
            );
        }
        let text = m.render();
        let series: HashSet<&str> = text
            .lines()
            .filter(|l| l.starts_with("gen_ai_server_request_duration_seconds_count"))
            .collect();
        // model-0 and upstream-m took the two slots; everything else is "other".
        assert_eq!(series.len(), 2, "{series:?}");
        assert!(text.contains("gen_ai_request_model=\"other\""));
        let allow = Bounded::new(Some(vec!["a".into()]), 0);
        assert_eq!((allow.label("a"), allow.label("b")), ("a", OTHER));
    }
}
