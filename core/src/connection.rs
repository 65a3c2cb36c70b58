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
use serde_json::value::RawValue;

use crate::call::{self, CallAction, CallFailure, CallId};
use crate::environment::{Environment, System};
use crate::exchange::{
    AbortStep, Answer, Body, BodyStep, Exchange, HeadStep, Operation, Outcome, Reply, RequestStep,
    ResponseHead, Settings, Summary,
};
use crate::life::{self, Life};
use crate::metadata::{self, record::Record};
use crate::openresponses::{ApiError, Code, ContextTokens, ErrorCode, Events};
use crate::translate::json::document::{self, Node, Str};
use crate::translate::json::shape::Kind;
use crate::translate::{Meta, ReasoningEvents};
use crate::upstream_failure::{self, KeptHeader};
use crate::websocket::decode::{Decoder, Message};
use crate::websocket::{encode, CloseCode, CloseReason};
use admission::Budget;

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
    /// output, finished (or cut) with its summary and timing.
    Response(life::Event),
    /// A message refused before it became a response (not a valid `response.create`): its
    /// status and error code.
    Refused { status: u16, code: Option<Code> },
    /// A client message, for hosts that record content (`Connection::record_content`).
    Message(Bytes),
    /// A response's last message (its terminal event, or its error), for hosts that record
    /// content.
    Answer(Bytes),
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
    decoder: Decoder,
    phase: Phase,
    /// Set once the connection must end after the response in flight.
    ending: Option<Ending>,
    opened: Instant,
    /// The last client message (or the end of the last response): the idle timer's start.
    active: Instant,
    queue: VecDeque<Queued>,
    queued_bytes: usize,
    /// The response in flight.
    turn: Option<Turn>,
    /// The call of a response that ended well while its upstream had not finished (the
    /// terminal event came before the body's end): left to end by itself, cancelled when
    /// the next call starts or the connection ends.
    finishing: Option<CallId>,
    /// The last response that ended well, ready to be continued.
    context: Option<Context>,
    /// The last response that ended well but was not kept: its id, so that naming it gets a
    /// message that says why.
    too_large: Option<String>,
    /// The summary of the last response that ended, for logs.
    last: Option<Summary>,
    /// The life of the response in flight, or of the last one until its end is polled.
    life: Option<Life>,
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
    /// The client's bytes cannot be read any further (a frame refused unread, a protocol
    /// error).
    read_failed: bool,
    /// The memory all of the host's connections share, when the host has one.
    budget: Option<Arc<Budget>>,
    /// What this connection counts in it.
    counted: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
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

/// Why the connection ends once the response in flight is over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// A frame over twice the message limit, refused unread: the messages before it are
    /// answered (its own 413 among them), then 1009.
    TooBig,
    /// `max_age` reached: no further message starts; an `error` event, then 1000.
    MaxAge,
    /// The host drains: no further message starts; 1001 after the response in flight, or at
    /// `deadline` with that response failed.
    Drain { deadline: Instant },
}

/// What the client sent, in order.
#[derive(Debug)]
enum Queued {
    Text(Bytes),
    Binary,
    /// A message between the message limit and twice it: read, and refused in its turn.
    TooLarge,
}

/// The last response that ended well, kept as the text it was sent and read as: nothing of it
/// is a tree until a continuation reads it (counted at its size, [`Connection::held`]).
#[derive(Debug)]
struct Context {
    id: String,
    /// Its whole input (its own continued context first), a JSON array.
    input: String,
    /// Its terminal event as sent (`response.completed` or `.incomplete`): the output is
    /// read from it only if the context is continued.
    terminal: Bytes,
    bytes: usize,
}

