//! Traces (`--otlp-endpoint`): one span per exchange, a child of the caller's span (W3C trace
//! context: the `traceparent` Envoy puts in the ext_proc stream's gRPC metadata, or on the
//! WebSocket handshake), named and tagged as the OpenTelemetry GenAI conventions say, exported
//! over OTLP by [`export`] (batched, bounded: a slow or absent collector costs dropped spans,
//! never an exchange).
//!
//! Everything on the span comes from what the adapters already have at the end of an exchange:
//! the core's [`Summary`] and the adapter's [`Timing`] (the same two the metrics record), named
//! and valued by the core ([`responses_core::telemetry`], which the in-process module puts on
//! Envoy's span too); here they become OpenTelemetry attributes. The
//! span is opened when the exchange becomes ours (so that the WebSocket transport can pass its
//! context on to the Chat request it makes) and filled and ended once, when it ends.
//!
//! Off (no endpoint), none of this runs: the adapters hold `None`.

mod export;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http::{HeaderName, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Array, Context, KeyValue, StringValue, Value};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider, Span};

use crate::config::Config;
use crate::metrics::{Metrics, Timing};
use crate::otlp::{self, Destination, Protocol, Signal};
use responses_core::exchange::{Outcome, Summary};
use responses_core::life::CallTiming;
use responses_core::openresponses::Code;
pub use responses_core::telemetry::Transport;
use responses_core::telemetry::{self, key, Attribute};

/// Bodies recorded with `--trace-content` are cut at this many bytes.
const MAX_CONTENT_BYTES: usize = 64 * 1024;
/// The processor's own attributes (never on Envoy's span): `--trace-content`'s bodies.
const REQUEST_BODY_ATTR: &str = "responses_extproc.request.body";
const RESPONSE_BODY_ATTR: &str = "responses_extproc.response.body";

/// The tracer of the process, shared by every adapter.
#[derive(Debug)]
pub struct Traces {
    tracer: SdkTracer,
    provider: SdkTracerProvider,
    propagator: TraceContextPropagator,
    /// `--trace-content`: request and answer bodies on the spans.
    content: bool,
    exporter: export::Handle,
}

impl Traces {
    /// The tracer `config` asks for, its exporter started on the current tokio runtime;
    /// `None` when tracing is off: no `--otlp-endpoint` and none of the standard
    /// `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT` variables, or `OTEL_SDK_DISABLED=true`, or
    /// `OTEL_TRACES_EXPORTER=none`. `metrics`: where dropped spans are counted.
    pub fn start(config: &Config, metrics: Option<Arc<Metrics>>) -> Result<Option<Traces>, String> {
        let Some(destination) =
            Destination::resolve(config.otlp_endpoint.as_deref(), Signal::Traces, otlp::env)?
        else {
            return Ok(None);
        };
        let resource = otlp::resource();
        let exporter = build_exporter(&destination, &resource)?;
        let (processor, handle) =
            export::BatchExport::start(exporter, export::Limits::from_env(), metrics);
        // The sampler honours OTEL_TRACES_SAMPLER (default: parent-based, always on): an
        // exchange whose caller did not sample its trace is not recorded either.
        let provider = SdkTracerProvider::builder()
            .with_resource(resource)
            .with_span_processor(processor)
            .build();
        let tracer = opentelemetry::trace::TracerProvider::tracer_with_scope(
            &provider,
            opentelemetry::InstrumentationScope::builder(env!("CARGO_PKG_NAME"))
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
        );
        tracing::info!(
            endpoint = %destination.used,
            protocol = ?destination.protocol,
            tls = destination.describe_tls(),
            content = config.trace_content,
            "exporting traces over OTLP"
        );
        if config.trace_content {
            tracing::warn!(
                "--trace-content is on: prompts and completions are recorded on the spans"
            );
        }
        Ok(Some(Traces {
            tracer,
            provider,
            propagator: TraceContextPropagator::new(),
            content: config.trace_content,
            exporter: handle,
        }))
    }

