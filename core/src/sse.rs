//! Incremental, bounded, sans-IO decoder for `text/event-stream` bodies.
//!
//! Follows the WHATWG "interpreting an event stream" algorithm for the parts
//! that Chat Completions servers use: `data:` and `event:` fields, comments,
//! LF / CRLF / CR line endings, and a leading UTF-8 BOM. `id:`, `retry:` and
//! unknown fields are ignored. Unlike WHATWG, `finish` dispatches a trailing
//! event that has data lines but no terminating blank line, so a body cut
//! after `data: [DONE]\n` is not silently lost.
//!
//! The decoder is a streaming state machine: it never buffers whole lines.
//! Field names are matched on the fly (at most five bytes of look-ahead,
//! enough for `event`), values of ignored fields and comments are discarded as
//! they arrive, and `data:` values are appended straight into the pending
//! event's buffer. Input may therefore be split anywhere, down to one byte per
//! chunk, at linear cost.

use std::fmt;

use bytes::Bytes;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// Value of the last `event:` field, decoded lossily; `None` when absent
    /// or empty (WHATWG treats an empty type as the default `message`).
    pub event: Option<String>,
    /// The `data:` values joined with `\n`, as raw bytes.
    pub data: Bytes,
}

/// One dispatched event, borrowed from the decoder ([`SseDecoder::push_with`]): the same
/// fields as [`SseEvent`], without copying them out of the decoder's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEventRef<'a> {
    /// The last `event:` field's value, as raw bytes; `None` when absent or empty.
    pub event: Option<&'a [u8]>,
    /// The `data:` values joined with `\n`, as raw bytes.
    pub data: &'a [u8],
}

impl SseEventRef<'_> {
    pub fn to_owned(self) -> SseEvent {
        SseEvent {
            event: self.event.map(|e| String::from_utf8_lossy(e).into_owned()),
            data: Bytes::copy_from_slice(self.data),
        }
    }
}

/// Decoding failure; the decoder stays poisoned after returning one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseError {
    /// The event being assembled grew beyond the configured bound.
    FrameTooLarge { limit: usize },
}

impl fmt::Display for SseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SseError::FrameTooLarge { limit } => {
                write!(f, "server-sent event exceeds the {limit}-byte frame limit")
            }
        }
    }
}

impl std::error::Error for SseError {}

const BOM: &[u8; 3] = b"\xEF\xBB\xBF";
/// Longest field name we care about (`event`); longer names are ignored.
const NAME_CAP: usize = 5;
/// The pending event's buffer is kept from one event to the next (no allocation per event)
/// unless an event made it larger than this: then it is released.
const KEPT_BUFFER_BYTES: usize = 16 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Data,
    Event,
    Ignored,
}

#[derive(Debug, Clone, Copy)]
enum Line {
    /// Before the colon. `len` counts every name byte seen (saturating) while
    /// only the first `NAME_CAP` are kept, so `len == 0` at a line end means
    /// a blank line.
    Name { buf: [u8; NAME_CAP], len: usize },
    /// After the colon; `skip_space` is set until the first value byte.
    Value { field: Field, skip_space: bool },
}

const FRESH_LINE: Line = Line::Name {
    buf: [0; NAME_CAP],
    len: 0,
};

/// Push-based decoder: feed body chunks as they arrive, collect events.
#[derive(Debug)]
pub struct SseDecoder {
    max_frame_bytes: usize,
    line: Line,
    /// The last chunk ended with CR: a leading LF in the next one is part of
    /// the same line break.
    pending_cr: bool,
    /// `Some(n)`: still at the start of the stream with `n` BOM bytes matched
    /// (and withheld, to be replayed if the BOM turns out not to be one).
    bom_seen: Option<usize>,
    /// Data of the pending event, separators included.
    data: Vec<u8>,
    /// Whether the pending event has at least one data line (its data may
    /// still be empty).
    has_data: bool,
    event_name: Vec<u8>,
    poisoned: bool,
}

impl SseDecoder {
    /// `max_frame_bytes` bounds the bytes held for one pending event (its
    /// data plus its event name).
    pub fn new(max_frame_bytes: usize) -> Self {
        SseDecoder {
            max_frame_bytes,
            line: FRESH_LINE,
            pending_cr: false,
            bom_seen: Some(0),
            data: Vec::new(),
            has_data: false,
            event_name: Vec::new(),
            poisoned: false,
        }
    }

    /// Feed one chunk; appends every event completed by it to `out`, in order.
    ///
    /// On error, events completed earlier in the chunk have already been
    /// appended, and the decoder is poisoned: every later call fails too.
    pub fn push(&mut self, chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        self.push_with(chunk, |e| out.push(e.to_owned()))
    }

