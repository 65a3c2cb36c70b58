//! One HTTP exchange as Envoy's filter hooks report it: a thin driver of
//! [`exchange::Exchange`], which makes every decision; this file only maps those decisions to
//! what Envoy does with headers and bodies (the [`Host`]), as `src/extproc/session.rs` maps
//! them to ext_proc messages.
//!
//! Envoy calls, per request: request headers → request body pieces (→ trailers) → response
//! headers → response body pieces (→ trailers) → stream complete. The request's head is held
//! (`Stop`) while its body is read piece by piece into the core, each piece drained from
//! Envoy (no second buffer); at the end the translated body replaces it. Streamed answers go
//! out piece by piece, translated; gathered answers are held (head and body) and replaced
//! whole. Every error is an OpenResponses envelope sent as Envoy's local reply.
//!
//! Fail closed: once a request is ours, no hook lets the original bytes continue: each body
//! piece is drained before anything is added, and a head continues only once the core has
//! decided how its body is translated (`tests::prop_nothing_untranslated_passes`, and the fuzz
//! target over `crate::fake`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use responses_core::environment::{Environment, System};
use responses_core::exchange::{
    self, AbortStep, BodyStep, Exchange, HeadStep, Reply, RequestStep, ResponseHead,
};
use responses_core::openresponses::ApiError;
use responses_core::proxy::{self, HeaderEdit, DETAILS_ANSWER, DETAILS_REQUEST};
use responses_core::telemetry::{self, Timing, Transport};
use responses_core::translate::Meta;

use crate::config::FilterConfig;
use crate::host::{Host, Level, Side};

/// What a headers hook tells Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadersStatus {
    Continue,
    /// Hold the head (and everything after it) until a later hook continues.
    Stop,
}

/// What a body hook tells Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyStatus {
    /// Pass on what is left in the piece (the translation, or nothing).
    Continue,
    /// Hold the head; the piece was drained (Envoy's `StopIterationNoBuffer`).
    Stop,
}

/// What a trailers hook tells Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrailersStatus {
    Continue,
    Stop,
}

#[derive(Debug)]
enum Phase {
    /// Before the request headers.
    Start,
    /// Not ours: every hook lets everything pass.
    PassThrough,
    /// Ours, from the request headers on.
    Ours(Box<Exchange>),
}

/// The exchange's timing, for the stats.
#[derive(Debug, Default)]
struct Clock {
    started: Option<Instant>,
    first_output: Option<Duration>,
    /// Time spent in the filter's hooks.
    busy: Duration,
    /// Counted in `streams_in_flight`.
    streaming: bool,
    recorded: bool,
    /// Envoy's span has the exchange's attributes.
    tagged: bool,
}

impl Clock {
    fn timing(&self) -> Timing {
        Timing {
            total: self.started.map(|t| t.elapsed()).unwrap_or_default(),
            first_output: self.first_output,
            translation: self.busy,
        }
    }
}

/// One HTTP exchange's filter.
#[derive(Debug)]
pub struct Filter<E = System> {
    config: Arc<FilterConfig>,
    env: E,
    phase: Phase,
    /// The request's translated body went upstream.
    forwarded: bool,
    /// The answer's head went to the client (a stream is open): from now on only bytes can be
    /// added, or the stream reset.
    head_sent: bool,
    /// We answered with a local reply: if Envoy shows it to our response hooks, it passes.
    replied: bool,
    /// A panic ended the exchange: every later byte is dropped.
    failed: bool,
    /// The exchange's summary is in Envoy's dynamic metadata.
    metadata_set: bool,
    /// `x-request-id`, for logs.
    request_id: String,
    clock: Clock,
}

/// How a request step was carried out.
enum Carried {
    Held,
    Forwarded,
    Replied,
}

impl<E: Environment> Filter<E> {
    pub fn new(config: Arc<FilterConfig>, env: E) -> Self {
        Filter {
            config,
            env,
            phase: Phase::Start,
            forwarded: false,
            head_sent: false,
            replied: false,
            failed: false,
            metadata_set: false,
            request_id: String::new(),
            clock: Clock::default(),
        }
    }

    /// The exchange, once it is ours.
    pub fn exchange(&self) -> Option<&Exchange> {
        match &self.phase {
            Phase::Ours(ex) => Some(ex),
            _ => None,
        }
    }

    pub fn request_headers(&mut self, host: &mut impl Host, end: bool) -> HeadersStatus {
        self.run(host, |f, host| f.on_request_headers(host, end))
    }