    /// The caller's trace context from its W3C headers (`traceparent`, `tracestate`), read by
    /// `header`; an empty context (a new trace) when there is none or it is malformed.
    /// Whether `--trace-content` records bodies on the spans.
    pub fn wants_content(&self) -> bool {
        self.content
    }

    pub fn parent<'h>(&self, header: impl Fn(&str) -> Option<&'h str>) -> Context {
        // The lifetime marker ties the headers' borrow to the extractor's.
        struct Headers<'h, F>(F, std::marker::PhantomData<&'h str>);
        impl<'h, F: Fn(&str) -> Option<&'h str>> Extractor for Headers<'h, F> {
            fn get(&self, key: &str) -> Option<&str> {
                (self.0)(key)
            }
            fn keys(&self) -> Vec<&str> {
                Vec::new()
            }
        }
        self.propagator
            .extract(&Headers(header, std::marker::PhantomData))
    }

    /// Opens the span of an exchange that started `elapsed` ago, as a child of `parent`.
    pub fn start_exchange(
        &self,
        parent: &Context,
        transport: Transport,
        elapsed: Duration,
    ) -> ExchangeSpan {
        let started = SystemTime::now()
            .checked_sub(elapsed)
            .unwrap_or_else(SystemTime::now);
        let span = self
            .tracer
            .span_builder(telemetry::OPERATION)
            .with_kind(SpanKind::Server)
            .with_start_time(started)
            .with_attributes([KeyValue::new(key::TRANSPORT, transport.as_str())])
            .start_with_context(&self.tracer, parent);
        ExchangeSpan {
            span,
            started,
            content: self.content,
        }
    }

    /// Exports what is queued (for at most `timeout`) and stops the exporter.
    pub async fn shutdown(&self, timeout: Duration) {
        self.exporter.shutdown(timeout).await;
        let _ = self.provider.shutdown();
    }
}

/// The OTLP exporter; the standard `OTEL_EXPORTER_OTLP_*` variables (headers, timeout,
/// compression, the endpoint when `--otlp-endpoint` is not given) are read by
/// opentelemetry-otlp itself, the TLS ones by [`otlp::tls`]. `--otlp-endpoint` is a base URL,
/// like `OTEL_EXPORTER_OTLP_ENDPOINT`: over HTTP the exporter posts to `/v1/traces` under it.
fn build_exporter(
    to: &Destination,
    resource: &opentelemetry_sdk::Resource,
) -> Result<opentelemetry_otlp::SpanExporter, String> {
    use opentelemetry_otlp::SpanExporter;
    use opentelemetry_sdk::trace::SpanExporter as _;
    let built = match to.protocol {
        Protocol::Grpc => to.grpc(SpanExporter::builder().with_tonic()).build(),
        Protocol::HttpProtobuf => to.http(SpanExporter::builder().with_http())?.build(),
    };
    let mut exporter = built
        .map_err(|e| format!("the OTLP exporter (--otlp-endpoint, OTEL_EXPORTER_OTLP_*): {e}"))?;
    exporter.set_resource(resource);
    Ok(exporter)
}

/// The span of one exchange, open until [`ExchangeSpan::finish`].
#[derive(Debug)]
pub struct ExchangeSpan {
    span: Span,
    started: SystemTime,
    content: bool,
}

impl ExchangeSpan {
    /// `traceparent` (and `tracestate`) continuing this span's trace, for a request the
    /// exchange makes (the WebSocket transport's Chat request back through Envoy).
    pub fn propagation_headers(&self) -> Vec<(HeaderName, HeaderValue)> {
        struct Out(Vec<(HeaderName, HeaderValue)>);
        impl Injector for Out {
            fn set(&mut self, key: &str, value: String) {
                if value.is_empty() {
                    return;
                }
                if let (Ok(k), Ok(v)) = (
                    HeaderName::from_bytes(key.as_bytes()),
                    HeaderValue::from_str(&value),
                ) {
                    self.0.push((k, v));
                }
            }
        }
        let cx = Context::new().with_remote_span_context(self.span.span_context().clone());
        let mut out = Out(Vec::with_capacity(2));
        TraceContextPropagator::new().inject_context(&cx, &mut out);
        out.0
    }

