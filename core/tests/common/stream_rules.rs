//! The rules every translated event stream obeys, checked on the translator's output bytes:
//! framing, schema, sequence numbers, per-item event order, one terminal event whose `output`
//! equals the `output_item.done` items, `error` followed by `response.failed`, deltas adding
//! up to their `.done`. Used by `core/tests/stream_translate.rs` and the stream snapshots
//! (`core/tests/snapshots.rs`).

use std::collections::HashSet;

use serde_json::{json, Value};

use super::{json, schema};

/// What the response objects of a stream must say.
pub struct Expected<'a> {
    pub model: &'a str,
    /// `Meta.now` of the exchange.
    pub created_at: u64,
    /// The clock passed to `push`/`finish`.
    pub completed_at: u64,
}

/// Item kinds [`check`] knows the event order of.
pub const CHECKED_ITEMS: [&str; 3] = ["message", "function_call", "reasoning"];

pub const TERMINAL: [&str; 3] = [
    "response.completed",
    "response.incomplete",
    "response.failed",
];

/// Event names OpenAI uses that the OpenResponses schema does not define.
pub const NOT_IN_SCHEMA: [&str; 2] = [
    "response.reasoning_text.delta",
    "response.reasoning_text.done",
];

/// Content-part kind of a text event and the field carrying its text (delta, done).
pub fn text_event(ty: &str) -> Option<(&'static str, &'static str)> {
    Some(match ty {
        "response.output_text.delta" => ("output_text", "delta"),
        "response.output_text.done" => ("output_text", "text"),
        "response.refusal.delta" => ("refusal", "delta"),
        "response.refusal.done" => ("refusal", "refusal"),
        "response.reasoning.delta" | "response.reasoning_text.delta" => ("reasoning_text", "delta"),
        "response.reasoning.done" | "response.reasoning_text.done" => ("reasoning_text", "text"),
        _ => return None,
    })
}

/// The text field of a content part of kind `kind`.
pub fn part_field(kind: &str) -> &'static str {
    if kind == "refusal" {
        "refusal"
    } else {
        "text"
    }
}

#[derive(Debug)]
struct PartTrack {
    kind: String,
    acc: String,
    text_done: bool,
    done: bool,
}

#[derive(Debug)]
struct ItemTrack {
    id: String,
    kind: String,
    added: Value,
    parts: Vec<PartTrack>,
    args: String,
    args_done: bool,
    done: Option<Value>,
}

/// Parses the translator's output strictly: `event: <type>\ndata: <one-line JSON>\n\n`
/// frames, each event's name its `type`, `sequence_number` consecutive from 0, then
/// `data: [DONE]` once. Returns the events.
#[track_caller]
pub fn events(out: &[u8]) -> Vec<Value> {
    let body = std::str::from_utf8(out).expect("output is UTF-8");
    assert!(!body.contains('\r'), "output has CR characters:\n{body}");

    // Framing: `event: <type>\ndata: <one-line JSON>\n\n`…, then `data: [DONE]\n\n` once.
    let mut rest = body
        .strip_suffix("data: [DONE]\n\n")
        .unwrap_or_else(|| panic!("output does not end with data: [DONE]:\n{body}"));
    let mut events: Vec<Value> = Vec::new();
    while !rest.is_empty() {
        let frame = rest
            .strip_prefix("event: ")
            .unwrap_or_else(|| panic!("frame does not start with `event: `:\n{rest}"));
        let (name, frame) = frame.split_once('\n').expect("event line ends");
        let frame = frame
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("no `data: ` line after event {name}:\n{frame}"));
        let (data, frame) = frame.split_once('\n').expect("data line ends");
        rest = frame
            .strip_prefix('\n')
            .unwrap_or_else(|| panic!("event {name} is not followed by a blank line"));
        let v = json::parse_strict(data)
            .unwrap_or_else(|e| panic!("data is not JSON without repeated keys ({e}): {data}"));
        assert_eq!(v["type"], name, "event name differs from its type: {data}");
        assert_eq!(
            v["sequence_number"],
            events.len() as u64,
            "sequence_number is not consecutive from 0: {data}"
        );
        events.push(v);
    }
    events
}