    /// [`SseDecoder::push`], handing each event to `on_event` as it completes, borrowed.
    pub fn push_with(
        &mut self,
        chunk: &[u8],
        mut on_event: impl FnMut(SseEventRef<'_>),
    ) -> Result<(), SseError> {
        self.check_poisoned()?;
        let chunk = self.strip_bom(chunk, &mut on_event)?;
        self.process(chunk, &mut on_event)
    }

    /// End of input: dispatches a last event that had data lines but no
    /// terminating blank line (an unterminated last line counts as a line).
    /// The decoder is then reset and may decode a new stream.
    pub fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        self.finish_with(|e| out.push(e.to_owned()))
    }

    /// [`SseDecoder::finish`], handing the last event to `on_event`, borrowed.
    pub fn finish_with(
        &mut self,
        mut on_event: impl FnMut(SseEventRef<'_>),
    ) -> Result<(), SseError> {
        self.check_poisoned()?;
        // A partial BOM still withheld here could only have formed an ignored
        // field name, so dropping it (via the reset below) is exact.
        if !matches!(self.line, Line::Name { len: 0, .. }) {
            self.end_line(&mut on_event)?;
        }
        self.dispatch(&mut on_event);
        *self = SseDecoder::new(self.max_frame_bytes);
        Ok(())
    }

    /// Bytes currently held for the incomplete event: its data so far
    /// (including the partial value of an unterminated `data:` line) plus its
    /// event name. Never exceeds `max_frame_bytes`. Excludes the constant
    /// look-ahead (a partial BOM and at most five field-name bytes).
    pub fn held_bytes(&self) -> usize {
        self.data.len() + self.event_name.len()
    }

    fn check_poisoned(&self) -> Result<(), SseError> {
        if self.poisoned {
            Err(self.too_large())
        } else {
            Ok(())
        }
    }

    fn too_large(&self) -> SseError {
        SseError::FrameTooLarge {
            limit: self.max_frame_bytes,
        }
    }

    /// Skips a BOM at the very start of the stream, even when it arrives split
    /// across chunks. Returns the part of `chunk` left to process.
    fn strip_bom<'a>(
        &mut self,
        chunk: &'a [u8],
        out: &mut impl FnMut(SseEventRef<'_>),
    ) -> Result<&'a [u8], SseError> {
        let Some(seen) = self.bom_seen else {
            return Ok(chunk);
        };
        let want = &BOM[seen..];
        let n = want.len().min(chunk.len());
        if chunk[..n] == want[..n] {
            if n == want.len() {
                self.bom_seen = None;
                return Ok(&chunk[n..]);
            }
            // The chunk is a strict prefix of the rest of the BOM: undecided.
            self.bom_seen = Some(seen + n);
            return Ok(&[]);
        }
        // Not a BOM after all: the withheld bytes are ordinary input.
        self.bom_seen = None;
        self.process(&BOM[..seen], out)?;
        Ok(chunk)
    }

    fn process(
        &mut self,
        mut rest: &[u8],
        out: &mut impl FnMut(SseEventRef<'_>),
    ) -> Result<(), SseError> {
        if self.pending_cr {
            if let Some((&first, tail)) = rest.split_first() {
                self.pending_cr = false;
                if first == b'\n' {
                    rest = tail;
                }
            }
        }
        // memchr scans a word (or a vector) at a time: the line ends are most of the work.
        while let Some(i) = memchr::memchr2(b'\n', b'\r', rest) {
            self.feed(&rest[..i])?;
            self.end_line(out)?;
            let mut next = i + 1;
            if rest[i] == b'\r' {
                match rest.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.pending_cr = true,
                }
            }
            rest = &rest[next..];
        }
        self.feed(rest)
    }

    /// Consumes a piece of the current line (no line terminators in `seg`).
    fn feed(&mut self, mut seg: &[u8]) -> Result<(), SseError> {
        while !seg.is_empty() {
            match &mut self.line {
                Line::Name { buf, len } => {
                    let colon = memchr::memchr(b':', seg);
                    let name = &seg[..colon.unwrap_or(seg.len())];
                    if let Some(room) = buf.get_mut(*len..) {
                        let n = room.len().min(name.len());
                        room[..n].copy_from_slice(&name[..n]);
                    }
                    *len = len.saturating_add(name.len());
                    match colon {
                        Some(i) => {
                            self.start_value()?;
                            seg = &seg[i + 1..];
                        }
                        None => return Ok(()),
                    }
                }
                Line::Value { field, skip_space } => {
                    let field = *field;
                    if std::mem::take(skip_space) {
                        if let Some(tail) = seg.strip_prefix(b" ") {
                            seg = tail;
                            continue;
                        }
                    }
                    return self.append_value(field, seg);
                }
            }
        }
        Ok(())
    }

