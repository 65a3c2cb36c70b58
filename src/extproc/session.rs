//! One HTTP exchange as Envoy reports it: ext_proc messages in, ext_proc answers out. A shell
//! around the core's [`Driver`], which owns the exchange's life (what each message means, what
//! Envoy does next, when it is ours, streams, first shows output and ends); this file only maps
//! its actions to protobuf (body modes, mutations, immediate responses) and its events to the
//! metrics, the span and Envoy's dynamic metadata, as `module/src/filter.rs` maps them to
//! Envoy's filter ABI.
//!
//! Envoy sends, per request: request headers → request body (BUFFERED) → response headers →
//! response body (the mode we pick on the response headers). Each message gets exactly one
//! answer. Gathered answers use BUFFERED_PARTIAL: Envoy holds the head and hands us the whole
//! body, or, when its buffer is full, what it has so far (`end_of_stream: false`), which the
//! driver answers with an error envelope ([`Gathering::Whole`]) instead of letting Envoy fail
//! the request itself.
//!
//! Fail closed: once a request is ours, no answer to a body message leaves the original bytes
//! in place, and no answer to a response head lets its body pass unread
//! (`tests::prop_nothing_untranslated_passes` checks both over random message sequences).

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::ProcessingMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation::Mutation, common_response::ResponseStatus, processing_request::Request,
    BodyMutation, CommonResponse, HttpHeaders, ProcessingRequest, ProcessingResponse,
};

use super::messages::{self as msg, header, Headers};
use super::Settings;
use crate::config::StreamBodyMode;
use crate::logs;
use crate::traces::{ExchangeSpan, Transport};
use responses_core::call::{Call, CallFailure, CallId, ReportedHead};
use responses_core::driver::{Action, Cause, Driver, Edits, Failure, Gathering, HeaderEdit};
use responses_core::exchange::{self, Body, ErrorReply};
use responses_core::life::{Event, Finished};
use responses_core::log;
use responses_core::metadata::{self, record, record::Answer};

pub use responses_core::environment::{Environment, System};

pub use responses_core::metadata::METADATA_NAMESPACE;

/// An exchange's summary as Envoy dynamic metadata: model, ids, outcome and token counts.
fn metadata(s: &exchange::Summary) -> envoy_types::pb::google::protobuf::Struct {
    msg::dynamic_metadata(METADATA_NAMESPACE, metadata::metadata(s))
}

/// Every header the processor reads from Envoy's header messages: the request's method,
/// path, id and content coding, the client's identity, the answer's status and content
/// type, and the answer's headers a translated error keeps (`retry-after`, ...; with
/// [`HEADER_PREFIXES_READ`]). Envoy forwards no others (`forward_rules` in envoy/envoy.yaml
/// and the other shipped configs, checked against this list by a test): fewer bytes to
/// encode and decode in every header message (measured: ~7 % more translated JSON exchanges
/// per second with openai-python's headers, benches/side_by_side.py). The client's
/// credentials and trace context (`call::FORWARDED_HEADERS`) are read for the processor's own
/// call, an automatic compaction's summarising request, which carries them as the routed call
/// does.
pub const HEADERS_READ: [&str; 18] = responses_core::call::names_once(&[
    &[":method", ":path", "x-request-id"],
    responses_core::call::FORWARDED_HEADERS,
    &[
        responses_core::request_encoding::HEADER,
        ":status",
        "content-type",
    ],
    &responses_core::client::IDENTITY_HEADERS,
    &responses_core::upstream_failure::KEPT_HEADERS,
]);

/// The prefixes of the other headers the processor reads: an answer's `x-ratelimit-*`.
pub const HEADER_PREFIXES_READ: [&str; 1] = [responses_core::upstream_failure::KEPT_HEADER_PREFIX];

/// The transport field of this adapter's log lines.
const TRANSPORT: &str = "ext_proc";

/// The message an answer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Message {
    RequestHeaders,
    RequestBody,
    ResponseHeaders,
    ResponseBody,
    ResponseTrailers,
    /// No message: the last answers before the gRPC stream ends with an error.
    Failure,
}

