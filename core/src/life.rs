//! What telemetry sees of one exchange's life, whichever driver runs it: when it started, how
//! long the host's callbacks spent in the core, when its first output went out, whether a
//! stream is open, and its end, each told once as an [`Event`].
//!
//! The caller gives every time: `enter(now)` when a host callback begins, `poll(now)` after
//! it. A callback counts as busy from its `enter` to its last `poll`.

use std::time::{Duration, Instant};

use crate::exchange::{Compaction, Summary};

/// An adapter's timing of one exchange (what the metrics and the span record beside the
/// [`Summary`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Timing {
    /// From the request's first message to the exchange's last answer.
    pub total: Duration,
    /// From the request's first message to the first output (text, reasoning or a tool
    /// call) sent to the client, for streams.
    pub first_output: Option<Duration>,
    /// Time spent translating (validation, translation, events), not waiting.
    pub translation: Duration,
}

/// What happened to an exchange, for the adapter's telemetry (metrics, spans, Envoy's
/// metadata and stats). Polled after each input until there is none.
#[derive(Debug, Clone)]
pub enum Event {
    /// The exchange is ours: its request is translated from now on. It started `elapsed` ago,
    /// at the host's first callback.
    Claimed { elapsed: Duration },
    /// A stream's head went to the client: it is in flight until [`Event::StreamClosed`].
    StreamOpened,
    /// A stream's first output (text, reasoning or a tool call) went to the client, `elapsed`
    /// after the exchange started.
    FirstOutput { elapsed: Duration },
    /// The stream of [`Event::StreamOpened`] is no longer in flight (told just before
    /// [`Event::Finished`]).
    StreamClosed,
    /// The exchange's own call (an automatic compaction's summarising request) ended.
    Call(CallTiming),
    /// The exchange ended, or was cut: record it. Exactly once for every exchange that was
    /// ours.
    Finished(Box<Finished>),
}

/// The exchange's own call, once it ended: when it started (after the exchange did), how
/// long it took, and the compaction it made (its outcome `running` when the exchange ended
/// some other way while it was in flight).
#[derive(Debug, Clone, Copy)]
pub struct CallTiming {
    pub started: Duration,
    pub took: Duration,
    pub compaction: Option<Compaction>,
}

/// An exchange at its end.
#[derive(Debug, Clone)]
pub struct Finished {
    pub summary: Summary,
    pub timing: Timing,
    /// The host ended the exchange before its answer was complete (client gone, upstream
    /// reset, a timeout): its outcome is still `Open` (recorded as `cut`), and nothing of it
    /// reaches the client any more (no metadata, no span tags on the host's side).
    pub cut: bool,
}

/// An event owed: not yet, due at the next poll, told.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Tell {
    #[default]
    No,
    Due,
    Told,
}

impl Tell {
    fn due(&mut self) {
        if *self == Tell::No {
            *self = Tell::Due;
        }
    }

    /// Whether it is due, marking it told.
    fn take(&mut self) -> bool {
        let due = *self == Tell::Due;
        if due {
            *self = Tell::Told;
        }
        due
    }
}

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct Life {
    /// The first callback's time.
    started: Option<Instant>,
    /// The callback in progress: when it began, and when it was last seen busy (a poll).
    callback: Option<(Instant, Instant)>,
    /// Time spent in the callbacks before it.
    busy: Duration,
    claimed: Tell,
    stream_opened: Tell,
    stream_closed: Tell,
    output: Tell,
    first_output: Option<Duration>,
    /// The exchange's own call: when it started, then how it ended.
    call_start: Option<Instant>,
    call: Tell,
    call_timing: Option<CallTiming>,
    end: Tell,
    cut: bool,
}

impl Life {
    /// A host callback begins.
    pub fn enter(&mut self, now: Instant) {
        if let Some((began, until)) = self.callback {
            self.busy += until.saturating_duration_since(began);
        }
        self.started.get_or_insert(now);
        self.callback = Some((now, now));
    }

    pub fn claim(&mut self) {
        self.claimed.due();
    }

    pub fn open_stream(&mut self) {
        self.stream_opened.due();
    }

    /// The exchange's own call starts, in the current callback.
    pub fn call_started(&mut self) {
        self.call_start = self.callback.map(|(began, _)| began);
    }

    /// The call ended (once).
    pub fn call_ended(&mut self, now: Instant, compaction: Option<Compaction>) {
        let (Some(started), Some(begun)) = (self.started, self.call_start.take()) else {
            return;
        };
        self.call_timing = Some(CallTiming {
            started: begun.saturating_duration_since(started),
            took: now.saturating_duration_since(begun),
            compaction,
        });
        self.call.due();
    }

    /// Output went to the client (only the first time counts).
    pub fn output(&mut self) {
        self.output.due();
    }

    /// The exchange ended (`cut`: before its answer was complete). Only the first end counts.
    pub fn finish(&mut self, cut: bool) {
        if self.end == Tell::No {
            self.end = Tell::Due;
            self.cut = cut;
        }
    }

    /// Its end was told: nothing more will be.
    pub fn is_over(&self) -> bool {
        self.end == Tell::Told
    }

    /// The next event owed, in the order they happen; `summary` is the exchange's, for its
    /// end.
    pub fn poll(&mut self, now: Instant, summary: Option<&Summary>) -> Option<Event> {
        let started = self.started?;
        if let Some((_, until)) = &mut self.callback {
            *until = (*until).max(now);
        }
        let owed = [
            self.claimed,
            self.call,
            self.stream_opened,
            self.output,
            self.end,
        ];
        if !owed.contains(&Tell::Due) {
            // The usual poll, after every callback: cheap.
            return None;
        }
        let elapsed = now.saturating_duration_since(started);
        if self.claimed.take() {
            return Some(Event::Claimed { elapsed });
        }
        if self.call.take() {
            if let Some(timing) = self.call_timing {
                return Some(Event::Call(timing));
            }
        }
        if self.stream_opened.take() {
            return Some(Event::StreamOpened);
        }
        if self.output.take() {
            self.first_output = Some(elapsed);
            return Some(Event::FirstOutput { elapsed });
        }
        if self.end != Tell::Due {
            return None;
        }
        if self.stream_opened == Tell::Told {
            self.stream_closed.due();
            if self.stream_closed.take() {
                return Some(Event::StreamClosed);
            }
        }
        self.end = Tell::Told;
        let in_callback = self.callback.map_or(Duration::ZERO, |(began, until)| {
            until.saturating_duration_since(began)
        });
        let timing = Timing {
            total: elapsed,
            first_output: self.first_output,
            translation: self.busy + in_callback,
        };
        Some(Event::Finished(Box::new(Finished {
            summary: summary?.clone(),
            timing,
            cut: self.cut,
        })))
    }
}
