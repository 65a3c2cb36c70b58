//! The rules of one exchange, sans-IO: a client's Responses request in, the Chat request for
//! the upstream out; the upstream's head in, a decision out; its body in, the client's bytes
//! out; and every way it can end.
//!
//! Transport adapters (Envoy's ext_proc, the WebSocket listener) drive one [`Exchange`] per
//! request and only move bytes: which answers are translated, streamed, gathered or replaced
//! by an error envelope is decided here, once. Nothing here knows gRPC, Envoy or an async
//! runtime; the caller supplies the clock ([`Meta`], `now`).
//!
//! Fail closed: once an exchange exists, every step yields either translated bytes or an
//! OpenResponses error ([`Reply`]); no step says "let the original bytes through". A call that
//! does not fit the exchange's state (a body before its head, a second head) ends it with an
//! error rather than guessing.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::client::{self, ReasoningEventsPolicy};
use crate::openresponses::{ApiError, Code, ErrorCode, Events, Usage};
use crate::request_encoding::{self, Decoder};
use crate::translate::request::Window;
use crate::translate::seal::Tenant;
use crate::translate::stream::StreamTranslator;
use crate::translate::{self, compact, response, Meta, Options, Params, ReasoningEvents};
use crate::upstream_failure::{self, CallFailure, KeptHeader};

/// What a request asks of us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `POST /v1/responses`: create a response.
    Create,
    /// `POST /v1/responses/compact`: summarise an input window into a sealed `compaction`
    /// item (answered with one `response.compaction` object, never streamed).
    Compact,
}

impl Operation {
    /// Its name in logs and Envoy metadata.
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "create",
            Operation::Compact => "compact",
        }
    }
}

/// Default of `responses_path`.
pub const DEFAULT_RESPONSES_PATH: &str = "/v1/responses";
/// Default of `chat_path`.
pub const DEFAULT_CHAT_PATH: &str = "/v1/chat/completions";
/// Default of `model_header`.
pub const DEFAULT_MODEL_HEADER: &str = "x-responses-model";
/// Default of `upstream_model_header`.
pub const DEFAULT_UPSTREAM_MODEL_HEADER: &str = "x-responses-upstream-model";
/// Default of `forward_headers`: the client's identity in envoy/examples/token-rate-limit.yaml.
pub const DEFAULT_FORWARD_HEADERS: &str = "x-client-id";
/// Default of `max_body_bytes`: 16 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 << 20;
/// Default of `compaction_timeout`, in seconds.
pub const DEFAULT_COMPACTION_TIMEOUT: u64 = 25;

/// The settings of the exchange rules. The operator sets them through
/// `crate::settings::ExchangeConfig` (flags or the module's JSON), whose defaults are these.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The path of `POST` requests that are ours (`/v1/responses`); query strings ignored.
    pub responses_path: String,
    /// The upstream path of translated requests (`/v1/chat/completions`).
    pub chat_path: String,
    /// Request header set to the model name the client asked for, so that routes can match
    /// on it (lowercase).
    pub model_header: String,
    /// Request header set to the model name the Chat request carries: the model map's for
    /// the requested one, else the requested one (lowercase).
    pub upstream_model_header: String,
    /// Request header whose value is the tenant sealed items are bound to (lowercase; `None`:
    /// blobs are bound to no tenant). See [`tenant`].
    pub seal_tenant_header: Option<String>,
    /// Headers of a client's request its own calls carry on beside
    /// [`call::FORWARDED_HEADERS`](crate::call::FORWARDED_HEADERS) (lowercase): those Envoy's
    /// rate limits or routes key on (`x-client-id`).
    pub forward_headers: Vec<String>,
    /// A WebSocket connection asks its host to send each ended turn's record
    /// ([`crate::metadata::record`]): off where Envoy's route table has no records' route.
    pub turn_records: bool,
    /// Largest upstream answer gathered whole (JSON, error bodies, folded streams).
    pub max_body_bytes: usize,
    /// How long an automatic compaction's summarising call may take (the host enforces it).
    pub compaction_timeout: Duration,
    /// Which reasoning event names each client gets (`options.reasoning_events` is only the
    /// per-exchange result, see [`Exchange::request_head`]).
    pub reasoning_events: ReasoningEventsPolicy,
    /// Translation options, the request caps included.
    pub options: Options,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            responses_path: DEFAULT_RESPONSES_PATH.to_owned(),
            chat_path: DEFAULT_CHAT_PATH.to_owned(),
            model_header: DEFAULT_MODEL_HEADER.to_owned(),
            upstream_model_header: DEFAULT_UPSTREAM_MODEL_HEADER.to_owned(),
            seal_tenant_header: None,
            forward_headers: vec![DEFAULT_FORWARD_HEADERS.to_owned()],
            turn_records: true,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            compaction_timeout: Duration::from_secs(DEFAULT_COMPACTION_TIMEOUT),
            reasoning_events: ReasoningEventsPolicy::default(),
            options: Options::default(),
        }
    }
}

/// Which operation a request is, if it is ours at all (other traffic passes untouched).
pub fn route(settings: &Settings, method: &str, path: &str) -> Option<Operation> {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    if method != "POST" {
        return None;
    }
    match path.strip_prefix(settings.responses_path.as_str())? {
        "" => Some(Operation::Create),
        "/compact" => Some(Operation::Compact),
        _ => None,
    }
}

/// The tenant a request's sealed items are bound to: the value of the tenant header
/// (`header` looks it up by lowercase name) when the operator names one, [`Tenant::Missing`]
/// when the request has none (or an empty one), [`Tenant::Unbound`] when no header is named.
pub fn tenant<'h>(settings: &Settings, header: impl Fn(&str) -> Option<&'h str>) -> Tenant {
    let Some(name) = &settings.seal_tenant_header else {
        return Tenant::Unbound;
    };
    match header(name) {
        Some(id) if !id.is_empty() => Tenant::Id(id.into()),
        _ => Tenant::Missing,
    }
}

/// A complete answer for the client, replacing whatever the upstream sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// The translation: a response (or compaction) object, or a whole event stream.
    Answer(Answer),
    /// An OpenResponses error envelope.
    Error(ErrorReply),
}

/// A translated answer, whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// 200, whatever 2xx the upstream chose.
    pub status: u16,
    pub body: Body,
}

/// The body of a whole answer, as it is framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// One JSON object: a response, a compaction.
    Json(Bytes),
    /// A whole event stream (one that ended as soon as it began).
    Events(Events),
}

/// The body's bytes.
impl std::ops::Deref for Body {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes()
    }
}

impl Body {
    pub fn content_type(&self) -> &'static str {
        match self {
            Body::Json(_) => JSON,
            Body::Events(_) => EVENT_STREAM,
        }
    }

    pub fn bytes(&self) -> &Bytes {
        match self {
            Body::Json(b) => b,
            Body::Events(e) => e.bytes(),
        }
    }

    /// The JSON object that stands for the answer: the object itself, or a stream's last
    /// (terminal) event (`--trace-content` records it).
    pub fn last_object(&self) -> Option<Bytes> {
        match self {
            Body::Json(b) => Some(b.clone()),
            Body::Events(e) => e.last(),
        }
    }
}

/// An error envelope: its JSON body, its error for transports that frame it their own way
/// (the WebSocket `error` event), and the headers it keeps from an upstream's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorReply {
    pub error: ApiError,
    pub body: Bytes,
    /// Response headers to send with it: those an upstream's error keeps for the client
    /// (`retry-after`, `retry-after-ms`, `x-ratelimit-*`; see [`upstream_failure`]).
    pub headers: Vec<KeptHeader>,
}

pub const JSON: &str = "application/json";
pub const EVENT_STREAM: &str = "text/event-stream";

impl ErrorReply {
    pub fn new(error: ApiError) -> Self {
        ErrorReply {
            body: error.to_body(),
            error,
            headers: Vec::new(),
        }
    }

    pub fn status(&self) -> u16 {
        self.error.status
    }

    /// Always JSON.
    pub fn content_type(&self) -> &'static str {
        JSON
    }
}

impl Reply {
    pub fn status(&self) -> u16 {
        match self {
            Reply::Answer(a) => a.status,
            Reply::Error(e) => e.status(),
        }
    }

    pub fn content_type(&self) -> &'static str {
        match self {
            Reply::Answer(a) => a.body.content_type(),
            Reply::Error(e) => e.content_type(),
        }
    }

    pub fn body(&self) -> &Bytes {
        match self {
            Reply::Answer(a) => a.body.bytes(),
            Reply::Error(e) => &e.body,
        }
    }
}

/// The Chat request to send upstream.
#[derive(Debug, Clone)]
pub struct UpstreamRequest {
    pub body: Bytes,
    /// The model the client asked for (the model header's value).
    pub model: String,
    /// The model the Chat body names: the model map's name for `model`, else `model` (the
    /// upstream model header's value).
    pub chat_model: String,
    pub stream: bool,
}

impl UpstreamRequest {
    /// The model headers of the Chat request, `(name, value)`: the requested name for routes
    /// and rate limits keyed on what clients ask for, the name sent for those keyed on the
    /// upstream's. Every transport sets both.
    pub fn model_headers<'a>(&'a self, settings: &'a Settings) -> [(&'a str, &'a str); 2] {
        [
            (settings.model_header.as_str(), self.model.as_str()),
            (
                settings.upstream_model_header.as_str(),
                self.chat_model.as_str(),
            ),
        ]
    }
}

#[derive(Debug)]
pub enum RequestStep {
    /// Keep the bytes; more are expected.
    Hold,
    /// Send this instead of the client's body (to `Settings::chat_path`).
    Forward(UpstreamRequest),
    /// Before the turn goes upstream, make this call and report its answer
    /// ([`Exchange::call_head`], [`Exchange::call_body`], [`Exchange::call_failed`]): an
    /// automatic compaction's summarising request (`context_management`), never streamed.
    /// The client's request is held meanwhile; the turn follows as [`RequestStep::Forward`].
    Call(UpstreamRequest),
    /// Answer the client with this envelope; the upstream is never called.
    Reply(ErrorReply),
    /// The body is costly to read (see [`Exchange::offload`]): [`Work::run`] it on any
    /// thread, then hand its result to [`Exchange::request_worked`]. The client's request is
    /// held meanwhile.
    Work(Box<Work>),
}

/// A request body at least this large is costly to translate (about a millisecond per MiB
/// of agent turn, measured: up to ~15 ms at the default cap), as a compressed one is (up to
/// the decoding budget's time, [`request_encoding`]): its host translates it off its event
/// loop ([`Exchange::is_costly`], [`Exchange::offload`]).
pub const COSTLY_BODY_BYTES: usize = 1 << 20;

/// The costly part of reading a request (decoding, parsing, translating), apart from its
/// exchange: pure, and `Send`, for another thread.
#[derive(Debug)]
pub struct Work {
    /// The body as it came (encoded, when `decoder` is set).
    body: Bytes,
    decoder: Option<Box<Decoder>>,
    operation: Operation,
    settings: Arc<Settings>,
    tenant: Tenant,
    meta: Meta,
}

