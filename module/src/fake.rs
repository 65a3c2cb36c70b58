//! A fake Envoy for tests and the fuzz target: [`FakeHost`] implements the [`Host`] trait over
//! plain bytes, and [`FakeEnvoy`] drives a [`Filter`] through one exchange as Envoy's filter
//! manager does (held heads, body pieces that continue or stop, local replies), recording what
//! the upstream and the client got. [`FakeEnvoy::assert_fail_closed`] states the rule: nothing
//! untranslated ever reaches either side.
//!
//! For a stream the filter answers itself, [`FakeHost`] is also a [`Terminal`]: it records the
//! filter's own answer (head, data, trailers), its callouts, its timer and drain watch, and
//! [`FakeEnvoy`] scripts what Envoy reports of them (a callout's head, data, end or reset, the
//! timer firing, the drain, the watermarks), delivering what Envoy reports inline (a reset the
//! filter asked for) after the filter's call returns, as the host layer does.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use responses_core::environment::Environment;
use responses_core::exchange::Settings;
use responses_core::exchange::Work;
use responses_core::metadata::record::{self, Answer, Fields};
use responses_core::metadata::MetadataValue;
use responses_testkit::answers::check_answer;

use crate::config::{FilterConfig, KeyFile};
use crate::filter::Filter;
use crate::host::ffi::Deferred;
use crate::host::{
    Callout, CalloutId, CalloutRefused, CalloutReset, Host, Level, MetricId, Side, SpanRef,
    Terminal,
};
use crate::record::RECORDS;
use crate::status::{BodyStatus, HeadersStatus, TrailersStatus};

/// A fixed clock and id seed.
#[derive(Debug, Clone, Copy)]
pub struct Fixed;

impl Environment for Fixed {
    fn now(&self) -> u64 {
        1_700_000_000
    }
    fn id_seed(&self) -> u128 {
        42
    }
    /// The real clock, moved on by [`FakeEnvoy::wait`] and by the timers the fake fires.
    fn instant(&self) -> Instant {
        Instant::now() + SKEW.with(Cell::get)
    }
}

thread_local! {
    /// How far this thread's fake clock is ahead of the real one.
    static SKEW: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// Moves this thread's fake clock on to `at`, if it is not there yet.
fn advance_to(at: Instant) {
    let now = Fixed.instant();
    if at > now {
        SKEW.with(|s| s.set(s.get() + (at - now)));
    }
}

/// A filter config from JSON, its stats numbered in definition order (names kept).
pub fn config(json: &str) -> Arc<FilterConfig> {
    let mut names = Vec::new();
    let config = FilterConfig::new(
        json.as_bytes(),
        KeyFile::Read,
        &mut |kind, name, _labels| {
            names.push((kind, name.to_owned()));
            Some(MetricId(names.len() - 1))
        },
    );
    Arc::new(config.unwrap_or_else(|e| panic!("config {json}: {e}")))
}

/// A reply the filter sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentReply {
    pub status: u16,
    pub content_type: String,
    /// The headers besides `content-type`.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub details: String,
}

/// Envoy's span for the request, as the filter left it. Envoy finishes (exports) its span
/// when the stream ends: at once after a local reply, and before it reports the stream
/// complete; what the filter sets later is lost, and counted here.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FakeSpan {
    /// The operation name, if the filter set one.
    pub name: Option<String>,
    pub tags: BTreeMap<String, String>,
    /// Calls that set tags (each sets several).
    pub tag_calls: usize,
    pub events: Vec<String>,
    pub finished: bool,
    /// Calls made on the span after it finished.
    pub lost: usize,
}

impl FakeSpan {
    /// The span, if the filter's call still counts.
    fn open(&mut self) -> Option<&mut FakeSpan> {
        if self.finished {
            self.lost += 1;
            None
        } else {
            Some(self)
        }
    }
}

/// Envoy's side of one hook, as plain data.
#[derive(Debug, Default)]
pub struct FakeHost {
    pub request_headers: Vec<(String, String)>,
    pub response_headers: Vec<(String, String)>,
    /// The body piece of the current hook, per side (request, response).
    pub received: [Vec<u8>; 2],
    /// Whether the current hook has a received piece (body hooks), per side.
    pub in_body_hook: [bool; 2],
    /// Data the filter added outside a body hook, per side: it follows the head.
    pub added: [Vec<u8>; 2],
    pub replies: Vec<SentReply>,
    pub resets: usize,
    pub route_cache_cleared: usize,
    pub metadata: BTreeMap<(String, String), MetadataValue>,
    pub counters: BTreeMap<(usize, Vec<String>), u64>,
    pub gauges: BTreeMap<usize, i64>,
    pub observed: Vec<(usize, Vec<String>, u64)>,
    pub logs: RefCell<Vec<(Level, String)>>,
    /// Envoy's span, when it traces (`None`: no tracer, the ABI's null span).
    pub span: Option<FakeSpan>,
    /// Times the filter asked for the span.
    pub span_lookups: usize,
    /// Headers Envoy refuses to set or remove (`set_header` answers false), by name.
    pub refused_headers: Vec<String>,
    /// The filter's own answer ([`Terminal`]).
    pub answer: OwnAnswer,
    /// The callouts the filter started, by id (from 1).
    pub callouts: BTreeMap<u64, FakeCallout>,
    /// Every `reset_callout` call, by id (known or not: Envoy ignores an unknown one).
    pub callout_resets: Vec<u64>,
    /// Set: `start_callout` is refused so (e.g. no such cluster).
    pub refuse_callouts: Option<CalloutRefused>,
    /// The armed timer.
    pub timer: Option<Instant>,
    /// The filter resumed the request it held ([`Terminal::continue_request`]), not yet acted
    /// on by the fake's filter manager.
    pub continued: bool,
    pub drain_watched: bool,
    /// Envoy has started draining.
    pub draining: bool,
    /// The client's write buffer is over its high watermark.
    pub write_blocked: bool,
    /// What Envoy reported from inside the filter's calls, delivered when the call returns.
    pub reported: VecDeque<Deferred>,
    /// The request body Envoy keeps in its buffer (a body hook returned `Keep`), read before
    /// the piece of the current hook.
    pub buffered_request: Vec<u8>,
    /// The protocol the request came on (`HTTP/1.1` when unset).
    pub protocol: Option<String>,
    /// The downstream address (`127.0.0.1:40000` when unset).
    pub address: Option<String>,
    /// The client's write buffer's high watermark (Envoy's 1 MiB default when unset).
    pub write_buffer_limit: Option<usize>,
    /// A client that does not read: once the answer holds more than this many bytes, its
    /// write buffer is over its high watermark (reported from inside `send_data`, as Envoy
    /// does).
    pub block_past: Option<usize>,
    /// The child spans the filter made, in order (`SpanRef::fake_child(i)` is the `i`th).
    pub children: Vec<FakeSpan>,
    /// The work the filter started ([`Terminal::start_work`]), not yet run.
    pub work: Option<Box<Work>>,
    /// Works started so far.
    pub works_started: usize,
    /// Set: `start_work` is refused (the work threads' queue is full).
    pub refuse_work: bool,
    /// The turns' records the filter sent: as Envoy's internal listener does with the
    /// shipped config, the filter on their route takes each from the module's ledger and
    /// Envoy answers 204 (told after the hook that sent it).
    pub records: Vec<FakeRecord>,
    /// Set: the records' answers wait for [`FakeEnvoy::release_records`].
    pub hold_records: bool,
}

