//! The head of a callout that carries one of the core's calls (a socket's Chat request, an
//! HTTP exchange's side call) to `upstream_cluster`: the pseudo-headers, the call's own
//! headers, and the trace context of the span the call continues in place of the client's, so
//! that Envoy's spans for it, on the listener it loops back to, are that span's children.

use responses_core::call::Call;
use responses_core::telemetry;

use crate::host::{SpanRef, Terminal};

/// What a call's head is made of besides the call.
#[derive(Debug)]
pub struct CallHead<'c> {
    call: &'c Call,
    authority: &'c str,
    length: String,
    /// The continued span's, when Envoy traces.
    traceparent: Option<String>,
}

impl<'c> CallHead<'c> {
    /// The head of `call` for the virtual host `authority`, continuing `span` (if any).
    pub fn new(
        host: &impl Terminal,
        call: &'c Call,
        authority: &'c str,
        span: Option<SpanRef>,
    ) -> CallHead<'c> {
        let traceparent = span
            .and_then(|span| host.span_ids(span))
            .and_then(|(trace, span)| telemetry::traceparent(&trace, &span));
        CallHead {
            call,
            authority,
            length: call.body.len().to_string(),
            traceparent,
        }
    }

    /// The headers, in order (the client's `traceparent` and `tracestate` replaced when a span
    /// is continued).
    pub fn headers(&self) -> Vec<(&str, &str)> {
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", &self.call.path),
            (":authority", self.authority),
            ("content-length", &self.length),
        ];
        let replaced = |name: &str| {
            self.traceparent.is_some() && (name == "traceparent" || name == "tracestate")
        };
        headers.extend(
            self.call
                .headers
                .iter()
                .filter(|(name, _)| !replaced(name))
                .map(|(name, value)| (name.as_ref(), value.as_str())),
        );
        if let Some(traceparent) = &self.traceparent {
            headers.push(("traceparent", traceparent));
        }
        headers
    }
}
