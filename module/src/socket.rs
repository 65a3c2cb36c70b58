//! The WebSocket transport inside Envoy: a request on the Responses path that asks for the
//! upgrade is the filter's own to answer. Every rule of the transport is the core's
//! [`Connection`] (framing, messages, the kept context, limits, timers, close codes), as in
//! the processor's socket (`src/websocket`); this file only carries, over Envoy's ABI
//! ([`Terminal`]):
//!
//! - the handshake: the core's answer ([`handshake::negotiate`]), a refusal as Envoy's local
//!   reply, the core's admission of the downstream address Envoy gives (the config's count,
//!   the quotas per address and per caller, origins, the drain:
//!   [`Admission`](responses_core::connection::admission::Admission)), then the `101` from the
//!   request-headers hook (which holds the request: the router never sees it);
//! - the client's bytes (the request body after the upgrade) into the connection, read only
//!   while it wants them: the rest stays in Envoy's buffer, whose watermark stops the reading
//!   of the client ([`BodyStatus::Keep`]);
//! - its frames to the client (`send_response_data`, the last with `end_stream`), taken only
//!   while Envoy's buffer toward the client is under its high watermark (checked after each
//!   piece: Envoy says at once), the rest waiting in the connection, counted, with Envoy's
//!   buffer limit meanwhile;
//! - each call it asks for as a streaming callout to `upstream_cluster` (a loop back into
//!   Envoy: the Chat request meets the route table like any other), its answer back, a cancel
//!   as the callout's reset;
//! - each turn's record ([`responses_core::metadata::record`]), filed in the module's
//!   ledger ([`crate::record`]) and sent as a callout of its own to `upstream_cluster`, so
//!   that Envoy logs and charges the turn (the stream ends only once its records are sent);
//! - its timer (the module's timer service), Envoy's drain (the bootstrap extension), the
//!   client's write buffer (watermarks), the stream's end;
//! - what it tells: Envoy's stats (the core's schema), log lines (the core's), and for each
//!   response a child of Envoy's span for the upgrade, its Chat call continuing it.
//!
//! A panic in any of it fails this connection only (1011, [`Socket::on_panic`]).

use std::sync::Arc;
use std::time::Instant;

use responses_core::call::{AnswerHead, CallAction, CallFailure, CallId};
use responses_core::connection::admission::Ticket;
use responses_core::connection::{Connection, Event, PerLane};
use responses_core::driver::DETAILS_REQUEST;
use responses_core::environment::Environment;
use responses_core::life;
use responses_core::log;
use responses_core::metadata::record::Record;
use responses_core::openresponses::{ApiError, Code};
use responses_core::telemetry::{self, Transport};
use responses_core::websocket::handshake::{self, Version};

use crate::callout::CallHead;
use crate::config::FilterConfig;
use crate::host::{
    Callout, CalloutId, CalloutRefused, CalloutReset, Level, Side, SpanRef, Terminal,
};
use crate::record::{RECORDS, RECORD_TIMEOUT};
use crate::report::{count_socket, log_line, tag_attributes, tag_span};
use crate::status::BodyStatus;

/// A call in flight: the connection's id, Envoy's, and whether its head came.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    call: CallId,
    callout: CalloutId,
    head: bool,
}

/// A turn's record on its way: its callout, and the token it is filed under.
#[derive(Debug, Clone, Copy)]
struct Sent {
    callout: CalloutId,
    token: u128,
}

/// One upgraded stream: the core's connection, carried.
#[derive(Debug)]
pub struct Socket<E> {
    config: Arc<FilterConfig>,
    conn: Connection<E>,
    /// The clock of the connection's inputs.
    clock: E,
    /// Its place among the config's connections, given back when the stream ends.
    ticket: Option<Ticket>,
    /// At most two: the response in flight's, and one whose terminal event is out but whose
    /// end is on its way.
    calls: Vec<InFlight>,
    /// The records of ended turns whose callouts are on their way.
    records: Vec<Sent>,
    /// The deadline the timer is armed for.
    armed: Option<Instant>,
    /// The answer ended (`end_stream` sent): nothing more goes to the client.
    ended: bool,
    /// Envoy is done with the stream: nothing more is asked of it.
    complete: bool,
    /// A hook panicked: the connection is not touched again.
    poisoned: bool,
    /// Envoy holds client bytes the connection did not want yet.
    held: bool,
    /// The client ended its side (the request body ended).
    input_ended: bool,
    /// The upgrade's `x-request-id`, for logs.
    request_id: String,
    /// The upgrade's `:authority`: each Chat call asks for the same virtual host.
    authority: String,
    /// The span of each lane's response in flight (Envoy traces).
    spans: PerLane<SpanRef>,
}

