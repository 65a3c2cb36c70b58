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

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use responses_core::environment::Environment;
use responses_core::metadata::MetadataValue;

use crate::config::{FilterConfig, KeyFile};
use crate::filter::{BodyStatus, Filter, HeadersStatus, TrailersStatus};
use crate::host::ffi::Deferred;
use crate::host::{
    Callout, CalloutId, CalloutRefused, CalloutReset, Host, Level, MetricId, Side, SpanRef,
    Terminal,
};

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
    pub drain_watched: bool,
    /// Envoy has started draining.
    pub draining: bool,
    /// The client's write buffer is over its high watermark.
    pub write_blocked: bool,
    /// What Envoy reported from inside the filter's calls, delivered when the call returns.
    pub reported: VecDeque<Deferred>,
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
        let piece = &self.received[index(side)];
        if piece.is_empty() {
            Vec::new()
        } else {
            // Envoy hands a piece over as slices; two, to exercise that.
            let (a, b) = piece.split_at(piece.len() / 2);
            [a, b].into_iter().filter(|s| !s.is_empty()).collect()
        }
    }

    fn drain_body(&mut self, side: Side) {
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

    fn tag_span(&mut self, _span: SpanRef, tags: &[(&str, &str)]) {
        let span = self.span.as_mut().expect("a span the host gave");
        if let Some(span) = span.open() {
            span.tag_calls += 1;
            for (key, value) in tags {
                span.tags.insert(key.to_string(), value.to_string());
            }
        }
    }

    fn rename_span(&mut self, _span: SpanRef, name: &str) {
        let span = self.span.as_mut().expect("a span the host gave");
        if let Some(span) = span.open() {
            span.name = Some(name.to_owned());
        }
    }

    fn span_event(&mut self, _span: SpanRef, event: &str) {
        let span = self.span.as_mut().expect("a span the host gave");
        if let Some(span) = span.open() {
            span.events.push(event.to_owned());
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
        self.answer.ended = end;
    }

    fn send_data(&mut self, bytes: &[u8], end: bool) {
        assert!(self.answer.headers.is_some(), "answer data before its head");
        assert!(!self.answer.ended, "answer data after its end");
        self.answer.body.extend_from_slice(bytes);
        self.answer.ended = end;
    }

    fn send_trailers(&mut self, trailers: &[(&str, &str)]) {
        assert!(
            self.answer.headers.is_some(),
            "answer trailers before its head"
        );
        assert!(!self.answer.ended, "answer trailers after its end");
        self.answer.trailers = Some(owned(trailers));
        self.answer.ended = true;
    }

    fn start_callout(&mut self, callout: &Callout<'_>) -> Result<CalloutId, CalloutRefused> {
        if let Some(refused) = self.refuse_callouts {
            return Err(refused);
        }
        let has = |name: &str| callout.headers.iter().any(|(k, _)| *k == name);
        if !has(":method") || !has(":path") || !(has("host") || has(":authority")) {
            return Err(CalloutRefused::MissingHeaders);
        }
        let id = self.callouts.keys().next_back().map_or(1, |last| last + 1);
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
}

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
        if self.done() {
            return;
        }
        match st {
            HeadersStatus::Continue => self.release_request(end),
            HeadersStatus::Stop => self.request_held = true,
        }
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
        if self.done() || self.upstream.ended {
            return;
        }
        let st = self.body_hook(Side::Request, bytes.to_vec(), end);
        self.settle();
        if self.done() {
            return;
        }
        let piece = std::mem::take(&mut self.host.received[0]);
        if st == BodyStatus::Continue {
            self.release_request(false);
            self.upstream.body.extend_from_slice(&piece);
            self.upstream.ended |= end;
        }
        // Stop (no buffer): whatever is left is the filter's to drop.
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
                Deferred::StreamComplete => filter.stream_complete(host),
            }
            self.settle();
        }
    }

    /// Whether Envoy still reports events of the callout `id`: not over (one the filter never
    /// started counts as live: Envoy may report a stale or foreign id).
    fn callout_live(&self, id: u64) -> bool {
        self.host.callouts.get(&id).is_none_or(|c| !c.over)
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

    /// The armed timer fires (the fake is the clock: whatever its deadline); false if none was
    /// armed.
    pub fn fire_timer(&mut self) -> bool {
        if self.host.timer.take().is_none() {
            return false;
        }
        self.filter.timer_fired(&mut self.host);
        self.settle();
        self.deliver_reported();
        true
    }

    /// Envoy starts draining (its bootstrap extension hears it): the filter is told if it
    /// watches.
    pub fn drain(&mut self) {
        self.host.draining = true;
        if self.host.drain_watched {
            self.filter.drain_started(&mut self.host);
            self.settle();
            self.deliver_reported();
        }
    }

    /// The client's write buffer goes over its high watermark (true) or back under its low one.
    pub fn watermark(&mut self, above: bool) {
        self.host.write_blocked = above;
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
        if self.done() {
            return;
        }
        let pass = self.filter.on_panic(&mut self.host);
        self.settle();
        if pass && self.client.headers.is_some() {
            let added = std::mem::take(&mut self.host.added[1]);
            self.client.body.extend_from_slice(&added);
        }
    }

    pub fn complete(&mut self) {
        // Envoy finishes its span first (`completeRequest`), then tells the filters.
        if let Some(span) = &mut self.host.span {
            span.finished = true;
        }
        self.filter.stream_complete(&mut self.host);
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

/// An answer the client may see: an envelope, a translated JSON response or compaction, or
/// translated SSE events (whole events, JSON data; ending in `[DONE]` when `complete`).
pub fn check_answer(status: u16, content_type: &str, body: &[u8], complete: bool) {
    if content_type == "text/event-stream" {
        assert_eq!(status, 200);
        let text = std::str::from_utf8(body).expect("UTF-8 events");
        if complete || !text.is_empty() {
            assert!(text.starts_with("event: "), "{text}");
        }
        if complete {
            assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        }
        let whole = match text.rfind("\n\n") {
            Some(i) => &text[..i + 2],
            None => "",
        };
        for event in whole.split_terminator("\n\n") {
            let data = event
                .strip_prefix("event: ")
                .and_then(|e| e.split_once("\ndata: "))
                .map(|(_, d)| d)
                .unwrap_or_else(|| event.strip_prefix("data: ").expect("an SSE event"));
            assert!(
                data == "[DONE]" || serde_json::from_str::<serde_json::Value>(data).is_ok(),
                "event data is JSON: {data}"
            );
        }
        return;
    }
    assert_eq!(content_type, "application/json", "status {status}");
    if !complete {
        return;
    }
    let v: serde_json::Value = serde_json::from_slice(body).expect("a JSON answer");
    if (200..300).contains(&status) {
        assert!(
            v["object"] == "response" || v["object"] == "response.compaction",
            "{v}"
        );
    } else {
        assert!((400..600).contains(&status), "{status}");
        assert!(
            v["error"]["message"].is_string() && v["error"]["type"].is_string(),
            "{v}"
        );
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
pub const CONTENT_TYPES: &[&str] = &["application/json", "text/event-stream", "text/plain", ""];
pub const STATUSES: &[u16] = &[200, 200, 201, 400, 413, 429, 500, 503, 504];

/// Small caps, so that scripts reach them.
pub const SMALL_CAPS: &str = r#"{"max_body_bytes": 300, "max_request_bytes": 300,
    "max_output_bytes": 200, "max_sse_frame_bytes": 100,
    "reasoning_keys": "k:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="}"#;

/// Runs a script against a `POST path` exchange and checks it failed closed.
pub fn run_script(path: &str, skip_request_end: bool, steps: &[Step]) -> FakeEnvoy {
    let config = config(SMALL_CAPS);
    let chat_path = config.settings.chat_path.clone();
    let mut envoy = FakeEnvoy::new(config);
    // Traced: whatever the sequence, Envoy's span is tagged at most once, and in time.
    envoy.host.span = Some(FakeSpan::default());
    envoy.request_headers(&[(":method", "POST"), (":path", path)], skip_request_end);
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
        }
        envoy.assert_fail_closed(&chat_path);
    }
    envoy.complete();
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

/// Arbitrary bytes as a script (the fuzz target's decoding).
pub fn script(data: &[u8]) -> (bool, Vec<Step>) {
    let mut bytes = data.iter().copied();
    let skip = bytes.next().is_some_and(|b| b & 1 == 1);
    let mut steps = Vec::new();
    while let Some(op) = bytes.next() {
        let arg = bytes.next().unwrap_or(0);
        let mut body = |arg: u8| -> Vec<u8> {
            if arg & 0x80 == 0 {
                BODIES[usize::from(arg) % BODIES.len()].to_vec()
            } else {
                bytes.by_ref().take(usize::from(arg & 0x3f)).collect()
            }
        };
        steps.push(match op % 7 {
            0 | 1 => Step::RequestBody {
                bytes: body(arg),
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
            _ => Step::ResponseBody {
                bytes: body(arg),
                end: true,
            },
        });
    }
    (skip, steps)
}
