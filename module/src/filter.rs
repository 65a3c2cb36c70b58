//! One HTTP exchange as Envoy's filter hooks report it: a shell around the core's
//! [`Driver`], which owns the exchange's life (what each hook means, what Envoy does next,
//! when it is ours, streams, first shows output and ends); this file only turns hooks into the
//! driver's inputs, its actions into calls on the [`Host`], and its events into Envoy's stats,
//! metadata and span, as `src/extproc/session.rs` does for ext_proc messages.
//!
//! Envoy calls, per request: request headers → request body pieces (→ trailers) → response
//! headers → response body pieces (→ trailers) → stream complete. The request's head is held
//! (`Stop`) while its body is read piece by piece into the core, each piece drained from
//! Envoy (no second buffer); at the end the translated body replaces it. Streamed answers go
//! out piece by piece, translated; gathered answers are held (head and body) and replaced
//! whole. Every error is an OpenResponses envelope sent as Envoy's local reply.
//!
//! Fail closed: once a request is ours, no hook lets the original bytes continue: each body
//! piece the driver read is drained before anything is added, and a head continues only once
//! the driver has decided how its body is translated (`tests::prop_nothing_untranslated_passes`,
//! and the fuzz target over `crate::fake`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use responses_core::call::{self, AnswerHead, Call, CallFailure, CallId};
use responses_core::connection;
use responses_core::driver::{Action, Cause, Driver, Edits, Failure, Gathering, HeaderEdit};
use responses_core::environment::{Environment, System};
use responses_core::exchange::{self, Exchange};
use responses_core::life::{Event, Finished, Timing};
use responses_core::log;
use responses_core::metadata::{self, record, record::Answer};
use responses_core::telemetry::{self, Transport};

use crate::callout::CallHead;
use crate::config::FilterConfig;
use crate::host::{Callout, CalloutId, CalloutReset, Host, Level, Side, Terminal, WorkResult};
use crate::record::RECORDS;
use crate::report::{count, log, log_line, tag_span};
use crate::socket::{self, Socket};
use crate::status::{
    body_status, headers_status, trailers_status, BodyStatus, HeadersStatus, TrailersStatus,
};

/// One stream's filter: an HTTP exchange, or (a WebSocket upgrade on the Responses path) the
/// transport's connection, answered by the filter itself (`crate::socket`).
#[derive(Debug)]
pub struct Filter<E = System> {
    config: Arc<FilterConfig>,
    env: E,
    driver: Driver<E>,
    /// `x-request-id`, for logs (boxed: every stream's filter is this size, and it stays
    /// within clippy's bound on `hooks::Stream`'s variants).
    request_id: Box<str>,
    upgrade: Upgrade<E>,
    /// The exchange's own call (an automatic compaction's), as a callout; boxed: few
    /// exchanges make one, and every stream's filter is this size.
    side_call: Option<Box<SideCall>>,
}

/// The driver's call ([`Action::Call`]) made as a streaming callout to `upstream_cluster`,
/// while Envoy holds the request.
#[derive(Debug, Clone, Copy)]
enum SideCall {
    Running(Running),
    /// Its answer was read or given up on: Envoy's last events of the callout (its
    /// completion, the reset asked for) are expected, not foreign.
    Over(CalloutId),
}

/// A side call in flight; the module's timer, armed for the driver's deadline, bounds it.
#[derive(Debug, Clone, Copy)]
struct Running {
    call: CallId,
    callout: CalloutId,
    /// What the timer is armed for ([`Driver::poll_timeout`] when it was last asked).
    armed: Option<Instant>,
}

/// Whether the stream is the WebSocket transport's.
#[derive(Debug)]
enum Upgrade<E> {
    /// No: an HTTP exchange (ours or not: the driver says).
    No,
    /// The connection, after the filter's 101.
    Socket(Box<Socket<E>>),
    /// A request the filter refused itself, its local reply sent: an upgrade, or a turn's
    /// record no socket filed.
    Refused,
}

impl<E: Environment + Clone> Filter<E> {
    pub fn new(config: Arc<FilterConfig>, env: E) -> Self {
        // Envoy hands the filter each piece as it arrives, and drops it once drained.
        // A costly body (compressed, or large) is read on the module's work threads: the
        // worker serves its other streams meanwhile.
        let driver =
            Driver::new(config.settings.clone(), env.clone(), Gathering::Pieces).offloading();
        Filter {
            config,
            env,
            driver,
            request_id: Box::default(),
            upgrade: Upgrade::No,
            side_call: None,
        }
    }

