//! The life of one HTTP exchange inside a proxy, sans-IO: what the host saw goes in (the
//! request's head, body pieces, the answer's head and body, trailers, the host ending the
//! stream, a panic the adapter caught), what the host must do comes out ([`Action`]), and what
//! happened is polled ([`Event`]: claimed, stream opened, first output, finished with its
//! summary and timing).
//!
//! As `quinn-proto`'s `Connection` is to `quinn`: the adapters (the ext_proc session, the Envoy
//! module's filter) only turn their host's callbacks into these inputs and the actions into
//! protobuf answers or ABI calls. The translation's rules stay in [`exchange`]; this file
//! decides which of the exchange's steps a callback is, what the host does with the result,
//! and when the exchange is ours, opens a stream, first shows output and ends.
//!
//! Times come from the caller: `now` on every input and poll (the core reads no clock; the
//! wall clock of `created_at` and the ids' randomness come from the [`Environment`]).
//!
//! Fail closed: once an exchange is ours, no action lets a body the host brought pass
//! untranslated (`Pass` is only for traffic that is not ours and for our own reply coming back
//! through the response callbacks), and every failure ends in an envelope, a stream's failed
//! ending, or a reset.

mod edits;
#[cfg(test)]
mod tests;

pub use edits::{Edits, HeaderEdit};

use std::borrow::Cow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::call::{self, Call, CallFailure, CallId, ReportedHead};
use crate::environment::{Environment, System};
use crate::exchange::{
    self, AbortStep, Answer, BodyStep, ErrorReply, Exchange, Fault, HeadStep, Operation, Reply,
    RequestStep, ResponseHead, Settings, Summary, UpstreamRequest, Work, Worked,
};
use crate::life::{Event, Life};
use crate::openresponses::{ErrorCode, Events};
use crate::translate::Meta;
use crate::upstream_failure;

/// Envoy's response code details of a reply to a request we refused: they name us in its
/// access logs and let its `local_reply_config` tell our envelopes from Envoy's own replies.
pub const DETAILS_REQUEST: &str = "responses_extproc_invalid_request";
/// The details of an error envelope in place of an upstream's answer.
pub const DETAILS_ANSWER: &str = "responses_extproc_upstream_error";

/// How much longer than a call's deadline the host's own bounds on it run ([`Action::Call`]'s
/// `bound`: the held request's `override_message_timeout` in ext_proc, the callout's own
/// timeout in the module): room for the turn's translation after the call, and for a timer
/// that fires a little late, so that the driver's deadline, not the host's bound, ends it.
pub const CALL_GRACE: Duration = Duration::from_secs(2);

/// The id of an exchange's call: it makes at most one (its compaction's).
const CALL: CallId = CallId(0);

/// How the host hands over the body of an answer the driver gathers ([`Action::ReadBody`] on
/// the answer's head).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gathering {
    /// Piece by piece as it arrives, each dropped from the host once read (the module's
    /// `StopIterationNoBuffer`): the driver gathers it.
    Pieces,
    /// Whole, from the host's own buffer; a piece before the end means that buffer is full
    /// (ext_proc's BUFFERED_PARTIAL): the answer cannot be held any longer and ends there, as
    /// too large.
    Whole,
}

/// Why the host cannot go on with a callback.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The adapter caught a panic in this exchange.
    Panic,
    /// The host sent a message the adapter could not read (over its size limit).
    Unreadable,
    /// The host refused one of an action's header edits: the exchange cannot go on half
    /// edited.
    Refused,
}

/// What a local reply answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The client's request, refused before anything went upstream.
    Request,
    /// The upstream's answer (or the host's own reply in its place), replaced by an envelope.
    Answer,
}

impl Cause {
    /// Envoy's response code details of the reply (its access logs; `local_reply_config` tells
    /// our envelopes from Envoy's own replies by them).
    pub fn details(self) -> &'static str {
        match self {
            Cause::Request => DETAILS_REQUEST,
            Cause::Answer => DETAILS_ANSWER,
        }
    }
}