/// One HTTP request/response exchange.
#[derive(Debug)]
pub struct Session<E = System> {
    settings: Arc<Settings>,
    driver: Driver<E>,
    /// `x-request-id`, for logs.
    request_id: String,
    /// The exchange's span, when traces are on.
    trace: Trace,
    /// The JSON object that stands for the answer sent last (a response, or a stream's last
    /// event), kept only while the span records content (`--trace-content`).
    last_answer: Option<bytes::Bytes>,
    /// A call the exchange asked for (an automatic compaction's summarising request), and the
    /// bound Envoy is asked to hold the request for it, not yet taken by the stream's relay
    /// ([`Session::take_call`]).
    call: Option<(Call, std::time::Duration)>,
    /// The request's head, kept (moved, not copied) for the headers a call of the exchange's
    /// own carries on ([`responses_core::call::forwarded`]).
    head: Option<HttpHeaders>,
}

/// The exchange's span: the caller's context until the exchange is ours, then the span,
/// until it is ended with the exchange.
#[derive(Debug, Default)]
enum Trace {
    #[default]
    Off,
    Parent(opentelemetry::Context),
    Open(Box<ExchangeSpan>),
}

impl<E: Environment> Session<E> {
    pub fn new(settings: Arc<Settings>, env: E) -> Self {
        // BUFFERED_PARTIAL hands a gathered answer over whole (or what Envoy holds when its
        // buffer is full).
        let driver = Driver::new(settings.exchange.clone(), env, Gathering::Whole);
        Session {
            settings,
            driver,
            request_id: String::new(),
            trace: Trace::Off,
            last_answer: None,
            call: None,
            head: None,
        }
    }

    /// The caller's trace context (traces on): the exchange's span, if it is ours, is its
    /// child.
    pub fn set_trace_parent(&mut self, parent: opentelemetry::Context) {
        self.trace = Trace::Parent(parent);
    }

    /// Whether this exchange is being translated (for tests).
    pub fn is_translating(&self) -> bool {
        self.driver.is_ours()
    }

    /// Whether a request body piece of `len` bytes may hold a thread for long
    /// ([`Exchange::is_costly`](responses_core::exchange::Exchange::is_costly)).
    pub fn is_costly(&self, len: usize) -> bool {
        match self.driver.exchange() {
            Some(exchange) => exchange.is_costly(len),
            None => len >= responses_core::exchange::COSTLY_BODY_BYTES,
        }
    }