    /// The exchange, once it is ours.
    pub fn exchange(&self) -> Option<&Exchange> {
        self.driver.exchange()
    }

    /// The stream is the WebSocket transport's connection (the filter sent its 101).
    pub fn is_socket(&self) -> bool {
        matches!(self.upgrade, Upgrade::Socket(_))
    }

    pub fn request_headers(&mut self, host: &mut impl Terminal, end: bool) -> HeadersStatus {
        if matches!(self.upgrade, Upgrade::No)
            && connection::opens(&self.config.settings, |name| {
                host.header(Side::Request, name)
            })
        {
            // The filter answers it: a refusal, or the 101 and the connection.
            self.upgrade = match socket::open(&self.config, self.env.clone(), host) {
                Some(socket) => Upgrade::Socket(Box::new(socket)),
                None => Upgrade::Refused,
            };
            return HeadersStatus::Stop;
        }
        // A WebSocket turn's record: its summary on this stream (Envoy answers it), or, for a
        // token no socket filed, a 404.
        let answer = record::answer(
            &self.config.settings,
            &RECORDS,
            host.header(Side::Request, ":method").unwrap_or_default(),
            host.header(Side::Request, ":path").unwrap_or_default(),
        );
        match answer {
            Answer::NotRecord => {}
            Answer::Record(fields) => host.set_metadata(metadata::METADATA_NAMESPACE, &fields),
            Answer::Unknown(error) => {
                socket::refuse(host, &error, &[]);
                self.upgrade = Upgrade::Refused;
                return HeadersStatus::Stop;
            }
        }
        let action = self.driver.handle_request_headers(
            self.env.instant(),
            |name| host.header(Side::Request, name),
            end,
        );
        if self.driver.is_ours() {
            self.request_id = host
                .header(Side::Request, "x-request-id")
                .unwrap_or_default()
                .into();
        }
        headers_status(self.carry(host, Side::Request, action))
    }

    pub fn request_body(&mut self, host: &mut impl Terminal, end: bool) -> BodyStatus {
        match &mut self.upgrade {
            Upgrade::Socket(socket) => return socket.request_body(host, end),
            Upgrade::Refused => {
                host.drain_body(Side::Request);
                return BodyStatus::Stop;
            }
            Upgrade::No => {}
        }
        let action =
            self.driver
                .handle_request_body(self.env.instant(), || host.body(Side::Request), end);
        body_status(self.carry_piece(host, Side::Request, action))
    }

    pub fn request_trailers(&mut self, host: &mut impl Terminal) -> TrailersStatus {
        if !matches!(self.upgrade, Upgrade::No) {
            return TrailersStatus::Stop;
        }
        let action = self.driver.handle_request_trailers(self.env.instant());
        trailers_status(self.carry(host, Side::Request, action))
    }

    pub fn response_headers(&mut self, host: &mut impl Terminal, end: bool) -> HeadersStatus {
        // The filter's own answer (an upgrade's 101 or refusal), on its way out.
        if !matches!(self.upgrade, Upgrade::No) {
            return HeadersStatus::Continue;
        }
        let action = self.driver.handle_response_headers(
            self.env.instant(),
            |name| host.header(Side::Response, name),
            || host.headers(Side::Response),
            end,
        );
        headers_status(self.carry(host, Side::Response, action))
    }

    pub fn response_body(&mut self, host: &mut impl Terminal, end: bool) -> BodyStatus {
        if !matches!(self.upgrade, Upgrade::No) {
            return BodyStatus::Continue;
        }
        let action =
            self.driver
                .handle_response_body(self.env.instant(), || host.body(Side::Response), end);
        body_status(self.carry_piece(host, Side::Response, action))
    }

    pub fn response_trailers(&mut self, host: &mut impl Terminal) -> TrailersStatus {
        if !matches!(self.upgrade, Upgrade::No) {
            return TrailersStatus::Continue;
        }
        let action = self.driver.handle_response_trailers(self.env.instant());
        trailers_status(self.carry(host, Side::Response, action))
    }

    /// Envoy is done with the stream (before the access log): an exchange still open was cut
    /// (client gone, upstream reset, a timeout); it is recorded as such.
    pub fn stream_complete(&mut self, host: &mut impl Terminal) {
        if let Upgrade::Socket(socket) = &mut self.upgrade {
            return socket.stream_complete(host);
        }
        // A side call still running is no one's now: its upstream stream goes too.
        if let Some(side) = self.running() {
            self.side_call = None;
            host.disarm_timer();
            host.reset_callout(side.callout);
        }
        self.driver.handle_closed(self.env.instant());
        self.settle(host);
    }