/// What [`Work::run`] made, for [`Exchange::request_worked`].
#[derive(Debug)]
pub struct Worked {
    planned: Planned,
    meta: Meta,
}

impl Work {
    /// Decodes, parses and translates the body (within the decoding budget and the caps).
    pub fn run(self) -> Worked {
        let options = options_for(&self.settings, &self.tenant);
        let planned = match self.decoder {
            None => plan(&self.body, self.operation, &options, self.meta),
            Some(mut decoder) => match decoder.push(&self.body).and_then(|()| decoder.finish()) {
                Ok(plain) => plan(&plain, self.operation, &options, self.meta),
                Err(err) => Planned {
                    turn: Err(err),
                    compaction: None,
                },
            },
        };
        Worked {
            planned,
            meta: self.meta,
        }
    }

    /// The body's size as it came (encoded, if it is).
    pub fn len(&self) -> usize {
        self.body.len()
    }

    pub fn is_empty(&self) -> bool {
        self.body.is_empty()
    }
}

/// What a plain body asks for: the turn, and (its estimate over its threshold) the
/// compaction's call first.
#[derive(Debug)]
struct Planned {
    turn: Result<translate::request::Translated, ApiError>,
    compaction: Option<Box<Summarising>>,
}

/// A turn's summarising request, when its compaction is due.
#[derive(Debug)]
struct Summarising {
    /// The plain body, kept for the turn's translation after the call.
    request: Bytes,
    call: Result<translate::request::Translated, ApiError>,
}

/// Parses and translates a client's whole plain body (the pure part of a request's reading).
fn plan(full: &[u8], operation: Operation, options: &Options, meta: Meta) -> Planned {
    if full.is_empty() {
        let err = ApiError::invalid_body(
            "The request has no body. Send a JSON object with 'model' and 'input'.",
        )
        .with_code(ErrorCode::MissingBody);
        return Planned {
            turn: Err(err),
            compaction: None,
        };
    }
    let turn = match operation {
        Operation::Create => translate::translate_request(full, options, meta),
        Operation::Compact => compact::translate(full, options, meta),
    };
    // Rare (a threshold crossed): the body is kept for the turn's translation.
    let compaction = match &turn {
        Ok(t) if t.compaction_due.is_some() => {
            let request = Bytes::copy_from_slice(full);
            let call = summarise(&request, true, options, meta);
            Some(Box::new(Summarising { request, call }))
        }
        _ => None,
    };
    Planned { turn, compaction }
}

/// The summarising request of a turn whose compaction is due (`capped`: `request` is the
/// client's body as it came, within the size cap).
fn summarise(
    request: &[u8],
    capped: bool,
    options: &Options,
    meta: Meta,
) -> Result<translate::request::Translated, ApiError> {
    translate::request::translate_window(request, capped, options, meta, Window::Summarise)
}

/// The translation's options for a tenant: the settings' (a copy only when sealed items are
/// bound to tenants).
fn options_for<'s>(settings: &'s Settings, tenant: &Tenant) -> std::borrow::Cow<'s, Options> {
    if *tenant == settings.options.tenant {
        return std::borrow::Cow::Borrowed(&settings.options);
    }
    let mut options = settings.options.clone();
    options.tenant = tenant.clone();
    std::borrow::Cow::Owned(options)
}

/// How an automatic compaction went, for logs, metrics and Envoy's metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionOutcome {
    /// Its summarising call is in flight.
    Running,
    /// The summary is sealed and the turn went upstream on the compacted window.
    Compacted,
    /// The summarising call failed (the exchange ended with its error).
    Failed,
}

impl CompactionOutcome {
    /// Its name in metadata and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            CompactionOutcome::Running => "running",
            CompactionOutcome::Compacted => "compacted",
            CompactionOutcome::Failed => "failed",
        }
    }

    /// Its label once the exchange is recorded: `cut` for one still running, which the host
    /// ended first.
    pub fn recorded(self) -> &'static str {
        match self {
            CompactionOutcome::Running => "cut",
            other => other.as_str(),
        }
    }
}

/// An exchange's automatic compaction (`context_management`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    pub outcome: CompactionOutcome,
    /// The turn's estimated input tokens, which crossed `threshold`.
    pub estimate: u64,
    pub threshold: u64,
    /// The summarising request's usage, when the upstream reported it.
    pub usage: Option<Usage>,
}

/// An automatic compaction's call, in flight.
#[derive(Debug)]
struct Compacting {
    /// The client's body, plain: the turn is translated again from it once the summary is
    /// sealed.
    request: Bytes,
    /// `request` is the client's body as it came (within the size cap), not one written from
    /// a parsed object.
    capped: bool,
    meta: Meta,
    /// What the turn echoes as `previous_response_id` ([`Exchange::request_read`]).
    continues: Option<String>,
    /// The call's answer, once its head came.
    answer: Option<CallAnswer>,
}

#[derive(Debug)]
struct CallAnswer {
    status: u16,
    /// JSON, or no content type (as for a forwarded request's answer).
    json: bool,
    body: BytesMut,
}

/// The head of the answer to a forwarded request (or of Envoy's own reply in its place).
#[derive(Debug, Clone, Copy)]
pub struct ResponseHead<'a> {
    pub status: u16,
    pub content_type: &'a str,
    /// The answer has no body.
    pub end_of_stream: bool,
}

#[derive(Debug)]
pub enum HeadStep {
    /// Send `200 text/event-stream` now and the bytes of each body step as they come.
    Stream,
    /// Hold the head: the body is gathered (bounded) and answered whole by a [`Reply`].
    Gather,
    /// Answer now with this; none of the upstream's body passes.
    Reply(Reply),
}

#[derive(Debug)]
pub enum BodyStep {
    /// Streaming: send these events now (possibly none).
    Send(Events),
    /// Gathering: nothing to send yet.
    Hold,
    /// The answer, complete: send this instead of the upstream's.
    Reply(Reply),
}

#[derive(Debug)]
pub enum AbortStep {
    /// Nothing was sent to the client yet: answer with this envelope.
    Reply(ErrorReply),
    /// A stream is open: its last events (`error`, `response.failed`, `[DONE]`).
    Send(Events),
    /// The exchange had already ended.
    Nothing,
}

/// Why an exchange ended on our side: a host call out of its place, or a failure of ours.
/// Never the client's or the upstream's doing (those have error codes of their own): each is
/// a 500 `internal_error` naming it, and a reset carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A request body after the request was complete.
    BodyAfterRequest,
    /// A parsed request for an exchange that is past its request, or not a `create`.
    ObjectOutOfPlace,
    /// A second answer head while the first one's stream is open.
    SecondHead,
    /// An answer (head or body) after the exchange ended.
    AfterEnd,
    /// An answer body without its head.
    BodyWithoutHead,
    /// A stream folded into one object did not end.
    UnendedFold,
    /// Trailers where the answer could not end.
    TrailersOutOfPlace,
    /// A whole answer after the client had the answer's head.
    AnswerAfterHead,
    /// The adapter caught a panic, or the host could not go on with the exchange.
    Failed,
    /// The host refused one of the exchange's header edits.
    HeaderRefused,
    /// A call's answer where the exchange made no call, or out of order.
    CallOutOfPlace,
    /// A request read elsewhere where the exchange asked for no such work.
    WorkOutOfPlace,
}

impl Fault {
    /// What the client is told.
    pub fn message(self) -> &'static str {
        match self {
            Fault::BodyAfterRequest => {
                "The exchange could not be completed: a request body after the request."
            }
            Fault::ObjectOutOfPlace => {
                "The exchange could not be completed: a parsed request out of place."
            }
            Fault::SecondHead => "The exchange could not be completed: a second answer head.",
            Fault::AfterEnd => "The exchange could not be completed: an answer after the end.",
            Fault::BodyWithoutHead => {
                "The exchange could not be completed: an answer body without its head."
            }
            Fault::UnendedFold => {
                "The exchange could not be completed: a folded stream did not end."
            }
            Fault::TrailersOutOfPlace => {
                "The exchange could not be completed: trailers out of place."
            }
            Fault::AnswerAfterHead => {
                "The exchange could not be completed: an answer after the answer's head."
            }
            Fault::Failed => "responses-extproc failed while translating this exchange.",
            Fault::HeaderRefused => {
                "The exchange could not be completed: the proxy refused one of its header edits."
            }
            Fault::CallOutOfPlace => {
                "The exchange could not be completed: a call's answer out of place."
            }
            Fault::WorkOutOfPlace => {
                "The exchange could not be completed: a request read out of place."
            }
        }
    }

    /// Its error: 500 `internal_error`.
    pub fn error(self) -> ApiError {
        ApiError::server(500, ErrorCode::InternalError, self.message())
    }
}

/// How an exchange ended, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Still running.
    Open,
    /// A translated answer was delivered (JSON, or a stream to its terminal event).
    Translated,
    /// Answered with an error envelope, or a stream that ended in `response.failed`.
    Failed,
}

impl Outcome {
    /// Its name in metadata and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Open => "open",
            Outcome::Translated => "translated",
            Outcome::Failed => "failed",
        }
    }

    /// Its label once the exchange is recorded (metrics, spans): `cut` for one still open,
    /// which the host ended first (client gone, upstream reset, a timeout).
    pub fn recorded(self) -> &'static str {
        match self {
            Outcome::Open => "cut",
            other => other.as_str(),
        }
    }
}

/// What is known about an exchange, for logs and metrics.
#[derive(Debug, Clone)]
pub struct Summary {
    pub operation: Operation,
    pub response_id: Option<String>,
    pub model: Option<String>,
    pub stream: bool,
    pub outcome: Outcome,
    /// The HTTP status answered, once known.
    pub status: Option<u16>,
    /// The error code of a failed exchange.
    pub error_code: Option<Code>,
    /// Token usage, when the upstream reported it.
    pub usage: Option<Usage>,
    /// The model the upstream says answered.
    pub upstream_model: Option<String>,
    /// The upstream's `finish_reason` (`stop`, `length`, `tool_calls`, ...), once it came.
    pub finish_reason: Option<String>,
    /// An automatic compaction, when the request's estimate crossed its threshold.
    pub compaction: Option<Compaction>,
    /// The generation parameters the request set (once it was translated).
    pub params: Params,
    /// A stream has sent output (text, reasoning or a tool call) to the client: set by the
    /// call whose bytes carried the first of it (see [`Exchange::has_output`]).
    pub streamed_output: bool,
}

/// Why a gathered answer is read whole.
#[derive(Debug)]
enum Gather {
    /// A JSON chat completion to translate.
    Json(Box<translate::ResponsePlan>),
    /// A stream answering a client that asked for one JSON object: folded into one.
    Fold(Box<translate::ResponsePlan>),
    /// Not a usable answer: read for a message, then replaced by an error envelope.
    Error {
        status: u16,
        expected_stream: bool,
        /// Envoy answered before the request was forwarded (413 over its buffer limit...):
        /// the upstream never saw it.
        local: bool,
    },
}

/// A body in pieces is gathered into room for its announced length, at most this many times
/// the bytes received so far (Envoy's first piece is ~16 KB: room for 1 MB at once).
const RESERVE_AHEAD: usize = 64;

