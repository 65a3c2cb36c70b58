//! Proves the SSE stream translator (`translate::stream::StreamTranslator`) against recorded
//! and handwritten upstream bodies (`tests/fixtures/streams/`, `tests/fixtures/upstream/`):
//!
//! * each scenario has an exact expectation of its events and their key fields;
//! * every output obeys the stream rules ([`check`]): framing, schema, sequence numbers,
//!   per-item event order, one terminal event whose `output` equals the `output_item.done`
//!   items, `error` followed by `response.failed`, deltas adding up to their `.done`;
//! * output bytes do not depend on how the upstream body is split into chunks (proptest);
//! * frame and output caps end the stream cleanly, and nothing follows the terminal event.

mod common;

use std::collections::{BTreeMap, HashSet};

use proptest::prelude::*;
use responses_core::translate::stream::StreamTranslator;
use responses_core::translate::{Exchange, Meta, Options, ReasoningEvents};
use serde_json::{json, Value};

/// `Meta.now`: becomes `created_at`.
const NOW: u64 = 1_700_000_000;
/// The clock passed to `push`/`finish`: becomes `completed_at`.
const END: u64 = 1_700_000_042;
const SEED: u128 = 0x0123_4567_89ab_cdef_0011_2233_4455_6677;
const MODEL: &str = "qwen3-8b";

/// Every fixture, for the properties that hold for all of them.
const FIXTURES: &[&str] = &[
    "streams/text.sse",
    "streams/reasoning-llama.sse",
    "streams/reasoning-vllm.sse",
    "streams/tool-call.sse",
    "streams/tool-call-late-name.sse",
    "streams/parallel-tool-calls.sse",
    "streams/text-then-tool-call.sse",
    "streams/reasoning-then-tool-call.sse",
    "streams/length.sse",
    "streams/content-filter.sse",
    "streams/refusal.sse",
    "streams/usage-after-finish-no-done.sse",
    "streams/midstream-error.sse",
    "streams/cut.sse",
    "streams/cut-mid-frame.sse",
    "streams/not-json.sse",
    "streams/crlf-keepalive.sse",
    "streams/cr-keepalive.sse",
    "upstream/llama-server-text.sse",
    "upstream/llama-server-reasoning.sse",
    "upstream/llama-server-tool.sse",
    "upstream/vllm-0.32-text.sse",
    "upstream/vllm-0.32-tool-required.sse",
];

fn fixture(name: &str) -> Vec<u8> {
    let path = common::repo_root().join("tests/fixtures").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

fn translator(options: Options) -> StreamTranslator {
    let meta = Meta {
        now: NOW,
        id_seed: SEED,
    };
    StreamTranslator::new(Exchange::new(MODEL, true, meta, options))
}

/// Whether `out` is a whole number of frames: the translator never emits half an event.
fn whole_frames(out: &[u8]) -> bool {
    out.is_empty()
        || ((out.starts_with(b"event: ") || out.starts_with(b"data: ")) && out.ends_with(b"\n\n"))
}

/// Pushes `chunks` in order, then finishes; returns all output bytes.
fn translate_chunks<'a>(options: Options, chunks: impl IntoIterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut t = translator(options);
    let mut out = Vec::new();
    for chunk in chunks {
        let b = t.push(chunk, END);
        assert!(whole_frames(&b), "push emitted a partial frame: {b:?}");
        out.extend_from_slice(&b);
    }
    let b = t.finish(END);
    assert!(whole_frames(&b), "finish emitted a partial frame: {b:?}");
    out.extend_from_slice(&b);
    out
}

fn translate(body: &[u8], options: Options) -> Vec<u8> {
    translate_chunks(options, [body])
}

// ---------------------------------------------------------------------------------------------
// The stream rules
// ---------------------------------------------------------------------------------------------

const TERMINAL: [&str; 3] = [
    "response.completed",
    "response.incomplete",
    "response.failed",
];

/// Event names OpenAI uses that the OpenResponses schema does not define.
const NOT_IN_SCHEMA: [&str; 2] = [
    "response.reasoning_text.delta",
    "response.reasoning_text.done",
];

