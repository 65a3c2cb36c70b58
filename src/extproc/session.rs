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
    processing_response, BodyMutation, CommonResponse, HttpHeaders, ProcessingRequest,
    ProcessingResponse,
};

use super::messages::{self as msg, header, Headers};
use super::Settings;
use crate::config::StreamBodyMode;
use crate::traces::{self, ExchangeSpan, Transport};
use responses_core::driver::{Action, Cause, Driver, Edits, Event, Failure, Finished, Gathering};
use responses_core::exchange::{self, ErrorReply};
use responses_core::openresponses::Code;
use responses_core::proxy::{self, HeaderEdit};

pub use responses_core::environment::{Environment, System};

pub use responses_core::proxy::METADATA_NAMESPACE;

/// An exchange's summary as Envoy dynamic metadata: model, ids, outcome and token counts.
fn metadata(s: &exchange::Summary) -> envoy_types::pb::google::protobuf::Struct {
    msg::dynamic_metadata(METADATA_NAMESPACE, proxy::metadata(s))
}

/// Every header the processor reads from Envoy's header messages: the request's method,
/// path, id and content coding, the client's identity, the answer's status and content
/// type, and the answer's headers a translated error keeps (`retry-after`, ...; with
/// [`HEADER_PREFIXES_READ`]). Envoy forwards no others (`forward_rules` in envoy/envoy.yaml
/// and the other shipped configs, checked against this list by a test): fewer bytes to
/// encode and decode in every header message (measured: ~7 % more translated JSON exchanges
/// per second with openai-python's headers, benches/side_by_side.py), and the client's
/// credentials never reach the processor.
pub const HEADERS_READ: [&str; 12] = [
    ":method",
    ":path",
    "x-request-id",
    responses_core::request_encoding::HEADER,
    ":status",
    "content-type",
    responses_core::client::IDENTITY_HEADERS[0],
    responses_core::client::IDENTITY_HEADERS[1],
    responses_core::client::IDENTITY_HEADERS[2],
    responses_core::client::IDENTITY_HEADERS[3],
    responses_core::upstream_failure::KEPT_HEADERS[0],
    responses_core::upstream_failure::KEPT_HEADERS[1],
];