/// A turn's record the filter sent, and what the filter on its route took for it.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeRecord {
    pub id: u64,
    pub headers: Vec<(String, String)>,
    /// The fields filed under its token (`None`: none were).
    pub fields: Option<Fields>,
    /// Envoy's answer is told (or queued to be).
    pub answered: bool,
}

impl FakeHost {
    /// Envoy's answer to a record's callout, told after the current hook.
    fn answer_record(&mut self, id: u64, status: &str) {
        self.reported.push_back(Deferred::CalloutHeaders {
            id: CalloutId(id),
            headers: vec![(":status".into(), status.into())],
            end: true,
        });
        self.reported
            .push_back(Deferred::CalloutComplete(CalloutId(id)));
    }
}

/// The answer a filter sends itself ([`Terminal::send_headers`] and the rest).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct OwnAnswer {
    pub headers: Option<Vec<(String, String)>>,
    pub body: Vec<u8>,
    pub trailers: Option<Vec<(String, String)>>,
    pub ended: bool,
}

/// A callout as the fake keeps it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FakeCallout {
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    /// Its request body so far, and whether it ended.
    pub body: Vec<u8>,
    pub ended: bool,
    pub trailers: Option<Vec<(String, String)>>,
    pub timeout: Option<Duration>,
    /// Over: it completed or was reset (Envoy reports nothing more, takes nothing more).
    pub over: bool,
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn index(side: Side) -> usize {
    match side {
        Side::Request => 0,
        Side::Response => 1,
    }
}

impl FakeHost {
    fn headers(&self, side: Side) -> &Vec<(String, String)> {
        match side {
            Side::Request => &self.request_headers,
            Side::Response => &self.response_headers,
        }
    }

    fn headers_mut(&mut self, side: Side) -> &mut Vec<(String, String)> {
        match side {
            Side::Request => &mut self.request_headers,
            Side::Response => &mut self.response_headers,
        }
    }

