//! Steering (`response.steer`): the client's input queued for a continuation of a response in
//! flight, read and checked here, and the events that tell what became of it.
//!
//! The connection decides when a steer commits (see `Connection::steer`); this module knows
//! its shape: which input may steer (user messages only, as openai-python's
//! `ResponseSteerEvent` says), and the `response.steer.accepted` / `.pending` / `.failed`
//! events.

use std::borrow::Cow;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::translate::json::document::{self, Node, Str};
use crate::translate::json::shape::Kind;

/// `{"type": "message", "role": "user", "content": text}`: a string input (a steer's, a
/// `response.create`'s) as its one item.
pub(super) fn user_message(text: Str<'_>) -> Node<'_> {
    let word = |w: &'static str| Node::Str(Str::Decoded(Cow::Borrowed(w)));
    Node::Object(vec![
        (Cow::Borrowed("type"), word("message")),
        (Cow::Borrowed("role"), word("user")),
        (Cow::Borrowed("content"), Node::Str(text)),
    ])
}

/// Steers a response may have waiting; beyond, `too_many_pending_steers`.
pub const MAX_PENDING_STEERS: usize = 4;

/// Why a steer was not committed: `response.steer.failed`'s `error.code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SteerError {
    ResponseNotFound,
    InvalidInput,
    SteeringNotSupported,
    TooManyPendingSteers,
    ResponseAlreadyCompleted,
    ResponseNotActive,
    SuccessorCreationFailed,
}

/// An accepted steer, queued on its response's lane.
#[derive(Debug)]
pub(super) struct Steer {
    pub id: String,
    /// The response it steers.
    pub target: String,
    /// Its input as the client sent it (a string or an array of items), JSON text: given
    /// back in `response.steer.failed`, read as items when it commits.
    pub input: Box<RawValue>,
}

impl Steer {
    pub fn bytes(&self) -> usize {
        self.id.len() + self.target.len() + self.input.get().len()
    }

    /// Its input as items, borrowed from its text: a string is one user message.
    pub fn items(&self) -> Vec<Node<'_>> {
        match document::open(&self.input, Kind::Input) {
            Ok(Node::Str(text)) => vec![user_message(text)],
            Ok(Node::Array(items)) => items,
            // Checked when it was accepted.
            _ => Vec::new(),
        }
    }
}

/// A `response.steer` message as read.
pub(super) struct Submission {
    pub target: String,
    pub input: Box<RawValue>,
}

/// A `response.steer` that cannot steer: what of it could be read (given back in
/// `response.steer.failed`) and why.
pub(super) struct Refusal {
    pub target: String,
    pub input: Option<Box<RawValue>>,
    pub why: String,
}

/// Reads a `response.steer` message: only `type`, `previous_response_id` and `input` (nulls
/// aside), the input a non-empty string or array of user messages whose content is a string or
/// `input_text` / `input_image` / `input_file` parts.
pub(super) fn read(text: &str) -> Result<Submission, Refusal> {
    let refused = |target: &str, input: Option<&RawValue>, why: String| Refusal {
        target: target.to_owned(),
        input: input.map(RawValue::to_owned),
        why,
    };
    let fields: std::collections::BTreeMap<Cow<'_, str>, &RawValue> = serde_json::from_str(text)
        .map_err(|e| refused("", None, format!("The steer could not be read: {e}.")))?;
    let input = fields.get("input").copied().filter(|v| v.get() != "null");
    let target = match fields.get("previous_response_id") {
        Some(raw) => serde_json::from_str::<Cow<'_, str>>(raw.get()).ok(),
        None => None,
    };
    let target_text = target.as_deref().unwrap_or_default();
    for (key, value) in &fields {
        if !matches!(&**key, "type" | "input" | "previous_response_id") && value.get() != "null" {
            return Err(refused(
                target_text,
                input,
                format!(
                    "'{key}' is not accepted in 'response.steer': it takes only 'previous_response_id' and 'input' (the target response decides the lane)."
                ),
            ));
        }
    }
    let (Some(target), Some(input)) = (target.as_deref(), input) else {
        return Err(refused(
            target_text,
            input,
            "Missing required parameter: 'response.steer' needs 'previous_response_id' (a string) and 'input'.".to_owned(),
        ));
    };
    check_input(input).map_err(|why| refused(target, Some(input), why))?;
    Ok(Submission {
        target: target.to_owned(),
        input: input.to_owned(),
    })
}

/// Only user messages steer (openai-python's `ResponseSteerInput`).
fn check_input(input: &RawValue) -> Result<(), String> {
    let node =
        document::open(input, Kind::Input).map_err(|_| "'input' could not be read.".to_owned())?;
    let items = match node {
        Node::Str(text) if !text.as_str().is_empty() => return Ok(()),
        Node::Str(_) => return Err("'input' is empty.".to_owned()),
        Node::Array(items) if !items.is_empty() => items,
        Node::Array(_) => return Err("'input' is an empty array.".to_owned()),
        other => {
            return Err(format!(
                "Invalid 'input': expected a string or an array of items, got {}.",
                other.type_name()
            ))
        }
    };
    for (i, item) in items.into_iter().enumerate() {
        let Node::Object(fields) = open(item)? else {
            return Err(format!("Invalid 'input[{i}]': expected an object."));
        };
        let mut role = None;
        for (key, value) in fields {
            match (&*key, value) {
                ("type", Node::Str(t)) if t.as_str() == "message" => {}
                ("role", Node::Str(r)) => role = Some(r.as_str().into_owned()),
                ("content", Node::Str(_)) => {}
                ("content", parts) => check_parts(i, open(parts)?)?,
                ("id" | "status", _) | (_, Node::Null) => {}
                ("type", _) => {
                    return Err(format!(
                        "Invalid 'input[{i}].type': only messages may steer (tool outputs and other items go in 'response.create')."
                    ))
                }
                (other, _) => {
                    return Err(format!(
                        "'input[{i}].{other}' is not accepted: a steering message has only 'type', 'role' and 'content'."
                    ))
                }
            }
        }
        if role.as_deref() != Some("user") {
            return Err(format!(
                "Invalid 'input[{i}].role': only messages with the 'user' role may steer."
            ));
        }
    }
    Ok(())
}

