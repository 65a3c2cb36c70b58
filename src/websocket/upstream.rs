//! The Chat request of one WebSocket response, sent with reqwest (streaming) back through
//! Envoy's listener, and its answer as a sequence of events for the connection's loop.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use super::WsSettings;
use responses_core::exchange::{Settings, UpstreamRequest, JSON};
use responses_core::upstream_failure::keeps_headers;

/// Handshake headers that go on to each Chat request: credentials, tracing, the client's
/// name. Everything else of the handshake (cookies, `sec-websocket-*`) stays here.
pub const FORWARDED_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "openai-organization",
    "openai-project",
    "x-request-id",
    "traceparent",
    "tracestate",
    "user-agent",
];

/// The handshake's headers that are forwarded (see [`FORWARDED_HEADERS`]).
pub fn forwarded_headers(headers: &HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    FORWARDED_HEADERS
        .iter()
        .filter_map(|name| {
            let value = headers.get(*name)?;
            Some((HeaderName::from_static(name), value.clone()))
        })
        .collect()
}

/// The HTTP client of the transport (one pool for all connections).
#[derive(Debug)]
pub struct Upstream {
    client: reqwest::Client,
    url: String,
    /// The model headers' names (checked to be header names).
    exchange: Arc<Settings>,
}

type Pending = Pin<Box<dyn Future<Output = reqwest::Result<reqwest::Response>> + Send>>;
pub type Body = Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>> + Send>>;

/// A Chat request in flight.
pub enum Call {
    /// Sent; waiting for the answer's head.
    Waiting(Pending),
    /// Reading the answer's body.
    Body(Body),
}

/// What happened next to a [`Call`].
pub enum UpstreamEvent {
    Head {
        status: u16,
        content_type: String,
        /// Every header of an answer that is not a success (the core keeps some on the
        /// error event; a success's are not read).
        headers: reqwest::header::HeaderMap,
        body: Body,
    },
    Chunk(Bytes),
    End,
    /// No answer (connection refused, reset, a read error): the message says what.
    Failed(String),
}

impl Upstream {
    pub fn new(settings: &WsSettings) -> Result<Self, String> {
        let url = format!(
            "{}{}",
            settings.upstream.trim_end_matches('/'),
            settings.exchange.chat_path
        );
        reqwest::Url::parse(&url).map_err(|e| format!("--ws-upstream {url}: {e}"))?;
        for (flag, name) in [
            ("--model-header", &settings.exchange.model_header),
            (
                "--upstream-model-header",
                &settings.exchange.upstream_model_header,
            ),
        ] {
            HeaderName::from_bytes(name.as_bytes()).map_err(|e| format!("{flag}: {e}"))?;
        }
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            // Every request is on loopback to Envoy: no proxy from the environment.
            .no_proxy()
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("the WebSocket transport's HTTP client: {e}"))?;
        Ok(Upstream {
            client,
            url,
            exchange: settings.exchange.clone(),
        })
    }

    /// Sends the Chat request with the handshake's `forwarded` headers; `trace` (the
    /// response's span context, traces on) replaces their `traceparent` and `tracestate`.
    pub fn call(
        &self,
        req: UpstreamRequest,
        forwarded: &[(HeaderName, HeaderValue)],
        trace: &[(HeaderName, HeaderValue)],
    ) -> Call {
        let mut builder = self
            .client
            .post(&self.url)
            .header(reqwest::header::CONTENT_TYPE, JSON)
            .header(
                reqwest::header::ACCEPT,
                if req.stream {
                    "text/event-stream"
                } else {
                    JSON
                },
            );
        for (name, value) in req.model_headers(&self.exchange) {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                builder = builder.header(name, value);
            }
        }
        // The response's span (a child of the handshake's trace) is the Chat request's parent.
        let handshake_trace = |name: &HeaderName| {
            !trace.is_empty() && (name == "traceparent" || name == "tracestate")
        };
        for (name, value) in forwarded
            .iter()
            .filter(|(name, _)| !handshake_trace(name))
            .chain(trace)
        {
            builder = builder.header(name.clone(), value.clone());
        }
        Call::Waiting(Box::pin(builder.body(req.body).send()))
    }
}

impl Call {
    /// The next thing that happens to the request (cancel-safe: a dropped future loses
    /// nothing).
    pub async fn next(&mut self) -> UpstreamEvent {
        match self {
            Call::Waiting(pending) => match pending.await {
                Ok(resp) => {
                    let content_type = resp
                        .headers()
                        .get(reqwest::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("")
                        .to_owned();
                    let status = resp.status().as_u16();
                    let headers = if keeps_headers(status) {
                        resp.headers().clone()
                    } else {
                        reqwest::header::HeaderMap::new()
                    };
                    UpstreamEvent::Head {
                        status,
                        content_type,
                        headers,
                        body: Box::pin(resp.bytes_stream()),
                    }
                }
                Err(e) => UpstreamEvent::Failed(format!(
                    "The upstream could not be reached: {}.",
                    error_chain(&e)
                )),
            },
            Call::Body(body) => match body.next().await {
                Some(Ok(chunk)) => UpstreamEvent::Chunk(chunk),
                Some(Err(e)) => UpstreamEvent::Failed(format!(
                    "The upstream connection failed before the answer was complete: {}.",
                    error_chain(&e)
                )),
                None => UpstreamEvent::End,
            },
        }
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}