    pub fn request_body(&mut self, host: &mut impl Host, end: bool) -> BodyStatus {
        self.run(host, |f, host| f.on_request_body(host, end))
    }

    pub fn request_trailers(&mut self, host: &mut impl Host) -> TrailersStatus {
        self.run(host, |f, host| f.on_request_trailers(host))
    }

    pub fn response_headers(&mut self, host: &mut impl Host, end: bool) -> HeadersStatus {
        self.run(host, |f, host| f.on_response_headers(host, end))
    }

    pub fn response_body(&mut self, host: &mut impl Host, end: bool) -> BodyStatus {
        self.run(host, |f, host| f.on_response_body(host, end))
    }

    pub fn response_trailers(&mut self, host: &mut impl Host) -> TrailersStatus {
        self.run(host, |f, host| f.on_response_trailers(host))
    }

    /// Envoy is done with the stream (before the access log): an exchange still open was cut
    /// (client gone, upstream reset, a timeout); it is recorded as such.
    pub fn stream_complete(&mut self, host: &mut impl Host) {
        if let Phase::Ours(ex) = &self.phase {
            if !ex.is_finished() && !self.failed {
                log(host, Level::Info, || {
                    format!(
                        "exchange ended by Envoy before its answer was complete (client \
                         disconnected, upstream reset or timeout) request_id={}",
                        self.request_id
                    )
                });
            }
        }
        self.record(host);
    }