/// Parses the translator's output strictly ([`events`]), validates each event against its
/// schema and checks every stream rule; returns the events. The stream's items must be of the
/// kinds the rules know ([`CHECKED_ITEMS`]).
#[track_caller]
pub fn check(out: &[u8], expected: &Expected) -> Vec<Value> {
    let body = std::str::from_utf8(out).expect("output is UTF-8");
    let events = events(out);
    for e in &events {
        if !NOT_IN_SCHEMA.contains(&e["type"].as_str().unwrap_or_default()) {
            schema::assert_valid_event(e);
        }
    }
    let ty = |i: usize| events[i]["type"].as_str().unwrap_or_default();
    assert!(events.len() >= 3, "too few events:\n{body}");
    assert_eq!(ty(0), "response.created");
    assert_eq!(ty(1), "response.in_progress");
    let created = &events[0]["response"];
    for e in &events[..2] {
        let r = &e["response"];
        assert_eq!(r["status"], "in_progress");
        assert_eq!(r["output"], json!([]));
        assert_eq!(r["id"], created["id"]);
        assert_eq!(r["created_at"], expected.created_at);
        assert_eq!(r["model"], expected.model);
    }

    // Exactly one terminal event, and it is the last one.
    let terminals: Vec<usize> = (0..events.len())
        .filter(|&i| TERMINAL.contains(&ty(i)))
        .collect();
    assert_eq!(
        terminals,
        [events.len() - 1],
        "want one terminal event, last:\n{body}"
    );
    // `error` is immediately followed by `response.failed`, which always follows an `error`.
    for i in 0..events.len() {
        if ty(i) == "error" {
            assert_eq!(
                ty(i + 1),
                "response.failed",
                "error not followed by failed:\n{body}"
            );
        }
        if ty(i) == "response.failed" {
            assert_eq!(
                ty(i - 1),
                "error",
                "response.failed without a preceding error:\n{body}"
            );
        }
    }

    let mut items: Vec<ItemTrack> = Vec::new();
    let mut ids = HashSet::new();
    for (i, e) in events.iter().enumerate() {
        let t = ty(i);
        let index = e["output_index"].as_u64().map(|n| n as usize);
        let item_id = e["item_id"].as_str();
        // The open item an event refers to, with its id checked.
        let open = |items: &mut Vec<ItemTrack>| -> usize {
            let n = index.unwrap_or_else(|| panic!("{t} without output_index"));
            let it = items
                .get(n)
                .unwrap_or_else(|| panic!("{t} for output_index {n} before its output_item.added"));
            assert!(it.done.is_none(), "{t} after output_item.done of item {n}");
            if let Some(id) = item_id {
                assert_eq!(id, it.id, "{t}: item_id differs from the added item's id");
            }
            n
        };
        match t {
            "response.output_item.added" => {
                let item = &e["item"];
                let n = index.expect("output_index");
                assert_eq!(n, items.len(), "output_index not consecutive");
                let kind = item["type"].as_str().unwrap_or_default().to_string();
                let id = item["id"].as_str().unwrap_or_default().to_string();
                assert!(ids.insert(id.clone()), "duplicate item id {id}");
                match kind.as_str() {
                    "message" => {
                        assert_eq!(item["status"], "in_progress");
                        assert_eq!(item["content"], json!([]));
                        assert_eq!(item["role"], "assistant");
                        // Whether tool calls follow is not known yet.
                        assert!(item.get("phase").is_none(), "phase on added: {item}");
                    }
                    "function_call" => {
                        assert_eq!(item["status"], "in_progress");
                        assert_eq!(item["arguments"], "");
                    }
                    "reasoning" => assert_eq!(item["content"], json!([])),
                    other => panic!("unexpected item type {other}"),
                }
                if kind != "reasoning" {
                    for r in items.iter().filter(|r| r.kind == "reasoning") {
                        assert!(
                            r.done.is_some(),
                            "{kind} added before reasoning {} closed",
                            r.id
                        );
                    }
                }
                items.push(ItemTrack {
                    id,
                    kind,
                    added: item.clone(),
                    parts: Vec::new(),
                    args: String::new(),
                    args_done: false,
                    done: None,
                });
            }
            "response.content_part.added" => {
                let n = open(&mut items);
                let it = &mut items[n];
                let kind = e["part"]["type"].as_str().unwrap_or_default().to_string();
                let allowed: &[&str] = match it.kind.as_str() {
                    "message" => &["output_text", "refusal"],
                    "reasoning" => &["reasoning_text"],
                    _ => &[],
                };
                assert!(
                    allowed.contains(&kind.as_str()),
                    "{kind} part in a {}",
                    it.kind
                );
                assert_eq!(e["content_index"], it.parts.len() as u64);
                assert!(
                    it.parts.iter().all(|p| p.done),
                    "part added while another is open"
                );
                assert_eq!(e["part"][part_field(&kind)], "", "part.added is not empty");
                it.parts.push(PartTrack {
                    kind,
                    acc: String::new(),
                    text_done: false,
                    done: false,
                });
            }
            "response.content_part.done" => {
                let n = open(&mut items);
                let c = e["content_index"].as_u64().expect("content_index") as usize;
                let p = items[n]
                    .parts
                    .get_mut(c)
                    .expect("content_part.done of an unknown part");
                assert!(
                    p.text_done && !p.done,
                    "content_part.done before the text's .done"
                );
                assert_eq!(e["part"]["type"], p.kind.as_str());
                assert_eq!(e["part"][part_field(&p.kind)], p.acc.as_str());
                p.done = true;
            }
            "response.function_call_arguments.delta" | "response.function_call_arguments.done" => {
                let n = open(&mut items);
                let it = &mut items[n];
                assert_eq!(it.kind, "function_call", "{t} for a {}", it.kind);
                assert!(!it.args_done, "{t} after function_call_arguments.done");
                if t.ends_with("delta") {
                    it.args.push_str(e["delta"].as_str().expect("delta"));
                } else {
                    assert_eq!(e["arguments"], it.args.as_str(), "arguments.done != deltas");
                    it.args_done = true;
                }
            }
            "response.output_item.done" => {
                let n = open(&mut items);
                let it = &mut items[n];
                let item = &e["item"];
                assert_eq!(
                    item["id"],
                    it.id.as_str(),
                    "item id changed from added to done"
                );
                assert_eq!(item["type"], it.kind.as_str());
                match it.kind.as_str() {
                    "function_call" => {
                        assert!(it.args_done, "function_call done without arguments.done");
                        assert_eq!(item["arguments"], it.args.as_str());
                        assert_eq!(item["call_id"], it.added["call_id"]);
                        assert_eq!(item["name"], it.added["name"]);
                    }
                    _ => {
                        let content = item["content"].as_array().expect("content");
                        assert_eq!(content.len(), it.parts.len(), "content != parts");
                        for (c, p) in content.iter().zip(&it.parts) {
                            assert!(p.done, "item done with a part still open");
                            assert_eq!(c["type"], p.kind.as_str());
                            assert_eq!(c[part_field(&p.kind)], p.acc.as_str());
                        }
                    }
                }
                if it.kind != "reasoning" {
                    let status = item["status"].as_str().unwrap_or_default();
                    assert!(
                        ["completed", "incomplete"].contains(&status),
                        "item status {status}"
                    );
                }
                it.done = Some(item.clone());
            }
            "error" => {}
            _ if TERMINAL.contains(&t) => {}
            "response.created" | "response.in_progress" => {}
            _ => {
                let (kind, field) = text_event(t).unwrap_or_else(|| panic!("unexpected event {t}"));
                let n = open(&mut items);
                let c = e["content_index"].as_u64().expect("content_index") as usize;
                let p = items[n]
                    .parts
                    .get_mut(c)
                    .expect("text event of an unknown part");
                assert_eq!(p.kind, kind, "{t} in a {} part", p.kind);
                assert!(!p.text_done, "{t} after the part's text .done");
                let text = e[field].as_str().expect("text");
                if field == "delta" {
                    p.acc.push_str(text);
                } else {
                    assert_eq!(text, p.acc, "{t} text != concatenated deltas");
                    p.text_done = true;
                }
            }
        }
    }

    // Every message says its phase when it ends; the last item of a response, when it is a
    // message, is the answer (`commentary` before calls: `messages_say_their_phase...`).
    for (n, it) in items.iter().enumerate() {
        if it.kind == "message" {
            let done = it.done.as_ref().expect("message done");
            let phase = done["phase"].as_str().unwrap_or_default();
            assert!(
                ["commentary", "final_answer"].contains(&phase),
                "phase of {done}"
            );
            if n + 1 == items.len() {
                assert_eq!(phase, "final_answer", "the last message: {done}");
            }
        }
    }

    // The terminal response: same id, status of its event, output = the done items.
    let last = &events[events.len() - 1];
    let r = &last["response"];
    assert_eq!(r["id"], created["id"]);
    assert_eq!(r["created_at"], expected.created_at);
    let done: Vec<Value> = items
        .iter()
        .map(|it| {
            it.done
                .clone()
                .unwrap_or_else(|| panic!("item {} never done:\n{body}", it.id))
        })
        .collect();
    assert_eq!(
        r["output"],
        Value::Array(done),
        "terminal output != output_item.done items"
    );
    match ty(events.len() - 1) {
        "response.completed" => {
            assert_eq!(r["status"], "completed");
            assert_eq!(r["incomplete_details"], Value::Null);
            assert_eq!(r["error"], Value::Null);
            assert_eq!(r["completed_at"], expected.completed_at);
        }
        "response.incomplete" => {
            assert_eq!(r["status"], "incomplete");
            assert!(r["incomplete_details"]["reason"].is_string());
            assert_eq!(r["error"], Value::Null);
            assert_eq!(r["completed_at"], expected.completed_at);
        }
        _ => {
            let err = &events[events.len() - 2]["error"];
            assert_eq!(r["status"], "failed");
            assert_eq!(r["error"]["code"], err["code"]);
            assert_eq!(r["error"]["message"], err["message"]);
        }
    }
    events
}