/// The prefixes of the other headers the processor reads: an answer's `x-ratelimit-*`.
pub const HEADER_PREFIXES_READ: [&str; 1] = [responses_core::upstream_failure::KEPT_HEADER_PREFIX];

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
                let action =
                    self.driver
                        .request_headers(now, |name| read(&h, name), h.end_of_stream);
                self.carry(Message::RequestHeaders, action)
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
                let action = self.driver.request_body(now, || [&b.body[..]], end);
                self.carry(Message::RequestBody, action)
            }
            Request::ResponseHeaders(h) => {
                let action = self.driver.response_headers(
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
                let action = self
                    .driver
                    .response_body(now, || [&b.body[..]], b.end_of_stream);
                self.carry(Message::ResponseBody, action)
            }
            // Envoy sends them only when asked (request_trailer_mode: SKIP in every shipped
            // config), and a trailers answer could not carry the body they would end.
            Request::RequestTrailers(_) => vec![msg::request_trailers()],
            // In FULL_DUPLEX_STREAMED mode trailers may be what ends the upstream body.
            Request::ResponseTrailers(_) => {
                let action = self.driver.response_trailers(now);
                self.carry(Message::ResponseTrailers, action)
            }
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
        let action = self.driver.fail(Instant::now(), why);
        let mut answers = self.carry(Message::Failure, action);
        self.settle(&mut answers);
        answers
    }

    /// Envoy ended the gRPC stream (or dropped it): an exchange still open was cut, and is
    /// recorded as such (every exchange is recorded once).
    pub fn closed(&mut self) {
        self.driver.closed(Instant::now());
        self.settle(&mut []);
    }

    /// The driver's action as the answer to a message.
    fn carry(&self, at: Message, action: Action) -> Vec<ProcessingResponse> {
        let (common, mode) = match action {
            Action::Reply { error, cause } => return vec![self.reply(&error, cause)],
            // Envoy resets a stream whose head went out when it is answered this way.
            Action::Reset { error } => return vec![self.reply(&error, Cause::Answer)],
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
                tracing::info!(
                    request_id = %self.request_id,
                    response_id = self.driver.summary().and_then(|s| s.response_id.as_deref()).unwrap_or(""),
                    model = %request.model,
                    stream = request.stream,
                    body_bytes = request.body.len(),
                    "translated request"
                );
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
            Action::Send { bytes, .. } if at == Message::ResponseTrailers => {
                return vec![
                    msg::streamed_body(Vec::from(bytes), true),
                    msg::response_trailers(),
                ]
            }
            Action::Send { bytes, end }
                if matches!(at, Message::ResponseBody | Message::Failure) =>
            {
                return vec![self.stream_bytes(bytes, end)]
            }
            Action::Send { bytes, .. } => (
                msg::common(Headers::default(), Some(Vec::from(bytes)), false),
                None,
            ),
            // A trailers answer cannot carry a body: the answer goes as Envoy's reply.
            Action::Answer { answer, .. }
                if matches!(at, Message::ResponseTrailers | Message::Failure) =>
            {
                return vec![msg::immediate(
                    answer.status,
                    answer.content_type,
                    Vec::from(answer.body),
                    Cause::Answer.details(),
                )]
            }
            Action::Answer { edits, answer } => (
                msg::common(headers(edits), Some(Vec::from(answer.body)), false),
                None,
            ),
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
                Event::StreamOpened | Event::StreamClosed | Event::FirstOutput { .. } => {}
            }
        }
    }

    /// The exchange ended: the answer that ends it carries its summary as Envoy metadata, and
    /// it is recorded on its span (the metrics have it from its event).
    fn finished(&mut self, f: &Finished, last: Option<&mut ProcessingResponse>) {
        let s = &f.summary;
        if f.cut {
            // The client got a cut answer (or none).
            tracing::info!(
                request_id = %self.request_id,
                "exchange ended by Envoy before its answer was complete \
                 (client disconnected, upstream reset or timeout)"
            );
        } else {
            tracing::info!(
                request_id = %self.request_id,
                response_id = s.response_id.as_deref().unwrap_or(""),
                operation = s.operation.as_str(),
                stream = s.stream,
                outcome = ?s.outcome,
                code = s.error_code.as_ref().map(Code::as_str).unwrap_or(""),
                "answer translated"
            );
            if let Some(last) = last {
                if let Trace::Open(span) = &mut self.trace {
                    if let (true, Some(body)) = (span.wants_content(), answer_body(last)) {
                        // A stream's last bytes: its terminal event holds the response.
                        let answer = if body.first() == Some(&b'{') {
                            body
                        } else {
                            traces::terminal_event(body)
                        };
                        span.record_answer(answer);
                    }
                }
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
        let code = error.error.code.as_ref().map(Code::as_str).unwrap_or("");
        match cause {
            Cause::Request => tracing::info!(
                request_id = %self.request_id,
                status = error.status(),
                code,
                "rejected request"
            ),
            Cause::Answer => tracing::warn!(
                request_id = %self.request_id,
                status = error.status(),
                code,
                "answered with an error envelope"
            ),
        }
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

/// The body an answer gives the client: an immediate response's, or a body mutation's.
fn answer_body(answer: &ProcessingResponse) -> Option<&[u8]> {
    use processing_response::Response as R;
    let common = match answer.response.as_ref()? {
        R::ImmediateResponse(i) => return Some(&i.body),
        R::RequestHeaders(h) | R::ResponseHeaders(h) => h.response.as_ref()?,
        R::RequestBody(b) | R::ResponseBody(b) => b.response.as_ref()?,
        _ => return None,
    };
    match common.body_mutation.as_ref()?.mutation.as_ref()? {
        Mutation::Body(b) => Some(b),
        Mutation::StreamedResponse(s) => Some(&s.body),
        _ => None,
    }
}

/// Every header of Envoy's message (those of [`HEADERS_READ`] and [`HEADER_PREFIXES_READ`]).
fn every(h: &HttpHeaders) -> impl Iterator<Item = (&str, &str)> {
    msg::headers(h)
}

/// A header of Envoy's message; only those of [`HEADERS_READ`] are ever sent to us.
fn read<'a>(h: &'a HttpHeaders, name: &str) -> Option<&'a str> {
    debug_assert!(
        HEADERS_READ.contains(&name) || HEADER_PREFIXES_READ.iter().any(|p| name.starts_with(p)),
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
    tracing::debug!(request_id = %request_id, content = %String::from_utf8_lossy(body), "{what}");
}

fn clear_body() -> CommonResponse {
    let mut c = msg::common(Headers::default(), None, false);
    c.body_mutation = Some(BodyMutation {
        mutation: Some(Mutation::ClearBody(true)),
    });
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
    use envoy_types::pb::envoy::service::ext_proc::v3::{
        processing_response::Response as R, CommonResponse, HeaderMutation, HttpBody,
        ImmediateResponse,
    };
    use serde_json::{json, Value};

    struct Fixed;
    impl Environment for Fixed {
        fn now(&self) -> u64 {
            1_700_000_000
        }
        fn id_seed(&self) -> u128 {
            42
        }
    }

    fn session() -> Session<Fixed> {
        Session::new(Arc::new(Settings::default()), Fixed)
    }

    fn headers(pairs: &[(&str, &str)], end_of_stream: bool) -> HttpHeaders {
        HttpHeaders {
            headers: Some(HeaderMap {
                headers: pairs
                    .iter()
                    .map(|(k, v)| HeaderValue {
                        key: (*k).to_owned(),
                        raw_value: v.as_bytes().to_vec(),
                        ..Default::default()
                    })
                    .collect(),
            }),
            end_of_stream,
            ..Default::default()
        }
    }

    fn send(s: &mut Session<Fixed>, r: Request) -> ProcessingResponse {
        let mut answers = s.on_message(ProcessingRequest {
            request: Some(r),
            ..Default::default()
        });
        assert_eq!(answers.len(), 1, "one answer per message");
        answers.remove(0)
    }

    fn post(s: &mut Session<Fixed>, body: Value) -> ProcessingResponse {
        send(
            s,
            Request::RequestHeaders(headers(
                &[(":method", "POST"), (":path", "/v1/responses")],
                false,
            )),
        );
        send(
            s,
            Request::RequestBody(body_msg(body.to_string().as_bytes(), true)),
        )
    }

    fn body_msg(b: &[u8], end_of_stream: bool) -> HttpBody {
        HttpBody {
            body: b.to_vec(),
            end_of_stream,
            ..Default::default()
        }
    }

    fn common(r: &ProcessingResponse) -> &CommonResponse {
        match r.response.as_ref() {
            Some(R::RequestHeaders(h) | R::ResponseHeaders(h)) => h.response.as_ref(),
            Some(R::RequestBody(b) | R::ResponseBody(b)) => b.response.as_ref(),
            _ => None,
        }
        .expect("a common response")
    }

    fn immediate(r: &ProcessingResponse) -> (i32, Value) {
        match r.response.as_ref() {
            Some(R::ImmediateResponse(ImmediateResponse { status, body, .. })) => (
                status.as_ref().map_or(0, |s| s.code),
                serde_json::from_slice(body).expect("JSON error body"),
            ),
            other => panic!("expected an immediate response, got {other:?}"),
        }
    }

    fn set_header<'a>(m: &'a Option<HeaderMutation>, key: &str) -> Option<&'a str> {
        m.as_ref()?
            .set_headers
            .iter()
            .filter_map(|h| h.header.as_ref())
            .find(|h| h.key == key)
            .map(|h| std::str::from_utf8(&h.raw_value).unwrap_or_default())
    }

    fn body_of(c: &CommonResponse) -> &[u8] {
        match c.body_mutation.as_ref().and_then(|b| b.mutation.as_ref()) {
            Some(Mutation::Body(b)) => b,
            _ => &[],
        }
    }

    fn body_mode(r: &ProcessingResponse) -> Option<i32> {
        r.mode_override.as_ref().map(|m| m.response_body_mode)
    }

    #[test]
    fn other_traffic_passes_through_without_body_buffering() {
        for (method, path) in [
            ("GET", "/v1/models"),
            ("POST", "/v1/chat/completions"),
            ("GET", "/v1/responses"),
        ] {
            let mut s = session();
            let r = send(
                &mut s,
                Request::RequestHeaders(headers(&[(":method", method), (":path", path)], false)),
            );
            let mode = r.mode_override.expect("mode override");
            assert_eq!(mode.request_body_mode, BodySendMode::None as i32);
            assert_eq!(mode.response_body_mode, BodySendMode::None as i32);
            assert_eq!(mode.response_header_mode, 2, "response headers skipped");
            assert!(common(&r).header_mutation.is_none());
            assert!(!s.is_translating());
        }
    }

    #[test]
    fn translated_request_rewrites_path_length_model_and_route() {
        let mut s = session();
        let r = post(&mut s, json!({"model": "llama", "input": "hi"}));
        let c = common(&r);
        assert!(c.clear_route_cache);
        assert_eq!(
            set_header(&c.header_mutation, ":path"),
            Some("/v1/chat/completions")
        );
        assert_eq!(
            set_header(&c.header_mutation, "x-responses-model"),
            Some("llama")
        );
        let body = body_of(c);
        assert_eq!(
            set_header(&c.header_mutation, "content-length"),
            Some(body.len().to_string().as_str())
        );
        let chat: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(
            chat,
            json!({"model": "llama", "messages": [{"role": "user", "content": "hi"}]})
        );
    }

    #[test]
    fn query_string_does_not_hide_the_responses_path() {
        let mut s = session();
        let r = send(
            &mut s,
            Request::RequestHeaders(headers(
                &[(":method", "POST"), (":path", "/v1/responses?x=1")],
                false,
            )),
        );
        assert!(r.mode_override.is_none());
        assert!(s.is_translating());
    }

    #[test]
    fn bodiless_and_invalid_requests_get_400_without_upstream() {
        let mut s = session();
        let r = send(
            &mut s,
            Request::RequestHeaders(headers(
                &[(":method", "POST"), (":path", "/v1/responses")],
                true,
            )),
        );
        assert_eq!(immediate(&r).0, 400);

        let mut s = session();
        let (status, body) = immediate(&post(&mut s, json!({"model": "m"})));
        assert_eq!(status, 400);
        assert_eq!(body["error"]["param"], "input");
        assert_eq!(body["error"]["type"], "invalid_request_error");
    }

    #[test]
    fn json_answer_is_buffered_and_translated() {
        let mut s = session();
        post(&mut s, json!({"model": "m", "input": "hi"}));
        let r = send(
            &mut s,
            Request::ResponseHeaders(headers(
                &[
                    (":status", "200"),
                    ("content-type", "application/json"),
                    ("content-length", "99"),
                ],
                false,
            )),
        );
        assert_eq!(body_mode(&r), Some(BodySendMode::BufferedPartial as i32));
        assert_eq!(
            common(&r)
                .header_mutation
                .as_ref()
                .map(|m| m.remove_headers.clone()),
            Some(vec!["content-length".to_owned()])
        );
        let chat = json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "yo"}}]});
        let r = send(
            &mut s,
            Request::ResponseBody(body_msg(chat.to_string().as_bytes(), true)),
        );
        let c = common(&r);
        let out: Value = serde_json::from_slice(body_of(c)).unwrap();
        assert_eq!(out["object"], "response");
        assert_eq!(out["output"][0]["content"][0]["text"], "yo");
        assert_eq!(out["created_at"], 1_700_000_000);
        assert_eq!(
            set_header(&c.header_mutation, "content-length"),
            Some(body_of(c).len().to_string().as_str())
        );
    }

    #[test]
    fn json_answer_over_the_body_cap_is_502_also_in_one_message() {
        let exchange = responses_core::exchange::Settings {
            max_body_bytes: 64,
            ..Default::default()
        };
        let settings = Settings {
            exchange: Arc::new(exchange),
            ..Settings::default()
        };
        let mut s = Session::new(Arc::new(settings), Fixed);
        post(&mut s, json!({"model": "m", "input": "hi"}));
        send(
            &mut s,
            Request::ResponseHeaders(headers(
                &[(":status", "200"), ("content-type", "application/json")],
                false,
            )),
        );
        let chat = json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"content": "x".repeat(100)}}]});
        let (status, body) = immediate(&send(
            &mut s,
            Request::ResponseBody(body_msg(chat.to_string().as_bytes(), true)),
        ));
        assert_eq!(status, 502);
        assert_eq!(body["error"]["code"], "upstream_response_too_large");
    }

    #[test]
    fn an_upstream_error_keeps_its_retry_headers_on_the_immediate_response() {
        let mut s = session();
        post(&mut s, json!({"model": "m", "input": "hi", "stream": true}));
        send(
            &mut s,
            Request::ResponseHeaders(headers(
                &[
                    (":status", "429"),
                    ("content-type", "application/json"),
                    ("retry-after", "1"),
                    ("x-ratelimit-reset-requests", "1s"),
                ],
                false,
            )),
        );
        let r = send(
            &mut s,
            Request::ResponseBody(body_msg(br#"{"error":{"message":"slow down"}}"#, true)),
        );
        let (status, body) = immediate(&r);
        assert_eq!(
            (status, &body["error"]["code"]),
            (429, &json!("rate_limit_exceeded"))
        );
        let Some(R::ImmediateResponse(reply)) = r.response.as_ref() else {
            unreachable!("checked above")
        };
        for (name, value) in [
            ("content-type", "application/json"),
            ("retry-after", "1"),
            ("x-ratelimit-reset-requests", "1s"),
        ] {
            assert_eq!(set_header(&reply.headers, name), Some(value), "{name}");
        }
    }

    #[test]
    fn event_stream_is_translated_chunk_by_chunk() {
        let mut s = session();
        post(&mut s, json!({"model": "m", "input": "hi", "stream": true}));
        let r = send(
            &mut s,
            Request::ResponseHeaders(headers(
                &[(":status", "200"), ("content-type", "text/event-stream")],
                false,
            )),
        );
        assert_eq!(body_mode(&r), Some(BodySendMode::Streamed as i32));
        let c = common(&r);
        assert_eq!(
            set_header(&c.header_mutation, "content-type"),
            Some("text/event-stream")
        );
        assert!(c
            .header_mutation
            .as_ref()
            .unwrap()
            .remove_headers
            .contains(&"content-length".to_owned()));

        let first = send(
            &mut s,
            Request::ResponseBody(body_msg(
                b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"He",
                false,
            )),
        );
        let text = String::from_utf8(body_of(common(&first)).to_vec()).unwrap();
        assert!(text.starts_with("event: response.created\n"));
        assert!(
            !text.contains("output_text.delta"),
            "an incomplete frame is held"
        );
        let second = send(
            &mut s,
            Request::ResponseBody(body_msg(b"llo\"}}]}\n\n", false)),
        );
        let text = String::from_utf8(body_of(common(&second)).to_vec()).unwrap();
        assert!(text.contains("\"delta\":\"Hello\""));
        let end = send(&mut s, Request::ResponseBody(body_msg(b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n", true)));
        let text = String::from_utf8(body_of(common(&end)).to_vec()).unwrap();
        assert!(text.contains("event: response.completed\n"));
        assert!(text.ends_with("data: [DONE]\n\n"));
    }

    #[test]
    fn upstream_errors_become_envelopes_with_their_status() {
        let mut s = session();
        post(&mut s, json!({"model": "m", "input": "hi"}));
        let r = send(
            &mut s,
            Request::ResponseHeaders(headers(
                &[(":status", "429"), ("content-type", "application/json")],
                false,
            )),
        );
        assert_eq!(body_mode(&r), Some(BodySendMode::BufferedPartial as i32));
        let r = send(
            &mut s,
            Request::ResponseBody(body_msg(
                br#"{"error":{"message":"busy","code":"rate"}}"#,
                true,
            )),
        );
        let (status, body) = immediate(&r);
        assert_eq!(status, 429);
        assert_eq!(body["error"]["message"], "busy");
        assert_eq!(body["error"]["type"], "rate_limit_error");
    }

    #[test]
    fn stream_requested_but_json_answered_is_502() {
        let mut s = session();
        post(&mut s, json!({"model": "m", "input": "hi", "stream": true}));
        send(
            &mut s,
            Request::ResponseHeaders(headers(
                &[(":status", "200"), ("content-type", "application/json")],
                false,
            )),
        );
        let r = send(
            &mut s,
            Request::ResponseBody(body_msg(b"{\"choices\":[]}", true)),
        );
        let (status, body) = immediate(&r);
        assert_eq!(status, 502);
        assert_eq!(body["error"]["code"], "upstream_invalid_response");
    }

    #[test]
    fn envoy_local_replies_are_not_translated() {
        // 413 before the body reached us: the upstream was never called.
        let mut s = session();
        send(
            &mut s,
            Request::RequestHeaders(headers(
                &[(":method", "POST"), (":path", "/v1/responses")],
                false,
            )),
        );
        send(
            &mut s,
            Request::ResponseHeaders(headers(
                &[(":status", "413"), ("content-type", "text/plain")],
                false,
            )),
        );
        let (status, body) = immediate(&send(
            &mut s,
            Request::ResponseBody(body_msg(b"Payload Too Large", true)),
        ));
        assert_eq!(status, 413);
        assert_eq!(body["error"]["code"], "request_too_large");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert!(
            !body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("upstream"),
            "the upstream never saw this request: {body}"
        );

        // 503 with no body at all, after forwarding.
        let mut s = session();
        post(&mut s, json!({"model": "m", "input": "hi", "stream": true}));
        let r = send(
            &mut s,
            Request::ResponseHeaders(headers(&[(":status", "503")], true)),
        );
        let (status, body) = immediate(&r);
        assert_eq!(status, 503);
        assert_eq!(body["error"]["type"], "server_error");
    }

    #[test]
    fn full_duplex_mode_answers_with_streamed_responses_and_ends_on_trailers() {
        use envoy_types::pb::envoy::service::ext_proc::v3::StreamedBodyResponse;
        let settings = Settings {
            stream_body_mode: StreamBodyMode::FullDuplexStreamed,
            ..Settings::default()
        };
        let mut s = Session::new(Arc::new(settings), Fixed);
        post(&mut s, json!({"model": "m", "input": "hi", "stream": true}));
        let r = send(
            &mut s,
            Request::ResponseHeaders(headers(
                &[(":status", "200"), ("content-type", "text/event-stream")],
                false,
            )),
        );
        let mode = r.mode_override.expect("mode override");
        assert_eq!(
            mode.response_body_mode,
            BodySendMode::FullDuplexStreamed as i32
        );
        assert_eq!(
            mode.response_trailer_mode, 1,
            "trailers are sent in full duplex"
        );
        let streamed = |r: &ProcessingResponse| match common(r)
            .body_mutation
            .as_ref()
            .and_then(|b| b.mutation.as_ref())
        {
            Some(Mutation::StreamedResponse(StreamedBodyResponse {
                body,
                end_of_stream,
                ..
            })) => (String::from_utf8(body.clone()).unwrap(), *end_of_stream),
            other => panic!("expected a streamed response, got {other:?}"),
        };
        let r = send(&mut s, Request::ResponseBody(body_msg(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\n", false)));
        let (text, eos) = streamed(&r);
        assert!(text.contains("\"delta\":\"Hi\"") && !eos);
        let answers = s.on_message(ProcessingRequest {
            request: Some(Request::ResponseTrailers(Default::default())),
            ..Default::default()
        });
        assert_eq!(answers.len(), 2, "the last events, then the trailers");
        let (text, eos) = streamed(&answers[0]);
        assert!(
            eos && text.contains("event: response.completed") && text.ends_with("data: [DONE]\n\n")
        );
        assert!(matches!(answers[1].response, Some(R::ResponseTrailers(_))));
    }

    #[test]
    fn empty_event_stream_ends_with_a_failed_response() {
        let mut s = session();
        post(&mut s, json!({"model": "m", "input": "hi", "stream": true}));
        let r = send(
            &mut s,
            Request::ResponseHeaders(headers(
                &[(":status", "200"), ("content-type", "text/event-stream")],
                true,
            )),
        );
        let c = common(&r);
        assert_eq!(c.status, ResponseStatus::ContinueAndReplace as i32);
        let text = String::from_utf8(body_of(c).to_vec()).unwrap();
        assert!(text.contains("event: response.failed\n"));
        assert!(text.ends_with("data: [DONE]\n\n"));
    }

    /// The headers in each `forward_rules.allowed_headers` block of a config (a prefix pattern
    /// as `prefix <value>`).
    fn forwarded(config: &str) -> Vec<Vec<String>> {
        let mut blocks = Vec::new();
        let mut lines = config.lines();
        while let Some(line) = lines.next() {
            if line.trim() != "forward_rules:" {
                continue;
            }
            let indent = line.len() - line.trim_start().len();
            let block = lines
                .by_ref()
                .take_while(|l| l.len() - l.trim_start().len() > indent)
                .filter_map(|l| {
                    let l = l.trim();
                    let exact = l.strip_prefix("- exact: ").map(|v| ("", v));
                    exact.or_else(|| l.strip_prefix("- prefix: ").map(|v| ("prefix ", v)))
                })
                .map(|(kind, v)| format!("{kind}{}", v.trim_matches('"')))
                .collect();
            blocks.push(block);
        }
        blocks
    }

    /// Envoy forwards exactly the headers the processor reads, in every shipped config that
    /// defines the filter (the examples and the Kubernetes ConfigMaps are checked against
    /// envoy/envoy.yaml by their own tests).
    #[test]
    fn envoy_forwards_exactly_the_headers_read() {
        let mut expected: Vec<String> = HEADERS_READ.iter().map(|h| h.to_string()).collect();
        expected.extend(HEADER_PREFIXES_READ.iter().map(|p| format!("prefix {p}")));
        expected.sort();
        for (name, config, blocks) in [
            (
                "envoy/envoy.yaml",
                include_str!("../../envoy/envoy.yaml"),
                1,
            ),
            (
                "deploy/istio/envoyfilter.yaml",
                include_str!("../../deploy/istio/envoyfilter.yaml"),
                2,
            ),
        ] {
            let found = forwarded(config);
            assert_eq!(found.len(), blocks, "{name}: forward_rules blocks");
            for mut block in found {
                block.sort();
                assert_eq!(block, expected, "{name}");
            }
        }
    }

    #[test]
    fn the_last_answer_carries_the_summary_as_envoy_metadata() {
        use envoy_types::pb::google::protobuf::value::Kind;
        let mut s = session();
        let r = post(&mut s, json!({"model": "m", "input": "hi"}));
        assert!(r.dynamic_metadata.is_none(), "not before the end");
        send(
            &mut s,
            Request::ResponseHeaders(headers(
                &[(":status", "200"), ("content-type", "application/json")],
                false,
            )),
        );
        let chat = json!({"model": "llama-3", "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"content": "yo"}}], "usage": {"prompt_tokens": 11, "completion_tokens": 7,
            "total_tokens": 18, "prompt_tokens_details": {"cached_tokens": 3}}});
        let r = send(
            &mut s,
            Request::ResponseBody(body_msg(chat.to_string().as_bytes(), true)),
        );
        let md = r.dynamic_metadata.expect("metadata at the end");
        let Some(Kind::StructValue(ns)) = md.fields[METADATA_NAMESPACE].kind.clone() else {
            panic!("a struct under {METADATA_NAMESPACE}");
        };
        let get = |k: &str| ns.fields.get(k).and_then(|v| v.kind.clone());
        assert_eq!(get("input_tokens"), Some(Kind::NumberValue(11.0)));
        assert_eq!(get("output_tokens"), Some(Kind::NumberValue(7.0)));
        assert_eq!(get("total_tokens"), Some(Kind::NumberValue(18.0)));
        assert_eq!(get("cached_tokens"), Some(Kind::NumberValue(3.0)));
        assert_eq!(get("reasoning_tokens"), Some(Kind::NumberValue(0.0)));
        assert_eq!(get("model"), Some(Kind::StringValue("m".into())));
        assert_eq!(
            get("upstream_model"),
            Some(Kind::StringValue("llama-3".into()))
        );
        assert_eq!(get("outcome"), Some(Kind::StringValue("translated".into())));
        assert_eq!(get("operation"), Some(Kind::StringValue("create".into())));
        assert_eq!(get("status"), Some(Kind::NumberValue(200.0)));
        assert!(
            matches!(get("response_id"), Some(Kind::StringValue(id)) if id.starts_with("resp_"))
        );

        // A rejected request too, with its error code.
        let mut s = session();
        let r = post(&mut s, json!({"model": "m"}));
        let md = r.dynamic_metadata.expect("metadata on the rejection");
        let Some(Kind::StructValue(ns)) = md.fields[METADATA_NAMESPACE].kind.clone() else {
            panic!("a struct");
        };
        assert_eq!(
            ns.fields["outcome"].kind,
            Some(Kind::StringValue("failed".into()))
        );
        assert_eq!(ns.fields["status"].kind, Some(Kind::NumberValue(400.0)));
    }

    mod fail_closed {
        //! For any sequence of Envoy messages and sizes, once a request is ours no answer
        //! lets untranslated bytes pass.
        use super::*;
        use proptest::prelude::*;

        /// One message Envoy could send, with small sizes around small caps.
        #[derive(Debug, Clone)]
        enum Msg {
            RequestBody {
                body: Vec<u8>,
                eos: bool,
            },
            ResponseHeaders {
                status: u16,
                content_type: &'static str,
                eos: bool,
            },
            ResponseBody {
                body: Vec<u8>,
                eos: bool,
            },
            ResponseTrailers,
        }

        fn body() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                Just(br#"{"model":"m","input":"hi"}"#.to_vec()),
                Just(br#"{"model":"m","input":"hi","stream":true}"#.to_vec()),
                Just(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n".to_vec()),
                Just(b"data: [DONE]\n\n".to_vec()),
                Just(br#"{"choices":[{"index":0,"finish_reason":"stop","message":{"content":"yo"}}]}"#.to_vec()),
                proptest::collection::vec(any::<u8>(), 0..600),
            ]
        }

        fn msg() -> impl Strategy<Value = Msg> {
            prop_oneof![
                (body(), any::<bool>()).prop_map(|(body, eos)| Msg::RequestBody { body, eos }),
                (
                    prop_oneof![Just(200u16), Just(413), Just(429), Just(500), Just(503)],
                    prop_oneof![
                        Just("application/json"),
                        Just("text/event-stream"),
                        Just("text/plain"),
                        Just("")
                    ],
                    any::<bool>()
                )
                    .prop_map(|(status, content_type, eos)| Msg::ResponseHeaders {
                        status,
                        content_type,
                        eos
                    }),
                (body(), any::<bool>()).prop_map(|(body, eos)| Msg::ResponseBody { body, eos }),
                Just(Msg::ResponseTrailers),
            ]
        }

        fn small_caps(full_duplex: bool) -> Settings {
            let exchange = responses_core::exchange::Settings {
                max_body_bytes: 256,
                options: responses_core::translate::Options {
                    max_request_bytes: 256,
                    max_output_bytes: 256,
                    max_sse_frame_bytes: 128,
                    ..Default::default()
                },
                ..Default::default()
            };
            Settings {
                exchange: Arc::new(exchange),
                log_content: false,
                stream_body_mode: if full_duplex {
                    StreamBodyMode::FullDuplexStreamed
                } else {
                    StreamBodyMode::Streamed
                },
                // Recorded too: no message sequence may upset the metrics either.
                metrics: Some(Arc::new(crate::metrics::Metrics::new(Default::default()))),
                traces: None,
            }
        }

        /// An answer to a body message that leaves the original bytes in place.
        fn passes_body(r: &ProcessingResponse) -> bool {
            match r.response.as_ref() {
                Some(R::ImmediateResponse(_)) | Some(R::ResponseTrailers(_)) => false,
                Some(R::RequestBody(b) | R::ResponseBody(b)) => {
                    b.response.as_ref().is_none_or(|c| {
                        c.body_mutation
                            .as_ref()
                            .and_then(|m| m.mutation.as_ref())
                            .is_none()
                    })
                }
                _ => true,
            }
        }

        /// An answer to a response head that lets its body pass unread.
        fn passes_head(r: &ProcessingResponse) -> bool {
            match r.response.as_ref() {
                Some(R::ImmediateResponse(_)) => false,
                Some(R::ResponseHeaders(h)) => {
                    let replaced = h
                        .response
                        .as_ref()
                        .is_some_and(|c| c.status == ResponseStatus::ContinueAndReplace as i32);
                    let read = r.mode_override.as_ref().is_some_and(|m| {
                        m.response_body_mode != BodySendMode::None as i32
                            && m.response_body_mode != BodySendMode::Buffered as i32
                    });
                    !replaced && !read
                }
                _ => true,
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]
            #[test]
            fn prop_nothing_untranslated_passes(
                skip_headers in any::<bool>(),
                full_duplex in any::<bool>(),
                msgs in proptest::collection::vec(msg(), 0..12),
            ) {
                let mut s = Session::new(Arc::new(small_caps(full_duplex)), Fixed);
                if !skip_headers {
                    let r = send(&mut s, Request::RequestHeaders(headers(
                        &[(":method", "POST"), (":path", "/v1/responses?x=1")], false)));
                    // The request body must still come to us.
                    prop_assert!(r.mode_override.as_ref().is_none_or(|m| m.request_body_mode != BodySendMode::None as i32));
                }
                let mut ended = false;
                for m in msgs {
                    if ended {
                        break;
                    }
                    let (request, is_head) = match m.clone() {
                        Msg::RequestBody { body, eos } => (Request::RequestBody(body_msg(&body, eos)), false),
                        Msg::ResponseHeaders { status, content_type, eos } => {
                            let status = status.to_string();
                            let mut h = vec![(":status", status.as_str())];
                            if !content_type.is_empty() {
                                h.push(("content-type", content_type));
                            }
                            (Request::ResponseHeaders(headers(&h, eos)), true)
                        }
                        Msg::ResponseBody { body, eos } => (Request::ResponseBody(body_msg(&body, eos)), false),
                        Msg::ResponseTrailers => (Request::ResponseTrailers(Default::default()), false),
                    };
                    let answers = s.on_message(ProcessingRequest { request: Some(request), ..Default::default() });
                    prop_assert!(!answers.is_empty(), "every message is answered: {m:?}");
                    for a in &answers {
                        if matches!(a.response, Some(R::ImmediateResponse(_))) {
                            ended = true;
                        }
                    }
                    if is_head {
                        prop_assert!(!passes_head(&answers[0]), "{m:?} -> {:?}", answers[0]);
                    } else if !matches!(m, Msg::ResponseTrailers) {
                        prop_assert!(!passes_body(&answers[0]), "{m:?} -> {:?}", answers[0]);
                    }
                }
                // And a transport failure at any point still ends in an envelope or nothing.
                for a in s.on_failure(true) {
                    prop_assert!(!passes_body(&a) || matches!(a.response, Some(R::ImmediateResponse(_))));
                }
            }
        }
    }
}