    /// The field name is complete: apply its effects that do not depend on
    /// the value, then switch to value mode.
    fn start_value(&mut self) -> Result<(), SseError> {
        let field = match self.line {
            Line::Name { buf, len } if len <= NAME_CAP => match &buf[..len] {
                b"data" => Field::Data,
                b"event" => Field::Event,
                _ => Field::Ignored,
            },
            _ => Field::Ignored,
        };
        match field {
            Field::Data => {
                if self.has_data {
                    self.reserve(1)?;
                    self.data.push(b'\n');
                }
                self.has_data = true;
            }
            // The last `event:` line wins, so its value replaces the old one.
            Field::Event => self.event_name.clear(),
            Field::Ignored => {}
        }
        self.line = Line::Value {
            field,
            skip_space: true,
        };
        Ok(())
    }

    fn append_value(&mut self, field: Field, value: &[u8]) -> Result<(), SseError> {
        if field == Field::Ignored {
            return Ok(());
        }
        self.reserve(value.len())?;
        // Single copy into the event buffer, which `dispatch` lends out.
        let buf = match field {
            Field::Data => &mut self.data,
            _ => &mut self.event_name,
        };
        buf.extend_from_slice(value);
        Ok(())
    }

    /// Checks that `extra` more bytes fit in the pending event.
    fn reserve(&mut self, extra: usize) -> Result<(), SseError> {
        if self.held_bytes().saturating_add(extra) > self.max_frame_bytes {
            return Err(self.poison());
        }
        Ok(())
    }

    fn poison(&mut self) -> SseError {
        self.poisoned = true;
        // Release the memory: nothing held can ever be emitted now.
        self.data = Vec::new();
        self.event_name = Vec::new();
        self.too_large()
    }

