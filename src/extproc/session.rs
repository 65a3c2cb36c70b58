//! One HTTP exchange as Envoy reports it: a synchronous state machine from ext_proc
//! messages to ext_proc answers, around the translation core.
//!
//! Envoy sends, per request: request headers → request body (BUFFERED) → response headers →
//! response body (mode chosen by us on the response headers). Each message gets exactly one
//! answer. The session never blocks and never waits for more input than Envoy sends.

use std::sync::Arc;

use bytes::BytesMut;
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::processing_mode::BodySendMode;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation::Mutation, common_response::ResponseStatus, processing_request::Request,
    BodyMutation, HttpBody, HttpHeaders, ProcessingRequest, ProcessingResponse,
};

use super::messages::{self as msg, header, Headers};
use super::Settings;
use crate::config::StreamBodyMode;
use crate::openresponses::ApiError;
use crate::translate::{self, response, stream::StreamTranslator, Exchange, Meta};

/// What the caller provides for each request: the clock and fresh randomness.
pub trait Environment {
    fn now(&self) -> u64;
    fn id_seed(&self) -> u128;
}

/// The real clock and OS randomness.
#[derive(Debug, Clone, Copy, Default)]
pub struct System;

impl Environment for System {
    fn now(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    fn id_seed(&self) -> u128 {
        uuid::Uuid::new_v4().as_u128()
    }
}

#[derive(Debug)]
enum State {
    /// Waiting for the request headers.
    Start,
    /// Not ours: Envoy was told to stop sending us this exchange.
    PassThrough,
    /// A `POST /v1/responses` whose body is on its way.
    RequestBody { body: BytesMut },
    /// Translated and sent upstream; waiting for the answer's headers.
    Forwarded(Box<Exchange>),
    /// A 2xx JSON answer to translate, buffered.
    Json {
        exchange: Box<Exchange>,
        body: BytesMut,
    },
    /// Not a usable answer (error status, Envoy local reply, wrong content type): its body is
    /// read for a message, then replaced by an error envelope.
    Error {
        status: u16,
        expected_stream: bool,
        /// Envoy answered before forwarding the request (413 over its buffer limit...): the
        /// upstream never saw it.
        local: bool,
        body: BytesMut,
    },
    /// An SSE answer being translated chunk by chunk.
    Stream(Box<StreamTranslator>),
    /// Our answer is complete; anything else Envoy sends is acknowledged unchanged.
    Done,
}

/// One HTTP request/response exchange.
#[derive(Debug)]
pub struct Session<E = System> {
    settings: Arc<Settings>,
    env: E,
    state: State,
    /// `x-request-id`, for logs.
    request_id: String,
}

impl<E: Environment> Session<E> {
    pub fn new(settings: Arc<Settings>, env: E) -> Self {
        Session {
            settings,
            env,
            state: State::Start,
            request_id: String::new(),
        }
    }

    /// Whether this exchange is being translated (for metrics and tests).
    pub fn is_translating(&self) -> bool {
        !matches!(self.state, State::Start | State::PassThrough)
    }

    /// Whether a translated exchange still owes the client (part of) its answer. If Envoy
    /// ends the gRPC stream now, the client did not get a complete answer.
    pub fn is_unfinished(&self) -> bool {
        !matches!(self.state, State::Start | State::PassThrough | State::Done)
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
        match req {
            Request::RequestHeaders(h) => vec![self.on_request_headers(&h)],
            Request::RequestBody(b) => vec![self.on_request_body(b)],
            Request::ResponseHeaders(h) => vec![self.on_response_headers(&h)],
            Request::ResponseBody(b) => vec![self.on_response_body(b)],
            Request::RequestTrailers(_) => vec![msg::request_trailers()],
            Request::ResponseTrailers(_) => self.on_response_trailers(),
        }
    }

