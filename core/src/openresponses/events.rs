//! The Responses semantic streaming events and their SSE encoding.
//!
//! Events borrow everything they carry, and [`EventWriter`] serialises each one straight
//! into the outgoing buffer: `event: <type>\ndata: <one-line JSON>\n\n`, LF only, with
//! `sequence_number` (always the last field) counted here so it is consecutive by
//! construction.

use std::ops::Range;

use bytes::Bytes;
use serde::Serialize;

use super::response::{EchoJson, LogProb, OutputItem, ResponseResource};

/// A content part as announced by `content_part.added` / `.done`.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part<'a> {
    OutputText {
        text: &'a str,
        annotations: [(); 0],
        logprobs: &'a [LogProb],
    },
    Refusal {
        refusal: &'a str,
    },
    ReasoningText {
        text: &'a str,
    },
}

/// `error` event payload (`ErrorPayload` in the schema).
#[derive(Debug, Serialize)]
pub struct ErrorPayload<'a> {
    #[serde(rename = "type")]
    pub kind: &'a str,
    pub code: Option<&'a super::Code>,
    pub message: &'a str,
    pub param: Option<&'a str>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "type")]
pub enum Event<'a> {
    #[serde(rename = "response.created")]
    Created { response: ResponseResource<'a> },
    #[serde(rename = "response.in_progress")]
    InProgress { response: ResponseResource<'a> },
    #[serde(rename = "response.completed")]
    Completed { response: ResponseResource<'a> },
    #[serde(rename = "response.incomplete")]
    Incomplete { response: ResponseResource<'a> },
    #[serde(rename = "response.failed")]
    Failed { response: ResponseResource<'a> },
    #[serde(rename = "response.output_item.added")]
    OutputItemAdded {
        output_index: usize,
        item: &'a OutputItem,
    },
    #[serde(rename = "response.output_item.done")]
    OutputItemDone {
        output_index: usize,
        item: &'a OutputItem,
    },
    #[serde(rename = "response.content_part.added")]
    ContentPartAdded {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        part: Part<'a>,
    },
    #[serde(rename = "response.content_part.done")]
    ContentPartDone {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        part: Part<'a>,
    },
    #[serde(rename = "response.output_text.delta")]
    OutputTextDelta {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        delta: &'a str,
        logprobs: &'a [LogProb],
    },
    #[serde(rename = "response.output_text.done")]
    OutputTextDone {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        text: &'a str,
        logprobs: &'a [LogProb],
    },
    #[serde(rename = "response.refusal.delta")]
    RefusalDelta {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        delta: &'a str,
    },
    #[serde(rename = "response.refusal.done")]
    RefusalDone {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        refusal: &'a str,
    },
    /// The OpenResponses name for reasoning text deltas.
    #[serde(rename = "response.reasoning.delta")]
    ReasoningDelta {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        delta: &'a str,
    },
    #[serde(rename = "response.reasoning.done")]
    ReasoningDone {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        text: &'a str,
    },
    /// OpenAI's name for the same event (opt-in, for clients built on OpenAI's SDK types).
    #[serde(rename = "response.reasoning_text.delta")]
    ReasoningTextDelta {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        delta: &'a str,
    },
    #[serde(rename = "response.reasoning_text.done")]
    ReasoningTextDone {
        item_id: &'a str,
        output_index: usize,
        content_index: usize,
        text: &'a str,
    },
    #[serde(rename = "response.function_call_arguments.delta")]
    FunctionCallArgumentsDelta {
        item_id: &'a str,
        output_index: usize,
        delta: &'a str,
    },
    #[serde(rename = "response.function_call_arguments.done")]
    FunctionCallArgumentsDone {
        item_id: &'a str,
        output_index: usize,
        arguments: &'a str,
    },
    /// OpenAI's events for a `custom_tool_call` (not in the OpenResponses schema).
    #[serde(rename = "response.custom_tool_call_input.delta")]
    CustomToolCallInputDelta {
        item_id: &'a str,
        output_index: usize,
        delta: &'a str,
    },
    #[serde(rename = "response.custom_tool_call_input.done")]
    CustomToolCallInputDone {
        item_id: &'a str,
        output_index: usize,
        input: &'a str,
    },
    /// OpenAI's events for the commands of a `shell_call` (not in the OpenResponses schema).
    #[serde(rename = "response.shell_call_command.added")]
    ShellCallCommandAdded {
        output_index: usize,
        command_index: usize,
        command: &'a str,
    },
    #[serde(rename = "response.shell_call_command.delta")]
    ShellCallCommandDelta {
        output_index: usize,
        command_index: usize,
        delta: &'a str,
    },
    #[serde(rename = "response.shell_call_command.done")]
    ShellCallCommandDone {
        output_index: usize,
        command_index: usize,
        command: &'a str,
    },
    /// OpenAI's progress event of a compaction (openai-python 3.57's
    /// `ResponseCompactionCompactingEvent`, not in the OpenResponses schema): new summary was
    /// sampled for the `compaction` item `item_id`; it carries none of it.
    #[serde(rename = "response.compaction.compacting")]
    CompactionCompacting {
        item_id: &'a str,
        output_index: usize,
    },
    #[serde(rename = "error")]
    Error { error: ErrorPayload<'a> },
}

impl Event<'_> {
    /// The `type` of the event, also used as the SSE `event:` name.
    pub fn name(&self) -> &'static str {
        match self {
            Event::Created { .. } => "response.created",
            Event::InProgress { .. } => "response.in_progress",
            Event::Completed { .. } => "response.completed",
            Event::Incomplete { .. } => "response.incomplete",
            Event::Failed { .. } => "response.failed",
            Event::OutputItemAdded { .. } => "response.output_item.added",
            Event::OutputItemDone { .. } => "response.output_item.done",
            Event::ContentPartAdded { .. } => "response.content_part.added",
            Event::ContentPartDone { .. } => "response.content_part.done",
            Event::OutputTextDelta { .. } => "response.output_text.delta",
            Event::OutputTextDone { .. } => "response.output_text.done",
            Event::RefusalDelta { .. } => "response.refusal.delta",
            Event::RefusalDone { .. } => "response.refusal.done",
            Event::ReasoningDelta { .. } => "response.reasoning.delta",
            Event::ReasoningDone { .. } => "response.reasoning.done",
            Event::ReasoningTextDelta { .. } => "response.reasoning_text.delta",
            Event::ReasoningTextDone { .. } => "response.reasoning_text.done",
            Event::FunctionCallArgumentsDelta { .. } => "response.function_call_arguments.delta",
            Event::FunctionCallArgumentsDone { .. } => "response.function_call_arguments.done",
            Event::CustomToolCallInputDelta { .. } => "response.custom_tool_call_input.delta",
            Event::CustomToolCallInputDone { .. } => "response.custom_tool_call_input.done",
            Event::ShellCallCommandAdded { .. } => "response.shell_call_command.added",
            Event::ShellCallCommandDelta { .. } => "response.shell_call_command.delta",
            Event::ShellCallCommandDone { .. } => "response.shell_call_command.done",
            Event::CompactionCompacting { .. } => "response.compaction.compacting",
            Event::Error { .. } => "error",
        }
    }
}

/// Encodes events as SSE frames, numbering them from 0, and notes where each event's JSON
/// lies in what it wrote (see [`Events`]).
#[derive(Debug, Default)]
pub struct EventWriter {
    next_sequence: u64,
    /// The JSON objects written since the last [`EventWriter::take_spans`], as ranges of the
    /// buffer they were written to.
    spans: Vec<Range<usize>>,
}

/// Bytes of the Responses event stream as the core wrote them (`event:` / `data:` frames),
/// with where each event's JSON object lies in them: an SSE transport sends the bytes as they
/// are, the WebSocket transport sends each event's JSON as one message, and neither scans
/// what the core wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Events {
    bytes: Bytes,
    spans: Vec<Range<usize>>,
}

/// The SSE bytes.
impl std::ops::Deref for Events {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl Events {
    /// `spans`: each event's JSON in `bytes`, in order.
    pub fn new(bytes: Bytes, spans: Vec<Range<usize>>) -> Events {
        debug_assert!(spans.iter().all(|s| s.end <= bytes.len()));
        Events { bytes, spans }
    }

    /// The SSE bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }

    /// No bytes at all (not even the closing `[DONE]`).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Each event's JSON object, in order: slices of the same buffer, no copy. The closing
    /// `[DONE]` is an SSE convention and is not among them.
    pub fn messages(&self) -> impl ExactSizeIterator<Item = Bytes> + '_ {
        self.spans.iter().map(|s| self.bytes.slice(s.clone()))
    }

    /// The last event's JSON object (a stream's terminal event, when it ended).
    pub fn last(&self) -> Option<Bytes> {
        self.spans.last().map(|s| self.bytes.slice(s.clone()))
    }

    /// `self` then `other`, copied only if both hold bytes.
    pub fn concat(self, other: Events) -> Events {
        if self.bytes.is_empty() {
            return other;
        }
        if other.bytes.is_empty() {
            return self;
        }
        let offset = self.bytes.len();
        let mut bytes = Vec::with_capacity(offset + other.bytes.len());
        bytes.extend_from_slice(&self.bytes);
        bytes.extend_from_slice(&other.bytes);
        let mut spans = self.spans;
        spans.extend(
            other
                .spans
                .into_iter()
                .map(|s| s.start + offset..s.end + offset),
        );
        Events {
            bytes: Bytes::from(bytes),
            spans,
        }
    }
}

/// A delta event's frame split around its delta. Every delta of one content part (or of one
/// call's arguments) differs from the one before only in its text and its sequence number:
/// the rest is serialised once per part ([`DeltaFrame::new`]) and copied for each delta
/// ([`EventWriter::write_delta`]).
#[derive(Debug, Clone)]
pub struct DeltaFrame {
    /// From `event: ` to `"delta":`.
    head: Vec<u8>,
    /// After the delta, up to the `sequence_number` (the object left open).
    tail: Vec<u8>,
}

impl DeltaFrame {
    /// The frame of `event`, a delta event whose delta is empty; `None` for an event without
    /// a `delta` field.
    pub fn new(event: &Event<'_>) -> Option<DeltaFrame> {
        const EMPTY_DELTA: &[u8] = b"\"delta\":\"\"";
        let mut frame = Vec::new();
        EventWriter::open_frame(&mut frame, event);
        // Quotes inside JSON strings are escaped: the only unescaped `"delta":""` is the field.
        let at = memchr::memmem::find(&frame, EMPTY_DELTA)?;
        let tail = frame[at + EMPTY_DELTA.len()..].to_vec();
        frame.truncate(at + EMPTY_DELTA.len() - 2);
        Some(DeltaFrame { head: frame, tail })
    }
}

impl EventWriter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of events written so far.
    pub fn count(&self) -> u64 {
        self.next_sequence
    }

    /// The next number, for an event of the same stream written elsewhere (a WebSocket
    /// steer's acknowledgement among a response's events).
    pub fn take_number(&mut self) -> u64 {
        self.next_sequence += 1;
        self.next_sequence - 1
    }

    /// The JSON objects written since the last call, as ranges of the buffer they went to
    /// (the caller writes every event of one [`Events`] into one buffer, and takes both
    /// together).
    pub fn take_spans(&mut self) -> Vec<Range<usize>> {
        std::mem::take(&mut self.spans)
    }

    pub fn write(&mut self, out: &mut Vec<u8>, event: &Event<'_>) {
        let start = out.len();
        Self::open_frame(out, event);
        self.close_frame(out, start);
    }

    /// A `response.*` event (created, in progress, completed, incomplete, failed), its
    /// resource's echo copied from `echo` (made from the same request's echo): the same bytes
    /// as [`EventWriter::write`] of that event. Any other event is written as `write` does.
    pub fn write_response(&mut self, out: &mut Vec<u8>, event: &Event<'_>, echo: &EchoJson) {
        let (Event::Created { response }
        | Event::InProgress { response }
        | Event::Completed { response }
        | Event::Incomplete { response }
        | Event::Failed { response }) = event
        else {
            return self.write(out, event);
        };
        let start = out.len();
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(event.name().as_bytes());
        out.extend_from_slice(b"\ndata: {\"type\":\"");
        out.extend_from_slice(event.name().as_bytes());
        out.extend_from_slice(b"\",\"response\":");
        response.write_with(out, echo);
        self.close_frame(out, start);
    }

    /// The event of `frame` with `delta` as its delta: the same bytes as [`EventWriter::write`]
    /// of that event.
    pub fn write_delta(&mut self, out: &mut Vec<u8>, frame: &DeltaFrame, delta: &str) {
        let start = out.len();
        out.extend_from_slice(&frame.head);
        // A string into memory: cannot fail.
        let _ = serde_json::to_writer(&mut *out, delta);
        out.extend_from_slice(&frame.tail);
        self.close_frame(out, start);
    }

    /// `event: <type>\ndata: <the event's JSON object without its closing brace>`.
    fn open_frame(out: &mut Vec<u8>, event: &Event<'_>) {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(event.name().as_bytes());
        out.extend_from_slice(b"\ndata: ");
        // serde_json escapes control characters, so the data stays on one line. Writing
        // borrowed strings and numbers into memory cannot fail.
        let _ = serde_json::to_writer(&mut *out, event);
        // Every event is a JSON object: its sequence number goes in before the closing brace.
        out.pop();
    }

    /// `,"sequence_number":N}` and the blank line; notes where the frame begun at `start`
    /// has its JSON (after its `data: `, up to the blank line).
    fn close_frame(&mut self, out: &mut Vec<u8>, start: usize) {
        out.extend_from_slice(b",\"sequence_number\":");
        out.extend_from_slice(itoa::Buffer::new().format(self.next_sequence).as_bytes());
        out.extend_from_slice(b"}\n\n");
        self.next_sequence += 1;
        // The event line is `event: <name>\n`, a few dozen bytes.
        const DATA: &[u8] = b"\ndata: ";
        let data =
            memchr::memmem::find(&out[start..], DATA).map_or(start, |at| start + at + DATA.len());
        self.spans.push(data..out.len() - 2);
    }

    /// The stream's closing sentinel, after the terminal event.
    pub fn write_done(out: &mut Vec<u8>) {
        out.extend_from_slice(b"data: [DONE]\n\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_one_line_json_with_consecutive_numbers() {
        let mut w = EventWriter::new();
        let mut out = Vec::new();
        let ev = Event::OutputTextDelta {
            item_id: "msg_1",
            output_index: 0,
            content_index: 0,
            delta: "a\nb\r\"c\"",
            logprobs: &[],
        };
        w.write(&mut out, &ev);
        w.write(&mut out, &ev);
        let text = std::str::from_utf8(&out).unwrap();
        let frames: Vec<&str> = text.split_terminator("\n\n").collect();
        assert_eq!(frames.len(), 2);
        for (i, f) in frames.iter().enumerate() {
            let mut lines = f.split('\n');
            assert_eq!(lines.next(), Some("event: response.output_text.delta"));
            let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
            assert!(lines.next().is_none());
            let v: serde_json::Value = serde_json::from_str(data).unwrap();
            assert_eq!(v["type"], "response.output_text.delta");
            assert_eq!(v["sequence_number"], i as u64);
            assert_eq!(v["delta"], "a\nb\r\"c\"");
            assert_eq!(v["logprobs"], serde_json::json!([]));
        }
    }

    #[test]
    fn events_know_where_each_json_object_lies() {
        let mut w = EventWriter::new();
        let mut out = Vec::new();
        let ev = |delta| Event::OutputTextDelta {
            item_id: "msg_1",
            output_index: 0,
            content_index: 0,
            delta,
            logprobs: &[],
        };
        w.write(&mut out, &ev("data: {\"x\"}\n\n"));
        let frame = DeltaFrame::new(&ev("")).unwrap();
        w.write_delta(&mut out, &frame, "b");
        EventWriter::write_done(&mut out);
        let events = Events::new(Bytes::from(out), w.take_spans());
        // What a scan of the SSE finds, `[DONE]` left out.
        let scanned: Vec<&[u8]> = std::str::from_utf8(&events)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(str::as_bytes)
            .collect();
        let messages: Vec<Bytes> = events.messages().collect();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages, scanned);
        assert_eq!(events.last().as_deref(), scanned.last().copied());
        assert!(w.take_spans().is_empty());
        // Two batches made one: the second's objects move with it.
        let both = events.clone().concat(events.clone());
        assert_eq!(both.messages().count(), 4);
        assert_eq!(both.last(), events.last());
    }

    #[test]
    fn a_response_event_with_its_echo_serialised_once_writes_the_bytes_of_the_event() {
        use crate::openresponses::response::*;
        use serde_json::value::RawValue;
        let raw = |s: &str| RawValue::from_string(s.to_owned()).unwrap();
        let plain = Echo::default();
        let full = Echo {
            instructions: Some(raw(r#""Be \"brief\".\nAlways.""#)),
            tools: vec![EchoTool {
                name: "get_weather".into(),
                description: Some(raw(r#""The weather""#)),
                parameters: Some(raw(
                    r#"{"type":"object","properties":{"city":{"type":"string"}}}"#,
                )),
                strict: Some(true),
            }],
            tool_choice: EchoToolChoice::AllowedTools {
                mode: "required",
                tools: vec!["get_weather".into()],
            },
            text: EchoText {
                format: EchoFormat::JsonSchema {
                    name: "w".into(),
                    description: None,
                    schema: raw(r#"{"type":"object"}"#),
                    strict: true,
                },
                verbosity: Some("low"),
            },
            reasoning: Some(EchoReasoning {
                effort: Some("high".into()),
                summary: Some("auto"),
            }),
            max_output_tokens: Some(100),
            max_tool_calls: Some(2),
            metadata: Some(raw(r#"{"k":"v"}"#)),
            safety_identifier: Some("u\u{e9}".into()),
            prompt_cache_key: Some("key".into()),
            previous_response_id: Some("resp_0".into()),
            ..Echo::default()
        };
        let output = [OutputItem::Message(MessageItem {
            id: "msg_1".into(),
            status: ItemStatus::Completed,
            role: "assistant".into(),
            content: vec![OutputContent::Refusal {
                refusal: "no".into(),
            }],
            phase: Some(Phase::FinalAnswer),
        })];
        let usage = Usage::default();
        let error = ResponseError {
            code: crate::openresponses::ErrorCode::ServerError.into(),
            message: "m".into(),
        };
        let incomplete = IncompleteDetails {
            reason: "max_output_tokens".into(),
        };
        for echo in [&plain, &full] {
            let state = ResponseState {
                id: "resp_1",
                created_at: 1,
                completed_at: Some(2),
                status: Status::Completed,
                incomplete_details: Some(&incomplete),
                model: "m\"1",
                output: &output,
                error: Some(&error),
                usage: Some(&usage),
            };
            let response = ResponseResource::new(state, echo);
            let bare = ResponseResource::new(
                ResponseState {
                    output: &[],
                    completed_at: None,
                    incomplete_details: None,
                    error: None,
                    usage: None,
                    ..state
                },
                echo,
            );
            let json = EchoJson::new(echo);
            for response in [response, bare] {
                let events = [
                    Event::Created { response },
                    Event::InProgress { response },
                    Event::Completed { response },
                    Event::Incomplete { response },
                    Event::Failed { response },
                ];
                let (mut generic, mut once) = (EventWriter::new(), EventWriter::new());
                let (mut a, mut b) = (Vec::new(), Vec::new());
                for event in &events {
                    generic.write(&mut a, event);
                    once.write_response(&mut b, event, &json);
                }
                assert_eq!(String::from_utf8(a).unwrap(), String::from_utf8(b).unwrap());
            }
        }
    }

    #[test]
    fn a_delta_frame_writes_the_bytes_of_its_event() {
        let deltas = [
            "",
            "Hello",
            " \"quoted\" \\ back",
            "line\nbreak\r\ttab\u{1}\u{1f}\u{7f}",
            "\u{e9}t\u{e9} \u{1f600} </script>",
            "\"delta\":\"\"",
        ];
        let lp = [LogProb {
            token: "x".into(),
            logprob: -0.5,
            bytes: vec![120],
            top_logprobs: Vec::new(),
        }];
        // Each kind of delta event, carrying `d`.
        let events = |d| {
            [
                Event::OutputTextDelta {
                    item_id: "msg_\"1\"",
                    output_index: 3,
                    content_index: 1,
                    delta: d,
                    logprobs: &[],
                },
                Event::OutputTextDelta {
                    item_id: "msg_1",
                    output_index: 0,
                    content_index: 0,
                    delta: d,
                    logprobs: &lp,
                },
                Event::ReasoningTextDelta {
                    item_id: "rs_1",
                    output_index: 0,
                    content_index: 0,
                    delta: d,
                },
                Event::RefusalDelta {
                    item_id: "msg_1",
                    output_index: 12,
                    content_index: 2,
                    delta: d,
                },
                Event::FunctionCallArgumentsDelta {
                    item_id: "fc_\"delta\":\"\"",
                    output_index: 1,
                    delta: d,
                },
            ]
        };
        for kind in 0..5 {
            let frame = DeltaFrame::new(&events("")[kind]).unwrap();
            let (mut generic, mut framed) = (EventWriter::new(), EventWriter::new());
            let (mut a, mut b) = (Vec::new(), Vec::new());
            for delta in deltas {
                generic.write(&mut a, &events(delta)[kind]);
                framed.write_delta(&mut b, &frame, delta);
            }
            assert_eq!(String::from_utf8(a).unwrap(), String::from_utf8(b).unwrap());
        }
        let done = Event::OutputTextDone {
            item_id: "msg_1",
            output_index: 0,
            content_index: 0,
            text: "",
            logprobs: &[],
        };
        assert!(DeltaFrame::new(&done).is_none());
    }
}
