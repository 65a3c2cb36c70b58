//! The WebSocket transport adapter: Envoy routes upgrade requests on the Responses path here
//! (`upgrade_configs` on the route). Every rule of the transport (the handshake, framing,
//! messages, the kept context, limits, timers, close codes) is the core's
//! [`Connection`](responses_core::connection::Connection); this file only carries: the
//! socket's bytes in and out, each call the connection asks for through Envoy's own listener
//! (so its routes, load balancing, retries and rate limits apply), the time when it asked to
//! be woken, the drain, and its events into metrics, spans and logs.
//!
//! Backpressure: the client's bytes are read only while the connection wants them (the rest of
//! a read waits here until it does, as the module leaves them in Envoy's buffer); frames are
//! written while the socket takes them, and when it does not (the client does not read, and
//! Envoy's buffer and the kernel's are full), the connection is told the socket cannot write,
//! so that what it has for the client waits there, counted (`--ws-max-unread-bytes`, the
//! memory budgets), while the socket, the upstream call and the timers go on. The writer holds
//! one piece at a time (at most the core's `TRANSMIT_BYTES`, or one larger frame).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use bytes::{Buf, Bytes};
use futures_util::FutureExt;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::Mutex;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::logs;
use crate::metrics::{Metrics, Timing};
use crate::traces::{ExchangeSpan, Traces, Transport};
use crate::upstream::{self, Upstream, UpstreamEvent};
use responses_core::call::{CallAction, CallFailure, CallId};
use responses_core::connection::admission::{self, Admission, Ticket};
use responses_core::connection::{Connection, Event, Limits, PerLane, CLOSE_FLUSH};
use responses_core::environment::System;
use responses_core::exchange::Settings;
use responses_core::life;
use responses_core::log;
use responses_core::metadata::record::Ledger;
use responses_core::openresponses::{ApiError, Code};
use responses_core::websocket::handshake::{self, Version};

/// The transport field of this adapter's log lines.
const TRANSPORT: &str = "websocket";

/// The socket's read buffer.
const READ_BUFFER_BYTES: usize = 16 * 1024;

/// The transport's settings (built from `config::Config`).
#[derive(Debug, Clone)]
pub struct WsSettings {
    pub exchange: Arc<Settings>,
    pub limits: Limits,
    /// Base URL of the Chat upstream (`--ws-upstream`); the path is `exchange.chat_path`.
    pub upstream: String,
    /// Which upgrades are taken: the count, the quota per caller, origins, the memory budget.
    pub admission: admission::Rules,
    /// How long a response in flight may run once the processor drains.
    pub drain: Duration,
    pub metrics: Option<Arc<Metrics>>,
    /// The tracer (`--otlp-endpoint`): a span per response, in the handshake's trace.
    pub traces: Option<Arc<Traces>>,
    /// `--log-content`: client messages, Chat requests and upstream chunks at debug level.
    pub log_content: bool,
    /// Where each turn's record is filed for the ext_proc exchange of its request to take
    /// (the processor's one ledger).
    pub records: Arc<Ledger>,
}

struct Shared {
    settings: WsSettings,
    /// Which upgrades are taken (the count, the quotas, the drain), the core's rules.
    admission: Arc<Mutex<Admission>>,
    upstream: Upstream,
    draining: watch::Receiver<bool>,
}

/// A running WebSocket listener.
pub struct Server {
    admission: Arc<Mutex<Admission>>,
    drain: watch::Sender<bool>,
}

impl Server {
    /// Serves upgrades on `settings.exchange.responses_path`.
    pub fn start(listener: TcpListener, settings: WsSettings) -> Result<Server, String> {
        let (drain, draining) = watch::channel(false);
        let admission = Arc::new(Mutex::new(Admission::new(settings.admission.clone())));
        let path = settings.exchange.responses_path.clone();
        let shared = Arc::new(Shared {
            upstream: Upstream::new(&settings.upstream, &settings.exchange.chat_path)?,
            admission: admission.clone(),
            draining: draining.clone(),
            settings: settings.clone(),
        });
        let app = Router::new().route(&path, any(upgrade)).with_state(shared);
        let mut stop = draining;
        let open = admission.clone();
        tokio::spawn(async move {
            let app = app.into_make_service_with_connect_info::<SocketAddr>();
            // The listener keeps taking upgrades while sockets drain, so that each gets the
            // admission's 503 `server_shutting_down` envelope (a closed port would give Envoy's
            // plain 503); it closes once the last socket has.
            let serve = axum::serve(listener, app).with_graceful_shutdown(async move {
                let _ = stop.wait_for(|d| *d).await;
                while lock(&open).open() > 0 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            });
            if let Err(e) = serve.await {
                tracing::error!(error = %e, "WebSocket listener failed");
            }
        });
        Ok(Server { admission, drain })
    }

