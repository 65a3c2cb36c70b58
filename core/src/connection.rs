//! One Responses WebSocket connection, sans-IO, from the accepted upgrade to its close.
//!
//! As `quinn-proto`'s `Connection` is to `quinn`: the host (the processor's socket task, the
//! Envoy module's upgraded stream) feeds in what it saw: the client's bytes, what the upstream
//! answered to the calls the connection asked for, whether the client reads what is sent, the
//! time when a timer it was asked for fires, drain, the transport's end; and it carries out
//! what comes out: bytes to send ([`Connection::poll_transmit`]), calls to start or cancel
//! ([`Connection::poll_call`]), when to wake it next ([`Connection::poll_timeout`]), what
//! happened ([`Connection::poll_event`]) and when it is over ([`Connection::is_closed`]).
//! Every rule of the transport is here, once: framing (RFC 6455, [`crate::websocket`]), the
//! protocol's messages, one response at a time in order, the kept context, limits, timers,
//! backpressure and close codes.
//!
//! A client sends `{"type":"response.create", ...}` messages (the body of `POST
//! /v1/responses` without its transport fields); each becomes one streamed [`Exchange`] and
//! one Chat call, and its events go back as one text message each: the same objects as over
//! SSE, numbered from 0 per response.
//!
//! Connection-local state, nothing persisted: the last response that completed (or ended
//! incomplete), with its whole context (its input, after its own continuation, plus its
//! output), so that the next `response.create` may name it in `previous_response_id` and send
//! only the new items. A `response.create` that names the kept response takes it: if that
//! attempt fails (a 4xx or 5xx, a failed stream), the context is gone and naming it again is
//! `previous_response_not_found`. A context over [`Limits::max_context_bytes`] is not kept.
//!
//! Bounded everywhere: messages read ahead while a response is in flight wait in a queue of
//! [`MAX_QUEUED_MESSAGES`] and one maximum-size message's worth of bytes ([`Connection::wants_input`]
//! turns false: a host that can stop reading does); a host that cannot stop reading and keeps
//! feeding past twice that ends the connection (1008). Frames for a client that does not read
//! them wait here, counted, not in the host: while the host says it cannot write (its buffer
//! toward the client over its high watermark), [`Connection::poll_transmit`] hands nothing
//! over, what the host holds is counted at its watermark ([`Connection::set_write_buffer`]), and
//! pings that come before the host took the last pong get one pong, for the last (RFC 6455
//! §5.5.3). What waits counts against [`Limits::max_unread_bytes`]: beyond, the frames
//! the client did not read are dropped, the response in flight fails and the connection
//! closes (1008), since a call cannot always be paused (the module's callouts cannot).
//!
//! Times come from the caller (`now` on every input); the wall clock of `created_at` and the
//! ids' randomness from the [`Environment`].

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use serde::Serialize;

use crate::call::{self, CallAction, CallFailure, CallId, ReportedHead};
use crate::environment::{Environment, System};
use crate::exchange::{
    AbortStep, Answer, Body, BodyStep, Exchange, HeadStep, Operation, Outcome, Reply, RequestStep,
    ResponseHead, Settings, Summary,
};
use crate::life::{self, Life};
use crate::metadata::{self, record::Record};
use crate::openresponses::{ApiError, Code, ContextTokens, ErrorCode, Events};
use crate::translate::json::document::{self, Node, Str};
use crate::translate::{Meta, ReasoningEvents};
use crate::upstream_failure::{self, KeptHeader};
use crate::websocket::decode::{Decoder, Message};
use crate::websocket::{encode, CloseCode, CloseReason};
use admission::Budget;
pub use lane::MAX_LANES;
use lane::{Context, Lane, Queued, State, Successor, Turn};
use steer::{user_message, Steer};
pub use steer::{SteerError, MAX_PENDING_STEERS};

/// Messages read ahead while a response is in flight.
pub const MAX_QUEUED_MESSAGES: usize = 8;

/// Most bytes [`Connection::poll_transmit`] hands over at once (whole frames; a larger frame
/// goes alone): a host that checks its buffer between two takes stops taking once it is
/// full, and what it did not take stays counted here.
pub const TRANSMIT_BYTES: usize = 64 << 10;

/// Turns' records a connection may have on their way at once; beyond, it reads no more
/// messages until one is over ([`Connection::handle_record_done`]).
pub const MAX_RECORDS_IN_FLIGHT: usize = 8;

/// Default of [`Limits::max_unread_bytes`]: 4 MiB, a few hundred events' worth.
pub const DEFAULT_MAX_UNREAD_BYTES: usize = 4 << 20;

/// How long the connection waits for the client's close frame after sending its own, before
/// the host drops the transport (RFC 6455 §7.1.1: the server closes the TCP connection). Also
/// what lets an error event overtake the reset that closing a socket with unread bytes causes.
pub const CLOSE_LINGER: Duration = Duration::from_millis(250);

/// How long a host that writes to the client itself (the processor) waits for its last bytes
/// (a response's end, the close frame) to leave once the connection is over, before it drops
/// the transport: a client that does not read them gets no longer (Envoy's own
/// `delayed_close_timeout`, which does the same in module mode, is 1 s by default).
pub const CLOSE_FLUSH: Duration = Duration::from_secs(1);

/// How much longer than its drain time a host waits for its sockets before it exits: they end
/// the responses still in flight at the drain time and close (1001), then wait up to
/// [`CLOSE_LINGER`] for the client's close frame, and their last bytes must leave first.
pub const DRAIN_CLOSE_MARGIN: Duration = Duration::from_secs(1);
const _: () = assert!(DRAIN_CLOSE_MARGIN.as_millis() > 2 * CLOSE_LINGER.as_millis());

/// The limits of one connection (the host enforces the count of connections).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest `response.create` message, in bytes: 413 `request_too_large` beyond; over twice
    /// that, the frame is refused unread and the connection ends (1009).
    pub max_message_bytes: usize,
    /// Largest context kept for a continuation (its input and output as JSON, in bytes).
    pub max_context_bytes: usize,
    /// With nothing in flight and no message for this long, the connection closes (1000).
    pub idle_timeout: Duration,
    /// A connection this old closes after the response in flight (an `error` event
    /// `websocket_connection_limit_reached`, then 1000).
    pub max_age: Duration,
    /// Bytes of frames waiting for a client that does not read them (the host cannot write)
    /// before its response fails and the connection ends (1008).
    pub max_unread_bytes: usize,
    /// Bytes the connection may hold ([`Connection::held`]) before it ends (1008).
    pub max_socket_bytes: usize,
}

/// What happened on the connection, for the host's telemetry.
#[derive(Debug, Clone)]
pub enum Event {
    /// The life of a response, as an HTTP exchange's: claimed, stream opened and closed, first
    /// output, finished (or cut) with its summary and timing; `lane` tells apart the
    /// responses of a connection's lanes, which run side by side.
    Response { lane: u64, event: life::Event },
    /// A message refused before it became a response (not a valid `response.create`): its
    /// status and error code (`lane` 0: refused before it had a lane, one beyond
    /// [`MAX_LANES`]).
    Refused {
        lane: u64,
        status: u16,
        code: Option<Code>,
    },
    /// A client message, for hosts that record content (`Connection::record_content`).
    Message { lane: u64, text: Bytes },
    /// A response's last message (its terminal event, or its error), for hosts that record
    /// content.
    Answer { lane: u64, text: Bytes },
    /// The connection is open (told first, once).
    Opened,
    /// The connection ended: the close code sent (or received), and why, once.
    Closed {
        code: CloseCode,
        reason: CloseReason,
    },
}

/// One WebSocket connection. See the module docs.
#[derive(Debug)]
pub struct Connection<E = System> {
    settings: Arc<Settings>,
    limits: Limits,
    env: E,
    reasoning_events: ReasoningEvents,
    /// The tenant of its sealed items: the handshake's (see [`crate::exchange::tenant`]).
    tenant: crate::translate::seal::Tenant,
    /// The opening request's headers that go on to each call.
    forwarded: Vec<(Cow<'static, str>, String)>,
    /// The socket's id in its turns' records: the upgrade's `x-request-id` (or one made up).
    socket_id: String,
    reader: Reader,
    phase: Phase,
    opened: Instant,
    /// The last client message (or the end of the last response): the idle timer's start.
    active: Instant,
    /// Its lanes, in the order they opened: each with its queue, its response in flight and
    /// its kept context.
    lanes: Vec<Lane>,
    /// The key the next lane gets (its responses' events are told with it).
    next_lane: u64,
    /// Messages waiting on every lane, and their bytes.
    queued: usize,
    queued_bytes: usize,
    /// The summary of the last response that ended, on any lane, for logs.
    last: Option<Summary>,
    next_call: u64,
    /// Frames for the client, not yet handed to the host: whole frames only (the host takes
    /// them whole).
    out: BytesMut,
    /// The pong for the last ping, while the host cannot write: sent once it can.
    pong: Option<Bytes>,
    /// What the host holds toward the client once it says it cannot write (its high
    /// watermark): counted meanwhile, with the last piece it took (the one that filled it).
    write_buffer: usize,
    /// The size of the last piece [`Connection::poll_transmit`] handed over.
    last_transmit: usize,
    /// The client's bytes the host holds, not yet wanted.
    read_buffer: usize,
    /// Turns' records handed to the host and not yet over ([`Connection::handle_record_done`]).
    records_in_flight: usize,
    calls: VecDeque<CallAction>,
    events: VecDeque<Event>,
    /// Whether the host can write to the client, and what waits for it meanwhile.
    writer: Writer,
    record_content: bool,
    /// The memory all of the host's connections share, when the host has one.
    budget: Option<Arc<Budget>>,
    /// What this connection counts in it.
    counted: usize,
}

/// The client's bytes: read as frames, or no longer (a frame refused unread, a protocol
/// error, a connection over its memory).
// One per connection, in place for its life: its size is the decoder's either way.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Reader {
    Reading(Decoder),
    Stopped,
}