    /// A hook panicked (the caller caught it): end the exchange with what can still be sent,
    /// an envelope while the client has no head yet, else the stream's failed ending, else a
    /// reset. Returns whether the current hook's data may continue (only that ending).
    pub fn on_panic(&mut self, host: &mut impl Host) -> bool {
        log(host, Level::Error, || {
            format!(
                "panic while translating an exchange; failing it request_id={}",
                self.request_id
            )
        });
        let already = self.failed || self.replied;
        self.failed = true;
        if already {
            host.drain_body(Side::Response);
            return self.head_sent;
        }
        let now = self.env.now();
        let step = match &mut self.phase {
            Phase::Ours(ex) => {
                let ex = &mut **ex;
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    proxy::abort_after_panic(ex, now)
                }))
                .unwrap_or(AbortStep::Nothing)
            }
            _ => AbortStep::Nothing,
        };
        // Whatever the hook left in the current pieces is untranslated.
        host.drain_body(Side::Request);
        host.drain_body(Side::Response);
        match step {
            AbortStep::Send(bytes) if self.head_sent => {
                self.set_metadata(host);
                self.tag_span(host);
                host.append_body(Side::Response, &bytes);
                true
            }
            AbortStep::Reply(r) if !self.head_sent => {
                self.reply(host, &r, DETAILS_ANSWER);
                false
            }
            _ if self.head_sent => {
                host.reset();
                false
            }
            _ => {
                let err = ApiError::server(
                    500,
                    "internal_error",
                    "responses-extproc failed while translating this exchange.",
                );
                self.replied = true;
                host.send_reply(err.status, exchange::JSON, &err.to_body(), DETAILS_ANSWER);
                false
            }
        }
    }

    /// Runs one hook: times it, then notes what changed (first output, stream opened, the
    /// end: metadata and stats).
    fn run<H: Host, R>(&mut self, host: &mut H, hook: impl FnOnce(&mut Self, &mut H) -> R) -> R {
        let began = Instant::now();
        let started = *self.clock.started.get_or_insert(began);
        let was_open = !self.exchange().is_some_and(Exchange::is_finished);
        let status = hook(self, host);
        self.clock.busy += began.elapsed();
        let Phase::Ours(ex) = &self.phase else {
            return status;
        };
        if self.clock.first_output.is_none() && ex.has_output() {
            self.clock.first_output = Some(started.elapsed());
            first_output_event(host);
        }
        if !self.clock.streaming && ex.is_streaming() {
            self.clock.streaming = true;
            host.gauge_add(self.config.metrics.streams_in_flight, 1);
        }
        if was_open && ex.is_finished() {
            self.set_metadata(host);
            self.tag_span(host);
            self.log_end(host);
            self.record(host);
        }
        status
    }

    fn meta(&self) -> Meta {
        Meta {
            now: self.env.now(),
            id_seed: self.env.id_seed(),
        }
    }

    fn on_request_headers(&mut self, host: &mut impl Host, end: bool) -> HeadersStatus {
        if !matches!(self.phase, Phase::Start) {
            return HeadersStatus::Continue;
        }
        let settings = &self.config.settings;
        let method = host.header(Side::Request, ":method").unwrap_or_default();
        let path = host.header(Side::Request, ":path").unwrap_or_default();
        let Some(op) = exchange::route(settings, method, path) else {
            self.phase = Phase::PassThrough;
            return HeadersStatus::Continue;
        };
        self.request_id = host
            .header(Side::Request, "x-request-id")
            .unwrap_or_default()
            .to_owned();
        let mut ex = Box::new(Exchange::new(settings.clone(), op));
        ex.request_head(|name| host.header(Side::Request, name));
        self.phase = Phase::Ours(ex);
        edit(host, Side::Request, proxy::request_head_edits());
        if end {
            let meta = self.meta();
            let Phase::Ours(ex) = &mut self.phase else {
                unreachable!("set above")
            };
            let step = ex.request_body(&[], true, meta);
            self.carry(host, step);
        }
        // Held until the body is translated (or the reply is sent).
        HeadersStatus::Stop
    }

    fn on_request_body(&mut self, host: &mut impl Host, end: bool) -> BodyStatus {
        if self.replied || self.failed || self.forwarded {
            host.drain_body(Side::Request);
            return BodyStatus::Stop;
        }
        let meta = self.meta();
        let Phase::Ours(ex) = &mut self.phase else {
            return BodyStatus::Continue;
        };
        let pieces = host.body(Side::Request);
        let mut step = RequestStep::Hold;
        if pieces.is_empty() && end {
            step = ex.request_body(&[], true, meta);
        }
        let last = pieces.len().saturating_sub(1);
        for (i, piece) in pieces.iter().enumerate() {
            step = ex.request_body(piece, end && i == last, meta);
            if !matches!(step, RequestStep::Hold) {
                break;
            }
        }
        drop(pieces);
        host.drain_body(Side::Request);
        match self.carry(host, step) {
            Carried::Forwarded => BodyStatus::Continue,
            Carried::Held | Carried::Replied => BodyStatus::Stop,
        }
    }

    /// Trailers end a request body that had no end of its own.
    fn on_request_trailers(&mut self, host: &mut impl Host) -> TrailersStatus {
        if self.replied || self.failed {
            return TrailersStatus::Stop;
        }
        let meta = self.meta();
        match &mut self.phase {
            Phase::Ours(ex) if !self.forwarded && !ex.is_finished() => {
                let step = ex.request_body(&[], true, meta);
                match self.carry(host, step) {
                    Carried::Forwarded => TrailersStatus::Continue,
                    Carried::Held | Carried::Replied => TrailersStatus::Stop,
                }
            }
            _ => TrailersStatus::Continue,
        }
    }

    /// Carries out a request step: the translated request replaces the client's (and Envoy
    /// routes it again), or the reply goes to the client.
    fn carry(&mut self, host: &mut impl Host, step: RequestStep) -> Carried {
        match step {
            RequestStep::Hold => Carried::Held,
            RequestStep::Forward(up) => {
                self.forwarded = true;
                log(host, Level::Debug, || {
                    format!(
                        "translated request request_id={} model={} stream={} body_bytes={}",
                        self.request_id,
                        up.model,
                        up.stream,
                        up.body.len()
                    )
                });
                edit(
                    host,
                    Side::Request,
                    proxy::forward_edits(&self.config.settings, &up),
                );
                host.clear_route_cache();
                host.append_body(Side::Request, &up.body);
                Carried::Forwarded
            }
            RequestStep::Reply(r) => {
                self.reply(host, &r, DETAILS_REQUEST);
                Carried::Replied
            }
        }
    }

    fn on_response_headers(&mut self, host: &mut impl Host, end: bool) -> HeadersStatus {
        if self.replied || self.failed {
            return HeadersStatus::Continue;
        }
        let now = self.env.now();
        let Phase::Ours(ex) = &mut self.phase else {
            return HeadersStatus::Continue;
        };
        let status = host
            .header(Side::Response, ":status")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let content_type = host
            .header(Side::Response, "content-type")
            .unwrap_or_default();
        let head = ResponseHead {
            status,
            content_type,
            end_of_stream: end,
        };
        match ex.response_head(head, now) {
            HeadStep::Stream => {
                edit(host, Side::Response, proxy::stream_head_edits());
                self.head_sent = true;
                HeadersStatus::Continue
            }
            HeadStep::Gather => {
                edit(host, Side::Response, proxy::gather_head_edits());
                HeadersStatus::Stop
            }
            HeadStep::Reply(r) if r.translated => {
                // A stream without a body: its whole (failed) event stream in its place.
                edit(host, Side::Response, proxy::stream_head_edits());
                host.append_body(Side::Response, &r.body);
                self.head_sent = true;
                HeadersStatus::Continue
            }
            HeadStep::Reply(r) => {
                self.reply(host, &r, DETAILS_ANSWER);
                HeadersStatus::Stop
            }
        }
    }

    fn on_response_body(&mut self, host: &mut impl Host, end: bool) -> BodyStatus {
        if self.replied {
            return BodyStatus::Continue;
        }
        if self.failed {
            host.drain_body(Side::Response);
            return if self.head_sent {
                BodyStatus::Continue
            } else {
                BodyStatus::Stop
            };
        }
        let now = self.env.now();
        let Phase::Ours(ex) = &mut self.phase else {
            return BodyStatus::Continue;
        };
        let pieces = host.body(Side::Response);
        let mut sent: Vec<Bytes> = Vec::new();
        let mut reply = None;
        let mut steps = |piece: &[u8], last: bool| match ex.response_body(piece, last, now) {
            BodyStep::Send(bytes) => {
                sent.push(bytes);
                true
            }
            BodyStep::Hold => true,
            BodyStep::Reply(r) => {
                reply = Some(r);
                false
            }
        };
        if pieces.is_empty() && end {
            steps(&[], true);
        }
        let last = pieces.len().saturating_sub(1);
        for (i, piece) in pieces.iter().enumerate() {
            if !steps(piece, end && i == last) {
                break;
            }
        }
        drop(pieces);
        host.drain_body(Side::Response);
        match reply {
            // Cannot happen: a stream under way answers with bytes. Fail closed.
            Some(_) if self.head_sent => {
                host.reset();
                BodyStatus::Stop
            }
            Some(r) if r.translated => {
                edit(host, Side::Response, proxy::translated_reply_edits(&r));
                host.append_body(Side::Response, &r.body);
                BodyStatus::Continue
            }
            Some(r) => {
                self.reply(host, &r, DETAILS_ANSWER);
                BodyStatus::Stop
            }
            None if self.head_sent => {
                for bytes in &sent {
                    host.append_body(Side::Response, bytes);
                }
                BodyStatus::Continue
            }
            // Gathering: the head stays held.
            None => BodyStatus::Stop,
        }
    }

    /// Trailers end an answer whose body had no end of its own.
    fn on_response_trailers(&mut self, host: &mut impl Host) -> TrailersStatus {
        if self.replied || self.failed {
            return TrailersStatus::Continue;
        }
        let now = self.env.now();
        let Phase::Ours(ex) = &mut self.phase else {
            return TrailersStatus::Continue;
        };
        if ex.is_finished() {
            return TrailersStatus::Continue;
        }
        match ex.response_body(&[], true, now) {
            BodyStep::Send(bytes) if self.head_sent => {
                host.append_body(Side::Response, &bytes);
                TrailersStatus::Continue
            }
            BodyStep::Reply(r) if r.translated && !self.head_sent => {
                edit(host, Side::Response, proxy::translated_reply_edits(&r));
                host.append_body(Side::Response, &r.body);
                TrailersStatus::Continue
            }
            BodyStep::Reply(r) if !self.head_sent => {
                self.reply(host, &r, DETAILS_ANSWER);
                TrailersStatus::Stop
            }
            _ => {
                host.reset();
                TrailersStatus::Stop
            }
        }
    }

    /// An error envelope (or other reply) as Envoy's local reply, the summary set first (in
    /// the metadata and on Envoy's span) so that the access log and the span of the reply
    /// have it.
    fn reply(&mut self, host: &mut impl Host, r: &Reply, details: &str) {
        self.set_metadata(host);
        // Before the reply: it ends the stream at once, Envoy's span with it.
        self.tag_span(host);
        log(host, Level::Debug, || {
            let code = self
                .exchange()
                .and_then(|e| e.summary().error_code.as_deref())
                .unwrap_or("");
            format!(
                "answered with an error envelope request_id={} status={} code={code}",
                self.request_id, r.status
            )
        });
        self.replied = true;
        host.send_reply(r.status, r.content_type, &r.body, details);
    }

    /// The exchange's summary as Envoy dynamic metadata (once, when it ends).
    fn set_metadata(&mut self, host: &mut impl Host) {
        let Phase::Ours(ex) = &self.phase else {
            return;
        };
        if self.metadata_set || !ex.is_finished() {
            return;
        }
        self.metadata_set = true;
        host.set_metadata(proxy::METADATA_NAMESPACE, &proxy::metadata(ex.summary()));
    }

    fn log_end(&self, host: &impl Host) {
        if let Some(s) = self.exchange().map(Exchange::summary) {
            log(host, Level::Debug, || {
                format!(
                    "answer translated request_id={} response_id={} operation={} stream={} \
                     outcome={} code={}",
                    self.request_id,
                    s.response_id.as_deref().unwrap_or(""),
                    s.operation.as_str(),
                    s.stream,
                    proxy::outcome_name(s.outcome),
                    s.error_code.as_deref().unwrap_or("")
                )
            });
        }
    }

    /// Records the exchange in the stats, once: when it ends, or when Envoy ends it first
    /// (then as `cut`).
    fn record(&mut self, host: &mut impl Host) {
        let (Phase::Ours(ex), false) = (&self.phase, self.clock.recorded) else {
            return;
        };
        self.clock.recorded = true;
        let m = self.config.metrics;
        let s = ex.summary();
        let stream = if s.stream { "true" } else { "false" };
        let outcome = proxy::recorded_outcome(s.outcome);
        host.count(m.exchanges, &[s.operation.as_str(), stream, outcome], 1);
        if let Some(code) = s
            .error_code
            .as_deref()
            .filter(|c| proxy::CAP_CODES.contains(c))
        {
            host.count(m.caps_hit, &[code], 1);
        }
        if let Some(u) = &s.usage {
            for (kind, n) in proxy::token_counts(u) {
                host.count(m.tokens, &[kind], n);
            }
        }
        let total = self.clock.started.map(|t| t.elapsed()).unwrap_or_default();
        host.observe(m.duration, &[stream, outcome], millis(total));
        host.observe(
            m.translation,
            &[stream],
            u64::try_from(self.clock.busy.as_micros()).unwrap_or(u64::MAX),
        );
        if let (true, Some(first)) = (s.stream, self.clock.first_output) {
            host.observe(m.first_output, &[], millis(first));
        }
        if self.clock.streaming {
            host.gauge_add(m.streams_in_flight, -1);
        }
    }

    /// Envoy's span for the request gets the exchange's attributes, once the exchange ended,
    /// before Envoy ends the stream: Envoy finishes its span before it reports the stream
    /// complete, so an exchange Envoy cut short is not tagged.
    fn tag_span(&mut self, host: &mut impl Host) {
        let Phase::Ours(ex) = &self.phase else {
            return;
        };
        if self.clock.tagged || !ex.is_finished() {
            return;
        }
        self.clock.tagged = true;
        tag_span(host, ex.summary(), &self.clock.timing());
    }
}

