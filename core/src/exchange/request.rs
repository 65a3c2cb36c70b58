//! An exchange's request: the client's body read (in pieces, decoded, off the event loop
//! when costly), translated, and forwarded as the upstream's Chat request.

use super::*;
use std::sync::Arc;

use bytes::Bytes;

use crate::openresponses::{ApiError, ErrorCode};
use crate::request_encoding::Decoder;
use crate::translate::request::Window;
use crate::translate::seal::Tenant;
use crate::translate::{self, compact, Meta, Options};

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
pub(super) fn options_for<'s>(
    settings: &'s Settings,
    tenant: &Tenant,
) -> std::borrow::Cow<'s, Options> {
    if *tenant == settings.options.tenant {
        return std::borrow::Cow::Borrowed(&settings.options);
    }
    let mut options = settings.options.clone();
    options.tenant = tenant.clone();
    std::borrow::Cow::Owned(options)
}

impl Exchange {
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

    pub(super) fn forward(
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
}

pub(super) fn request_too_large(limit: usize) -> ApiError {
    ApiError::invalid_body(format!(
        "The request body is larger than this server accepts (--max-request-bytes, {limit} bytes)."
    ))
    .with_status(413)
    .with_code(ErrorCode::RequestTooLarge)
}