    /// A hook panicked (the caller caught it): the driver ends the exchange with what can
    /// still be sent. Returns whether the current hook's data may continue (only that ending).
    pub fn on_panic(&mut self, host: &mut impl Terminal) -> bool {
        match &mut self.upgrade {
            Upgrade::Socket(socket) => {
                host.drain_body(Side::Request);
                socket.on_panic(host);
                return false;
            }
            Upgrade::Refused => return false,
            Upgrade::No => {}
        }
        log(host, Level::Error, || {
            format!(
                "panic while translating an exchange; failing it request_id={}",
                log::Logged(&self.request_id)
            )
        });
        if let Some(side) = self.running() {
            self.side_call = None;
            host.disarm_timer();
            host.reset_callout(side.callout);
        }
        let action = self
            .driver
            .handle_failure(self.env.instant(), Failure::Panic);
        // Whatever the hook left in the current pieces is untranslated.
        host.drain_body(Side::Request);
        host.drain_body(Side::Response);
        self.carry(host, Side::Response, action)
    }

    // What Envoy reports of a stream the filter answers itself (the WebSocket transport):
    // its callouts, its timer, Envoy's drain and the client's write buffer, for its socket. An
    // HTTP exchange starts at most one callout (its side call: an automatic compaction's
    // summarising request) and arms the timer only for it; it watches no drain. A callout it
    // does not know is reset (fail closed: no upstream stream runs unowned).

    /// A callout's answer head.
    pub fn callout_headers(
        &mut self,
        host: &mut impl Terminal,
        id: CalloutId,
        headers: &[(&str, &str)],
        end: bool,
    ) {
        match &mut self.upgrade {
            Upgrade::Socket(socket) => socket.callout_headers(host, id, headers, end),
            _ => self.side_call_headers(host, id, headers, end),
        }
    }

    /// A piece of a callout's answer body.
    pub fn callout_data(
        &mut self,
        host: &mut impl Terminal,
        id: CalloutId,
        data: &[&[u8]],
        end: bool,
    ) {
        match &mut self.upgrade {
            Upgrade::Socket(socket) => socket.callout_data(host, id, data, end),
            _ => self.side_call_data(host, id, data, end),
        }
    }

    /// A callout's answer trailers.
    pub fn callout_trailers(
        &mut self,
        host: &mut impl Terminal,
        id: CalloutId,
        _trailers: &[(&str, &str)],
    ) {
        match &mut self.upgrade {
            Upgrade::Socket(socket) => socket.callout_trailers(host, id),
            // Trailers end the answer.
            _ => self.side_call_data(host, id, &[], true),
        }
    }

    /// A callout ended, both ways (its last event).
    pub fn callout_complete(&mut self, host: &mut impl Terminal, id: CalloutId) {
        if let Upgrade::Socket(socket) = &mut self.upgrade {
            return socket.callout_complete(host, id);
        }
        // Complete before its answer ended (Envoy reports the end first): cut short. Any
        // other callout's last event needs nothing.
        if self.is_side_call(id) {
            let why = CallFailure::Failed("the upstream's answer ended early");
            self.side_call_failed(host, id, why, false);
        }
    }

    /// A callout was reset (its last event).
    pub fn callout_reset(&mut self, host: &mut impl Terminal, id: CalloutId, reason: CalloutReset) {
        if let Upgrade::Socket(socket) = &mut self.upgrade {
            return socket.callout_reset(host, id, reason);
        }
        if self.is_side_call(id) {
            let message = format!("the upstream stream was reset ({reason:?})");
            self.side_call_failed(host, id, CallFailure::Failed(&message), false);
        }
    }

    /// The timer armed with [`Terminal::arm_timer`] is due.
    pub fn timer_fired(&mut self, host: &mut impl Terminal) {
        match &mut self.upgrade {
            Upgrade::Socket(socket) => socket.timer_fired(host),
            _ => self.side_call_due(host),
        }
    }