impl Reader {
    fn held(&self) -> usize {
        match self {
            Reader::Reading(decoder) => decoder.held(),
            Reader::Stopped => 0,
        }
    }

    fn is_reading(&self) -> bool {
        matches!(self, Reader::Reading(_))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    /// Open, but ending once what is in flight is over (see [`Ending`]).
    Ending(Ending),
    /// Our close frame is sent; the client's is awaited until `deadline`.
    Closing {
        deadline: Instant,
    },
    /// Over: the host drops the transport once it has sent what is left.
    Closed,
}

/// Whether the host can write to the client (its buffer toward it is under its high
/// watermark), or not, and then the bytes of frames made for the client since it last could.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Writer {
    Writable,
    Blocked { unread: usize },
}

/// Why the connection ends once the responses in flight are over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// A frame over twice the message limit, refused unread: the messages before it are
    /// answered (its own 413 among them), then 1009.
    TooBig,
    /// `max_age` reached: no further message starts; an `error` event, then 1000.
    MaxAge,
    /// The host drains: no further message starts; 1001 after the responses in flight, or at
    /// `deadline` with those responses failed.
    Drain { deadline: Instant },
}

/// Fields of `POST /v1/responses` that belong to the HTTP transport, with the one value that
/// agrees with this transport (every response on a socket is streamed, none runs in the
/// background), which is accepted: Codex sends `"stream": true` on its sockets.
/// `stream_options` shapes SSE only: refused whatever its value.
const TRANSPORT_FIELDS: &[(&str, Option<bool>)] = &[
    ("stream", Some(true)),
    ("background", Some(false)),
    ("stream_options", None),
];

/// A stream with no output that ends at once: the "answer" of a `generate: false` request.
const NOTHING_GENERATED: &[u8] =
    b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