    /// Graceful drain: no new connections; each open one finishes its response in flight (up
    /// to the drain time), then closes with 1001 (going away). Returns once all are closed.
    pub async fn drain(&self) {
        lock(&self.admission).drain();
        let _ = self.drain.send(true);
        while lock(&self.admission).open() > 0 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn upgrade(
    State(shared): State<Arc<Shared>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    mut req: Request,
) -> Response {
    let headers = req.headers().clone();
    let lookup = |name: &str| lookup(&headers, req.method().as_str(), name);
    let accept = match handshake::negotiate(Version::Http1, lookup) {
        Ok(accept) => accept,
        Err(refusal) => {
            let mut response = refuse(&refusal.error());
            for (name, value) in refusal.headers() {
                if let Ok(value) = header::HeaderValue::from_str(value) {
                    response.headers_mut().insert(name, value);
                }
            }
            return response;
        }
    };
    // The client's address as Envoy saw it (its route sets the header); without it, Envoy's.
    let peer = peer.ip().to_string();
    let address = lookup(admission::CLIENT_ADDRESS_HEADER).unwrap_or(&peer);
    let ticket = match lock(&shared.admission).admit(address, lookup) {
        Ok(ticket) => ticket,
        Err(refused) => return refuse(&refused),
    };
    let place = Place {
        admission: shared.admission.clone(),
        ticket: Some(ticket),
    };
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => drive(TokioIo::new(upgraded), headers, shared, place).await,
            Err(e) => tracing::debug!(error = %e, "WebSocket upgrade failed"),
        }
    });
    let mut response = Response::new(axum::body::Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    for (name, value) in accept.headers {
        if let Ok(value) = header::HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

/// A header of the opening request, `:method` included.
fn lookup<'h>(headers: &'h HeaderMap, method: &'h str, name: &str) -> Option<&'h str> {
    if name == ":method" {
        return Some(method);
    }
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn refuse(err: &ApiError) -> Response {
    let status = StatusCode::from_u16(err.status).unwrap_or(StatusCode::BAD_REQUEST);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        err.to_body(),
    )
        .into_response()
}

/// A connection's place among the admitted, given back when it ends (however it ends).
struct Place {
    admission: Arc<Mutex<Admission>>,
    ticket: Option<Ticket>,
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            lock(&self.admission).release(ticket);
        }
    }
}

/// The admission's lock: its state stays consistent even if a holder panicked.
fn lock(admission: &Mutex<Admission>) -> std::sync::MutexGuard<'_, Admission> {
    admission
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What woke a connection's task: one input, told to the connection with the `now` read
/// after it.
enum Input {
    /// The socket took bytes of the piece being written (or failed).
    Written(std::io::Result<usize>),
    /// The client's bytes, in `buf` (or the end, or a failure).
    Read(std::io::Result<usize>),
    /// A turn's record is over.
    RecordDone,
    /// A call's next event.
    Upstream(CallId, UpstreamEvent),
    /// The connection's timer is due.
    Timer,
    /// The drain watch changed.
    Drain,
}

/// A call in flight (one per lane, and the end of one left to finish): its id and where it
/// stands.
struct InFlight {
    id: CallId,
    call: upstream::Call,
}

