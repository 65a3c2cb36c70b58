//! Proves the SSE stream translator (`translate::stream::StreamTranslator`) against recorded
//! and handwritten upstream bodies (`tests/fixtures/streams/`, `tests/fixtures/upstream/`) by
//! its properties; the exact events of each scenario are snapshots in
//! `core/tests/snapshots/stream/` (run by `core/tests/snapshots.rs`):
//!
//! * the real captures say what their upstream frames say (an independent oracle);
//! * every output obeys the stream rules ([`check`]): framing, schema, sequence numbers,
//!   per-item event order, one terminal event whose `output` equals the `output_item.done`
//!   items, `error` followed by `response.failed`, deltas adding up to their `.done`;
//! * output bytes do not depend on how the upstream body is split into chunks (proptest);
//! * frame and output caps end the stream cleanly, and nothing follows the terminal event.

use crate::common;

use std::collections::{BTreeMap, HashSet};

use common::stream_rules::{self, text_event};
use proptest::prelude::*;
use responses_core::openresponses::ErrorCode;
use responses_core::translate::stream::{StreamTranslator, CALL_SLOT_BYTES};
use responses_core::translate::{Meta, Options, ReasoningEvents, ResponsePlan};
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
    StreamTranslator::new(ResponsePlan::new(MODEL, true, meta, options))
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

/// Parses the output and checks every stream rule (`common::stream_rules`).
#[track_caller]
fn check(out: &[u8]) -> Vec<Value> {
    let expected = stream_rules::Expected {
        model: MODEL,
        created_at: NOW,
        completed_at: END,
    };
    stream_rules::check(out, &expected)
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

/// A frame of tool call deltas.
fn calls_frame(calls: Value) -> String {
    delta(json!({ "tool_calls": calls }))
}

/// The end of a tool-call answer.
fn tool_calls_end() -> String {
    chunk(json!([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}])) + "data: [DONE]\n\n"
}

#[test]
fn calls_opened_with_nothing_count_toward_the_output_cap() {
    // 100k calls, each opened by a delta of its own with no name, id or arguments, against a
    // cap of 1 MiB (the default, 16 MiB, takes 65,536 of them): the stream fails when the
    // next call would take the output beyond the cap. The calls opened so far are closed
    // as incomplete, as any open call is, and what they add stays within the cap.
    const CAP: usize = 1 << 20;
    let mut body = delta(json!({"role": "assistant", "content": ""}));
    for i in 0..100_000 {
        body += &calls_frame(json!([{"index": i, "function": {"arguments": ""}}]));
    }
    body += &tool_calls_end();
    let options = Options {
        max_output_bytes: CAP,
        ..Options::default()
    };
    let events = check(&translate(body.as_bytes(), options));
    let r = terminal(&events);
    assert_eq!(r["status"], "failed");
    assert_eq!(r["error"]["code"], ErrorCode::ResponseTooLarge.as_str());
    let items = r["output"].as_array().unwrap();
    assert_eq!(items.len(), CAP / CALL_SLOT_BYTES);
    assert!(items.iter().all(|i| i["type"] == "function_call"
        && i["arguments"] == ""
        && i["status"] == "incomplete"));
    let size: usize = items.iter().map(|i| i.to_string().len()).sum();
    assert!(size <= CAP, "the failed response's items take {size} bytes");

    // Exactly at the cap: N calls fit in N slots, the next one fails.
    let calls = |n: u32| {
        let mut body = String::new();
        for i in 0..n {
            body += &calls_frame(json!([{"index": i}]));
        }
        body + &tool_calls_end()
    };
    let options = || Options {
        max_output_bytes: 10 * CALL_SLOT_BYTES,
        ..Options::default()
    };
    let events = check(&translate(calls(10).as_bytes(), options()));
    let r = terminal(&events);
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["output"].as_array().unwrap().len(), 10);
    let events = check(&translate(calls(11).as_bytes(), options()));
    assert_eq!(terminal(&events)["error"]["code"], "response_too_large");
    // A repeated index is the same call: no new slot.
    let mut body = String::new();
    for _ in 0..100 {
        body += &calls_frame(json!([{"index": 3, "function": {"arguments": "1"}}]));
    }
    body += &tool_calls_end();
    let options = Options {
        max_output_bytes: CALL_SLOT_BYTES + 100,
        ..Options::default()
    };
    let events = check(&translate(body.as_bytes(), options));
    assert_eq!(terminal(&events)["status"], "completed");
}