impl<E: Environment> Connection<E> {
    /// A connection whose upgrade was accepted at `now`: `handshake` looks up the opening
    /// request's headers (its credentials go on to each call, its identity decides the
    /// reasoning event names the client gets, its tenant header binds its sealed items).
    pub fn new<'h>(
        settings: Arc<Settings>,
        limits: Limits,
        env: E,
        handshake: impl Fn(&str) -> Option<&'h str>,
        now: Instant,
    ) -> Self {
        let reasoning_events =
            crate::client::reasoning_events(settings.reasoning_events, &handshake);
        let socket_id = match handshake("x-request-id") {
            Some(id) if !id.is_empty() => id.to_owned(),
            _ => format!("ws_{:032x}", env.id_seed()),
        };
        Connection {
            socket_id,
            tenant: crate::exchange::tenant(&settings, &handshake),
            reader: Reader::Reading(Decoder::new(limits.max_message_bytes)),
            forwarded: call::forwarded(&handshake, &settings.forward_headers),
            settings,
            limits,
            env,
            reasoning_events,
            phase: Phase::Open,
            opened: now,
            active: now,
            lanes: Vec::new(),
            next_lane: 0,
            queued: 0,
            queued_bytes: 0,
            last: None,
            next_call: 0,
            out: BytesMut::new(),
            pong: None,
            write_buffer: 0,
            last_transmit: 0,
            read_buffer: 0,
            records_in_flight: 0,
            calls: VecDeque::new(),
            events: VecDeque::from([Event::Opened]),
            budget: None,
            counted: 0,
            writer: Writer::Writable,
            record_content: false,
        }
    }

    /// Counts what the connection holds in the host's shared budget (see
    /// [`admission::Budget`]): past its limit, the connection whose growth took it there
    /// closes (1013).
    pub fn share_budget(&mut self, budget: Arc<Budget>) {
        self.budget = Some(budget);
    }

    /// What the host holds toward the client once it says it cannot write, besides the last
    /// piece it took: its buffer's high watermark (the module: Envoy's buffer limit); 0 (the
    /// default) for a host that holds no more than that piece (the processor's socket writer).
    /// Counted in [`Connection::held`] while the host cannot write, with that piece (the
    /// host's buffer crossed its watermark with it), so that a client that does not read is
    /// charged for what it leaves there.
    pub fn set_write_buffer(&mut self, bytes: usize) {
        self.write_buffer = bytes;
    }

    /// Bytes the connection holds: each lane's kept context, the input and message of its
    /// response in flight (JSON text: no tree of them is kept), what that response has output
    /// so far (kept for its closing events) and its steers; the queued messages, the message
    /// being read, the frames not yet handed to the host, the client's bytes the host holds
    /// for it ([`Connection::set_read_buffer`]), and, while the host cannot write, what it
    /// holds toward the client ([`Connection::set_write_buffer`] and the last piece it took).
    pub fn held(&self) -> usize {
        let host = if self.writer == Writer::Writable {
            0
        } else {
            self.write_buffer + self.last_transmit
        };
        self.lanes.iter().map(Lane::held).sum::<usize>()
            + self.queued_bytes
            + self.reader.held()
            + self.out.len()
            + self.pong.as_ref().map_or(0, Bytes::len)
            + self.read_buffer
            + host
    }

    /// Tell each client message as an [`Event::Message`] (for `--log-content` and
    /// `--trace-content`: the messages hold prompts).
    pub fn record_content(&mut self, on: bool) {
        self.record_content = on;
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// An exchange in flight (the first lane's), for logs.
    pub fn exchange(&self) -> Option<&Exchange> {
        self.lanes.iter().find_map(Lane::turn).map(|t| &t.exchange)
    }

    /// The lane ([`Event::Response`]'s `lane`) and exchange a call is for, for its log line
    /// and its span.
    pub fn call_lane(&self, id: CallId) -> Option<(u64, &Exchange)> {
        self.lanes.iter().find_map(|l| {
            let turn = l.turn().filter(|t| t.call == Some(id))?;
            Some((l.key, &turn.exchange))
        })
    }

    /// The summary of the last response that ended, for logs.
    pub fn last_summary(&self) -> Option<&Summary> {
        self.last.as_ref()
    }

    /// Bytes of context kept for continuations (every lane's).
    pub fn context_bytes(&self) -> usize {
        self.lanes
            .iter()
            .filter_map(|l| l.context.as_ref())
            .map(|c| c.bytes)
            .sum()
    }

    /// Whether the host should read more of the client's bytes now. A host that can stop
    /// reading does so while this is false (the client then feels TCP's backpressure): while
    /// messages wait their turn, and while more than a piece ([`TRANSMIT_BYTES`]) of frames
    /// waits for the host, so that a client that does not read cannot make the connection
    /// answer more of its messages than the host takes.
    pub fn wants_input(&self) -> bool {
        self.reading()
            && self.queued < MAX_QUEUED_MESSAGES
            && self.queued_bytes < self.limits.max_message_bytes
            && self.out.len() < TRANSMIT_BYTES
            && self.records_in_flight < MAX_RECORDS_IN_FLIGHT
    }

    /// A turn's record the host sent ([`CallAction::Record`]) is over, answered or not: while
    /// [`MAX_RECORDS_IN_FLIGHT`] are on their way, the connection reads no more messages, so
    /// that a client whose turns end at once (`generate: false`) cannot make the host hold a
    /// request per turn (200 such clients made Envoy hold 1.4 GiB of them, module mode).
    pub fn handle_record_done(&mut self) {
        self.records_in_flight = self.records_in_flight.saturating_sub(1);
    }

    /// Bytes of the client's the host holds for the connection, read but not wanted yet
    /// (Envoy's buffer in the module, the processor's rest of a read): counted in
    /// [`Connection::held`].
    pub fn set_read_buffer(&mut self, now: Instant, bytes: usize) {
        if self.read_buffer != bytes {
            self.read_buffer = bytes;
            self.account(now);
        }
    }

    /// The connection is over: the host sends what [`Connection::poll_transmit`] still
    /// holds, then closes the transport.
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// Whether the client's bytes still mean anything: false once the connection has stopped
    /// reading for good (closed, or a frame it could not read); a host then drops them.
    pub fn reading(&self) -> bool {
        self.phase != Phase::Closed && self.reader.is_reading()
    }

    // ---- inputs ----

    /// Bytes from the client.
    pub fn handle_bytes(&mut self, now: Instant, bytes: &[u8]) {
        self.read(now, bytes, false);
    }

    /// Bytes from the client, read only while the connection wants them
    /// ([`Connection::wants_input`]): returns how many it read. A host that cannot stop its
    /// transport from reading but can hold what it read (the module: Envoy's buffer, which
    /// stops reading the client when full) keeps the rest and offers it again once the
    /// connection wants input.
    pub fn read_bytes(&mut self, now: Instant, bytes: &[u8]) -> usize {
        self.read(now, bytes, true)
    }

    fn read(&mut self, now: Instant, mut bytes: &[u8], bounded: bool) -> usize {
        let offered = bytes.len();
        while !bytes.is_empty() && self.reading() && (!bounded || self.wants_input()) {
            let Reader::Reading(decoder) = &mut self.reader else {
                break;
            };
            match decoder.decode(&mut bytes) {
                Ok(Some(message)) => {
                    self.on_message(now, message);
                    if bounded {
                        // What can start starts, so that the queue holds only what waits.
                        self.pump(now);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    self.reader = Reader::Stopped;
                    let code = e.close_code();
                    if code == CloseCode::TOO_BIG {
                        // The frame is not read: what came before it is answered, then its
                        // own 413, then the close.
                        self.enqueue(now, None, Queued::TooLarge);
                        if !matches!(self.phase, Phase::Ending(Ending::Drain { .. })) {
                            self.set_ending(Ending::TooBig);
                        }
                    } else {
                        self.cut(now);
                        self.close(now, code, CloseReason::ProtocolError);
                    }
                    break;
                }
            }
        }
        self.pump(now);
        offered - bytes.len()
    }

    /// The head of a call's answer.
    pub fn handle_call_head(&mut self, now: Instant, id: CallId, head: ReportedHead) {
        let status = head.status;
        let unix = self.env.now();
        let Some(at) = self.lane_of_call(now, id) else {
            return;
        };
        let lane = &mut self.lanes[at];
        let Some(turn) = lane.turn_mut() else {
            return;
        };
        if upstream_failure::keeps_headers(status) {
            turn.exchange.upstream_headers((head.every)());
        }
        if turn.compacting.is_some() {
            let step = turn.exchange.call_head(status, head.content_type());
            self.compaction_step(now, at, step);
            self.pump(now);
            return;
        }
        let head = ResponseHead {
            status,
            content_type: head.content_type(),
            end_of_stream: false,
        };
        match turn.exchange.response_head(head, unix) {
            HeadStep::Stream => {
                // In flight as any translated stream (the metrics' streams_in_flight).
                if let Some(life) = &mut lane.life {
                    life.open_stream();
                }
            }
            HeadStep::Gather => {}
            HeadStep::Reply(reply) => self.end_with(now, at, reply),
        }
        self.pump(now);
    }

    /// A piece of a call's answer body.
    pub fn handle_call_data(&mut self, now: Instant, id: CallId, bytes: &[u8]) {
        self.call_body(now, id, bytes, false);
    }

    /// A call's answer is complete (its body ended, or its trailers came).
    pub fn handle_call_end(&mut self, now: Instant, id: CallId) {
        self.call_body(now, id, &[], true);
    }

    /// A call brought no whole answer: none (connection refused, a reset, a timeout), or not
    /// all of it.
    pub fn handle_call_failed(&mut self, now: Instant, id: CallId, why: CallFailure<'_>) {
        self.finished_call(id);
        let unix = self.env.now();
        let Some(at) = self.lane_of_call(now, id) else {
            return;
        };
        let Some(turn) = self.lanes[at].turn_mut() else {
            return;
        };
        turn.call = None;
        if turn.compacting.is_some() {
            let step = turn.exchange.call_failed(why);
            self.compaction_step(now, at, step);
            self.pump(now);
            return;
        }
        let step = turn
            .exchange
            .abort(ErrorCode::UpstreamUnavailable, why.message(), unix);
        self.aborted(now, at, step);
        self.pump(now);
    }

    /// Whether the client reads what is sent (the host's buffer toward it is under its low
    /// watermark again, or over its high one). While it cannot write, frames wait here.
    pub fn handle_writable(&mut self, now: Instant, writable: bool) {
        self.writer = match (writable, self.writer) {
            (true, _) => Writer::Writable,
            (false, Writer::Writable) => Writer::Blocked { unread: 0 },
            (false, blocked) => blocked,
        };
        self.pump(now);
    }

    /// The host drains: no further response starts; those in flight may finish for `grace`
    /// (the host's drain time), then the connection closes (1001).
    pub fn handle_drain(&mut self, now: Instant, grace: Duration) {
        if self.is_open() && !matches!(self.ending(), Some(Ending::Drain { .. })) {
            self.phase = Phase::Ending(Ending::Drain {
                deadline: now + grace,
            });
        }
        self.pump(now);
    }

    /// A timer the connection asked for ([`Connection::poll_timeout`]) fired.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.phase {
            Phase::Closing { deadline } if now >= deadline => {
                self.phase = Phase::Closed;
            }
            Phase::Open | Phase::Ending(_) => {
                for at in 0..self.lanes.len() {
                    let late = self.lanes[at]
                        .turn_mut()
                        .filter(|t| t.compacting.is_some_and(|deadline| now >= deadline));
                    if let Some(turn) = late {
                        let call = turn.call.take();
                        let step = turn.exchange.call_failed(CallFailure::TimedOut);
                        if let Some(id) = call {
                            self.stop_call(id);
                        }
                        self.compaction_step(now, at, step);
                    }
                }
                if let Some(Ending::Drain { deadline }) = self.ending() {
                    if now >= deadline {
                        for at in 0..self.lanes.len() {
                            self.abort_turn(
                                now,
                                at,
                                ErrorCode::ServerShuttingDown,
                                "The server is shutting down: the response was ended before it was complete.",
                            );
                        }
                    }
                }
                if self.phase == Phase::Open && now >= self.opened + self.limits.max_age {
                    self.set_ending(Ending::MaxAge);
                }
                if self.is_idle() && self.phase == Phase::Open && now >= self.idle_deadline() {
                    self.close(now, CloseCode::NORMAL, CloseReason::IdleTimeout);
                }
            }
            _ => {}
        }
        self.pump(now);
    }

    /// The host failed under the connection (a panic in its code): the responses in flight
    /// are cut, their calls stopped, and the connection ends at once with 1011 (its close
    /// frame sent if none was).
    pub fn handle_failure(&mut self, now: Instant) {
        if self.phase == Phase::Closed {
            return;
        }
        self.cut(now);
        if self.is_open() {
            self.close_frame(
                CloseCode::INTERNAL_ERROR,
                CloseReason::InternalError.as_str(),
            );
        }
        self.end(CloseCode::INTERNAL_ERROR, CloseReason::InternalError);
    }

    /// The transport ended (the client went, or the host gave up on it): the responses in
    /// flight were cut.
    pub fn handle_closed(&mut self, now: Instant) {
        if self.phase == Phase::Closed {
            return;
        }
        self.cut(now);
        self.end(CloseCode(1006), CloseReason::TransportClosed);
    }

    // ---- outputs ----

    /// The bytes to send to the client now, if any: whole frames, up to [`TRANSMIT_BYTES`] (a
    /// larger frame alone); none while the host cannot write, until the connection is over.
    /// Poll until `None`.
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        let writable = self.writer == Writer::Writable;
        if writable && self.is_open() {
            if let Some(pong) = self.pong.take() {
                self.out.extend_from_slice(&pong);
            }
        }
        if self.out.is_empty() || (!writable && self.is_open()) {
            return None;
        }
        let mut n = 0;
        while n < self.out.len() {
            // Every frame in `out` is whole.
            let len = encode::frame_len(&self.out[n..]).unwrap_or(self.out.len() - n);
            if n > 0 && n + len > TRANSMIT_BYTES {
                break;
            }
            n += len;
        }
        self.last_transmit = n;
        Some(self.out.split_to(n).freeze())
    }

    /// The next call to start or cancel.
    pub fn poll_call(&mut self) -> Option<CallAction> {
        self.calls.pop_front()
    }

    /// When the connection wants [`Connection::handle_timeout`] next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.phase {
            Phase::Closed => None,
            Phase::Closing { deadline } => Some(deadline),
            Phase::Open | Phase::Ending(_) => {
                let open = self.phase == Phase::Open;
                let age = open.then(|| self.opened + self.limits.max_age);
                let idle = (open && self.is_idle()).then(|| self.idle_deadline());
                let busy = self.lanes.iter().any(Lane::is_busy);
                let drain = match self.ending() {
                    Some(Ending::Drain { deadline }) if busy => Some(deadline),
                    _ => None,
                };
                let compaction = self
                    .lanes
                    .iter()
                    .filter_map(|l| l.turn().and_then(|t| t.compacting))
                    .min();
                [age, idle, drain, compaction].into_iter().flatten().min()
            }
        }
    }

    /// The next thing that happened, once each; poll after each input until `None`. A
    /// response's events count its time in the core until their poll, as the driver's do.
    pub fn poll_event(&mut self, now: Instant) -> Option<Event> {
        // What was told before the responses' lives (a message, the last one's answer) comes
        // first; the connection's close last.
        if self
            .events
            .front()
            .is_some_and(|e| !matches!(e, Event::Closed { .. }))
        {
            return self.events.pop_front();
        }
        for lane in &mut self.lanes {
            let Some(life) = lane.life.as_mut() else {
                continue;
            };
            let summary = match &lane.state {
                State::Busy(turn) => Some(turn.exchange.summary()),
                State::Idle { .. } => lane.last.as_ref(),
            };
            if let Some(event) = life.poll(now, summary) {
                if life.is_over() {
                    lane.life = None;
                }
                return Some(Event::Response {
                    lane: lane.key,
                    event,
                });
            }
        }
        self.events.pop_front()
    }

    // ---- the rules ----

    fn is_open(&self) -> bool {
        matches!(self.phase, Phase::Open | Phase::Ending(_))
    }

    fn ending(&self) -> Option<Ending> {
        match self.phase {
            Phase::Ending(ending) => Some(ending),
            _ => None,
        }
    }

    /// The connection ends once what is in flight is over (a later reason replaces an
    /// earlier one, as a drain does a maximum age).
    fn set_ending(&mut self, ending: Ending) {
        if self.is_open() {
            self.phase = Phase::Ending(ending);
        }
    }

    fn on_message(&mut self, now: Instant, message: Message) {
        if !self.is_open() {
            // After our close frame only the client's close matters.
            if let (Message::Close(_), Phase::Closing { .. }) = (&message, self.phase) {
                self.phase = Phase::Closed;
            }
            return;
        }
        match message {
            Message::Text(text) => {
                self.active = now;
                if text.len() > self.limits.max_message_bytes {
                    self.enqueue(now, None, Queued::TooLarge);
                } else {
                    match lane::route(&text) {
                        (lane, false) => {
                            let len = text.len();
                            if self.enqueue(now, lane.as_deref(), Queued::Text(text)) {
                                self.queued_bytes += len;
                            }
                        }
                        (_, true) => self.steer(now, &text),
                    }
                }
            }
            Message::Binary(_) => {
                self.active = now;
                self.enqueue(now, None, Queued::Binary);
            }
            // Answered once the host takes bytes, between messages; it keeps nothing alive.
            // Pings that come before the host took the last pong get one pong, for the last
            // (RFC 6455 §5.5.3): a client that pings and does not read piles up nothing.
            Message::Ping(payload) => self.pong = Some(encode::pong(&payload)),
            Message::Pong(_) => {}
            Message::Close(close) => {
                // The client ends the connection: the responses in flight are cut, and its
                // close is echoed (RFC 6455 §5.5.1).
                self.cut(now);
                let code = close
                    .as_ref()
                    .map(|c| c.code)
                    .filter(|c| c.is_sendable())
                    .unwrap_or(CloseCode::NORMAL);
                self.close_frame(code, "");
                self.end(code, CloseReason::ClosedByClient);
                return;
            }
        }
        // A host that cannot stop reading, fed far past the queue's bound.
        if self.queued > 2 * MAX_QUEUED_MESSAGES
            || self.queued_bytes > 2 * self.limits.max_message_bytes
        {
            self.cut(now);
            self.close(
                now,
                CloseCode::POLICY_VIOLATION,
                CloseReason::TooManyMessages,
            );
        }
    }

    /// Queues a message on its lane, opening the lane if it has none; a lane beyond
    /// [`MAX_LANES`] is refused at once (`false`).
    fn enqueue(&mut self, now: Instant, lane: Option<&str>, message: Queued) -> bool {
        let at = match self.lanes.iter().position(|l| l.id.as_deref() == lane) {
            Some(at) => at,
            None => {
                self.lanes.retain(|l| !l.is_empty());
                let named = self.lanes.iter().filter(|l| l.id.is_some()).count();
                // The lane of messages without a name is always there to answer them (what
                // cannot be read for a name goes there too).
                if lane.is_some() && named >= MAX_LANES {
                    let err = ApiError::invalid(
                        "stream_id",
                        format!(
                            "Too many lanes: this server runs at most {MAX_LANES} lanes ('stream_id') per connection, counting those whose last response is kept for a continuation; messages without a 'stream_id' have a lane of their own beside them."
                        ),
                    )
                    .with_code(ErrorCode::TooManyLanes);
                    self.text_frame(now, lane, &error_frame(&err, &[]));
                    self.events.push_back(Event::Refused {
                        lane: 0,
                        status: err.status,
                        code: err.code.clone(),
                    });
                    return false;
                }
                self.next_lane += 1;
                self.lanes
                    .push(Lane::new(self.next_lane, lane.map(Arc::from)));
                self.lanes.len() - 1
            }
        };
        self.lanes[at].queue.push_back(message);
        self.queued += 1;
        true
    }

    /// Starts what can start, ends what must end.
    fn pump(&mut self, now: Instant) {
        self.start_and_end(now);
        self.account(now);
    }

    /// What the connection holds, against its own limit and the host's budget: past either,
    /// the responses in flight are cut and the connection ends (1008 its own, 1013 the host's).
    fn account(&mut self, now: Instant) {
        let held = self.held();
        let within_budget = match &self.budget {
            Some(budget) => budget.update(self.counted, held),
            None => true,
        };
        self.counted = held;
        let over = if held > self.limits.max_socket_bytes {
            Some((CloseCode::POLICY_VIOLATION, CloseReason::ConnectionMemory))
        } else if !within_budget {
            Some((CloseCode::TRY_AGAIN_LATER, CloseReason::ServerMemory))
        } else {
            None
        };
        let Some((code, reason)) = over else {
            return;
        };
        if self.phase == Phase::Closed {
            return;
        }
        self.cut(now);
        // What it held goes now: no context to continue, no message to read, no frame for a
        // client that does not read (its close frame comes instead).
        self.lanes.clear();
        if self.writer != Writer::Writable {
            self.out.clear();
            self.pong = None;
        }
        self.reader = Reader::Stopped;
        self.close_frame(code, reason.as_str());
        self.end(code, reason);
        let held = self.held();
        if let Some(budget) = &self.budget {
            budget.update(self.counted, held);
        }
        self.counted = held;
    }

    fn start_and_end(&mut self, now: Instant) {
        let mut at = 0;
        while at < self.lanes.len() {
            while matches!(self.phase, Phase::Open | Phase::Ending(Ending::TooBig))
                && !self.lanes[at].is_busy()
            {
                if let Some(successor) = self.lanes[at].successor.take() {
                    self.start_successor(now, at, successor);
                    continue;
                }
                let Some(next) = self.lanes[at].queue.pop_front() else {
                    break;
                };
                self.queued -= 1;
                self.start(now, at, next);
            }
            at += 1;
        }
        if self.is_open() && !self.lanes.iter().any(Lane::is_busy) {
            match self.ending() {
                Some(Ending::TooBig) if self.queued == 0 => {
                    self.close(now, CloseCode::TOO_BIG, CloseReason::MessageTooLarge)
                }
                Some(Ending::MaxAge) => {
                    // Messages and steers that will not start go with the connection.
                    self.drop_queue(now);
                    let minutes = self.limits.max_age.as_secs() / 60;
                    self.error_frame(now, None, &max_age_reached(minutes), &[]);
                    self.close(now, CloseCode::NORMAL, CloseReason::MaxAge);
                }
                Some(Ending::Drain { .. }) => {
                    self.drop_queue(now);
                    self.close(now, CloseCode::GOING_AWAY, CloseReason::ShuttingDown);
                }
                _ => {}
            }
        }
        self.lanes.retain(|l| !l.is_empty());
    }

    /// Drops every lane's waiting messages; their steers fail, since no successor will start.
    fn drop_queue(&mut self, now: Instant) {
        for at in 0..self.lanes.len() {
            self.lanes[at].queue.clear();
            let lane = &mut self.lanes[at];
            let mut steers = std::mem::take(&mut lane.steers);
            if let Some(successor) = lane.successor.take() {
                steers.extend(successor.steers);
            }
            lane.waiting = None;
            self.fail_steers(
                now,
                at,
                steers,
                SteerError::SuccessorCreationFailed,
                "The connection is closing: no successor response will start on it.",
            );
        }
        self.queued = 0;
        self.queued_bytes = 0;
    }

    /// A queued message's turn on its lane.
    fn start(&mut self, now: Instant, at: usize, next: Queued) {
        let text = match next {
            Queued::Binary => {
                let err = ApiError::invalid_body(
                    "Binary messages are not supported: send each event as a JSON text message.",
                )
                .with_code(ErrorCode::InvalidMessage);
                return self.refuse(now, at, &err);
            }
            Queued::TooLarge => {
                return self.refuse(now, at, &message_too_large(self.limits.max_message_bytes))
            }
            Queued::Text(text) => text,
        };
        self.queued_bytes -= text.len();
        self.flush_life(now, at);
        if self.record_content {
            self.events.push_back(Event::Message {
                lane: self.lanes[at].key,
                text: text.clone(),
            });
        }
        let mut steers = Vec::new();
        let begun = self.begin(now, at, &text, None, &mut steers);
        if let (Err(err), false) = (&begun, steers.is_empty()) {
            let why = format!("The continuation could not start: {}", err.message);
            self.fail_steers(now, at, steers, SteerError::SuccessorCreationFailed, &why);
        }
        self.begun(now, at, begun);
    }

    /// A steered response's successor: it continues the response with its settings and the
    /// steers' input. Its `response.created` commits them; if it cannot start, they fail.
    fn start_successor(&mut self, now: Instant, at: usize, successor: Successor) {
        self.flush_life(now, at);
        let Successor {
            parent,
            message,
            mut steers,
        } = successor;
        match self.begin(now, at, &message, Some(&parent), &mut steers) {
            Ok(begun) => self.begun(now, at, Ok(begun)),
            // Not the client's request: only the steers are told.
            Err(err) => {
                let why = format!(
                    "The successor response could not be created: {}",
                    err.message
                );
                self.fail_steers(now, at, steers, SteerError::SuccessorCreationFailed, &why);
            }
        }
    }

    fn begun(&mut self, now: Instant, at: usize, begun: Result<Begun, ApiError>) {
        let mut life = Life::default();
        life.enter(now);
        match begun {
            Ok(Begun::Call(up, compacting)) => {
                life.claim();
                if compacting {
                    life.call_started();
                    let deadline = now + self.settings.compaction_timeout;
                    if let Some(turn) = self.lanes[at].turn_mut() {
                        turn.compacting = Some(deadline);
                    }
                }
                self.lanes[at].life = Some(life);
                self.start_call(at, up);
            }
            Ok(Begun::Answered) => {
                life.claim();
                self.lanes[at].life = Some(life);
                // The same exchange, fed an answer with nothing in it: the same events, ids
                // and echo as any response, and its context kept.
                let unix = self.env.now();
                if let Some(turn) = self.lanes[at].turn_mut() {
                    let head = ResponseHead {
                        status: 200,
                        content_type: crate::exchange::EVENT_STREAM,
                        end_of_stream: false,
                    };
                    let _ = turn.exchange.response_head(head, unix);
                }
                self.body(now, at, NOTHING_GENERATED, true);
            }
            Err(err) => self.refuse(now, at, &err),
        }
        self.settle(at);
    }

    /// Starts the call of a lane's response in flight.
    fn start_call(&mut self, at: usize, up: crate::exchange::UpstreamRequest) {
        let id = CallId(self.next_call);
        self.next_call += 1;
        if let Some(turn) = self.lanes[at].turn_mut() {
            turn.call = Some(id);
            turn.model_headers = up
                .model_headers(&self.settings)
                .into_iter()
                .map(|(name, value)| (Cow::Owned(name.to_owned()), value.to_owned()))
                .collect();
        }
        let call = call::chat(id, &self.settings, up, &self.forwarded);
        self.calls.push_back(CallAction::Start(call));
    }

    /// A step of an automatic compaction's call: the turn's own call once the summary is
    /// sealed, or the response's error.
    fn compaction_step(&mut self, now: Instant, at: usize, step: RequestStep) {
        if matches!(step, RequestStep::Hold) {
            return;
        }
        let lane = &mut self.lanes[at];
        let outcome = lane.turn_mut().and_then(|turn| {
            turn.compacting = None;
            turn.exchange.summary().compaction
        });
        if let Some(life) = &mut lane.life {
            life.call_ended(now, outcome);
        }
        match step {
            RequestStep::Forward(up) => self.start_call(at, up),
            RequestStep::Reply(reply) => self.end_with(now, at, Reply::Error(reply)),
            // A parsed request is never read elsewhere.
            RequestStep::Hold | RequestStep::Call(_) | RequestStep::Work(_) => {
                let err = ApiError::server(
                    500,
                    ErrorCode::InternalError,
                    "The exchange could not be completed: a call out of place.",
                );
                self.end_with(now, at, Reply::Error(crate::exchange::ErrorReply::new(err)));
            }
        }
    }

    /// A message refused before it became a response: its `error` event.
    fn refuse(&mut self, now: Instant, at: usize, err: &ApiError) {
        let lane = self.lanes[at].id.clone();
        self.error_frame(now, lane.as_deref(), err, &[]);
        self.events.push_back(Event::Refused {
            lane: self.lanes[at].key,
            status: err.status,
            code: err.code.clone(),
        });
    }

    /// A `response.create`, read once (as an HTTP body is, within the same caps): the
    /// transport's own fields taken off, the continued context's items put at the head of
    /// `input` (read from the text it was kept as), and the request translated as it was read.
    /// A steered successor reads the message of the response it continues, with the steers'
    /// input for its own.
    fn begin<'s>(
        &mut self,
        now: Instant,
        at: usize,
        text: &Bytes,
        parent: Option<&str>,
        steers: &'s mut Vec<Steer>,
    ) -> Result<Begun, ApiError> {
        let meta = Meta {
            now: self.env.now(),
            id_seed: self.env.id_seed(),
        };
        let mut body = crate::translate::request::parse_request(text, &self.settings.options)?;
        match body.remove("type") {
            Some(Node::Str(t)) if t == *"response.create" => {}
            Some(Node::Str(t)) if t == *"response.steer" => {
                return Err(ApiError::invalid(
                    "type",
                    "The 'type' of a 'response.steer' must be written without escapes.",
                )
                .with_code(ErrorCode::InvalidValue))
            }
            Some(Node::Str(t)) => {
                return Err(ApiError::invalid(
                    "type",
                    format!("Unknown event type '{t}'. This server accepts 'response.create' and 'response.steer'."),
                )
                .with_code(ErrorCode::UnknownEventType))
            }
            Some(_) => {
                return Err(
                    ApiError::invalid("type", "Invalid 'type': expected a string.")
                        .with_code(ErrorCode::InvalidType),
                )
            }
            None => return Err(ApiError::invalid(
                "type",
                "Missing required parameter: 'type'. Send {\"type\": \"response.create\", ...}.",
            )
            .with_code(ErrorCode::MissingRequiredParameter)),
        }
        // The lane was read from it already ([`lane::route`]): the same, or refused.
        let lane = self.lanes[at].id.clone();
        match (body.remove("stream_id"), lane.as_deref()) {
            (None | Some(Node::Null), None) => {}
            (Some(Node::Str(named)), Some(lane)) if named.as_str() == lane => {}
            (Some(Node::Str(_) | Node::Null) | None, _) => {
                return Err(ApiError::invalid(
                    "stream_id",
                    "'stream_id' must be written as a plain key (no escapes).",
                )
                .with_code(ErrorCode::InvalidValue))
            }
            (Some(_), _) => {
                return Err(ApiError::invalid(
                    "stream_id",
                    "Invalid 'stream_id': expected a string.",
                )
                .with_code(ErrorCode::InvalidType))
            }
        }
        // A continuation takes the context it names: whatever happens next, a failure
        // leaves nothing to continue from.
        let named = body.remove("previous_response_id");
        let continued = match (parent, named) {
            (Some(parent), _) => Some(self.take_context(at, parent)?),
            (None, None | Some(Node::Null)) => None,
            (None, Some(Node::Str(id))) => Some(self.take_context(at, &id.as_str())?),
            (None, Some(_)) => {
                return Err(ApiError::invalid(
                    "previous_response_id",
                    "Invalid 'previous_response_id': expected a string.",
                )
                .with_code(ErrorCode::InvalidType))
            }
        };
        for &(field, agrees) in TRANSPORT_FIELDS {
            match (body.remove(field), agrees) {
                (None | Some(Node::Null), _) => {}
                (Some(Node::Bool(v)), Some(ok)) if v == ok => {}
                (Some(_), _) => {
                    return Err(ApiError::invalid(
                        field,
                        format!(
                            "'{field}' is not allowed over the WebSocket transport: every response is streamed as events on the socket, none runs in the background."
                        ),
                    )
                    .with_code(ErrorCode::UnsupportedParameter))
                }
            }
        }
        // `generate: false` preloads a context (instructions, tools, input) without a model
        // call: answered at once, continued by the next request. A successor generates.
        let generate = match body.remove("generate") {
            _ if parent.is_some() => true,
            None | Some(Node::Null) => true,
            Some(Node::Bool(b)) => b,
            Some(other) => {
                return Err(ApiError::invalid(
                    "generate",
                    format!(
                        "Invalid 'generate': expected a boolean, got {}.",
                        serde_json::to_string(&other).unwrap_or_default()
                    ),
                )
                .with_code(ErrorCode::InvalidType))
            }
        };
        if !generate {
            // A preload makes no model call: nothing to compact.
            body.remove("context_management");
        }
        let continues = continued.as_ref().map(|c| c.id.clone());
        // Steers waiting on this lane for the continuation of the response they steered
        // commit in it, their input first; any other request on the lane leaves them nothing
        // to commit in.
        if parent.is_none() {
            *steers = self.take_waiting(now, at, continues.as_deref());
        }
        let steers: &'s Vec<Steer> = steers;
        let own = match parent {
            Some(_) => {
                body.remove("input");
                Vec::new()
            }
            None => new_input(
                body.remove("input"),
                continued.is_some() || !steers.is_empty(),
            )?,
        };
        let mut input = match &continued {
            Some(context) => context.items()?,
            None => Vec::new(),
        };
        for steer in steers {
            input.extend(steer.items());
        }
        input.extend(own);
        // What the next context keeps: the input as JSON text (its tokens as they came).
        let kept = serde_json::to_string(&input).unwrap_or_default();
        let compacted = input.last().is_some_and(is_compaction_trigger);
        // A preload with no input at all (Codex's prewarm: instructions and tools only) is
        // checked as a request with one empty message: nothing is sent, and the context kept
        // is its real, empty input.
        if !generate && input.is_empty() {
            input.push(user_message(Str::Decoded(Cow::Borrowed(""))));
        }
        let request_bytes = text.len()
            + continued
                .as_ref()
                .map_or(0, |c| c.input.len() + c.terminal.len());
        body.fields
            .push((Cow::Borrowed("input"), Node::Array(input)));
        body.fields
            .push((Cow::Borrowed("stream"), Node::Bool(true)));
        let automatic_compaction = body.has("context_management");
        // Automatic compaction reads the request again (its summary, then the compacted
        // turn): written out only for a request that asks for it.
        let whole = automatic_compaction.then(|| Bytes::from(document::object_json(&body.fields)));

        let mut exchange = Exchange::new(self.settings.clone(), Operation::Create);
        exchange.set_reasoning_events(self.reasoning_events);
        exchange.set_tenant(self.tenant.clone());
        let step = exchange.request_read(body, request_bytes, whole, continues, meta);
        let (up, compacting) = match step {
            RequestStep::Forward(up) => (up, false),
            RequestStep::Call(up) => (up, true),
            RequestStep::Reply(reply) => return Err(reply.error),
            RequestStep::Hold | RequestStep::Work(_) => {
                return Err(ApiError::server(
                    500,
                    ErrorCode::InternalError,
                    "The request was not translated.",
                ))
            }
        };
        let turn = Turn {
            exchange,
            call: None,
            input: kept,
            message: text.clone(),
            compacted,
            automatic_compaction,
            compacting: None,
            model_headers: Vec::new(),
        };
        let before = std::mem::replace(&mut self.lanes[at].state, State::Busy(Box::new(turn)));
        if let State::Idle {
            finishing: Some(old),
        } = before
        {
            self.stop_call(old);
        }
        Ok(if generate {
            Begun::Call(up, compacting)
        } else {
            Begun::Answered
        })
    }

    /// The steers a lane holds for the continuation of a completed response: handed over if
    /// `continues` is that response (their input goes first in it), failed otherwise.
    fn take_waiting(&mut self, now: Instant, at: usize, continues: Option<&str>) -> Vec<Steer> {
        let lane = &mut self.lanes[at];
        let Some(parent) = lane.waiting.take() else {
            return Vec::new();
        };
        let steers = std::mem::take(&mut lane.steers);
        if continues == Some(parent.as_str()) {
            return steers;
        }
        self.fail_steers(
            now,
            at,
            steers,
            SteerError::ResponseNotActive,
            "The lane went on without continuing the response the steer waited for.",
        );
        Vec::new()
    }

    /// The kept context a continuation on lane `at` names: taken from its own lane (the new
    /// response will be that lane's last), copied from another (a fork: the other lane may
    /// still continue it).
    fn take_context(&mut self, at: usize, id: &str) -> Result<Context, ApiError> {
        let kept = self
            .lanes
            .iter()
            .position(|l| l.context.as_ref().is_some_and(|c| c.id == id));
        match kept {
            Some(lane) if lane == at => {
                if let Some(context) = self.lanes[lane].context.take() {
                    return Ok(context);
                }
            }
            Some(lane) => {
                if let Some(context) = &self.lanes[lane].context {
                    return Ok(context.clone());
                }
            }
            None => {}
        }
        let why = if self
            .lanes
            .iter()
            .any(|l| l.too_large.as_deref() == Some(id))
        {
            format!(
                "its context was larger than this server keeps per connection ({} bytes)",
                self.limits.max_context_bytes
            )
        } else {
            "only the last response of each lane of this connection can be continued, and only until a continuation of it fails".to_owned()
        };
        Err(ApiError::invalid(
            "previous_response_id",
            format!(
                "Previous response with id '{id}' not found: {why}. Responses are not stored (store: false): send the whole conversation in 'input'."
            ),
        )
        .with_code(ErrorCode::PreviousResponseNotFound))
    }

    /// Tells what is left of a lane's last response's life before its next one begins (a
    /// host that polls after each input finds nothing left).
    fn flush_life(&mut self, now: Instant, at: usize) {
        let lane = &mut self.lanes[at];
        let Some(mut life) = lane.life.take() else {
            return;
        };
        while let Some(event) = life.poll(now, lane.last.as_ref()) {
            self.events.push_back(Event::Response {
                lane: lane.key,
                event,
            });
        }
    }

    /// The lane whose response a call's event is for, entering its life's time; `None` for a
    /// call the connection gave up on.
    fn lane_of_call(&mut self, now: Instant, id: CallId) -> Option<usize> {
        let at = self
            .lanes
            .iter()
            .position(|l| l.turn().is_some_and(|t| t.call == Some(id)))?;
        if let Some(life) = &mut self.lanes[at].life {
            life.enter(now);
        }
        Some(at)
    }

    /// A call left to finish by itself is over.
    fn finished_call(&mut self, id: CallId) {
        for lane in &mut self.lanes {
            if let State::Idle { finishing } = &mut lane.state {
                if *finishing == Some(id) {
                    *finishing = None;
                }
            }
        }
    }

    fn call_body(&mut self, now: Instant, id: CallId, chunk: &[u8], end: bool) {
        let unix = self.env.now();
        if end {
            self.finished_call(id);
        }
        let Some(at) = self.lane_of_call(now, id) else {
            return;
        };
        let Some(turn) = self.lanes[at].turn_mut() else {
            return;
        };
        if end {
            // Over: nothing to cancel.
            turn.call = None;
        }
        if turn.compacting.is_some() {
            let step = turn.exchange.call_body(chunk, end, unix);
            if !matches!(step, RequestStep::Hold) {
                if let Some(id) = turn.call.take() {
                    // An answer over the cap ends the compaction before its body's end.
                    self.stop_call(id);
                }
            }
            self.compaction_step(now, at, step);
        } else {
            self.body(now, at, chunk, end);
        }
        self.settle(at);
        self.pump(now);
    }

    fn body(&mut self, now: Instant, at: usize, chunk: &[u8], end: bool) {
        let unix = self.env.now();
        let Some(turn) = self.lanes[at].turn_mut() else {
            return;
        };
        match turn.exchange.response_body(chunk, end, unix) {
            BodyStep::Send(events) => {
                if turn.exchange.is_finished() {
                    self.end_turn(now, at, events.messages().collect());
                } else {
                    self.send_events(now, at, &events);
                }
            }
            BodyStep::Hold => {}
            BodyStep::Reply(reply) => self.end_with(now, at, reply),
        }
    }

    fn end_with(&mut self, now: Instant, at: usize, reply: Reply) {
        match reply {
            Reply::Answer(Answer {
                body: Body::Events(events),
                ..
            }) => self.end_turn(now, at, events.messages().collect()),
            // Every response on a socket is a stream: an object cannot be framed as events.
            Reply::Answer(_) => {
                let err = ApiError::server(
                    500,
                    ErrorCode::InternalError,
                    "The response could not be framed as events.",
                );
                self.end_turn(now, at, vec![error_frame(&err, &[])]);
            }
            Reply::Error(e) => {
                let frame = error_frame(&e.error, &e.headers);
                self.end_turn(now, at, vec![frame]);
            }
        }
    }

    fn aborted(&mut self, now: Instant, at: usize, step: AbortStep) {
        match step {
            AbortStep::Send(events) => self.end_turn(now, at, events.messages().collect()),
            AbortStep::Reply(reply) => self.end_with(now, at, Reply::Error(reply)),
            AbortStep::Nothing => self.end_turn(now, at, Vec::new()),
        }
    }

    /// A lane's response ended with these messages: keep its context if it ended well; stop
    /// its call if the upstream may still be answering; its steers go on to a successor,
    /// wait for the client's tool output, or fail.
    fn end_turn(&mut self, now: Instant, at: usize, messages: Vec<Bytes>) {
        let name = self.lanes[at].id.clone();
        for m in &messages {
            self.text_frame(now, name.as_deref(), m);
        }
        if let (true, Some(last)) = (self.record_content, messages.last()) {
            self.events.push_back(Event::Answer {
                lane: self.lanes[at].key,
                text: last.clone(),
            });
        }
        self.active = now;
        let before = std::mem::replace(&mut self.lanes[at].state, State::Idle { finishing: None });
        let State::Busy(turn) = before else {
            self.lanes[at].state = before;
            return;
        };
        let summary = turn.exchange.summary().clone();
        self.record(&turn, &summary);
        if let Some(id) = turn.call {
            if summary.outcome == Outcome::Translated {
                // The terminal event is out; the upstream's `[DONE]` and end are on their way.
                self.lanes[at].state = State::Idle {
                    finishing: Some(id),
                };
            } else {
                self.stop_call(id);
            }
        }
        let message = turn.message.clone();
        // A stream that ended well: its terminal event is its last message. Copied, so that
        // the kept context does not hold the whole output buffer it is a slice of.
        let mut kept = None;
        if let (Outcome::Translated, Some(id), Some(terminal)) =
            (summary.outcome, &summary.response_id, messages.last())
        {
            let terminal = Bytes::copy_from_slice(terminal);
            if self.keep(at, id.clone(), *turn, terminal.clone()) {
                kept = Some((id.clone(), terminal));
            }
        }
        if !self.lanes[at].steers.is_empty() {
            self.steered_end(now, at, &summary, kept, message);
        }
        self.lanes[at].last = Some(summary.clone());
        self.last = Some(summary);
        self.settle(at);
    }

    /// The ended response's record, for Envoy's access log and rate limit: its summary and
    /// the socket's id, on a request with its call's headers (a response cut with its
    /// connection has none, as an HTTP exchange Envoy cut has no metadata).
    fn record(&mut self, turn: &Turn, summary: &Summary) {
        if !self.settings.turn_records {
            return;
        }
        let mut headers = turn.model_headers.clone();
        headers.extend(self.forwarded.iter().cloned());
        let fields = metadata::turn(summary, &self.socket_id);
        let record = Record::new(&self.settings, self.env.id_seed(), headers, fields);
        self.records_in_flight += 1;
        self.calls.push_back(CallAction::Record(record));
    }

    /// Ends a lane's response in flight as failed (a drain's deadline, a reader too slow).
    fn abort_turn(&mut self, now: Instant, at: usize, code: ErrorCode, message: &str) {
        let unix = self.env.now();
        let lane = &mut self.lanes[at];
        let State::Busy(turn) = &mut lane.state else {
            return;
        };
        if let Some(life) = &mut lane.life {
            life.enter(now);
        }
        let step = turn.exchange.abort(code, message, unix);
        self.aborted(now, at, step);
    }

    /// The connection ends under the responses in flight: they are cut, their calls stopped;
    /// what waited is dropped.
    fn cut(&mut self, now: Instant) {
        for at in 0..self.lanes.len() {
            let lane = &mut self.lanes[at];
            let before = std::mem::replace(&mut lane.state, State::Idle { finishing: None });
            let call = match before {
                State::Idle { finishing } => finishing,
                State::Busy(turn) => {
                    let summary = turn.exchange.summary().clone();
                    if let Some(life) = &mut lane.life {
                        life.enter(now);
                        life.finish(true);
                    }
                    lane.last = Some(summary.clone());
                    self.last = Some(summary);
                    turn.call
                }
            };
            let lane = &mut self.lanes[at];
            lane.queue.clear();
            lane.steers.clear();
            lane.successor = None;
            lane.waiting = None;
            if let Some(id) = call {
                self.stop_call(id);
            }
        }
        self.queued = 0;
        self.queued_bytes = 0;
    }

    /// The host stops a call: if it has not taken the call's start yet, it never starts.
    fn stop_call(&mut self, id: CallId) {
        let queued = self
            .calls
            .iter()
            .position(|a| matches!(a, CallAction::Start(c) if c.id == id));
        match queued {
            Some(at) => {
                self.calls.remove(at);
            }
            None => self.calls.push_back(CallAction::Cancel(id)),
        }
    }

    /// Keeps an ended response's context on its lane, if it is not too large (`false` then).
    fn keep(&mut self, at: usize, id: String, mut turn: Turn, terminal: Bytes) -> bool {
        // A compaction's output (its sealed summary) stands for everything it summarised.
        if turn.compacted {
            turn.input = "[]".to_owned();
        }
        let bytes = turn.input.len() + terminal.len();
        let lane = &mut self.lanes[at];
        if bytes > self.limits.max_context_bytes {
            lane.context = None;
            lane.too_large = Some(id);
            return false;
        }
        lane.too_large = None;
        lane.context = Some(Context {
            id,
            input: turn.input,
            terminal,
            bytes,
        });
        true
    }

    /// Notes what the last input changed of a lane's response's life: its first output, its
    /// end.
    fn settle(&mut self, at: usize) {
        let Some(lane) = self.lanes.get_mut(at) else {
            return;
        };
        let Some(life) = &mut lane.life else {
            return;
        };
        let (output, ended) = match &lane.state {
            State::Busy(turn) => (turn.exchange.has_output(), false),
            // An ended response is the lane's last summary.
            State::Idle { .. } => (lane.last.as_ref().is_some_and(|s| s.streamed_output), true),
        };
        if output {
            life.output();
        }
        if ended {
            life.finish(false);
        }
    }

    // ---- steering ----

    /// A `response.steer`: queued on the lane of the response in flight it names, told with
    /// `response.steer.accepted`; or refused at once with `response.steer.failed`.
    fn steer(&mut self, now: Instant, text: &[u8]) {
        let submission = match std::str::from_utf8(text) {
            Ok(text) => steer::read(text),
            Err(_) => Err(steer::Refusal {
                target: String::new(),
                input: None,
                why: "The steer is not UTF-8 text.".to_owned(),
            }),
        };
        let submission = match submission {
            Ok(submission) => submission,
            Err(refusal) => {
                let lane = self
                    .lane_of_response(&refusal.target)
                    .and_then(|at| self.lanes[at].id.clone());
                let event = steer::failed(
                    None,
                    &refusal.target,
                    refusal.input.as_deref(),
                    SteerError::InvalidInput,
                    &refusal.why,
                    0,
                );
                self.text_frame(now, lane.as_deref(), &event);
                return;
            }
        };
        let target = submission.target.as_str();
        let refuse = |code: SteerError, why: &str| (code, why.to_owned());
        let verdict = match self.lane_of_response(target) {
            Some(at) => {
                match self.lanes[at].turn() {
                    Some(turn) if turn.response_id() == Some(target) => {
                        if turn.automatic_compaction {
                            Err((Some(at), refuse(SteerError::SteeringNotSupported, "Responses using automatic compaction ('context_management') cannot be steered.")))
                        } else if self.lanes[at].steers.len() >= MAX_PENDING_STEERS {
                            Err((Some(at), refuse(SteerError::TooManyPendingSteers, &format!("The response already has {MAX_PENDING_STEERS} steers waiting."))))
                        } else {
                            Ok(at)
                        }
                    }
                    _ => {
                        let completed = self.lanes[at]
                            .last
                            .as_ref()
                            .is_some_and(|s| s.outcome == Outcome::Translated);
                        if completed {
                            Err((Some(at), refuse(SteerError::ResponseAlreadyCompleted, "The response has ended: continue it with 'response.create' and 'previous_response_id'.")))
                        } else {
                            Err((
                                Some(at),
                                refuse(
                                    SteerError::ResponseNotActive,
                                    "The response is no longer in progress: it failed or was cut.",
                                ),
                            ))
                        }
                    }
                }
            }
            None => Err((
                None,
                refuse(
                    SteerError::ResponseNotFound,
                    "No response with this id is in progress on this connection.",
                ),
            )),
        };
        match verdict {
            Ok(at) => {
                let steer = Steer {
                    id: format!("steer_{:032x}", self.env.id_seed()),
                    target: submission.target.clone(),
                    input: submission.input,
                };
                let number = self.lanes[at]
                    .turn_mut()
                    .and_then(|t| t.exchange.take_sequence_number())
                    .unwrap_or(0);
                let event = steer::accepted(&steer, number);
                let lane = self.lanes[at].id.clone();
                self.lanes[at].steers.push(steer);
                self.text_frame(now, lane.as_deref(), &event);
            }
            Err((at, (code, why))) => {
                let lane = at.and_then(|at| self.lanes[at].id.clone());
                let event = steer::failed(None, target, Some(&submission.input), code, &why, 0);
                self.text_frame(now, lane.as_deref(), &event);
            }
        }
    }

    /// The lane whose response in flight, or last ended response, has this id.
    fn lane_of_response(&self, id: &str) -> Option<usize> {
        if id.is_empty() {
            return None;
        }
        self.lanes
            .iter()
            .position(|l| l.turn().and_then(Turn::response_id) == Some(id))
            .or_else(|| {
                self.lanes.iter().position(|l| {
                    l.last.as_ref().and_then(|s| s.response_id.as_deref()) == Some(id)
                })
            })
    }

    /// A lane's response with steers ended: kept, it is continued by a successor with the
    /// steers' input, or, if it waits for the client's tool output, the steers wait for the
    /// client's continuation (`response.steer.pending`); otherwise they fail.
    fn steered_end(
        &mut self,
        now: Instant,
        at: usize,
        summary: &Summary,
        kept: Option<(String, Bytes)>,
        message: Bytes,
    ) {
        let steers = std::mem::take(&mut self.lanes[at].steers);
        let Some((parent, terminal)) = kept else {
            let (code, why) = if summary.outcome == Outcome::Translated {
                (
                    SteerError::SuccessorCreationFailed,
                    "The response's context was larger than this server keeps per connection: no successor can continue it.",
                )
            } else {
                (
                    SteerError::ResponseNotActive,
                    "The response failed before the steer could be committed.",
                )
            };
            return self.fail_steers(now, at, steers, code, why);
        };
        let (required, mut number) = steer::after(&terminal);
        if required.is_empty() {
            self.lanes[at].successor = Some(Successor {
                parent,
                message,
                steers,
            });
            return;
        }
        let lane = self.lanes[at].id.clone();
        for s in &steers {
            let event = steer::pending(s, &required, number);
            number += 1;
            self.text_frame(now, lane.as_deref(), &event);
        }
        self.lanes[at].steers = steers;
        self.lanes[at].waiting = Some(parent);
    }

    /// Tells each steer's failure, its input given back.
    fn fail_steers(
        &mut self,
        now: Instant,
        at: usize,
        steers: Vec<Steer>,
        code: SteerError,
        why: &str,
    ) {
        let lane = self.lanes[at].id.clone();
        for s in steers {
            let event = steer::failed(Some(&s.id), &s.target, Some(&s.input), code, why, 0);
            self.text_frame(now, lane.as_deref(), &event);
        }
    }

    /// Sends our close frame: the client's is awaited for [`CLOSE_LINGER`].
    fn close(&mut self, now: Instant, code: CloseCode, reason: CloseReason) {
        if !self.is_open() {
            return;
        }
        self.close_frame(code, reason.as_str());
        self.events.push_back(Event::Closed { code, reason });
        self.phase = Phase::Closing {
            deadline: now + CLOSE_LINGER,
        };
    }

    /// The connection is over. Its close is told once, when it stops being open: here, unless
    /// our close frame told it before ([`Connection::close`]).
    fn end(&mut self, code: CloseCode, reason: CloseReason) {
        if self.is_open() {
            self.events.push_back(Event::Closed { code, reason });
        }
        self.phase = Phase::Closed;
    }

    fn is_idle(&self) -> bool {
        self.queued == 0
            && self
                .lanes
                .iter()
                .all(|l| !l.is_busy() && l.successor.is_none())
    }

    fn idle_deadline(&self) -> Instant {
        self.active + self.limits.idle_timeout
    }

    fn send_events(&mut self, now: Instant, at: usize, events: &Events) {
        let lane = self.lanes[at].id.clone();
        for m in events.messages() {
            self.text_frame(now, lane.as_deref(), &m);
        }
    }

    fn error_frame(
        &mut self,
        now: Instant,
        lane: Option<&str>,
        err: &ApiError,
        headers: &[KeptHeader],
    ) {
        self.text_frame(now, lane, &error_frame(err, headers));
    }

    /// One event as one text message: its head, then its JSON (the one copy, into the
    /// output), with its lane's `stream_id` first when it is on a named lane.
    fn text_frame(&mut self, now: Instant, lane: Option<&str>, payload: &[u8]) {
        if !self.is_open() {
            // Our close frame is out: nothing follows it (the rest of a batch of events whose
            // first ones took a slow reader past its limit).
            return;
        }
        let prefix = lane.and_then(|lane| lane::lane_prefix(payload, lane));
        let (prefix, rest): (&[u8], &[u8]) = match &prefix {
            Some(prefix) => (prefix, &payload[1..]),
            None => (&[], payload),
        };
        let len = prefix.len() + rest.len();
        let head = encode::Head::new(crate::websocket::Opcode::Text, len);
        self.out.extend_from_slice(head.as_bytes());
        self.out.extend_from_slice(prefix);
        self.out.extend_from_slice(rest);
        self.count_unread(now, head.as_bytes().len() + len);
    }

    /// Our close frame, the last frame: not a slow reader's limit's business (that limit
    /// would write a close of its own after it).
    fn close_frame(&mut self, code: CloseCode, reason: &str) {
        if !self.is_open() {
            return;
        }
        let frame = encode::close(code, reason);
        self.out.extend_from_slice(&frame);
        if let Writer::Blocked { unread } = &mut self.writer {
            *unread += frame.len();
        }
    }

    /// Bytes for a client that is not reading: over [`Limits::max_unread_bytes`], the frames
    /// it did not read are dropped, the responses in flight fail and the connection ends.
    fn count_unread(&mut self, now: Instant, n: usize) {
        let Writer::Blocked { unread } = &mut self.writer else {
            return;
        };
        *unread += n;
        if *unread > self.limits.max_unread_bytes && self.is_open() {
            // Whole frames only: the client gets the stream up to what the host took, then
            // the responses' ends and the close.
            self.out.clear();
            self.pong = None;
            // (Counted no further: what follows is the connection's last bytes.)
            self.writer = Writer::Writable;
            for at in 0..self.lanes.len() {
                if let Some(id) = self.lanes[at].turn_mut().and_then(|t| t.call.take()) {
                    self.stop_call(id);
                }
                self.abort_turn(
                    now,
                    at,
                    ErrorCode::ResponseTooLarge,
                    "The client did not read the response's events as fast as they came.",
                );
            }
            self.drop_queue(now);
            let reason = CloseReason::ClientTooSlow;
            self.close_frame(CloseCode::POLICY_VIOLATION, reason.as_str());
            self.end(CloseCode::POLICY_VIOLATION, reason);
        }
    }
}