/// One connection, from upgrade to close: the core's connection, carried.
async fn drive<S>(io: S, handshake: HeaderMap, shared: Arc<Shared>, _place: Place)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let settings = &shared.settings;
    let opened = Instant::now();
    let mut conn = Connection::new(
        settings.exchange.clone(),
        settings.limits,
        System,
        |name| lookup(&handshake, "GET", name),
        opened,
    );
    let request_id = lookup(&handshake, "GET", "x-request-id")
        .unwrap_or_default()
        .to_owned();
    conn.share_budget(lock(&shared.admission).budget());
    let traced = settings.traces.as_ref().is_some_and(|t| t.wants_content());
    conn.record_content(settings.log_content || traced);
    // With tracing on, each response's span continues the handshake's trace (Envoy's span
    // for the upgrade, when Envoy traces).
    let trace_parent = settings
        .traces
        .as_ref()
        .map(|t| t.parent(|name| handshake.get(name).and_then(|v| v.to_str().ok())));
    let mut telemetry = Telemetry {
        metrics: settings.metrics.clone(),
        traces: settings.traces.clone(),
        parent: trace_parent,
        spans: PerLane::default(),
        messages: PerLane::default(),
        log_content: settings.log_content,
        request_id: request_id.clone(),
    };
    let (mut reader, mut writer) = tokio::io::split(io);
    let mut buf = vec![0u8; READ_BUFFER_BYTES];
    let mut calls: Vec<InFlight> = Vec::new();
    let mut draining = shared.draining.clone();
    let mut drain_told = false;
    // The piece being written, and whether the socket takes what comes.
    let mut sending = Bytes::new();
    let mut writable = true;
    // Client bytes read but not yet wanted (at most one read's worth): offered again once the
    // connection wants input, before the socket is read again.
    let mut kept: Vec<u8> = Vec::new();
    // Each record's end, told back to the connection (it bounds the records on their way).
    let (record_over, mut records_over) = tokio::sync::mpsc::unbounded_channel::<()>();
    // The clock, read once per input (each wake of the select below): the connection is told
    // this `now` for that input and for every step it leads to until the next wait. Its
    // events are polled with a second read, after those steps: a response counts its time in
    // the core (its translation) from the input's `now` to its poll's.
    let mut now = opened;
    loop {
        if hand_over(&mut conn, &mut writer, &mut sending).is_err() {
            sending.clear();
            conn.handle_closed(now);
        }
        if sending.is_empty() != writable {
            // The socket stopped taking bytes, or took the last piece it held: the
            // connection keeps what it has meanwhile, or hands it over again.
            writable = sending.is_empty();
            conn.handle_writable(now, writable);
            continue;
        }
        // The rest of a read, once the connection wants it again (its frames taken, a turn
        // over); its answers are handed over next.
        if !kept.is_empty() && (conn.wants_input() || !conn.reading()) {
            let taken = if conn.reading() {
                conn.read_bytes(now, &kept)
            } else {
                kept.len()
            };
            kept.drain(..taken);
            conn.set_read_buffer(now, kept.len());
            continue;
        }
        // Told first: a response's span is open before its call carries its context.
        telemetry.tell(&mut conn, Instant::now());
        while let Some(action) = conn.poll_call() {
            match action {
                CallAction::Start(c) => {
                    let lane = conn.call_lane(c.id);
                    let summary = lane.map(|(_, e)| e.summary());
                    logs::emit(&log::called(summary, &c), TRANSPORT, &request_id);
                    if settings.log_content {
                        log_content("upstream request", &c.body);
                    }
                    // The Chat request continues the response's trace, so that Envoy's spans
                    // for it are children of the response's span.
                    let trace = lane
                        .and_then(|(lane, _)| telemetry.spans.get_mut(lane))
                        .map(|span| span.propagation_headers())
                        .unwrap_or_default();
                    calls.push(InFlight {
                        id: c.id,
                        call: shared.upstream.call(c, &trace),
                    });
                }
                // Dropping the request resets it (Envoy resets it upstream).
                CallAction::Cancel(id) => calls.retain(|c| c.id != id),
                // Sent on its own: it outlives the socket, whose client may go at once.
                CallAction::Record(mut record) => {
                    let ledger = settings.records.clone();
                    ledger.file(record.token, std::mem::take(&mut record.fields));
                    let sent = shared.upstream.record(&record);
                    let request_id = request_id.clone();
                    let over = record_over.clone();
                    tokio::spawn(async move {
                        let answer = sent.await;
                        ledger.forget(record.token);
                        record_sent(answer, &request_id);
                        // (The socket may be gone: nothing to tell then.)
                        let _ = over.send(());
                    });
                }
            }
        }
        if conn.is_closed() {
            // Its last bytes, if the client takes them in time.
            let last = async {
                loop {
                    if sending.is_empty() {
                        match conn.poll_transmit() {
                            Some(piece) => sending = piece,
                            None => break,
                        }
                    }
                    match writer.write(&sending).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => sending.advance(n),
                    }
                }
                let _ = writer.shutdown().await;
            };
            let _ = tokio::time::timeout(CLOSE_FLUSH, last).await;
            linger(&mut reader, &mut buf).await;
            break;
        }
        let wake = conn.poll_timeout();
        let input = tokio::select! {
            written = writer.write(&sending), if !sending.is_empty() => Input::Written(written),
            read = reader.read(&mut buf), if conn.wants_input() && kept.is_empty() => Input::Read(read),
            Some(()) = records_over.recv() => Input::RecordDone,
            (id, event) = next_upstream(&mut calls) => Input::Upstream(id, event),
            () = sleep_until(wake), if wake.is_some() => Input::Timer,
            _ = draining.changed(), if !drain_told => Input::Drain,
        };
        now = Instant::now();
        match input {
            Input::Written(Ok(0) | Err(_)) => {
                sending.clear();
                conn.handle_closed(now);
            }
            Input::Written(Ok(n)) => sending.advance(n),
            Input::Read(Ok(0) | Err(_)) => conn.handle_closed(now),
            Input::Read(Ok(n)) => {
                let taken = conn.read_bytes(now, &buf[..n]);
                if conn.reading() {
                    kept.extend_from_slice(&buf[taken..n]);
                    conn.set_read_buffer(now, kept.len());
                }
            }
            Input::RecordDone => conn.handle_record_done(),
            Input::Upstream(id, event) => match event {
                UpstreamEvent::Head {
                    status,
                    headers,
                    body,
                } => {
                    upstream::report_head(status, &headers, |head| {
                        conn.handle_call_head(now, id, head)
                    });
                    if let Some(c) = calls.iter_mut().find(|c| c.id == id) {
                        c.call = upstream::Call::Body(body);
                    }
                }
                UpstreamEvent::Chunk(chunk) => {
                    if settings.log_content {
                        log_content("upstream body", &chunk);
                    }
                    conn.handle_call_data(now, id, &chunk);
                }
                UpstreamEvent::End => {
                    calls.retain(|c| c.id != id);
                    conn.handle_call_end(now, id);
                }
                UpstreamEvent::Failed(message) => {
                    calls.retain(|c| c.id != id);
                    conn.handle_call_failed(now, id, CallFailure::Failed(&message));
                }
            },
            Input::Timer => conn.handle_timeout(now),
            Input::Drain => {
                if *draining.borrow() {
                    drain_told = true;
                    conn.handle_drain(now, settings.drain);
                }
            }
        }
    }
    tracing::debug!(
        seconds = now.duration_since(opened).as_secs(),
        "WebSocket connection closed"
    );
}