#[test]
fn a_calls_name_and_id_count_toward_the_output_cap() {
    let options = || Options {
        max_output_bytes: CALL_SLOT_BYTES + 10,
        ..Options::default()
    };
    let call = |id: &str, name: &str| {
        calls_frame(json!([{"index": 0, "id": id, "type": "function",
            "function": {"name": name, "arguments": ""}}]))
            + &tool_calls_end()
    };
    for (id, name, status) in [
        ("", "abcdefghij", "completed"),
        ("", "abcdefghijk", "failed"),
        ("call_12345", "", "completed"),
        ("call_123456", "", "failed"),
        ("call_", "abcde", "completed"),
        ("call_", "abcdef", "failed"),
    ] {
        let events = check(&translate(call(id, name).as_bytes(), options()));
        assert_eq!(terminal(&events)["status"], status, "{id:?} {name:?}");
    }
    // Given once, counted once: the name and id repeated on each delta of an announced call.
    let mut body = String::new();
    for _ in 0..50 {
        body += &calls_frame(json!([{"index": 0, "id": "call_", "type": "function",
            "function": {"name": "abcde", "arguments": ""}}]));
    }
    body += &tool_calls_end();
    let events = check(&translate(body.as_bytes(), options()));
    let r = terminal(&events);
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["output"][0]["name"], "abcde");
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
            t.abort(ErrorCode::UpstreamTimeout, "late", END).is_empty(),
            "{name}: abort after the end"
        );
        assert_eq!(t.event_count(), count);
        check(&out.concat(rest));
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
        let out = t
            .push(&[&body[..], tail].concat(), END)
            .concat(t.finish(END));
        let alone = translate(&body, options());
        assert!(
            out[..] == alone[..],
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
    out.extend_from_slice(&t.abort(
        ErrorCode::UpstreamTimeout,
        "The upstream stopped sending.",
        END,
    ));
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
    let events = check(&t.abort(ErrorCode::UpstreamTimeout, "No answer.", END));
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
    responses_core::sse::split_frames(body)
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
        let vec = Vec::from(out.into_bytes());
        assert_eq!(vec.as_ptr(), at, "copied");
    }
}

/// A `compaction_trigger`'s one item seals the upstream's summary: it opens, under the
/// operator's key, to exactly the text the upstream streamed.
#[test]
fn a_streamed_compaction_seals_the_upstreams_text() {
    use responses_core::translate::seal::{Keyring, Purpose};
    let keyring = Keyring::single("k1", [5; 32]).unwrap();
    let options = Options {
        keyring: Some(std::sync::Arc::new(keyring.clone())),
        ..Options::default()
    };
    let request = json!({"model": MODEL, "stream": true, "input": [
        {"role": "user", "content": "I am Ada"}, {"type": "compaction_trigger"}]});
    let meta = Meta {
        now: NOW,
        id_seed: SEED,
    };
    let t = responses_core::translate::translate_request(
        request.to_string().as_bytes(),
        &options,
        meta,
    )
    .unwrap();
    let body = [
        json!({"reasoning_content": "summarise"}),
        json!({"content": "The user "}),
        json!({"content": "is Ada."}),
    ]
    .iter()
    .map(|delta| {
        format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": delta}]})
        )
    })
    .collect::<String>()
        + "data: [DONE]\n\n";
    let mut translator = StreamTranslator::new(t.plan);
    let mut out = translator.push(body.as_bytes(), END).to_vec();
    out.extend_from_slice(&translator.finish(END));
    let events = stream_rules::events(&out);
    let item = &events[events.len() - 1]["response"]["output"][0];
    assert_eq!(item["type"], "compaction");
    let sealed = item["encrypted_content"].as_str().unwrap();
    assert!(!sealed.contains("Ada"));
    assert_eq!(
        keyring.open_for(Purpose::Compaction, sealed).unwrap(),
        "The user is Ada."
    );
}