/// What the host does at the end of a callback: exactly this, nothing else. "The head" is the
/// head of the callback's side (the request's in request callbacks, the answer's in response
/// callbacks); "the piece" is the body the callback brought, if any.
#[derive(Debug)]
pub enum Action {
    /// Carry on untouched: the traffic is not ours, our own reply is coming back through the
    /// response callbacks, or there is nothing to change.
    Pass,
    /// Drop the piece (the driver has read it, or it must not pass) and hold the head, if the
    /// host still holds one.
    Hold,
    /// Apply these edits to the head, hold it, and hand over its body: the request's, to
    /// translate, or an answer's, to gather whole.
    ReadBody(Edits),
    /// The translated request replaces the client's: these edits on its head (its route
    /// changes: the host computes it again), this body instead of the piece; let it go.
    Forward {
        edits: Edits,
        request: UpstreamRequest,
    },
    /// The answer is a stream: these edits on its head, which goes to the client now; its
    /// body follows translated, piece by piece ([`Action::Send`]).
    OpenStream(Edits),
    /// A stream's events (possibly none) instead of the piece; `end`: the last of its body.
    Send { events: Events, end: bool },
    /// The translated answer, whole: these edits on its head, this body instead of the
    /// upstream's; let it go.
    Answer { edits: Edits, answer: Answer },
    /// Answer the client with this envelope (the host's local reply, `error.headers` among
    /// its response headers) instead of anything else.
    Reply { error: ErrorReply, cause: Cause },
    /// The client already has the answer's head: end the stream abruptly. A host whose only
    /// way is a local reply sends `error` (Envoy turns a reply after the head into a reset).
    Reset { error: ErrorReply, why: ResetReason },
    /// Make this call (an automatic compaction's summarising request, to be answered whole)
    /// and report its answer by its id ([`Driver::handle_call_head`], [`Driver::handle_call_data`],
    /// [`Driver::handle_call_end`], [`Driver::handle_call_failed`]), holding the request meanwhile (the
    /// piece, if any, is dropped): its turn follows as [`Action::Forward`], or the exchange
    /// ends with [`Action::Reply`]. The driver owns the call's deadline: the host arms its
    /// timer for [`Driver::poll_timeout`] and reports it with [`Driver::handle_timeout`]; its
    /// own bounds on the call and on the held request (Envoy's `override_message_timeout`, a
    /// callout's timeout) are `bound`, which ends later ([`CALL_GRACE`]). A host that stops
    /// waiting for other reasons (the exchange ended: [`Driver::call_in_flight`] is `None`)
    /// drops the call. The host adds the request head's [`call::FORWARDED_HEADERS`]
    /// (`call::forwarded`: the client's credentials and trace context), which the driver does
    /// not copy for every exchange when so few make a call.
    Call { call: Call, bound: Duration },
    /// Run this off the host's event loop ([`Work::run`], on any thread: the request's body
    /// is costly to read, see [`Driver::offloading`]), holding the request meanwhile (the
    /// piece, if any, is dropped), then report its result ([`Driver::handle_work_done`]), or that
    /// it could not be run ([`Driver::handle_work_refused`]). Its turn follows as for a body read
    /// in place. If the exchange ends first, its result is no one's.
    Work(Box<Work>),
}

impl Action {
    /// Whether the body piece the callback brought stays where it is. Every other action
    /// replaces it (with nothing, or with its bytes): a host whose pieces stay in its buffers
    /// until it drops them (Envoy's module ABI) drops the piece first.
    pub fn keeps_piece(&self) -> bool {
        matches!(self, Action::Pass)
    }
}

/// Why a stream whose head the client has is reset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetReason {
    /// The answer failed where only an envelope could tell it (Envoy's own reply in place of
    /// the upstream's, an unusable answer), and the client has a head already.
    Answer,
    /// A fault of ours or of the host's calls.
    Fault(Fault),
}

/// Where an exchange stands, as the host sees it: one state, so that no impossible
/// combination can be written.
#[derive(Debug)]
enum Phase {
    /// Before the request's head.
    Start,
    /// Not ours: every callback passes.
    PassThrough,
    /// Not ours, but a failure of the adapter's answered it with our envelope.
    Refused,
    /// Ours, from the request's head on.
    Ours(Box<Exchange>, Stage),
}

/// Where an exchange that is ours stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Its request is being read (or Envoy answered before it went upstream).
    Request,
    /// Its request is read, and held while the call of [`Action::Call`] ([`CALL`]) is made,
    /// until this deadline.
    Calling { deadline: Instant },
    /// Its request is held while [`Action::Work`]'s work runs.
    Working,
    /// The translated request went upstream; its answer is awaited or being gathered.
    Forwarded,
    /// The client has the answer's head (a stream is open, or the answer went out whole):
    /// from now on only bytes can be added, or the stream reset.
    Answering,
    /// We answered with a local reply: when the host shows it to the response callbacks, it
    /// passes.
    Replied,
    /// A failure or a reset ended it after the client had the answer's head: every later
    /// byte is dropped, and an open stream carries on empty to its end.
    Broken,
}