/// What became of a turn's record: Envoy answers 204 once the record is taken; anything
/// else means a route or filter is missing for it (its access log line and rate limit
/// charge are lost), which an operator must hear of.
fn record_sent(answer: Result<u16, String>, request_id: &str) {
    match answer {
        Ok(204) => {}
        Ok(status) => tracing::warn!(
            transport = TRANSPORT,
            request_id,
            status,
            "a turn's record was not taken: Envoy has no route for it, or no translating filter on that route"
        ),
        Err(error) => tracing::warn!(
            transport = TRANSPORT,
            request_id,
            %error,
            "a turn's record could not be sent"
        ),
    }
}

/// Writes the connection's frames while the socket takes them at once; what it does not take
/// stays in `sending` (one piece) and in the connection. An error: the transport is gone.
fn hand_over<E, W>(
    conn: &mut Connection<E>,
    writer: &mut W,
    sending: &mut Bytes,
) -> std::io::Result<()>
where
    E: responses_core::environment::Environment,
    W: AsyncWrite + Unpin,
{
    loop {
        if sending.is_empty() {
            match conn.poll_transmit() {
                Some(piece) => *sending = piece,
                None => return Ok(()),
            }
        }
        // Polled once: a write that would wait is dropped unwritten (tokio's `write` is
        // cancel-safe) and awaited in the select.
        match writer.write(sending).now_or_never() {
            None => return Ok(()),
            Some(Ok(0)) => return Err(std::io::ErrorKind::WriteZero.into()),
            Some(Ok(n)) => sending.advance(n),
            Some(Err(e)) => return Err(e),
        }
    }
}

