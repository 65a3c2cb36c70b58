//! An exchange's answer: the upstream's head decides (stream, gather or reply), its body is
//! translated as it comes or gathered and answered whole, and every way it can end.

use super::*;

use bytes::{Bytes, BytesMut};

use crate::openresponses::{ApiError, ErrorCode, Events};
use crate::translate::stream::StreamTranslator;
use crate::translate::{compact, response};
use crate::upstream_failure::{self};

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

impl Exchange {
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

    /// The whole answer is here: translate it, or make its error envelope.
    fn gathered(&mut self, why: Gather, body: &[u8], now: u64) -> Reply {
        self.state = State::Done;
        match why {
            Gather::Json(ex) => {
                let completed = if ex.is_compact() {
                    compact::answer(&ex, body)
                } else {
                    response::translate_completion(&ex, body, now)
                };
                match completed {
                    Ok(out) => {
                        self.summary.usage = out.usage;
                        self.summary.upstream_model = out.upstream_model;
                        self.summary.finish_reason = out.finish_reason;
                        self.translated(200, out.body)
                    }
                    Err(err) => Reply::Error(self.fail(err)),
                }
            }
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
