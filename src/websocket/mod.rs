//! The WebSocket transport adapter: Envoy routes upgrade requests on the Responses path here
//! (`upgrade_configs` on the route); each connection is driven by one
//! [`Connection`](responses_core::connection::Connection), which holds every rule. This file only
//! moves bytes: client messages in, Chat requests out through Envoy's own listener (so its
//! routes, load balancing, retries and rate limits apply), answers back in, events out.
//!
//! Bounded everywhere: a fixed number of connections (a semaphore), queued messages per
//! connection (reading stops while the queue is full), one response in flight, and a slow
//! client holds the upstream read (each send is awaited before the next chunk is read).

mod upstream;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::metrics::{Metrics, Timing};
use crate::traces::{ExchangeSpan, Traces, Transport};
use responses_core::client;
use responses_core::connection::{Connection, Limits, Start};
use responses_core::environment::{Environment, System};
use responses_core::exchange::Settings;
use responses_core::life::Event;
use responses_core::openresponses::{ApiError, Code, ErrorCode};
use responses_core::translate::Meta;
use upstream::{Upstream, UpstreamEvent};

pub use upstream::FORWARDED_HEADERS;

/// Messages read ahead while a response is in flight; reading pauses beyond this many, or
/// once they hold one maximum-size message's worth of bytes.
const MAX_QUEUED_MESSAGES: usize = 8;

/// How long a socket closed with the client's bytes unread stays open (see `drive`).
const CLOSE_LINGER: Duration = Duration::from_millis(250);

/// The largest frame or message the socket reads: twice the message limit. A message between
/// the two is read whole and refused by the connection (413, and the socket goes on); only a
/// larger one is refused from its frame header, unread, which ends the socket (1009).
fn read_limit(max_message_bytes: usize) -> usize {
    max_message_bytes.saturating_mul(2)
}

/// The socket's read buffer (see `upgrade`).
const READ_BUFFER_BYTES: usize = 16 * 1024;

/// Close codes (RFC 6455).
const CLOSE_NORMAL: u16 = 1000;
const CLOSE_GOING_AWAY: u16 = 1001;
const CLOSE_TOO_BIG: u16 = 1009;

/// The transport's settings (built from `config::Config`).
#[derive(Debug, Clone)]
pub struct WsSettings {
    pub exchange: Arc<Settings>,
    pub limits: Limits,
    /// Base URL of the Chat upstream (`--ws-upstream`); the path is `exchange.chat_path`.
    pub upstream: String,
    pub max_connections: usize,
    pub max_age: Duration,
    pub idle_timeout: Duration,
    pub metrics: Option<Arc<Metrics>>,
    /// The tracer (`--otlp-endpoint`): a span per response, in the handshake's trace.
    pub traces: Option<Arc<Traces>>,
    /// `--log-content`: client messages, Chat requests and upstream chunks at debug level.
    pub log_content: bool,
}

struct Shared {
    settings: WsSettings,
    slots: Arc<Semaphore>,
    upstream: Upstream,
    draining: watch::Receiver<bool>,
}

/// A running WebSocket listener.
pub struct Server {
    slots: Arc<Semaphore>,
    max_connections: usize,
    drain: watch::Sender<bool>,
}