    /// `--trace-content`: the client's request as it arrived.
    pub fn record_request(&mut self, body: &[u8]) {
        if self.content && self.span.is_recording() {
            self.span
                .set_attribute(KeyValue::new(REQUEST_BODY_ATTR, text(body)));
        }
    }

    /// `--trace-content`: the answer the client got (the response object, the stream's
    /// terminal event, or the error).
    pub fn record_answer(&mut self, body: &[u8]) {
        if self.content && self.span.is_recording() {
            self.span
                .set_attribute(KeyValue::new(RESPONSE_BODY_ATTR, text(body)));
        }
    }

    /// Whether `--trace-content` wants the bodies (so that adapters find them only then).
    pub fn wants_content(&self) -> bool {
        self.content && self.span.is_recording()
    }

    /// The exchange's own call (an automatic compaction's summarising request): an event at
    /// its start, with its duration and the compaction's outcome and tokens.
    pub fn call_event(&mut self, timing: &CallTiming) {
        if self.span.is_recording() {
            let attributes = telemetry::call_attributes(timing);
            self.span.add_event_with_timestamp(
                telemetry::COMPACTION_EVENT,
                self.started + timing.started,
                attributes.iter().map(key_value).collect(),
            );
        }
    }

    /// Tags the span with what the exchange reported and ends it `timing.total` after it
    /// started.
    pub fn finish(mut self, summary: &Summary, timing: &Timing) {
        if self.span.is_recording() {
            if summary.model.is_some() {
                self.span.update_name(telemetry::span_name(summary));
            }
            self.span.set_attributes(attributes(summary, timing));
            if let Some(first) = timing.first_output {
                self.span.add_event_with_timestamp(
                    telemetry::FIRST_TOKEN_EVENT,
                    self.started + first,
                    Vec::new(),
                );
            }
            match (summary.outcome, &summary.error_code) {
                (Outcome::Translated, _) => {}
                (Outcome::Failed, code) => self.span.set_status(Status::error(
                    code.as_ref().map_or_else(|| "failed".to_owned(), Code::to_string),
                )),
                (Outcome::Open, _) => self.span.set_status(Status::error(
                    "the exchange ended before its answer was complete (client gone, upstream reset or timeout)",
                )),
            }
        }
        self.span.end_with_timestamp(self.started + timing.total);
    }

    /// Ends the span of a message refused before it became an exchange (a WebSocket message
    /// that is not a valid `response.create`).
    pub fn refused(mut self, status: u16, code: Option<&str>, timing: &Timing) {
        if self.span.is_recording() {
            let code = code.unwrap_or("invalid_request");
            self.span.set_attributes(
                telemetry::refused_attributes(status, code)
                    .iter()
                    .map(key_value),
            );
            self.span.set_status(Status::error(code.to_owned()));
        }
        self.span.end_with_timestamp(self.started + timing.total);
    }
}

/// The span's attributes (the core's, see the table in docs/operations.md) as OpenTelemetry's.
fn attributes(s: &Summary, timing: &Timing) -> Vec<KeyValue> {
    telemetry::attributes(s, timing)
        .iter()
        .map(key_value)
        .collect()
}

fn key_value(a: &Attribute<'_>) -> KeyValue {
    use telemetry::Value as V;
    let value = match a.value {
        V::Str(s) => Value::from(s.to_owned()),
        V::Bool(b) => Value::Bool(b),
        V::Int(n) => Value::I64(n),
        V::F64(x) => Value::F64(x),
        V::Strs(items) => Value::Array(Array::String(
            items.iter().cloned().map(StringValue::from).collect(),
        )),
    };
    KeyValue::new(a.key, value)
}

/// A body as attribute text: lossy UTF-8, cut at [`MAX_CONTENT_BYTES`].
fn text(body: &[u8]) -> String {
    let cut = body.len() > MAX_CONTENT_BYTES;
    let mut s = String::from_utf8_lossy(&body[..body.len().min(MAX_CONTENT_BYTES)]).into_owned();
    if cut {
        s.push_str(&format!(" [cut: {} bytes in all]", body.len()));
    }
    s
}

#[cfg(test)]
mod tests;
