//! The rules of one WebSocket connection on the Responses path, sans-IO.
//!
//! A client sends `{"type":"response.create", ...}` messages (the body of `POST
//! /v1/responses` without its transport fields); each becomes one [`Exchange`], streamed, and
//! its events go back as one text message each: the same objects as over SSE, numbered from
//! 0 per response. The adapter (the service's `websocket` module) only moves bytes: it sends the Chat
//! request this returns, feeds the answer back in, and sends the messages that come out.
//!
//! Connection-local state, nothing persisted: the last response that completed (or ended
//! incomplete), with its whole context (its input, after its own continuation, plus its
//! output), so that the next `response.create` may name it in `previous_response_id` and
//! send only the new items. That works with `store: false` because nothing outlives the
//! socket. A `response.create` that names the kept response takes it: if that attempt fails
//! (a 4xx or 5xx, a failed stream), the context is gone and naming it again is
//! `previous_response_not_found`. A context over `Limits::max_context_bytes` is not kept.
//!
//! One response at a time: the adapter queues further messages and hands them over in
//! order once [`Connection::in_flight`] is false.
//!
//! Each response's life (its stream opened and closed, its first output, its end, a cut by the
//! socket's close) is told as the driver's [`Event`]s, polled after each input; times come
//! from the caller.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::exchange::{
    AbortStep, BodyStep, Exchange, HeadStep, Operation, Outcome, Reply, RequestStep, ResponseHead,
    Settings, Summary, UpstreamRequest, EVENT_STREAM,
};
use crate::life::{Event, Life};
use crate::openresponses::{ApiError, Code, ContextTokens, ErrorCode};
use crate::translate::{Meta, ReasoningEvents};
use crate::upstream_failure::{self, KeptHeader};

/// The limits of one connection (the adapter enforces the rest: count, age, idle time).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest `response.create` message, in bytes: 413 `request_too_large` beyond.
    pub max_message_bytes: usize,
    /// Largest context kept for a continuation (its input and output as JSON, in bytes).
    pub max_context_bytes: usize,
}

/// What to do with a client's message.
#[derive(Debug)]
pub enum Start {
    /// Send this Chat request upstream and feed its answer to [`Connection::upstream_head`].
    Forward(UpstreamRequest),
    /// Nothing goes upstream: send this `error` event.
    Reject(Rejection),
    /// Nothing goes upstream: a `generate: false` request (Codex's prewarm) was answered at
    /// once, a completed response with no output whose context is kept for a continuation.
    Answered(Frames),
}

/// A message refused before anything went upstream.
#[derive(Debug)]
pub struct Rejection {
    /// The `error` event to send.
    pub frame: Bytes,
    /// Its status and code, for logs.
    pub status: u16,
    pub code: Option<Code>,
}

/// Messages for the client.
#[derive(Debug, Default)]
pub struct Frames {
    /// One text message each (JSON), in order.
    pub messages: Vec<Bytes>,
    /// The response has ended (its terminal event or its error was among the messages):
    /// the next `response.create` may start.
    pub done: bool,
}

/// One WebSocket connection. See the module docs.
#[derive(Debug)]
pub struct Connection {
    settings: Arc<Settings>,
    limits: Limits,
    reasoning_events: ReasoningEvents,
    /// The last response that ended well, ready to be continued.
    context: Option<Context>,
    /// The last response that ended well but was not kept: its id, so that naming it gets a
    /// message that says why.
    too_large: Option<String>,
    turn: Option<Turn>,
    /// The summary of the last exchange that ended, for logs and metrics.
    last: Option<Summary>,
    /// The life of the response in flight, or of the last one until its end is polled.
    life: Option<Life>,
}

#[derive(Debug)]
struct Context {
    id: String,
    /// Its whole input (its own continued context first).
    input: Vec<Value>,
    /// Its terminal event as sent (`response.completed` or `.incomplete`): the output is
    /// read from it only if the context is continued.
    terminal: Bytes,
    bytes: usize,
}

impl Context {
    /// The context as input items: its input, then its output.
    fn into_items(self) -> Result<Vec<Value>, ApiError> {
        #[derive(serde::Deserialize)]
        struct Terminal {
            response: Finished,
        }
        #[derive(serde::Deserialize)]
        struct Finished {
            output: Vec<Value>,
        }
        let terminal: Terminal = serde_json::from_slice(&self.terminal).map_err(|e| {
            ApiError::server(
                500,
                ErrorCode::InternalError,
                format!("The kept response could not be read: {e}."),
            )
        })?;
        let mut items = self.input;
        items.extend(terminal.response.output);
        Ok(items)
    }
}