    /// A header's value (first of its name).
    pub fn get(&self, side: Side, name: &str) -> Option<&str> {
        self.headers(side)
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Host for FakeHost {
    fn header(&self, side: Side, name: &str) -> Option<&str> {
        self.get(side, name)
    }

    fn headers(&self, side: Side) -> Vec<(&str, &str)> {
        self.headers(side)
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }

    fn set_header(&mut self, side: Side, name: &str, value: Option<&str>) -> bool {
        if self
            .refused_headers
            .iter()
            .any(|r| r.eq_ignore_ascii_case(name))
        {
            return false;
        }
        let headers = self.headers_mut(side);
        headers.retain(|(k, _)| !k.eq_ignore_ascii_case(name));
        if let Some(v) = value {
            headers.push((name.to_owned(), v.to_owned()));
        }
        true
    }

    fn clear_route_cache(&mut self) {
        self.route_cache_cleared += 1;
    }

    fn body(&self, side: Side) -> Vec<&[u8]> {
        let kept: &[u8] = match side {
            Side::Request => &self.buffered_request,
            Side::Response => &[],
        };
        let piece = &self.received[index(side)];
        // Envoy hands a piece over as slices; two, to exercise that.
        let (a, b) = piece.split_at(piece.len() / 2);
        [kept, a, b].into_iter().filter(|s| !s.is_empty()).collect()
    }

    fn drain_body(&mut self, side: Side) {
        if side == Side::Request {
            self.buffered_request.clear();
        }
        self.received[index(side)].clear();
    }

    fn append_body(&mut self, side: Side, bytes: &[u8]) {
        let i = index(side);
        if self.in_body_hook[i] {
            self.received[i].extend_from_slice(bytes);
        } else {
            self.added[i].extend_from_slice(bytes);
        }
    }

    fn send_reply(
        &mut self,
        status: u16,
        content_type: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        details: &str,
    ) {
        // The reply ends the stream, and Envoy's span with it, before this call returns.
        if let Some(span) = &mut self.span {
            span.finished = true;
        }
        self.replies.push(SentReply {
            status,
            content_type: content_type.to_owned(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.to_vec(),
            details: details.to_owned(),
        });
    }

    fn reset(&mut self) {
        self.resets += 1;
    }

    fn set_metadata(&mut self, namespace: &str, fields: &[(&str, MetadataValue)]) {
        for (key, value) in fields {
            self.metadata
                .insert((namespace.to_owned(), key.to_string()), value.clone());
        }
    }

    fn log_enabled(&self, _level: Level) -> bool {
        true
    }

    fn log(&self, level: Level, message: &str) {
        self.logs.borrow_mut().push((level, message.to_owned()));
    }

    fn count(&mut self, metric: MetricId, labels: &[&str], by: u64) {
        let labels = labels.iter().map(|l| l.to_string()).collect();
        *self.counters.entry((metric.0, labels)).or_default() += by;
    }

    fn gauge_add(&mut self, metric: MetricId, delta: i64) {
        *self.gauges.entry(metric.0).or_default() += delta;
    }

    fn observe(&mut self, metric: MetricId, labels: &[&str], value: u64) {
        let labels = labels.iter().map(|l| l.to_string()).collect();
        self.observed.push((metric.0, labels, value));
    }

    fn active_span(&mut self) -> Option<SpanRef> {
        self.span_lookups += 1;
        self.span.is_some().then(SpanRef::fake)
    }

    fn tag_span(&mut self, span: SpanRef, tags: &[(&str, &str)]) {
        if let Some(span) = self.fake_span(span).open() {
            span.tag_calls += 1;
            for (key, value) in tags {
                span.tags.insert(key.to_string(), value.to_string());
            }
        }
    }

    fn rename_span(&mut self, span: SpanRef, name: &str) {
        if let Some(span) = self.fake_span(span).open() {
            span.name = Some(name.to_owned());
        }
    }

    fn span_event(&mut self, span: SpanRef, event: &str) {
        if let Some(span) = self.fake_span(span).open() {
            span.events.push(event.to_owned());
        }
    }
}

impl FakeHost {
    /// The filter's own answer ended (`end`): Envoy ends the stream, and reports it complete
    /// from inside the call that ended it.
    fn end_answer(&mut self, end: bool) {
        if end {
            self.answer.ended = true;
            self.reported.push_back(Deferred::StreamComplete);
        }
    }

    /// The span a reference the host gave names: the stream's, or a child.
    fn fake_span(&mut self, span: SpanRef) -> &mut FakeSpan {
        match span.fake_child_index() {
            None => self.span.as_mut().expect("a span the host gave"),
            Some(i) => self.children.get_mut(i).expect("a child the host made"),
        }
    }
}

/// Envoy's side of the calls: what it checks it checks here too (a head before data, nothing
/// after the end, the callout's required headers), so a filter's mistake fails its test.
impl Terminal for FakeHost {
    fn send_headers(&mut self, headers: &[(&str, &str)], end: bool) {
        assert!(self.answer.headers.is_none(), "the answer's head, twice");
        assert!(
            headers.iter().any(|(k, _)| *k == ":status"),
            "a head without :status: {headers:?}"
        );
        self.answer.headers = Some(owned(headers));
        self.end_answer(end);
    }

    fn send_data(&mut self, bytes: &[u8], end: bool) {
        assert!(self.answer.headers.is_some(), "answer data before its head");
        assert!(!self.answer.ended, "answer data after its end");
        self.answer.body.extend_from_slice(bytes);
        if self
            .block_past
            .is_some_and(|limit| !self.write_blocked && self.answer.body.len() > limit)
        {
            self.write_blocked = true;
            self.reported.push_back(Deferred::WriteBlocked);
        }
        self.end_answer(end);
    }

    fn send_trailers(&mut self, trailers: &[(&str, &str)]) {
        assert!(
            self.answer.headers.is_some(),
            "answer trailers before its head"
        );
        assert!(!self.answer.ended, "answer trailers after its end");
        self.answer.trailers = Some(owned(trailers));
        self.end_answer(true);
    }

    fn start_callout(&mut self, callout: &Callout<'_>) -> Result<CalloutId, CalloutRefused> {
        if let Some(refused) = self.refuse_callouts {
            return Err(refused);
        }
        let has = |name: &str| callout.headers.iter().any(|(k, _)| *k == name);
        if !has(":method") || !has(":path") || !(has("host") || has(":authority")) {
            return Err(CalloutRefused::MissingHeaders);
        }
        let last = self.callouts.keys().next_back().copied();
        let id = last
            .max(self.records.last().map(|r| r.id))
            .map_or(1, |last| last + 1);
        let path = callout
            .headers
            .iter()
            .find(|(k, _)| *k == ":path")
            .map_or("", |(_, v)| *v);
        if let Some(at) = path.find(record::PATH_SEGMENT) {
            // Envoy's internal listener, its filter on the records' route, its direct 204.
            let settings = Settings {
                responses_path: path[..at].to_owned(),
                ..Settings::default()
            };
            let fields = match record::answer(&settings, &RECORDS, "POST", path) {
                Answer::Record(fields) => Some(fields),
                _ => None,
            };
            let status = if fields.is_some() { "204" } else { "404" };
            self.records.push(FakeRecord {
                id,
                headers: owned(callout.headers),
                fields,
                answered: !self.hold_records,
            });
            if !self.hold_records {
                self.answer_record(id, status);
            }
            return Ok(CalloutId(id));
        }
        self.callouts.insert(
            id,
            FakeCallout {
                cluster: callout.cluster.to_owned(),
                headers: owned(callout.headers),
                body: callout.body.to_vec(),
                ended: callout.end,
                trailers: None,
                timeout: callout.timeout,
                over: false,
            },
        );
        Ok(CalloutId(id))
    }

    fn send_callout_data(&mut self, id: CalloutId, bytes: &[u8], end: bool) -> bool {
        match self.callouts.get_mut(&id.0) {
            Some(c) if !c.over && !c.ended => {
                c.body.extend_from_slice(bytes);
                c.ended = end;
                true
            }
            _ => false,
        }
    }

    fn send_callout_trailers(&mut self, id: CalloutId, trailers: &[(&str, &str)]) -> bool {
        match self.callouts.get_mut(&id.0) {
            Some(c) if !c.over && !c.ended => {
                c.trailers = Some(owned(trailers));
                c.ended = true;
                true
            }
            _ => false,
        }
    }

    fn reset_callout(&mut self, id: CalloutId) {
        self.callout_resets.push(id.0);
        // Envoy resets a live callout and reports it from inside this call.
        if let Some(c) = self.callouts.get_mut(&id.0).filter(|c| !c.over) {
            c.over = true;
            self.reported
                .push_back(Deferred::CalloutReset(id, CalloutReset::LocalReset));
        }
    }

    fn continue_request(&mut self) {
        self.continued = true;
    }

    fn start_work(&mut self, work: Box<Work>) -> bool {
        if self.refuse_work {
            return false;
        }
        assert!(self.work.is_none(), "one work at a time");
        self.work = Some(work);
        self.works_started += 1;
        true
    }

    fn arm_timer(&mut self, at: Instant) {
        self.timer = Some(at);
    }

    fn disarm_timer(&mut self) {
        self.timer = None;
    }

    fn watch_drain(&mut self) -> bool {
        self.drain_watched = true;
        self.draining
    }

    fn write_blocked(&self) -> bool {
        self.write_blocked
    }

    fn drain_request(&mut self, bytes: usize) {
        let from_buffer = bytes.min(self.buffered_request.len());
        self.buffered_request.drain(..from_buffer);
        let piece = &mut self.received[0];
        let rest = (bytes - from_buffer).min(piece.len());
        piece.drain(..rest);
    }

    fn request_protocol(&self) -> Option<&str> {
        Some(self.protocol.as_deref().unwrap_or("HTTP/1.1"))
    }

    fn downstream_address(&self) -> Option<&str> {
        Some(self.address.as_deref().unwrap_or("127.0.0.1:40000"))
    }

    fn write_buffer_limit(&self) -> usize {
        self.write_buffer_limit.unwrap_or(1 << 20)
    }

    fn spawn_span(&mut self, parent: SpanRef, name: &str) -> Option<SpanRef> {
        assert!(
            !self.fake_span(parent).finished,
            "a child of a finished span"
        );
        self.children.push(FakeSpan {
            name: Some(name.to_owned()),
            ..FakeSpan::default()
        });
        Some(SpanRef::fake_child(self.children.len() - 1))
    }

    fn finish_span(&mut self, span: SpanRef) {
        let child = span.fake_child_index().expect("only children are finished");
        let child = &mut self.children[child];
        assert!(!child.finished, "a span finished twice");
        child.finished = true;
    }

    /// The stream's own span is `…-00000000000000ff`, the `i`th child `…-{i + 1}`.
    fn span_ids(&self, span: SpanRef) -> Option<(String, String)> {
        let id = match span.fake_child_index() {
            Some(child) => child + 1,
            None => {
                self.span.as_ref()?;
                0xff
            }
        };
        Some((FAKE_TRACE_ID.to_owned(), format!("{id:016x}")))
    }
}

/// The trace id of every fake span.
pub const FAKE_TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";

/// What went upstream.
#[derive(Debug, Default, Clone)]
pub struct Upstream {
    /// The request head, as it left (None: nothing was sent upstream).
    pub headers: Option<Vec<(String, String)>>,
    pub body: Vec<u8>,
    pub ended: bool,
}

/// What the client got.
#[derive(Debug, Default, Clone)]
pub struct Client {
    /// The answer's head as it left (from the upstream's or Envoy's head).
    pub headers: Option<Vec<(String, String)>>,
    pub body: Vec<u8>,
    pub ended: bool,
    /// A local reply of the filter, in place of any head.
    pub reply: Option<SentReply>,
    pub reset: bool,
}

/// Envoy's filter manager around one [`Filter`], over a [`FakeHost`].
#[derive(Debug)]
pub struct FakeEnvoy {
    pub host: FakeHost,
    pub filter: Filter<Fixed>,
    pub upstream: Upstream,
    pub client: Client,
    /// The filter held the request head, so data waits behind it.
    request_held: bool,
    response_held: bool,
    /// Replies already delivered (the host keeps every one).
    replies_seen: usize,
    /// Envoy told the filter the stream is complete: it reports nothing more.
    pub completed: bool,
    /// Set: the work the filter starts waits for [`FakeEnvoy::finish_work`]; unset, it is
    /// done as soon as the hook that started it returns (a work thread at once).
    pub hold_work: bool,
}

impl FakeEnvoy {
    pub fn new(config: Arc<FilterConfig>) -> FakeEnvoy {
        FakeEnvoy {
            host: FakeHost::default(),
            filter: Filter::new(config, Fixed),
            upstream: Upstream::default(),
            client: Client::default(),
            request_held: false,
            response_held: false,
            replies_seen: 0,
            completed: false,
            hold_work: false,
        }
    }

    /// The work the filter started is done (on this thread) and its result delivered on the
    /// filter's worker (`panicked`: as if it had panicked); false if none was started. After
    /// the stream completed, Envoy delivers nothing (the filter is gone).
    pub fn finish_work_as(&mut self, panicked: bool) -> bool {
        let Some(work) = self.host.work.take() else {
            return false;
        };
        let worked = (!panicked).then(|| work.run());
        if self.completed {
            return true;
        }
        self.filter.work_done(&mut self.host, worked);
        self.settle();
        self.deliver_reported();
        true
    }

    /// [`FakeEnvoy::finish_work_as`], done.
    pub fn finish_work(&mut self) -> bool {
        self.finish_work_as(false)
    }

    /// After a hook: the work it started is done at once, unless held.
    fn work_after_hook(&mut self) {
        if !self.hold_work {
            self.finish_work();
        }
    }

    /// The exchange is over for the client (a reply, a reset or the end of the answer).
    pub fn done(&self) -> bool {
        self.client.reply.is_some() || self.client.reset || self.client.ended
    }

    /// A local reply or reset of the filter ends the exchange; Envoy then shows the reply to
    /// the encoder hooks (1.40 skips the filter that sent it; it must pass unchanged anyway).
    fn settle(&mut self) {
        if self.host.resets > 0 {
            self.client.reset = true;
        }
        // Resumed from outside the hooks (after a side call): the held head goes upstream
        // with the body appended to Envoy's buffer meanwhile, all of it (the request had
        // ended before the filter made its call).
        if std::mem::take(&mut self.host.continued) && self.request_held && !self.done() {
            self.release_request(true);
        }
        if self.host.replies.len() > self.replies_seen {
            self.replies_seen = self.host.replies.len();
            let r = self.host.replies[self.replies_seen - 1].clone();
            if self.client.headers.is_some() || self.client.reply.is_some() {
                // Headers already went out: Envoy can only reset.
                self.client.reset = true;
                return;
            }
            self.host.response_headers = vec![
                (":status".into(), r.status.to_string()),
                ("content-type".into(), r.content_type.clone()),
            ];
            let st = self
                .filter
                .response_headers(&mut self.host, r.body.is_empty());
            assert_eq!(st, HeadersStatus::Continue, "our own reply passes");
            if !r.body.is_empty() {
                let st = self.body_hook(Side::Response, r.body.clone(), true);
                assert_eq!(st, BodyStatus::Continue, "our own reply passes");
                assert_eq!(self.host.received[1], r.body, "our own reply is unchanged");
                self.host.received[1].clear();
            }
            self.client.reply = Some(r);
        }
    }

    fn body_hook(&mut self, side: Side, bytes: Vec<u8>, end: bool) -> BodyStatus {
        let i = index(side);
        self.host.received[i] = bytes;
        self.host.in_body_hook[i] = true;
        let st = match side {
            Side::Request => self.filter.request_body(&mut self.host, end),
            Side::Response => self.filter.response_body(&mut self.host, end),
        };
        self.host.in_body_hook[i] = false;
        st
    }

    pub fn request_headers(&mut self, headers: &[(&str, &str)], end: bool) {
        self.host.request_headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let st = self.filter.request_headers(&mut self.host, end);
        self.settle();
        self.deliver_reported();
        if self.done() || self.filter.is_socket() {
            return;
        }
        match st {
            HeadersStatus::Continue => self.release_request(end),
            HeadersStatus::Stop => self.request_held = true,
        }
        self.work_after_hook();
    }

    fn release_request(&mut self, end: bool) {
        if self.upstream.headers.is_none() {
            self.upstream.headers = Some(self.host.request_headers.clone());
        }
        self.request_held = false;
        let added = std::mem::take(&mut self.host.added[0]);
        self.upstream.body.extend_from_slice(&added);
        self.upstream.ended |= end;
    }

    pub fn request_body(&mut self, bytes: &[u8], end: bool) {
        if self.done() || self.upstream.ended || self.completed {
            return;
        }
        let st = self.body_hook(Side::Request, bytes.to_vec(), end);
        self.settle();
        let piece = std::mem::take(&mut self.host.received[0]);
        if st == BodyStatus::Keep {
            // Envoy keeps what is left with what it kept before.
            self.host.buffered_request.extend_from_slice(&piece);
        }
        self.deliver_reported();
        if self.done() {
            return;
        }
        if st == BodyStatus::Continue {
            self.release_request(false);
            self.upstream.body.extend_from_slice(&piece);
            self.upstream.ended |= end;
        }
        // Stop (no buffer): whatever is left is the filter's to drop.
        self.work_after_hook();
    }

    pub fn request_trailers(&mut self) {
        if self.done() || self.upstream.ended {
            return;
        }
        let st = self.filter.request_trailers(&mut self.host);
        self.settle();
        if !self.done() && st == TrailersStatus::Continue {
            self.release_request(true);
        }
        self.work_after_hook();
    }

    /// The answer's head, from the upstream or (if nothing went upstream) Envoy's own reply.
    pub fn response_headers(&mut self, status: u16, content_type: &str, end: bool) {
        self.response_headers_with(status, content_type, &[], end);
    }

    /// [`FakeEnvoy::response_headers`] with these headers too.
    pub fn response_headers_with(
        &mut self,
        status: u16,
        content_type: &str,
        extra: &[(&str, &str)],
        end: bool,
    ) {
        if self.done() || self.client.headers.is_some() || self.response_held {
            return;
        }
        let mut headers = vec![(":status".to_string(), status.to_string())];
        if !content_type.is_empty() {
            headers.push(("content-type".into(), content_type.into()));
        }
        headers.push(("content-length".into(), "7".into()));
        headers.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self.host.response_headers = headers;
        let st = self.filter.response_headers(&mut self.host, end);
        self.settle();
        if self.done() {
            return;
        }
        match st {
            HeadersStatus::Continue => self.release_response(end),
            HeadersStatus::Stop => self.response_held = true,
        }
    }

    fn release_response(&mut self, end: bool) {
        if self.client.headers.is_none() {
            self.client.headers = Some(self.host.response_headers.clone());
        }
        self.response_held = false;
        let added = std::mem::take(&mut self.host.added[1]);
        self.client.body.extend_from_slice(&added);
        self.client.ended |= end;
    }

    pub fn response_body(&mut self, bytes: &[u8], end: bool) {
        if self.done() || (self.client.headers.is_none() && !self.response_held) {
            return;
        }
        let st = self.body_hook(Side::Response, bytes.to_vec(), end);
        self.settle();
        if self.done() {
            return;
        }
        let piece = std::mem::take(&mut self.host.received[1]);
        if st == BodyStatus::Continue {
            self.release_response(false);
            self.client.body.extend_from_slice(&piece);
            self.client.ended |= end;
        }
    }

    pub fn response_trailers(&mut self) {
        if self.done() || (self.client.headers.is_none() && !self.response_held) {
            return;
        }
        let st = self.filter.response_trailers(&mut self.host);
        self.settle();
        if !self.done() && st == TrailersStatus::Continue {
            self.release_response(true);
        }
    }

    /// What Envoy reported from inside the filter's last call, to the filter, in order (as the
    /// host layer delivers it).
    fn deliver_reported(&mut self) {
        while let Some(event) = self.host.reported.pop_front() {
            let (filter, host) = (&mut self.filter, &mut self.host);
            match event {
                Deferred::CalloutHeaders { id, headers, end } => {
                    let headers: Vec<(&str, &str)> = headers
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    filter.callout_headers(host, id, &headers, end);
                }
                Deferred::CalloutData { id, bytes, end } => {
                    filter.callout_data(host, id, &[bytes.as_slice()], end);
                }
                Deferred::CalloutTrailers { id, trailers } => {
                    let trailers: Vec<(&str, &str)> = trailers
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    filter.callout_trailers(host, id, &trailers);
                }
                Deferred::CalloutComplete(id) => filter.callout_complete(host, id),
                Deferred::CalloutReset(id, reason) => filter.callout_reset(host, id, reason),
                Deferred::Scheduled(_) => filter.timer_fired(host),
                Deferred::WriteBlocked => filter.write_blocked(host),
                Deferred::WriteUnblocked => filter.write_unblocked(host),
                Deferred::StreamComplete => {
                    if self.completed {
                        continue;
                    }
                    self.completed = true;
                    if let Some(span) = &mut host.span {
                        span.finished = true;
                    }
                    filter.stream_complete(host);
                }
            }
            self.settle();
        }
    }

    /// Whether Envoy still reports events of the callout `id`: not over (one the filter never
    /// started counts as live: Envoy may report a stale or foreign id).
    fn callout_live(&self, id: u64) -> bool {
        !self.completed && self.host.callouts.get(&id).is_none_or(|c| !c.over)
    }

    /// Envoy reports a callout's answer head (`:status` first, then `headers`). A callout the
    /// filter never started is reported too (as a stale or foreign id would be).
    pub fn callout_headers(&mut self, id: u64, status: u16, headers: &[(&str, &str)], end: bool) {
        if !self.callout_live(id) {
            return;
        }
        let status = status.to_string();
        let mut all = vec![(":status", status.as_str())];
        all.extend_from_slice(headers);
        self.filter
            .callout_headers(&mut self.host, CalloutId(id), &all, end);
        self.settle();
        self.deliver_reported();
        if end {
            self.answered(id);
        }
    }

    /// A callout's answer ended: once its request has too, Envoy reports it complete.
    fn answered(&mut self, id: u64) {
        if self.host.callouts.get(&id).is_some_and(|c| c.ended) {
            self.callout_complete(id);
        }
    }

    /// Envoy reports a piece of a callout's answer body.
    pub fn callout_data(&mut self, id: u64, bytes: &[u8], end: bool) {
        if !self.callout_live(id) {
            return;
        }
        self.filter
            .callout_data(&mut self.host, CalloutId(id), &[bytes], end);
        self.settle();
        self.deliver_reported();
        if end {
            self.answered(id);
        }
    }

    /// Envoy reports a callout's answer trailers.
    pub fn callout_trailers(&mut self, id: u64, trailers: &[(&str, &str)]) {
        if !self.callout_live(id) {
            return;
        }
        self.filter
            .callout_trailers(&mut self.host, CalloutId(id), trailers);
        self.settle();
        self.deliver_reported();
        self.answered(id);
    }

    /// Envoy reports a callout complete (its answer ended, its request too).
    pub fn callout_complete(&mut self, id: u64) {
        if !self.callout_live(id) {
            return;
        }
        if let Some(c) = self.host.callouts.get_mut(&id) {
            c.over = true;
        }
        self.filter.callout_complete(&mut self.host, CalloutId(id));
        self.settle();
        self.deliver_reported();
    }

    /// Envoy reports a callout reset (the upstream went, or a timeout).
    pub fn callout_reset(&mut self, id: u64, reason: CalloutReset) {
        if !self.callout_live(id) {
            return;
        }
        if let Some(c) = self.host.callouts.get_mut(&id) {
            c.over = true;
        }
        self.filter
            .callout_reset(&mut self.host, CalloutId(id), reason);
        self.settle();
        self.deliver_reported();
    }

    /// The armed timer fires, the fake clock moved on to its deadline; false if none was
    /// armed.
    pub fn fire_timer(&mut self) -> bool {
        if self.completed {
            return false;
        }
        let Some(at) = self.host.timer.take() else {
            return false;
        };
        advance_to(at);
        self.filter.timer_fired(&mut self.host);
        self.settle();
        self.deliver_reported();
        true
    }

    /// Envoy starts draining (its bootstrap extension hears it): the filter is told if it
    /// watches.
    pub fn drain(&mut self) {
        self.host.draining = true;
        if self.host.drain_watched && !self.completed {
            self.filter.drain_started(&mut self.host);
            self.settle();
            self.deliver_reported();
        }
    }

    /// The client's write buffer goes over its high watermark (true) or back under its low one.
    pub fn watermark(&mut self, above: bool) {
        self.host.write_blocked = above;
        if self.completed {
            return;
        }
        if above {
            self.filter.write_blocked(&mut self.host);
        } else {
            self.filter.write_unblocked(&mut self.host);
        }
        self.settle();
        self.deliver_reported();
    }

    /// A hook panicked (as the FFI layer handles it): the filter ends what it can.
    pub fn panic(&mut self) {
        if self.done() || self.completed {
            return;
        }
        let pass = self.filter.on_panic(&mut self.host);
        self.settle();
        self.deliver_reported();
        if pass && self.client.headers.is_some() {
            let added = std::mem::take(&mut self.host.added[1]);
            self.client.body.extend_from_slice(&added);
        }
    }

    pub fn complete(&mut self) {
        if self.completed {
            return;
        }
        self.completed = true;
        // Envoy finishes its span first (`completeRequest`), then tells the filters.
        if let Some(span) = &mut self.host.span {
            span.finished = true;
        }
        self.filter.stream_complete(&mut self.host);
        self.deliver_reported();
    }

    /// Nothing untranslated reached either side: the upstream got nothing or a whole Chat
    /// request on the Chat path; the client got an envelope, a translated response, or
    /// whole translated SSE events (possibly cut short by a reset).
    pub fn assert_fail_closed(&self, chat_path: &str) {
        if let Some(headers) = &self.upstream.headers {
            let path = headers.iter().find(|(k, _)| k == ":path").map(|(_, v)| v);
            assert_eq!(path.map(String::as_str), Some(chat_path), "{headers:?}");
            if self.upstream.ended {
                let v: serde_json::Value =
                    serde_json::from_slice(&self.upstream.body).expect("the upstream got JSON");
                assert!(
                    v["messages"].is_array(),
                    "the upstream got a Chat request: {v}"
                );
            } else {
                // Still arriving: only ever a prefix of the translated body.
                assert!(self.upstream.body.is_empty() || self.upstream.body[0] == b'{');
            }
        }
        if let Some(r) = &self.client.reply {
            assert!(self.client.headers.is_none());
            check_answer(r.status, &r.content_type, &r.body, true);
        }
        if let Some(headers) = &self.client.headers {
            let get = |name: &str| {
                headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            };
            let status: u16 = get(":status").and_then(|s| s.parse().ok()).unwrap_or(0);
            let content_type = get("content-type").unwrap_or("");
            let complete = self.client.ended && !self.client.reset;
            check_answer(status, content_type, &self.client.body, complete);
        }
    }
}

/// One step of a fuzz or property script.
#[derive(Debug, Clone)]
pub enum Step {
    RequestBody {
        bytes: Vec<u8>,
        end: bool,
    },
    RequestTrailers,
    ResponseHeaders {
        status: u16,
        content_type: &'static str,
        end: bool,
    },
    ResponseBody {
        bytes: Vec<u8>,
        end: bool,
    },
    ResponseTrailers,
    Panic,
    /// The work the filter started (a compressed request's reading) is done now; until then
    /// (in a compressed script) it waits, whatever else happens.
    Work,
}

/// A script of Envoy hooks for one exchange.
#[derive(Debug, Clone, Default)]
pub struct Script {
    /// The request head ends the request (no body).
    pub headers_end: bool,
    /// The request says `content-encoding: gzip`: its reading is work, held until
    /// [`Step::Work`].
    pub compressed: bool,
    pub steps: Vec<Step>,
}

/// Typical bodies of both sides, for scripts.
pub const BODIES: &[&[u8]] = &[
    br#"{"model":"m","input":"hi"}"#,
    br#"{"model":"m","input":"hi","stream":true}"#,
    b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n",
    b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
    br#"{"choices":[{"index":0,"finish_reason":"stop","message":{"content":"yo"}}]}"#,
    br#"{"error":{"message":"busy"}}"#,
];
/// The first two of [`BODIES`] gzipped: a compressed script's requests.
pub const GZIPPED: &[&[u8]] = &[
    b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\xab\x56\xca\xcd\x4f\x49\xcd\x51\xb2\x52\xca\x55\xd2\x51\xca\xcc\x2b\x28\x2d\x01\xb2\x33\x32\x95\x6a\x01\x18\x50\x9e\x1e\x1a\x00\x00\x00",
    b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\x03\xab\x56\xca\xcd\x4f\x49\xcd\x51\xb2\x52\xca\x55\xd2\x51\xca\xcc\x2b\x28\x2d\x01\xb2\x33\x32\x81\x9c\xe2\x92\xa2\xd4\xc4\x5c\x25\xab\x92\xa2\xd2\xd4\x5a\x00\x78\xe5\x7b\x0a\x28\x00\x00\x00",
];
pub const CONTENT_TYPES: &[&str] = &["application/json", "text/event-stream", "text/plain", ""];
pub const STATUSES: &[u16] = &[200, 200, 201, 400, 413, 429, 500, 503, 504];

/// Small caps, so that scripts reach them.
pub const SMALL_CAPS: &str = r#"{"max_body_bytes": 300, "max_request_bytes": 300,
    "max_output_bytes": 200, "max_sse_frame_bytes": 100,
    "reasoning_keys": "k:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="}"#;

/// Runs a script against a `POST path` exchange and checks it failed closed.
pub fn run_script(path: &str, script: &Script) -> FakeEnvoy {
    let steps = &script.steps;
    let config = config(SMALL_CAPS);
    let chat_path = config.settings.chat_path.clone();
    let mut envoy = FakeEnvoy::new(config.clone());
    // Traced: whatever the sequence, Envoy's span is tagged at most once, and in time.
    envoy.host.span = Some(FakeSpan::default());
    let mut head = vec![(":method", "POST"), (":path", path)];
    if script.compressed {
        head.push(("content-encoding", "gzip"));
        envoy.hold_work = true;
    }
    envoy.request_headers(&head, script.headers_end);
    for step in steps {
        match step.clone() {
            Step::RequestBody { bytes, end } => envoy.request_body(&bytes, end),
            Step::RequestTrailers => envoy.request_trailers(),
            Step::ResponseHeaders {
                status,
                content_type,
                end,
            } => envoy.response_headers(status, content_type, end),
            Step::ResponseBody { bytes, end } => envoy.response_body(&bytes, end),
            Step::ResponseTrailers => envoy.response_trailers(),
            Step::Panic => envoy.panic(),
            Step::Work => {
                envoy.finish_work();
            }
        }
        envoy.assert_fail_closed(&chat_path);
    }
    envoy.complete();
    // A work still running ends after the stream: its result is no one's.
    envoy.finish_work();
    envoy.assert_fail_closed(&chat_path);
    let span = envoy.host.span.as_ref().expect("traced");
    assert!(span.tag_calls <= 1 && span.lost == 0, "{span:?}");
    // Every exchange that ended in a hook (not cut by Envoy, no panic) is on it.
    let ended = envoy.filter.exchange().is_some_and(|e| e.is_finished());
    if ended && !steps.iter().any(|s| matches!(s, Step::Panic)) {
        assert_eq!(span.tag_calls, 1, "{span:?}");
    }
    // Every stream that opened was closed in the gauge.
    assert!(
        envoy.host.gauges.values().all(|v| *v == 0),
        "{:?}",
        envoy.host.gauges
    );
    envoy
}

/// Arbitrary bytes as a script (the fuzz target's decoding): the first byte says whether the
/// head ends the request (bit 0) and whether it is compressed (bit 1), then two bytes a step.
pub fn script(data: &[u8]) -> Script {
    let mut bytes = data.iter().copied();
    let first = bytes.next().unwrap_or(0);
    let compressed = first & 2 == 2;
    let mut steps = Vec::new();
    while let Some(op) = bytes.next() {
        let arg = bytes.next().unwrap_or(0);
        // A compressed script's typical requests are gzipped.
        let gzipped = (compressed && arg & 0x80 == 0)
            .then(|| GZIPPED.get(usize::from(arg) % BODIES.len()))
            .flatten();
        let mut body = |arg: u8| -> Vec<u8> {
            if arg & 0x80 == 0 {
                BODIES[usize::from(arg) % BODIES.len()].to_vec()
            } else {
                bytes.by_ref().take(usize::from(arg & 0x3f)).collect()
            }
        };
        steps.push(match op % 7 {
            0 | 1 => Step::RequestBody {
                bytes: gzipped.map_or_else(|| body(arg), |g| g.to_vec()),
                end: arg & 0x40 != 0,
            },
            2 => Step::ResponseHeaders {
                status: STATUSES[usize::from(arg) % STATUSES.len()],
                content_type: CONTENT_TYPES[usize::from(arg >> 4) % CONTENT_TYPES.len()],
                end: arg & 0x08 != 0,
            },
            3 | 4 => Step::ResponseBody {
                bytes: body(arg),
                end: arg & 0x40 != 0,
            },
            5 if arg & 1 == 0 => Step::RequestTrailers,
            5 => Step::ResponseTrailers,
            _ if arg & 0x0f == 0 => Step::Panic,
            _ if arg & 0x0f == 1 => Step::Work,
            _ => Step::ResponseBody {
                bytes: body(arg),
                end: true,
            },
        });
    }
    Script {
        headers_end: first & 1 == 1,
        compressed,
        steps,
    }
}

// ---- WebSocket sessions ----

/// An HTTP/1.1 WebSocket upgrade on the Responses path, as a client sends it.
pub const UPGRADE: [(&str, &str); 8] = [
    (":method", "GET"),
    (":path", "/v1/responses"),
    (":authority", "gateway.example"),
    ("upgrade", "websocket"),
    ("connection", "Upgrade"),
    ("sec-websocket-version", "13"),
    ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
    ("x-request-id", "ws-1"),
];

/// A client frame (masked, as RFC 6455 wants a client's), FIN set.
pub fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n <= 0xFFFF => {
            f.push(0x80 | 126);
            f.extend((n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend((n as u64).to_be_bytes());
        }
    }
    let key = [0x37, 0xfa, 0x21, 0x3d];
    f.extend(key);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    f
}

/// A text message from the client: one frame.
pub fn client_text(text: &str) -> Vec<u8> {
    client_frame(0x1, text.as_bytes())
}

/// A frame the filter sent the client.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerFrame {
    /// A text message: one JSON event each.
    Text(serde_json::Value),
    Close(u16, String),
    Pong(Vec<u8>),
}

/// The filter's frames to the client: whole, unmasked, unfragmented, each text a JSON object
/// (panics otherwise: what a client would fail the connection on).
pub fn server_frames(mut bytes: &[u8]) -> Vec<ServerFrame> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        assert!(bytes.len() >= 2, "a partial frame head");
        assert_eq!(
            bytes[0] & 0xf0,
            0x80,
            "FIN, no reserved bits: {:x}",
            bytes[0]
        );
        assert_eq!(bytes[1] & 0x80, 0, "the server's frames are not masked");
        let (len, at) = match bytes[1] & 0x7f {
            126 => (usize::from(u16::from_be_bytes([bytes[2], bytes[3]])), 4),
            127 => {
                let len = u64::from_be_bytes(bytes[2..10].try_into().expect("8 bytes"));
                (usize::try_from(len).expect("a length"), 10)
            }
            n => (usize::from(n), 2),
        };
        assert!(bytes.len() >= at + len, "a partial frame");
        let payload = &bytes[at..at + len];
        out.push(match bytes[0] & 0x0f {
            0x1 => {
                let v: serde_json::Value =
                    serde_json::from_slice(payload).expect("each text message is JSON");
                assert!(v["type"].is_string(), "an event with a type: {v}");
                ServerFrame::Text(v)
            }
            0x8 => {
                let code = payload
                    .get(..2)
                    .map_or(1005, |c| u16::from_be_bytes([c[0], c[1]]));
                let reason = String::from_utf8(payload.get(2..).unwrap_or(&[]).to_vec())
                    .expect("a UTF-8 reason");
                ServerFrame::Close(code, reason)
            }
            0xA => ServerFrame::Pong(payload.to_vec()),
            other => panic!("the server sent opcode {other}"),
        });
        bytes = &bytes[at + len..];
    }
    out
}