    /// The result of the work started by [`Terminal::start_work`] (`None`: it panicked): the
    /// held request goes upstream translated, or the exchange ends with its envelope.
    pub fn work_done(&mut self, host: &mut impl Terminal, worked: WorkResult) {
        if !matches!(self.upgrade, Upgrade::No) {
            return;
        }
        let action = match worked {
            Some(worked) => self.driver.handle_work_done(self.env.instant(), worked),
            None => {
                log(host, Level::Error, || {
                    format!(
                        "panic while reading a request body; failing the exchange request_id={}",
                        log::Logged(&self.request_id)
                    )
                });
                self.driver
                    .handle_failure(self.env.instant(), Failure::Panic)
            }
        };
        if self.carry(host, Side::Request, action) {
            host.continue_request();
        }
    }

    /// Envoy started draining (after [`Terminal::watch_drain`]).
    pub fn drain_started(&mut self, host: &mut impl Terminal) {
        if let Upgrade::Socket(socket) = &mut self.upgrade {
            socket.drain_started(host);
        }
    }

    /// The client's write buffer went over its high watermark.
    pub fn write_blocked(&mut self, host: &mut impl Terminal) {
        if let Upgrade::Socket(socket) = &mut self.upgrade {
            socket.writable(host, false);
        }
    }

    /// ... and back under its low watermark.
    pub fn write_unblocked(&mut self, host: &mut impl Terminal) {
        if let Upgrade::Socket(socket) = &mut self.upgrade {
            socket.writable(host, true);
        }
    }

    /// Makes the driver's call as a callout to `upstream_cluster` (the internal listener, so
    /// that the call meets Envoy's routes as the turn does), its head the call's with the
    /// request's credentials and trace context; the timer bounds it. Returns whether the
    /// hook continues (never while the call runs; a refused callout ends as a failed call).
    fn start_side_call(
        &mut self,
        host: &mut impl Terminal,
        side: Side,
        call: Call,
        bound: Duration,
    ) -> bool {
        self.log(host, &log::called(self.driver.summary(), &call));
        let mut call = call;
        call.headers.extend(call::forwarded(
            |name| host.header(Side::Request, name),
            &self.config.settings.forward_headers,
        ));
        let authority = host
            .header(Side::Request, ":authority")
            .unwrap_or_default()
            .to_owned();
        // The call continues the exchange's span (Envoy's for the stream, which the exchange's
        // attributes tag), as the processor's continues its own.
        let span = host.active_span();
        let head = CallHead::new(host, &call, &authority, span);
        let headers = head.headers();
        let cluster = &self.config.socket.upstream_cluster;
        let callout = Callout {
            cluster,
            headers: &headers,
            body: &call.body,
            end: true,
            // Envoy's own bound too, later than the driver's deadline, in case the timer is
            // late (at the same time, Envoy's reset would win the race and tell a timeout as
            // a reset).
            timeout: Some(bound),
        };
        match host.start_callout(&callout) {
            Ok(callout) => {
                self.side_call = Some(Box::new(SideCall::Running(Running {
                    call: call.id,
                    callout,
                    armed: None,
                })));
                self.arm(host);
                false
            }
            Err(why) => {
                let message = socket::refused(why, cluster);
                log(host, Level::Warn, || {
                    format!("{message} request_id={}", log::Logged(&self.request_id))
                });
                let action = self.driver.handle_call_failed(
                    self.env.instant(),
                    call.id,
                    CallFailure::Failed(&message),
                );
                self.carry(host, side, action)
            }
        }
    }

    /// The side call in flight, if any.
    fn running(&self) -> Option<Running> {
        match self.side_call.as_deref() {
            Some(SideCall::Running(side)) => Some(*side),
            _ => None,
        }
    }

    fn is_side_call(&self, id: CalloutId) -> bool {
        self.running().is_some_and(|side| side.callout == id)
    }

    /// The side call `id`, if it is the one in flight; any other callout is reset.
    fn side_call(&mut self, host: &mut impl Terminal, id: CalloutId) -> Option<Running> {
        match self.side_call.as_deref() {
            Some(SideCall::Running(side)) if side.callout == id => Some(*side),
            Some(SideCall::Over(over)) if *over == id => None,
            _ => {
                self.unknown_callout(host, id);
                None
            }
        }
    }

    fn side_call_headers(
        &mut self,
        host: &mut impl Terminal,
        id: CalloutId,
        headers: &[(&str, &str)],
        end: bool,
    ) {
        let Some(side) = self.side_call(host, id) else {
            return;
        };
        let head = AnswerHead(headers);
        let status = match head.status() {
            Ok(status) => status,
            Err(why) => return self.side_call_failed(host, id, why, true),
        };
        let now = self.env.instant();
        let action = head.report(status, |head| {
            self.driver.handle_call_head(now, side.call, head)
        });
        self.side_call_step(host, action, true);
        if end && self.running().is_some() {
            self.side_call_data(host, id, &[], true);
        }
    }