    /// In FULL_DUPLEX_STREAMED mode trailers may be what ends the upstream body: finish the
    /// stream (its last events, end_of_stream), then let the trailers pass.
    fn on_response_trailers(&mut self) -> Vec<ProcessingResponse> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Stream(mut translator) => {
                let out = translator.finish(self.env.now()).to_vec();
                vec![msg::streamed_body(out, true), msg::response_trailers()]
            }
            other => {
                self.state = other;
                vec![msg::response_trailers()]
            }
        }
    }

    fn on_request_headers(&mut self, h: &HttpHeaders) -> ProcessingResponse {
        self.request_id = header(h, "x-request-id").unwrap_or_default().to_owned();
        let method = header(h, ":method").unwrap_or_default();
        let path = header(h, ":path").unwrap_or_default();
        let path = path.split('?').next().unwrap_or_default();
        if method != "POST" || path != self.settings.responses_path {
            self.state = State::PassThrough;
            return msg::request_headers(
                msg::common(Headers::default(), None, false),
                Some(msg::pass_through_mode()),
            );
        }
        if h.end_of_stream {
            self.state = State::Done;
            let err = ApiError::invalid_body(
                "The request has no body. Send a JSON object with 'model' and 'input'.",
            )
            .with_code("missing_body");
            return msg::error_reply(&err, "responses_extproc_invalid_request");
        }
        self.state = State::RequestBody {
            body: BytesMut::new(),
        };
        // The upstream must answer in plain bytes we can parse.
        msg::request_headers(
            msg::common(Headers::default().remove("accept-encoding"), None, false),
            None,
        )
    }

    fn on_request_body(&mut self, b: HttpBody) -> ProcessingResponse {
        let State::RequestBody { body } = &mut self.state else {
            return msg::request_body(msg::common(Headers::default(), None, false));
        };
        if !b.end_of_stream {
            // Only with a STREAMED request mode (we configure BUFFERED): gather and hold back.
            if body.len() + b.body.len() > self.settings.max_body_bytes {
                self.state = State::Done;
                return msg::error_reply(&too_large(), "responses_extproc_invalid_request");
            }
            body.extend_from_slice(&b.body);
            return msg::request_body(clear_body());
        }
        let full = if body.is_empty() {
            b.body
        } else {
            body.extend_from_slice(&b.body);
            std::mem::take(body).to_vec()
        };
        let meta = Meta {
            now: self.env.now(),
            id_seed: self.env.id_seed(),
        };
        self.log_content("client request", &full);
        match translate::translate_request(&full, &self.settings.options, meta) {
            Ok(t) => {
                self.log_content("upstream request", &t.body);
                tracing::info!(
                    request_id = %self.request_id,
                    response_id = %t.exchange.id(),
                    model = %t.exchange.model(),
                    stream = t.exchange.is_stream(),
                    body_bytes = t.body.len(),
                    "translated request"
                );
                let headers = Headers::default()
                    .set(":path", self.settings.chat_path.clone())
                    .set("content-type", "application/json")
                    .set("content-length", t.body.len().to_string())
                    .set(&self.settings.model_header, t.exchange.model().to_owned());
                self.state = State::Forwarded(Box::new(t.exchange));
                msg::request_body(msg::common(headers, Some(t.body.to_vec()), true))
            }
            Err(err) => {
                tracing::info!(
                    request_id = %self.request_id,
                    status = err.status,
                    param = err.param.as_deref().unwrap_or(""),
                    code = err.code.as_deref().unwrap_or(""),
                    "rejected request"
                );
                self.state = State::Done;
                msg::error_reply(&err, "responses_extproc_invalid_request")
            }
        }
    }

    fn on_response_headers(&mut self, h: &HttpHeaders) -> ProcessingResponse {
        let status: u16 = header(h, ":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let content_type = header(h, "content-type")
            .unwrap_or_default()
            .to_ascii_lowercase();
        let state = std::mem::replace(&mut self.state, State::Done);
        let exchange = match state {
            State::Forwarded(ex) => ex,
            // Envoy answered before the request reached the upstream (413, 503...): never
            // translate what the upstream did not send.
            State::RequestBody { .. } => {
                return self.error_headers(status, false, true, h.end_of_stream);
            }
            other => {
                self.state = other;
                return msg::response_headers(msg::common(Headers::default(), None, false), None);
            }
        };
        let success = (200..300).contains(&status);
        let is_sse = content_type.starts_with("text/event-stream");
        tracing::debug!(request_id = %self.request_id, status, content_type = %content_type, "upstream answered");
        if !success || exchange.is_stream() != is_sse {
            return self.error_headers(status, exchange.is_stream(), false, h.end_of_stream);
        }
        if exchange.is_stream() {
            let mut translator = Box::new(StreamTranslator::new(*exchange));
            let headers = Headers::default()
                .set("content-type", "text/event-stream")
                .set("cache-control", "no-cache")
                .remove("content-length");
            if h.end_of_stream {
                // A stream with no body at all: answer the whole (failed) event stream now.
                let body = translator.finish(self.env.now()).to_vec();
                return msg::response_headers(replace_body(headers, body), None);
            }
            self.state = State::Stream(translator);
            let mode = match self.settings.stream_body_mode {
                StreamBodyMode::Streamed => BodySendMode::Streamed,
                StreamBodyMode::FullDuplexStreamed => BodySendMode::FullDuplexStreamed,
            };
            return msg::response_headers(
                msg::common(headers, None, false),
                Some(msg::response_body_mode(mode)),
            );
        }
        if h.end_of_stream {
            return self.error_headers(502, false, false, true);
        }
        self.state = State::Json {
            exchange,
            body: BytesMut::new(),
        };
        msg::response_headers(
            msg::common(Headers::default().remove("content-length"), None, false),
            Some(msg::response_body_mode(BodySendMode::Buffered)),
        )
    }

    /// The answer is not translatable: read its body (if any) for a message, then reply
    /// with an error envelope.
    fn error_headers(
        &mut self,
        status: u16,
        expected_stream: bool,
        local: bool,
        end_of_stream: bool,
    ) -> ProcessingResponse {
        if end_of_stream {
            self.state = State::Done;
            let err = error_for(status, expected_stream, local, b"");
            log_upstream_error(&self.request_id, &err);
            return msg::error_reply(&err, "responses_extproc_upstream_error");
        }
        self.state = State::Error {
            status,
            expected_stream,
            local,
            body: BytesMut::new(),
        };
        msg::response_headers(
            msg::common(Headers::default(), None, false),
            Some(msg::response_body_mode(BodySendMode::Buffered)),
        )
    }

    fn on_response_body(&mut self, b: HttpBody) -> ProcessingResponse {
        let now = self.env.now();
        let eos = b.end_of_stream;
        match std::mem::replace(&mut self.state, State::Done) {
            State::Stream(mut translator) => {
                self.log_content("upstream chunk", &b.body);
                let mut out = BytesMut::from(translator.push(&b.body, now));
                if eos {
                    out.extend_from_slice(&translator.finish(now));
                    tracing::info!(
                        request_id = %self.request_id,
                        events = translator.event_count(),
                        "stream translated"
                    );
                } else {
                    self.state = State::Stream(translator);
                }
                match self.settings.stream_body_mode {
                    StreamBodyMode::Streamed => msg::response_body(msg::common(
                        Headers::default(),
                        Some(out.to_vec()),
                        false,
                    )),
                    StreamBodyMode::FullDuplexStreamed => msg::streamed_body(out.to_vec(), eos),
                }
            }
            State::Json { exchange, body } if !eos => match self.gather(body, &b.body) {
                Ok(body) => {
                    self.state = State::Json { exchange, body };
                    msg::response_body(clear_body())
                }
                Err(reply) => *reply,
            },
            State::Error {
                status,
                expected_stream,
                local,
                body,
            } if !eos => match self.gather(body, &b.body) {
                Ok(body) => {
                    self.state = State::Error {
                        status,
                        expected_stream,
                        local,
                        body,
                    };
                    msg::response_body(clear_body())
                }
                Err(reply) => *reply,
            },
            State::Json { exchange, body } => {
                // The cap holds for the last message too: with the BUFFERED mode we ask for,
                // Envoy hands over the whole answer in this one message (`end_of_stream`), so
                // checking only the earlier chunks would never apply --max-body-bytes.
                let body = match self.gather(body, &b.body) {
                    Ok(body) => body,
                    Err(reply) => return *reply,
                };
                self.log_content("upstream answer", &body);
                match response::completion(&exchange, &body, now) {
                    Ok(out) => {
                        tracing::info!(request_id = %self.request_id, response_id = %exchange.id(), "response translated");
                        let headers = Headers::default()
                            .set("content-type", "application/json")
                            .set("content-length", out.len().to_string());
                        msg::response_body(msg::common(headers, Some(out.to_vec()), false))
                    }
                    Err(err) => {
                        log_upstream_error(&self.request_id, &err);
                        msg::error_reply(&err, "responses_extproc_upstream_error")
                    }
                }
            }
            State::Error {
                status,
                expected_stream,
                local,
                mut body,
            } => {
                body.extend_from_slice(&b.body);
                let err = error_for(status, expected_stream, local, &body);
                log_upstream_error(&self.request_id, &err);
                msg::error_reply(&err, "responses_extproc_upstream_error")
            }
            other => {
                self.state = other;
                msg::response_body(msg::common(Headers::default(), None, false))
            }
        }
    }

    /// Logs a body only when the operator asked for content logging (`--log-content`).
    fn log_content(&self, what: &str, body: &[u8]) {
        if self.settings.log_content {
            tracing::debug!(request_id = %self.request_id, content = %String::from_utf8_lossy(body), "{what}");
        }
    }

    /// Adds a chunk of a buffered upstream answer, within the body cap.
    fn gather(
        &self,
        mut body: BytesMut,
        chunk: &[u8],
    ) -> Result<BytesMut, Box<ProcessingResponse>> {
        if body.len() + chunk.len() > self.settings.max_body_bytes {
            let err = ApiError::server(
                502,
                "upstream_response_too_large",
                "The upstream answer exceeded this server's size limit.",
            );
            log_upstream_error(&self.request_id, &err);
            return Err(Box::new(msg::error_reply(
                &err,
                "responses_extproc_upstream_error",
            )));
        }
        body.extend_from_slice(chunk);
        Ok(body)
    }
}