    /// `x-request-id` of the exchange (empty before the request headers), for logs.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// Answers one message from Envoy: one answer per message, except that trailers ending
    /// a FULL_DUPLEX_STREAMED body also get the stream's last events; none for an empty message.
    pub fn on_message(&mut self, req: ProcessingRequest) -> Vec<ProcessingResponse> {
        let Some(req) = req.request else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut answers = match req {
            Request::RequestHeaders(h) => {
                self.request_id = read(&h, "x-request-id").unwrap_or_default().to_owned();
                // A WebSocket turn's record: its metadata on this stream, or a 404.
                let method = read(&h, ":method").unwrap_or_default();
                let path = read(&h, ":path").unwrap_or_default();
                let fields = match record::answer(
                    &self.settings.exchange,
                    &self.settings.records,
                    method,
                    path,
                ) {
                    Answer::NotRecord => None,
                    Answer::Record(fields) => Some(fields),
                    Answer::Unknown(error) => {
                        return vec![self.reply(&ErrorReply::new(error), Cause::Request)]
                    }
                };
                // The operator's tenant header, if any, is read too (Envoy must forward it).
                let tenant = self.settings.exchange.seal_tenant_header.as_deref();
                let action = self.driver.handle_request_headers(
                    now,
                    |name| read_or(&h, name, tenant),
                    h.end_of_stream,
                );
                if self.driver.is_ours() {
                    self.head = Some(h);
                }
                let mut answers = self.carry(Message::RequestHeaders, action);
                if let (Some(fields), Some(answer)) = (fields, answers.last_mut()) {
                    answer.dynamic_metadata =
                        Some(msg::dynamic_metadata(METADATA_NAMESPACE, fields));
                }
                answers
            }
            Request::RequestBody(b) => {
                // BUFFERED (every shipped config): Envoy sends the whole body in this one
                // message; `end_of_stream` is false only when trailers follow (the client's,
                // or a filter's before ours), which carry nothing we read and are not sent to
                // us (`request_trailer_mode: SKIP`): waiting for them would hang the request.
                let end = true;
                if self.settings.log_content {
                    log_content(&self.request_id, "client request", &b.body);
                }
                if let Trace::Open(span) = &mut self.trace {
                    if span.wants_content() {
                        span.record_request(&b.body);
                    }
                }
                let action = self.driver.handle_request_body(now, || [&b.body[..]], end);
                self.carry(Message::RequestBody, action)
            }
            Request::ResponseHeaders(h) => {
                let action = self.driver.handle_response_headers(
                    now,
                    |name| read(&h, name),
                    || every(&h),
                    h.end_of_stream,
                );
                if self.driver.is_ours() {
                    tracing::debug!(
                        request_id = %self.request_id,
                        status = read(&h, ":status").unwrap_or_default(),
                        content_type = read(&h, "content-type").unwrap_or_default(),
                        "answer head"
                    );
                }
                self.carry(Message::ResponseHeaders, action)
            }
            Request::ResponseBody(b) => {
                if self.settings.log_content {
                    log_content(&self.request_id, "upstream body", &b.body);
                }
                let action =
                    self.driver
                        .handle_response_body(now, || [&b.body[..]], b.end_of_stream);
                self.carry(Message::ResponseBody, action)
            }
            // Envoy sends them only when asked (request_trailer_mode: SKIP in every shipped
            // config), and a trailers answer could not carry the body they would end.
            Request::RequestTrailers(_) => vec![msg::request_trailers()],
            // In FULL_DUPLEX_STREAMED mode trailers may be what ends the upstream body.
            Request::ResponseTrailers(_) => {
                let action = self.driver.handle_response_trailers(now);
                self.carry(Message::ResponseTrailers, action)
            }
        };
        self.settle(&mut answers);
        answers
    }

    /// The call the last answer left to make (the request body's answer waits for it), and
    /// how long Envoy is asked to hold the request for it (`override_message_timeout`: the
    /// driver's deadline for the call, then some).
    pub fn take_call(&mut self) -> Option<(Call, std::time::Duration)> {
        self.call.take()
    }

    /// `traceparent` (and `tracestate`) continuing the exchange's span (traces on): they
    /// replace the client's on the exchange's own call, so that its Envoy spans are the span's
    /// children.
    pub fn trace_headers(&self) -> Vec<(axum::http::HeaderName, axum::http::HeaderValue)> {
        match &self.trace {
            Trace::Open(span) => span.propagation_headers(),
            _ => Vec::new(),
        }
    }

    /// The call the exchange waits for, if any (a call it gave up on is no longer it).
    pub fn call_in_flight(&self) -> Option<CallId> {
        self.driver.call_in_flight()
    }

    /// The head of the call's answer.
    pub fn call_head(&mut self, id: CallId, head: ReportedHead) -> Vec<ProcessingResponse> {
        let action = self.driver.handle_call_head(Instant::now(), id, head);
        self.call_answers(action)
    }

    /// A piece of the call's answer.
    pub fn call_data(&mut self, id: CallId, bytes: &[u8]) -> Vec<ProcessingResponse> {
        let action = self.driver.handle_call_data(Instant::now(), id, bytes);
        self.call_answers(action)
    }

    /// The call's answer is complete.
    pub fn call_end(&mut self, id: CallId) -> Vec<ProcessingResponse> {
        let action = self.driver.handle_call_end(Instant::now(), id);
        self.call_answers(action)
    }

