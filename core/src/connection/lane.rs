//! A lane of a connection (`stream_id`): its own queue of messages, answered one at a time
//! in order, its response in flight, its kept context and its steers. Lanes run side by side;
//! the messages that name no `stream_id` share one lane of their own.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde_json::value::RawValue;

use super::steer::Steer;
use crate::call::CallId;
use crate::exchange::{Exchange, Summary};
use crate::life::Life;
use crate::openresponses::{ApiError, ErrorCode};
use crate::translate::json::document::{self, Node};
use crate::translate::json::shape::Kind;

/// Named lanes a connection may have at once (each with its own upstream call and kept
/// context), beside the lane of messages without a `stream_id`: a `response.create` that opens
/// one more is refused.
pub const MAX_LANES: usize = 8;

/// A lane's name: the `stream_id` its messages carry (none: the lane of those without).
pub(super) type LaneId = Option<Arc<str>>;

#[derive(Debug)]
pub(super) struct Lane {
    /// Its key in the events of its responses' lives ([`super::Event::Response`]).
    pub key: u64,
    pub id: LaneId,
    /// Messages waiting their turn on this lane, in order.
    pub queue: VecDeque<Queued>,
    pub state: State,
    /// Its last response that ended well, ready to be continued (from any lane).
    pub context: Option<Context>,
    /// Its last response that ended well but was not kept (too large): its id, so that naming
    /// it gets a message that says why.
    pub too_large: Option<String>,
    /// The summary of its last response that ended, for its life's last events.
    pub last: Option<Summary>,
    /// The life of its response in flight, or of the last one until its end is polled.
    pub life: Option<Life>,
    /// Steers accepted for its response in flight, or, once that completed waiting for the
    /// client's tool output, for the continuation of it (`waiting`).
    pub steers: Vec<Steer>,
    /// The completed response whose continuation the steers wait for.
    pub waiting: Option<String>,
    /// Steers whose response ended well, to commit in a successor of it before the queue.
    pub successor: Option<Successor>,
}

/// A successor to start with steered input: it continues `parent` with the settings of the
/// `message` that created it.
#[derive(Debug)]
pub(super) struct Successor {
    pub parent: String,
    pub message: Bytes,
    pub steers: Vec<Steer>,
}

#[derive(Debug)]
pub(super) enum State {
    /// No response in flight. `finishing`: the call of one that ended well while its upstream
    /// had not finished (the terminal event came before the body's end): left to end by
    /// itself, cancelled when the lane's next call starts or the connection ends.
    Idle { finishing: Option<CallId> },
    /// A response in flight.
    Busy(Box<Turn>),
}

impl Lane {
    pub fn new(key: u64, id: LaneId) -> Lane {
        Lane {
            key,
            id,
            queue: VecDeque::new(),
            state: State::Idle { finishing: None },
            context: None,
            too_large: None,
            last: None,
            life: None,
            steers: Vec::new(),
            waiting: None,
            successor: None,
        }
    }

    pub fn turn(&self) -> Option<&Turn> {
        match &self.state {
            State::Busy(turn) => Some(turn),
            State::Idle { .. } => None,
        }
    }

    pub fn turn_mut(&mut self) -> Option<&mut Turn> {
        match &mut self.state {
            State::Busy(turn) => Some(turn),
            State::Idle { .. } => None,
        }
    }

    pub fn is_busy(&self) -> bool {
        matches!(self.state, State::Busy(_))
    }

    /// Nothing in flight, waiting or kept: the lane may go.
    pub fn is_empty(&self) -> bool {
        matches!(self.state, State::Idle { finishing: None })
            && self.queue.is_empty()
            && self.context.is_none()
            && self.life.is_none()
            && self.steers.is_empty()
            && self.successor.is_none()
    }

    /// Bytes it holds (counted in the connection's `held`).
    pub fn held(&self) -> usize {
        let turn = self.turn().map_or(0, |t| {
            t.input.len() + t.message.len() + t.exchange.held_output()
        });
        let steers: usize = self.steers.iter().map(Steer::bytes).sum();
        let successor = self.successor.as_ref().map_or(0, |s| {
            s.message.len() + s.steers.iter().map(Steer::bytes).sum::<usize>()
        });
        self.context.as_ref().map_or(0, |c| c.bytes) + turn + steers + successor
    }
}

/// What the client sent, in order.
#[derive(Debug)]
pub(super) enum Queued {
    Text(Bytes),
    Binary,
    /// A message between the message limit and twice it: read, and refused in its turn.
    TooLarge,
}