impl Server {
    /// Serves upgrades on `settings.exchange.responses_path`.
    pub fn start(listener: TcpListener, settings: WsSettings) -> Result<Server, String> {
        let (drain, draining) = watch::channel(false);
        let slots = Arc::new(Semaphore::new(settings.max_connections));
        let path = settings.exchange.responses_path.clone();
        let shared = Arc::new(Shared {
            upstream: Upstream::new(&settings)?,
            slots: slots.clone(),
            draining: draining.clone(),
            settings: settings.clone(),
        });
        let app = Router::new().route(&path, get(upgrade)).with_state(shared);
        let mut stop = draining;
        tokio::spawn(async move {
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stop.wait_for(|d| *d).await;
            });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "WebSocket listener failed");
            }
        });
        Ok(Server {
            slots,
            max_connections: settings.max_connections,
            drain,
        })
    }

    /// Graceful drain: no new connections; each open one finishes its response in flight,
    /// then closes with 1001 (going away). Returns once all are closed.
    pub async fn drain(&self) {
        let _ = self.drain.send(true);
        while self.slots.available_permits() < self.max_connections {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn upgrade(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    if *shared.draining.borrow() {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::ServerShuttingDown,
            "This server is shutting down: connect again.",
        );
    }
    let Ok(permit) = shared.slots.clone().try_acquire_owned() else {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::WebsocketConnectionsExhausted,
            &format!(
                "This server holds its maximum of {} WebSocket connections (--ws-max-connections): retry later or use HTTP.",
                shared.settings.max_connections
            ),
        );
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let names = client::reasoning_events(shared.settings.exchange.reasoning_events, header);
    let forwarded = upstream::forwarded_headers(&headers);
    // With tracing on, each response's span continues the handshake's trace (Envoy's span
    // for the upgrade, when Envoy traces).
    let trace_parent = shared
        .settings
        .traces
        .as_ref()
        .map(|t| t.parent(|name| headers.get(name).and_then(|v| v.to_str().ok())));
    let limits = shared.settings.limits;
    // Messages up to twice the limit are read and refused by the connection (see read_limit).
    // tungstenite zeroes its read buffer's free space (up to this size) on every read
    // attempt, including the ones that find nothing: at the default 128 KiB that memset was
    // a fifth of the processor's CPU (perf, 32 sockets streaming); 16 KiB reads requests fine.
    ws.read_buffer_size(READ_BUFFER_BYTES)
        .max_message_size(read_limit(limits.max_message_bytes))
        .max_frame_size(read_limit(limits.max_message_bytes))
        .on_upgrade(move |socket| async move {
            let connection = Connection::new(shared.settings.exchange.clone(), limits, names);
            drive(socket, connection, shared, forwarded, trace_parent, permit).await;
        })
}

fn refuse(status: StatusCode, code: ErrorCode, message: &str) -> Response {
    let err = ApiError::server(status.as_u16(), code, message);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        err.to_body(),
    )
        .into_response()
}

/// What the client sent, in order.
enum Queued {
    Text(Bytes),
    Binary,
    /// A message over the size limit, not read: answered in its turn, then the socket ends.
    Oversize,
}