/// While a `compaction_trigger`'s summary is sampled, `response.compaction.compacting` reports
/// it (OpenAI's progress event): right after the item opens with the first sampled delta
/// (reasoning counts), then at most once every 30 s of the clock, only when more was sampled;
/// the item is added empty and done with its sealed summary. An upstream failing after the item
/// opened ends the stream with no item in the failed response.
#[test]
fn a_streamed_compaction_reports_its_progress_at_most_every_30_seconds() {
    use responses_core::translate::stream::COMPACTING_EVERY;
    let options = Options {
        keyring: Some(std::sync::Arc::new(
            responses_core::translate::seal::Keyring::single("k1", [5; 32]).unwrap(),
        )),
        ..Options::default()
    };
    let request = json!({"model": MODEL, "stream": true, "input": [
        {"role": "user", "content": "I am Ada"}, {"type": "compaction_trigger"}]});
    let plan = || {
        responses_core::translate::translate_request(
            request.to_string().as_bytes(),
            &options,
            Meta {
                now: NOW,
                id_seed: SEED,
            },
        )
        .unwrap()
        .plan
    };
    let frame = |delta: Value| {
        format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": delta}]})
        )
    };
    // The events of part of a stream (no `[DONE]` yet).
    let events_of = |bytes: &[u8]| -> Vec<Value> {
        common::sse::parse_sse_json(std::str::from_utf8(bytes).unwrap())
            .into_iter()
            .map(|(_, e)| e)
            .collect()
    };
    let types = |bytes: &[u8]| -> Vec<String> {
        events_of(bytes)
            .iter()
            .map(|e| e["type"].as_str().unwrap().to_owned())
            .collect()
    };
    let mut t = StreamTranslator::new(plan());
    // Nothing sampled yet: no item.
    let out = t.push(frame(json!({"role": "assistant"})).as_bytes(), NOW);
    assert_eq!(types(&out), ["response.created", "response.in_progress"]);
    // The first reasoning opens the item, empty, and reports progress.
    let out = t.push(frame(json!({"reasoning_content": "hmm"})).as_bytes(), NOW);
    let events = events_of(&out);
    assert_eq!(
        types(&out),
        [
            "response.output_item.added",
            "response.compaction.compacting"
        ]
    );
    let item_id = events[0]["item"]["id"].as_str().unwrap().to_owned();
    assert_eq!(
        events[0]["item"],
        json!({"type": "compaction", "id": item_id, "encrypted_content": ""})
    );
    assert_eq!(
        events[1],
        json!({"type": "response.compaction.compacting", "item_id": item_id, "output_index": 0,
               "sequence_number": 3})
    );
    // More within 30 s: nothing; at 30 s: one event; a frame with nothing sampled: nothing.
    let text = |s: &str| frame(json!({"content": s}));
    assert!(t
        .push(text("The user ").as_bytes(), NOW + COMPACTING_EVERY - 1)
        .is_empty());
    assert_eq!(
        types(&t.push(text("is ").as_bytes(), NOW + COMPACTING_EVERY)),
        ["response.compaction.compacting"]
    );
    assert!(t
        .push(frame(json!({})).as_bytes(), NOW + 3 * COMPACTING_EVERY)
        .is_empty());
    assert!(t
        .push(text("Ada").as_bytes(), NOW + 2 * COMPACTING_EVERY - 1)
        .is_empty());
    assert_eq!(
        types(&t.push(text(".").as_bytes(), NOW + 2 * COMPACTING_EVERY)),
        ["response.compaction.compacting"]
    );
    let out = t.push(b"data: [DONE]\n\n", END);
    let events = events_of(&out);
    assert_eq!(
        types(&out),
        ["response.output_item.done", "response.completed"]
    );
    let done = &events[0]["item"];
    assert_eq!(
        (&done["id"], done["type"].as_str()),
        (&json!(item_id), Some("compaction"))
    );
    assert!(!done["encrypted_content"].as_str().unwrap().is_empty());
    assert_eq!(events[1]["response"]["output"], json!([done]));

    // Failing after the item opened: no item in the failed response.
    let mut t = StreamTranslator::new(plan());
    let mut out = t.push(text("The user").as_bytes(), NOW).to_vec();
    out.extend_from_slice(&t.push(b"data: {\"error\":{\"message\":\"boom\"}}\n\n", NOW));
    let events = stream_rules::events(&out);
    assert_eq!(
        types(&out),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.compaction.compacting",
            "error",
            "response.failed"
        ]
    );
    assert_eq!(events[5]["response"]["output"], json!([]));
}