/// Sockets share the fake clock: tests that open them take turns.
pub fn sockets_alone() -> std::sync::MutexGuard<'static, ()> {
    static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ALONE.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakeEnvoy {
    /// Time passes (the fake clock, [`Fixed::instant`]).
    pub fn wait(&mut self, by: Duration) {
        advance_to(Fixed.instant() + by);
    }

    /// Envoy answers the records it held ([`FakeHost::hold_records`]).
    pub fn release_records(&mut self) {
        self.host.hold_records = false;
        let held: Vec<(u64, bool)> = self
            .host
            .records
            .iter_mut()
            .filter(|r| !r.answered)
            .map(|r| {
                r.answered = true;
                (r.id, r.fields.is_some())
            })
            .collect();
        for (id, taken) in held {
            self.host
                .answer_record(id, if taken { "204" } else { "404" });
        }
        self.deliver_reported();
        self.settle();
    }

    /// The client asks for the upgrade with [`UPGRADE`] and these headers besides.
    pub fn upgrade(&mut self, extra: &[(&str, &str)]) {
        let mut head = UPGRADE.to_vec();
        head.extend_from_slice(extra);
        self.request_headers(&head, false);
    }

    /// The client's bytes.
    pub fn client(&mut self, bytes: &[u8]) {
        self.request_body(bytes, false);
    }

    /// The frames the client got so far (and keeps: call again for all of them).
    pub fn frames(&self) -> Vec<ServerFrame> {
        server_frames(&self.host.answer.body)
    }

    /// The events the client got so far (the text messages).
    pub fn events(&self) -> Vec<serde_json::Value> {
        self.frames()
            .into_iter()
            .filter_map(|f| match f {
                ServerFrame::Text(v) => Some(v),
                _ => None,
            })
            .collect()
    }

    /// The last callout the filter started, and whether Envoy still reports on it.
    pub fn last_callout(&self) -> Option<(u64, bool)> {
        let (id, c) = self.host.callouts.iter().next_back()?;
        Some((*id, !c.over))
    }

    /// What a socket's session must hold after any step: whole frames, nothing after a close,
    /// every callout a translated Chat request on the Chat path; once Envoy is done with the
    /// stream, no callout left running, no timer armed, the stream gauges at zero and every
    /// child span finished.
    pub fn assert_socket_sound(&self, chat_path: &str) {
        let frames = self.frames();
        if let Some(i) = frames
            .iter()
            .position(|f| matches!(f, ServerFrame::Close(..)))
        {
            assert_eq!(i, frames.len() - 1, "nothing after a close: {frames:?}");
        }
        for c in self.host.callouts.values() {
            let header = |name: &str| {
                c.headers
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            };
            assert_eq!(header(":path"), Some(chat_path));
            assert_eq!(header(":method"), Some("POST"));
            assert!(c.ended, "the Chat request is sent whole");
            let chat: serde_json::Value =
                serde_json::from_slice(&c.body).expect("a JSON Chat request");
            assert!(chat["messages"].is_array(), "a Chat request: {chat}");
        }
        if self.completed {
            for (id, c) in &self.host.callouts {
                assert!(
                    c.over || self.host.callout_resets.contains(id),
                    "callout {id} left running"
                );
            }
            assert_eq!(self.host.timer, None, "a timer left armed");
            assert!(
                self.host.gauges.values().all(|v| *v == 0),
                "{:?}",
                self.host.gauges
            );
            assert!(
                self.host.children.iter().all(|s| s.finished),
                "{:?}",
                self.host.children
            );
        }
    }
}