    fn side_call_data(
        &mut self,
        host: &mut impl Terminal,
        id: CalloutId,
        data: &[&[u8]],
        end: bool,
    ) {
        let Some(side) = self.side_call(host, id) else {
            return;
        };
        for piece in data {
            let action = self
                .driver
                .handle_call_data(self.env.instant(), side.call, piece);
            self.side_call_step(host, action, true);
            if self.running().is_none() {
                return;
            }
        }
        if end {
            let action = self.driver.handle_call_end(self.env.instant(), side.call);
            self.side_call_step(host, action, false);
        }
    }

    /// The side call ended without its whole answer (reset, cut short, no status); `open`:
    /// its callout still runs.
    fn side_call_failed(
        &mut self,
        host: &mut impl Terminal,
        id: CalloutId,
        why: CallFailure<'_>,
        open: bool,
    ) {
        let Some(side) = self.side_call(host, id) else {
            return;
        };
        log(host, Level::Warn, || {
            format!(
                "the compaction's call failed: {} request_id={}",
                why.message(),
                log::Logged(&self.request_id)
            )
        });
        let action = self
            .driver
            .handle_call_failed(self.env.instant(), side.call, why);
        self.side_call_step(host, action, open);
    }

    /// The timer fired: the driver says whether its side call is over its time (a timer that
    /// fires early is armed again).
    fn side_call_due(&mut self, host: &mut impl Terminal) {
        let Some(SideCall::Running(side)) = self.side_call.as_deref_mut() else {
            return;
        };
        side.armed = None;
        let action = self.driver.handle_timeout(self.env.instant());
        self.side_call_step(host, action, true);
    }

    /// Arms the module's timer for the driver's next deadline ([`Driver::poll_timeout`]),
    /// while a side call runs, if it is not armed for it already.
    fn arm(&mut self, host: &mut impl Terminal) {
        let wake = self.driver.poll_timeout();
        let Some(SideCall::Running(side)) = self.side_call.as_deref_mut() else {
            return;
        };
        if side.armed != wake {
            match wake {
                Some(at) => host.arm_timer(at),
                None => host.disarm_timer(),
            }
            side.armed = wake;
        }
    }

    /// What the driver makes of an event of the side call: more of it (`Hold`), or its end:
    /// the compacted turn goes upstream (the held request resumes with its new body), or an
    /// envelope ends the exchange. Once over, the callout is reset if still `open`.
    fn side_call_step(&mut self, host: &mut impl Terminal, action: Action, open: bool) {
        if matches!(action, Action::Hold) && self.driver.call_in_flight().is_some() {
            self.arm(host);
            return self.settle(host);
        }
        if let Some(side) = self.running() {
            host.disarm_timer();
            self.side_call = Some(Box::new(SideCall::Over(side.callout)));
            if open {
                host.reset_callout(side.callout);
            }
        }
        if self.carry(host, Side::Request, action) {
            host.continue_request();
        }
    }

    fn unknown_callout(&mut self, host: &mut impl Terminal, id: CalloutId) {
        log(host, Level::Warn, || {
            format!(
                "an event of callout {} this exchange did not start; resetting it request_id={}",
                id.0,
                log::Logged(&self.request_id)
            )
        });
        host.reset_callout(id);
    }

    /// Carries out an action of a body hook: unless it passes, the piece the driver read (or
    /// refused) is drained first.
    fn carry_piece(&mut self, host: &mut impl Terminal, side: Side, action: Action) -> bool {
        if !action.keeps_piece() {
            host.drain_body(side);
        }
        self.carry(host, side, action)
    }