impl Context {
    /// The context as input items, borrowed from its text: its input, then its output.
    fn items(&self) -> Result<Vec<Node<'_>>, ApiError> {
        #[derive(serde::Deserialize)]
        struct Terminal<'a> {
            #[serde(borrow)]
            response: Finished<'a>,
        }
        #[derive(serde::Deserialize)]
        struct Finished<'a> {
            #[serde(borrow)]
            output: &'a RawValue,
        }
        let unreadable = |why: &dyn std::fmt::Display| {
            ApiError::server(
                500,
                ErrorCode::InternalError,
                format!("The kept response could not be read: {why}."),
            )
        };
        fn as_items<'a>(
            read: Result<Node<'a>, document::Refused>,
        ) -> Result<Vec<Node<'a>>, String> {
            match read {
                Ok(Node::Array(items)) => Ok(items),
                Ok(other) => Err(format!("{} for items", other.type_name())),
                Err(refused) => Err(format!("{refused:?}")),
            }
        }
        let mut items =
            as_items(document::parse(&self.input, Kind::Input)).map_err(|e| unreadable(&e))?;
        let text = std::str::from_utf8(&self.terminal).map_err(|e| unreadable(&e))?;
        let terminal: Terminal<'_> = serde_json::from_str(text).map_err(|e| unreadable(&e))?;
        let output = document::open(terminal.response.output, Kind::Input);
        items.extend(as_items(output).map_err(|e| unreadable(&e))?);
        Ok(items)
    }
}