/// One connection, from upgrade to close.
async fn drive(
    socket: WebSocket,
    mut conn: Connection,
    shared: Arc<Shared>,
    forwarded: Vec<(header::HeaderName, header::HeaderValue)>,
    trace_parent: Option<opentelemetry::Context>,
    _permit: OwnedSemaphorePermit,
) {
    // Opens the span of a response that started at `started` (traces on).
    let open_span = |started: Instant| {
        let (Some(traces), Some(parent)) = (&shared.settings.traces, &trace_parent) else {
            return None;
        };
        Some(traces.start_exchange(parent, Transport::WebSocket, started.elapsed()))
    };
    let metrics = shared.settings.metrics.clone();
    if let Some(m) = &metrics {
        m.websocket_connections().inc();
    }
    let opened = Instant::now();
    let (mut sink, mut stream) = socket.split();
    let mut queue: VecDeque<Queued> = VecDeque::new();
    let mut queued_bytes = 0usize;
    let mut draining = shared.draining.clone();
    let mut upstream: Option<upstream::Call> = None;
    // The span of the response in flight (traces on).
    let mut span: Option<ExchangeSpan> = None;
    let age_deadline = tokio::time::Instant::now() + shared.settings.max_age;
    let mut idle_deadline = tokio::time::Instant::now() + shared.settings.idle_timeout;
    let mut aged = false;
    // Set when the client's side ends: why, and the close code to answer with.
    let mut closing: Option<(u16, &'static str)> = None;
    let mut client_gone = false;

    let reason = loop {
        // Start the next queued message once nothing is in flight.
        while upstream.is_none() && !aged {
            let Some(next) = queue.pop_front() else { break };
            if let Queued::Text(text) = &next {
                queued_bytes -= text.len();
            }
            let out = match next {
                Queued::Binary => vec![conn.on_binary()],
                Queued::Oversize => vec![conn.on_oversize()],
                Queued::Text(text) => {
                    let started = Instant::now();
                    if shared.settings.log_content {
                        log_content("client message", &text);
                    }
                    let mut opened = open_span(started);
                    if let Some(s) = opened.as_mut().filter(|s| s.wants_content()) {
                        s.record_request(&text);
                    }
                    let out = match conn.on_text(&text, meta(), started) {
                        Start::Forward(req) => {
                            let summary = conn.exchange().map(|e| e.summary());
                            tracing::info!(
                                transport = "websocket",
                                response_id = summary.and_then(|s| s.response_id.as_deref()).unwrap_or(""),
                                model = %req.model,
                                body_bytes = req.body.len(),
                                "translated request"
                            );
                            if shared.settings.log_content {
                                log_content("upstream request", &req.body);
                            }
                            // The Chat request continues the response's trace, so that
                            // Envoy's spans for it are children of the response's span.
                            let trace_headers = opened
                                .as_ref()
                                .map(ExchangeSpan::propagation_headers)
                                .unwrap_or_default();
                            span = opened;
                            upstream = Some(shared.upstream.call(req, &forwarded, &trace_headers));
                            Vec::new()
                        }
                        Start::Answered(frames) => {
                            tracing::info!(
                                transport = "websocket",
                                response_id = conn
                                    .last_summary()
                                    .and_then(|s| s.response_id.as_deref())
                                    .unwrap_or(""),
                                "preloaded context (generate: false)"
                            );
                            span = opened;
                            answered(&mut span, &frames.messages);
                            frames.messages
                        }
                        Start::Reject(r) => {
                            tracing::info!(
                                transport = "websocket",
                                status = r.status,
                                code = r.code.as_ref().map(Code::as_str).unwrap_or(""),
                                "rejected message"
                            );
                            // Not a response: its span says why, and nothing is recorded.
                            if let Some(mut refused) = opened {
                                refused.record_answer(&r.frame);
                                let timing = Timing {
                                    total: started.elapsed(),
                                    ..Timing::default()
                                };
                                refused.refused(
                                    r.status,
                                    r.code.as_ref().map(Code::as_str),
                                    &timing,
                                );
                            }
                            vec![r.frame]
                        }
                    };
                    tell(&mut conn, &metrics, &mut span);
                    out
                }
            };
            if send(&mut sink, out).await.is_err() {
                client_gone = true;
                break;
            }
        }
        if client_gone {
            break "client gone";
        }
        let idle = upstream.is_none() && queue.is_empty();
        if idle {
            if let Some((code, why)) = closing {
                let _ = close(&mut sink, code, why).await;
                if code == CLOSE_TOO_BIG {
                    // The client's oversized frame is still unread: closing the socket now
                    // would reset it, and the reset can overtake the error event on its way
                    // through Envoy. A moment for both to arrive first.
                    tokio::time::sleep(CLOSE_LINGER).await;
                }
                break why;
            }
            if aged {
                let frame = conn.connection_limit_reached(shared.settings.max_age.as_secs() / 60);
                let _ = send(&mut sink, vec![frame]).await;
                let _ = close(&mut sink, CLOSE_NORMAL, "maximum connection age").await;
                break "maximum age";
            }
            if *draining.borrow() {
                let _ = close(&mut sink, CLOSE_GOING_AWAY, "server shutting down").await;
                break "drained";
            }
        }
        let reading = closing.is_none()
            && queue.len() < MAX_QUEUED_MESSAGES
            && queued_bytes < shared.settings.limits.max_message_bytes;
        tokio::select! {
            message = stream.next(), if reading => {
                idle_deadline = tokio::time::Instant::now() + shared.settings.idle_timeout;
                match message {
                    Some(Ok(Message::Text(text))) => {
                        queued_bytes += text.len();
                        queue.push_back(Queued::Text(Bytes::from(text)));
                    }
                    Some(Ok(Message::Binary(_))) => queue.push_back(Queued::Binary),
                    // Pings are answered by the socket itself.
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                    Some(Ok(Message::Close(_))) | None => {
                        client_gone = true;
                    }
                    Some(Err(e)) if is_too_large(&e) => {
                        // The frame was not read whole: the stream cannot go on. What was
                        // queued before it is answered first, then its error, then the close.
                        queue.push_back(Queued::Oversize);
                        closing = Some((CLOSE_TOO_BIG, "message too large"));
                    }
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "WebSocket read failed");
                        client_gone = true;
                    }
                }
            }
            event = next_upstream(&mut upstream) => {
                let now = unix_now();
                let at = Instant::now();
                let frames = match event {
                    UpstreamEvent::Head { status, content_type, headers, body } => {
                        let every = || {
                            headers.iter().filter_map(|(name, value)| {
                                Some((name.as_str(), value.to_str().ok()?))
                            })
                        };
                        let frames = conn.upstream_head(status, &content_type, every, now, at);
                        if !frames.done {
                            upstream = Some(upstream::Call::Body(body));
                        }
                        frames
                    }
                    UpstreamEvent::Chunk(chunk) => {
                        if shared.settings.log_content {
                            log_content("upstream body", &chunk);
                        }
                        conn.upstream_body(&chunk, false, now, at)
                    }
                    UpstreamEvent::End => conn.upstream_body(&[], true, now, at),
                    UpstreamEvent::Failed(message) => {
                        conn.upstream_failed(ErrorCode::UpstreamUnavailable, &message, now, at)
                    }
                };
                if frames.done {
                    upstream = None;
                    answered(&mut span, &frames.messages);
                    if let Some(s) = conn.last_summary() {
                        tracing::info!(
                            transport = "websocket",
                            response_id = s.response_id.as_deref().unwrap_or(""),
                            status = s.status.unwrap_or_default(),
                            outcome = ?s.outcome,
                            code = s.error_code.as_ref().map(Code::as_str).unwrap_or(""),
                            "answer translated"
                        );
                    }
                }
                tell(&mut conn, &metrics, &mut span);
                if send(&mut sink, frames.messages).await.is_err() {
                    client_gone = true;
                }
            }
            () = tokio::time::sleep_until(idle_deadline), if idle && closing.is_none() => {
                closing = Some((CLOSE_NORMAL, "idle timeout"));
            }
            () = tokio::time::sleep_until(age_deadline), if !aged => {
                aged = true;
            }
            _ = draining.changed(), if !*draining.borrow() => {}
        }
        if client_gone {
            break "client gone";
        }
    };
    // A response cut by the client's departure: the upstream request is dropped (Envoy
    // resets it) and the exchange is recorded as cut.
    if upstream.is_some() {
        tracing::info!(
            transport = "websocket",
            reason,
            "response ended before its answer was complete (the connection closed)"
        );
        conn.closed(Instant::now());
        tell(&mut conn, &metrics, &mut span);
    }
    if let Some(m) = &metrics {
        m.websocket_connections().dec();
    }
    tracing::debug!(
        reason,
        seconds = opened.elapsed().as_secs(),
        "WebSocket connection closed"
    );
}