/// One step of a socket's session script.
#[derive(Debug, Clone)]
pub enum SocketStep {
    /// The client's bytes, as they come.
    Client(Vec<u8>),
    /// The client ends its side.
    ClientEnd,
    /// The last callout's answer head.
    Head {
        status: u16,
        content_type: &'static str,
        end: bool,
    },
    /// A piece of the last callout's answer.
    Data {
        bytes: Vec<u8>,
        end: bool,
    },
    CalloutComplete,
    CalloutReset,
    Timer,
    Drain,
    Watermark(bool),
    Panic,
    /// Envoy is done with the stream (the client went).
    Complete,
}

/// Client messages for socket scripts: creates, a continuation of whatever came last, bad
/// ones, a ping, a close.
pub fn socket_messages() -> Vec<Vec<u8>> {
    vec![
        client_text(r#"{"type":"response.create","model":"m","input":"hi"}"#),
        client_text(r#"{"type":"response.create","model":"m","input":"hi","generate":false}"#),
        client_text(
            r#"{"type":"response.create","model":"m","previous_response_id":"resp_x","input":"more"}"#,
        ),
        client_text(r#"{"type":"nope"}"#),
        client_text("{"),
        client_frame(0x2, b"\x00\x01"),
        client_frame(0x9, b"ping"),
        client_frame(0x8, &1000u16.to_be_bytes()),
    ]
}

/// Arbitrary bytes as a socket session script (the fuzz target's decoding).
pub fn socket_script(data: &[u8]) -> Vec<SocketStep> {
    let messages = socket_messages();
    let mut bytes = data.iter().copied();
    let mut steps = Vec::new();
    while let Some(op) = bytes.next() {
        let arg = bytes.next().unwrap_or(0);
        let step = match op % 12 {
            0..=2 => {
                let message = &messages[usize::from(arg) % messages.len()];
                if arg & 0x80 != 0 {
                    // Split at a point drawn from the data.
                    let at = usize::from(bytes.next().unwrap_or(0)) % (message.len() + 1);
                    steps.push(SocketStep::Client(message[..at].to_vec()));
                    SocketStep::Client(message[at..].to_vec())
                } else {
                    SocketStep::Client(message.clone())
                }
            }
            3 => SocketStep::Client(bytes.by_ref().take(usize::from(arg & 0x3f)).collect()),
            4 => SocketStep::Head {
                status: STATUSES[usize::from(arg) % STATUSES.len()],
                content_type: CONTENT_TYPES[usize::from(arg >> 4) % CONTENT_TYPES.len()],
                end: arg & 0x08 != 0,
            },
            5 | 6 => SocketStep::Data {
                bytes: if arg & 0x80 == 0 {
                    BODIES[usize::from(arg) % BODIES.len()].to_vec()
                } else {
                    bytes.by_ref().take(usize::from(arg & 0x3f)).collect()
                },
                end: arg & 0x40 != 0,
            },
            7 if arg & 1 == 0 => SocketStep::CalloutComplete,
            7 => SocketStep::CalloutReset,
            8 => SocketStep::Timer,
            9 => SocketStep::Watermark(arg & 1 == 1),
            10 if arg & 0x0f == 0 => SocketStep::Panic,
            10 if arg & 0x0f == 1 => SocketStep::Drain,
            10 if arg & 0x0f == 2 => SocketStep::ClientEnd,
            10 if arg & 0x0f == 3 => SocketStep::Complete,
            _ => SocketStep::Timer,
        };
        steps.push(step);
    }
    steps
}

/// Runs a socket session script against one upgraded stream (small caps, traced), checking
/// [`FakeEnvoy::assert_socket_sound`] after each step and once Envoy is done with it, and
/// that its place among the config's connections was given back.
pub fn run_socket_script(steps: &[SocketStep]) -> FakeEnvoy {
    let _alone = sockets_alone();
    let config = config(SMALL_CAPS);
    let chat_path = config.settings.chat_path.clone();
    let mut envoy = FakeEnvoy::new(config.clone());
    envoy.host.span = Some(FakeSpan::default());
    envoy.upgrade(&[]);
    assert!(envoy.filter.is_socket(), "the upgrade was accepted");
    for step in steps {
        match step.clone() {
            SocketStep::Client(bytes) => envoy.client(&bytes),
            SocketStep::ClientEnd => envoy.request_body(&[], true),
            SocketStep::Head {
                status,
                content_type,
                end,
            } => {
                if let Some((id, true)) = envoy.last_callout() {
                    envoy.callout_headers(id, status, &[("content-type", content_type)], end);
                }
            }
            SocketStep::Data { bytes, end } => {
                if let Some((id, true)) = envoy.last_callout() {
                    envoy.callout_data(id, &bytes, end);
                }
            }
            SocketStep::CalloutComplete => {
                if let Some((id, true)) = envoy.last_callout() {
                    envoy.callout_complete(id);
                }
            }
            SocketStep::CalloutReset => {
                if let Some((id, true)) = envoy.last_callout() {
                    envoy.callout_reset(id, CalloutReset::ConnectionTermination);
                }
            }
            SocketStep::Timer => {
                envoy.fire_timer();
            }
            SocketStep::Drain => envoy.drain(),
            SocketStep::Watermark(above) => envoy.watermark(above),
            SocketStep::Panic => envoy.panic(),
            SocketStep::Complete => envoy.complete(),
        }
        envoy.assert_socket_sound(&chat_path);
    }
    envoy.complete();
    envoy.assert_socket_sound(&chat_path);
    assert_eq!(
        config.socket.admission().open(),
        0,
        "the place was given back"
    );
    envoy
}
