//! Chat Completions SSE → Responses semantic events, as a sans-IO state machine.
//!
//! Feed it the upstream body in chunks of any size with [`StreamTranslator::push`]; each
//! call returns the bytes to send to the client now (possibly none). Call
//! [`StreamTranslator::finish`] at the end of the upstream body. Every event is written as
//! soon as the upstream frame that causes it is complete; only an incomplete frame is held.
//!
//! Event order per output item: `output_item.added` → (`content_part.added` → deltas →
//! `*.done` → `content_part.done`)… → `output_item.done`. Reasoning is closed before text
//! or tool calls start; text is closed before tool calls start; each tool call (by its
//! upstream `index`) is its own `function_call` item, and calls may be open together since
//! upstreams may interleave their argument deltas. A `compaction_trigger`'s one `compaction`
//! item is added empty with the first output sampled for its summary, reported by
//! `response.compaction.compacting` (at most every [`COMPACTING_EVERY`] seconds) and done with
//! the summary sealed at the end. The stream ends with exactly one of
//! `response.completed` / `response.incomplete` / `response.failed`, then `data: [DONE]`.
//!
//! How streams end:
//! - `finish_reason` closes the items; the terminal event waits for `[DONE]` (or the end
//!   of the body) so that the trailing usage chunk is included.
//! - `[DONE]` without a `finish_reason` is a complete answer: the upstream said it is done.
//! - The body ending with neither (connection cut, upstream crash) → `response.failed`
//!   with code `upstream_stream_truncated`: the answer may be missing its end. A last
//!   frame cut short by the end of the body (no blank line after it, not JSON) is dropped
//!   as part of that cut, so it fails only when the `finish_reason` had not come yet.
//! - A `data: {"error": …}` frame → an `error` event, then `response.failed` carrying the
//!   upstream's message and a word code ([`crate::upstream_failure::classify_stream`]:
//!   `context_length_exceeded` for a context overflow).
//! - A frame that is not JSON, or one larger than the frame cap, or a delta that would take
//!   the output beyond the output cap (none of it is sent) → `error` + `response.failed`. Open items are closed as `incomplete`
//!   before the terminal event so that its `output` equals the `output_item.done` items.

use std::borrow::Cow;
use std::collections::HashMap;

use bytes::Bytes;

/// Bytes of Responses events per byte of upstream SSE, about (the captured llama-server and
/// vLLM streams of tests/fixtures/upstream translate to 1.2 to 2.1 times their size, plus the
/// opening and closing events).
const OUTPUT_PER_INPUT_BYTE: usize = 2;

/// What a tool call the upstream opens (a delta with a new `index`) counts toward
/// `max_output_bytes`, beside its name, id and arguments: its item and the events that open
/// and close it (about 600 bytes of events, 150 of the response's JSON), and its slot here.
/// Without it, deltas that open calls and carry nothing would grow the output uncounted.
pub const CALL_SLOT_BYTES: usize = 256;

/// Seconds between two `response.compaction.compacting` events while a summary is sampled:
/// OpenAI's rate ("reports newly sampled summary output at most once every 30 seconds", the
/// API reference's streaming events). The events keep a client's idle timer from firing while
/// nothing of the sealed summary can stream.
pub const COMPACTING_EVERY: u64 = 30;

use super::calls::custom_tool_input;
use super::{compaction, finish_status, logprobs, usage, Progress, ReasoningEvents, ResponsePlan};
use crate::chat;
use crate::openresponses::events::ErrorPayload;
use crate::openresponses::{
    ApplyPatchStatus, Code, DeltaFrame, EchoJson, ErrorCode, ErrorKind, Event, EventWriter, Events,
    ItemStatus, LogProb, MessageItem, OutputContent, OutputItem, Part, Phase as MessagePhase,
    ReasoningItem, ReasoningText, ResponseError, Status, Usage,
};
use crate::sse::SseDecoder;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing sent yet: `response.created` goes out with the first bytes.
    New,
    Open,
    /// The terminal event and `[DONE]` were sent; further input is ignored.
    Done,
}