    /// Carries out the driver's action on this hook's side, after what it tells (the summary
    /// must be in the metadata and on the span before a local reply ends the stream). Returns
    /// whether the hook continues.
    fn carry(&mut self, host: &mut impl Terminal, side: Side, action: Action) -> bool {
        self.settle(host);
        match action {
            Action::Pass => true,
            Action::Hold => false,
            Action::ReadBody(edits) => {
                if !edit(host, side, edits) {
                    return self.refused(host, side);
                }
                false
            }
            Action::Call { call, bound } => self.start_side_call(host, side, call, bound),
            Action::Work(work) => {
                if host.start_work(work) {
                    return false;
                }
                log(host, Level::Warn, || {
                    format!(
                        "too many request bodies waiting for the work threads; refusing this one request_id={}",
                        log::Logged(&self.request_id)
                    )
                });
                let action = self.driver.handle_work_refused(self.env.instant());
                self.carry(host, side, action)
            }
            Action::Forward { edits, request } => {
                self.log(host, &log::forwarded(self.driver.summary(), &request));
                if !edit(host, side, edits) {
                    return self.refused(host, side);
                }
                host.clear_route_cache();
                host.append_body(side, &request.body);
                true
            }
            Action::OpenStream(edits) => {
                if !edit(host, side, edits) {
                    return self.refused(host, side);
                }
                true
            }
            Action::Send { events, .. } => {
                host.append_body(side, &events);
                true
            }
            Action::Answer { edits, answer } => {
                if !edit(host, side, edits) {
                    return self.refused(host, side);
                }
                host.append_body(side, &answer.body);
                true
            }
            Action::Reply { error, cause } => {
                self.log(host, &log::replied(&error, cause == Cause::Request));
                let kept: Vec<(&str, &str)> = error
                    .headers
                    .iter()
                    .map(|h| (h.name.as_str(), h.value.as_str()))
                    .collect();
                host.send_reply(
                    error.status(),
                    error.content_type(),
                    &kept,
                    &error.body,
                    cause.details(),
                );
                false
            }
            Action::Reset { .. } => {
                host.reset();
                false
            }
        }
    }

    /// Envoy refused one of an action's header edits: the exchange cannot go on half edited,
    /// so it ends as a failure does (an envelope, or a stream's last event), nothing more of
    /// it continues.
    fn refused(&mut self, host: &mut impl Terminal, side: Side) -> bool {
        log(host, Level::Error, || {
            format!(
                "Envoy refused a header edit; failing the exchange request_id={}",
                log::Logged(&self.request_id)
            )
        });
        let action = self
            .driver
            .handle_failure(self.env.instant(), Failure::Refused);
        host.drain_body(side);
        self.carry(host, side, action)
    }

    /// What the driver tells, into Envoy's stats, metadata and span.
    fn settle(&mut self, host: &mut impl Host) {
        let now = self.env.instant();
        while let Some(event) = self.driver.poll_event(now) {
            count(host, &self.config, &event);
            match event {
                Event::FirstOutput { .. } => first_output_event(host),
                Event::Finished(f) => self.finished(host, &f),
                Event::Call(_) => {
                    if let Some(span) = host.active_span() {
                        host.span_event(span, telemetry::COMPACTION_EVENT);
                    }
                }
                Event::Claimed { .. } | Event::StreamOpened | Event::StreamClosed => {}
            }
        }
    }

    /// The exchange ended: its summary as Envoy's dynamic metadata and on Envoy's span (its
    /// stats have it from its event). An exchange Envoy cut has neither metadata nor tags:
    /// Envoy finishes its span before it reports the stream complete.
    fn finished(&self, host: &mut impl Host, f: &Finished) {
        self.log(host, &log::finished(f));
        if !f.cut {
            let s = &f.summary;
            host.set_metadata(metadata::METADATA_NAMESPACE, &metadata::metadata(s));
            tag_active_span(host, s, &f.timing);
        }
    }

    /// One of the core's log lines, as Envoy's (formatted only when Envoy logs its level).
    fn log(&self, host: &impl Host, line: &log::Line<'_>) {
        log_line(host, line, &self.request_id);
    }
}

/// Envoy's span for the request (when Envoy traces it) gets the exchange's attributes and
/// name, those of the processor's own span (`responses_core::telemetry`; never a body), as
/// string tags in one call. Untraced, this is one lookup that finds no span.
fn tag_active_span(host: &mut impl Host, s: &exchange::Summary, timing: &Timing) {
    if let Some(span) = host.active_span() {
        tag_span(host, span, s, timing, Transport::Module);
    }
}

/// The first output of a stream, as an event on Envoy's span (stamped by Envoy: now).
fn first_output_event(host: &mut impl Host) {
    if let Some(span) = host.active_span() {
        host.span_event(span, telemetry::FIRST_TOKEN_EVENT);
    }
}

/// The driver's header edits, applied to one side's headers, up to the first Envoy refuses
/// (false).
fn edit(host: &mut impl Host, side: Side, edits: Edits) -> bool {
    edits.iter().all(|e| match e {
        HeaderEdit::Set(name, value) => host.set_header(side, name, Some(value)),
        HeaderEdit::Remove(name) => host.set_header(side, name, None),
    })
}