/// A request head that opens the transport: the socket, or `None` when the filter answered
/// it (the refusal is sent).
pub fn open<E: Environment + Clone>(
    config: &Arc<FilterConfig>,
    env: E,
    host: &mut impl Terminal,
) -> Option<Socket<E>> {
    // Envoy's HTTP/2 and HTTP/3 codecs hand over an extended CONNECT as an HTTP/1.1 upgrade
    // without a key; only the protocol tells it apart from an HTTP/1.1 request without one.
    let version = match host.request_protocol() {
        Some("HTTP/2" | "HTTP/3") => Version::Http2,
        _ => Version::Http1,
    };
    let accept = match handshake::negotiate(version, |name| host.header(Side::Request, name)) {
        Ok(accept) => accept,
        Err(refusal) => {
            refuse(host, &refusal.error(), &refusal.headers());
            return None;
        }
    };
    let draining = host.watch_drain();
    let admitted = {
        let mut admission = config.socket.admission();
        if draining {
            admission.drain();
        }
        admission
            .admit(host.downstream_address().unwrap_or_default(), |name| {
                host.header(Side::Request, name)
            })
            .map(|ticket| (ticket, admission.budget()))
    };
    let (ticket, budget) = match admitted {
        Ok(admitted) => admitted,
        Err(refusal) => {
            refuse(host, &refusal, &[]);
            return None;
        }
    };
    let status = accept.status.to_string();
    let mut head = vec![(":status", status.as_str())];
    head.extend(accept.headers.iter().map(|(k, v)| (*k, v.as_str())));
    host.send_headers(&head, false);
    let now = env.instant();
    let mut conn = Connection::new(
        config.settings.clone(),
        config.socket.limits,
        env.clone(),
        |name| host.header(Side::Request, name),
        now,
    );
    conn.share_budget(budget);
    conn.set_write_buffer(host.write_buffer_limit());
    let owned = |name: &str| {
        host.header(Side::Request, name)
            .unwrap_or_default()
            .to_owned()
    };
    let mut socket = Socket {
        config: config.clone(),
        conn,
        clock: env,
        ticket: Some(ticket),
        calls: Vec::with_capacity(2),
        records: Vec::new(),
        armed: None,
        ended: false,
        complete: false,
        poisoned: false,
        held: false,
        input_ended: false,
        request_id: owned("x-request-id"),
        authority: owned(":authority"),
        spans: PerLane::default(),
    };
    if host.write_blocked() {
        socket.conn.handle_writable(now, false);
    }
    socket.pump(host);
    Some(socket)
}

/// An upgrade refused: the core's error envelope as Envoy's local reply, with the headers the
/// refusal carries.
pub(crate) fn refuse(host: &mut impl Terminal, error: &ApiError, headers: &[(&str, &str)]) {
    host.send_reply(
        error.status,
        "application/json",
        headers,
        &error.to_body(),
        DETAILS_REQUEST,
    );
}

impl<E: Environment + Clone> Socket<E> {
    /// The client's bytes (a piece of the request body after the upgrade); `end`: the client
    /// ended its side.
    pub fn request_body(&mut self, host: &mut impl Terminal, end: bool) -> BodyStatus {
        if self.poisoned || self.complete {
            host.drain_body(Side::Request);
            return BodyStatus::Stop;
        }
        self.input_ended |= end;
        self.read(host, self.clock.instant());
        self.pump(host);
        if self.held {
            BodyStatus::Keep
        } else {
            BodyStatus::Stop
        }
    }