/// After our FIN, reads and drops what the client still sends, until its own FIN or for
/// [`CLOSE_LINGER`](responses_core::connection::CLOSE_LINGER): a socket dropped with the
/// client's bytes unread makes the kernel send a reset, which can destroy our close frame
/// before the client reads it (a client still writing a large message when its limit closed
/// the connection then saw no close code).
async fn linger<R: tokio::io::AsyncRead + Unpin>(reader: &mut R, buf: &mut [u8]) {
    let discard = async {
        while let Ok(n) = reader.read(buf).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(responses_core::connection::CLOSE_LINGER, discard).await;
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// What happens next to any of the calls in flight (cancel-safe, as each call's `next` is).
async fn next_upstream(calls: &mut [InFlight]) -> (CallId, UpstreamEvent) {
    if calls.is_empty() {
        return std::future::pending().await;
    }
    let next = calls
        .iter_mut()
        .map(|c| Box::pin(async move { (c.id, c.call.next().await) }));
    futures_util::future::select_all(next).await.0
}

/// What the connection tells, into the metrics, the responses' spans and the logs.
struct Telemetry {
    metrics: Option<Arc<Metrics>>,
    traces: Option<Arc<Traces>>,
    parent: Option<opentelemetry::Context>,
    /// The span of each lane's response in flight (traces on).
    spans: PerLane<ExchangeSpan>,
    /// The message of each lane's response in flight (content recorded).
    messages: PerLane<bytes::Bytes>,
    log_content: bool,
    /// The handshake's `x-request-id`, for logs.
    request_id: String,
}

impl Telemetry {
    /// The connection's events, polled at `done`: when the steps of the last input ended.
    fn tell<E: responses_core::environment::Environment>(
        &mut self,
        conn: &mut Connection<E>,
        done: Instant,
    ) {
        while let Some(event) = conn.poll_event(done) {
            if let Some(m) = &self.metrics {
                m.tell_socket(&event);
            }
            match event {
                Event::Opened => {}
                Event::Message { lane, text } => {
                    if self.log_content {
                        log_content("client message", &text);
                    }
                    self.messages.insert(lane, text);
                }
                Event::Refused { lane, status, code } => {
                    let line = log::refused_message(status, code.as_ref());
                    logs::emit(&line, TRANSPORT, &self.request_id);
                    let code = code.as_ref().map(Code::as_str);
                    // Not a response: its span says why, and nothing is recorded.
                    if let Some(mut refused) = self.open_span(Duration::ZERO) {
                        if let Some(text) = self.messages.take(lane) {
                            refused.record_request(&text);
                        }
                        refused.refused(status, code, &Timing::default());
                    }
                }
                Event::Response { lane, event } => self.response(lane, event),
                Event::Answer { lane, text: last } => {
                    if let Some(span) = self.spans.get_mut(lane).filter(|s| s.wants_content()) {
                        span.record_answer(&last);
                    }
                }
                Event::Closed { code, reason } => {
                    let reason = reason.as_str();
                    tracing::debug!(transport = "websocket", code = code.0, reason, "closing");
                }
            }
        }
    }

    fn response(&mut self, lane: u64, event: life::Event) {
        match event {
            life::Event::Claimed { elapsed } => {
                let message = self.messages.take(lane);
                if let Some(mut span) = self.open_span(elapsed) {
                    if let (true, Some(text)) = (span.wants_content(), message) {
                        span.record_request(&text);
                    }
                    self.spans.insert(lane, span);
                }
            }
            life::Event::Finished(f) => {
                logs::emit(&log::finished(&f), TRANSPORT, &self.request_id);
                if let Some(span) = self.spans.take(lane) {
                    span.finish(&f.summary, &f.timing);
                }
            }
            life::Event::Call(timing) => {
                if let Some(span) = self.spans.get_mut(lane) {
                    span.call_event(&timing);
                }
            }
            life::Event::StreamOpened
            | life::Event::StreamClosed
            | life::Event::FirstOutput { .. } => {}
        }
    }

    /// The span of a response whose message came `elapsed` ago (traces on).
    fn open_span(&self, elapsed: Duration) -> Option<ExchangeSpan> {
        let (Some(traces), Some(parent)) = (&self.traces, &self.parent) else {
            return None;
        };
        Some(traces.start_exchange(parent, Transport::WebSocket, elapsed))
    }
}

/// `--log-content` only: the text holds prompts and completions.
fn log_content(what: &str, body: &[u8]) {
    // A string value: the format quotes and escapes it (a message's newlines forge no line).
    tracing::debug!(
        transport = "websocket",
        content = &*String::from_utf8_lossy(body),
        "{what}"
    );
}