#[derive(Debug)]
enum State {
    /// The client's body is arriving.
    Request {
        body: BytesMut,
        /// The length the client announced (`content-length`), up to the cap: a body in
        /// pieces is gathered into one buffer of that size instead of one regrown (and copied)
        /// as they come.
        expected: usize,
        /// The decoders of a compressed body (its decoded bytes are theirs until the end).
        decoder: Option<Box<Decoder>>,
    },
    /// The client's body is read elsewhere ([`RequestStep::Work`]); the turn waits for it.
    Working,
    /// An automatic compaction's call is in flight; the turn waits for it.
    Compacting(Box<Compacting>),
    /// Translated and sent; waiting for the answer's head.
    Forwarded(Box<translate::ResponsePlan>),
    Gathering {
        why: Gather,
        body: BytesMut,
    },
    Streaming(Box<StreamTranslator>),
    /// The stream's terminal event was sent: the rest of the upstream body is dropped.
    StreamEnded,
    Done,
}

/// One client request and its answer. See the module docs.
#[derive(Debug)]
pub struct Exchange {
    settings: Arc<Settings>,
    state: State,
    summary: Summary,
    /// The names this client parses (from its headers, the policy and the override).
    reasoning_events: ReasoningEvents,
    /// Why the request's body cannot be read, known from its head (a coding this server does
    /// not decode: see [`request_encoding`]).
    unreadable: Option<ApiError>,
    /// What the answer's head said that an error keeps (see [`Exchange::upstream_headers`]).
    upstream_headers: Vec<KeptHeader>,
    /// The tenant its sealed items are bound to (from its request's headers: [`tenant`]).
    tenant: Tenant,
    /// Its host reads a costly body off its event loop ([`Exchange::offload`]).
    offload: bool,
}

impl Exchange {
    pub fn new(settings: Arc<Settings>, operation: Operation) -> Self {
        let reasoning_events = client::reasoning_events(settings.reasoning_events, |_| None);
        Exchange {
            reasoning_events,
            // Until its headers say: none (so `Missing` when the operator requires one).
            tenant: tenant(&settings, |_| None),
            unreadable: None,
            upstream_headers: Vec::new(),
            offload: false,
            settings,
            state: State::Request {
                body: BytesMut::new(),
                expected: 0,
                decoder: None,
            },
            summary: Summary {
                operation,
                response_id: None,
                model: None,
                stream: false,
                outcome: Outcome::Open,
                status: None,
                error_code: None,
                usage: None,
                upstream_model: None,
                finish_reason: None,
                compaction: None,
                params: Params::default(),
                streamed_output: false,
            },
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The client's request headers (`header` looks one up by lowercase name), read before
    /// its body: they decide the event names it gets (see [`client`]) and how its body is
    /// read (`content-encoding`: decoded here, see [`request_encoding`]).
    pub fn request_head<'h>(&mut self, header: impl Fn(&str) -> Option<&'h str>) {
        self.reasoning_events = client::reasoning_events(self.settings.reasoning_events, &header);
        self.tenant = tenant(&self.settings, &header);
        match request_encoding::codings(header(request_encoding::HEADER)) {
            Ok(codings) if codings.is_empty() => {}
            Ok(codings) => {
                if let State::Request { decoder, .. } = &mut self.state {
                    let limit = self.settings.options.max_request_bytes;
                    *decoder = Some(Box::new(Decoder::new(&codings, limit)));
                }
            }
            Err(refused) => self.unreadable = Some(refused),
        }
    }

    /// The headers of the answer's head (with [`Exchange::response_head`]): an error made
    /// of the answer keeps those a client retries by ([`upstream_failure::kept_headers`]).
    pub fn upstream_headers<'h>(&mut self, headers: impl IntoIterator<Item = (&'h str, &'h str)>) {
        self.upstream_headers = upstream_failure::kept_headers(headers);
    }

    /// The event names this client gets, when the transport knows them already (a WebSocket
    /// connection identifies its client once, at the handshake).
    pub fn set_reasoning_events(&mut self, names: ReasoningEvents) {
        self.reasoning_events = names;
    }

    /// The tenant of its sealed items, when the transport knows it already (a WebSocket
    /// connection's is its handshake's: [`tenant`]).
    pub fn set_tenant(&mut self, tenant: Tenant) {
        self.tenant = tenant;
    }