    /// Reads what Envoy holds of the client's bytes, as far as the connection wants them,
    /// and drops what it read (or what no longer means anything).
    fn read(&mut self, host: &mut impl Terminal, now: Instant) {
        let mut read = 0;
        let mut kept = 0;
        for piece in host.body(Side::Request) {
            if kept > 0 {
                kept += piece.len();
                continue;
            }
            if !self.conn.reading() {
                // Closed, or a frame it could not read: what follows is dropped.
                read += piece.len();
                continue;
            }
            let n = self.conn.read_bytes(now, piece);
            read += n;
            kept = piece.len() - n;
        }
        if read > 0 {
            host.drain_request(read);
        }
        // What Envoy keeps for the connection counts in what it holds.
        self.conn.set_read_buffer(now, kept);
        let left = kept > 0;
        self.held = left;
        if self.input_ended && !left {
            self.conn.handle_closed(now);
        }
    }

    /// Carries out everything the connection has for Envoy after an input: the client's bytes
    /// Envoy holds (once it wants them), frames, calls, what it tells, the stream's end and
    /// its timer.
    fn pump(&mut self, host: &mut impl Terminal) {
        if self.poisoned || self.complete {
            return;
        }
        let now = self.clock.instant();
        loop {
            if self.held && self.conn.wants_input() {
                self.read(host, now);
            }
            self.flush(host);
            // Told first: a response's span is open before its call carries its context.
            self.tell(host);
            let heard = self.calls(host, now);
            // Frames taken, the connection may want the bytes Envoy keeps again.
            let again = heard || (self.held && self.conn.wants_input());
            if !again {
                break;
            }
        }
        // The stream ends once the last turns' records are sent: Envoy resets a filter's
        // callouts with it.
        if self.conn.is_closed() && !self.ended && self.records.is_empty() {
            self.ended = true;
            host.send_data(&[], true);
        }
        let wake = self.conn.poll_timeout();
        if wake != self.armed {
            match wake {
                Some(at) => host.arm_timer(at),
                None => host.disarm_timer(),
            }
            self.armed = wake;
        }
    }

    /// Frames for the client, while Envoy's buffer toward it takes them: Envoy reports the
    /// high watermark from inside the `send_response_data` that crossed it (its hook's event
    /// follows), and the connection hands nothing more over until the low one.
    fn flush(&mut self, host: &mut impl Terminal) {
        while let Some(bytes) = self.conn.poll_transmit() {
            if !self.ended {
                host.send_data(&bytes, false);
            }
            if host.write_blocked() {
                self.conn.handle_writable(self.clock.instant(), false);
            }
        }
    }

    /// Starts and cancels the calls the connection asks for; true if it heard back at once (a
    /// callout Envoy refused), so there is more to carry.
    fn calls(&mut self, host: &mut impl Terminal, now: Instant) -> bool {
        let mut heard = false;
        while let Some(action) = self.conn.poll_call() {
            match action {
                CallAction::Start(call) => {
                    let lane = self.conn.call_lane(call.id);
                    let summary = lane.map(|(_, e)| e.summary());
                    self.log(host, &log::called(summary, &call));
                    // The Chat request continues the response's span.
                    let span = lane.and_then(|(lane, _)| self.spans.get_mut(lane).copied());
                    let head = CallHead::new(host, &call, &self.authority, span);
                    let headers = head.headers();
                    let callout = Callout {
                        cluster: &self.config.socket.upstream_cluster,
                        headers: &headers,
                        body: &call.body,
                        end: true,
                        // None of its own: the Chat request it makes meets the route's timeout
                        // and the stream idle timeout of the listener it loops back to, as
                        // every Chat request does, and a stream may rightly run for long.
                        timeout: None,
                    };
                    match host.start_callout(&callout) {
                        Ok(callout) => self.calls.push(InFlight {
                            call: call.id,
                            callout,
                            head: false,
                        }),
                        Err(why) => {
                            let message = refused(why, &self.config.socket.upstream_cluster);
                            self.log_line(host, Level::Warn, &message);
                            self.conn.handle_call_failed(
                                now,
                                call.id,
                                CallFailure::Failed(&message),
                            );
                            heard = true;
                        }
                    }
                }
                CallAction::Cancel(id) => {
                    if let Some(i) = self.calls.iter().position(|c| c.call == id) {
                        let gone = self.calls.swap_remove(i);
                        // Reported back from inside the call, for a callout no longer known.
                        host.reset_callout(gone.callout);
                    }
                }
                CallAction::Record(record) => self.send_record(host, record),
            }
        }
        heard
    }