/// The response in flight.
#[derive(Debug)]
struct Turn {
    exchange: Exchange,
    /// Its call, while the upstream may still answer.
    call: Option<CallId>,
    /// Its whole input (the continued context's items first), a JSON array kept for the next
    /// context.
    input: String,
    /// The last item of `input` is a `compaction_trigger`: its output stands for the rest.
    compacted: bool,
    /// Its call is an automatic compaction's summarising request, given up on at this time.
    compacting: Option<Instant>,
    /// The model headers of its last call, which its record carries too.
    model_headers: Vec<(Cow<'static, str>, String)>,
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
            decoder: Decoder::new(limits.max_message_bytes),
            forwarded: call::forwarded(&handshake, &settings.forward_headers),
            settings,
            limits,
            env,
            reasoning_events,
            phase: Phase::Open,
            ending: None,
            opened: now,
            active: now,
            queue: VecDeque::new(),
            queued_bytes: 0,
            turn: None,
            finishing: None,
            context: None,
            too_large: None,
            last: None,
            life: None,
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
            read_failed: false,
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

    /// Bytes the connection holds: its kept context and the input of the response in flight
    /// (JSON text: no tree of them is kept), what the response in flight has output so far
    /// (kept for its closing events), the queued messages, the message being read, the frames
    /// not yet handed to the host, the client's bytes the host holds for it
    /// ([`Connection::set_read_buffer`]), and, while the host cannot write, what it holds
    /// toward the client ([`Connection::set_write_buffer`] and the last piece it took).
    pub fn held(&self) -> usize {
        let host = if self.writer == Writer::Writable {
            0
        } else {
            self.write_buffer + self.last_transmit
        };
        self.context_bytes()
            + self
                .turn
                .as_ref()
                .map_or(0, |t| t.input.len() + t.exchange.held_output())
            + self.queued_bytes
            + self.decoder.held()
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

    /// The exchange in flight, for logs.
    pub fn exchange(&self) -> Option<&Exchange> {
        self.turn.as_ref().map(|t| &t.exchange)
    }

    /// The summary of the last response that ended, for logs.
    pub fn last_summary(&self) -> Option<&Summary> {
        self.last.as_ref()
    }

    /// Bytes of context kept for a continuation.
    pub fn context_bytes(&self) -> usize {
        self.context.as_ref().map_or(0, |c| c.bytes)
    }

    /// Whether the host should read more of the client's bytes now. A host that can stop
    /// reading does so while this is false (the client then feels TCP's backpressure): while
    /// messages wait their turn, and while more than a piece ([`TRANSMIT_BYTES`]) of frames
    /// waits for the host, so that a client that does not read cannot make the connection
    /// answer more of its messages than the host takes.
    pub fn wants_input(&self) -> bool {
        self.phase != Phase::Closed
            && !self.read_failed
            && self.queue.len() < MAX_QUEUED_MESSAGES
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
        self.phase != Phase::Closed && !self.read_failed
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
        while !bytes.is_empty()
            && self.phase != Phase::Closed
            && !self.read_failed
            && (!bounded || self.wants_input())
        {
            match self.decoder.decode(&mut bytes) {
                Ok(Some(message)) => {
                    self.on_message(now, message);
                    if bounded {
                        // What can start starts, so that the queue holds only what waits.
                        self.pump(now);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    self.read_failed = true;
                    let code = e.close_code();
                    if code == CloseCode::TOO_BIG {
                        // The frame is not read: what came before it is answered, then its
                        // own 413, then the close.
                        self.queue.push_back(Queued::TooLarge);
                        self.ending = Some(Ending::TooBig);
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

    /// The head of a call's answer (`status`; `header` looks up its headers by lowercase
    /// name; `every` header is read only of an answer that is not a success: the `error` event
    /// made of it keeps some, see [`upstream_failure::kept_headers`]).
    pub fn handle_call_head<'h, A>(
        &mut self,
        now: Instant,
        id: CallId,
        status: u16,
        header: impl Fn(&str) -> Option<&'h str>,
        every: impl FnOnce() -> A,
    ) where
        A: IntoIterator<Item = (&'h str, &'h str)>,
    {
        let unix = self.env.now();
        let Some(turn) = self.turn_of(now, id) else {
            return;
        };
        if upstream_failure::keeps_headers(status) {
            turn.exchange.upstream_headers(every());
        }
        if turn.compacting.is_some() {
            let step = turn
                .exchange
                .call_head(status, header("content-type").unwrap_or_default());
            self.compaction_step(now, step);
            self.pump(now);
            return;
        }
        let head = ResponseHead {
            status,
            content_type: header("content-type").unwrap_or_default(),
            end_of_stream: false,
        };
        match turn.exchange.response_head(head, unix) {
            HeadStep::Stream => {
                // In flight as any translated stream (the metrics' streams_in_flight).
                if let Some(life) = &mut self.life {
                    life.open_stream();
                }
            }
            HeadStep::Gather => {}
            HeadStep::Reply(reply) => self.end_with(now, reply),
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
        if self.finishing == Some(id) {
            self.finishing = None;
        }
        let unix = self.env.now();
        let Some(turn) = self.turn_of(now, id) else {
            return;
        };
        turn.call = None;
        if turn.compacting.is_some() {
            let step = turn.exchange.call_failed(why);
            self.compaction_step(now, step);
            self.pump(now);
            return;
        }
        match turn
            .exchange
            .abort(ErrorCode::UpstreamUnavailable, why.message(), unix)
        {
            AbortStep::Send(events) => self.end_turn(now, events.messages().collect()),
            AbortStep::Reply(reply) => self.end_with(now, Reply::Error(reply)),
            AbortStep::Nothing => self.end_turn(now, Vec::new()),
        }
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

    /// The host drains: no further response starts; the one in flight may finish until
    /// `deadline`, then the connection closes (1001).
    pub fn handle_drain(&mut self, now: Instant, deadline: Instant) {
        if self.phase == Phase::Open && !matches!(self.ending, Some(Ending::Drain { .. })) {
            self.ending = Some(Ending::Drain { deadline });
        }
        self.pump(now);
    }

    /// A timer the connection asked for ([`Connection::poll_timeout`]) fired.
    pub fn handle_timeout(&mut self, now: Instant) {
        match self.phase {
            Phase::Closing { deadline } if now >= deadline => {
                self.phase = Phase::Closed;
            }
            Phase::Open => {
                let late = self
                    .turn
                    .as_mut()
                    .filter(|t| t.compacting.is_some_and(|deadline| now >= deadline));
                if let Some(turn) = late {
                    let call = turn.call.take();
                    let step = turn.exchange.call_failed(CallFailure::TimedOut);
                    if let Some(id) = call {
                        self.stop_call(id);
                    }
                    self.compaction_step(now, step);
                }
                if let Some(Ending::Drain { deadline }) = self.ending {
                    if now >= deadline && self.turn.is_some() {
                        self.abort_turn(
                            now,
                            ErrorCode::ServerShuttingDown,
                            "The server is shutting down: the response was ended before it was complete.",
                        );
                    }
                }
                if self.ending.is_none() && now >= self.opened + self.limits.max_age {
                    self.ending = Some(Ending::MaxAge);
                }
                if self.is_idle() && self.ending.is_none() && now >= self.idle_deadline() {
                    self.close(now, CloseCode::NORMAL, CloseReason::IdleTimeout);
                }
            }
            _ => {}
        }
        self.pump(now);
    }

    /// The host failed under the connection (a panic in its code): the response in flight is
    /// cut, its call stopped, and the connection ends at once with 1011 (its close frame sent
    /// if none was).
    pub fn handle_failure(&mut self, now: Instant) {
        if self.phase == Phase::Closed {
            return;
        }
        self.cut(now);
        self.drop_queue();
        if self.phase == Phase::Open {
            self.close_frame(
                CloseCode::INTERNAL_ERROR,
                CloseReason::InternalError.as_str(),
            );
        }
        self.end(CloseCode::INTERNAL_ERROR, CloseReason::InternalError);
    }

    /// The transport ended (the client went, or the host gave up on it): a response in flight
    /// was cut.
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
        if writable && self.phase == Phase::Open {
            if let Some(pong) = self.pong.take() {
                self.out.extend_from_slice(&pong);
            }
        }
        if self.out.is_empty() || (!writable && self.phase == Phase::Open) {
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
            Phase::Open => {
                let age = (self.ending.is_none()).then(|| self.opened + self.limits.max_age);
                let idle = (self.is_idle() && self.ending.is_none()).then(|| self.idle_deadline());
                let drain = match self.ending {
                    Some(Ending::Drain { deadline }) if self.turn.is_some() => Some(deadline),
                    _ => None,
                };
                let compaction = self.turn.as_ref().and_then(|t| t.compacting);
                [age, idle, drain, compaction].into_iter().flatten().min()
            }
        }
    }

    /// The next thing that happened, once each; poll after each input until `None`. A
    /// response's events count its time in the core until their poll, as the driver's do.
    pub fn poll_event(&mut self, now: Instant) -> Option<Event> {
        // What was told before the response's life (its message, the last one's answer)
        // comes first; the connection's close last.
        if self
            .events
            .front()
            .is_some_and(|e| !matches!(e, Event::Closed { .. }))
        {
            return self.events.pop_front();
        }
        if let Some(life) = self.life.as_mut() {
            let summary = match &self.turn {
                Some(turn) => Some(turn.exchange.summary()),
                None => self.last.as_ref(),
            };
            if let Some(event) = life.poll(now, summary) {
                if life.is_over() {
                    self.life = None;
                }
                return Some(Event::Response(event));
            }
        }
        self.events.pop_front()
    }

    // ---- the rules ----

    fn on_message(&mut self, now: Instant, message: Message) {
        if self.phase != Phase::Open {
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
                    self.queue.push_back(Queued::TooLarge);
                } else {
                    self.queued_bytes += text.len();
                    self.queue.push_back(Queued::Text(text));
                }
            }
            Message::Binary(_) => {
                self.active = now;
                self.queue.push_back(Queued::Binary);
            }
            // Answered once the host takes bytes, between messages; it keeps nothing alive.
            // Pings that come before the host took the last pong get one pong, for the last
            // (RFC 6455 §5.5.3): a client that pings and does not read piles up nothing.
            Message::Ping(payload) => self.pong = Some(encode::pong(&payload)),
            Message::Pong(_) => {}
            Message::Close(close) => {
                // The client ends the connection: a response in flight is cut, and its close
                // is echoed (RFC 6455 §5.5.1).
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
        if self.queue.len() > 2 * MAX_QUEUED_MESSAGES
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

    /// Starts what can start, ends what must end.
    fn pump(&mut self, now: Instant) {
        self.start_and_end(now);
        self.account(now);
    }

    /// What the connection holds, against its own limit and the host's budget: past either,
    /// the response in flight is cut and the connection ends (1008 its own, 1013 the host's).
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
        self.context = None;
        if self.writer != Writer::Writable {
            self.out.clear();
            self.pong = None;
        }
        self.read_failed = true;
        self.decoder = Decoder::new(0);
        self.close_frame(code, reason.as_str());
        self.end(code, reason);
        let held = self.held();
        if let Some(budget) = &self.budget {
            budget.update(self.counted, held);
        }
        self.counted = held;
    }

    fn start_and_end(&mut self, now: Instant) {
        while self.phase == Phase::Open && self.turn.is_none() {
            if matches!(self.ending, Some(Ending::MaxAge | Ending::Drain { .. })) {
                break;
            }
            let Some(next) = self.queue.pop_front() else {
                break;
            };
            self.start(now, next);
        }
        if self.phase != Phase::Open || self.turn.is_some() {
            return;
        }
        match self.ending {
            Some(Ending::TooBig) if self.queue.is_empty() => {
                self.close(now, CloseCode::TOO_BIG, CloseReason::MessageTooLarge)
            }
            Some(Ending::MaxAge) => {
                // Messages that will not start go with the connection.
                self.drop_queue();
                let minutes = self.limits.max_age.as_secs() / 60;
                self.error_frame(now, &max_age_reached(minutes), &[]);
                self.close(now, CloseCode::NORMAL, CloseReason::MaxAge);
            }
            Some(Ending::Drain { .. }) => {
                self.drop_queue();
                self.close(now, CloseCode::GOING_AWAY, CloseReason::ShuttingDown);
            }
            _ => {}
        }
    }

    fn drop_queue(&mut self) {
        self.queue.clear();
        self.queued_bytes = 0;
    }

    /// A queued message's turn.
    fn start(&mut self, now: Instant, next: Queued) {
        let text = match next {
            Queued::Binary => {
                let err = ApiError::invalid_body(
                    "Binary messages are not supported: send each event as a JSON text message.",
                )
                .with_code(ErrorCode::InvalidMessage);
                return self.refuse(now, &err);
            }
            Queued::TooLarge => {
                return self.refuse(now, &message_too_large(self.limits.max_message_bytes))
            }
            Queued::Text(text) => text,
        };
        self.queued_bytes -= text.len();
        self.flush_life(now);
        if self.record_content {
            self.events.push_back(Event::Message(text.clone()));
        }
        let mut life = Life::default();
        life.enter(now);
        let meta = Meta {
            now: self.env.now(),
            id_seed: self.env.id_seed(),
        };
        match self.begin(&text, meta) {
            Ok(Begun::Call(up, compacting)) => {
                life.claim();
                if let Some(old) = self.finishing.take() {
                    self.stop_call(old);
                }
                if compacting {
                    life.call_started();
                    let deadline = now + self.settings.compaction_timeout;
                    if let Some(turn) = &mut self.turn {
                        turn.compacting = Some(deadline);
                    }
                }
                self.life = Some(life);
                self.start_call(up);
            }
            Ok(Begun::Answered) => {
                life.claim();
                self.life = Some(life);
                // The same exchange, fed an answer with nothing in it: the same events, ids
                // and echo as any response, and its context kept.
                let unix = self.env.now();
                if let Some(turn) = &mut self.turn {
                    let head = ResponseHead {
                        status: 200,
                        content_type: crate::exchange::EVENT_STREAM,
                        end_of_stream: false,
                    };
                    let _ = turn.exchange.response_head(head, unix);
                }
                self.body(now, NOTHING_GENERATED, true);
            }
            Err(err) => self.refuse(now, &err),
        }
        self.settle();
    }

    /// Starts the call of the response in flight.
    fn start_call(&mut self, up: crate::exchange::UpstreamRequest) {
        let id = CallId(self.next_call);
        self.next_call += 1;
        if let Some(turn) = &mut self.turn {
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
    fn compaction_step(&mut self, now: Instant, step: RequestStep) {
        if matches!(step, RequestStep::Hold) {
            return;
        }
        let outcome = self.turn.as_mut().and_then(|turn| {
            turn.compacting = None;
            turn.exchange.summary().compaction
        });
        if let Some(life) = &mut self.life {
            life.call_ended(now, outcome);
        }
        match step {
            RequestStep::Forward(up) => self.start_call(up),
            RequestStep::Reply(reply) => self.end_with(now, Reply::Error(reply)),
            // A parsed request is never read elsewhere.
            RequestStep::Hold | RequestStep::Call(_) | RequestStep::Work(_) => {
                let err = ApiError::server(
                    500,
                    ErrorCode::InternalError,
                    "The exchange could not be completed: a call out of place.",
                );
                self.end_with(now, Reply::Error(crate::exchange::ErrorReply::new(err)));
            }
        }
    }

    /// A message refused before it became a response: its `error` event.
    fn refuse(&mut self, now: Instant, err: &ApiError) {
        self.error_frame(now, err, &[]);
        self.events.push_back(Event::Refused {
            status: err.status,
            code: err.code.clone(),
        });
    }

    /// A `response.create`, read once (as an HTTP body is, within the same caps): the
    /// transport's own fields taken off, the continued context's items put at the head of
    /// `input` (read from the text it was kept as), and the request translated as it was read.
    fn begin(&mut self, text: &[u8], meta: Meta) -> Result<Begun, ApiError> {
        let mut body = crate::translate::request::parse_request(text, &self.settings.options)?;
        match body.remove("type") {
            Some(Node::Str(t)) if t == *"response.create" => {}
            Some(Node::Str(t)) => {
                return Err(ApiError::invalid(
                    "type",
                    format!("Unknown event type '{t}'. This server accepts 'response.create'."),
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
        // A continuation takes the context it names: whatever happens next, a failure
        // leaves nothing to continue from.
        let continued = match body.remove("previous_response_id") {
            None | Some(Node::Null) => None,
            Some(Node::Str(id)) => Some(self.take_context(&id.as_str())?),
            Some(_) => {
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
        if body.has("stream_id") {
            return Err(ApiError::invalid(
                "stream_id",
                "Lanes ('stream_id') are not supported: this server runs one response at a time per connection, in order.",
            )
            .with_code(ErrorCode::UnsupportedParameter));
        }
        // `generate: false` preloads a context (instructions, tools, input) without a model
        // call: answered at once, continued by the next request.
        let generate = match body.remove("generate") {
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
        let new = new_input(body.remove("input"), continued.is_some())?;
        let mut input = match &continued {
            Some(context) => context.items()?,
            None => Vec::new(),
        };
        input.extend(new);
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
        // Automatic compaction reads the request again (its summary, then the compacted
        // turn): written out only for a request that asks for it.
        let whole = body
            .has("context_management")
            .then(|| Bytes::from(document::object_json(&body.fields)));

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
        self.turn = Some(Turn {
            exchange,
            call: None,
            input: kept,
            compacted,
            compacting: None,
            model_headers: Vec::new(),
        });
        Ok(if generate {
            Begun::Call(up, compacting)
        } else {
            Begun::Answered
        })
    }

    fn take_context(&mut self, id: &str) -> Result<Context, ApiError> {
        match self.context.take() {
            Some(c) if c.id == id => Ok(c),
            other => {
                self.context = other;
                let why = if self.too_large.as_deref() == Some(id) {
                    format!(
                        "its context was larger than this server keeps per connection ({} bytes)",
                        self.limits.max_context_bytes
                    )
                } else {
                    "only the last response of this connection can be continued, and only until a continuation of it fails".to_owned()
                };
                Err(ApiError::invalid(
                    "previous_response_id",
                    format!(
                        "Previous response with id '{id}' not found: {why}. Responses are not stored (store: false): send the whole conversation in 'input'."
                    ),
                )
                .with_code(ErrorCode::PreviousResponseNotFound))
            }
        }
    }

    /// Tells what is left of the last response's life before the next one begins (a host
    /// that polls after each input finds nothing left).
    fn flush_life(&mut self, now: Instant) {
        let Some(mut life) = self.life.take() else {
            return;
        };
        while let Some(event) = life.poll(now, self.last.as_ref()) {
            self.events.push_back(Event::Response(event));
        }
    }

    /// The turn a call's event is for, entering its life's time; `None` for a call the
    /// connection gave up on.
    fn turn_of(&mut self, now: Instant, id: CallId) -> Option<&mut Turn> {
        let turn = self.turn.as_mut().filter(|t| t.call == Some(id))?;
        if let Some(life) = &mut self.life {
            life.enter(now);
        }
        Some(turn)
    }

    fn call_body(&mut self, now: Instant, id: CallId, chunk: &[u8], end: bool) {
        let unix = self.env.now();
        if end && self.finishing == Some(id) {
            self.finishing = None;
        }
        let Some(turn) = self.turn_of(now, id) else {
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
            self.compaction_step(now, step);
        } else {
            self.body(now, chunk, end);
        }
        self.settle();
        self.pump(now);
    }

    fn body(&mut self, now: Instant, chunk: &[u8], end: bool) {
        let unix = self.env.now();
        let Some(turn) = &mut self.turn else {
            return;
        };
        match turn.exchange.response_body(chunk, end, unix) {
            BodyStep::Send(events) => {
                if turn.exchange.is_finished() {
                    self.end_turn(now, events.messages().collect());
                } else {
                    self.send_events(now, &events);
                }
            }
            BodyStep::Hold => {}
            BodyStep::Reply(reply) => self.end_with(now, reply),
        }
    }

    fn end_with(&mut self, now: Instant, reply: Reply) {
        match reply {
            Reply::Answer(Answer {
                body: Body::Events(events),
                ..
            }) => self.end_turn(now, events.messages().collect()),
            // Every response on a socket is a stream: an object cannot be framed as events.
            Reply::Answer(_) => {
                let err = ApiError::server(
                    500,
                    ErrorCode::InternalError,
                    "The response could not be framed as events.",
                );
                self.end_turn(now, vec![error_frame(&err, &[])]);
            }
            Reply::Error(e) => {
                let frame = error_frame(&e.error, &e.headers);
                self.end_turn(now, vec![frame]);
            }
        }
    }

    /// The response ended with these messages: keep its context if it ended well; stop its
    /// call if the upstream may still be answering.
    fn end_turn(&mut self, now: Instant, messages: Vec<Bytes>) {
        for m in &messages {
            self.text_frame(now, m);
        }
        if let (true, Some(last)) = (self.record_content, messages.last()) {
            self.events.push_back(Event::Answer(last.clone()));
        }
        self.active = now;
        let Some(turn) = self.turn.take() else {
            return;
        };
        let summary = turn.exchange.summary().clone();
        self.record(&turn, &summary);
        if let Some(id) = turn.call {
            if summary.outcome == Outcome::Translated {
                // The terminal event is out; the upstream's `[DONE]` and end are on their way.
                self.finishing = Some(id);
            } else {
                self.stop_call(id);
            }
        }
        // A stream that ended well: its terminal event is its last message. Copied, so that
        // the kept context does not hold the whole output buffer it is a slice of.
        if let (Outcome::Translated, Some(id), Some(terminal)) =
            (summary.outcome, &summary.response_id, messages.last())
        {
            self.keep(id.clone(), turn, Bytes::copy_from_slice(terminal));
        }
        self.last = Some(summary);
        self.settle();
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

    /// Ends the response in flight as failed (a drain's deadline, a reader too slow).
    fn abort_turn(&mut self, now: Instant, code: ErrorCode, message: &str) {
        let unix = self.env.now();
        let Some(turn) = &mut self.turn else {
            return;
        };
        if let Some(life) = &mut self.life {
            life.enter(now);
        }
        match turn.exchange.abort(code, message, unix) {
            AbortStep::Send(events) => self.end_turn(now, events.messages().collect()),
            AbortStep::Reply(reply) => self.end_with(now, Reply::Error(reply)),
            AbortStep::Nothing => self.end_turn(now, Vec::new()),
        }
    }

    /// The connection ends under the response in flight: it is cut, its call stopped.
    fn cut(&mut self, now: Instant) {
        if let Some(old) = self.finishing.take() {
            self.stop_call(old);
        }
        let Some(turn) = self.turn.take() else {
            return;
        };
        if let Some(id) = turn.call {
            self.stop_call(id);
        }
        self.last = Some(turn.exchange.summary().clone());
        if let Some(life) = &mut self.life {
            life.enter(now);
            life.finish(true);
        }
        self.drop_queue();
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

    fn keep(&mut self, id: String, mut turn: Turn, terminal: Bytes) {
        // A compaction's output (its sealed summary) stands for everything it summarised.
        if turn.compacted {
            turn.input = "[]".to_owned();
        }
        let bytes = turn.input.len() + terminal.len();
        if bytes > self.limits.max_context_bytes {
            self.context = None;
            self.too_large = Some(id);
            return;
        }
        self.too_large = None;
        self.context = Some(Context {
            id,
            input: turn.input,
            terminal,
            bytes,
        });
    }

    /// Notes what the last input changed of the response's life: its first output, its end.
    fn settle(&mut self) {
        let Some(life) = &mut self.life else {
            return;
        };
        let (output, ended) = match &self.turn {
            Some(turn) => (turn.exchange.has_output(), false),
            // An ended response is the connection's last summary.
            None => (self.last.as_ref().is_some_and(|s| s.streamed_output), true),
        };
        if output {
            life.output();
        }
        if ended {
            life.finish(false);
        }
    }

    /// Sends our close frame: the client's is awaited for [`CLOSE_LINGER`].
    fn close(&mut self, now: Instant, code: CloseCode, reason: CloseReason) {
        if self.phase != Phase::Open {
            return;
        }
        self.close_frame(code, reason.as_str());
        self.events.push_back(Event::Closed { code, reason });
        self.phase = Phase::Closing {
            deadline: now + CLOSE_LINGER,
        };
    }

    /// The connection is over. Its close is told once, when it leaves [`Phase::Open`]: here,
    /// unless our close frame told it before ([`Connection::close`]).
    fn end(&mut self, code: CloseCode, reason: CloseReason) {
        if self.phase == Phase::Open {
            self.events.push_back(Event::Closed { code, reason });
        }
        self.phase = Phase::Closed;
    }

    fn is_idle(&self) -> bool {
        self.turn.is_none() && self.queue.is_empty()
    }

    fn idle_deadline(&self) -> Instant {
        self.active + self.limits.idle_timeout
    }

    fn send_events(&mut self, now: Instant, events: &Events) {
        for m in events.messages() {
            self.text_frame(now, &m);
        }
    }

    fn error_frame(&mut self, now: Instant, err: &ApiError, headers: &[KeptHeader]) {
        self.text_frame(now, &error_frame(err, headers));
    }

    /// One event as one text message: its head, then its JSON (the one copy, into the output).
    fn text_frame(&mut self, now: Instant, payload: &[u8]) {
        if self.phase != Phase::Open {
            // Our close frame is out: nothing follows it (the rest of a batch of events whose
            // first ones took a slow reader past its limit).
            return;
        }
        let head = encode::Head::new(crate::websocket::Opcode::Text, payload.len());
        self.out.extend_from_slice(head.as_bytes());
        self.out.extend_from_slice(payload);
        self.count_unread(now, head.as_bytes().len() + payload.len());
    }

    /// Our close frame, the last frame: not a slow reader's limit's business (that limit
    /// would write a close of its own after it).
    fn close_frame(&mut self, code: CloseCode, reason: &str) {
        if self.phase != Phase::Open {
            return;
        }
        let frame = encode::close(code, reason);
        self.out.extend_from_slice(&frame);
        if let Writer::Blocked { unread } = &mut self.writer {
            *unread += frame.len();
        }
    }

    /// Bytes for a client that is not reading: over [`Limits::max_unread_bytes`], the frames
    /// it did not read are dropped, the response in flight fails and the connection ends.
    fn count_unread(&mut self, now: Instant, n: usize) {
        let Writer::Blocked { unread } = &mut self.writer else {
            return;
        };
        *unread += n;
        if *unread > self.limits.max_unread_bytes && self.phase == Phase::Open {
            // Whole frames only: the client gets the stream up to what the host took, then
            // the response's end and the close.
            self.out.clear();
            self.pong = None;
            // (Counted no further: what follows is the connection's last bytes.)
            self.writer = Writer::Writable;
            if let Some(turn) = &mut self.turn {
                if let Some(id) = turn.call.take() {
                    self.stop_call(id);
                }
            }
            self.abort_turn(
                now,
                ErrorCode::ResponseTooLarge,
                "The client did not read the response's events as fast as they came.",
            );
            self.drop_queue();
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

/// `{"type": "message", "role": "user", "content": text}`.
fn user_message(text: Str<'_>) -> Node<'_> {
    let word = |w: &'static str| Node::Str(Str::Decoded(Cow::Borrowed(w)));
    Node::Object(vec![
        (Cow::Borrowed("type"), word("message")),
        (Cow::Borrowed("role"), word("user")),
        (Cow::Borrowed("content"), Node::Str(text)),
    ])
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

/// Whatever ends a connection, its bytes leave the shared budget.
impl<E> Drop for Connection<E> {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.update(self.counted, 0);
        }
    }
}

pub mod admission;
#[cfg(test)]
mod tests;