/// What a `response.create` became.
enum Begun {
    /// A Chat call to make; `true`: an automatic compaction's, before the turn's own.
    Call(crate::exchange::UpstreamRequest, bool),
    /// `generate: false`: answered without the upstream.
    Answered,
}

/// A `response.create`'s own input as items: a string is one user message; none at all is no
/// item when a context is continued.
fn new_input(input: Option<Node<'_>>, continues: bool) -> Result<Vec<Node<'_>>, ApiError> {
    match input {
        Some(Node::Str(text)) => Ok(vec![user_message(text)]),
        Some(node) if node.is_array() => {
            Ok(crate::translate::into_items(node)?.unwrap_or_default())
        }
        None if continues => Ok(Vec::new()),
        None => Err(
            ApiError::invalid("input", "Missing required parameter: 'input'.")
                .with_code(ErrorCode::MissingRequiredParameter),
        ),
        Some(_) => Err(ApiError::invalid(
            "input",
            "Invalid 'input': expected a string or an array of items.",
        )
        .with_code(ErrorCode::InvalidType)),
    }
}

/// Whether an input item is a `compaction_trigger`.
fn is_compaction_trigger(item: &Node<'_>) -> bool {
    match item {
        Node::Object(fields) => fields
            .iter()
            .any(|(k, v)| k == "type" && matches!(v, Node::Str(t) if *t == *"compaction_trigger")),
        _ => false,
    }
}

/// Whether a request head opens the WebSocket transport: the Responses path (its query aside)
/// asking for `websocket`, by `upgrade` (HTTP/1.1, and the form Envoy's HTTP/2 codec hands its
/// filters an extended CONNECT in) or by `:protocol` (an extended CONNECT as sent). Whether
/// the upgrade is accepted is the handshake's
/// ([`negotiate`](crate::websocket::handshake::negotiate)).
pub fn opens<'h>(settings: &Settings, header: impl Fn(&str) -> Option<&'h str>) -> bool {
    let path = header(":path").unwrap_or_default();
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let websocket = |name: &str| {
        header(name).is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().eq_ignore_ascii_case("websocket"))
        })
    };
    path == settings.responses_path && (websocket("upgrade") || websocket(":protocol"))
}