    /// Files a turn's record in the module's ledger and sends it to `upstream_cluster`, where
    /// the filter on its route takes it (a direct 204: nothing goes upstream).
    fn send_record(&mut self, host: &mut impl Terminal, mut record: Record) {
        RECORDS.file(record.token, std::mem::take(&mut record.fields));
        let mut headers: Vec<(&str, &str)> = vec![
            (":method", "POST"),
            (":path", &record.path),
            (":authority", &self.authority),
            ("content-length", "0"),
        ];
        headers.extend(record.headers.iter().map(|(n, v)| (n.as_ref(), v.as_str())));
        let cluster = &self.config.socket.upstream_cluster;
        let callout = Callout {
            cluster,
            headers: &headers,
            body: &[],
            end: true,
            timeout: Some(RECORD_TIMEOUT),
        };
        match host.start_callout(&callout) {
            Ok(callout) => self.records.push(Sent {
                callout,
                token: record.token,
            }),
            Err(why) => {
                self.conn.handle_record_done();
                RECORDS.forget(record.token);
                let message = format!(
                    "a turn's record could not be sent: Envoy refused the callout to `{cluster}` ({why:?})"
                );
                self.log_line(host, Level::Warn, &message);
            }
        }
    }

    /// A record's callout told something: its answer's status (anything but 204 means no
    /// filter took it: no access log line, no charge), or its end. True if it was a record's.
    fn record_event(
        &mut self,
        host: &mut impl Terminal,
        id: CalloutId,
        event: RecordEvent,
    ) -> bool {
        let Some(i) = self.records.iter().position(|r| r.callout == id) else {
            return false;
        };
        match event {
            RecordEvent::Status(status) if status != "204" => {
                let message = format!(
                    "a turn's record was not taken (Envoy answered {status}): no route for it, or no translating filter on that route"
                );
                self.log_line(host, Level::Warn, &message);
            }
            RecordEvent::Status(_) => {}
            RecordEvent::Over { reset } => {
                let sent = self.records.swap_remove(i);
                self.conn.handle_record_done();
                RECORDS.forget(sent.token);
                if let Some(why) = reset {
                    let message = format!("a turn's record was reset ({why:?})");
                    self.log_line(host, Level::Warn, &message);
                }
                if !self.poisoned && !self.complete {
                    self.pump(host);
                }
            }
        }
        true
    }

    /// What the connection tells, into Envoy's stats, log and spans.
    fn tell(&mut self, host: &mut impl Terminal) {
        let now = self.clock.instant();
        while let Some(event) = self.conn.poll_event(now) {
            count_socket(host, &self.config, &event);
            match event {
                Event::Opened | Event::Message { .. } | Event::Answer { .. } => {}
                Event::Refused { status, code, .. } => {
                    self.log(host, &log::refused_message(status, code.as_ref()));
                    refused_span(host, status, code.as_ref());
                }
                Event::Response { lane, event } => self.response(host, lane, event),
                Event::Closed { code, reason } => {
                    self.log_line(
                        host,
                        Level::Debug,
                        &format!(
                            "WebSocket connection closing code={} reason={}",
                            code.0,
                            log::Quoted(reason.as_str())
                        ),
                    );
                }
            }
        }
    }

    /// One response's life: its span, its log line.
    fn response(&mut self, host: &mut impl Terminal, lane: u64, event: life::Event) {
        match event {
            life::Event::Claimed { .. } => {
                let span = host
                    .active_span()
                    .and_then(|parent| host.spawn_span(parent, telemetry::OPERATION));
                if let Some(span) = span {
                    self.spans.insert(lane, span);
                }
            }
            life::Event::FirstOutput { .. } => {
                if let Some(&mut span) = self.spans.get_mut(lane) {
                    host.span_event(span, telemetry::FIRST_TOKEN_EVENT);
                }
            }
            life::Event::Finished(f) => {
                self.log(host, &log::finished(&f));
                if let Some(span) = self.spans.take(lane) {
                    tag_span(host, span, &f.summary, &f.timing, Transport::WebSocket);
                    host.finish_span(span);
                }
            }
            // A response's automatic compaction made its call.
            life::Event::Call(_) => {
                if let Some(&mut span) = self.spans.get_mut(lane) {
                    host.span_event(span, telemetry::COMPACTION_EVENT);
                }
            }
            life::Event::StreamOpened | life::Event::StreamClosed => {}
        }
    }

    // ---- what Envoy reports ----