/// The response in flight.
#[derive(Debug)]
struct Turn {
    exchange: Exchange,
    /// Its whole input (the continued context's items first), kept for the next context.
    input: Vec<Value>,
    input_bytes: usize,
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

impl Connection {
    /// `reasoning_events`: the names this client parses, known from the handshake's headers.
    pub fn new(settings: Arc<Settings>, limits: Limits, reasoning_events: ReasoningEvents) -> Self {
        Connection {
            settings,
            limits,
            reasoning_events,
            context: None,
            too_large: None,
            turn: None,
            last: None,
            life: None,
        }
    }

    /// A response is in flight: further messages wait.
    pub fn in_flight(&self) -> bool {
        self.turn.is_some()
    }

    /// The exchange in flight, for logs and metrics.
    pub fn exchange(&self) -> Option<&Exchange> {
        self.turn.as_ref().map(|t| &t.exchange)
    }

    /// The summary of the last exchange that ended.
    pub fn last_summary(&self) -> Option<&Summary> {
        self.last.as_ref()
    }

    /// Bytes of context kept for a continuation.
    pub fn context_bytes(&self) -> usize {
        self.context.as_ref().map_or(0, |c| c.bytes)
    }

    /// A text message from the client, at `now`.
    pub fn on_text(&mut self, text: &[u8], meta: Meta, now: Instant) -> Start {
        let mut life = Life::default();
        life.enter(now);
        self.life = Some(life);
        match self.start(text, meta) {
            Ok(start) => {
                self.settle();
                start
            }
            Err(err) => {
                // Not a response: nothing to tell.
                self.life = None;
                Start::Reject(Rejection {
                    frame: error_frame(&err, &[]),
                    status: err.status,
                    code: err.code,
                })
            }
        }
    }

    /// A binary message: the protocol is JSON text.
    pub fn on_binary(&mut self) -> Bytes {
        error_frame(
            &ApiError::invalid_body(
                "Binary messages are not supported: send each event as a JSON text message.",
            )
            .with_code(ErrorCode::InvalidMessage),
            &[],
        )
    }

    /// A message over the size limit (the transport did not read it whole).
    pub fn on_oversize(&mut self) -> Bytes {
        error_frame(&message_too_large(self.limits.max_message_bytes), &[])
    }

    /// The error sent when the connection has reached its maximum age.
    pub fn connection_limit_reached(&self, max_age_minutes: u64) -> Bytes {
        error_frame(
            &ApiError::invalid_body(format!(
                "This connection has reached its maximum age ({max_age_minutes} minutes): open a new one. \
                 Continuations cannot cross connections: send the whole input on the new one."
            ))
            .with_code(ErrorCode::WebsocketConnectionLimitReached),
            &[],
        )
    }