fn message_too_large(limit: usize) -> ApiError {
    ApiError::invalid_body(format!(
        "The message is larger than this server accepts (--max-request-bytes, {limit} bytes)."
    ))
    .with_status(413)
    .with_code(ErrorCode::RequestTooLarge)
}

fn max_age_reached(minutes: u64) -> ApiError {
    ApiError::invalid_body(format!(
        "This connection has reached its maximum age ({minutes} minutes): open a new one. \
         Continuations cannot cross connections: send the whole input on the new one."
    ))
    .with_code(ErrorCode::WebsocketConnectionLimitReached)
}

/// The `error` event of the WebSocket transport:
/// `{"type":"error","status":N,"error":{"type","code","message","param"},"headers":{...}}`.
///
/// An event has no HTTP headers: the headers an upstream's error keeps (`retry-after`,
/// `retry-after-ms`, `x-ratelimit-*`) go in it as an object of strings, twice: as
/// `error.headers`, where OpenAI's event type has them (openai-python's
/// `ResponseWsErrorError.headers`, openai-node's `ResponseWsError.Error.headers`), and as
/// `headers`, where Codex reads them into the HTTP error it makes of the event (codex-api's
/// `WrappedWebsocketErrorEvent`). Both are absent when there are none. A context overflow's
/// token counts are fields of `error`, as in the envelope.
pub fn error_frame(err: &ApiError, headers: &[KeptHeader]) -> Bytes {
    #[derive(Serialize)]
    struct Frame<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        status: u16,
        error: Payload<'a>,
        #[serde(skip_serializing_if = "Headers::is_empty")]
        headers: Headers<'a>,
    }
    #[derive(Serialize)]
    struct Payload<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        code: Option<&'a Code>,
        message: &'a str,
        param: Option<&'a str>,
        #[serde(flatten, skip_serializing_if = "Option::is_none")]
        tokens: Option<&'a ContextTokens>,
        #[serde(skip_serializing_if = "Headers::is_empty")]
        headers: Headers<'a>,
    }
    let frame = Frame {
        kind: "error",
        status: err.status,
        error: Payload {
            kind: err.kind.as_str(),
            code: err.code.as_ref(),
            message: &err.message,
            param: err.param.as_deref(),
            tokens: err.tokens.as_ref(),
            headers: Headers(headers),
        },
        headers: Headers(headers),
    };
    // Serialising plain strings cannot fail.
    Bytes::from(serde_json::to_vec(&frame).unwrap_or_default())
}

