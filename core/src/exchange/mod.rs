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

mod answer;
mod compaction;
mod reply;
mod request;
mod summary;
#[cfg(test)]
mod tests;

pub use answer::{AbortStep, BodyStep, HeadStep, ResponseHead};
use compaction::Compacting;
pub use compaction::{Compaction, CompactionOutcome};
pub use reply::{Answer, Body, ErrorReply, Reply, EVENT_STREAM, JSON};
use request::{options_for, request_too_large};
pub use request::{RequestStep, UpstreamRequest, Work, Worked, COSTLY_BODY_BYTES};
pub use summary::{Outcome, Summary};

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;

use crate::client::{self, ReasoningEventsPolicy};
use crate::openresponses::{ApiError, ErrorCode};
use crate::request_encoding::{self, Decoder};
use crate::translate::seal::Tenant;
use crate::translate::stream::StreamTranslator;
use crate::translate::{self, Options, Params, ReasoningEvents};
use crate::upstream_failure::{self, KeptHeader};

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

    /// The next sequence number of a streamed answer, for an event told among its events by
    /// its host (a WebSocket steer's acknowledgement); `None` before the stream opened.
    pub fn take_sequence_number(&mut self) -> Option<u64> {
        match &mut self.state {
            State::Streaming(translator) => Some(translator.take_sequence_number()),
            _ => None,
        }
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

    /// Ends the exchange with an error envelope.
    fn fail(&mut self, err: ApiError) -> ErrorReply {
        self.state = State::Done;
        self.summary.outcome = Outcome::Failed;
        self.summary.status = Some(err.status);
        self.summary.error_code = err.code.clone();
        ErrorReply::new(err)
    }
}

fn starts_with_ignore_case(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}
