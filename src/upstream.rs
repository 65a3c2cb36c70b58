//! The processor's own Chat calls (the core's `call::Call`: each response of a WebSocket
//! connection, an automatic compaction's summarising request), sent with reqwest (streaming)
//! back through Envoy's listener (`--ws-upstream`), and their answers as a sequence of events.

use std::future::Future;
use std::pin::Pin;

use axum::http::{HeaderName, HeaderValue};
use bytes::Bytes;
use futures_util::{Stream, StreamExt};

use responses_core::call::{Call as CoreCall, ReportedHead};
use responses_core::metadata::record::Record;

/// How long a turn's record may take: Envoy answers it itself, after one ext_proc message.
const RECORD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The HTTP client of the calls (one pool for all of them).
#[derive(Debug)]
pub struct Upstream {
    client: reqwest::Client,
    /// `--ws-upstream`, without its trailing slash: a call's path goes after it.
    base: String,
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
        headers: reqwest::header::HeaderMap,
        body: Body,
    },
    Chunk(Bytes),
    End,
    /// No answer (connection refused, reset, a read error): the message says what.
    Failed(String),
}

impl Upstream {
    /// `base`: `--ws-upstream`; `chat_path`: the path of every call.
    pub fn new(base: &str, chat_path: &str) -> Result<Self, String> {
        let base = base.trim_end_matches('/').to_owned();
        let url = format!("{base}{chat_path}");
        reqwest::Url::parse(&url).map_err(|e| format!("--ws-upstream {url}: {e}"))?;
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            // Every request is on loopback to Envoy: no proxy from the environment.
            .no_proxy()
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("the processor's HTTP client: {e}"))?;
        Ok(Upstream { client, base })
    }

    /// Makes the connection's call; `trace` (the response's span context, traces on)
    /// replaces the `traceparent` and `tracestate` it carries from the handshake.
    pub fn call(&self, call: CoreCall, trace: &[(HeaderName, HeaderValue)]) -> Call {
        let mut builder = self.client.post(format!("{}{}", self.base, call.path));
        let replaced =
            |name: &str| !trace.is_empty() && (name == "traceparent" || name == "tracestate");
        for (name, value) in call.headers.iter().filter(|(name, _)| !replaced(name)) {
            let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) else {
                continue;
            };
            builder = builder.header(name, value);
        }
        for (name, value) in trace {
            builder = builder.header(name.clone(), value.clone());
        }
        Call::Waiting(Box::pin(builder.body(call.body).send()))
    }
}

impl Upstream {
    /// Sends a WebSocket turn's record back through Envoy (its metadata is filed under its
    /// token already): the status Envoy answered, or why there was none.
    pub fn record(&self, record: &Record) -> impl Future<Output = Result<u16, String>> + Send {
        let mut builder = self
            .client
            .post(format!("{}{}", self.base, record.path))
            .timeout(RECORD_TIMEOUT);
        for (name, value) in &record.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                builder = builder.header(name, value);
            }
        }
        let sent = builder.header("content-length", "0").send();
        async move {
            let response = sent.await.map_err(|e| error_chain(&e))?;
            let status = response.status().as_u16();
            // Read to its end, so that the connection goes back to the pool.
            let _ = response.bytes().await;
            Ok(status)
        }
    }
}

/// `report` given an answer's head as the core takes it (its headers read as text; one that is
/// not is left out).
pub fn report_head<R>(
    status: u16,
    headers: &reqwest::header::HeaderMap,
    report: impl FnOnce(ReportedHead) -> R,
) -> R {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let every = || {
        headers
            .iter()
            .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)))
            .collect()
    };
    report(ReportedHead {
        status,
        header: &header,
        every: &every,
    })
}

impl Call {
    /// The next thing that happens to the request (cancel-safe: a dropped future loses
    /// nothing).
    pub async fn next(&mut self) -> UpstreamEvent {
        match self {
            Call::Waiting(pending) => match pending.await {
                Ok(mut resp) => UpstreamEvent::Head {
                    status: resp.status().as_u16(),
                    headers: std::mem::take(resp.headers_mut()),
                    body: Box::pin(resp.bytes_stream()),
                },
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