async fn next_upstream(call: &mut Option<upstream::Call>) -> UpstreamEvent {
    match call {
        Some(c) => c.next().await,
        None => std::future::pending().await,
    }
}

/// Sends the messages, one flush for all.
async fn send<S>(sink: &mut S, messages: Vec<Bytes>) -> Result<(), axum::Error>
where
    S: futures_util::Sink<Message, Error = axum::Error> + Unpin,
{
    if messages.is_empty() {
        return Ok(());
    }
    for m in messages {
        // Our messages are JSON we wrote: always UTF-8.
        let text = Utf8Bytes::try_from(m).unwrap_or_else(|_| Utf8Bytes::from_static("{}"));
        sink.feed(Message::Text(text)).await?;
    }
    sink.flush().await
}

async fn close<S>(sink: &mut S, code: u16, reason: &'static str) -> Result<(), axum::Error>
where
    S: futures_util::Sink<Message, Error = axum::Error> + Unpin,
{
    sink.send(Message::Close(Some(CloseFrame {
        code,
        reason: Utf8Bytes::from_static(reason),
    })))
    .await
}

fn is_too_large(e: &axum::Error) -> bool {
    use tokio_tungstenite::tungstenite::Error;
    let source: &(dyn std::error::Error + 'static) = e;
    let mut cur = Some(source);
    while let Some(err) = cur {
        if let Some(Error::Capacity(_)) = err.downcast_ref::<Error>() {
            return true;
        }
        cur = err.source();
    }
    false
}

/// A response's last messages were sent: the last one (its terminal event, or its error)
/// goes on its span with `--trace-content`.
fn answered(span: &mut Option<ExchangeSpan>, messages: &[Bytes]) {
    if let (Some(span), Some(last)) = (span, messages.last()) {
        if span.wants_content() {
            span.record_answer(last);
        }
    }
}

/// What the connection tells of its responses, into the metrics and their spans: a stream
/// in flight, an ended (or cut) response, whose span ends with the timing the core kept.
fn tell(conn: &mut Connection, metrics: &Option<Arc<Metrics>>, span: &mut Option<ExchangeSpan>) {
    let now = Instant::now();
    while let Some(event) = conn.poll_event(now) {
        if let Some(m) = metrics {
            m.tell(&event);
        }
        // Its first output is in the timing it ends with.
        let Event::Finished(f) = event else { continue };
        if let Some(span) = span.take() {
            span.finish(&f.summary, &f.timing);
        }
    }
}

/// `--log-content` only: the text holds prompts and completions.
fn log_content(what: &str, body: &[u8]) {
    tracing::debug!(transport = "websocket", content = %String::from_utf8_lossy(body), "{what}");
}

fn meta() -> Meta {
    Meta {
        now: System.now(),
        id_seed: System.id_seed(),
    }
}

fn unix_now() -> u64 {
    System.now()
}