    /// The translation's options for this exchange: the settings' with its tenant (a copy
    /// only when sealed items are bound to tenants).
    fn options(&self) -> std::borrow::Cow<'_, Options> {
        options_for(&self.settings, &self.tenant)
    }

    /// Its host runs a costly body's reading elsewhere: such a body (compressed, or of
    /// [`COSTLY_BODY_BYTES`] or more) is gathered as it comes and ends in
    /// [`RequestStep::Work`] (a compressed one is then held encoded, up to the cap, until the
    /// work decodes it).
    pub fn offload(&mut self) {
        self.offload = true;
    }

    /// Whether a piece of `len` bytes of the request's body may hold a thread for long: a
    /// compressed body (its decoding may take up to the decoding budget's time), or a piece
    /// of [`COSTLY_BODY_BYTES`] or more. For a host that reads a body whole on its own
    /// threads (the processor's blocking pool).
    pub fn is_costly(&self, len: usize) -> bool {
        len >= COSTLY_BODY_BYTES || self.decodes_request()
    }

    /// What a streamed answer's translation holds of its output so far (see
    /// [`StreamTranslator::output_bytes`]); nothing when it is not streaming.
    pub fn held_output(&self) -> usize {
        match &self.state {
            State::Streaming(translator) => translator.output_bytes(),
            _ => 0,
        }
    }

    pub fn summary(&self) -> &Summary {
        &self.summary
    }

    /// The request's body is decoded as it comes (a `content-encoding`): reading it may cost
    /// up to the decoding budget's time ([`request_encoding`]).
    pub fn decodes_request(&self) -> bool {
        matches!(
            self.state,
            State::Request {
                decoder: Some(_),
                ..
            }
        )
    }

    /// The exchange has given its last bytes.
    pub fn is_finished(&self) -> bool {
        matches!(self.state, State::Done | State::StreamEnded)
    }

    /// Output (text, reasoning or a tool call) has been sent to the client, for streams: the
    /// moment of the first token, as the client sees it, is the first call after which this
    /// is true (also when that call's bytes ended the stream too).
    pub fn has_output(&self) -> bool {
        self.summary.streamed_output
    }

    /// The answer's head has been sent to the client (a stream is open): from now on only
    /// bytes can be added to it.
    pub fn is_streaming(&self) -> bool {
        matches!(self.state, State::Streaming(_))
    }

    /// The client's `content-length`, when it sent one: the size to gather a body in pieces
    /// into (bounded by the request cap and by [`RESERVE_AHEAD`] times the bytes come so far;
    /// a wrong one only costs a regrowth or some spare room).
    pub fn expect_request_bytes(&mut self, length: usize) {
        if let State::Request { expected, .. } = &mut self.state {
            *expected = length.min(self.settings.options.max_request_bytes);
        }
    }

    /// A piece of the client's body; `end` on the last one.
    pub fn request_body(&mut self, chunk: &[u8], end: bool, meta: Meta) -> RequestStep {
        #[cfg(feature = "fault-injection")]
        crate::fault::check(chunk);
        let offload = self.offload;
        let State::Request {
            body,
            expected,
            decoder,
        } = &mut self.state
        else {
            return RequestStep::Reply(self.fail(Fault::BodyAfterRequest.error()));
        };
        if let Some(err) = self.unreadable.take() {
            return RequestStep::Reply(self.fail(err));
        }
        if let Some(d) = decoder.as_mut().filter(|_| !offload) {
            // Decoded as it comes: what is held is the decoded body, bounded by the cap.
            if let Err(err) = d.push(chunk) {
                return RequestStep::Reply(self.fail(err));
            }
            if !end {
                return RequestStep::Hold;
            }
            let Some(d) = decoder.take() else {
                unreachable!("matched above")
            };
            return match d.finish() {
                Ok(decoded) => self.translate_whole(&decoded, meta),
                Err(err) => RequestStep::Reply(self.fail(err)),
            };
        }
        if body.len() + chunk.len() > self.settings.options.max_request_bytes {
            let limit = self.settings.options.max_request_bytes;
            return RequestStep::Reply(self.fail(request_too_large(limit)));
        }
        if !end {
            if body.capacity() - body.len() < chunk.len() {
                // Room for the announced length at once, but never more than a multiple of
                // what has come: a client announcing the cap and sending a byte holds little.
                let held = body.len() + chunk.len();
                let room = (*expected)
                    .min(held.saturating_mul(RESERVE_AHEAD))
                    .max(held);
                body.reserve(room - body.len());
            }
            body.extend_from_slice(chunk);
            return RequestStep::Hold;
        }
        if offload && (decoder.is_some() || body.len() + chunk.len() >= COSTLY_BODY_BYTES) {
            body.extend_from_slice(chunk);
            let work = Work {
                body: std::mem::take(body).freeze(),
                decoder: decoder.take(),
                operation: self.summary.operation,
                settings: Arc::clone(&self.settings),
                tenant: self.tenant.clone(),
                meta,
            };
            self.state = State::Working;
            return RequestStep::Work(Box::new(work));
        }
        // The usual case is one piece: translate it in place, without a copy.
        if body.is_empty() {
            return self.translate_whole(chunk, meta);
        }
        body.extend_from_slice(chunk);
        let whole = std::mem::take(body);
        self.translate_whole(&whole, meta)
    }

    /// The result of [`RequestStep::Work`]'s work: the same steps as the end of
    /// [`Exchange::request_body`].
    pub fn request_worked(&mut self, worked: Worked) -> RequestStep {
        if !matches!(self.state, State::Working) {
            return RequestStep::Reply(self.fail(Fault::WorkOutOfPlace.error()));
        }
        self.planned(worked.planned, worked.meta)
    }

    /// The host could not run [`RequestStep::Work`]'s work (too many at once): a 503 the
    /// client may retry.
    pub fn work_refused(&mut self) -> RequestStep {
        if !matches!(self.state, State::Working) {
            return RequestStep::Reply(self.fail(Fault::WorkOutOfPlace.error()));
        }
        let err = ApiError::server(
            503,
            ErrorCode::ServerIsOverloaded,
            "This server is reading too many large or compressed request bodies at once. \
             Retry shortly.",
        );
        RequestStep::Reply(self.fail(err))
    }

    /// The client's whole body, plain.
    fn translate_whole(&mut self, full: &[u8], meta: Meta) -> RequestStep {
        let planned = plan(full, self.summary.operation, &self.options(), meta);
        self.planned(planned, meta)
    }

    /// What a plain body asks for, carried out: the turn forwarded, or the compaction's call.
    fn planned(&mut self, planned: Planned, meta: Meta) -> RequestStep {
        match (planned.turn, planned.compaction) {
            (Ok(turn), Some(c)) => self.compact(c.request, true, None, meta, turn, c.call),
            (turn, _) => self.forward(turn),
        }
    }

    /// The client's request already read (a `create`): the same rules as
    /// [`Exchange::request_body`] without reading it again. `request_bytes`: about the size of
    /// what was read. `whole`: the request written out, when it asks for automatic compaction
    /// (the summarising request and the compacted turn read it again). `continues`: the
    /// response whose context the caller put at the head of `input` (echoed as
    /// `previous_response_id`).
    pub(crate) fn request_read(
        &mut self,
        req: translate::Obj<'_, '_>,
        request_bytes: usize,
        whole: Option<Bytes>,
        continues: Option<String>,
        meta: Meta,
    ) -> RequestStep {
        if !matches!(self.state, State::Request { .. })
            || self.summary.operation != Operation::Create
        {
            return RequestStep::Reply(self.fail(Fault::ObjectOutOfPlace.error()));
        }
        let options = self.options();
        let translated = translate::request::translate_read(req, request_bytes, &options, meta);
        match (translated, whole) {
            (Ok(turn), Some(body)) if turn.compaction_due.is_some() => {
                let summarising = summarise(&body, false, &options, meta);
                drop(options);
                self.compact(body, false, continues, meta, turn, summarising)
            }
            (Ok(turn), None) if turn.compaction_due.is_some() => {
                drop(options);
                RequestStep::Reply(self.fail(Fault::ObjectOutOfPlace.error()))
            }
            (other, _) => {
                drop(options);
                self.forward(other.map(|mut t| {
                    t.plan.echo.previous_response_id = continues;
                    t
                }))
            }
        }
    }

    /// The turn's estimate crossed its `compact_threshold`: its summarising request is the
    /// call to make first, and the turn waits in [`State::Compacting`].
    fn compact(
        &mut self,
        request: Bytes,
        capped: bool,
        continues: Option<String>,
        meta: Meta,
        turn: translate::request::Translated,
        summarising: Result<translate::request::Translated, ApiError>,
    ) -> RequestStep {
        let summarising = match summarising {
            Ok(s) => s,
            Err(err) => return RequestStep::Reply(self.fail(err)),
        };
        let plan = &turn.plan;
        self.summary.response_id = Some(plan.id().to_owned());
        self.summary.model = Some(plan.model().to_owned());
        self.summary.stream = plan.is_stream();
        self.summary.params = plan.params();
        let due = turn.compaction_due.unwrap_or(translate::request::Due {
            estimate: 0,
            threshold: 0,
        });
        self.summary.compaction = Some(Compaction {
            outcome: CompactionOutcome::Running,
            estimate: due.estimate,
            threshold: due.threshold,
            usage: None,
        });
        let model = plan.model().to_owned();
        let up = UpstreamRequest {
            body: summarising.body,
            chat_model: summarising.chat_model.unwrap_or_else(|| model.clone()),
            model,
            stream: false,
        };
        self.state = State::Compacting(Box::new(Compacting {
            request,
            capped,
            meta,
            continues,
            answer: None,
        }));
        RequestStep::Call(up)
    }

    /// The head of the answer to [`RequestStep::Call`]'s call (`status`, `content_type`; an
    /// error made of it keeps the headers [`Exchange::upstream_headers`] was given).
    pub fn call_head(&mut self, status: u16, content_type: &str) -> RequestStep {
        let State::Compacting(c) = &mut self.state else {
            return RequestStep::Reply(self.fail(Fault::CallOutOfPlace.error()));
        };
        if c.answer.is_some() {
            return RequestStep::Reply(self.fail(Fault::CallOutOfPlace.error()));
        }
        let content_type = content_type.trim_start();
        c.answer = Some(CallAnswer {
            status,
            json: starts_with_ignore_case(content_type, JSON) || content_type.is_empty(),
            body: BytesMut::new(),
        });
        RequestStep::Hold
    }

    /// A piece of the call's answer body; `end` with the last: then the turn goes upstream
    /// ([`RequestStep::Forward`]), or the exchange ends with the call's error.
    pub fn call_body(&mut self, chunk: &[u8], end: bool, now: u64) -> RequestStep {
        let max = self.settings.max_body_bytes;
        let State::Compacting(c) = &mut self.state else {
            return RequestStep::Reply(self.fail(Fault::CallOutOfPlace.error()));
        };
        let Some(answer) = &mut c.answer else {
            return RequestStep::Reply(self.fail(Fault::CallOutOfPlace.error()));
        };
        if answer.body.len() + chunk.len() > max {
            let err = ApiError::server(
                502,
                ErrorCode::UpstreamResponseTooLarge,
                format!("the upstream's answer to the summarising request is larger than this server reads (--max-body-bytes, {max} bytes)."),
            );
            return RequestStep::Reply(self.compaction_failed(err));
        }
        answer.body.extend_from_slice(chunk);
        if !end {
            return RequestStep::Hold;
        }
        let State::Compacting(c) = std::mem::replace(&mut self.state, State::Done) else {
            unreachable!("matched above")
        };
        self.compacted(*c, now)
    }

    /// The call brought no whole answer: no answer, not all of it, or none before its
    /// deadline (`compaction_timeout`).
    pub fn call_failed(&mut self, why: CallFailure<'_>) -> RequestStep {
        if !matches!(self.state, State::Compacting(_)) {
            return RequestStep::Reply(self.fail(Fault::CallOutOfPlace.error()));
        }
        let err = match why {
            CallFailure::TimedOut => ApiError::server(
                504,
                ErrorCode::UpstreamTimeout,
                format!(
                    "the summarising request took longer than this server waits (compaction_timeout, {} s).",
                    self.settings.compaction_timeout.as_secs()
                ),
            ),
            why => ApiError::server(
                503,
                ErrorCode::UpstreamUnavailable,
                format!("the summarising request failed: {}", why.message()),
            ),
        };
        RequestStep::Reply(self.compaction_failed(err))
    }

    /// The call's whole answer: its summary sealed, the turn translated again on the compacted
    /// window; or the exchange's error.
    fn compacted(&mut self, c: Compacting, _now: u64) -> RequestStep {
        let Some(answer) = c.answer else {
            return RequestStep::Reply(self.fail(Fault::CallOutOfPlace.error()));
        };
        if !(200..300).contains(&answer.status) {
            let err = upstream_failure::classify(answer.status, &answer.body);
            let mut reply = self.compaction_failed(err);
            reply.headers = std::mem::take(&mut self.upstream_headers);
            return RequestStep::Reply(reply);
        }
        if !answer.json {
            let err = ApiError::server(
                502,
                ErrorCode::UpstreamInvalidResponse,
                "the upstream's answer to the summarising request is not JSON.",
            );
            return RequestStep::Reply(self.compaction_failed(err));
        }
        let summarised = match compact::summarised(&answer.body) {
            Ok(s) => s,
            Err(err) => return RequestStep::Reply(self.compaction_failed(err)),
        };
        let options = self.options();
        let options = options.as_ref();
        let Some(item) = compact::seal_lead(options, c.meta, &summarised.summary) else {
            let err = ApiError::server(
                500,
                ErrorCode::InternalError,
                "The exchange could not be completed: no keys to seal the compaction.",
            );
            return RequestStep::Reply(self.compaction_failed(err));
        };
        let blob = item.encrypted_content.clone();
        let turn = translate::request::translate_window(
            &c.request,
            c.capped,
            options,
            c.meta,
            Window::Compacted(blob),
        );
        if let Some(report) = &mut self.summary.compaction {
            report.outcome = CompactionOutcome::Compacted;
            report.usage = summarised.usage;
        }
        self.forward(turn.map(|mut t| {
            t.plan.set_lead(item, summarised.usage);
            t.plan.echo.previous_response_id = c.continues;
            t
        }))
    }

    /// The compaction failed: the exchange ends with `err`, its message naming the step.
    fn compaction_failed(&mut self, mut err: ApiError) -> ErrorReply {
        if let Some(report) = &mut self.summary.compaction {
            report.outcome = CompactionOutcome::Failed;
        }
        err.message = format!(
            "Compacting the input before this turn (context_management) failed: {}",
            err.message
        );
        self.fail(err)
    }

    fn forward(
        &mut self,
        translated: Result<translate::request::Translated, ApiError>,
    ) -> RequestStep {
        match translated {
            Ok(mut t) => {
                t.plan.options.reasoning_events = self.reasoning_events;
                self.summary.response_id = Some(t.plan.id().to_owned());
                self.summary.model = Some(t.plan.model().to_owned());
                self.summary.stream = t.plan.is_stream();
                self.summary.params = t.plan.params();
                let model = t.plan.model().to_owned();
                let up = UpstreamRequest {
                    body: t.body,
                    chat_model: t.chat_model.unwrap_or_else(|| model.clone()),
                    model,
                    stream: t.plan.is_stream(),
                };
                self.state = State::Forwarded(Box::new(t.plan));
                RequestStep::Forward(up)
            }
            Err(err) => RequestStep::Reply(self.fail(err)),
        }
    }

    /// The head of the answer: decides what happens to its body.
    pub fn response_head(&mut self, head: ResponseHead<'_>, now: u64) -> HeadStep {
        let success = (200..300).contains(&head.status);
        let content_type = head.content_type.trim_start();
        let is_sse = starts_with_ignore_case(content_type, EVENT_STREAM);
        let is_json = starts_with_ignore_case(content_type, JSON);
        let why = match std::mem::replace(&mut self.state, State::Done) {
            State::Forwarded(ex) if success && ex.is_stream() && is_sse => {
                let mut translator = Box::new(StreamTranslator::new(*ex));
                if head.end_of_stream {
                    // A stream with no body at all: the whole (failed) event stream now.
                    let body = translator.finish(now);
                    return HeadStep::Reply(self.finish_stream(&translator, body));
                }
                self.state = State::Streaming(translator);
                return HeadStep::Stream;
            }
            // A compaction is sealed whole from one JSON answer; a stream is not folded for it.
            State::Forwarded(ex) if success && !ex.is_stream() && !ex.is_compact() && is_sse => {
                Gather::Fold(ex)
            }
            // JSON is what Chat servers send; some omit the content type.
            State::Forwarded(ex)
                if success && !ex.is_stream() && (is_json || content_type.is_empty()) =>
            {
                Gather::Json(ex)
            }
            State::Forwarded(ex) => Gather::Error {
                status: head.status,
                expected_stream: ex.is_stream(),
                local: false,
            },
            // Envoy answered before the request was forwarded: never translate what the
            // upstream did not send.
            State::Request { .. } | State::Working | State::Compacting(_) => Gather::Error {
                status: head.status,
                expected_stream: false,
                local: true,
            },
            // A second head while gathering: Envoy replaced the upstream's answer with its
            // own reply (a timeout, a reset).
            State::Gathering { why, .. } => Gather::Error {
                status: head.status,
                expected_stream: matches!(
                    why,
                    Gather::Error {
                        expected_stream: true,
                        ..
                    }
                ),
                local: matches!(why, Gather::Error { local: true, .. }),
            },
            // The client already has a head: fail (a transport resets the stream).
            State::Streaming(_) => {
                return HeadStep::Reply(Reply::Error(self.fail(Fault::SecondHead.error())));
            }
            State::Done | State::StreamEnded => {
                return HeadStep::Reply(Reply::Error(self.fail(Fault::AfterEnd.error())))
            }
        };
        if head.end_of_stream {
            return HeadStep::Reply(self.gathered(why, &[], now));
        }
        self.state = State::Gathering {
            why,
            body: BytesMut::new(),
        };
        HeadStep::Gather
    }

    /// A piece of the answer's body; `end` on the last one.
    pub fn response_body(&mut self, chunk: &[u8], end: bool, now: u64) -> BodyStep {
        #[cfg(feature = "fault-injection")]
        crate::fault::check(chunk);
        match &mut self.state {
            State::Streaming(translator) => {
                let mut out = translator.push(chunk, now);
                if end {
                    let last = translator.finish(now);
                    out = out.concat(last);
                }
                self.summary.streamed_output |= translator.has_output();
                if translator.is_done() {
                    let State::Streaming(translator) =
                        std::mem::replace(&mut self.state, State::StreamEnded)
                    else {
                        unreachable!("matched above")
                    };
                    self.note_stream_end(&translator);
                }
                BodyStep::Send(out)
            }
            State::Gathering { body, .. } => {
                if body.len() + chunk.len() > self.settings.max_body_bytes {
                    return BodyStep::Reply(Reply::Error(self.response_overflow()));
                }
                if end && body.is_empty() {
                    // The usual case: the whole answer in one piece; no copy.
                    let State::Gathering { why, .. } =
                        std::mem::replace(&mut self.state, State::Done)
                    else {
                        unreachable!("matched above")
                    };
                    return BodyStep::Reply(self.gathered(why, chunk, now));
                }
                body.extend_from_slice(chunk);
                if !end {
                    return BodyStep::Hold;
                }
                let State::Gathering { why, body } =
                    std::mem::replace(&mut self.state, State::Done)
                else {
                    unreachable!("matched above")
                };
                BodyStep::Reply(self.gathered(why, &body, now))
            }
            // The upstream goes on after its terminal event (or after a cap ended the
            // stream): dropped, the client's stream is complete.
            State::StreamEnded => BodyStep::Send(Events::default()),
            _ => BodyStep::Reply(Reply::Error(self.fail(Fault::BodyWithoutHead.error()))),
        }
    }

    /// The transport cannot hold more of a gathered answer (or it is over our cap).
    pub fn response_overflow(&mut self) -> ErrorReply {
        let err = ApiError::server(
            502,
            ErrorCode::UpstreamResponseTooLarge,
            format!(
                "The upstream answer is larger than this server translates (--max-body-bytes, {} bytes).",
                self.settings.max_body_bytes
            ),
        );
        self.fail(err)
    }

    /// The transport could not take in a message of this exchange (over its size limit):
    /// the request body while it is arriving, else the answer. What can still be sent.
    pub fn overflow(&mut self, now: u64) -> AbortStep {
        match &self.state {
            State::Request { .. } => {
                let limit = self.settings.options.max_request_bytes;
                AbortStep::Reply(self.fail(request_too_large(limit)))
            }
            State::Working
            | State::Compacting(_)
            | State::Forwarded(_)
            | State::Gathering { .. } => AbortStep::Reply(self.response_overflow()),
            State::Streaming(_) => self.abort(
                ErrorCode::ResponseTooLarge,
                "The upstream sent more at once than this server reads.",
                now,
            ),
            State::Done | State::StreamEnded => AbortStep::Nothing,
        }
    }

    /// The transport failed (an internal error, a message it could not read): what can still
    /// be sent so that the client gets an OpenResponses ending.
    pub fn abort(&mut self, code: ErrorCode, message: &str, now: u64) -> AbortStep {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Done | State::StreamEnded => AbortStep::Nothing,
            State::Streaming(mut translator) => {
                let out = translator.abort(code, message, now);
                self.note_stream_end(&translator);
                AbortStep::Send(out)
            }
            _ => AbortStep::Reply(self.fail(ApiError::server(500, code, message))),
        }
    }

    /// Ends the exchange with an error envelope.
    fn fail(&mut self, err: ApiError) -> ErrorReply {
        self.state = State::Done;
        self.summary.outcome = Outcome::Failed;
        self.summary.status = Some(err.status);
        self.summary.error_code = err.code.clone();
        ErrorReply::new(err)
    }

    /// The whole answer is here: translate it, or make its error envelope.
    fn gathered(&mut self, why: Gather, body: &[u8], now: u64) -> Reply {
        self.state = State::Done;
        match why {
            Gather::Json(ex) if ex.is_compact() => match compact::answer(&ex, body) {
                Ok(out) => {
                    self.summary.usage = out.usage;
                    self.summary.upstream_model = out.upstream_model;
                    self.summary.finish_reason = out.finish_reason;
                    self.translated(200, out.body)
                }
                Err(err) => Reply::Error(self.fail(err)),
            },
            Gather::Json(ex) => match response::translate_completion(&ex, body, now) {
                Ok(out) => {
                    self.summary.usage = out.usage;
                    self.summary.upstream_model = out.upstream_model;
                    self.summary.finish_reason = out.finish_reason;
                    self.translated(200, out.body)
                }
                Err(err) => Reply::Error(self.fail(err)),
            },
            Gather::Fold(ex) => {
                let mut translator = StreamTranslator::new(*ex);
                translator.push(body, now);
                translator.finish(now);
                let Some(folded) = translator.final_response() else {
                    return Reply::Error(self.fail(Fault::UnendedFold.error()));
                };
                self.summary.usage = folded.report.usage;
                self.summary.upstream_model = folded.report.upstream_model;
                self.summary.finish_reason = folded.report.finish_reason;
                match folded.report.error {
                    None => self.translated(200, folded.body),
                    Some(e) => {
                        let status = upstream_failure::folded_status(&e.code);
                        Reply::Error(self.fail(ApiError::server(status, e.code, e.message)))
                    }
                }
            }
            Gather::Error {
                status,
                expected_stream,
                local,
            } => {
                let error = error_for(status, expected_stream, local, body);
                let mut reply = self.fail(error);
                reply.headers = std::mem::take(&mut self.upstream_headers);
                Reply::Error(reply)
            }
        }
    }

    fn translated(&mut self, status: u16, body: Bytes) -> Reply {
        self.summary.outcome = Outcome::Translated;
        self.summary.status = Some(status);
        Reply::Answer(Answer {
            status,
            body: Body::Json(body),
        })
    }

    /// A stream that ends at once (no body): its events as one reply.
    fn finish_stream(&mut self, translator: &StreamTranslator, events: Events) -> Reply {
        self.note_stream_end(translator);
        Reply::Answer(Answer {
            status: 200,
            body: Body::Events(events),
        })
    }

    fn note_stream_end(&mut self, translator: &StreamTranslator) {
        let report = translator.report();
        self.summary.status = Some(200);
        self.summary.usage = report.usage;
        self.summary.upstream_model = report.upstream_model;
        self.summary.finish_reason = report.finish_reason;
        match report.error {
            Some(e) => {
                self.summary.outcome = Outcome::Failed;
                self.summary.error_code = Some(e.code);
            }
            None => self.summary.outcome = Outcome::Translated,
        }
    }
}

fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

fn request_too_large(limit: usize) -> ApiError {
    ApiError::invalid_body(format!(
        "The request body is larger than this server accepts (--max-request-bytes, {limit} bytes)."
    ))
    .with_status(413)
    .with_code(ErrorCode::RequestTooLarge)
}

/// The error envelope for an answer we cannot translate. `local`: Envoy answered before the
/// request was forwarded.
fn error_for(status: u16, expected_stream: bool, local: bool, body: &[u8]) -> ApiError {
    if local {
        local_reply_error(status, body)
    } else if (200..300).contains(&status) {
        unusable_answer(expected_stream)
    } else {
        upstream_failure::classify(status, body)
    }
}

/// A success the exchange cannot translate: not the content type it asked for.
fn unusable_answer(expected_stream: bool) -> ApiError {
    let what = if expected_stream {
        "a stream was requested but the upstream did not answer with text/event-stream"
    } else {
        "a JSON answer was expected but the upstream answered with another content type"
    };
    ApiError::server(
        502,
        ErrorCode::UpstreamInvalidResponse,
        format!("The upstream answer cannot be translated: {what}."),
    )
}

/// Envoy's own reply to a request it never forwarded (413 when the body is over its buffer
/// limit, ...). Why not `upstream_failure::classify` alone: its message says "The upstream
/// answered", which sends the client (and the operator) to look at a model server that never
/// saw the request. The status and code are kept.
fn local_reply_error(status: u16, body: &[u8]) -> ApiError {
    if status == 413 {
        return ApiError::invalid_body(
            "The request body is larger than the proxy buffers (Envoy's per_connection_buffer_limit_bytes).",
        )
        .with_status(413)
        .with_code(ErrorCode::RequestTooLarge);
    }
    let mut err = upstream_failure::classify(status, body);
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    err.message = if text.is_empty() || text.len() > 512 {
        format!("Envoy answered with HTTP status {status} before the request was forwarded.")
    } else {
        format!("Envoy answered with HTTP status {status} before the request was forwarded: {text}")
    };
    err
}

#[cfg(test)]
mod tests {
    //! The rules with plain bytes: no Envoy, no gRPC.
    use super::*;
    use serde_json::{json, Value};

    const META: Meta = Meta {
        now: 1_700_000_000,
        id_seed: 7,
    };

    fn settings(max_request: usize, max_body: usize) -> Arc<Settings> {
        Arc::new(Settings {
            max_body_bytes: max_body,
            options: Options {
                max_request_bytes: max_request,
                ..Options::default()
            },
            ..Settings::default()
        })
    }

    fn forwarded(body: Value) -> Exchange {
        let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
        match ex.request_body(body.to_string().as_bytes(), true, META) {
            RequestStep::Forward(_) => ex,
            other => panic!("not forwarded: {other:?}"),
        }
    }

    /// The room gathered for a body in pieces after its first piece.
    fn room_after_first_piece(announced: usize, first: usize) -> usize {
        let mut ex = Exchange::new(settings(16 << 20, 1 << 20), Operation::Create);
        ex.expect_request_bytes(announced);
        let piece = vec![b' '; first];
        assert!(matches!(
            ex.request_body(&piece, false, META),
            RequestStep::Hold
        ));
        match &ex.state {
            State::Request { body, .. } => body.capacity(),
            _ => unreachable!("still reading the request"),
        }
    }

    #[test]
    fn a_body_in_pieces_gets_room_for_its_length_but_not_for_a_length_it_only_announced() {
        // A 400 KB turn whose first piece is Envoy's 16 KB: room for all of it at once.
        assert!(room_after_first_piece(400_000, 16_384) >= 400_000);
        // The cap announced, one byte sent: room for a few bytes, not for 16 MiB.
        assert!(room_after_first_piece(16 << 20, 1) < 4096);
        // Over the cap: bounded by the cap, then by what came.
        assert!(room_after_first_piece(usize::MAX, 16_384) <= 2 * RESERVE_AHEAD * 16_384);
        // No length: the piece itself.
        assert!(room_after_first_piece(0, 100) >= 100);
    }