    /// A callout's answer head.
    pub fn callout_headers(
        &mut self,
        host: &mut impl Terminal,
        id: CalloutId,
        headers: &[(&str, &str)],
        end: bool,
    ) {
        let head = AnswerHead(headers);
        let status = head.header(":status").unwrap_or("none");
        if self.record_event(host, id, RecordEvent::Status(status)) {
            return;
        }
        let Some(call) = self.in_flight(host, id) else {
            return;
        };
        let now = self.clock.instant();
        let status = match head.status() {
            Ok(status) => status,
            Err(why) => {
                self.forget(id);
                host.reset_callout(id);
                self.conn.handle_call_failed(now, call, why);
                self.pump(host);
                return;
            }
        };
        if let Some(c) = self.calls.iter_mut().find(|c| c.callout == id) {
            c.head = true;
        }
        head.report(status, |head| self.conn.handle_call_head(now, call, head));
        if end {
            self.forget(id);
            self.conn.handle_call_end(now, call);
        }
        self.pump(host);
    }

    /// Pieces of a callout's answer body.
    pub fn callout_data(
        &mut self,
        host: &mut impl Terminal,
        id: CalloutId,
        data: &[&[u8]],
        end: bool,
    ) {
        if self.records.iter().any(|r| r.callout == id) {
            return;
        }
        let Some(call) = self.in_flight(host, id) else {
            return;
        };
        let now = self.clock.instant();
        for piece in data {
            self.conn.handle_call_data(now, call, piece);
        }
        if end {
            self.forget(id);
            self.conn.handle_call_end(now, call);
        }
        self.pump(host);
    }

    /// A callout's answer trailers: its end.
    pub fn callout_trailers(&mut self, host: &mut impl Terminal, id: CalloutId) {
        if self.records.iter().any(|r| r.callout == id) {
            return;
        }
        let Some(call) = self.in_flight(host, id) else {
            return;
        };
        self.forget(id);
        self.conn.handle_call_end(self.clock.instant(), call);
        self.pump(host);
    }

    /// A callout is over both ways (its answer ended before, unless it had none).
    pub fn callout_complete(&mut self, host: &mut impl Terminal, id: CalloutId) {
        if self.record_event(host, id, RecordEvent::Over { reset: None }) {
            return;
        }
        let Some(gone) = self.forget(id) else {
            return;
        };
        if self.poisoned || self.complete {
            return;
        }
        self.conn.handle_call_end(self.clock.instant(), gone.call);
        self.pump(host);
    }

    /// A callout was reset: by Envoy (the upstream went, a timeout), or by the filter (a
    /// cancel, already forgotten).
    pub fn callout_reset(&mut self, host: &mut impl Terminal, id: CalloutId, why: CalloutReset) {
        if self.record_event(host, id, RecordEvent::Over { reset: Some(why) }) {
            return;
        }
        let Some(gone) = self.forget(id) else {
            return;
        };
        if self.poisoned || self.complete {
            return;
        }
        let message = if gone.head {
            format!(
                "The upstream connection failed before the answer was complete (Envoy reset the call: {why:?})."
            )
        } else {
            format!("The upstream could not be reached (Envoy reset the call: {why:?}).")
        };
        self.conn.handle_call_failed(
            self.clock.instant(),
            gone.call,
            CallFailure::Failed(&message),
        );
        self.pump(host);
    }

    /// The connection's call for a callout, or `None` (a callout it no longer knows is
    /// reset: nothing upstream runs unowned).
    fn in_flight(&mut self, host: &mut impl Terminal, id: CalloutId) -> Option<CallId> {
        if self.poisoned || self.complete {
            return None;
        }
        match self.calls.iter().find(|c| c.callout == id) {
            Some(c) => Some(c.call),
            None => {
                host.reset_callout(id);
                None
            }
        }
    }

    fn forget(&mut self, id: CalloutId) -> Option<InFlight> {
        let i = self.calls.iter().position(|c| c.callout == id)?;
        Some(self.calls.swap_remove(i))
    }

    /// The timer armed for the connection is due.
    pub fn timer_fired(&mut self, host: &mut impl Terminal) {
        self.armed = None;
        if self.poisoned || self.complete {
            return;
        }
        self.conn.handle_timeout(self.clock.instant());
        self.pump(host);
    }