/// Content-part kind of a text event and the field carrying its text (delta, done).
fn text_event(ty: &str) -> Option<(&'static str, &'static str)> {
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
fn part_field(kind: &str) -> &'static str {
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

/// Parses the translator's output strictly and checks every stream rule; returns the events.
#[track_caller]
fn check(out: &[u8]) -> Vec<Value> {
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
        let v: Value =
            serde_json::from_str(data).unwrap_or_else(|e| panic!("data is not JSON ({e}): {data}"));
        assert_eq!(v["type"], name, "event name differs from its type: {data}");
        assert_eq!(
            v["sequence_number"],
            events.len() as u64,
            "sequence_number is not consecutive from 0: {data}"
        );
        if !NOT_IN_SCHEMA.contains(&name) {
            common::schema::assert_valid_event(&v);
        }
        events.push(v);
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
        assert_eq!(r["created_at"], NOW);
        assert_eq!(r["model"], MODEL);
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
    assert_eq!(r["created_at"], NOW);
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
            assert_eq!(r["completed_at"], END);
        }
        "response.incomplete" => {
            assert_eq!(r["status"], "incomplete");
            assert!(r["incomplete_details"]["reason"].is_string());
            assert_eq!(r["error"], Value::Null);
            assert_eq!(r["completed_at"], END);
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

// ---------------------------------------------------------------------------------------------
// Compact, readable renderings for exact expectations
// ---------------------------------------------------------------------------------------------

/// One line per event with its key fields (`<output_index>/<content_index>`, texts as `{:?}`).
fn trace(events: &[Value]) -> Vec<String> {
    let s = |v: &Value| v.as_str().unwrap_or("?").to_string();
    let at = |e: &Value| match e.get("content_index") {
        Some(c) => format!("{}/{c}", e["output_index"]),
        None => format!("{}", e["output_index"]),
    };
    events
        .iter()
        .map(|e| {
            let t = e["type"].as_str().unwrap_or_default();
            let item = &e["item"];
            match t {
                "response.created" => "created".into(),
                "response.in_progress" => "in_progress".into(),
                "response.completed" => "completed".into(),
                "response.incomplete" => format!(
                    "incomplete {}",
                    s(&e["response"]["incomplete_details"]["reason"])
                ),
                "response.failed" => format!("failed {}", s(&e["response"]["error"]["code"])),
                "error" => format!(
                    "error {}: {}",
                    s(&e["error"]["code"]),
                    s(&e["error"]["message"])
                ),
                "response.output_item.added" | "response.output_item.done" => {
                    let sign = if t.ends_with("added") { '+' } else { '-' };
                    let mut line = format!("{sign}item {} {}", at(e), s(&item["type"]));
                    if sign == '+' && item["type"] == "function_call" {
                        line += &format!(" {} {}", s(&item["name"]), s(&item["call_id"]));
                    }
                    if sign == '-' && item["type"] != "reasoning" {
                        line += &format!(" {}", s(&item["status"]));
                    }
                    line
                }
                "response.content_part.added" => {
                    format!("+part {} {}", at(e), s(&e["part"]["type"]))
                }
                "response.content_part.done" => {
                    format!("-part {} {}", at(e), s(&e["part"]["type"]))
                }
                "response.function_call_arguments.delta" => {
                    format!("args {} {:?}", at(e), s(&e["delta"]))
                }
                "response.function_call_arguments.done" => {
                    format!("args.done {} {:?}", at(e), s(&e["arguments"]))
                }
                _ => {
                    let short = t
                        .trim_start_matches("response.")
                        .replace("output_text", "text");
                    let (_, field) = text_event(t).unwrap_or(("", "delta"));
                    let short = short.trim_end_matches(".delta");
                    format!("{short} {} {:?}", at(e), s(&e[field]))
                }
            }
        })
        .collect()
}

fn terminal(events: &[Value]) -> &Value {
    &events[events.len() - 1]["response"]
}

/// A Responses usage object.
fn usage(input: u64, output: u64, total: u64, cached: u64, reasoning: u64) -> Value {
    json!({
        "input_tokens": input,
        "output_tokens": output,
        "total_tokens": total,
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": reasoning},
    })
}

/// Translates a fixture in one chunk, checks the rules, and compares the trace exactly.
#[track_caller]
fn scenario(name: &str, expected: &[&str]) -> Vec<Value> {
    let events = check(&translate(&fixture(name), Options::default()));
    let got = trace(&events);
    assert_eq!(got, expected, "{name}: got\n{got:#?}");
    events
}

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

#[test]
fn plain_text() {
    let events = scenario(
        "streams/text.sse",
        &[
            "created",
            "in_progress",
            "+item 0 message",
            "+part 0/0 output_text",
            r#"text 0/0 "Hello""#,
            r#"text 0/0 ",""#,
            r#"text 0/0 " wörld""#,
            r#"text 0/0 "!""#,
            r#"text.done 0/0 "Hello, wörld!""#,
            "-part 0/0 output_text",
            "-item 0 message completed",
            "completed",
        ],
    );
    let r = terminal(&events);
    // The usage chunk (`choices: []`) came after the finish_reason: the terminal event has it.
    assert_eq!(r["usage"], usage(12, 4, 16, 0, 0));
    assert_eq!(r["completed_at"], END);
    assert_eq!(r["id"], format!("resp_{SEED:032x}"));
    assert_eq!(r["output"][0]["id"], format!("msg_{SEED:032x}0000"));
    assert_eq!(
        r["output"][0]["content"],
        json!([{"type": "output_text", "text": "Hello, wörld!", "annotations": [], "logprobs": []}])
    );
}

#[test]
fn reasoning_content_then_text_llama_cpp() {
    let events = scenario(
        "streams/reasoning-llama.sse",
        &[
            "created",
            "in_progress",
            "+item 0 reasoning",
            "+part 0/0 reasoning_text",
            r#"reasoning 0/0 "The user""#,
            r#"reasoning 0/0 " greets me.""#,
            r#"reasoning.done 0/0 "The user greets me.""#,
            "-part 0/0 reasoning_text",
            "-item 0 reasoning",
            "+item 1 message",
            "+part 1/0 output_text",
            r#"text 1/0 "Hi""#,
            r#"text 1/0 " there!""#,
            r#"text.done 1/0 "Hi there!""#,
            "-part 1/0 output_text",
            "-item 1 message completed",
            "completed",
        ],
    );
    let r = terminal(&events);
    assert_eq!(r["usage"], usage(14, 9, 23, 5, 0));
    assert_eq!(r["output"][0]["id"], format!("rs_{SEED:032x}0000"));
    assert_eq!(
        r["output"][0]["content"],
        json!([{"type": "reasoning_text", "text": "The user greets me."}])
    );
    assert_eq!(r["output"][0]["summary"], json!([]));
}

#[test]
fn reasoning_then_text_vllm() {
    let events = scenario(
        "streams/reasoning-vllm.sse",
        &[
            "created",
            "in_progress",
            "+item 0 reasoning",
            "+part 0/0 reasoning_text",
            r#"reasoning 0/0 "Two""#,
            r#"reasoning 0/0 " plus two""#,
            r#"reasoning 0/0 " is four.\n""#,
            r#"reasoning.done 0/0 "Two plus two is four.\n""#,
            "-part 0/0 reasoning_text",
            "-item 0 reasoning",
            "+item 1 message",
            "+part 1/0 output_text",
            r#"text 1/0 "\n\n""#,
            r#"text 1/0 "4""#,
            r#"text.done 1/0 "\n\n4""#,
            "-part 1/0 output_text",
            "-item 1 message completed",
            "completed",
        ],
    );
    assert_eq!(terminal(&events)["usage"], usage(20, 11, 31, 0, 8));
}

#[test]
fn single_tool_call() {
    let events = scenario(
        "streams/tool-call.sse",
        &[
            "created",
            "in_progress",
            "+item 0 function_call get_weather kD5y4dSJehNikHGI2ynz",
            r#"args 0 "{\"""#,
            r#"args 0 "city""#,
            r#"args 0 "\":\"""#,
            r#"args 0 "Paris\"}""#,
            r#"args.done 0 "{\"city\":\"Paris\"}""#,
            "-item 0 function_call completed",
            "completed",
        ],
    );
    let r = terminal(&events);
    assert_eq!(r["usage"], usage(190, 18, 208, 0, 0));
    assert_eq!(
        r["output"],
        json!([{
            "type": "function_call",
            "id": format!("fc_{SEED:032x}0000"),
            "call_id": "kD5y4dSJehNikHGI2ynz",
            "name": "get_weather",
            "arguments": "{\"city\":\"Paris\"}",
            "status": "completed",
        }])
    );
}

#[test]
fn tool_call_whose_name_comes_after_its_first_arguments() {
    scenario(
        "streams/tool-call-late-name.sse",
        &[
            "created",
            "in_progress",
            "+item 0 function_call add call_late",
            r#"args 0 "{\"a\":1}""#,
            r#"args.done 0 "{\"a\":1}""#,
            "-item 0 function_call completed",
            "completed",
        ],
    );
}

#[test]
fn parallel_tool_calls_in_one_chunk_and_interleaved() {
    let events = scenario(
        "streams/parallel-tool-calls.sse",
        &[
            "created",
            "in_progress",
            "+item 0 function_call get_weather chatcmpl-tool-aaa",
            "+item 1 function_call get_time chatcmpl-tool-bbb",
            r#"args 0 "{\"city\": ""#,
            r#"args 1 "{\"tz\": ""#,
            r#"args 0 "\"Paris\"}""#,
            r#"args 1 "\"CET\"}""#,
            "+item 2 function_call get_weather chatcmpl-tool-ccc",
            r#"args 2 "{\"city\": ""#,
            r#"args 2 "\"Rome\"}""#,
            r#"args.done 0 "{\"city\": \"Paris\"}""#,
            "-item 0 function_call completed",
            r#"args.done 1 "{\"tz\": \"CET\"}""#,
            "-item 1 function_call completed",
            r#"args.done 2 "{\"city\": \"Rome\"}""#,
            "-item 2 function_call completed",
            "completed",
        ],
    );
    let r = terminal(&events);
    assert_eq!(r["usage"], usage(210, 52, 262, 0, 0));
    let calls: Vec<(&str, &str)> = r["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["call_id"].as_str().unwrap(),
                i["arguments"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("chatcmpl-tool-aaa", r#"{"city": "Paris"}"#),
            ("chatcmpl-tool-bbb", r#"{"tz": "CET"}"#),
            ("chatcmpl-tool-ccc", r#"{"city": "Rome"}"#),
        ]
    );
}

#[test]
fn text_then_tool_call() {
    let events = scenario(
        "streams/text-then-tool-call.sse",
        &[
            "created",
            "in_progress",
            "+item 0 message",
            "+part 0/0 output_text",
            r#"text 0/0 "Let me check""#,
            r#"text 0/0 " that.""#,
            r#"text.done 0/0 "Let me check that.""#,
            "-part 0/0 output_text",
            "-item 0 message completed",
            "+item 1 function_call search call_7Yt",
            r#"args 1 "{\"q\":""#,
            r#"args 1 "\"ext_proc\"}""#,
            r#"args.done 1 "{\"q\":\"ext_proc\"}""#,
            "-item 1 function_call completed",
            "completed",
        ],
    );
    assert_eq!(terminal(&events)["usage"], usage(150, 21, 171, 0, 0));
}

#[test]
fn reasoning_then_tool_call() {
    let events = scenario(
        "streams/reasoning-then-tool-call.sse",
        &[
            "created",
            "in_progress",
            "+item 0 reasoning",
            "+part 0/0 reasoning_text",
            r#"reasoning 0/0 "Need the weather.""#,
            r#"reasoning.done 0/0 "Need the weather.""#,
            "-part 0/0 reasoning_text",
            "-item 0 reasoning",
            "+item 1 function_call get_weather call_r1",
            r#"args 1 "{}""#,
            r#"args.done 1 "{}""#,
            "-item 1 function_call completed",
            "completed",
        ],
    );
    // No usage chunk upstream: none invented.
    assert_eq!(terminal(&events)["usage"], Value::Null);
}

#[test]
fn finish_reason_length_is_incomplete_max_output_tokens() {
    let events = scenario(
        "streams/length.sse",
        &[
            "created",
            "in_progress",
            "+item 0 message",
            "+part 0/0 output_text",
            r#"text 0/0 "Once upon""#,
            r#"text 0/0 " a time""#,
            r#"text.done 0/0 "Once upon a time""#,
            "-part 0/0 output_text",
            "-item 0 message incomplete",
            "incomplete max_output_tokens",
        ],
    );
    let r = terminal(&events);
    assert_eq!(r["status"], "incomplete");
    assert_eq!(
        r["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(r["usage"], usage(9, 4, 13, 0, 0));
}

#[test]
fn finish_reason_content_filter_is_incomplete_content_filter() {
    let events = scenario(
        "streams/content-filter.sse",
        &[
            "created",
            "in_progress",
            "+item 0 message",
            "+part 0/0 output_text",
            r#"text 0/0 "Here is how to""#,
            r#"text.done 0/0 "Here is how to""#,
            "-part 0/0 output_text",
            "-item 0 message incomplete",
            "incomplete content_filter",
        ],
    );
    let r = terminal(&events);
    assert_eq!(r["incomplete_details"], json!({"reason": "content_filter"}));
    assert_eq!(r["usage"], usage(15, 4, 19, 0, 0));
}

#[test]
fn refusal() {
    let events = scenario(
        "streams/refusal.sse",
        &[
            "created",
            "in_progress",
            "+item 0 message",
            "+part 0/0 refusal",
            r#"refusal 0/0 "I can't""#,
            r#"refusal 0/0 " help with that.""#,
            r#"refusal.done 0/0 "I can't help with that.""#,
            "-part 0/0 refusal",
            "-item 0 message completed",
            "completed",
        ],
    );
    let r = terminal(&events);
    assert_eq!(
        r["output"][0]["content"],
        json!([{"type": "refusal", "refusal": "I can't help with that."}])
    );
    assert_eq!(r["usage"], usage(30, 6, 36, 0, 0));
}

#[test]
fn usage_after_finish_without_done_is_carried_by_the_terminal_event() {
    let events = scenario(
        "streams/usage-after-finish-no-done.sse",
        &[
            "created",
            "in_progress",
            "+item 0 message",
            "+part 0/0 output_text",
            r#"text 0/0 "Done.""#,
            r#"text.done 0/0 "Done.""#,
            "-part 0/0 output_text",
            "-item 0 message completed",
            "completed",
        ],
    );
    assert_eq!(terminal(&events)["usage"], usage(7, 2, 9, 0, 0));
}

#[test]
fn midstream_error_chunk_fails_with_the_word_of_the_upstream_code_and_its_message() {
    const MSG: &str = "CUDA error: an illegal memory access was encountered";
    let events = scenario(
        "streams/midstream-error.sse",
        &[
            "created",
            "in_progress",
            "+item 0 message",
            "+part 0/0 output_text",
            r#"text 0/0 "Partial""#,
            r#"text.done 0/0 "Partial""#,
            "-part 0/0 output_text",
            "-item 0 message incomplete",
            &format!("error server_error: {MSG}"),
            "failed server_error",
        ],
    );
    let r = terminal(&events);
    assert_eq!(r["error"], json!({"code": "server_error", "message": MSG}));
    assert_eq!(r["status"], "failed");
    assert_eq!(events[events.len() - 2]["error"]["type"], "server_error");
}

#[test]
fn connection_cut_at_a_frame_boundary_is_truncated() {
    let events = scenario(
        "streams/cut.sse",
        &[
            "created",
            "in_progress",
            "+item 0 message",
            "+part 0/0 output_text",
            r#"text 0/0 "The first""#,
            r#"text 0/0 " half""#,
            r#"text.done 0/0 "The first half""#,
            "-part 0/0 output_text",
            "-item 0 message incomplete",
            &format!("error upstream_stream_truncated: {TRUNCATED}"),
            "failed upstream_stream_truncated",
        ],
    );
    assert_eq!(terminal(&events)["output"][0]["status"], "incomplete");
}

const TRUNCATED: &str =
    "The upstream stream ended before the answer was finished (no finish_reason and no [DONE]).";

#[test]
fn connection_cut_inside_a_frame_is_truncated() {
    let events = check(&translate(
        &fixture("streams/cut-mid-frame.sse"),
        Options::default(),
    ));
    let got = trace(&events);
    let expected = trace(&check(&translate(
        &fixture("streams/cut.sse"),
        Options::default(),
    )));
    assert_eq!(
        got, expected,
        "a frame cut mid-JSON is a truncated stream, not a bad chunk"
    );
}

/// After the finish_reason the answer is whole: a body cut inside the trailing usage chunk or
/// inside `[DONE]` completes (without the lost usage), it does not fail.
#[test]
fn a_cut_after_the_finish_reason_completes() {
    let body = fixture("streams/text.sse");
    let fr = frames(&body);
    let usage_frame = fr[5];
    assert!(usage_frame.starts_with(b"data: {") && usage_frame.windows(5).any(|w| w == b"usage"));
    let cut_in_usage = [&fr[..5].concat()[..], &usage_frame[..40]].concat();
    let events = check(&translate(&cut_in_usage, Options::default()));
    assert_eq!(terminal(&events)["status"], "completed");
    assert_eq!(terminal(&events)["usage"], Value::Null);
    let cut_in_done = [&fr[..6].concat()[..], b"data: [DO"].concat();
    let events = check(&translate(&cut_in_done, Options::default()));
    assert_eq!(terminal(&events)["status"], "completed");
    assert_eq!(terminal(&events)["usage"], usage(12, 4, 16, 0, 0));
    // A whole last chunk without its blank line is used like any other.
    let unterminated = &body[..body.len() - "data: [DONE]\n\n".len() - 2];
    let events = check(&translate(unterminated, Options::default()));
    assert_eq!(terminal(&events)["usage"], usage(12, 4, 16, 0, 0));
}

#[test]
fn chunk_that_is_not_json_fails() {
    let events = scenario(
        "streams/not-json.sse",
        &[
            "created",
            "in_progress",
            "+item 0 message",
            "+part 0/0 output_text",
            r#"text 0/0 "Almost""#,
            r#"text.done 0/0 "Almost""#,
            "-part 0/0 output_text",
            "-item 0 message incomplete",
            "error upstream_invalid_chunk: The upstream sent a stream event that is not a valid chat.completion.chunk.",
            "failed upstream_invalid_chunk",
        ],
    );
    // Nothing of what followed the bad chunk was used.
    assert_eq!(
        terminal(&events)["output"][0]["content"][0]["text"],
        "Almost"
    );
}

#[test]
fn crlf_and_cr_line_endings_keepalive_comments_and_data_without_space() {
    let expected = [
        "created",
        "in_progress",
        "+item 0 message",
        "+part 0/0 output_text",
        r#"text 0/0 "Line one""#,
        r#"text 0/0 "\r\nline two""#,
        r#"text.done 0/0 "Line one\r\nline two""#,
        "-part 0/0 output_text",
        "-item 0 message completed",
        "completed",
    ];
    let crlf = scenario("streams/crlf-keepalive.sse", &expected);
    let cr = scenario("streams/cr-keepalive.sse", &expected);
    assert_eq!(terminal(&crlf)["usage"], usage(3, 5, 8, 0, 0));
    assert_eq!(crlf, cr);
}

// ---------------------------------------------------------------------------------------------
// Real captures: cross-checked against what the upstream frames say (an independent oracle)
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Default, PartialEq)]
struct Oracle {
    reasoning: String,
    text: String,
    refusal: String,
    /// By upstream index: (call id, name, arguments).
    calls: BTreeMap<u64, (String, String, String)>,
    finish: Option<String>,
    usage: Option<Value>,
}

fn oracle(body: &[u8]) -> Oracle {
    let mut o = Oracle::default();
    let body = std::str::from_utf8(body).expect("UTF-8 fixture");
    for ev in common::sse::parse_sse(body) {
        if ev.data == "[DONE]" {
            continue;
        }
        // The answer ends at a frame that is not a chunk, or an error.
        let Ok(v) = serde_json::from_str::<Value>(&ev.data) else {
            break;
        };
        if v.get("error").is_some() {
            break;
        }
        if !v["usage"].is_null() {
            o.usage = Some(v["usage"].clone());
        }
        for c in v["choices"].as_array().into_iter().flatten() {
            // One answer per response: the first choice, up to its finish_reason.
            if c["index"].as_u64().unwrap_or(0) != 0 || o.finish.is_some() {
                continue;
            }
            let d = &c["delta"];
            let reasoning = d["reasoning_content"].as_str().or(d["reasoning"].as_str());
            o.reasoning += reasoning.unwrap_or_default();
            o.text += d["content"].as_str().unwrap_or_default();
            o.refusal += d["refusal"].as_str().unwrap_or_default();
            for tc in d["tool_calls"].as_array().into_iter().flatten() {
                let call = o
                    .calls
                    .entry(tc["index"].as_u64().unwrap_or(0))
                    .or_default();
                if let Some(id) = tc["id"]
                    .as_str()
                    .filter(|id| call.0.is_empty() && !id.is_empty())
                {
                    call.0 = id.to_string();
                }
                if let Some(name) = tc["function"]["name"]
                    .as_str()
                    .filter(|n| call.1.is_empty() && !n.is_empty())
                {
                    call.1 = name.to_string();
                }
                call.2 += tc["function"]["arguments"].as_str().unwrap_or_default();
            }
            if let Some(f) = c["finish_reason"].as_str() {
                o.finish = Some(f.to_string());
            }
        }
    }
    o
}

/// What the terminal response says, in the oracle's terms.
fn observed(r: &Value) -> Oracle {
    let mut o = Oracle::default();
    for (n, item) in r["output"].as_array().expect("output").iter().enumerate() {
        match item["type"].as_str().unwrap_or_default() {
            "reasoning" => o.reasoning += item["content"][0]["text"].as_str().unwrap_or_default(),
            "message" => {
                for part in item["content"].as_array().expect("content") {
                    o.text += part["text"].as_str().unwrap_or_default();
                    o.refusal += part["refusal"].as_str().unwrap_or_default();
                }
            }
            _ => {
                o.calls.insert(
                    n as u64,
                    (
                        item["call_id"].as_str().unwrap_or_default().to_string(),
                        item["name"].as_str().unwrap_or_default().to_string(),
                        item["arguments"].as_str().unwrap_or_default().to_string(),
                    ),
                );
            }
        }
    }
    o
}

#[test]
fn real_captures_match_what_the_upstream_said() {
    // (fixture, status, incomplete reason, usage)
    let cases = [
        (
            "upstream/llama-server-text.sse",
            "incomplete",
            Some("max_output_tokens"),
            usage(37, 60, 97, 0, 0),
        ),
        (
            "upstream/llama-server-reasoning.sse",
            "incomplete",
            Some("max_output_tokens"),
            usage(20, 60, 80, 3, 0),
        ),
        (
            "upstream/llama-server-tool.sse",
            "incomplete",
            Some("max_output_tokens"),
            usage(204, 100, 304, 203, 0),
        ),
        (
            "upstream/vllm-0.32-text.sse",
            "incomplete",
            Some("max_output_tokens"),
            usage(37, 12, 49, 0, 0),
        ),
        (
            "upstream/vllm-0.32-tool-required.sse",
            "completed",
            None,
            usage(204, 49, 253, 0, 0),
        ),
    ];
    for (name, status, reason, want_usage) in cases {
        let body = fixture(name);
        let events = check(&translate(&body, Options::default()));
        let r = terminal(&events);
        assert_eq!(r["status"], status, "{name}");
        assert_eq!(r["incomplete_details"]["reason"].as_str(), reason, "{name}");
        assert_eq!(r["usage"], want_usage, "{name}");
        let want = oracle(&body);
        let got = observed(r);
        assert_eq!(got.reasoning, want.reasoning, "{name}");
        assert_eq!(got.text, want.text, "{name}");
        // Output indices follow the calls' upstream order after any reasoning/text items.
        let got_calls: Vec<_> = got.calls.into_values().collect();
        let want_calls: Vec<_> = want.calls.into_values().collect();
        assert_eq!(got_calls, want_calls, "{name}");
        // Calls cut by `length` are incomplete, like the text.
        let item_status = if status == "completed" {
            "completed"
        } else {
            "incomplete"
        };
        for item in r["output"].as_array().unwrap() {
            if item["type"] != "reasoning" {
                assert_eq!(item["status"], item_status, "{name}: {item}");
            }
        }
    }
    // The llama.cpp tool capture has three calls, the last one cut short.
    let r = check(&translate(
        &fixture("upstream/llama-server-tool.sse"),
        Options::default(),
    ));
    let calls = terminal(&r)["output"].as_array().unwrap().len();
    assert_eq!(calls, 3);
}

/// The oracle also agrees on every handwritten fixture that ends normally.
#[test]
fn handwritten_fixtures_match_what_the_upstream_said() {
    for name in FIXTURES.iter().filter(|n| n.starts_with("streams/")) {
        let body = fixture(name);
        let events = check(&translate(&body, Options::default()));
        let r = terminal(&events);
        if r["status"] == "failed" || name.contains("keepalive") {
            continue;
        }
        let want = oracle(&body);
        let got = observed(r);
        assert_eq!(
            (&got.reasoning, &got.text, &got.refusal),
            (&want.reasoning, &want.text, &want.refusal),
            "{name}"
        );
        let got_calls: Vec<_> = got.calls.into_values().collect();
        let want_calls: Vec<_> = want.calls.into_values().collect();
        assert_eq!(got_calls, want_calls, "{name}");
    }
}

// ---------------------------------------------------------------------------------------------
// Every fixture obeys the rules; output does not depend on chunking
// ---------------------------------------------------------------------------------------------

#[test]
fn every_fixture_obeys_the_rules_with_both_reasoning_event_names() {
    for name in FIXTURES {
        let body = fixture(name);
        for reasoning_events in [ReasoningEvents::Spec, ReasoningEvents::OpenAi] {
            let options = Options {
                reasoning_events,
                ..Options::default()
            };
            check(&translate(&body, options));
        }
    }
}

#[test]
fn one_byte_chunks_give_the_same_bytes_for_every_fixture() {
    for name in FIXTURES {
        let body = fixture(name);
        let whole = translate(&body, Options::default());
        let bytewise = translate_chunks(Options::default(), body.chunks(1));
        assert!(
            whole == bytewise,
            "{name}: 1-byte chunks changed the output"
        );
    }
}

/// Chunk sizes, used in turn until the body is consumed: 1-byte chunks in about a fifth of
/// the cases, otherwise random sizes up to a random bound (mostly smaller than one frame).
fn chunk_sizes() -> impl Strategy<Value = Vec<usize>> {
    prop_oneof![
        1 => Just(vec![1]),
        4 => (prop::sample::select(vec![4usize, 40, 400, 4000]))
            .prop_flat_map(|max| prop::collection::vec(1..=max, 1..24)),
    ]
}

fn split<'a>(body: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    let mut chunks = Vec::new();
    let mut at = 0;
    for &n in sizes.iter().cycle() {
        if at >= body.len() {
            break;
        }
        let end = (at + n).min(body.len());
        chunks.push(&body[at..end]);
        at = end;
    }
    chunks
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // Failures print their minimal input; do not write regression files into tests/.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(128))]

    /// Any split of any fixture gives byte-identical output to the one-chunk translation, and
    /// every push emits whole frames. The one-chunk output of every fixture obeys the rules
    /// (`every_fixture_obeys_the_rules…`), so every split's output does too.
    #[test]
    fn any_split_gives_identical_bytes(
        fixture_index in 0..FIXTURES.len(),
        sizes in chunk_sizes(),
        openai in any::<bool>(),
    ) {
        let body = fixture(FIXTURES[fixture_index]);
        let options = || Options {
            reasoning_events: if openai { ReasoningEvents::OpenAi } else { ReasoningEvents::Spec },
            ..Options::default()
        };
        let whole = translate(&body, options());
        let chunked = translate_chunks(options(), split(&body, &sizes));
        prop_assert!(whole == chunked, "{}: split {:?} changed the output", FIXTURES[fixture_index], sizes);
    }

    /// With tight caps the streams fail in the middle; still split-independent and valid.
    #[test]
    fn any_split_with_tight_caps_is_identical_and_valid(
        fixture_index in 0..FIXTURES.len(),
        sizes in chunk_sizes(),
        max_sse_frame_bytes in 150usize..700,
        max_output_bytes in 0usize..60,
    ) {
        let body = fixture(FIXTURES[fixture_index]);
        let options = || Options { max_sse_frame_bytes, max_output_bytes, ..Options::default() };
        let whole = translate(&body, options());
        let chunked = translate_chunks(options(), split(&body, &sizes));
        prop_assert!(whole == chunked, "{}: split {:?} changed the output", FIXTURES[fixture_index], sizes);
        let events = check(&whole);
        let r = terminal(&events);
        let total: usize = r["output"].as_array().unwrap().iter().map(|item| {
            let text = item["content"][0]["text"].as_str()
                .or(item["content"][0]["refusal"].as_str())
                .or(item["arguments"].as_str())
                .unwrap_or_default();
            text.len()
        }).sum();
        prop_assert!(total <= max_output_bytes, "output of {} bytes beyond the cap", total);
    }

    /// The body cut anywhere (a connection cut at any byte) still gives a valid stream: failed
    /// as truncated unless the answer had already ended, never a second terminal event.
    #[test]
    fn a_body_cut_anywhere_ends_cleanly(
        fixture_index in 0..FIXTURES.len(),
        cut in any::<prop::sample::Index>(),
    ) {
        let body = fixture(FIXTURES[fixture_index]);
        let cut = cut.index(body.len() + 1);
        let events = check(&translate(&body[..cut], Options::default()));
        let r = terminal(&events);
        if r["status"] == "failed" {
            let code = r["error"]["code"].as_str().unwrap_or_default();
            let whole = check(&translate(&body, Options::default()));
            let whole_code = terminal(&whole)["error"]["code"].clone();
            // Either cut short, or the failure the whole body has anyway.
            prop_assert!(
                code == "upstream_stream_truncated" || whole_code == code,
                "cut at {} of {}: failed with {}", cut, FIXTURES[fixture_index], code
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Generated upstream streams: any mix of deltas, finish reasons, usage, errors and cuts
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Reasoning(String),
    Content(String),
    Refusal(String),
    /// A tool-call delta: upstream index, with id, with name, argument fragment.
    Tool(u32, bool, bool, String),
    /// Several tool-call deltas in one chunk.
    Tools(Vec<(u32, String)>),
    Finish(&'static str),
    Usage,
    Error,
    NotJson,
    KeepAlive,
    /// A delta for a second choice (n > 1), which is dropped.
    OtherChoice(String),
}

fn op() -> impl Strategy<Value = Op> {
    let text = || "[a-z \"{}:é\\n]{0,6}";
    prop_oneof![
        4 => text().prop_map(Op::Reasoning),
        6 => text().prop_map(Op::Content),
        1 => text().prop_map(Op::Refusal),
        6 => (0u32..3, any::<bool>(), prop::bool::weighted(0.7), text())
            .prop_map(|(i, id, name, args)| Op::Tool(i, id, name, args)),
        1 => prop::collection::vec((0u32..3, text()), 1..4).prop_map(Op::Tools),
        1 => prop::sample::select(vec!["stop", "length", "tool_calls", "content_filter"])
            .prop_map(Op::Finish),
        1 => Just(Op::Usage),
        1 => Just(Op::Error),
        1 => Just(Op::NotJson),
        1 => Just(Op::KeepAlive),
        1 => text().prop_map(Op::OtherChoice),
    ]
}

fn chunk(choices: Value) -> String {
    let c = json!({"id": "chatcmpl-g", "object": "chat.completion.chunk", "created": NOW,
                   "model": MODEL, "choices": choices});
    format!("data: {c}\n\n")
}

fn delta(d: Value) -> String {
    chunk(json!([{"index": 0, "delta": d, "finish_reason": null}]))
}

fn render(ops: &[Op], done: bool) -> String {
    let mut body = delta(json!({"role": "assistant", "content": ""}));
    for op in ops {
        body += &match op {
            Op::Reasoning(t) => delta(json!({ "reasoning_content": t })),
            Op::Content(t) => delta(json!({ "content": t })),
            Op::Refusal(t) => delta(json!({ "refusal": t })),
            Op::Tool(i, id, name, args) => {
                let mut tc = json!({"index": i, "function": {"arguments": args}});
                if *id {
                    tc["id"] = json!(format!("call_{i}"));
                    tc["type"] = json!("function");
                }
                if *name {
                    tc["function"]["name"] = json!(format!("fn_{i}"));
                }
                delta(json!({ "tool_calls": [tc] }))
            }
            Op::Tools(calls) => {
                let tcs: Vec<Value> = calls
                    .iter()
                    .map(|(i, args)| json!({"index": i, "function": {"name": format!("fn_{i}"), "arguments": args}}))
                    .collect();
                delta(json!({ "tool_calls": tcs }))
            }
            Op::Finish(reason) => {
                chunk(json!([{"index": 0, "delta": {}, "finish_reason": reason}]))
            }
            Op::Usage => {
                let c = json!({"id": "chatcmpl-g", "object": "chat.completion.chunk", "choices": [],
                               "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}});
                format!("data: {c}\n\n")
            }
            Op::Error => {
                "data: {\"error\": {\"message\": \"boom\", \"code\": \"overloaded\"}}\n\n".into()
            }
            Op::NotJson => "data: {\"choices\": [\n\n".into(),
            Op::KeepAlive => ": keep-alive\n\n".into(),
            Op::OtherChoice(t) => {
                chunk(json!([{"index": 1, "delta": {"content": t}, "finish_reason": null}]))
            }
        };
    }
    if done {
        body += "data: [DONE]\n\n";
    }
    body
}

proptest! {
    #![proptest_config(config(128))]

    /// Any generated upstream stream obeys the rules, and unless it failed its output says what
    /// the upstream said (up to the finish_reason).
    #[test]
    fn any_generated_upstream_stream_obeys_the_rules(
        ops in prop::collection::vec(op(), 0..24),
        done in any::<bool>(),
        sizes in chunk_sizes(),
    ) {
        let body = render(&ops, done);
        let whole = translate(body.as_bytes(), Options::default());
        let chunked = translate_chunks(Options::default(), split(body.as_bytes(), &sizes));
        prop_assert!(whole == chunked, "split {:?} changed the output", sizes);
        let events = check(&whole);
        let r = terminal(&events);
        let want = oracle(body.as_bytes());
        // The first error or bad chunk fails the stream; else the end without a finish_reason.
        let failure = ops.iter().find_map(|op| match op {
            Op::Error => Some("overloaded"),
            Op::NotJson => Some("upstream_invalid_chunk"),
            _ => None,
        });
        let finished = done || ops.iter().any(|op| matches!(op, Op::Finish(_)));
        let failure = failure.or((!finished).then_some("upstream_stream_truncated"));
        prop_assert_eq!(r["error"]["code"].as_str(), failure);
        match r["status"].as_str().unwrap() {
            "failed" => return Ok(()),
            "incomplete" => {
                let reason = r["incomplete_details"]["reason"].as_str().unwrap();
                let finish = want.finish.as_deref();
                prop_assert!(
                    (finish == Some("length") && reason == "max_output_tokens")
                        || (finish == Some("content_filter") && reason == "content_filter"),
                    "incomplete {} after finish_reason {:?}", reason, finish
                );
            }
            _ => prop_assert!(!matches!(want.finish.as_deref(), Some("length" | "content_filter"))),
        }
        let got = observed(r);
        prop_assert_eq!(&got.reasoning, &want.reasoning);
        prop_assert_eq!(&got.text, &want.text);
        prop_assert_eq!(&got.refusal, &want.refusal);
        let mut got_args: Vec<&String> = got.calls.values().map(|c| &c.2).collect();
        let mut want_args: Vec<&String> = want.calls.values().map(|c| &c.2).collect();
        got_args.sort();
        want_args.sort();
        prop_assert_eq!(got_args, want_args);
        prop_assert_eq!(r["usage"].is_null(), want.usage.is_none());
    }
}

// ---------------------------------------------------------------------------------------------
// Bounds and the end of the stream
// ---------------------------------------------------------------------------------------------

/// A vLLM-style content chunk.
fn content_frame(text: &str) -> String {
    let chunk = json!({
        "id": "chatcmpl-x", "object": "chat.completion.chunk", "created": NOW, "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": null}],
    });
    format!("data: {chunk}\n\n")
}

#[test]
fn an_event_larger_than_the_frame_cap_fails_without_holding_more_than_the_cap() {
    const CAP: usize = 512;
    let options = || Options {
        max_sse_frame_bytes: CAP,
        ..Options::default()
    };
    let first = content_frame("Hi");
    let huge = content_frame(&"x".repeat(10 * CAP));

    let mut t = translator(options());
    let mut out = t.push(first.as_bytes(), END).to_vec();
    // Byte by byte: the failure comes exactly when the pending event's data would exceed the
    // cap (`data: ` itself is not held), so no more than CAP bytes are ever held for it.
    let mut failed_at = None;
    for (i, b) in huge.as_bytes().iter().enumerate() {
        let b = t.push(std::slice::from_ref(b), END);
        if !b.is_empty() {
            assert!(failed_at.is_none(), "output after the failure");
            failed_at = Some(i);
            out.extend_from_slice(&b);
        }
    }
    assert_eq!(
        failed_at,
        Some("data: ".len() + CAP),
        "not failed at the cap"
    );
    assert!(t.is_done());
    assert!(t.push(huge.as_bytes(), END).is_empty());
    assert!(t.finish(END).is_empty());
    let events = check(&out);
    let got = trace(&events);
    assert_eq!(
        &got[..5],
        [
            "created",
            "in_progress",
            "+item 0 message",
            "+part 0/0 output_text",
            r#"text 0/0 "Hi""#
        ]
    );
    assert_eq!(got[got.len() - 1], "failed upstream_event_too_large");
    assert_eq!(got[got.len() - 3], "-item 0 message incomplete");

    // The same in one chunk, and with an event made of many small `data:` lines.
    let whole = translate(format!("{first}{huge}").as_bytes(), options());
    assert!(whole == out, "one chunk differs from byte-by-byte");
    let lines = format!("{first}{}", "data: 0123456789\n".repeat(CAP));
    let events = check(&translate(lines.as_bytes(), options()));
    assert_eq!(
        terminal(&events)["error"]["code"],
        "upstream_event_too_large"
    );
}

#[test]
fn an_event_right_at_the_frame_cap_is_accepted() {
    let frame = content_frame("exactly at the cap");
    let options = Options {
        // The data of the frame (what the decoder holds) is its length minus `data: ` and `\n\n`.
        max_sse_frame_bytes: frame.len() - "data: ".len() - 2,
        ..Options::default()
    };
    let body = format!("{frame}data: [DONE]\n\n");
    let events = check(&translate(body.as_bytes(), options));
    assert_eq!(terminal(&events)["status"], "completed");
}

#[test]
fn output_beyond_the_output_cap_fails_cleanly() {
    const CAP: usize = 100;
    let options = || Options {
        max_output_bytes: CAP,
        ..Options::default()
    };
    // 30 deltas of 10 bytes: the 11th would take the text past 100 bytes.
    let body: String = (0..30)
        .map(|i| content_frame(&format!("chunk {i:03} ")))
        .collect();
    let body = body + "data: [DONE]\n\n";
    let events = check(&translate(body.as_bytes(), options()));
    let r = terminal(&events);
    assert_eq!(r["status"], "failed");
    assert_eq!(r["error"]["code"], "response_too_large");
    let text = r["output"][0]["content"][0]["text"].as_str().unwrap();
    assert_eq!(text.len(), CAP, "exactly the deltas that fit are kept");
    assert_eq!(r["output"][0]["status"], "incomplete");

    // Tool-call arguments and reasoning count too.
    for fixture_name in [
        "streams/parallel-tool-calls.sse",
        "streams/reasoning-vllm.sse",
    ] {
        let options = Options {
            max_output_bytes: 12,
            ..Options::default()
        };
        let events = check(&translate(&fixture(fixture_name), options));
        let r = terminal(&events);
        assert_eq!(r["error"]["code"], "response_too_large", "{fixture_name}");
    }
}

#[test]
fn nothing_is_sent_after_the_terminal_event() {
    for name in FIXTURES {
        let body = fixture(name);
        let mut t = translator(Options::default());
        let out = t.push(&body, END);
        let rest = t.finish(END);
        assert!(t.is_done(), "{name}");
        let count = t.event_count();
        assert!(t.push(&body, END).is_empty(), "{name}: push after the end");
        assert!(t.push(b"data: [DONE]\n\n", END).is_empty());
        assert!(t.finish(END).is_empty(), "{name}: finish after the end");
        assert!(
            t.abort("timeout", "late", END).is_empty(),
            "{name}: abort after the end"
        );
        assert_eq!(t.event_count(), count);
        check(&[out, rest].concat());
    }
}

#[test]
fn input_after_done_in_the_same_chunk_is_ignored() {
    let body = fixture("streams/text.sse");
    let reference = translate(&body, Options::default());
    let oversized = format!("data: {}", "x".repeat(1000)).into_bytes();
    let tails: [&[u8]; 4] = [
        &body,
        b"data: {\"error\": {\"message\": \"late\"}}\n\n",
        b"data: not json\n\n",
        &oversized,
    ];
    for tail in tails {
        // A frame cap that the tail's last event exceeds: the decoder fails inside the same
        // push that completed the stream, which must not add a second terminal event.
        let options = || Options {
            max_sse_frame_bytes: 400,
            ..Options::default()
        };
        let mut t = translator(options());
        let out = [t.push(&[&body[..], tail].concat(), END), t.finish(END)].concat();
        let alone = translate(&body, options());
        assert!(
            out == alone,
            "tail {:?} changed the output",
            String::from_utf8_lossy(tail)
        );
        check(&out);
    }
    check(&reference);
}

#[test]
fn abort_ends_the_stream_as_failed() {
    let body = fixture("streams/text.sse");
    let mut t = translator(Options::default());
    // The role chunk and the first text delta.
    let mut out = t.push(&frames(&body)[..2].concat(), END).to_vec();
    out.extend_from_slice(&t.abort("upstream_timeout", "The upstream stopped sending.", END));
    assert!(t.push(&body, END).is_empty());
    assert!(t.finish(END).is_empty());
    let events = check(&out);
    let got = trace(&events);
    assert_eq!(
        got[got.len() - 5..],
        [
            r#"text.done 0/0 "Hello""#,
            "-part 0/0 output_text",
            "-item 0 message incomplete",
            "error upstream_timeout: The upstream stopped sending.",
            "failed upstream_timeout",
        ]
    );

    // Before any input: a complete, valid failed stream.
    let mut t = translator(Options::default());
    let events = check(&t.abort("upstream_timeout", "No answer.", END));
    assert_eq!(
        trace(&events),
        [
            "created",
            "in_progress",
            "error upstream_timeout: No answer.",
            "failed upstream_timeout"
        ]
    );
}

#[test]
fn an_empty_body_is_truncated() {
    let events = check(&translate(b"", Options::default()));
    assert_eq!(
        trace(&events).last().unwrap(),
        "failed upstream_stream_truncated"
    );
    let events = check(&translate(b": keep-alive\n\n", Options::default()));
    assert_eq!(
        trace(&events).last().unwrap(),
        "failed upstream_stream_truncated"
    );
}

// ---------------------------------------------------------------------------------------------
// Reasoning event names; incremental emission
// ---------------------------------------------------------------------------------------------

#[test]
fn openai_reasoning_events_rename_only_the_reasoning_text_events() {
    for name in [
        "streams/reasoning-llama.sse",
        "streams/reasoning-vllm.sse",
        "upstream/llama-server-reasoning.sse",
    ] {
        let body = fixture(name);
        let spec = translate(&body, Options::default());
        let openai = translate(
            &body,
            Options {
                reasoning_events: ReasoningEvents::OpenAi,
                ..Options::default()
            },
        );
        let events = check(&openai);
        let names: HashSet<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert!(names.contains("response.reasoning_text.delta"), "{name}");
        assert!(names.contains("response.reasoning_text.done"), "{name}");
        assert!(!names.contains("response.reasoning.delta"), "{name}");
        assert!(!names.contains("response.reasoning.done"), "{name}");
        // Byte for byte the Spec output with those two names changed, nothing else.
        let renamed = String::from_utf8(spec)
            .unwrap()
            .replace("response.reasoning.delta", "response.reasoning_text.delta")
            .replace("response.reasoning.done", "response.reasoning_text.done");
        assert_eq!(String::from_utf8(openai).unwrap(), renamed, "{name}");
    }
}

/// The `response.output_text.delta`s in `out`, concatenated.
fn text_so_far(out: &[u8]) -> String {
    common::sse::parse_sse_json(std::str::from_utf8(out).unwrap())
        .iter()
        .filter(|(name, _)| name == "response.output_text.delta")
        .map(|(_, v)| v["delta"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn each_delta_is_sent_as_soon_as_its_frame_is_complete() {
    let body = fixture("streams/text.sse");
    let fr = frames(&body);
    let mut t = translator(Options::default());
    let mut out = t.push(fr[0], END).to_vec();
    assert_eq!(text_so_far(&out), "");
    // The first text frame without its blank line: nothing can be sent for it yet.
    let (line, blank) = fr[1].split_at(fr[1].len() - 1);
    assert!(
        t.push(line, END).is_empty(),
        "an incomplete frame produced output"
    );
    // Its blank line completes it: the delta goes out at once.
    out.extend_from_slice(&t.push(blank, END));
    assert!(!t.is_done());
    assert_eq!(
        text_so_far(&out),
        "Hello",
        "the first delta was not sent at once"
    );
    assert!(String::from_utf8_lossy(&out).contains("event: response.output_text.delta\n"));
    let mut want = String::from("Hello");
    for (frame, delta) in fr[2..5].iter().zip([",", " wörld", "!"]) {
        out.extend_from_slice(&t.push(frame, END));
        want += delta;
        assert_eq!(text_so_far(&out), want);
    }
    // The finish_reason closed the item at once; the terminal event waits for the usage.
    let names: Vec<String> = common::sse::parse_sse_json(std::str::from_utf8(&out).unwrap())
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names.last().map(String::as_str),
        Some("response.output_item.done")
    );

    // Tool-call arguments and reasoning are just as immediate.
    for (name, event, first) in [
        (
            "streams/tool-call.sse",
            "response.function_call_arguments.delta",
            "{\"",
        ),
        (
            "streams/reasoning-llama.sse",
            "response.reasoning.delta",
            "The user",
        ),
    ] {
        let body = fixture(name);
        let mut t = translator(Options::default());
        let out = t.push(&frames(&body)[..2].concat(), END);
        let events = common::sse::parse_sse_json(std::str::from_utf8(&out).unwrap());
        let (_, last) = events.last().expect("events");
        assert_eq!(last["type"], event, "{name}");
        assert_eq!(last["delta"], first, "{name}");
    }
}

/// An LF body cut after each blank line (one upstream frame each).
fn frames(body: &[u8]) -> Vec<&[u8]> {
    let mut frames = Vec::new();
    let mut start = 0;
    for i in 1..body.len() {
        if body[i - 1] == b'\n' && body[i] == b'\n' {
            frames.push(&body[start..=i]);
            start = i + 1;
        }
    }
    if start < body.len() {
        frames.push(&body[start..]);
    }
    frames
}

// ---- custom tools (Codex's apply_patch): OpenAI's events, outside the OpenResponses schema ----

#[test]
fn a_custom_tool_call_streams_as_custom_tool_call_events_with_the_input_decoded() {
    let request = json!({"model": MODEL, "input": "edit", "stream": true,
        "tools": [{"type": "custom", "name": "apply_patch"}]});
    let t = responses_core::translate::translate_request(
        request.to_string().as_bytes(),
        &Options::default(),
        Meta {
            now: NOW,
            id_seed: SEED,
        },
    )
    .unwrap();
    let patch = "*** Begin Patch\n*** Add File: \"a.txt\"\n+hello\n*** End Patch";
    let args = json!({"input": patch}).to_string();
    // The arguments cut in three, one cut inside an escape.
    let cut = args.find("\\n").unwrap() + 1;
    let pieces = [&args[..cut], &args[cut..cut + 10], &args[cut + 10..]];
    let frame = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "c", "object": "chat.completion.chunk", "model": MODEL,
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut body = frame(
        json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
               "function": {"name": "apply_patch", "arguments": ""}}]}),
        Value::Null,
    );
    for p in pieces {
        body += &frame(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}),
            Value::Null,
        );
    }
    body += &frame(json!({}), json!("tool_calls"));
    body += "data: [DONE]\n\n";

    let mut translator = StreamTranslator::new(t.exchange);
    let mut out = translator.push(body.as_bytes(), END).to_vec();
    out.extend_from_slice(&translator.finish(END));
    let events: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .split("\n\n")
        .filter_map(|frame| frame.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.custom_tool_call_input.delta",
            "response.custom_tool_call_input.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let added = &events[2]["item"];
    assert_eq!(added["type"], "custom_tool_call");
    assert_eq!(
        (&added["call_id"], &added["name"], &added["input"]),
        (&json!("call_1"), &json!("apply_patch"), &json!(""))
    );
    let id = added["id"].as_str().unwrap();
    assert!(id.starts_with("ctc_"), "{id}");
    assert_eq!(
        (&events[3]["delta"], &events[3]["item_id"]),
        (&json!(patch), &json!(id))
    );
    assert_eq!(events[4]["input"], patch);
    let done = &events[5]["item"];
    assert_eq!(done["input"], patch);
    assert_eq!(events[6]["response"]["output"], json!([done]));
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
}

/// What `push` returns is not shared with the translator's next writes, so the ext_proc
/// adapter turns it into the protobuf body (a `Vec<u8>`) without copying it.
#[test]
fn pushed_bytes_become_a_vec_without_a_copy() {
    let mut t = translator(Options::default());
    let body = fixture("upstream/vllm-0.32-text.sse");
    for piece in body.chunks(700) {
        let out = t.push(piece, NOW);
        if out.is_empty() {
            continue;
        }
        let at = out.as_ptr();
        let vec = Vec::from(out);
        assert_eq!(vec.as_ptr(), at, "copied");
    }
}

// ---- Issue 18: built-in tools, compaction_trigger, phase ----

/// The translator for `request` (a `/v1/responses` body), with reasoning keys.
fn translator_for(request: Value) -> StreamTranslator {
    let options = Options {
        keyring: Some(std::sync::Arc::new(
            responses_core::translate::seal::Keyring::single("k1", [5; 32]).unwrap(),
        )),
        ..Options::default()
    };
    let t = responses_core::translate::translate_request(
        request.to_string().as_bytes(),
        &options,
        Meta {
            now: NOW,
            id_seed: SEED,
        },
    )
    .unwrap();
    StreamTranslator::new(t.exchange)
}

/// A Chat chunk of `choices[0]` (`delta`, `finish_reason`) as one SSE frame.
fn chunk_frame(delta: Value, finish: Value) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "model": MODEL,
               "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    )
}

/// All events of `body` through `t` (whole, then finish), in order.
fn events_of(mut t: StreamTranslator, body: &str) -> Vec<Value> {
    let mut out = t.push(body.as_bytes(), END).to_vec();
    out.extend_from_slice(&t.finish(END));
    let events: Vec<Value> = String::from_utf8(out)
        .unwrap()
        .split("\n\n")
        .filter_map(|frame| frame.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    events
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

#[test]
fn messages_say_their_phase_when_they_end() {
    let events = check(&translate(
        &fixture("streams/text-then-tool-call.sse"),
        Options::default(),
    ));
    let done: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .collect();
    assert_eq!(done[0]["item"]["type"], "message");
    assert_eq!(done[0]["item"]["phase"], "commentary");
    let events = check(&translate(&fixture("streams/text.sse"), Options::default()));
    assert_eq!(terminal(&events)["output"][0]["phase"], "final_answer");
}

#[test]
fn builtin_tool_calls_stream_as_their_call_items_and_events() {
    let t = translator_for(json!({"model": MODEL, "input": "go", "stream": true,
        "tools": [{"type": "shell"}, {"type": "apply_patch"}, {"type": "local_shell"},
                  {"type": "function", "name": "f"}]}));
    let shell = json!({"commands": ["ls", "cat a.txt"]}).to_string();
    let patch = json!({"type": "create_file", "path": "a.txt", "diff": "+hi"}).to_string();
    let call = |i: u32, id: Option<&str>, name: Option<&str>, args: &str| {
        let mut tc = json!({"index": i, "function": {"arguments": args}});
        if let Some(id) = id {
            tc["id"] = json!(id);
            tc["type"] = json!("function");
        }
        if let Some(n) = name {
            tc["function"]["name"] = json!(n);
        }
        chunk_frame(json!({"tool_calls": [tc]}), Value::Null)
    };
    // Interleaved: the shell call's arguments in two pieces around a function call.
    let mut body = chunk_frame(json!({"content": "On it."}), Value::Null);
    body += &call(0, Some("c_sh"), Some("shell"), &shell[..10]);
    body += &call(1, Some("c_f"), Some("f"), "{}");
    body += &call(0, None, None, &shell[10..]);
    body += &call(2, Some("c_ap"), Some("apply_patch"), &patch);
    body += &call(
        3,
        Some("c_ls"),
        Some("local_shell"),
        "{\"command\":\"pwd\"}",
    );
    body += &chunk_frame(json!({}), json!("tool_calls"));
    body += "data: [DONE]\n\n";
    let events = events_of(t, &body);
    assert_eq!(
        types(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added", // 0 message
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added", // 1 function f, announced by its name
            "response.function_call_arguments.delta",
            // 2 shell, whole once its arguments are (the calls close in upstream order)
            "response.output_item.added",
            "response.shell_call_command.added",
            "response.shell_call_command.delta",
            "response.shell_call_command.done",
            "response.shell_call_command.added",
            "response.shell_call_command.delta",
            "response.shell_call_command.done",
            "response.output_item.done",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.output_item.added", // 3 apply_patch
            "response.output_item.done",
            "response.output_item.added", // 4 local_shell
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert_eq!(events[7]["item"]["phase"], "commentary");
    let shell_added = &events[10]["item"];
    assert_eq!(shell_added["type"], "shell_call");
    assert_eq!(shell_added["status"], "in_progress");
    assert_eq!(shell_added["call_id"], "c_sh");
    assert_eq!(
        shell_added["action"]["commands"],
        json!(["ls", "cat a.txt"])
    );
    assert_eq!(
        (
            &events[14]["command_index"],
            &events[15]["delta"],
            &events[16]["command"]
        ),
        (&json!(1), &json!("cat a.txt"), &json!("cat a.txt"))
    );
    assert_eq!(events[11]["command"], "");
    assert_eq!(events[11]["output_index"], 2);
    assert_eq!(events[17]["item"]["status"], "completed");
    assert_eq!(events[19]["item"]["type"], "function_call");
    assert_eq!(events[20]["item"]["status"], "in_progress");
    assert_eq!(
        events[21]["item"],
        json!({"type": "apply_patch_call", "id": events[21]["item"]["id"], "call_id": "c_ap",
               "operation": {"type": "create_file", "path": "a.txt", "diff": "+hi"},
               "status": "completed"})
    );
    assert_eq!(
        events[23]["item"]["action"],
        json!({"type": "exec", "command": ["pwd"], "env": {}, "timeout_ms": null,
               "user": null, "working_directory": null})
    );
    // The terminal output is the done items, in output_index order.
    let mut done: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .collect();
    done.sort_by_key(|e| e["output_index"].as_u64());
    let done: Vec<&Value> = done.iter().map(|e| &e["item"]).collect();
    assert_eq!(events.last().unwrap()["response"]["output"], json!(done));
    for (n, e) in events
        .iter()
        .filter(|e| e["type"] == "response.output_item.added")
        .enumerate()
    {
        assert_eq!(e["output_index"], n);
    }
}

#[test]
fn a_builtin_call_whose_arguments_do_not_fit_streams_as_a_function_call() {
    let t = translator_for(json!({"model": MODEL, "input": "go", "stream": true,
        "tools": [{"type": "apply_patch"}]}));
    let mut body = chunk_frame(
        json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
               "function": {"name": "apply_patch", "arguments": "{\"path\": 3}"}}]}),
        Value::Null,
    );
    body += &chunk_frame(json!({}), json!("tool_calls"));
    body += "data: [DONE]\n\n";
    let events = events_of(t, &body);
    assert_eq!(
        types(&events)[2..],
        [
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    assert_eq!(events[2]["item"]["arguments"], "");
    assert_eq!(events[5]["item"]["name"], "apply_patch");
    assert_eq!(events[5]["item"]["arguments"], "{\"path\": 3}");
}

#[test]
fn a_compaction_trigger_streams_one_sealed_compaction_item() {
    let request = json!({"model": MODEL, "stream": true, "input": [
        {"role": "user", "content": "I am Ada"}, {"type": "compaction_trigger"}]});
    let mut body = chunk_frame(json!({"reasoning_content": "summarise"}), Value::Null);
    body += &chunk_frame(json!({"content": "The user "}), Value::Null);
    body += &chunk_frame(json!({"content": "is Ada."}), json!("stop"));
    body += "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":4,\"total_tokens\":11}}\n\n";
    body += "data: [DONE]\n\n";
    let events = events_of(translator_for(request.clone()), &body);
    assert_eq!(
        types(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.output_item.done",
            "response.completed"
        ]
    );
    let item = &events[3]["item"];
    assert_eq!(item["type"], "compaction");
    assert_eq!(events[2]["item"], *item);
    let r = &events[4]["response"];
    assert_eq!(r["output"], json!([item]));
    assert_eq!(r["usage"]["output_tokens"], 4);
    // The sealed summary is the upstream's text.
    let keyring = responses_core::translate::seal::Keyring::single("k1", [5; 32]).unwrap();
    assert_eq!(
        keyring
            .open_for(
                responses_core::translate::seal::Purpose::Compaction,
                item["encrypted_content"].as_str().unwrap()
            )
            .unwrap(),
        "The user is Ada."
    );
    // No text: the stream fails, nothing is sealed.
    let body = chunk_frame(json!({"content": ""}), json!("stop")) + "data: [DONE]\n\n";
    let events = events_of(translator_for(request), &body);
    assert_eq!(
        types(&events)[2..],
        ["error", "response.failed"],
        "{events:?}"
    );
    assert_eq!(
        events[3]["response"]["error"]["code"],
        "upstream_invalid_response"
    );
}