/// Envoy's span for the request (when Envoy traces it) gets the exchange's attributes and
/// name, those of the processor's own span (`responses_core::telemetry`; never a body), as
/// string tags in one call. Untraced, this is one lookup that finds no span.
fn tag_span(host: &mut impl Host, s: &exchange::Summary, timing: &Timing) {
    let Some(span) = host.active_span() else {
        return;
    };
    let attributes = telemetry::attributes(s, timing);
    let texts: Vec<_> = attributes.iter().map(|a| a.value.text()).collect();
    let mut tags: Vec<(&str, &str)> = attributes
        .iter()
        .zip(&texts)
        .map(|(a, text)| (a.key, text.as_ref()))
        .collect();
    tags.push((telemetry::key::TRANSPORT, Transport::Module.as_str()));
    host.tag_span(span, &tags);
    if s.model.is_some() {
        host.rename_span(span, &telemetry::span_name(s));
    }
}

/// The first output of a stream, as an event on Envoy's span (stamped by Envoy: now).
fn first_output_event(host: &mut impl Host) {
    if let Some(span) = host.active_span() {
        host.span_event(span, telemetry::FIRST_TOKEN_EVENT);
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The core's header edits, applied to one side's headers.
fn edit<'a>(host: &mut impl Host, side: Side, edits: impl IntoIterator<Item = HeaderEdit<'a>>) {
    for e in edits {
        match e {
            HeaderEdit::Set(name, value) => host.set_header(side, name, Some(&value)),
            HeaderEdit::Remove(name) => host.set_header(side, name, None),
        }
    }
}

/// A log line, formatted only when Envoy logs that level.
fn log(host: &impl Host, level: Level, message: impl FnOnce() -> String) {
    if host.log_enabled(level) {
        host.log(level, &message());
    }
}