/// A response in flight.
#[derive(Debug)]
pub(super) struct Turn {
    pub exchange: Exchange,
    /// Its call, while the upstream may still answer.
    pub call: Option<CallId>,
    /// Its whole input (the continued context's items first), a JSON array kept for the next
    /// context.
    pub input: String,
    /// The message that created it: the settings a steered successor inherits.
    pub message: Bytes,
    /// The last item of `input` is a `compaction_trigger`: its output stands for the rest.
    pub compacted: bool,
    /// It asked for automatic compaction (`context_management`): it cannot be steered.
    pub automatic_compaction: bool,
    /// Its call is an automatic compaction's summarising request, given up on at this time.
    pub compacting: Option<Instant>,
    /// The model headers of its last call, which its record carries too.
    pub model_headers: Vec<(Cow<'static, str>, String)>,
}

impl Turn {
    pub fn response_id(&self) -> Option<&str> {
        self.exchange.summary().response_id.as_deref()
    }
}

/// The last response that ended well, kept as the text it was sent and read as: nothing of it
/// is a tree until a continuation reads it (counted at its size).
#[derive(Debug, Clone)]
pub(super) struct Context {
    pub id: String,
    /// Its whole input (its own continued context first), a JSON array.
    pub input: String,
    /// Its terminal event as sent (`response.completed` or `.incomplete`): the output is
    /// read from it only if the context is continued.
    pub terminal: Bytes,
    pub bytes: usize,
}

impl Context {
    /// The context as input items, borrowed from its text: its input, then its output.
    pub fn items(&self) -> Result<Vec<Node<'_>>, ApiError> {
        #[derive(serde::Deserialize)]
        struct Terminal<'a> {
            #[serde(borrow)]
            response: Finished<'a>,
        }
        #[derive(serde::Deserialize)]
        struct Finished<'a> {
            #[serde(borrow)]
            output: &'a RawValue,
        }
        let unreadable = |why: &dyn std::fmt::Display| {
            ApiError::server(
                500,
                ErrorCode::InternalError,
                format!("The kept response could not be read: {why}."),
            )
        };
        fn as_items<'a>(
            read: Result<Node<'a>, document::Refused>,
        ) -> Result<Vec<Node<'a>>, String> {
            match read {
                Ok(Node::Array(items)) => Ok(items),
                Ok(other) => Err(format!("{} for items", other.type_name())),
                Err(refused) => Err(format!("{refused:?}")),
            }
        }
        let mut items =
            as_items(document::parse(&self.input, Kind::Input)).map_err(|e| unreadable(&e))?;
        let text = std::str::from_utf8(&self.terminal).map_err(|e| unreadable(&e))?;
        let terminal: Terminal<'_> = serde_json::from_str(text).map_err(|e| unreadable(&e))?;
        let output = document::open(terminal.response.output, Kind::Input);
        items.extend(as_items(output).map_err(|e| unreadable(&e))?);
        Ok(items)
    }
}

/// The lane a message is for, read from its `stream_id` without building anything of the rest
/// (and only when the text has the word); whether it is a `response.steer`. A message that cannot be read this way goes to the lane
/// without a name, where reading it as a request says what is wrong.
pub(super) fn route(text: &[u8]) -> (Option<String>, bool) {
    // Most messages name no lane and steer nothing: a search for the two words spares them
    // the read. (A key or type written with escapes is not found here: the request's own read
    // refuses it, `Connection::begin`.)
    let finder = |word: &[u8]| memchr::memmem::find(text, word).is_some();
    if !finder(b"stream_id") && !finder(b"response.steer") {
        return (None, false);
    }
    #[derive(serde::Deserialize)]
    struct Head<'a> {
        #[serde(rename = "type", borrow, default)]
        kind: Option<Cow<'a, str>>,
        #[serde(borrow, default)]
        stream_id: Option<&'a RawValue>,
    }
    match serde_json::from_slice::<Head<'_>>(text) {
        Ok(head) => {
            let lane = head
                .stream_id
                .and_then(|raw| serde_json::from_str::<String>(raw.get()).ok());
            (lane, head.kind.as_deref() == Some("response.steer"))
        }
        Err(_) => (None, false),
    }
}

/// What an event's JSON starts with on a lane, in place of its `{`: `{"stream_id":"…",` (every
/// server event of a lane echoes it). `None` for a payload that is not a non-empty object.
pub(super) fn lane_prefix(payload: &[u8], lane: &str) -> Option<Vec<u8>> {
    if payload.first() != Some(&b'{') || payload.get(1) == Some(&b'}') {
        return None;
    }
    let mut prefix = b"{\"stream_id\":".to_vec();
    prefix.extend_from_slice(serde_json::to_string(lane).unwrap_or_default().as_bytes());
    prefix.push(b',');
    Some(prefix)
}
