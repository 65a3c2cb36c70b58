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

    /// Answers one message from Envoy. `None` for messages that need no answer.
    pub fn on_message(&mut self, req: ProcessingRequest) -> Option<ProcessingResponse> {
        match req.request? {
            Request::RequestHeaders(h) => Some(self.on_request_headers(&h)),
            Request::RequestBody(b) => Some(self.on_request_body(b)),
            Request::ResponseHeaders(h) => Some(self.on_response_headers(&h)),
            Request::ResponseBody(b) => Some(self.on_response_body(b)),
            Request::RequestTrailers(_) => Some(msg::request_trailers()),
            Request::ResponseTrailers(_) => Some(msg::response_trailers()),
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
        match translate::translate_request(&full, &self.settings.options, meta) {
            Ok(t) => {
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
                return self.error_headers(status, false, h.end_of_stream);
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
            return self.error_headers(status, exchange.is_stream(), h.end_of_stream);
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
            return msg::response_headers(
                msg::common(headers, None, false),
                Some(msg::response_body_mode(BodySendMode::Streamed)),
            );
        }
        if h.end_of_stream {
            return self.error_headers(502, false, true);
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
        end_of_stream: bool,
    ) -> ProcessingResponse {
        if end_of_stream {
            self.state = State::Done;
            let err = error_for(status, expected_stream, b"");
            log_upstream_error(&self.request_id, &err);
            return msg::error_reply(&err, "responses_extproc_upstream_error");
        }
        self.state = State::Error {
            status,
            expected_stream,
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
                msg::response_body(msg::common(Headers::default(), Some(out.to_vec()), false))
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
                body,
            } if !eos => match self.gather(body, &b.body) {
                Ok(body) => {
                    self.state = State::Error {
                        status,
                        expected_stream,
                        body,
                    };
                    msg::response_body(clear_body())
                }
                Err(reply) => *reply,
            },
            State::Json { exchange, mut body } => {
                body.extend_from_slice(&b.body);
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
                mut body,
            } => {
                body.extend_from_slice(&b.body);
                let err = error_for(status, expected_stream, &body);
                log_upstream_error(&self.request_id, &err);
                msg::error_reply(&err, "responses_extproc_upstream_error")
            }
            other => {
                self.state = other;
                msg::response_body(msg::common(Headers::default(), None, false))
            }
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

/// The error envelope for an answer we cannot translate.
fn error_for(status: u16, expected_stream: bool, body: &[u8]) -> ApiError {
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