    fn start(&mut self, text: &[u8], meta: Meta) -> Result<Start, ApiError> {
        if self.turn.is_some() {
            return Err(ApiError::server(
                500,
                ErrorCode::InternalError,
                "A response.create arrived while a response is in flight.",
            ));
        }
        if text.len() > self.limits.max_message_bytes {
            return Err(message_too_large(self.limits.max_message_bytes));
        }
        let mut body = crate::translate::request::parse_body(text, &self.settings.options)?.map;
        match body.remove("type") {
            Some(Value::String(t)) if t == "response.create" => {}
            Some(Value::String(t)) => {
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
            None | Some(Value::Null) => None,
            Some(Value::String(id)) => Some(self.take_context(&id)?),
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
                (None | Some(Value::Null), _) => {}
                (Some(Value::Bool(v)), Some(ok)) if v == ok => {}
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
        if body.get("stream_id").is_some_and(|v| !v.is_null()) {
            return Err(ApiError::invalid(
                "stream_id",
                "Lanes ('stream_id') are not supported: this server runs one response at a time per connection, in order.",
            )
            .with_code(ErrorCode::UnsupportedParameter));
        }
        // `generate: false` preloads a context (instructions, tools, input) without a model
        // call: answered at once, continued by the next request.
        let generate = match body.remove("generate") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => b,
            Some(other) => {
                return Err(ApiError::invalid(
                    "generate",
                    format!("Invalid 'generate': expected a boolean, got {other}."),
                )
                .with_code(ErrorCode::InvalidType))
            }
        };
        let continues = continued.as_ref().map(|c| c.id.clone());
        let (input, input_bytes) = self.full_input(&mut body, continued, text.len())?;
        body.insert("input".into(), Value::Array(input.clone()));
        body.insert("stream".into(), Value::Bool(true));

        let mut exchange = Exchange::new(self.settings.clone(), Operation::Create);
        exchange.set_reasoning_events(self.reasoning_events);
        match exchange.request_object(body, continues, meta) {
            RequestStep::Forward(up) => {
                self.turn = Some(Turn {
                    exchange,
                    input,
                    input_bytes,
                });
                if generate {
                    return Ok(Start::Forward(up));
                }
                // The same exchange, fed an answer with nothing in it: the same events,
                // ids and echo as any response, and its context kept.
                let now = meta.now;
                let head = self.head(200, "text/event-stream", now);
                let mut frames = self.body(NOTHING_GENERATED, true, now);
                frames.messages.splice(0..0, head.messages);
                Ok(Start::Answered(frames))
            }
            RequestStep::Reply(reply) => Err(reply.error),
            RequestStep::Hold => Err(ApiError::server(
                500,
                ErrorCode::InternalError,
                "The request was not translated.",
            )),
        }
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

    /// The request's input as items, after the continued context's.
    fn full_input(
        &self,
        body: &mut Map<String, Value>,
        continued: Option<Context>,
        message_bytes: usize,
    ) -> Result<(Vec<Value>, usize), ApiError> {
        let new = match body.remove("input") {
            Some(Value::Array(items)) => items,
            Some(Value::String(text)) => vec![serde_json::json!({
                "type": "message", "role": "user", "content": text
            })],
            None if continued.is_some() => Vec::new(),
            None => {
                return Err(
                    ApiError::invalid("input", "Missing required parameter: 'input'.")
                        .with_code(ErrorCode::MissingRequiredParameter),
                )
            }
            Some(_) => {
                return Err(ApiError::invalid(
                    "input",
                    "Invalid 'input': expected a string or an array of items.",
                )
                .with_code(ErrorCode::InvalidType))
            }
        };
        Ok(match continued {
            None => (new, message_bytes),
            Some(context) => {
                let bytes = context.bytes + message_bytes;
                let mut items = context.into_items()?;
                items.extend(new);
                (items, bytes)
            }
        })
    }

    /// The head of the upstream's answer, at `at` (`now`: the wall clock, in seconds):
    /// `every` header is read only of an answer that is not a success (the `error` event made
    /// of it carries some, see [`upstream_failure::kept_headers`]).
    pub fn upstream_head<'h, A>(
        &mut self,
        status: u16,
        content_type: &str,
        every: impl FnOnce() -> A,
        now: u64,
        at: Instant,
    ) -> Frames
    where
        A: IntoIterator<Item = (&'h str, &'h str)>,
    {
        self.enter(at);
        if let (Some(turn), true) = (&mut self.turn, upstream_failure::keeps_headers(status)) {
            turn.exchange.upstream_headers(every());
        }
        let frames = self.head(status, content_type, now);
        self.settle();
        frames
    }

    /// A piece of the upstream's body, at `at`; `end` on the last one.
    pub fn upstream_body(&mut self, chunk: &[u8], end: bool, now: u64, at: Instant) -> Frames {
        self.enter(at);
        let frames = self.body(chunk, end, now);
        self.settle();
        frames
    }

    /// The upstream failed (no answer, a reset, a timeout), at `at`: the response ends as
    /// failed.
    pub fn upstream_failed(
        &mut self,
        code: ErrorCode,
        message: &str,
        now: u64,
        at: Instant,
    ) -> Frames {
        self.enter(at);
        let Some(turn) = &mut self.turn else {
            return Frames::default();
        };
        let frames = match turn.exchange.abort(code, message, now) {
            AbortStep::Send(bytes) => {
                let messages = event_messages(&bytes);
                self.end_turn(messages)
            }
            AbortStep::Reply(reply) => self.end_with(Reply::Error(reply)),
            AbortStep::Nothing => self.end_turn(Vec::new()),
        };
        self.settle();
        frames
    }

    /// The socket closed, at `at`: a response in flight was cut.
    pub fn closed(&mut self, at: Instant) {
        if let (Some(life), Some(_)) = (&mut self.life, &self.turn) {
            life.enter(at);
            life.finish(true);
        }
    }

    /// The next thing that happened to the response in flight (or that just ended), once
    /// each: its stream opened, its first output, its stream closed, its end. Poll after each input until `None`.
    pub fn poll_event(&mut self, at: Instant) -> Option<Event> {
        let life = self.life.as_mut()?;
        let summary = match &self.turn {
            Some(turn) => Some(turn.exchange.summary()),
            None => self.last.as_ref(),
        };
        let event = life.poll(at, summary);
        if life.is_over() {
            self.life = None;
        }
        event
    }

    fn enter(&mut self, at: Instant) {
        if let Some(life) = &mut self.life {
            life.enter(at);
        }
    }

    /// Notes what the last input changed: the first output, the end.
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

    fn head(&mut self, status: u16, content_type: &str, now: u64) -> Frames {
        let Some(turn) = &mut self.turn else {
            return Frames::default();
        };
        let head = ResponseHead {
            status,
            content_type,
            end_of_stream: false,
        };
        match turn.exchange.response_head(head, now) {
            HeadStep::Stream => {
                // In flight as any translated stream (the metrics' streams_in_flight).
                if let Some(life) = &mut self.life {
                    life.open_stream();
                }
                Frames::default()
            }
            HeadStep::Gather => Frames::default(),
            HeadStep::Reply(reply) => self.end_with(reply),
        }
    }

    fn body(&mut self, chunk: &[u8], end: bool, now: u64) -> Frames {
        let Some(turn) = &mut self.turn else {
            return Frames::default();
        };
        match turn.exchange.response_body(chunk, end, now) {
            BodyStep::Send(bytes) => {
                let messages = event_messages(&bytes);
                if turn.exchange.is_finished() {
                    self.end_turn(messages)
                } else {
                    Frames {
                        messages,
                        done: false,
                    }
                }
            }
            BodyStep::Hold => Frames::default(),
            BodyStep::Reply(reply) => self.end_with(reply),
        }
    }

    fn end_with(&mut self, reply: Reply) -> Frames {
        let messages = match reply {
            Reply::Answer(a) if a.content_type == EVENT_STREAM => event_messages(&a.body),
            // Every response on a socket is a stream: an object cannot be framed as events.
            Reply::Answer(_) => vec![error_frame(
                &ApiError::server(
                    500,
                    ErrorCode::InternalError,
                    "The response could not be framed as events.",
                ),
                &[],
            )],
            Reply::Error(e) => vec![error_frame(&e.error, &e.headers)],
        };
        self.end_turn(messages)
    }

    /// The response ended: keep its context if it ended well.
    fn end_turn(&mut self, messages: Vec<Bytes>) -> Frames {
        if let Some(turn) = self.turn.take() {
            let summary = turn.exchange.summary().clone();
            // A stream that ended well: its terminal event is its last message. Copied, so
            // that the kept context does not hold the whole output buffer it is a slice of.
            if let (Outcome::Translated, Some(id), Some(terminal)) =
                (summary.outcome, &summary.response_id, messages.last())
            {
                self.keep(id.clone(), turn, Bytes::copy_from_slice(terminal));
            }
            self.last = Some(summary);
        }
        Frames {
            messages,
            done: true,
        }
    }

    fn keep(&mut self, id: String, mut turn: Turn, terminal: Bytes) {
        // A compaction's output (its sealed summary) stands for everything it summarised.
        let compacted = turn
            .input
            .last()
            .and_then(|item| item.get("type"))
            .is_some_and(|t| t == "compaction_trigger");
        if compacted {
            turn.input.clear();
            turn.input_bytes = 0;
        }
        let bytes = turn.input_bytes + terminal.len();
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
}

fn message_too_large(limit: usize) -> ApiError {
    ApiError::invalid_body(format!(
        "The message is larger than this server accepts (--max-request-bytes, {limit} bytes)."
    ))
    .with_status(413)
    .with_code(ErrorCode::RequestTooLarge)
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

/// The events of the core's SSE output (`event: X\ndata: {json}\n\n`, one line of data each,
/// see `openresponses::events`), as one message each: slices of the same buffer, no copy.
/// The closing `[DONE]` is an SSE convention and is not sent.
pub fn event_messages(sse: &Bytes) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut rest = &sse[..];
    let mut offset = 0;
    while let Some(start) = find(rest, b"data: ") {
        let data = start + b"data: ".len();
        let len = rest[data..]
            .iter()
            .position(|&b| b == b'\n')
            .unwrap_or(rest.len() - data);
        let payload = &rest[data..data + len];
        if payload != b"[DONE]" {
            out.push(sse.slice(offset + data..offset + data + len));
        }
        offset += data + len;
        rest = &rest[data + len..];
    }
    out
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests;