/// The text-like item currently open (at most one at a time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Current {
    None,
    Reasoning { item: usize },
    Message { item: usize, part: Option<PartKind> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartKind {
    Text,
    Refusal,
}

/// One upstream tool call (by its `index`), pending until its name is known.
#[derive(Debug)]
struct Call {
    /// Position in `output` once announced.
    item: Option<usize>,
    id: Option<String>,
    name: String,
    /// Arguments received before the call could be announced; a built-in's whole arguments
    /// (its call is announced complete, see `calls::ToolKind::is_builtin`).
    pending: String,
    closed: bool,
    /// Over `max_tool_calls`: never announced.
    dropped: bool,
    /// The frame of its argument deltas, once the first is sent.
    delta_frame: Option<DeltaFrame>,
}

/// What a stream reported, for logs, metrics and Envoy's metadata ([`StreamTranslator::report`]).
#[derive(Debug, Clone, Default)]
pub struct StreamReport {
    /// Why the response failed, if it did.
    pub error: Option<ResponseError>,
    /// The upstream's trailing usage, if it sent one.
    pub usage: Option<Usage>,
    /// The model the upstream says answered.
    pub upstream_model: Option<String>,
    /// The upstream's `finish_reason`, once it came.
    pub finish_reason: Option<String>,
}

/// A stream's final response folded into one object ([`StreamTranslator::final_response`]).
#[derive(Debug, Clone)]
pub struct FinalResponse {
    pub report: StreamReport,
    /// The `ResponseResource` JSON.
    pub body: Bytes,
}

/// Translates one upstream SSE body. See the module docs for the rules.
#[derive(Debug)]
pub struct StreamTranslator {
    plan: ResponsePlan,
    sse: SseDecoder,
    events: EventWriter,
    out: Vec<u8>,
    phase: Phase,
    output: Vec<OutputItem>,
    progress: Progress,
    current: Current,
    /// The frame of the deltas of the open reasoning or message part, once the first is sent.
    delta_frame: Option<DeltaFrame>,
    calls: Vec<Call>,
    /// The slot in `calls` of each upstream `index`.
    call_slots: HashMap<u32, usize>,
    /// The calls within `max_tool_calls` (not dropped).
    kept_calls: usize,
    finish_reason: Option<String>,
    /// Bytes of text, arguments and tool calls accumulated (counted in `handle_frame`, see
    /// [`CALL_SLOT_BYTES`]), bounded by `max_output_bytes`.
    output_bytes: usize,
    /// The `model` of the upstream's chunks.
    upstream_model: Option<String>,
    /// A `compaction_trigger` request: the summary so far, sealed and sent at the end.
    summary: String,
    /// A `compaction_trigger` request: when the last `response.compaction.compacting` went out
    /// (`None`: the `compaction` item is not open yet).
    compacting_at: Option<u64>,
    /// The request's echo, serialised once for the response objects of the stream's
    /// opening and terminal events.
    echo: EchoJson,
}

impl StreamTranslator {
    pub fn new(plan: ResponsePlan) -> Self {
        let sse = SseDecoder::new(plan.options.max_sse_frame_bytes);
        let echo = EchoJson::new(&plan.echo);
        StreamTranslator {
            plan,
            sse,
            events: EventWriter::new(),
            out: Vec::new(),
            phase: Phase::New,
            output: Vec::new(),
            progress: Progress::in_progress(),
            current: Current::None,
            delta_frame: None,
            calls: Vec::new(),
            call_slots: HashMap::new(),
            kept_calls: 0,
            finish_reason: None,
            output_bytes: 0,
            upstream_model: None,
            summary: String::new(),
            compacting_at: None,
            echo,
        }
    }

    /// True once the terminal event has been produced.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Number of events produced so far.
    pub fn event_count(&self) -> u64 {
        self.events.count()
    }

    /// The output so far, in bytes (text, reasoning and tool calls' arguments, each call's
    /// slot): about what the translator keeps of it for the closing events and the final
    /// response, which a host counts as held while the stream is open.
    pub fn output_bytes(&self) -> usize {
        self.output_bytes
    }

    /// The next sequence number, taken for an event told among this stream's by its host.
    pub fn take_sequence_number(&mut self) -> u64 {
        self.events.take_number()
    }

    /// An output item (text, reasoning, a tool call) has been opened: the turn's own (an
    /// automatic compaction's item, which leads it, is not the model's output).
    pub fn has_output(&self) -> bool {
        self.output.len() > usize::from(self.plan.lead.is_some())
    }

    /// Feeds a chunk of the upstream body; returns what to send to the client now.
    pub fn push(&mut self, chunk: &[u8], now: u64) -> Events {
        self.start();
        if self.phase == Phase::Open {
            // The events are a few times the size of the frames they come from: one
            // allocation up front instead of a doubling (and a copy) per few events.
            self.out
                .reserve(chunk.len().saturating_mul(OUTPUT_PER_INPUT_BYTE) + 1024);
            let mut sse = self.take_decoder();
            let decoded = sse.push_with(chunk, |frame| self.handle_frame(frame.data, false, now));
            self.put_decoder(sse);
            // The frames before the oversized one may have ended the stream already.
            if let (Err(e), Phase::Open) = (decoded, self.phase) {
                self.fail(ErrorCode::UpstreamEventTooLarge, &e.to_string(), now);
            }
        }
        self.take_out()
    }

    /// The upstream body ended; returns the last bytes to send (ending with `[DONE]`).
    pub fn finish(&mut self, now: u64) -> Events {
        self.start();
        if self.phase == Phase::Open {
            let mut sse = self.take_decoder();
            // Only an event without its closing blank line is dispatched here.
            let decoded = sse.finish_with(|frame| self.handle_frame(frame.data, true, now));
            self.put_decoder(sse);
            if let (Err(e), Phase::Open) = (decoded, self.phase) {
                self.fail(ErrorCode::UpstreamEventTooLarge, &e.to_string(), now);
            }
        }
        if self.phase == Phase::Open {
            if self.finish_reason.is_some() {
                self.complete(now);
            } else {
                self.fail(
                    ErrorCode::UpstreamStreamTruncated,
                    "The upstream stream ended before the answer was finished (no finish_reason and no [DONE]).",
                    now,
                );
            }
        }
        self.take_out()
    }

    /// The finished response as its terminal event carries it, for a client that asked for
    /// one JSON object but got a stream (some servers always stream): `None` until the
    /// stream has ended.
    pub fn final_response(&self) -> Option<FinalResponse> {
        if self.phase != Phase::Done {
            return None;
        }
        let resource = self.plan.resource(&self.progress, &self.output);
        Some(FinalResponse {
            report: self.report(),
            // Serialising our own typed values cannot fail.
            body: Bytes::from(serde_json::to_vec(&resource).unwrap_or_default()),
        })
    }

    /// What the stream reported so far (cheap: no serialisation).
    pub fn report(&self) -> StreamReport {
        StreamReport {
            error: self.progress.error.clone(),
            usage: self.progress.usage,
            upstream_model: self.upstream_model.clone(),
            finish_reason: self.finish_reason.clone(),
        }
    }

    /// Ends the stream as failed for a reason outside the upstream body (a timeout, a
    /// reset): returns the events to send, or nothing if the stream had already ended.
    pub fn abort(&mut self, code: ErrorCode, message: &str, now: u64) -> Events {
        self.start();
        if self.phase == Phase::Open {
            self.fail(code, message, now);
        }
        self.take_out()
    }

    /// The events written so far, handed over whole: the buffer is not shared with what
    /// comes next, so the adapter can turn it into its message without a copy
    /// (`Vec::from(Bytes)` reuses a buffer it alone holds).
    fn take_out(&mut self) -> Events {
        Events::new(
            Bytes::from(std::mem::take(&mut self.out)),
            self.events.take_spans(),
        )
    }

    fn start(&mut self) {
        if self.phase != Phase::New {
            return;
        }
        self.phase = Phase::Open;
        let r = self.plan.resource(&self.progress, &[]);
        self.events
            .write_response(&mut self.out, &Event::Created { response: r }, &self.echo);
        let r = self.plan.resource(&self.progress, &[]);
        self.events.write_response(
            &mut self.out,
            &Event::InProgress { response: r },
            &self.echo,
        );
        self.lead();
    }

    /// After an automatic compaction, its item leads the output: added (with nothing sealed
    /// yet, as OpenAI adds one), `response.compaction.compacting` (the summary was sampled,
    /// before the turn's stream began), then done with its `encrypted_content`, before the
    /// turn's events.
    fn lead(&mut self) {
        let Some(lead) = &self.plan.lead else {
            return;
        };
        let opened = OutputItem::Compaction(crate::openresponses::CompactionItem {
            id: lead.item.id.clone(),
            encrypted_content: String::new(),
        });
        self.events.write(
            &mut self.out,
            &Event::OutputItemAdded {
                output_index: 0,
                item: &opened,
            },
        );
        self.events.write(
            &mut self.out,
            &Event::CompactionCompacting {
                item_id: &lead.item.id,
                output_index: 0,
            },
        );
        self.output.push(OutputItem::Compaction(lead.item.clone()));
        self.item_done(0);
    }

    /// The decoder lends each frame out of its own buffer: it is set aside while the frames
    /// of a chunk are handled (and put back by [`StreamTranslator::put_decoder`]).
    fn take_decoder(&mut self) -> SseDecoder {
        std::mem::replace(&mut self.sse, SseDecoder::new(0))
    }

    /// Puts the decoder back, unless the stream ended meanwhile: what it holds is dropped.
    fn put_decoder(&mut self, sse: SseDecoder) {
        if self.phase == Phase::Open {
            self.sse = sse;
        }
    }

    /// `unterminated`: the frame was ended by the end of the body, not by a blank line.
    /// Frames after the stream's end are ignored.
    fn handle_frame(&mut self, data: &[u8], unterminated: bool, now: u64) {
        if self.phase != Phase::Open {
            return;
        }
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            self.complete(now);
            return;
        }
        if data.is_empty() {
            return;
        }
        let chunk = match chat::parse::<chat::Chunk<'_>>(data) {
            Some(c) => c,
            // The body was cut inside this frame: dropped, so that `finish` reports the cut
            // (or completes, if the finish_reason had already come).
            None if unterminated => return,
            None => {
                self.fail(
                    ErrorCode::UpstreamInvalidChunk,
                    "The upstream sent a stream event that is not a valid chat.completion.chunk.",
                    now,
                );
                return;
            }
        };
        if let Some(err) = &chunk.error {
            let failure = crate::upstream_failure::classify_stream(err);
            self.fail(failure.code, &failure.message, now);
            return;
        }
        if let Some(u) = &chunk.usage {
            self.progress.usage = self.plan.usage(Some(usage(u)));
        }
        if self.upstream_model.is_none() {
            self.upstream_model = chunk.model.map(Cow::into_owned);
        }
        for choice in chunk.choices {
            // Responses has one answer per response; other choices (n > 1) are dropped.
            if choice.index != 0 || self.finish_reason.is_some() {
                continue;
            }
            let delta = choice.delta;
            // Checked before any of the delta is sent, so the output never exceeds the cap.
            let size = delta.reasoning_text().map_or(0, str::len)
                + delta.content.as_deref().map_or(0, str::len)
                + delta.refusal.as_deref().map_or(0, str::len)
                + delta
                    .tool_calls
                    .iter()
                    .map(|tc| self.tool_call_size(tc))
                    .sum::<usize>()
                + logprobs_size(choice.logprobs.as_ref(), self.plan.logprobs);
            self.output_bytes = self.output_bytes.saturating_add(size);
            if self.output_bytes > self.plan.options.max_output_bytes {
                self.fail(
                    ErrorCode::ResponseTooLarge,
                    "The answer exceeded this server's output size limit.",
                    now,
                );
                return;
            }
            if self.plan.compaction {
                // The summary is sealed whole: nothing of it streams, nothing else is output;
                // what the upstream samples for it (its reasoning too) is progress to report.
                if let Some(text) = delta.content.as_deref() {
                    self.summary.push_str(text);
                }
                let sampled = [delta.content.as_deref(), delta.reasoning_text()];
                if sampled.iter().flatten().any(|t| !t.is_empty()) {
                    self.compacting(now);
                }
                if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                    self.finish_reason = Some(reason.into_owned());
                }
                continue;
            }
            if let Some(r) = delta.reasoning_text() {
                self.reasoning_delta(r);
            }
            if let Some(text) = delta.content.as_deref().filter(|t| !t.is_empty()) {
                let lp = if self.plan.logprobs {
                    logprobs(choice.logprobs.as_ref())
                } else {
                    Vec::new()
                };
                self.message_delta(PartKind::Text, text, lp);
            }
            if let Some(refusal) = delta.refusal.as_deref().filter(|t| !t.is_empty()) {
                self.message_delta(PartKind::Refusal, refusal, Vec::new());
            }
            for tc in delta.tool_calls {
                self.tool_call_delta(tc);
            }
            if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
                self.finish_reason = Some(reason.into_owned());
                let status = self.item_status();
                self.close_current(status);
                self.close_calls(status);
            }
        }
    }

    fn item_status(&self) -> ItemStatus {
        match finish_status(self.finish_reason.as_deref()).0 {
            Status::Incomplete => ItemStatus::Incomplete,
            _ => ItemStatus::Completed,
        }
    }

    fn reasoning_delta(&mut self, delta: &str) {
        let item = match self.current {
            Current::Reasoning { item } => item,
            _ => {
                self.close_current(ItemStatus::Completed);
                let item = self.output.len();
                self.output.push(OutputItem::Reasoning(ReasoningItem {
                    id: self.plan.item_id("rs", item),
                    summary: Vec::new(),
                    content: Vec::new(),
                    encrypted_content: None,
                }));
                self.events.write(
                    &mut self.out,
                    &Event::OutputItemAdded {
                        output_index: item,
                        item: &self.output[item],
                    },
                );
                if let OutputItem::Reasoning(r) = &mut self.output[item] {
                    r.content.push(ReasoningText {
                        text: String::new(),
                    });
                }
                self.events.write(
                    &mut self.out,
                    &Event::ContentPartAdded {
                        item_id: self.output[item].id(),
                        output_index: item,
                        content_index: 0,
                        part: Part::ReasoningText { text: "" },
                    },
                );
                self.current = Current::Reasoning { item };
                self.delta_frame = None;
                item
            }
        };
        let OutputItem::Reasoning(r) = &mut self.output[item] else {
            return;
        };
        if let Some(t) = r.content.last_mut() {
            t.text.push_str(delta);
        }
        let (item_id, output_index, content_index) = (r.id.as_str(), item, 0);
        let names = self.plan.options.reasoning_events;
        let event = |delta| match names {
            ReasoningEvents::Spec => Event::ReasoningDelta {
                item_id,
                output_index,
                content_index,
                delta,
            },
            ReasoningEvents::OpenAi => Event::ReasoningTextDelta {
                item_id,
                output_index,
                content_index,
                delta,
            },
        };
        write_delta(
            &mut self.events,
            &mut self.out,
            &mut self.delta_frame,
            event,
            delta,
        );
    }

    fn message_delta(&mut self, kind: PartKind, delta: &str, lp: Vec<LogProb>) {
        let item = match self.current {
            Current::Message { item, part } => {
                if part != Some(kind) {
                    self.close_part(item);
                    self.open_part(item, kind);
                }
                item
            }
            _ => {
                self.close_current(ItemStatus::Completed);
                let item = self.output.len();
                self.output.push(OutputItem::Message(MessageItem {
                    id: self.plan.item_id("msg", item),
                    status: ItemStatus::InProgress,
                    role: "assistant".into(),
                    content: Vec::new(),
                    // Not known yet: whether tool calls follow (see `close_current`).
                    phase: None,
                }));
                self.events.write(
                    &mut self.out,
                    &Event::OutputItemAdded {
                        output_index: item,
                        item: &self.output[item],
                    },
                );
                self.open_part(item, kind);
                item
            }
        };
        let OutputItem::Message(m) = &mut self.output[item] else {
            return;
        };
        let content_index = m.content.len().saturating_sub(1);
        let (item_id, output_index) = (m.id.as_str(), item);
        match m.content.last_mut() {
            Some(OutputContent::OutputText { text, logprobs, .. }) => {
                text.push_str(delta);
                let from = logprobs.len();
                logprobs.extend(lp);
                let logprobs = &logprobs[from..];
                let event = |delta| Event::OutputTextDelta {
                    item_id,
                    output_index,
                    content_index,
                    delta,
                    logprobs,
                };
                // The part's frame has no logprobs: a delta that has some is written whole.
                if logprobs.is_empty() {
                    write_delta(
                        &mut self.events,
                        &mut self.out,
                        &mut self.delta_frame,
                        event,
                        delta,
                    );
                } else {
                    self.events.write(&mut self.out, &event(delta));
                }
            }
            Some(OutputContent::Refusal { refusal }) => {
                refusal.push_str(delta);
                let event = |delta| Event::RefusalDelta {
                    item_id,
                    output_index,
                    content_index,
                    delta,
                };
                write_delta(
                    &mut self.events,
                    &mut self.out,
                    &mut self.delta_frame,
                    event,
                    delta,
                );
            }
            None => {}
        }
    }

    fn open_part(&mut self, item: usize, kind: PartKind) {
        let OutputItem::Message(m) = &mut self.output[item] else {
            return;
        };
        m.content.push(match kind {
            PartKind::Text => OutputContent::OutputText {
                text: String::new(),
                annotations: Vec::new(),
                logprobs: Vec::new(),
            },
            PartKind::Refusal => OutputContent::Refusal {
                refusal: String::new(),
            },
        });
        let part = match kind {
            PartKind::Text => Part::OutputText {
                text: "",
                annotations: [],
                logprobs: &[],
            },
            PartKind::Refusal => Part::Refusal { refusal: "" },
        };
        self.events.write(
            &mut self.out,
            &Event::ContentPartAdded {
                item_id: &m.id,
                output_index: item,
                content_index: m.content.len() - 1,
                part,
            },
        );
        self.current = Current::Message {
            item,
            part: Some(kind),
        };
        self.delta_frame = None;
    }

    /// Closes the open content part of message `item`, if any.
    fn close_part(&mut self, item: usize) {
        let Current::Message { part: Some(_), .. } = self.current else {
            return;
        };
        self.current = Current::Message { item, part: None };
        let OutputItem::Message(m) = &self.output[item] else {
            return;
        };
        let Some(content) = m.content.last() else {
            return;
        };
        let (item_id, output_index, content_index) = (m.id.as_str(), item, m.content.len() - 1);
        let (done, part) = match content {
            OutputContent::OutputText { text, logprobs, .. } => (
                Event::OutputTextDone {
                    item_id,
                    output_index,
                    content_index,
                    text,
                    logprobs,
                },
                Part::OutputText {
                    text,
                    annotations: [],
                    logprobs,
                },
            ),
            OutputContent::Refusal { refusal } => (
                Event::RefusalDone {
                    item_id,
                    output_index,
                    content_index,
                    refusal,
                },
                Part::Refusal { refusal },
            ),
        };
        self.events.write(&mut self.out, &done);
        self.events.write(
            &mut self.out,
            &Event::ContentPartDone {
                item_id,
                output_index,
                content_index,
                part,
            },
        );
    }

    /// Closes the open reasoning or message item with its final events.
    fn close_current(&mut self, status: ItemStatus) {
        match self.current {
            Current::None => {}
            Current::Reasoning { item } => {
                self.current = Current::None;
                if let OutputItem::Reasoning(r) = &self.output[item] {
                    let text = r.content.first().map_or("", |t| t.text.as_str());
                    let (item_id, output_index, content_index) = (r.id.as_str(), item, 0);
                    let done = match self.plan.options.reasoning_events {
                        ReasoningEvents::Spec => Event::ReasoningDone {
                            item_id,
                            output_index,
                            content_index,
                            text,
                        },
                        ReasoningEvents::OpenAi => Event::ReasoningTextDone {
                            item_id,
                            output_index,
                            content_index,
                            text,
                        },
                    };
                    self.events.write(&mut self.out, &done);
                    self.events.write(
                        &mut self.out,
                        &Event::ContentPartDone {
                            item_id,
                            output_index,
                            content_index,
                            part: Part::ReasoningText { text },
                        },
                    );
                    let sealed = self.plan.seal(item, text);
                    if let OutputItem::Reasoning(r) = &mut self.output[item] {
                        r.encrypted_content = sealed;
                    }
                }
                self.item_done(item);
            }
            Current::Message { item, .. } => {
                self.close_part(item);
                self.current = Current::None;
                if let OutputItem::Message(m) = &mut self.output[item] {
                    m.status = status;
                    // A message closed by a tool call is `commentary` (see `tool_call_delta`).
                    m.phase.get_or_insert(MessagePhase::FinalAnswer);
                }
                self.item_done(item);
            }
        }
    }

    fn item_done(&mut self, item: usize) {
        self.events.write(
            &mut self.out,
            &Event::OutputItemDone {
                output_index: item,
                item: &self.output[item],
            },
        );
    }

    fn tool_call_delta(&mut self, tc: chat::ToolCall<'_>) {
        let slot = self.call_slot(tc.index);
        // Text before a tool call is a finished thought: close it first. When this starts a
        // call that will be an item after it, the text was on the way to the call:
        // `commentary`.
        let call = &self.calls[slot];
        if call.item.is_none() && !call.closed && !call.dropped {
            if let Current::Message { item, .. } = self.current {
                if let OutputItem::Message(m) = &mut self.output[item] {
                    m.phase = Some(MessagePhase::Commentary);
                }
            }
        }
        self.close_current(ItemStatus::Completed);
        let call = &mut self.calls[slot];
        if call.closed || call.dropped {
            return;
        }
        if let Some(id) = tc.id.filter(|id| !id.is_empty()) {
            call.id.get_or_insert_with(|| id.into_owned());
        }
        if call.item.is_none() {
            if let Some(name) = tc.function.name.filter(|n| !n.is_empty()) {
                call.name = name.into_owned();
            }
        }
        let args = tc.function.arguments.unwrap_or_default();
        match call.item {
            Some(_) => self.arguments_delta(slot, &args),
            None => {
                call.pending.push_str(&args);
                // A built-in's call is announced whole, when it closes.
                if !call.name.is_empty() && !self.plan.tool_kind(&call.name).is_builtin() {
                    self.announce_call(slot);
                }
            }
        }
    }

    /// What a tool call delta adds to the output ([`StreamTranslator::output_bytes`]): its
    /// arguments; the name and id it gives a call that keeps them; [`CALL_SLOT_BYTES`] if it
    /// opens a call.
    fn tool_call_size(&self, tc: &chat::ToolCall<'_>) -> usize {
        let len = |text: &Option<Cow<'_, str>>| text.as_deref().map_or(0, str::len);
        let arguments = len(&tc.function.arguments);
        match self
            .call_slots
            .get(&tc.index)
            .map(|&slot| &self.calls[slot])
        {
            None => CALL_SLOT_BYTES + len(&tc.id) + len(&tc.function.name) + arguments,
            Some(call) => {
                let id = if call.id.is_none() { len(&tc.id) } else { 0 };
                let name = if call.item.is_none() {
                    len(&tc.function.name)
                } else {
                    0
                };
                id + name + arguments
            }
        }
    }

    /// The slot of the upstream's call `index`, made on its first delta.
    fn call_slot(&mut self, index: u32) -> usize {
        if let Some(&slot) = self.call_slots.get(&index) {
            return slot;
        }
        // `max_tool_calls`: calls beyond the limit are dropped, deltas and all.
        let dropped = self.plan.over_tool_call_limit(self.kept_calls);
        if !dropped {
            self.kept_calls += 1;
        }
        self.calls.push(Call {
            item: None,
            id: None,
            name: String::new(),
            pending: String::new(),
            closed: false,
            dropped,
            delta_frame: None,
        });
        let slot = self.calls.len() - 1;
        self.call_slots.insert(index, slot);
        slot
    }

    /// Emits `output_item.added` for a call whose name is known, then its pending arguments.
    fn announce_call(&mut self, slot: usize) {
        let item = self.output.len();
        let call = &mut self.calls[slot];
        call.item = Some(item);
        let pending = std::mem::take(&mut call.pending);
        let call_id = call
            .id
            .clone()
            .unwrap_or_else(|| self.plan.item_id("call", item));
        let name = std::mem::take(&mut call.name);
        // A custom tool's item holds the raw Chat arguments until the call is complete, then
        // its decoded input (see `close_calls`).
        let added = self.plan.call_item(
            item,
            Some(call_id),
            name,
            String::new(),
            ItemStatus::InProgress,
        );
        self.output.push(added);
        self.events.write(
            &mut self.out,
            &Event::OutputItemAdded {
                output_index: item,
                item: &self.output[item],
            },
        );
        if !pending.is_empty() {
            self.arguments_delta(slot, &pending);
        }
    }

    /// Arguments of the announced call in `slot`.
    fn arguments_delta(&mut self, slot: usize, delta: &str) {
        let Some(item) = self.calls[slot].item.filter(|_| !delta.is_empty()) else {
            return;
        };
        if let OutputItem::CustomToolCall(c) = &mut self.output[item] {
            // JSON arguments, decoded when complete: the input goes out in one delta then.
            c.input.push_str(delta);
            return;
        }
        if let OutputItem::FunctionCall(f) = &mut self.output[item] {
            f.arguments.push_str(delta);
            let item_id = f.id.as_str();
            let event = |delta| Event::FunctionCallArgumentsDelta {
                item_id,
                output_index: item,
                delta,
            };
            write_delta(
                &mut self.events,
                &mut self.out,
                &mut self.calls[slot].delta_frame,
                event,
                delta,
            );
        }
    }

    /// Announces calls still waiting for a name, then closes every open call.
    fn close_calls(&mut self, status: ItemStatus) {
        for slot in 0..self.calls.len() {
            if self.calls[slot].closed || self.calls[slot].dropped {
                continue;
            }
            if self.calls[slot].item.is_none()
                && self.plan.tool_kind(&self.calls[slot].name).is_builtin()
            {
                self.calls[slot].closed = true;
                self.builtin_call(slot, status);
                continue;
            }
            if self.calls[slot].item.is_none() {
                self.announce_call(slot);
            }
            self.calls[slot].closed = true;
            let Some(item) = self.calls[slot].item else {
                continue;
            };
            match &mut self.output[item] {
                OutputItem::FunctionCall(f) => {
                    f.status = status;
                    self.events.write(
                        &mut self.out,
                        &Event::FunctionCallArgumentsDone {
                            item_id: &f.id,
                            output_index: item,
                            arguments: &f.arguments,
                        },
                    );
                }
                OutputItem::CustomToolCall(c) => {
                    c.input = custom_tool_input(&c.input);
                    if !c.input.is_empty() {
                        self.events.write(
                            &mut self.out,
                            &Event::CustomToolCallInputDelta {
                                item_id: &c.id,
                                output_index: item,
                                delta: &c.input,
                            },
                        );
                    }
                    self.events.write(
                        &mut self.out,
                        &Event::CustomToolCallInputDone {
                            item_id: &c.id,
                            output_index: item,
                            input: &c.input,
                        },
                    );
                }
                _ => {}
            }
            self.item_done(item);
        }
    }

    /// A built-in tool's call, complete: its item (or a function call, when the arguments
    /// do not fit the built-in's action), announced and closed with its events at once.
    fn builtin_call(&mut self, slot: usize, status: ItemStatus) {
        let item = self.output.len();
        let call = &mut self.calls[slot];
        call.item = Some(item);
        let arguments = std::mem::take(&mut call.pending);
        let name = std::mem::take(&mut call.name);
        let call_id = call.id.clone();
        let done = self.plan.call_item(item, call_id, name, arguments, status);
        // `output_item.added` shows it in progress, as every item starts.
        let mut added = done.clone();
        match &mut added {
            OutputItem::ShellCall(c) => c.status = ItemStatus::InProgress,
            OutputItem::LocalShellCall(c) => c.status = ItemStatus::InProgress,
            OutputItem::ApplyPatchCall(c) => c.status = ApplyPatchStatus::InProgress,
            OutputItem::FunctionCall(f) => {
                f.status = ItemStatus::InProgress;
                f.arguments.clear();
            }
            _ => {}
        }
        self.output.push(added);
        self.events.write(
            &mut self.out,
            &Event::OutputItemAdded {
                output_index: item,
                item: &self.output[item],
            },
        );
        self.output[item] = done;
        match &self.output[item] {
            OutputItem::ShellCall(c) => {
                for (command_index, command) in c.action.commands.iter().enumerate() {
                    let events = [
                        Event::ShellCallCommandAdded {
                            output_index: item,
                            command_index,
                            command: "",
                        },
                        Event::ShellCallCommandDelta {
                            output_index: item,
                            command_index,
                            delta: command,
                        },
                        Event::ShellCallCommandDone {
                            output_index: item,
                            command_index,
                            command,
                        },
                    ];
                    for ev in &events {
                        self.events.write(&mut self.out, ev);
                    }
                }
            }
            OutputItem::FunctionCall(f) => {
                if !f.arguments.is_empty() {
                    self.events.write(
                        &mut self.out,
                        &Event::FunctionCallArgumentsDelta {
                            item_id: &f.id,
                            output_index: item,
                            delta: &f.arguments,
                        },
                    );
                }
                self.events.write(
                    &mut self.out,
                    &Event::FunctionCallArgumentsDone {
                        item_id: &f.id,
                        output_index: item,
                        arguments: &f.arguments,
                    },
                );
            }
            _ => {}
        }
        self.item_done(item);
    }

    /// The upstream sampled more for a `compaction_trigger`'s summary: the `compaction` item
    /// opens with the first of it, and `response.compaction.compacting` follows, then at most
    /// every [`COMPACTING_EVERY`] seconds, as OpenAI sends them: "The existing
    /// response.output_item.added and response.output_item.done events mark that item's
    /// lifecycle; response.output_item.done carries its final encrypted content" (the API
    /// reference's streaming events). The item has no content until it is done: its
    /// `encrypted_content` is empty when added.
    fn compacting(&mut self, now: u64) {
        match self.compacting_at {
            Some(at) if now < at.saturating_add(COMPACTING_EVERY) => return,
            Some(_) => {}
            None => {
                self.output
                    .push(OutputItem::Compaction(compaction::opened(&self.plan, 0)));
                self.events.write(
                    &mut self.out,
                    &Event::OutputItemAdded {
                        output_index: 0,
                        item: &self.output[0],
                    },
                );
            }
        }
        self.compacting_at = Some(now);
        self.events.write(
            &mut self.out,
            &Event::CompactionCompacting {
                item_id: self.output[0].id(),
                output_index: 0,
            },
        );
    }

    /// A `compaction_trigger` request's one output item: the summary, sealed. False (and the
    /// stream failed) when there is no summary to seal.
    fn seal_summary(&mut self, now: u64) -> bool {
        let summary = std::mem::take(&mut self.summary);
        let item = (!summary.trim().is_empty())
            .then(|| compaction::sealed(&self.plan, 0, &summary))
            .flatten();
        let Some(item) = item else {
            self.fail(
                ErrorCode::UpstreamInvalidResponse,
                "The upstream's answer to the summarising request has no text.",
                now,
            );
            return false;
        };
        // Opened by the first of the summary, which there is.
        if self.output.is_empty() {
            self.compacting(now);
        }
        self.output[0] = OutputItem::Compaction(item);
        self.item_done(0);
        true
    }

    /// The answer is complete: close what is open and send the terminal event.
    fn complete(&mut self, now: u64) {
        if self.plan.compaction && !self.seal_summary(now) {
            return;
        }
        let (status, incomplete) = finish_status(self.finish_reason.as_deref());
        let item_status = self.item_status();
        self.close_current(item_status);
        self.close_calls(item_status);
        self.progress.status = status;
        self.progress.incomplete = incomplete;
        self.progress.completed_at = Some(now);
        let response = self.plan.resource(&self.progress, &self.output);
        let ev = if status == Status::Incomplete {
            Event::Incomplete { response }
        } else {
            Event::Completed { response }
        };
        self.events.write_response(&mut self.out, &ev, &self.echo);
        self.end();
    }

    /// The answer failed: close what is open as incomplete, then `error` and `response.failed`.
    fn fail(&mut self, code: impl Into<Code>, message: &str, _now: u64) {
        let code = code.into();
        // A context overflow is the request's fault, as before a stream (400).
        let kind = if code == ErrorCode::ContextLengthExceeded {
            ErrorKind::InvalidRequest
        } else {
            ErrorKind::Server
        };
        self.close_current(ItemStatus::Incomplete);
        self.close_calls(ItemStatus::Incomplete);
        if self.plan.compaction {
            // A compaction item is done only with its sealed summary: one left open has
            // nothing in it, and no response carries it.
            self.output.clear();
        }
        self.events.write(
            &mut self.out,
            &Event::Error {
                error: ErrorPayload {
                    kind: kind.as_str(),
                    code: Some(&code),
                    message,
                    param: None,
                },
            },
        );
        self.progress.status = Status::Failed;
        self.progress.error = Some(ResponseError {
            code,
            message: message.to_owned(),
        });
        let response = self.plan.resource(&self.progress, &self.output);
        self.events
            .write_response(&mut self.out, &Event::Failed { response }, &self.echo);
        self.end();
    }

    fn end(&mut self) {
        EventWriter::write_done(&mut self.out);
        self.phase = Phase::Done;
        // The rest of the upstream body is ignored; drop what the decoder holds.
        self.sse = SseDecoder::new(0);
    }
}

/// Writes the delta event `event(delta)` through `frame`, the frame of its part's deltas,
/// made from the first one (see [`DeltaFrame`]).
fn write_delta<'a>(
    events: &mut EventWriter,
    out: &mut Vec<u8>,
    frame: &mut Option<DeltaFrame>,
    event: impl Fn(&'a str) -> Event<'a>,
    delta: &'a str,
) {
    if frame.is_none() {
        *frame = DeltaFrame::new(&event(""));
    }
    match frame {
        Some(frame) => events.write_delta(out, frame, delta),
        None => events.write(out, &event(delta)),
    }
}

/// What the kept logprobs of a chunk cost in memory, roughly: they accumulate on the text
/// part like the text itself, so they count toward the same output cap.
fn logprobs_size(lp: Option<&chat::Logprobs>, kept: bool) -> usize {
    if !kept {
        return 0;
    }
    let token = |t: &str| t.len() * 5 + 16; // token, bytes as integers, logprob
    lp.and_then(|l| l.content.as_ref()).map_or(0, |tokens| {
        tokens
            .iter()
            .map(|t| {
                token(&t.token)
                    + t.top_logprobs
                        .iter()
                        .map(|top| token(&top.token))
                        .sum::<usize>()
            })
            .sum()
    })
}