fn check_parts(i: usize, parts: Node<'_>) -> Result<(), String> {
    let Node::Array(parts) = parts else {
        return Err(format!(
            "Invalid 'input[{i}].content': expected a string or an array of parts."
        ));
    };
    for (j, part) in parts.into_iter().enumerate() {
        let Node::Object(fields) = open(part)? else {
            return Err(format!(
                "Invalid 'input[{i}].content[{j}]': expected an object."
            ));
        };
        let kind = fields.iter().find_map(|(k, v)| match v {
            Node::Str(t) if k == "type" => Some(t.as_str().into_owned()),
            _ => None,
        });
        if !matches!(
            kind.as_deref(),
            Some("input_text" | "input_image" | "input_file")
        ) {
            return Err(format!(
                "Invalid 'input[{i}].content[{j}].type': a steering message's parts are 'input_text', 'input_image' or 'input_file'."
            ));
        }
    }
    Ok(())
}

fn open(node: Node<'_>) -> Result<Node<'_>, String> {
    match node {
        Node::Kept(raw, kind) => {
            document::open(raw, kind).map_err(|_| "'input' could not be read.".to_owned())
        }
        other => Ok(other),
    }
}

/// The `steer` object of the three events.
#[derive(Serialize)]
struct Submitted<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    previous_response_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    input: Option<&'a RawValue>,
}

/// `response.steer.accepted`.
pub(super) fn accepted(steer: &Steer, sequence_number: u64) -> Bytes {
    #[derive(Serialize)]
    struct Accepted<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        steer: Submitted<'a>,
        sequence_number: u64,
    }
    to_bytes(&Accepted {
        kind: "response.steer.accepted",
        steer: Submitted {
            id: Some(&steer.id),
            previous_response_id: &steer.target,
            input: None,
        },
        sequence_number,
    })
}

/// `response.steer.failed`: the input given back, with the steer's id once it had one.
pub(super) fn failed(
    id: Option<&str>,
    target: &str,
    input: Option<&RawValue>,
    code: SteerError,
    message: &str,
    sequence_number: u64,
) -> Bytes {
    #[derive(Serialize)]
    struct Failed<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        error: Error<'a>,
        steer: Submitted<'a>,
        sequence_number: u64,
    }
    #[derive(Serialize)]
    struct Error<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        code: SteerError,
        message: &'a str,
    }
    let null = RawValue::NULL;
    to_bytes(&Failed {
        kind: "response.steer.failed",
        error: Error {
            kind: "invalid_request_error",
            code,
            message,
        },
        steer: Submitted {
            id,
            previous_response_id: target,
            input: Some(input.unwrap_or(null)),
        },
        sequence_number,
    })
}

/// A client-owned call the completed response waits for: `response.steer.pending`'s stubs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct RequiredInput {
    #[serde(rename = "type")]
    pub kind: String,
    pub call_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `response.steer.pending`: the steer waits for the client's tool output.
pub(super) fn pending(steer: &Steer, required: &[RequiredInput], sequence_number: u64) -> Bytes {
    #[derive(Serialize)]
    struct Pending<'a> {
        #[serde(rename = "type")]
        kind: &'static str,
        reason: &'static str,
        required_input: &'a [RequiredInput],
        steer: Submitted<'a>,
        sequence_number: u64,
    }
    to_bytes(&Pending {
        kind: "response.steer.pending",
        reason: "waiting_for_required_input",
        required_input: required,
        steer: Submitted {
            id: Some(&steer.id),
            previous_response_id: &steer.target,
            input: None,
        },
        sequence_number,
    })
}

/// What a finished response's terminal event says a steer needs: the calls it made that the
/// client answers (function and custom tool calls), and the number after its own.
pub(super) fn after(terminal: &[u8]) -> (Vec<RequiredInput>, u64) {
    #[derive(Deserialize)]
    struct Terminal {
        #[serde(default)]
        response: Option<Response>,
        #[serde(default)]
        sequence_number: u64,
    }
    #[derive(Deserialize)]
    struct Response {
        #[serde(default)]
        output: Vec<Item>,
    }
    #[derive(Deserialize)]
    struct Item {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        call_id: Option<String>,
        #[serde(default)]
        name: Option<String>,
    }
    let Ok(terminal) = serde_json::from_slice::<Terminal>(terminal) else {
        return (Vec::new(), 0);
    };
    let required = terminal
        .response
        .map(|r| r.output)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|item| {
            let kind = match item.kind.as_str() {
                "function_call" => "function_call_output",
                "custom_tool_call" => "custom_tool_call_output",
                _ => return None,
            };
            Some(RequiredInput {
                kind: kind.to_owned(),
                call_id: item.call_id?,
                name: item.name.filter(|_| kind == "function_call_output"),
            })
        })
        .collect();
    (required, terminal.sequence_number + 1)
}

fn to_bytes<T: Serialize>(event: &T) -> Bytes {
    // Plain strings and numbers: serialising cannot fail.
    Bytes::from(serde_json::to_vec(event).unwrap_or_default())
}