    fn head(status: u16, content_type: &str) -> ResponseHead<'_> {
        ResponseHead {
            status,
            content_type,
            end_of_stream: false,
        }
    }

    fn error(r: &Reply) -> &ErrorReply {
        match r {
            Reply::Error(e) => e,
            Reply::Answer(a) => panic!("not an envelope: {a:?}"),
        }
    }

    fn envelope(r: &ErrorReply) -> Value {
        assert_eq!(r.content_type(), JSON);
        assert_eq!(r.status(), r.error.status);
        serde_json::from_slice::<Value>(&r.body).unwrap()["error"].clone()
    }

    #[test]
    fn a_compressed_body_is_decoded_and_an_unknown_coding_is_a_415() {
        let body = json!({"model": "m", "input": "hi"}).to_string();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, body.as_bytes()).unwrap();
        let gz = gz.finish().unwrap();
        let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
        ex.request_head(|name| (name == "content-encoding").then_some("gzip"));
        let (a, b) = gz.split_at(gz.len() / 2);
        assert!(matches!(ex.request_body(a, false, META), RequestStep::Hold));
        let RequestStep::Forward(up) = ex.request_body(b, true, META) else {
            panic!("not forwarded");
        };
        let chat: Value = serde_json::from_slice(&up.body).unwrap();
        assert_eq!(chat["messages"][0]["content"], "hi");
        // A decoded body over the cap is refused as a plain one is.
        let mut ex = Exchange::new(settings(20, 1 << 20), Operation::Create);
        ex.request_head(|name| (name == "content-encoding").then_some("gzip"));
        let RequestStep::Reply(r) = ex.request_body(&gz, true, META) else {
            panic!("not refused");
        };
        assert_eq!(
            (r.status(), envelope(&r)["code"].as_str()),
            (413, Some("request_too_large"))
        );

        let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
        ex.request_head(|name| (name == "content-encoding").then_some("compress"));
        let RequestStep::Reply(r) = ex.request_body(b"x\x9c", false, META) else {
            panic!("not refused");
        };
        assert_eq!(r.status(), 415);
        assert_eq!(envelope(&r)["code"], "unsupported_content_encoding");
        assert!(envelope(&r)["message"]
            .as_str()
            .unwrap()
            .contains("'compress'"));
        assert_eq!(ex.summary().outcome, Outcome::Failed);
        // Never encoded: read as usual.
        for encoding in [None, Some("identity")] {
            let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
            ex.request_head(|name| encoding.filter(|_| name == "content-encoding"));
            assert!(matches!(
                ex.request_body(body.as_bytes(), true, META),
                RequestStep::Forward(_)
            ));
        }
    }

    #[test]
    fn an_upstream_error_keeps_the_headers_a_client_retries_by() {
        let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
        ex.upstream_headers([
            ("retry-after", "7"),
            ("x-ratelimit-remaining-requests", "0"),
            ("content-length", "60"),
        ]);
        ex.response_head(head(429, "application/json"), 1);
        let BodyStep::Reply(Reply::Error(r)) = ex.response_body(
            br#"{"object":"error","message":"slow down","type":"RateLimitError","code":429}"#,
            true,
            1,
        ) else {
            panic!("no reply");
        };
        assert_eq!(r.status(), 429);
        assert_eq!(envelope(&r)["code"], "rate_limit_exceeded");
        assert_eq!(envelope(&r)["message"], "slow down");
        assert_eq!(
            r.headers,
            [
                KeptHeader::new("retry-after", "7"),
                KeptHeader::new("x-ratelimit-remaining-requests", "0")
            ]
        );
        assert_eq!(
            ex.summary().error_code,
            Some(ErrorCode::RateLimitExceeded.into())
        );
    }

    #[test]
    fn a_context_overflow_is_400_before_a_stream_and_inside_one() {
        let overflow = r#"{"error":{"code":400,"message":"request (9 tokens) exceeds the available context size (8 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9,"n_ctx":8}}"#;
        let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": true}));
        ex.response_head(head(400, "application/json"), 1);
        let BodyStep::Reply(Reply::Error(r)) = ex.response_body(overflow.as_bytes(), true, 1)
        else {
            panic!("no reply");
        };
        assert_eq!(r.status(), 400);
        let e = envelope(&r);
        assert_eq!(
            (&e["code"], &e["param"]),
            (&json!("context_length_exceeded"), &json!("input"))
        );
        assert_eq!((&e["n_prompt_tokens"], &e["n_ctx"]), (&json!(9), &json!(8)));
        // The same error inside a stream folded for a JSON client: the request's fault, 400.
        let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
        ex.response_head(head(200, "text/event-stream"), 1);
        let frame = format!("data: {overflow}\n\n");
        let BodyStep::Reply(Reply::Error(r)) = ex.response_body(frame.as_bytes(), true, 1) else {
            panic!("no reply");
        };
        assert_eq!(
            (r.status(), envelope(&r)["code"].as_str()),
            (400, Some("context_length_exceeded"))
        );
    }

    const CHUNK: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
    const END: &str =
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

    #[test]
    fn routes_only_posts_to_the_responses_path() {
        let s = Settings::default();
        assert_eq!(route(&s, "POST", "/v1/responses"), Some(Operation::Create));
        assert_eq!(
            route(&s, "POST", "/v1/responses?x=1"),
            Some(Operation::Create)
        );
        assert_eq!(route(&s, "GET", "/v1/responses"), None);
        assert_eq!(route(&s, "POST", "/v1/responses/x"), None);
        assert_eq!(
            route(&s, "POST", "/v1/responses/compact"),
            Some(Operation::Compact)
        );
        assert_eq!(
            route(&s, "POST", "/v1/responses/compact?a=b"),
            Some(Operation::Compact)
        );
        assert_eq!(route(&s, "GET", "/v1/responses/compact"), None);
        assert_eq!(route(&s, "POST", "/v1/responses/compact/x"), None);
        assert_eq!(route(&s, "POST", "/v1/responsescompact"), None);
        assert_eq!(route(&s, "POST", "/v1/chat/completions"), None);
    }

    #[test]
    fn request_in_pieces_is_translated_once_whole() {
        let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
        let body = json!({"model": "m", "input": "hi"}).to_string();
        let (a, b) = body.as_bytes().split_at(5);
        assert!(matches!(ex.request_body(a, false, META), RequestStep::Hold));
        let RequestStep::Forward(up) = ex.request_body(b, true, META) else {
            panic!("not forwarded");
        };
        let chat: Value = serde_json::from_slice(&up.body).unwrap();
        assert_eq!(chat["messages"][0]["content"], "hi");
        assert_eq!((up.model.as_str(), up.stream), ("m", false));
        assert_eq!(
            ex.summary().response_id.as_deref(),
            Some("resp_00000000000000000000000000000007")
        );
    }

    #[test]
    fn request_caps_hold_on_both_sides() {
        let body = json!({"model": "m", "input": "x".repeat(100)}).to_string();
        let fits = Exchange::new(settings(body.len(), 1), Operation::Create).request_body(
            body.as_bytes(),
            true,
            META,
        );
        assert!(matches!(fits, RequestStep::Forward(_)));
        let mut ex = Exchange::new(settings(body.len() - 1, 1), Operation::Create);
        let RequestStep::Reply(r) = ex.request_body(body.as_bytes(), true, META) else {
            panic!("over the cap");
        };
        assert_eq!(r.status(), 413);
        assert_eq!(envelope(&r)["code"], "request_too_large");
        assert!(ex.is_finished());
        // Also when it arrives in pieces: refused as soon as the pieces exceed the cap.
        let mut ex = Exchange::new(settings(10, 1), Operation::Create);
        assert!(matches!(
            ex.request_body(b"{\"model\":", false, META),
            RequestStep::Hold
        ));
        assert!(matches!(
            ex.request_body(b"\"m\"", false, META),
            RequestStep::Reply(_)
        ));
        // No body at all.
        let mut ex = Exchange::new(settings(10, 1), Operation::Create);
        let RequestStep::Reply(r) = ex.request_body(b"", true, META) else {
            panic!("no body");
        };
        assert_eq!(envelope(&r)["code"], "missing_body");
    }

    #[test]
    fn json_answer_is_gathered_then_translated() {
        let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
        assert!(matches!(
            ex.response_head(head(200, "application/json; charset=utf-8"), 1),
            HeadStep::Gather
        ));
        let body = json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "yo"}}]})
            .to_string();
        let (a, b) = body.as_bytes().split_at(10);
        assert!(matches!(ex.response_body(a, false, 1), BodyStep::Hold));
        let BodyStep::Reply(r) = ex.response_body(b, true, 1) else {
            panic!("no reply");
        };
        let Reply::Answer(r) = r else {
            panic!("not translated: {r:?}");
        };
        let v: Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["output"][0]["content"][0]["text"], "yo");
        assert_eq!(ex.summary().outcome, Outcome::Translated);
        assert_eq!(ex.summary().finish_reason.as_deref(), Some("stop"));
    }

    #[test]
    fn the_summary_has_the_parameters_set_and_the_finish_reason() {
        let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": true,
            "temperature": 0.25, "max_output_tokens": 64}));
        assert_eq!(
            ex.summary().params,
            Params {
                temperature: Some(0.25),
                max_output_tokens: Some(64),
                ..Params::default()
            },
            "only what the request set"
        );
        assert_eq!(ex.summary().finish_reason, None);
        ex.response_head(head(200, "text/event-stream"), 1);
        assert!(!ex.has_output());
        ex.response_body(CHUNK.as_bytes(), false, 1);
        assert!(ex.has_output(), "the first output went with this call");
        assert_eq!(
            ex.summary().finish_reason,
            None,
            "not before the stream ends"
        );
        let length =
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n";
        ex.response_body(length.as_bytes(), true, 1);
        assert_eq!(ex.summary().finish_reason.as_deref(), Some("length"));
        // The first output and the end in one call: the output is still reported.
        let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": true}));
        ex.response_head(head(200, "text/event-stream"), 1);
        ex.response_body(format!("{CHUNK}{END}").as_bytes(), true, 1);
        assert!(ex.is_finished() && ex.has_output());
        // Folded for a JSON request: nothing was streamed.
        let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
        ex.response_head(head(200, "text/event-stream"), 1);
        ex.response_body(format!("{CHUNK}{END}").as_bytes(), true, 1);
        assert!(!ex.has_output());
        let ex = forwarded(json!({"model": "m", "input": "hi", "top_p": 0.5,
            "presence_penalty": -1, "frequency_penalty": 1.5}));
        assert_eq!(
            ex.summary().params,
            Params {
                top_p: Some(0.5),
                presence_penalty: Some(-1.0),
                frequency_penalty: Some(1.5),
                ..Params::default()
            }
        );
    }

    #[test]
    fn gathered_answers_over_the_cap_are_502() {
        let mut ex = Exchange::new(settings(1 << 20, 16), Operation::Create);
        ex.request_body(br#"{"model":"m","input":"hi"}"#, true, META);
        ex.response_head(head(200, "application/json"), 1);
        assert!(matches!(
            ex.response_body(&[b' '; 16], false, 1),
            BodyStep::Hold
        ));
        let BodyStep::Reply(r) = ex.response_body(b" ", true, 1) else {
            panic!("over the cap");
        };
        assert_eq!(r.status(), 502);
        assert_eq!(envelope(error(&r))["code"], "upstream_response_too_large");
        // The transport's own limit says the same.
        let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
        ex.response_head(head(200, "application/json"), 1);
        assert_eq!(ex.response_overflow().status(), 502);
    }

    #[test]
    fn stream_answer_is_translated_as_it_comes_and_the_rest_dropped() {
        let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": true}));
        assert!(matches!(
            ex.response_head(head(200, "text/event-stream"), 1),
            HeadStep::Stream
        ));
        assert!(ex.is_streaming());
        let BodyStep::Send(out) = ex.response_body(CHUNK.as_bytes(), false, 1) else {
            panic!("not sent");
        };
        let out = String::from_utf8(out.to_vec()).unwrap();
        assert!(out.starts_with("event: response.created\n") && out.contains("\"delta\":\"Hi\""));
        let BodyStep::Send(out) = ex.response_body(END.as_bytes(), false, 1) else {
            panic!("not sent");
        };
        assert!(String::from_utf8(out.to_vec())
            .unwrap()
            .ends_with("data: [DONE]\n\n"));
        assert!(ex.is_finished());
        // The upstream goes on after [DONE]: nothing more reaches the client.
        let BodyStep::Send(out) = ex.response_body(CHUNK.as_bytes(), true, 1) else {
            panic!("not answered");
        };
        assert!(out.is_empty());
    }

    #[test]
    fn stream_answering_a_json_request_is_folded() {
        let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
        assert!(matches!(
            ex.response_head(head(200, "text/event-stream"), 1),
            HeadStep::Gather
        ));
        ex.response_body(CHUNK.as_bytes(), false, 1);
        let BodyStep::Reply(r) = ex.response_body(END.as_bytes(), true, 1) else {
            panic!("no reply");
        };
        let v: Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(
            (v["object"].as_str(), v["status"].as_str()),
            (Some("response"), Some("completed"))
        );
        assert_eq!(v["output"][0]["content"][0]["text"], "Hi");
        // Cut short: an envelope with the stream's code, not half an answer.
        let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
        ex.response_head(head(200, "text/event-stream"), 1);
        let BodyStep::Reply(r) = ex.response_body(CHUNK.as_bytes(), true, 1) else {
            panic!("no reply");
        };
        assert_eq!(
            (r.status(), envelope(error(&r))["code"].as_str()),
            (502, Some("upstream_stream_truncated"))
        );
    }

    #[test]
    fn unusable_answers_become_envelopes() {
        for (stream, status, content_type, code) in [
            (true, 200, "application/json", "upstream_invalid_response"),
            (false, 200, "text/html", "upstream_invalid_response"),
            (false, 429, "application/json", "rate_limit_exceeded"),
            (true, 503, "text/plain", "upstream_unavailable"),
        ] {
            let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": stream}));
            assert!(matches!(
                ex.response_head(head(status, content_type), 1),
                HeadStep::Gather
            ));
            let BodyStep::Reply(r) = ex.response_body(b"nope", true, 1) else {
                panic!("no reply");
            };
            assert_eq!(envelope(error(&r))["code"], code, "{status} {content_type}");
            assert_eq!(ex.summary().outcome, Outcome::Failed);
        }
    }

    #[test]
    fn envoys_reply_before_forwarding_is_never_translated() {
        let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
        ex.request_body(b"{", false, META);
        assert!(matches!(
            ex.response_head(head(413, "text/plain"), 1),
            HeadStep::Gather
        ));
        let BodyStep::Reply(r) = ex.response_body(b"Payload Too Large", true, 1) else {
            panic!("no reply");
        };
        let e = envelope(error(&r));
        assert_eq!(
            (r.status(), e["code"].as_str()),
            (413, Some("request_too_large"))
        );
        assert!(!e["message"].as_str().unwrap().contains("upstream"), "{e}");
    }

    #[test]
    fn out_of_order_calls_fail_closed() {
        // A body before any head.
        let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
        assert!(
            matches!(ex.response_body(b"raw", true, 1), BodyStep::Reply(r) if r.status() == 500)
        );
        // A second head once a stream is open.
        let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": true}));
        ex.response_head(head(200, "text/event-stream"), 1);
        assert!(matches!(
            ex.response_head(head(200, "text/event-stream"), 1),
            HeadStep::Reply(_)
        ));
        // A request body after forwarding.
        let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
        assert!(matches!(
            ex.request_body(b"{}", true, META),
            RequestStep::Reply(_)
        ));
    }

    #[test]
    fn transport_failures_end_with_what_can_still_be_sent() {
        // Before any answer: an envelope.
        let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
        assert!(matches!(ex.overflow(1), AbortStep::Reply(r) if r.status() == 413));
        let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
        assert!(matches!(ex.overflow(1), AbortStep::Reply(r) if r.status() == 502));
        // Mid-stream: the stream's failed ending.
        let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": true}));
        ex.response_head(head(200, "text/event-stream"), 1);
        ex.response_body(CHUNK.as_bytes(), false, 1);
        let AbortStep::Send(out) = ex.abort(ErrorCode::InternalError, "boom", 1) else {
            panic!("no ending");
        };
        let out = String::from_utf8(out.to_vec()).unwrap();
        assert!(out.contains("event: response.failed\n") && out.ends_with("data: [DONE]\n\n"));
        assert_eq!(
            ex.summary().error_code.as_ref().map(Code::as_str),
            Some("internal_error")
        );
        // After the end: nothing.
        assert!(matches!(
            ex.abort(ErrorCode::InternalError, "again", 1),
            AbortStep::Nothing
        ));
    }

    fn keyed(max_request: usize) -> Arc<Settings> {
        let ring = crate::translate::seal::Keyring::single("k1", [7; 32]).unwrap();
        Arc::new(Settings {
            options: Options {
                max_request_bytes: max_request,
                keyring: Some(Arc::new(ring)),
                ..Options::default()
            },
            ..Settings::default()
        })
    }

    fn completion(text: &str) -> String {
        json!({"model": "up", "choices": [{"index": 0, "finish_reason": "stop",
               "message": {"role": "assistant", "content": text}}],
               "usage": {"prompt_tokens": 30, "completion_tokens": 5}})
        .to_string()
    }

    /// A compact request through the core: the Chat request sent, the client's answer.
    fn compact(settings: &Arc<Settings>, body: &Value, upstream: &str) -> (Value, Value) {
        let mut ex = Exchange::new(settings.clone(), Operation::Compact);
        let RequestStep::Forward(up) = ex.request_body(body.to_string().as_bytes(), true, META)
        else {
            panic!("not forwarded");
        };
        assert!(!up.stream);
        assert!(matches!(
            ex.response_head(head(200, "application/json"), 1),
            HeadStep::Gather
        ));
        let BodyStep::Reply(r) = ex.response_body(upstream.as_bytes(), true, 1) else {
            panic!("no reply");
        };
        assert!(matches!(r, Reply::Answer(_)), "{:?}", r.body());
        (
            serde_json::from_slice(&up.body).unwrap(),
            serde_json::from_slice(r.body()).unwrap(),
        )
    }

    #[test]
    fn compact_asks_for_a_summary_and_seals_it() {
        let s = keyed(1 << 20);
        let window = json!({"model": "m", "instructions": "Be brief.", "input": [
            {"role": "user", "content": "My name is Ada."},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi Ada."}]},
            {"role": "user", "content": "Remember 42."}
        ]});
        let (chat, answer) = compact(&s, &window, &completion("Ada; remember 42."));
        // The summarising request: the prompt (with the instructions noted) first, the
        // conversation, then the request to summarise.
        let msgs = chat["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 5);
        assert_eq!(msgs[0]["role"], "system");
        let sys = msgs[0]["content"].as_str().unwrap();
        assert!(sys.starts_with(compact::PROMPT) && sys.ends_with("Be brief."));
        assert_eq!(msgs[1]["content"], "My name is Ada.");
        assert_eq!(msgs[3]["content"], "Remember 42.");
        assert_eq!(msgs[4]["content"], compact::REQUEST);
        assert_eq!(chat["stream"], false);
        // The answer: the latest user message verbatim, then the sealed summary.
        assert_eq!(answer["object"], "response.compaction");
        assert_eq!(answer["id"], "resp_00000000000000000000000000000007");
        assert_eq!(answer["created_at"], META.now);
        assert_eq!(answer["usage"]["input_tokens"], 30);
        assert_eq!(answer["usage"]["total_tokens"], 35);
        let out = answer["output"].as_array().unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(
            (out[0]["type"].as_str(), out[0]["role"].as_str()),
            (Some("message"), Some("user"))
        );
        assert_eq!(
            out[0]["content"],
            json!([{"type": "input_text", "text": "Remember 42."}])
        );
        assert_eq!(out[1]["type"], "compaction");
        let blob = out[1]["encrypted_content"].as_str().unwrap();
        assert!(!blob.contains("Ada"));

        // A later request carrying the item: the summary reaches the upstream as context,
        // at the head, after the instructions.
        let next = json!({"model": "m", "instructions": "Be brief.", "input": [
            out[0], out[1], {"role": "user", "content": "What number?"}
        ]});
        let mut ex = Exchange::new(s.clone(), Operation::Create);
        let RequestStep::Forward(up) = ex.request_body(next.to_string().as_bytes(), true, META)
        else {
            panic!("not forwarded");
        };
        let chat: Value = serde_json::from_slice(&up.body).unwrap();
        assert_eq!(
            chat["messages"][0]["content"],
            format!("Be brief.\n\n{}Ada; remember 42.", compact::CONTEXT_PREFIX)
        );
        assert_eq!(
            chat["messages"][1]["content"],
            json!([{"type": "text", "text": "Remember 42."}])
        );
        assert_eq!(chat["messages"][2]["content"], "What number?");

        // Compacting a window that already holds a compaction: the old summary is context
        // of the new one.
        let (chat, _) = compact(&s, &next, &completion("newer"));
        let sys = chat["messages"][0]["content"].as_str().unwrap();
        assert!(sys.contains(&format!("{}Ada; remember 42.", compact::CONTEXT_PREFIX)));
    }

    fn rejected(settings: &Arc<Settings>, op: Operation, body: &Value) -> (u16, Value) {
        let mut ex = Exchange::new(settings.clone(), op);
        let RequestStep::Reply(r) = ex.request_body(body.to_string().as_bytes(), true, META) else {
            panic!("forwarded: {body}");
        };
        (r.status(), envelope(&r))
    }

    #[test]
    fn compaction_items_that_do_not_open_are_400() {
        let s = keyed(1 << 20);
        let (_, answer) = compact(
            &s,
            &json!({"model": "m", "input": "hi"}),
            &completion("sum"),
        );
        let blob = answer["output"][1]["encrypted_content"].as_str().unwrap();
        let mut tampered = blob.to_owned();
        let last = tampered.pop().unwrap();
        tampered.push(if last == 'A' { 'B' } else { 'A' });
        let other = crate::translate::seal::Keyring::single("k1", [8; 32]).unwrap();
        let foreign = other.seal_for(
            crate::translate::seal::Purpose::Compaction,
            "x",
            crate::translate::seal::nonce(1, 0),
        );
        // A reasoning blob of the same keys is not a compaction.
        let reasoning = s
            .options
            .keyring
            .as_ref()
            .unwrap()
            .seal("x", crate::translate::seal::nonce(1, 0));
        for bad in [
            tampered.as_str(),
            foreign.as_str(),
            reasoning.as_str(),
            "nope",
        ] {
            let body = json!({"model": "m", "input": [
                {"type": "compaction", "encrypted_content": bad},
                {"role": "user", "content": "go on"}]});
            for op in [Operation::Create, Operation::Compact] {
                let (status, e) = rejected(&s, op, &body);
                assert_eq!(status, 400);
                assert_eq!(e["code"], "invalid_encrypted_content");
                assert_eq!(e["param"], "input[0].encrypted_content");
            }
        }
        // No keys: neither compacting nor opening.
        let plain = settings(1 << 20, 1 << 20);
        let (status, e) = rejected(
            &plain,
            Operation::Compact,
            &json!({"model": "m", "input": "hi"}),
        );
        assert_eq!(
            (status, e["code"].as_str()),
            (400, Some("compaction_unavailable"))
        );
        let (status, e) = rejected(
            &plain,
            Operation::Create,
            &json!({"model": "m", "input": [{"type": "compaction", "encrypted_content": blob}]}),
        );
        assert_eq!(
            (status, e["code"].as_str()),
            (400, Some("invalid_encrypted_content"))
        );
    }

    #[test]
    fn compact_refuses_streams_and_keeps_the_limits() {
        let s = keyed(200);
        let (status, e) = rejected(
            &s,
            Operation::Compact,
            &json!({"model": "m", "input": "hi", "stream": true}),
        );
        assert_eq!((status, e["param"].as_str()), (400, Some("stream")));
        let (status, e) = rejected(
            &s,
            Operation::Compact,
            &json!({"model": "m", "input": "x".repeat(300)}),
        );
        assert_eq!(
            (status, e["code"].as_str()),
            (413, Some("request_too_large"))
        );
        let (status, _) = rejected(&s, Operation::Compact, &json!({"model": "m"}));
        assert_eq!(status, 400);
    }

    #[test]
    fn compact_upstream_failures_are_envelopes() {
        let s = keyed(1 << 20);
        let body = json!({"model": "m", "input": "hi"}).to_string();
        for (status, content_type, upstream, code) in [
            (
                503,
                "application/json",
                "{}".to_owned(),
                "upstream_unavailable",
            ),
            (
                200,
                "text/event-stream",
                "data: [DONE]\n\n".to_owned(),
                "upstream_invalid_response",
            ),
            (
                200,
                "application/json",
                completion("  "),
                "upstream_invalid_response",
            ),
            (
                200,
                "application/json",
                "not json".to_owned(),
                "upstream_invalid_response",
            ),
        ] {
            let mut ex = Exchange::new(s.clone(), Operation::Compact);
            assert!(matches!(
                ex.request_body(body.as_bytes(), true, META),
                RequestStep::Forward(_)
            ));
            ex.response_head(head(status, content_type), 1);
            let BodyStep::Reply(r) = ex.response_body(upstream.as_bytes(), true, 1) else {
                panic!("no reply");
            };
            assert_eq!(envelope(error(&r))["code"], code, "{status} {content_type}");
            assert_eq!(ex.summary().outcome, Outcome::Failed);
        }
    }

    /// Keys, and sealed items bound to the tenant in `x-tenant` (unbound ones accepted or not).
    fn tenanted(accept_unbound: bool) -> Arc<Settings> {
        let mut s = (*keyed(1 << 20)).clone();
        s.seal_tenant_header = Some("x-tenant".into());
        s.options.accept_unbound_seals = accept_unbound;
        Arc::new(s)
    }

    /// A request through the core with its `x-tenant` header (none: `None`): forwarded (the
    /// Chat body), or refused (the envelope's status and error).
    fn as_tenant(
        settings: &Arc<Settings>,
        op: Operation,
        tenant: Option<&str>,
        body: &Value,
    ) -> Result<Value, (u16, Value)> {
        let mut ex = Exchange::new(settings.clone(), op);
        ex.request_head(|name| (name == "x-tenant").then_some(tenant).flatten());
        match ex.request_body(body.to_string().as_bytes(), true, META) {
            RequestStep::Forward(up) => Ok(serde_json::from_slice(&up.body).unwrap()),
            RequestStep::Reply(e) => Err((e.status(), envelope(&e))),
            RequestStep::Hold => panic!("held"),
            RequestStep::Call(_) => panic!("no context_management here"),
            RequestStep::Work(_) => panic!("not offloaded"),
        }
    }

    /// A compaction item sealed through the core for `tenant` (the `/compact` answer's).
    fn compaction_for(settings: &Arc<Settings>, tenant: Option<&str>) -> Value {
        let mut ex = Exchange::new(settings.clone(), Operation::Compact);
        ex.request_head(|name| (name == "x-tenant").then_some(tenant).flatten());
        let body = json!({"model": "m", "input": "I am Ada."});
        assert!(matches!(
            ex.request_body(body.to_string().as_bytes(), true, META),
            RequestStep::Forward(_)
        ));
        ex.response_head(head(200, "application/json"), 1);
        let BodyStep::Reply(r) = ex.response_body(completion("Ada.").as_bytes(), true, 1) else {
            panic!("no reply");
        };
        let answer: Value = serde_json::from_slice(r.body()).unwrap();
        answer["output"][1].clone()
    }

    /// With a tenant header: a blob sealed for one tenant opens for that tenant only (400
    /// `invalid_encrypted_content` for another, on `/v1/responses` and `/compact`); a request
    /// that would seal or open one without the header is 403 `missing_tenant`, one that does
    /// neither is served; blobs sealed bound to no tenant open only in the migration window;
    /// blobs bound to a tenant do not open where no tenant header is set.
    #[test]
    fn sealed_items_are_bound_to_the_requests_tenant() {
        let s = tenanted(false);
        let item = compaction_for(&s, Some("team-a"));
        assert_eq!(item["type"], "compaction");
        let next = json!({"model": "m", "input": [item, {"role": "user", "content": "Who am I?"}]});
        for op in [Operation::Create, Operation::Compact] {
            let chat = as_tenant(&s, op, Some("team-a"), &next).expect("the same tenant");
            assert!(chat.to_string().contains("Ada."), "{chat}");
            for other in ["team-b", "team-a2", "Team-a"] {
                let (status, err) = as_tenant(&s, op, Some(other), &next).unwrap_err();
                assert_eq!(status, 400, "{other}");
                assert_eq!(err["code"], "invalid_encrypted_content", "{err}");
                assert_eq!(err["param"], "input[0].encrypted_content");
                assert!(
                    err["message"].as_str().unwrap().contains("another tenant"),
                    "{err}"
                );
            }
        }

        // No tenant: refused wherever something would be sealed or opened.
        let missing = |op, body: &Value| {
            for tenant in [None, Some("")] {
                let (status, err) = as_tenant(&s, op, tenant, body).unwrap_err();
                assert_eq!(
                    (status, err["code"].as_str()),
                    (403, Some("missing_tenant"))
                );
                assert_eq!(err["type"], "permission_error");
            }
        };
        missing(Operation::Create, &next);
        missing(Operation::Compact, &json!({"model": "m", "input": "hi"}));
        missing(
            Operation::Create,
            &json!({"model": "m", "input": "hi", "include": ["reasoning.encrypted_content"]}),
        );
        missing(
            Operation::Create,
            &json!({"model": "m", "input": [{"role": "user", "content": "hi"},
                                           {"type": "compaction_trigger"}]}),
        );
        let plain = json!({"model": "m", "input": "hi"});
        assert!(as_tenant(&s, Operation::Create, None, &plain).is_ok());

        // Blobs sealed before the tenant header was set: refused, or open during migration.
        let unbound = compaction_for(&keyed(1 << 20), None);
        let old = json!({"model": "m", "input": [unbound, {"role": "user", "content": "Who?"}]});
        let (status, err) = as_tenant(&s, Operation::Create, Some("team-a"), &old).unwrap_err();
        assert_eq!(
            (status, err["code"].as_str()),
            (400, Some("invalid_encrypted_content"))
        );
        assert!(
            err["message"]
                .as_str()
                .unwrap()
                .contains("before this server bound"),
            "{err}"
        );
        let migrating = tenanted(true);
        for tenant in ["team-a", "team-b"] {
            assert!(as_tenant(&migrating, Operation::Create, Some(tenant), &old).is_ok());
        }
        // New blobs are bound even during the migration.
        let bound = compaction_for(&migrating, Some("team-a"));
        let next = json!({"model": "m", "input": [bound, {"role": "user", "content": "Who?"}]});
        assert!(as_tenant(&migrating, Operation::Create, Some("team-b"), &next).is_err());

        // A bound blob where no tenant header is set.
        let (status, err) = as_tenant(&keyed(1 << 20), Operation::Create, None, &next).unwrap_err();
        assert_eq!(
            (status, err["code"].as_str()),
            (400, Some("invalid_encrypted_content"))
        );
    }

    /// Sealed reasoning is bound like compaction items: sealed for the request's tenant in the
    /// answer, opened for it only.
    #[test]
    fn sealed_reasoning_is_bound_to_the_tenant() {
        let s = tenanted(false);
        let mut ex = Exchange::new(s.clone(), Operation::Create);
        ex.request_head(|name| (name == "x-tenant").then_some("team-a"));
        let body = json!({"model": "m", "input": "hi", "include": ["reasoning.encrypted_content"]});
        assert!(matches!(
            ex.request_body(body.to_string().as_bytes(), true, META),
            RequestStep::Forward(_)
        ));
        ex.response_head(head(200, "application/json"), 1);
        let answer = json!({"model": "up", "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."}}]});
        let BodyStep::Reply(r) = ex.response_body(answer.to_string().as_bytes(), true, 1) else {
            panic!("no reply");
        };
        let response: Value = serde_json::from_slice(r.body()).unwrap();
        let reasoning = response["output"][0].clone();
        assert_eq!(reasoning["type"], "reasoning");
        let next = json!({"model": "m", "input": [{"role": "user", "content": "hi"}, reasoning,
            response["output"][1], {"role": "user", "content": "Again."}]});
        let chat = as_tenant(&s, Operation::Create, Some("team-a"), &next).unwrap();
        assert_eq!(chat["messages"][1]["reasoning_content"], "Greet.");
        let (status, err) = as_tenant(&s, Operation::Create, Some("team-b"), &next).unwrap_err();
        assert_eq!(
            (status, err["code"].as_str()),
            (400, Some("invalid_encrypted_content"))
        );
        assert_eq!(err["param"], "input[1].encrypted_content");
    }
}