/// Kept headers as a JSON object of strings.
#[derive(Clone, Copy)]
struct Headers<'a>(&'a [KeptHeader]);

impl Headers<'_> {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for Headers<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|h| (&h.name, &h.value)))
    }
}

/// What a host keeps per lane of a connection (a response's span, its message): one at a
/// time, as a lane has one response in flight; keyed by the events' `lane`.
#[derive(Debug)]
pub struct PerLane<T>(Vec<(u64, T)>);

impl<T> Default for PerLane<T> {
    fn default() -> Self {
        PerLane(Vec::new())
    }
}

impl<T> PerLane<T> {
    pub fn insert(&mut self, lane: u64, value: T) {
        self.take(lane);
        self.0.push((lane, value));
    }

    pub fn get_mut(&mut self, lane: u64) -> Option<&mut T> {
        self.0.iter_mut().find(|(l, _)| *l == lane).map(|(_, v)| v)
    }

    pub fn take(&mut self, lane: u64) -> Option<T> {
        let at = self.0.iter().position(|(l, _)| *l == lane)?;
        Some(self.0.swap_remove(at).1)
    }

    /// Every lane's, taken.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.0.drain(..).map(|(_, v)| v)
    }
}

/// Whatever ends a connection, its bytes leave the shared budget.
impl<E> Drop for Connection<E> {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.update(self.counted, 0);
        }
    }
}

pub mod admission;
mod lane;
mod steer;
#[cfg(test)]
mod tests;