/// The error envelope for an answer we cannot translate. `local`: Envoy answered before the
/// request was forwarded.
fn error_for(status: u16, expected_stream: bool, local: bool, body: &[u8]) -> ApiError {
    if local {
        return local_reply_error(status, body);
    }
    if (200..300).contains(&status) {
        let what = if expected_stream {
            "a stream was requested but the upstream did not answer with text/event-stream"
        } else {
            "a JSON answer was expected but the upstream answered with an event stream"
        };
        return ApiError::server(
            502,
            "upstream_invalid_response",
            format!("The upstream answer cannot be translated: {what}."),
        );
    }
    response::upstream_error(status, body)
}

/// Envoy's own reply to a request it never forwarded (413 when the body is over its buffer
/// limit, ...). Why not `response::upstream_error`: its message says "The upstream answered
/// with HTTP status 413", which sends the client (and the operator reading the envelope) to
/// look at the model server, which never saw the request. The status and code are kept.
fn local_reply_error(status: u16, body: &[u8]) -> ApiError {
    if status == 413 {
        return too_large();
    }
    let mut err = response::upstream_error(status, body);
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    err.message = if text.is_empty() || text.len() > 512 {
        format!("Envoy answered with HTTP status {status} before the request was forwarded.")
    } else {
        format!("Envoy answered with HTTP status {status} before the request was forwarded: {text}")
    };
    err
}