    fn end_line(&mut self, out: &mut impl FnMut(SseEventRef<'_>)) -> Result<(), SseError> {
        match self.line {
            Line::Name { len: 0, .. } => self.dispatch(out),
            // A line without a colon is a field name with an empty value.
            Line::Name { .. } => self.start_value()?,
            Line::Value { .. } => {}
        }
        self.line = FRESH_LINE;
        Ok(())
    }

    /// Blank line: emits the pending event if it has data lines; the event
    /// name is reset either way.
    fn dispatch(&mut self, out: &mut impl FnMut(SseEventRef<'_>)) {
        if self.has_data {
            out(SseEventRef {
                event: (!self.event_name.is_empty()).then_some(self.event_name.as_slice()),
                data: &self.data,
            });
        }
        self.has_data = false;
        self.data.clear();
        self.event_name.clear();
        if self.data.capacity() > KEPT_BUFFER_BYTES {
            self.data = Vec::new();
        }
    }
}

/// `body` cut after each blank line (`\n\n`): one piece per frame, what follows the last
/// one (if anything) last, as an upstream writing each event on its own hands them over.
pub fn split_frames(body: &[u8]) -> Vec<&[u8]> {
    let mut pieces = Vec::new();
    let mut rest = body;
    while let Some(end) = rest.windows(2).position(|w| w == b"\n\n") {
        let (frame, tail) = rest.split_at(end + 2);
        pieces.push(frame);
        rest = tail;
    }
    if !rest.is_empty() {
        pieces.push(rest);
    }
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::sample::Index;

    const BIG: usize = 1 << 20;

    const FIXTURES: [(&str, &[u8]); 5] = [
        (
            "vllm-0.32-text",
            include_bytes!("../../tests/fixtures/upstream/vllm-0.32-text.sse"),
        ),
        (
            "vllm-0.32-tool-required",
            include_bytes!("../../tests/fixtures/upstream/vllm-0.32-tool-required.sse"),
        ),
        (
            "llama-server-text",
            include_bytes!("../../tests/fixtures/upstream/llama-server-text.sse"),
        ),
        (
            "llama-server-reasoning",
            include_bytes!("../../tests/fixtures/upstream/llama-server-reasoning.sse"),
        ),
        (
            "llama-server-tool",
            include_bytes!("../../tests/fixtures/upstream/llama-server-tool.sse"),
        ),
    ];

    fn ev(event: Option<&str>, data: &[u8]) -> SseEvent {
        SseEvent {
            event: event.map(str::to_owned),
            data: Bytes::copy_from_slice(data),
        }
    }

    fn msg(data: &str) -> SseEvent {
        ev(None, data.as_bytes())
    }

    /// Everything observable about one decoding run.
    #[derive(Debug, PartialEq)]
    struct Outcome {
        events: Vec<SseEvent>,
        result: Result<(), SseError>,
        max_held: usize,
    }

    /// Pushes `chunks` in order, then finishes; stops at the first error.
    fn run<'a>(max: usize, chunks: impl IntoIterator<Item = &'a [u8]>) -> Outcome {
        let mut dec = SseDecoder::new(max);
        let mut events = Vec::new();
        let mut max_held = 0;
        let mut result = Ok(());
        for chunk in chunks {
            result = dec.push(chunk, &mut events);
            max_held = max_held.max(dec.held_bytes());
            if result.is_err() {
                break;
            }
        }
        if result.is_ok() {
            result = dec.finish(&mut events);
        }
        Outcome {
            events,
            result,
            max_held,
        }
    }

    fn decode(chunks: &[&[u8]]) -> Vec<SseEvent> {
        let outcome = run(BIG, chunks.iter().copied());
        assert_eq!(outcome.result, Ok(()));
        outcome.events
    }

    fn bytewise(input: &[u8], max: usize) -> Outcome {
        run(max, input.chunks(1))
    }

    /// Splits `input` at the given (unsorted, possibly repeated) positions.
    fn split<'a>(input: &'a [u8], cuts: &[Index]) -> Vec<&'a [u8]> {
        let mut at: Vec<usize> = cuts.iter().map(|c| c.index(input.len() + 1)).collect();
        at.sort_unstable();
        let mut chunks = Vec::with_capacity(at.len() + 1);
        let mut start = 0;
        for cut in at {
            chunks.push(&input[start..cut]);
            start = cut;
        }
        chunks.push(&input[start..]);
        chunks
    }

    #[test]
    fn lf_line_endings() {
        assert_eq!(decode(&[b"data: a\n\ndata: b\n\n"]), [msg("a"), msg("b")]);
    }

    #[test]
    fn crlf_line_endings() {
        assert_eq!(
            decode(&[b"data: a\r\n\r\ndata: b\r\n\r\n"]),
            [msg("a"), msg("b")]
        );
    }

    #[test]
    fn cr_line_endings() {
        assert_eq!(decode(&[b"data: a\r\rdata: b\r\r"]), [msg("a"), msg("b")]);
    }

    #[test]
    fn mixed_line_endings() {
        assert_eq!(
            decode(&[b"data: a\rdata: b\r\n\ndata: c\n\r\ndata: d\r\n\r"]),
            [msg("a\nb"), msg("c"), msg("d")]
        );
    }

    #[test]
    fn crlf_split_across_chunks_is_one_line_break() {
        // Were the split CRLF two breaks, the LF would be a blank line and
        // dispatch "a" alone.
        assert_eq!(
            decode(&[b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n"]),
            [msg("a\nb")]
        );
        // The pending CR survives empty chunks.
        assert_eq!(decode(&[b"data: a\r", b"", b"\n", b"\r\n"]), [msg("a")]);
        // CR then a non-LF byte: the CR alone was the break.
        assert_eq!(decode(&[b"data: a\r", b"\r\n"]), [msg("a")]);
        assert_eq!(decode(&[b"data: a\r", b"data: b\n\n"]), [msg("a\nb")]);
    }

    #[test]
    fn comments_are_ignored() {
        assert_eq!(decode(&[b": keep-alive\n\n"]), []);
        assert_eq!(
            decode(&[b": ping\ndata: a\n:\n: data: no\ndata: b\n\n"]),
            [msg("a\nb")]
        );
    }

    #[test]
    fn one_optional_space_after_colon() {
        assert_eq!(
            decode(&[b"data:x\n\ndata: x\n\ndata:  x\n\ndata:\n\ndata: \n\n"]),
            [msg("x"), msg("x"), msg(" x"), msg(""), msg("")]
        );
        // The space may arrive in a later chunk than the colon.
        assert_eq!(decode(&[b"data:", b" ", b" x\n\n"]), [msg(" x")]);
        // Colons inside the value are kept.
        assert_eq!(decode(&[b"data: a: b:c\n\n"]), [msg("a: b:c")]);
    }

    #[test]
    fn multi_line_data_joins_with_lf() {
        assert_eq!(
            decode(&[b"data: {\"a\":\ndata:\ndata: 1}\n\n"]),
            [msg("{\"a\":\n\n1}")]
        );
    }

    #[test]
    fn several_events_in_one_chunk() {
        let events = decode(&[b"data: 1\n\ndata: 2\n\n: c\n\ndata: 3\n\ndata: [DONE]\n\n"]);
        assert_eq!(events, [msg("1"), msg("2"), msg("3"), msg("[DONE]")]);
    }

    #[test]
    fn event_names() {
        assert_eq!(
            decode(&[b"event: error\ndata: x\n\ndata: y\n\n"]),
            [ev(Some("error"), b"x"), msg("y")]
        );
        // Last one wins; data may come first; one space stripped.
        assert_eq!(
            decode(&[b"data: x\nevent: a\nevent:  b\n\n"]),
            [ev(Some(" b"), b"x")]
        );
        // Empty name and a bare `event` line mean the default type.
        assert_eq!(
            decode(&[b"event: a\nevent:\ndata: x\n\nevent: a\nevent\ndata: y\n\n"]),
            [msg("x"), msg("y")]
        );
        // Names are converted lossily.
        assert_eq!(
            decode(&[b"event: a\xFFb\ndata: x\n\n"]),
            [ev(Some("a\u{FFFD}b"), b"x")]
        );
    }

    #[test]
    fn blank_line_without_data_drops_event_and_resets_name() {
        assert_eq!(decode(&[b"\n\n\r\n\r\r"]), []);
        assert_eq!(decode(&[b"event: lost\nid: 7\n\ndata: x\n\n"]), [msg("x")]);
    }

    #[test]
    fn ignored_fields_and_lines_without_colon() {
        assert_eq!(
            decode(&[b"id: 1\nretry: 10\nfoo: bar\ndatax: no\ndat: no\nData: no\ndata: y\n\n"]),
            [msg("y")]
        );
        // A bare `data` line is a data line with an empty value.
        assert_eq!(decode(&[b"data\n\n"]), [msg("")]);
        assert_eq!(decode(&[b"data\ndata\n\n"]), [msg("\n")]);
        assert_eq!(decode(&[b"datum\nevents\n\n"]), []);
    }

    #[test]
    fn data_is_raw_bytes() {
        // Invalid UTF-8 survives, and so does a code point split across chunks.
        assert_eq!(
            decode(&[b"data: \xFF\xFE\xE2", b"\x82", b"\xAC\n\n"]),
            [ev(None, b"\xFF\xFE\xE2\x82\xAC")]
        );
    }

    #[test]
    fn finish_dispatches_a_pending_event() {
        assert_eq!(decode(&[b"data: a\n\ndata: b\n"]), [msg("a"), msg("b")]);
        // An unterminated last line counts as a line.
        assert_eq!(decode(&[b"data: [DONE]"]), [msg("[DONE]")]);
        assert_eq!(
            decode(&[b"event: e\ndata: x\ndata: y"]),
            [ev(Some("e"), b"x\ny")]
        );
        assert_eq!(decode(&[b"data: x\r"]), [msg("x")]);
    }

    #[test]
    fn finish_without_pending_event() {
        assert_eq!(decode(&[]), []);
        assert_eq!(decode(&[b"data: a\n\n"]), [msg("a")]);
        assert_eq!(decode(&[b"data: a\n\nevent: e\n: c"]), [msg("a")]);
        assert_eq!(decode(&[b"id: 1"]), []);
    }

    #[test]
    fn decoder_is_reusable_after_finish() {
        let mut dec = SseDecoder::new(BIG);
        let mut out = Vec::new();
        assert_eq!(dec.push(b"event: e\ndata: a", &mut out), Ok(()));
        assert_eq!(dec.finish(&mut out), Ok(()));
        assert_eq!(dec.held_bytes(), 0);
        assert_eq!(dec.push(b"\xEF\xBB\xBFdata: b\n\n", &mut out), Ok(()));
        assert_eq!(out, [ev(Some("e"), b"a"), msg("b")]);
    }

    #[test]
    fn leading_bom_is_skipped() {
        assert_eq!(decode(&[b"\xEF\xBB\xBFdata: a\n\n"]), [msg("a")]);
        assert_eq!(
            decode(&[b"\xEF", b"", b"\xBB", b"\xBF", b"data: a\n\n"]),
            [msg("a")]
        );
        assert_eq!(decode(&[b"\xEF\xBB", b"\xBFdata: a\n\n"]), [msg("a")]);
        // Only at the very start: later it is part of the field name.
        assert_eq!(decode(&[b"data: a\n\n\xEF\xBB\xBFdata: b\n\n"]), [msg("a")]);
        assert_eq!(decode(&[b"\xEF\xBB\xBF\xEF\xBB\xBFdata: b\n\n"]), []);
    }

    #[test]
    fn partial_bom_is_replayed_as_input() {
        // The withheld bytes prefix the field name, so the line is ignored.
        assert_eq!(decode(&[b"\xEF", b"data: x\n\n"]), []);
        assert_eq!(decode(&[b"\xEF\xBB", b"data: x\n\n"]), []);
        assert_eq!(decode(&[b"\xEF", b"\xBBdata: x\n\n"]), []);
        assert_eq!(decode(&[b"\xEF\xBB", b"\ndata: x\n\n"]), [msg("x")]);
        assert_eq!(decode(&[b"\xEF\xBB"]), []);
        // A lone partial BOM is not a blank line: it does not end the event.
        assert_eq!(decode(&[b"\xEF", b"\n"]), []);
    }

    #[test]
    fn held_partial_line_at_and_over_limit() {
        let mut dec = SseDecoder::new(8);
        let mut out = Vec::new();
        assert_eq!(dec.push(b"data: 1234", &mut out), Ok(()));
        assert_eq!(dec.held_bytes(), 4);
        assert_eq!(dec.push(b"5678", &mut out), Ok(()));
        assert_eq!(dec.held_bytes(), 8);
        assert_eq!(
            dec.push(b"9", &mut out),
            Err(SseError::FrameTooLarge { limit: 8 })
        );
        assert_eq!(dec.held_bytes(), 0);
        assert!(out.is_empty());

        // A complete event of exactly the limit passes, limit + 1 fails.
        let ok = run(8, [b"data: 12345678\n\n".as_slice()]);
        assert_eq!((ok.events, ok.result), (vec![msg("12345678")], Ok(())));
        let too_big = run(8, [b"data: 123456789\n\n".as_slice()]);
        assert_eq!(too_big.result, Err(SseError::FrameTooLarge { limit: 8 }));
        assert!(too_big.events.is_empty());
    }

    #[test]
    fn accumulated_multi_line_data_at_and_over_limit() {
        // "1234\n567" is 8 bytes, separator included.
        let ok = bytewise(b"data: 1234\ndata: 567\n\n", 8);
        assert_eq!((ok.events, ok.result), (vec![msg("1234\n567")], Ok(())));
        assert_eq!(ok.max_held, 8);
        let too_big = bytewise(b"data: 1234\ndata: 5678\n\n", 8);
        assert_eq!(too_big.result, Err(SseError::FrameTooLarge { limit: 8 }));
        // The separator alone can overflow.
        let sep = run(4, [b"data: 1234\ndata\n\n".as_slice()]);
        assert_eq!(sep.result, Err(SseError::FrameTooLarge { limit: 4 }));
        // The event name counts towards the frame.
        let named = run(8, [b"event: abcd\ndata: 12345\n\n".as_slice()]);
        assert_eq!(named.result, Err(SseError::FrameTooLarge { limit: 8 }));
        // The limit applies per event, not per stream.
        let many = run(4, [b"data: 1234\n\ndata: 5678\n\n".as_slice()]);
        assert_eq!(
            (many.events, many.result),
            (vec![msg("1234"), msg("5678")], Ok(()))
        );
        // Comments and ignored fields are never held.
        let comment = run(
            4,
            [b": a very long keep-alive comment\nid: 123456789\n\n".as_slice()],
        );
        assert_eq!(comment.result, Ok(()));
    }

    #[test]
    fn the_event_buffer_is_kept_unless_an_event_made_it_large() {
        let mut dec = SseDecoder::new(BIG);
        let mut seen = Vec::new();
        dec.push_with(b"data: small\n\n", |e| seen.push(e.to_owned()))
            .unwrap();
        assert!(dec.data.capacity() > 0, "kept for the next event");
        let large = format!("data: {}\n\n", "x".repeat(KEPT_BUFFER_BYTES + 1));
        dec.push_with(large.as_bytes(), |e| seen.push(e.to_owned()))
            .unwrap();
        assert_eq!(dec.data.capacity(), 0, "released");
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0], msg("small"));
        assert_eq!(seen[1].data.len(), KEPT_BUFFER_BYTES + 1);
    }

    #[test]
    fn poisoned_after_error() {
        let mut dec = SseDecoder::new(4);
        let mut out = Vec::new();
        let err = Err(SseError::FrameTooLarge { limit: 4 });
        // Events completed before the overflow are still delivered.
        assert_eq!(dec.push(b"data: ok\n\ndata: 12345\n\n", &mut out), err);
        assert_eq!(out, [msg("ok")]);
        assert_eq!(dec.push(b"data: a\n\n", &mut out), err);
        assert_eq!(dec.push(b"", &mut out), err);
        assert_eq!(dec.finish(&mut out), err);
        assert_eq!(out, [msg("ok")]);
        assert_eq!(dec.held_bytes(), 0);
    }

    #[test]
    fn error_display() {
        let err: Box<dyn std::error::Error> = Box::new(SseError::FrameTooLarge { limit: 16 });
        assert_eq!(
            err.to_string(),
            "server-sent event exceeds the 16-byte frame limit"
        );
    }

    #[test]
    fn realistic_stream_one_byte_at_a_time() {
        let (_, vllm) = FIXTURES[0];
        let out = bytewise(vllm, 4096);
        assert_eq!(out.result, Ok(()));
        assert_eq!(out.events.len(), 15);
        let (last, chunks) = out.events.split_last().expect("events");
        assert_eq!(*last, msg("[DONE]"));
        for event in chunks {
            assert_eq!(event.event, None);
            assert!(event
                .data
                .starts_with(b"{\"id\":\"chatcmpl-99ecb8e2383f01ea\""));
            assert!(event.data.ends_with(b"}"));
        }
        assert!(out.max_held < 400);
        assert_eq!(out.events, decode(&[vllm]));

        // The same kind of stream with CRLF, keep-alives, a named error event
        // and a BOM, one byte at a time.
        let stream = b"\xEF\xBB\xBF: ok\r\n\r\nretry: 3000\r\n\
            data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\r\n\r\n\
            : keep-alive\r\n\r\n\
            event: error\r\ndata: {\"error\":\r\ndata: \"boom\"}\r\n\r\n\
            data: [DONE]\r\n\r\n";
        let out = bytewise(stream, 4096);
        assert_eq!(out.result, Ok(()));
        assert_eq!(
            out.events,
            [
                msg("{\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}"),
                ev(Some("error"), b"{\"error\":\n\"boom\"}"),
                msg("[DONE]"),
            ]
        );
    }

    #[test]
    fn fixtures_decode_to_chat_chunks() {
        for (name, body) in FIXTURES {
            let events = decode(&[body]);
            let data_lines = body
                .split(|&b| b == b'\n')
                .filter(|l| l.starts_with(b"data: "));
            assert_eq!(events.len(), data_lines.count(), "{name}");
            let (last, chunks) = events.split_last().expect("events");
            assert_eq!(*last, msg("[DONE]"), "{name}");
            assert!(
                chunks
                    .iter()
                    .all(|e| e.data.starts_with(b"{") && e.data.ends_with(b"}")),
                "{name}"
            );
        }
    }

    #[test]
    fn large_line_in_one_byte_chunks_is_linear() {
        // Quadratic re-copying would take minutes here.
        let mut input = b"data: ".to_vec();
        input.resize(256 * 1024, b'x');
        input.extend_from_slice(b"\n\n");
        let out = bytewise(&input, 256 * 1024);
        assert_eq!(out.result, Ok(()));
        assert_eq!(out.events.len(), 1);
        assert_eq!(out.events[0].data.len(), 256 * 1024 - 6);
    }

    // ---- property tests ----

    /// Rewrites the LF-only fixtures to another line-ending style.
    fn with_endings(body: &[u8], style: u8) -> Vec<u8> {
        let eol: &[u8] = match style {
            0 => b"\n",
            1 => b"\r\n",
            _ => b"\r",
        };
        let mut out = Vec::with_capacity(body.len() * 2);
        for &b in body {
            if b == b'\n' {
                out.extend_from_slice(eol);
            } else {
                out.push(b);
            }
        }
        out
    }

    #[derive(Debug, Clone)]
    enum GenLine {
        Data { value: Vec<u8>, space: bool },
        Event { value: Vec<u8>, space: bool },
        Comment(Vec<u8>),
        Field { name: &'static str, value: Vec<u8> },
        Bare(&'static str),
        Blank,
    }

    #[derive(Debug, Clone)]
    struct GenStream {
        bom: bool,
        lines: Vec<(GenLine, u8)>,
        terminate_last: bool,
    }

    fn value() -> impl Strategy<Value = Vec<u8>> {
        // Mostly characters that matter to the parser, plus arbitrary bytes.
        let byte = prop_oneof![
            3 => prop::sample::select(b" :adtaevn{}\"x".to_vec()),
            1 => any::<u8>().prop_filter("no line breaks", |b| *b != b'\r' && *b != b'\n'),
        ];
        prop::collection::vec(byte, 0..12)
    }

    fn gen_line() -> impl Strategy<Value = GenLine> {
        prop_oneof![
            6 => (value(), any::<bool>()).prop_map(|(value, space)| GenLine::Data { value, space }),
            1 => (value(), any::<bool>()).prop_map(|(value, space)| GenLine::Event { value, space }),
            1 => value().prop_map(GenLine::Comment),
            1 => (
                prop::sample::select(vec!["id", "retry", "foo", "datax", "dat", "Data", "events", ""]),
                value()
            )
                .prop_map(|(name, value)| GenLine::Field { name, value }),
            1 => prop::sample::select(vec!["data", "event", "id", "x"]).prop_map(GenLine::Bare),
            4 => Just(GenLine::Blank),
        ]
    }

    fn gen_stream() -> impl Strategy<Value = GenStream> {
        (
            any::<bool>(),
            prop::collection::vec((gen_line(), 0u8..3), 0..40),
            any::<bool>(),
        )
            .prop_map(|(bom, lines, terminate_last)| GenStream {
                bom,
                lines,
                terminate_last,
            })
    }

    fn with_space(space: bool, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        if space {
            out.push(b' ');
        }
        out.extend_from_slice(value);
        out
    }

    impl GenStream {
        fn encode(&self) -> Vec<u8> {
            let mut out = Vec::new();
            if self.bom {
                out.extend_from_slice(BOM);
            }
            let mut prev_cr = false;
            for (i, (line, style)) in self.lines.iter().enumerate() {
                match line {
                    GenLine::Data { value, space } => {
                        out.extend_from_slice(b"data:");
                        out.extend(with_space(*space, value));
                    }
                    GenLine::Event { value, space } => {
                        out.extend_from_slice(b"event:");
                        out.extend(with_space(*space, value));
                    }
                    GenLine::Comment(value) => {
                        out.push(b':');
                        out.extend_from_slice(value);
                    }
                    GenLine::Field { name, value } => {
                        out.extend_from_slice(name.as_bytes());
                        out.push(b':');
                        out.extend_from_slice(value);
                    }
                    GenLine::Bare(name) => out.extend_from_slice(name.as_bytes()),
                    GenLine::Blank => {}
                }
                if i + 1 == self.lines.len() && !self.terminate_last {
                    break;
                }
                // CR then an LF-terminated blank line would read as one CRLF.
                let style = match (prev_cr, line, style) {
                    (true, GenLine::Blank, 0) => 1,
                    _ => *style,
                };
                out.extend_from_slice(match style {
                    0 => b"\n".as_slice(),
                    1 => b"\r\n",
                    _ => b"\r",
                });
                prev_cr = style == 2;
            }
            out
        }

        /// Reference semantics, applied to whole, already-parsed lines.
        fn expected(&self) -> Vec<SseEvent> {
            fn strip(value: &[u8], space: bool) -> &[u8] {
                if space {
                    value
                } else {
                    value.strip_prefix(b" ").unwrap_or(value)
                }
            }
            fn emit(out: &mut Vec<SseEvent>, data: &mut Option<Vec<u8>>, name: &mut Vec<u8>) {
                if let Some(data) = data.take() {
                    let event = (!name.is_empty()).then(|| String::from_utf8_lossy(name).into());
                    out.push(SseEvent {
                        event,
                        data: data.into(),
                    });
                }
                name.clear();
            }
            let mut out = Vec::new();
            let mut data: Option<Vec<u8>> = None;
            let mut name = Vec::new();
            for (line, _) in &self.lines {
                let value = match line {
                    GenLine::Data { value, space } => strip(value, *space),
                    GenLine::Bare("data") => b"",
                    GenLine::Event { value, space } => {
                        name = strip(value, *space).to_vec();
                        continue;
                    }
                    GenLine::Bare("event") => {
                        name.clear();
                        continue;
                    }
                    GenLine::Blank => {
                        emit(&mut out, &mut data, &mut name);
                        continue;
                    }
                    _ => continue,
                };
                match &mut data {
                    Some(data) => {
                        data.push(b'\n');
                        data.extend_from_slice(value);
                    }
                    None => data = Some(value.to_vec()),
                }
            }
            emit(&mut out, &mut data, &mut name);
            out
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn fixtures_split_anywhere_decode_identically(
            fixture in 0..FIXTURES.len(),
            style in 0u8..3,
            cuts in prop::collection::vec(any::<Index>(), 0..48),
        ) {
            let body = with_endings(FIXTURES[fixture].1, style);
            let whole = run(BIG, [body.as_slice()]);
            prop_assert_eq!(&whole.result, &Ok(()));
            // The tightest limit that fits the largest event must hold.
            let limit = whole.events.iter().map(|e| e.data.len()).max().unwrap_or(0);
            let parts = run(limit, split(&body, &cuts));
            prop_assert_eq!(&parts.events, &whole.events);
            prop_assert_eq!(&parts.result, &Ok(()));
            prop_assert!(parts.max_held <= limit);
            // One byte less fails, at the same event, however it is split.
            let short_whole = run(limit - 1, [body.as_slice()]);
            let short_parts = run(limit - 1, split(&body, &cuts));
            prop_assert_eq!(&short_whole.result, &Err(SseError::FrameTooLarge { limit: limit - 1 }));
            prop_assert_eq!(&short_parts.events, &short_whole.events);
            prop_assert_eq!(&short_parts.result, &short_whole.result);
            prop_assert!(short_parts.max_held < limit);
        }

        #[test]
        fn generated_streams_match_reference(
            stream in gen_stream(),
            cuts in prop::collection::vec(any::<Index>(), 0..48),
        ) {
            let body = stream.encode();
            let expected = stream.expected();
            let whole = run(BIG, [body.as_slice()]);
            prop_assert_eq!(&whole.result, &Ok(()));
            prop_assert_eq!(&whole.events, &expected);
            let parts = run(BIG, split(&body, &cuts));
            prop_assert_eq!(&parts.events, &expected);
            prop_assert_eq!(&parts.result, &Ok(()));
            let bytes = bytewise(&body, BIG);
            prop_assert_eq!(&bytes.events, &expected);
        }

        #[test]
        fn generated_streams_respect_limit_however_split(
            stream in gen_stream(),
            limit in 0usize..40,
            cuts in prop::collection::vec(any::<Index>(), 0..48),
        ) {
            let body = stream.encode();
            let whole = run(limit, [body.as_slice()]);
            let parts = run(limit, split(&body, &cuts));
            prop_assert!(whole.max_held <= limit);
            prop_assert!(parts.max_held <= limit);
            // Same events and same verdict, wherever the chunks are cut.
            prop_assert_eq!(parts.events, whole.events);
            prop_assert_eq!(parts.result, whole.result);
        }
    }
}