/// One HTTP exchange as a proxy's host reports it. See the module docs.
#[derive(Debug)]
pub struct Driver<E = System> {
    settings: Arc<Settings>,
    env: E,
    gathering: Gathering,
    /// The host runs costly work off its event loop ([`Action::Work`]).
    offloading: bool,
    phase: Phase,
    life: Life,
}

impl<E: Environment> Driver<E> {
    pub fn new(settings: Arc<Settings>, env: E, gathering: Gathering) -> Self {
        Driver {
            settings,
            env,
            gathering,
            offloading: false,
            phase: Phase::Start,
            life: Life::default(),
        }
    }

    /// The host runs a costly request body's reading (decoding, parsing, translating: a
    /// compressed body, or one of [`exchange::COSTLY_BODY_BYTES`] or more) off its event
    /// loop: such a body ends in [`Action::Work`] instead of being read in the callback.
    pub fn offloading(mut self) -> Self {
        self.offloading = true;
        self
    }

    /// The call of [`Action::Call`] the exchange waits for, if any.
    pub fn call_in_flight(&self) -> Option<CallId> {
        match self.stage() {
            Some(Stage::Calling { .. }) => Some(CALL),
            _ => None,
        }
    }

    /// When the driver wants [`Driver::handle_timeout`] next: the deadline of the call it
    /// waits for, if any. The host arms one timer for it (and re-arms it after each input).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.stage() {
            Some(Stage::Calling { deadline }) => Some(deadline),
            _ => None,
        }
    }

    /// The timer armed for [`Driver::poll_timeout`] fired: a call past its deadline ends the
    /// exchange (504); a timer early, or for a call no longer waited for, changes nothing
    /// ([`Action::Hold`]).
    pub fn handle_timeout(&mut self, now: Instant) -> Action {
        self.life.enter(now);
        let ex = match &mut self.phase {
            Phase::Ours(ex, Stage::Calling { deadline }) if now >= *deadline => ex,
            _ => return Action::Hold,
        };
        let step = ex.call_failed(CallFailure::TimedOut);
        self.call_step(now, step)
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The exchange, once it is ours.
    pub fn exchange(&self) -> Option<&Exchange> {
        match &self.phase {
            Phase::Ours(ex, _) => Some(ex),
            _ => None,
        }
    }

    /// What is known of the exchange, once it is ours (for logs).
    pub fn summary(&self) -> Option<&Summary> {
        self.exchange().map(Exchange::summary)
    }

    /// Whether the exchange is being translated.
    pub fn is_ours(&self) -> bool {
        matches!(self.phase, Phase::Ours(..))
    }

    /// The stage of an exchange that is ours.
    fn stage(&self) -> Option<Stage> {
        match &self.phase {
            Phase::Ours(_, stage) => Some(*stage),
            _ => None,
        }
    }

    /// The request's head (`header` looks one up by lowercase name: `:method`, `:path`, the
    /// client's identity and, for a body in pieces, `content-length` are read); `end`: it has
    /// no body.
    pub fn handle_request_headers<'h>(
        &mut self,
        now: Instant,
        header: impl Fn(&str) -> Option<&'h str>,
        end: bool,
    ) -> Action {
        self.life.enter(now);
        if !matches!(self.phase, Phase::Start) {
            return Action::Pass;
        }
        let method = header(":method").unwrap_or_default();
        let path = header(":path").unwrap_or_default();
        let Some(op) = exchange::route(&self.settings, method, path) else {
            self.phase = Phase::PassThrough;
            return Action::Pass;
        };
        let mut ex = Exchange::new(self.settings.clone(), op);
        if self.offloading {
            ex.offload();
        }
        ex.request_head(&header);
        // A body handed over in pieces is gathered into one buffer of its announced size.
        if self.gathering == Gathering::Pieces {
            if let Some(length) = header("content-length").and_then(|n| n.parse().ok()) {
                ex.expect_request_bytes(length);
            }
        }
        self.claim(ex);
        if !end {
            // The upstream must answer in plain bytes we can parse.
            return Action::ReadBody(Cow::Borrowed(edits::REQUEST_HEAD_EDITS));
        }
        let meta = self.meta();
        let step = self.ours().request_body(&[], true, meta);
        self.request_step(now, step, true)
    }

    /// Pieces of the request's body (`pieces` is called only if the driver reads them: the
    /// host's buffers are not touched for traffic that is not ours); `end` with the last.
    pub fn handle_request_body<'p, P>(
        &mut self,
        now: Instant,
        pieces: impl FnOnce() -> P,
        end: bool,
    ) -> Action
    where
        P: IntoIterator<Item = &'p [u8]>,
    {
        self.life.enter(now);
        self.claim_unannounced();
        let meta = self.meta();
        let ex = match &mut self.phase {
            Phase::Start | Phase::PassThrough => return Action::Pass,
            Phase::Refused => return Action::Hold,
            Phase::Ours(ex, Stage::Request) => ex,
            // Its request went upstream, or it ended: nothing more of the client's passes.
            Phase::Ours(..) => return Action::Hold,
        };
        let mut step = RequestStep::Hold;
        feed(pieces(), end, |piece, last| {
            step = ex.request_body(piece, last, meta);
            matches!(step, RequestStep::Hold)
        });
        self.request_step(now, step, false)
    }

    /// The head of the answer to [`Action::Call`]'s call `id`.
    pub fn handle_call_head(&mut self, now: Instant, id: CallId, head: ReportedHead) -> Action {
        self.life.enter(now);
        let Some(ex) = self.calling(id) else {
            return Action::Hold;
        };
        if upstream_failure::keeps_headers(head.status) {
            ex.upstream_headers((head.every)());
        }
        let step = ex.call_head(head.status, head.content_type());
        self.call_step(now, step)
    }

    /// A piece of the call's answer body.
    pub fn handle_call_data(&mut self, now: Instant, id: CallId, bytes: &[u8]) -> Action {
        self.life.enter(now);
        let unix = self.env.now();
        let Some(ex) = self.calling(id) else {
            return Action::Hold;
        };
        let step = ex.call_body(bytes, false, unix);
        self.call_step(now, step)
    }

    /// The call's answer is complete (its body ended, or its trailers came): the turn goes
    /// upstream ([`Action::Forward`]) or the exchange ends ([`Action::Reply`]).
    pub fn handle_call_end(&mut self, now: Instant, id: CallId) -> Action {
        self.life.enter(now);
        let unix = self.env.now();
        let Some(ex) = self.calling(id) else {
            return Action::Hold;
        };
        let step = ex.call_body(&[], true, unix);
        self.call_step(now, step)
    }

    /// The call brought no whole answer: the exchange ends with its envelope.
    pub fn handle_call_failed(&mut self, now: Instant, id: CallId, why: CallFailure<'_>) -> Action {
        self.life.enter(now);
        let Some(ex) = self.calling(id) else {
            return Action::Hold;
        };
        let step = ex.call_failed(why);
        self.call_step(now, step)
    }

    /// The result of [`Action::Work`]'s work: the request goes on as if read in place.
    pub fn handle_work_done(&mut self, now: Instant, worked: Worked) -> Action {
        self.worked(now, |ex| ex.request_worked(worked))
    }

    /// The host could not run [`Action::Work`]'s work: the exchange ends with a 503.
    pub fn handle_work_refused(&mut self, now: Instant) -> Action {
        self.worked(now, Exchange::work_refused)
    }

    /// The end of the work the exchange waits for, if it still does (else it is no one's).
    fn worked(&mut self, now: Instant, step: impl FnOnce(&mut Exchange) -> RequestStep) -> Action {
        self.life.enter(now);
        let Some(ex) = self.working() else {
            return Action::Hold;
        };
        let step = step(ex);
        self.set_stage(Stage::Request);
        self.request_step(now, step, false)
    }

    /// The exchange, if it waits for its work.
    fn working(&mut self) -> Option<&mut Exchange> {
        match &mut self.phase {
            Phase::Ours(ex, Stage::Working) => Some(ex),
            _ => None,
        }
    }

    /// The exchange, if it waits for call `id`.
    fn calling(&mut self, id: CallId) -> Option<&mut Exchange> {
        match &mut self.phase {
            Phase::Ours(ex, Stage::Calling { .. }) if id == CALL => Some(ex),
            _ => None,
        }
    }

    /// What the host does with a step of the call's answer.
    fn call_step(&mut self, now: Instant, step: RequestStep) -> Action {
        if !matches!(step, RequestStep::Hold) {
            // The call is over: its outcome is the exchange's compaction's.
            let compaction = self.summary().and_then(|s| s.compaction);
            self.life.call_ended(now, compaction);
            self.set_stage(Stage::Request);
        }
        self.request_step(now, step, false)
    }

    /// The request's trailers: they end a body that had no end of its own.
    pub fn handle_request_trailers(&mut self, now: Instant) -> Action {
        self.life.enter(now);
        let meta = self.meta();
        match &mut self.phase {
            Phase::Refused | Phase::Ours(_, Stage::Replied | Stage::Broken) => Action::Hold,
            Phase::Ours(ex, Stage::Request) if !ex.is_finished() => {
                let step = ex.request_body(&[], true, meta);
                self.request_step(now, step, false)
            }
            Phase::Ours(_, Stage::Calling { .. } | Stage::Working) => Action::Hold,
            _ => Action::Pass,
        }
    }

    /// The answer's head, from the upstream or the host's own reply in its place (`:status`
    /// and `content-type` are read by name; `every` header, only of an answer that is not a
    /// success: the error made of it keeps some, see [`upstream_failure::kept_headers`]);
    /// `end`: it has no body.
    pub fn handle_response_headers<'h, A>(
        &mut self,
        now: Instant,
        header: impl Fn(&str) -> Option<&'h str>,
        every: impl FnOnce() -> A,
        end: bool,
    ) -> Action
    where
        A: IntoIterator<Item = (&'h str, &'h str)>,
    {
        self.life.enter(now);
        self.claim_unannounced();
        let unix = self.env.now();
        let ex = match &mut self.phase {
            // Envoy's own reply while the call is made: the call is dropped.
            Phase::Ours(
                ex,
                Stage::Request
                | Stage::Working
                | Stage::Calling { .. }
                | Stage::Forwarded
                | Stage::Answering,
            ) => ex,
            // Our own reply, or traffic that is not ours.
            _ => return Action::Pass,
        };
        let head = ResponseHead {
            status: header(":status").and_then(|s| s.parse().ok()).unwrap_or(0),
            content_type: header("content-type").unwrap_or_default(),
            end_of_stream: end,
        };
        if upstream_failure::keeps_headers(head.status) {
            ex.upstream_headers(every());
        }
        let action = match ex.response_head(head, unix) {
            HeadStep::Stream => {
                self.set_stage(Stage::Answering);
                self.life.open_stream();
                Action::OpenStream(Cow::Borrowed(edits::STREAM_HEAD_EDITS))
            }
            HeadStep::Gather => Action::ReadBody(Cow::Borrowed(edits::GATHER_HEAD_EDITS)),
            HeadStep::Reply(reply) => self.reply(reply),
        };
        self.settle();
        action
    }

    /// Pieces of the answer's body (`pieces` is called only if the driver reads them); `end`
    /// with the last.
    pub fn handle_response_body<'p, P>(
        &mut self,
        now: Instant,
        pieces: impl FnOnce() -> P,
        end: bool,
    ) -> Action
    where
        P: IntoIterator<Item = &'p [u8]>,
    {
        self.life.enter(now);
        self.claim_unannounced();
        let unix = self.env.now();
        let (ex, stage) = match &mut self.phase {
            Phase::Ours(_, Stage::Broken) => return dropped(true, end),
            Phase::Ours(_, Stage::Replied) | Phase::Start | Phase::PassThrough | Phase::Refused => {
                return Action::Pass
            }
            Phase::Ours(ex, stage) => (ex, *stage),
        };
        let mut sent = Events::default();
        let mut reply = None;
        feed(pieces(), end, |piece, last| {
            match ex.response_body(piece, last, unix) {
                BodyStep::Send(events) => {
                    sent = std::mem::take(&mut sent).concat(events);
                    true
                }
                BodyStep::Hold => true,
                BodyStep::Reply(r) => {
                    reply = Some(r);
                    false
                }
            }
        });
        let action = match reply {
            Some(reply) => self.reply(reply),
            None if stage == Stage::Answering => Action::Send { events: sent, end },
            None if self.gathering == Gathering::Whole => {
                let error = self.ours().response_overflow();
                self.reply(Reply::Error(error))
            }
            // Gathering: the head stays held.
            None => Action::Hold,
        };
        self.settle();
        action
    }

    /// The answer's trailers: they end a body that had no end of its own.
    pub fn handle_response_trailers(&mut self, now: Instant) -> Action {
        self.life.enter(now);
        let unix = self.env.now();
        let (ex, stage) = match &mut self.phase {
            // Envoy's own reply while the request is still ours (read, worked on, or held for
            // a call) is gathered as an upstream's answer is: its trailers end it.
            Phase::Ours(
                ex,
                stage @ (Stage::Request
                | Stage::Working
                | Stage::Calling { .. }
                | Stage::Forwarded
                | Stage::Answering),
            ) if !ex.is_finished() => (ex, *stage),
            _ => return Action::Pass,
        };
        let action = match ex.response_body(&[], true, unix) {
            BodyStep::Send(events) if stage == Stage::Answering => {
                Action::Send { events, end: true }
            }
            BodyStep::Reply(reply) => self.reply(reply),
            // Cannot happen: a stream answers with bytes, a gathered answer ends in a reply.
            BodyStep::Send(_) | BodyStep::Hold => self.reset(Fault::TrailersOutOfPlace),
        };
        self.settle();
        action
    }

    /// The host cannot go on with the current callback: end the exchange with what can still
    /// be sent, an envelope while the client has no head yet, else the stream's failed
    /// ending, else a reset. After that, every byte is dropped.
    pub fn handle_failure(&mut self, now: Instant, why: Failure) -> Action {
        self.life.enter(now);
        let unix = self.env.now();
        let action = match &mut self.phase {
            Phase::Refused | Phase::Ours(_, Stage::Replied) => Action::Hold,
            Phase::Ours(_, Stage::Broken) => dropped(true, false),
            Phase::Start | Phase::PassThrough => {
                self.phase = Phase::Refused;
                reply_to(ErrorReply::new(Fault::Failed.error()), Cause::Answer)
            }
            Phase::Ours(ex, stage) => {
                let head_sent = *stage == Stage::Answering;
                // The exchange's state may be what panicked: if ending it panics too, it is
                // over.
                let step = catch_unwind(AssertUnwindSafe(|| match why {
                    Failure::Panic => {
                        ex.abort(ErrorCode::InternalError, Fault::Failed.message(), unix)
                    }
                    Failure::Refused => {
                        let fault = Fault::HeaderRefused;
                        ex.abort(ErrorCode::InternalError, fault.message(), unix)
                    }
                    Failure::Unreadable => ex.overflow(unix),
                }))
                .unwrap_or(AbortStep::Nothing);
                match step {
                    AbortStep::Send(events) if head_sent => {
                        *stage = Stage::Broken;
                        Action::Send { events, end: true }
                    }
                    AbortStep::Reply(error) if !head_sent => self.reply(Reply::Error(error)),
                    _ => self.reply(Reply::Error(ErrorReply::new(Fault::Failed.error()))),
                }
            }
        };
        self.settle();
        action
    }

    /// The host is done with the exchange (the stream completed, was reset, or the host's
    /// channel to us ended): if it had not ended, it was cut.
    pub fn handle_closed(&mut self, now: Instant) {
        self.life.enter(now);
        if let Phase::Ours(ex, stage @ Stage::Calling { .. }) = &mut self.phase {
            // The call is dropped with the exchange: its late answer is no one's.
            *stage = Stage::Request;
            self.life.call_ended(now, ex.summary().compaction);
        }
        // So is the result of its work.
        if let Phase::Ours(_, stage @ Stage::Working) = &mut self.phase {
            *stage = Stage::Request;
        }
        if let Phase::Ours(ex, _) = &self.phase {
            self.life.finish(!ex.is_finished());
        }
    }

    /// The next thing that happened, once each; `None` when nothing more did. Poll after each
    /// input until `None`: the callback counts as busy until the last poll.
    pub fn poll_event(&mut self, now: Instant) -> Option<Event> {
        let summary = match &self.phase {
            Phase::Ours(ex, _) => Some(ex.summary()),
            _ => None,
        };
        self.life.poll(now, summary)
    }

    fn meta(&self) -> Meta {
        Meta {
            now: self.env.now(),
            id_seed: self.env.id_seed(),
        }
    }

    fn claim(&mut self, ex: Exchange) {
        self.phase = Phase::Ours(Box::new(ex), Stage::Request);
        self.life.claim();
    }

    /// A first callback other than the request's head: it was skipped (ext_proc's per-route
    /// processing mode), and only the Responses route sends us anything, so the exchange is
    /// ours. Fail closed: an answer to a request we never saw is never let through.
    fn claim_unannounced(&mut self) {
        if matches!(self.phase, Phase::Start) {
            let mut ex = Exchange::new(self.settings.clone(), Operation::Create);
            if self.offloading {
                ex.offload();
            }
            self.claim(ex);
        }
    }

    fn ours(&mut self) -> &mut Exchange {
        match &mut self.phase {
            Phase::Ours(ex, _) => ex,
            _ => unreachable!("called once the exchange is ours"),
        }
    }

    fn set_stage(&mut self, to: Stage) {
        if let Phase::Ours(_, stage) = &mut self.phase {
            *stage = to;
        }
    }

    /// What the host does with a step of the request; `at_head`: in the head's callback,
    /// whose own edits go with it.
    fn request_step(&mut self, now: Instant, step: RequestStep, at_head: bool) -> Action {
        let action = match step {
            RequestStep::Hold => Action::Hold,
            RequestStep::Forward(request) => {
                self.set_stage(Stage::Forwarded);
                let mut edits = Vec::new();
                if at_head {
                    edits.extend_from_slice(edits::REQUEST_HEAD_EDITS);
                }
                edits.extend(edits::forward_edits(&self.settings, &request));
                Action::Forward {
                    edits: Cow::Owned(edits),
                    request,
                }
            }
            RequestStep::Call(request) => {
                let timeout = self.settings.compaction_timeout;
                self.set_stage(Stage::Calling {
                    deadline: now + timeout,
                });
                self.life.call_started();
                let call = call::chat(CALL, &self.settings, request, &[]);
                Action::Call {
                    call,
                    bound: timeout + CALL_GRACE,
                }
            }
            RequestStep::Reply(error) => {
                self.set_stage(Stage::Replied);
                reply_to(error, Cause::Request)
            }
            RequestStep::Work(work) => {
                self.set_stage(Stage::Working);
                Action::Work(work)
            }
        };
        self.settle();
        action
    }

    /// A whole answer: translated, it replaces the upstream's head and body; an envelope is a
    /// local reply. Once the client has a head, only a reset is left.
    fn reply(&mut self, reply: Reply) -> Action {
        let head_sent = self.stage() == Some(Stage::Answering);
        match reply {
            Reply::Error(error) if head_sent => {
                self.set_stage(Stage::Broken);
                Action::Reset {
                    error,
                    why: ResetReason::Answer,
                }
            }
            Reply::Answer(_) if head_sent => self.reset(Fault::AnswerAfterHead),
            Reply::Answer(answer) => {
                self.set_stage(Stage::Answering);
                Action::Answer {
                    edits: edits::answer_edits(&answer),
                    answer,
                }
            }
            Reply::Error(error) => {
                self.set_stage(Stage::Replied);
                reply_to(error, Cause::Answer)
            }
        }
    }

    fn reset(&mut self, fault: Fault) -> Action {
        self.set_stage(Stage::Broken);
        Action::Reset {
            error: ErrorReply::new(fault.error()),
            why: ResetReason::Fault(fault),
        }
    }

    /// Notes what the last step changed: the first output, the end.
    fn settle(&mut self) {
        if let Phase::Ours(ex, _) = &self.phase {
            if ex.has_output() {
                self.life.output();
            }
            if ex.is_finished() {
                self.life.finish(false);
            }
        }
    }
}

fn reply_to(error: ErrorReply, cause: Cause) -> Action {
    Action::Reply { error, cause }
}

/// After a failure: the piece is dropped; an open stream (`head_sent`) carries on empty to
/// its end.
fn dropped(head_sent: bool, end: bool) -> Action {
    if head_sent {
        Action::Send {
            events: Events::default(),
            end,
        }
    } else {
        Action::Hold
    }
}

/// Feeds a callback's body pieces to `step` (`last` with the last one, when the body ends
/// with them; an empty last piece when it ends with none) while it asks for more.
fn feed<'p>(
    pieces: impl IntoIterator<Item = &'p [u8]>,
    end: bool,
    mut step: impl FnMut(&[u8], bool) -> bool,
) {
    let mut pieces = pieces.into_iter().peekable();
    if pieces.peek().is_none() {
        if end {
            step(&[], true);
        }
        return;
    }
    while let Some(piece) = pieces.next() {
        if !step(piece, end && pieces.peek().is_none()) {
            return;
        }
    }
}