    /// When the exchange wants [`Session::handle_timeout`]: its call's deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.driver.poll_timeout()
    }

    /// The timer armed for [`Session::poll_timeout`] fired.
    pub fn handle_timeout(&mut self) -> Vec<ProcessingResponse> {
        let action = self.driver.handle_timeout(Instant::now());
        self.call_answers(action)
    }

    /// The call failed.
    pub fn call_failed(&mut self, id: CallId, why: CallFailure<'_>) -> Vec<ProcessingResponse> {
        let action = self.driver.handle_call_failed(Instant::now(), id, why);
        self.call_answers(action)
    }

    /// What a step of the call makes of the request body's answer, still owed to Envoy.
    fn call_answers(&mut self, action: Action) -> Vec<ProcessingResponse> {
        let mut answers = match action {
            Action::Hold => Vec::new(),
            action => self.carry(Message::RequestBody, action),
        };
        self.settle(&mut answers);
        answers
    }

    /// Envoy sent a message we could not read (over the gRPC message limit) or handling one
    /// failed (a panic): end the exchange with an OpenResponses error while Envoy still waits
    /// for an answer. The caller then ends the gRPC stream with an error status, so that
    /// Envoy fails the request rather than carrying on without us.
    pub fn on_failure(&mut self, unreadable: bool) -> Vec<ProcessingResponse> {
        let why = if unreadable {
            Failure::Unreadable
        } else {
            Failure::Panic
        };
        let action = self.driver.handle_failure(Instant::now(), why);
        let mut answers = self.carry(Message::Failure, action);
        self.settle(&mut answers);
        answers
    }

    /// Envoy ended the gRPC stream (or dropped it): an exchange still open was cut, and is
    /// recorded as such (every exchange is recorded once).
    pub fn closed(&mut self) {
        self.driver.handle_closed(Instant::now());
        self.settle(&mut []);
    }

    /// The driver's action as the answer to a message.
    fn carry(&mut self, at: Message, mut action: Action) -> Vec<ProcessingResponse> {
        // This driver does not offload (a costly message is handled on a blocking thread
        // whole, `crate::extproc`): work it asks for anyway is done here.
        while let Action::Work(work) = action {
            action = self.driver.handle_work_done(Instant::now(), work.run());
        }
        if let Trace::Open(span) = &self.trace {
            if span.wants_content() {
                match &action {
                    Action::Send { events, .. } => {
                        if let Some(last) = events.last() {
                            self.last_answer = Some(last);
                        }
                    }
                    Action::Answer { answer, .. } => self.last_answer = answer.body.last_object(),
                    _ => {}
                }
            }
        }
        let (common, mode) = match action {
            // The message's answer waits for the call (the stream's driver makes it).
            Action::Call { mut call, bound } => {
                if let Some(head) = self.head.take() {
                    // The operator's forward_headers arrive if Envoy forwards them too
                    // (its forward_rules), as its tenant header does.
                    let extra = &self.settings.exchange.forward_headers;
                    call.headers.extend(responses_core::call::forwarded(
                        |name| match extra.iter().any(|h| h == name) {
                            true => header(&head, name),
                            false => read(&head, name),
                        },
                        extra,
                    ));
                }
                self.call = Some((call, bound));
                return Vec::new();
            }
            Action::Reply { error, cause } => return vec![self.reply(&error, cause)],
            Action::Work(_) => unreachable!("done above"),
            // Envoy resets a stream whose head went out when it is answered this way.
            Action::Reset { error, .. } => return vec![self.reply(&error, Cause::Answer)],
            Action::Pass | Action::Hold if at == Message::ResponseTrailers => {
                return vec![msg::response_trailers()]
            }
            Action::Pass | Action::Hold if at == Message::Failure => return Vec::new(),
            // Not ours: Envoy stops sending us this exchange.
            Action::Pass if at == Message::RequestHeaders => (
                msg::common(Headers::default(), None, false),
                Some(msg::pass_through_mode()),
            ),
            Action::Pass => (msg::common(Headers::default(), None, false), None),
            Action::Hold => (clear_body(), None),
            Action::ReadBody(edits) => {
                // The request body comes BUFFERED (the filter's config); a gathered answer
                // BUFFERED_PARTIAL.
                let mode = (at == Message::ResponseHeaders)
                    .then(|| msg::response_body_mode(BodySendMode::BufferedPartial));
                (msg::common(headers(edits), None, false), mode)
            }
            Action::Forward { edits, request } => {
                let line = log::forwarded(self.driver.summary(), &request);
                logs::emit(&line, TRANSPORT, &self.request_id);
                if self.settings.log_content {
                    log_content(&self.request_id, "upstream request", &request.body);
                }
                let body = Some(Vec::from(request.body));
                (msg::common(headers(edits), body, true), None)
            }
            Action::OpenStream(edits) => {
                let mode = match self.settings.stream_body_mode {
                    StreamBodyMode::Streamed => BodySendMode::Streamed,
                    StreamBodyMode::FullDuplexStreamed => BodySendMode::FullDuplexStreamed,
                };
                (
                    msg::common(headers(edits), None, false),
                    Some(msg::response_body_mode(mode)),
                )
            }
            // The stream's last events, then the trailers.
            Action::Send { events, .. } if at == Message::ResponseTrailers => {
                return vec![
                    msg::streamed_body(Vec::from(events.into_bytes()), true),
                    msg::response_trailers(),
                ]
            }
            Action::Send { events, end }
                if matches!(at, Message::ResponseBody | Message::Failure) =>
            {
                return vec![self.stream_bytes(events.into_bytes(), end)]
            }
            Action::Send { events, .. } => (
                msg::common(
                    Headers::default(),
                    Some(Vec::from(events.into_bytes())),
                    false,
                ),
                None,
            ),
            // A trailers answer cannot carry a body: the answer goes as Envoy's reply.
            Action::Answer { answer, .. }
                if matches!(at, Message::ResponseTrailers | Message::Failure) =>
            {
                return vec![msg::immediate(
                    answer.status,
                    answer.body.content_type(),
                    answer.body.to_vec(),
                    Cause::Answer.details(),
                )]
            }
            Action::Answer { edits, answer } => {
                let body = match answer.body {
                    Body::Json(bytes) => Vec::from(bytes),
                    Body::Events(events) => Vec::from(events.into_bytes()),
                };
                (msg::common(headers(edits), Some(body), false), None)
            }
        };
        vec![wrap(at, common, mode)]
    }

    /// What the driver tells, into the metrics, the span and Envoy's metadata (on the last
    /// answer).
    fn settle(&mut self, answers: &mut [ProcessingResponse]) {
        let now = Instant::now();
        while let Some(event) = self.driver.poll_event(now) {
            if let Some(m) = &self.settings.metrics {
                m.tell(&event);
            }
            match event {
                Event::Claimed { elapsed } => {
                    if let (Trace::Parent(parent), Some(t)) = (&self.trace, &self.settings.traces) {
                        let span = t.start_exchange(parent, Transport::ExtProc, elapsed);
                        self.trace = Trace::Open(Box::new(span));
                    }
                }
                Event::Finished(f) => self.finished(&f, answers.last_mut()),
                Event::Call(timing) => {
                    if let Trace::Open(span) = &mut self.trace {
                        span.call_event(&timing);
                    }
                }
                Event::StreamOpened | Event::StreamClosed | Event::FirstOutput { .. } => {}
            }
        }
    }

    /// The exchange ended: the answer that ends it carries its summary as Envoy metadata, and
    /// it is recorded on its span (the metrics have it from its event).
    fn finished(&mut self, f: &Finished, last: Option<&mut ProcessingResponse>) {
        let s = &f.summary;
        logs::emit(&log::finished(f), TRANSPORT, &self.request_id);
        if !f.cut {
            if let (Trace::Open(span), Some(answer)) = (&mut self.trace, self.last_answer.take()) {
                span.record_answer(&answer);
            }
            if let Some(last) = last {
                last.dynamic_metadata = Some(metadata(s));
            }
        }
        if let Trace::Open(span) = std::mem::take(&mut self.trace) {
            span.finish(s, &f.timing);
        }
    }

    /// Translated stream bytes, in the answer form of the configured body mode.
    fn stream_bytes(&self, bytes: bytes::Bytes, end_of_stream: bool) -> ProcessingResponse {
        match self.settings.stream_body_mode {
            StreamBodyMode::Streamed => msg::response_body(msg::common(
                Headers::default(),
                Some(Vec::from(bytes)),
                false,
            )),
            StreamBodyMode::FullDuplexStreamed => {
                msg::streamed_body(Vec::from(bytes), end_of_stream)
            }
        }
    }

    /// An error envelope as Envoy's reply, in place of the request or of the upstream's answer.
    fn reply(&self, error: &ErrorReply, cause: Cause) -> ProcessingResponse {
        let line = log::replied(error, cause == Cause::Request);
        logs::emit(&line, TRANSPORT, &self.request_id);
        let kept = error
            .headers
            .iter()
            .map(|h| (h.name.as_str(), h.value.as_str()));
        msg::immediate_with(
            error.status(),
            error.content_type(),
            kept,
            error.body.to_vec(),
            cause.details(),
        )
    }
}