fn log_upstream_error(request_id: &str, err: &ApiError) {
    tracing::warn!(
        request_id = %request_id,
        status = err.status,
        code = err.code.as_deref().unwrap_or(""),
        "answered with an error envelope"
    );
}

fn too_large() -> ApiError {
    ApiError::invalid_body("The request body is larger than this server accepts.")
        .with_status(413)
        .with_code("request_too_large")
}

fn clear_body() -> envoy_types::pb::envoy::service::ext_proc::v3::CommonResponse {
    let mut c = msg::common(Headers::default(), None, false);
    c.body_mutation = Some(BodyMutation {
        mutation: Some(Mutation::ClearBody(true)),
    });
    c
}

/// A headers answer that also sets the whole body (for answers that have none).
fn replace_body(
    headers: Headers,
    body: Vec<u8>,
) -> envoy_types::pb::envoy::service::ext_proc::v3::CommonResponse {
    let mut c = msg::common(headers, Some(body), false);
    c.status = ResponseStatus::ContinueAndReplace as i32;
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
    use envoy_types::pb::envoy::service::ext_proc::v3::{
        processing_response::Response as R, CommonResponse, HeaderMutation, ImmediateResponse,
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
        assert_eq!(body_mode(&r), Some(BodySendMode::Buffered as i32));
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
        let settings = Settings {
            max_body_bytes: 64,
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
        assert_eq!(body_mode(&r), Some(BodySendMode::Buffered as i32));
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
}