    /// Envoy drains: the response in flight may run for the drain time, then 1001.
    pub fn drain_started(&mut self, host: &mut impl Terminal) {
        if self.poisoned || self.complete {
            return;
        }
        let now = self.clock.instant();
        self.conn.handle_drain(now, crate::drain::drain_time());
        self.pump(host);
    }

    /// The client's write buffer went over its high watermark (false) or back under its low
    /// one (true).
    pub fn writable(&mut self, host: &mut impl Terminal, writable: bool) {
        if self.poisoned || self.complete {
            return;
        }
        self.conn.handle_writable(self.clock.instant(), writable);
        self.pump(host);
    }

    /// Envoy is done with the stream (the client went, or the answer ended): a response in
    /// flight was cut; its call is reset, its span finished, its place given back.
    pub fn stream_complete(&mut self, host: &mut impl Terminal) {
        if !self.poisoned && !self.complete {
            let now = self.clock.instant();
            self.conn.handle_closed(now);
            self.tell(host);
            self.calls(host, now);
        }
        self.complete = true;
        self.end(host);
    }

    /// A hook panicked (the caller caught it): the connection ends at once, 1011 if anything
    /// can still be sent, and is never touched again.
    pub fn on_panic(&mut self, host: &mut impl Terminal) {
        self.log_line(
            host,
            Level::Error,
            "panic while serving a WebSocket connection; closing it (1011)",
        );
        if self.poisoned || self.complete {
            return;
        }
        self.poisoned = true;
        let now = self.clock.instant();
        // The connection's own ending, if it still can (it tells the close and the response
        // cut, so the stats stay whole); the caller contains a second panic.
        self.conn.handle_failure(now);
        self.flush(host);
        self.tell(host);
        self.calls(host, now);
        if !self.ended {
            self.ended = true;
            host.send_data(&[], true);
        }
        self.end(host);
    }

    /// What is left to undo when the connection is over for the module.
    fn end(&mut self, host: &mut impl Terminal) {
        for c in self.calls.drain(..) {
            host.reset_callout(c.callout);
        }
        for span in self.spans.drain() {
            host.finish_span(span);
        }
        if self.armed.take().is_some() {
            host.disarm_timer();
        }
        if let Some(ticket) = self.ticket.take() {
            self.config.socket.admission().release(ticket);
        }
    }

    /// One of the core's log lines, as Envoy's (formatted only when Envoy logs its level).
    fn log(&self, host: &impl Terminal, line: &log::Line<'_>) {
        log_line(host, line, &self.request_id);
    }

    fn log_line(&self, host: &impl Terminal, level: Level, message: &str) {
        if host.log_enabled(level) {
            let request_id = log::Logged(&self.request_id);
            host.log(
                level,
                &format!("{message} transport=websocket request_id={request_id}"),
            );
        }
    }
}

/// What a record's callout told.
#[derive(Debug, Clone, Copy)]
enum RecordEvent<'a> {
    /// Its answer's `:status`.
    Status(&'a str),
    /// It is over: complete, or reset (why).
    Over { reset: Option<CalloutReset> },
}

/// However the socket goes (a filter Envoy destroys without its stream's end too), its place
/// is given back.
impl<E> Drop for Socket<E> {
    fn drop(&mut self) {
        if let Some(ticket) = self.ticket.take() {
            self.config.socket.admission().release(ticket);
        }
    }
}

/// Why a callout did not start, for the client's error event.
pub(crate) fn refused(why: CalloutRefused, cluster: &str) -> String {
    match why {
        CalloutRefused::NoCluster => format!(
            "The upstream could not be reached: this Envoy has no cluster `{cluster}` (upstream_cluster)."
        ),
        other => format!("The upstream could not be reached: Envoy refused the call ({other:?})."),
    }
}

/// A message refused before it became a response: a span of its own, closed at once, saying
/// why (the core's attributes of a refusal, as the processor's span has them).
fn refused_span(host: &mut impl Terminal, status: u16, code: Option<&Code>) {
    let Some(parent) = host.active_span() else {
        return;
    };
    let Some(span) = host.spawn_span(parent, telemetry::OPERATION) else {
        return;
    };
    let code = code.map_or("invalid_request", Code::as_str);
    let attributes = telemetry::refused_attributes(status, code);
    tag_attributes(host, span, &attributes, Transport::WebSocket);
    host.finish_span(span);
}

#[cfg(test)]
mod tests;