/// A common response as the answer to its message. A head's answer replaces the body only
/// as CONTINUE_AND_REPLACE.
fn wrap(at: Message, mut c: CommonResponse, mode: Option<ProcessingMode>) -> ProcessingResponse {
    match at {
        Message::RequestHeaders | Message::ResponseHeaders => {
            if c.body_mutation.is_some() {
                c.status = ResponseStatus::ContinueAndReplace as i32;
            }
            if at == Message::RequestHeaders {
                msg::request_headers(c, mode)
            } else {
                msg::response_headers(c, mode)
            }
        }
        Message::RequestBody => msg::request_body(c),
        Message::ResponseBody | Message::ResponseTrailers | Message::Failure => {
            msg::response_body(c)
        }
    }
}

/// Every header of Envoy's message (those of [`HEADERS_READ`] and [`HEADER_PREFIXES_READ`]).
fn every(h: &HttpHeaders) -> impl Iterator<Item = (&str, &str)> {
    msg::headers(h)
}

/// A header of Envoy's message; only those of [`HEADERS_READ`] are ever sent to us.
fn read<'a>(h: &'a HttpHeaders, name: &str) -> Option<&'a str> {
    read_or(h, name, None)
}

/// [`read`], or the header `also` (the operator's tenant header: `--seal-tenant-header`,
/// which the operator adds to Envoy's `forward_rules`).
fn read_or<'a>(h: &'a HttpHeaders, name: &str, also: Option<&str>) -> Option<&'a str> {
    debug_assert!(
        HEADERS_READ.contains(&name)
            || HEADER_PREFIXES_READ.iter().any(|p| name.starts_with(p))
            || also == Some(name),
        "{name} is not in HEADERS_READ"
    );
    header(h, name)
}

/// The driver's header edits as an ext_proc header mutation.
fn headers(edits: Edits) -> Headers {
    edits
        .iter()
        .fold(Headers::default(), |headers, edit| match edit {
            HeaderEdit::Set(name, value) => headers.set(name, value.as_ref()),
            HeaderEdit::Remove(name) => headers.remove(name),
        })
}

/// Logs a body only when the operator asked for content logging (`--log-content`).
fn log_content(request_id: &str, what: &str, body: &[u8]) {
    // String values: the format quotes and escapes them (a body's newlines forge no line).
    tracing::debug!(
        request_id = &*log::Logged(request_id).cut(),
        content = &*String::from_utf8_lossy(body),
        "{what}"
    );
}

fn clear_body() -> CommonResponse {
    let mut c = msg::common(Headers::default(), None, false);
    c.body_mutation = Some(BodyMutation {
        mutation: Some(Mutation::ClearBody(true)),
    });
    c
}

#[cfg(test)]
mod tests;
