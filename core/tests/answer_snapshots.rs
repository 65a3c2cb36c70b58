//! What the client gets for every recorded Chat answer and for the edge cases of the Chat
//! side's parsing, pinned in `core/tests/snapshots/answers/`: a change to how chunks and
//! completions are parsed must not change one byte of what is accepted, refused or emitted.
//!
//! Each answer goes through the core's exchange, as the adapters drive it, after one of these
//! requests:
//! - `stream`: `{"model":"m","input":"hi","stream":true}`;
//! - `codex`: a real Codex CLI turn (benches/fixtures/codex_turn.json: tools, sealed reasoning);
//! - `fold`: the same without `stream`, so a stream is folded into one JSON answer;
//! - `logprobs`: `stream` asking for logprobs (the edge frames);
//!
//! and a stream is fed whole, one frame at a time, in 7-byte pieces and (below 20 KB) one byte
//! at a time: all four give the same bytes.
//! `UPDATE_SNAPSHOTS=1 cargo test -p responses-core --test main answer_snapshots` writes what
//! the code gives; review it with `git diff`.

use crate::common;

use std::path::Path;
use std::sync::Arc;

use responses_core::exchange::{
    BodyStep, Exchange, HeadStep, Operation, RequestStep, ResponseHead, Settings,
};
use responses_core::settings::ExchangeConfig;
use responses_core::translate::Meta;

const META: Meta = Meta {
    now: 1_700_000_000,
    id_seed: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
};
/// The clock of the answer: becomes `completed_at`.
const END: u64 = 1_700_000_042;

const STREAM: &[u8] = br#"{"model":"m","input":"hi","stream":true}"#;
const FOLD: &[u8] = br#"{"model":"m","input":"hi"}"#;
const LOGPROBS: &[u8] = br#"{"model":"m","input":"hi","stream":true,"top_logprobs":2,"include":["message.output_text.logprobs"]}"#;

fn settings() -> Arc<Settings> {
    let config = ExchangeConfig::default();
    let (keyring, _) = config
        .keyring(|_| unreachable!("no key file"), || [7; 32])
        .unwrap();
    Arc::new(config.exchange_settings(Some(keyring)))
}

/// The client's answer to `request` when the upstream answers `status`, `content_type` and
/// `body` in `pieces`: the status line, then the body.
fn answer<'a>(
    request: &[u8],
    status: u16,
    content_type: &str,
    pieces: impl IntoIterator<Item = &'a [u8]>,
) -> String {
    let mut ex = Exchange::new(settings(), Operation::Create);
    ex.request_head(|_| None);
    match ex.request_body(request, true, META) {
        RequestStep::Forward(_) => {}
        other => panic!("the request was not forwarded: {other:?}"),
    }
    let head = ResponseHead {
        status,
        content_type,
        end_of_stream: false,
    };
    let mut out = Vec::new();
    let mut status = match ex.response_head(head, META.now) {
        HeadStep::Stream => 200,
        HeadStep::Gather => 0,
        HeadStep::Reply(r) => {
            return format!("{} {}", r.status(), String::from_utf8_lossy(r.body()))
        }
    };
    let mut pieces = pieces.into_iter().peekable();
    while let Some(piece) = pieces.next() {
        let last = pieces.peek().is_none();
        match ex.response_body(piece, last, END) {
            BodyStep::Send(b) => out.extend_from_slice(&b),
            BodyStep::Hold => {}
            BodyStep::Reply(r) => {
                status = r.status();
                out.extend_from_slice(r.body());
            }
        }
    }
    assert!(ex.is_finished(), "the exchange did not end");
    format!("{status} {}", String::from_utf8(out).expect("UTF-8 out"))
}

/// `body` cut after each blank line, and an empty last piece (a host may hand one over).
fn frames(body: &[u8]) -> Vec<&[u8]> {
    let mut pieces = responses_core::sse::split_frames(body);
    pieces.push(&[]);
    pieces
}

/// The streamed answer to `request`, the same whatever the chunking.
fn streamed(request: &[u8], body: &[u8]) -> String {
    let whole = answer(request, 200, "text/event-stream", [body]);
    let mut chunkings = vec![frames(body), body.chunks(7).collect()];
    if body.len() < 20_000 {
        chunkings.push(body.chunks(1).collect());
    }
    for pieces in chunkings {
        let n = pieces.len();
        assert_eq!(
            answer(request, 200, "text/event-stream", pieces),
            whole,
            "in {n} pieces"
        );
    }
    whole
}

/// Compares `text` with `core/tests/snapshots/answers/<name>.txt`, byte for byte (beside the JSON
/// cases of core/tests/snapshots.rs, which compare values; these compare bytes).
fn pinned(name: &str, text: String) {
    common::snapshot::pinned_text(&format!("core/tests/snapshots/answers/{name}.txt"), &text);
}

fn stream_fixtures() -> Vec<std::path::PathBuf> {
    let root = common::repo_root();
    let mut files = Vec::new();
    for dir in [
        "tests/fixtures/streams",
        "tests/fixtures/upstream",
        "benches/fixtures",
    ] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "sse") {
                files.push(path);
            }
        }
    }
    files.sort();
    assert!(files.len() >= 25, "fixtures not found: {files:?}");
    files
}

fn snapshot_name(path: &Path) -> String {
    let dir = path
        .parent()
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy();
    let stem = path.file_stem().unwrap().to_string_lossy();
    format!("{dir}__{stem}")
}

#[test]
fn every_recorded_stream() {
    let codex =
        std::fs::read(common::repo_root().join("benches/fixtures/codex_turn.json")).unwrap();
    for path in stream_fixtures() {
        let body = std::fs::read(&path).unwrap();
        let stream = streamed(STREAM, &body);
        let with_tools = streamed(&codex, &body);
        for out in [&stream, &with_tools] {
            assert!(out.ends_with("data: [DONE]\n\n"), "{}", path.display());
        }
        let folded = answer(FOLD, 200, "text/event-stream", [&body[..]]);
        pinned(
            &snapshot_name(&path),
            format!("## stream\n{stream}\n## codex\n{with_tools}\n## fold\n{folded}\n"),
        );
    }
}

/// One frame at a time, each as a whole stream (the frame, then `[DONE]`): the types, nulls,
/// escapes, duplicates, numbers and error shapes the chunk parser meets.
const EDGE_FRAMES: &[&str] = &[
    // Text with escapes (the text is owned, not borrowed), and raw non-ASCII.
    r#"{"choices":[{"index":0,"delta":{"content":"a\u00e9\"\\\n\t\ud83d\ude00 é😀"}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"content":"\ud800"}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"content":"\x"}}]}"#,
    // Nulls where lists and objects are expected.
    r#"{"choices":null}"#,
    r#"{"choices":[{"index":0,"delta":null,"finish_reason":"stop"}]}"#,
    r#"{"choices":[{"index":0,"delta":{"content":"x","tool_calls":null,"refusal":null}}]}"#,
    r#"{"model":null,"usage":null,"error":null,"choices":[{"index":0,"logprobs":null,"delta":{"content":"x"}}]}"#,
    // Wrong types.
    r#"{"choices":{}}"#,
    r#"{"choices":[1]}"#,
    r#"{"choices":"x"}"#,
    r#"{"choices":[{"index":-1,"delta":{"content":"x"}}]}"#,
    r#"{"choices":[{"index":1.0,"delta":{"content":"x"}}]}"#,
    r#"{"choices":[{"index":4294967296,"delta":{"content":"x"}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"content":5}}]}"#,
    r#"{"choices":[{"index":0,"delta":[]}]}"#,
    r#"{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":5}]}"#,
    r#"{"model":5,"choices":[]}"#,
    r#"{"choices":[{"index":0,"delta":{"tool_calls":{}}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":"f"}]}}]}"#,
    // Fields missing.
    r#"{}"#,
    r#"{"choices":[{}]}"#,
    r#"{"choices":[{"delta":{"content":"no index"}}]}"#,
    // Duplicate keys: known ones are refused, unknown ones pass.
    r#"{"choices":[{"index":0,"delta":{"content":"a","content":"b"}}]}"#,
    r#"{"choices":[],"choices":[{"index":0,"delta":{"content":"x"}}]}"#,
    r#"{"id":"a","id":"b","choices":[{"index":0,"delta":{"content":"x"}}]}"#,
    // Unknown fields of every shape, and whitespace.
    r#"{"x":{"y":[1,{"z":null}],"w":-1.5e3},"choices":[{"index":0,"token_ids":[1,2],"delta":{"role":"assistant","content":"x","extra":{}}}],"system_fingerprint":"f"}"#,
    " \t{ \"choices\" : [ { \"index\" : 0 , \"delta\" : { \"content\" : \"x\" } } ] } \t",
    // Not one JSON object.
    r#"[]"#,
    r#""x""#,
    r#"null"#,
    r#"{"choices":[]} x"#,
    r#"{"choices":[]"#,
    // Several choices: only index 0 is the answer, in order.
    r#"{"choices":[{"index":1,"delta":{"content":"other"}},{"index":0,"delta":{"content":"mine"}},{"index":0,"delta":{"content":" again"}}]}"#,
    // Reasoning under both names, refusal, finish reasons.
    r#"{"choices":[{"index":0,"delta":{"reasoning":"r1","reasoning_content":""}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"reasoning_content":"r2","reasoning":"ignored"}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"refusal":"no"},"finish_reason":"content_filter"}]}"#,
    r#"{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":"length"}]}"#,
    r#"{"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":""}]}"#,
    // Tool calls: several in one delta, no name yet, null function, escapes in arguments.
    r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":"}},{"index":1,"id":"c2","function":{"name":"g","arguments":"{\"s\":\"\\u00e9\"}"}}]},"finish_reason":"tool_calls"}]}"#,
    r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":3,"function":{"arguments":"{}"}}]}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","function":null}]}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"c","function":{"name":"h"}}]}}]}"#,
    // Usage, in range or not.
    r#"{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3,"prompt_tokens_details":{"cached_tokens":1},"completion_tokens_details":{"reasoning_tokens":null}}}"#,
    r#"{"choices":[],"usage":{"prompt_tokens":1}}"#,
    r#"{"choices":[],"usage":{"prompt_tokens":-1,"completion_tokens":2}}"#,
    r#"{"choices":[],"usage":{"prompt_tokens":1.0,"completion_tokens":2}}"#,
    r#"{"choices":[],"usage":{"prompt_tokens":"1"}}"#,
    r#"{"choices":[],"usage":{"prompt_tokens":18446744073709551616}}"#,
    // Logprobs (kept by the `logprobs` request).
    r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.1,"bytes":[72,105],"top_logprobs":[{"token":"Hi","logprob":-0.1},{"token":"H\u00e9","logprob":-2.5,"bytes":null}]}]}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.1,"top_logprobs":null}]}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":null}}]}"#,
    r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":"x"}]}}]}"#,
    // Error frames in the shapes upstreams send, and values JSON numbers cannot hold.
    r#"{"error":{"message":"boom","type":"server_error","code":"overloaded"}}"#,
    r#"{"error":{"message":"m","code":503,"param":"p"}}"#,
    r#"{"error":"text"}"#,
    r#"{"error":[1,2]}"#,
    r#"{"error":{"message":1e400}}"#,
    r#"{"error":{},"choices":[{"index":0,"delta":{"content":"x"}}]}"#,
];

/// Nesting past serde_json's depth limit, in an unknown field and in an error.
fn deep(key: &str, depth: usize) -> String {
    format!(
        r#"{{"{key}":{}{},"choices":[]}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    )
}

#[test]
fn edge_frames() {
    let mut frames: Vec<String> = EDGE_FRAMES.iter().map(|f| f.to_string()).collect();
    for depth in [126, 127, 128] {
        frames.push(deep("x", depth));
        frames.push(deep("error", depth));
    }
    let mut all = String::new();
    for frame in &frames {
        let body = format!("data: {frame}\n\ndata: [DONE]\n\n");
        let out = streamed(LOGPROBS, body.as_bytes());
        let shown = if frame.len() > 200 {
            format!("{}... ({} bytes)", &frame[..60], frame.len())
        } else {
            frame.clone()
        };
        all.push_str(&format!("### {shown}\n{out}\n"));
    }
    pinned("edge_frames", all);
}

/// JSON answers (a request without `stream`), in the shapes and edge cases upstreams send.
const JSON_ANSWERS: &[&str] = &[
    r#"{"id":"c","object":"chat.completion","created":1,"model":"up","choices":[{"index":0,"message":{"role":"assistant","content":"Hi there"},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2,"total_tokens":7,"prompt_tokens_details":{"cached_tokens":3}}}"#,
    r#"{"choices":[{"index":0,"finish_reason":"tool_calls","message":{"reasoning":"think","content":null,"tool_calls":[{"id":"call_a","type":"function","function":{"name":"f","arguments":"{\"x\":1}"}},{"id":"call_b","type":"function","function":{"name":"g","arguments":"{}"}}]}}]}"#,
    r#"{"choices":[{"index":0,"finish_reason":"stop","message":{"reasoning_content":"t\u00e9","content":"a\nb"}}]}"#,
    r#"{"choices":[{"index":0,"finish_reason":"length","message":{"content":"abc"}}]}"#,
    r#"{"choices":[{"index":0,"finish_reason":"content_filter","message":{"content":"abc"}}]}"#,
    r#"{"choices":[{"index":0,"finish_reason":"stop","message":{"content":null,"refusal":"no"}}]}"#,
    r#"{"choices":[{"index":0,"finish_reason":"stop","message":{"content":""}}]}"#,
    r#"{"choices":[{"index":0,"finish_reason":"stop","message":null}]}"#,
    r#"{"choices":[{"index":1,"message":{"content":"other"}},{"index":0,"message":{"content":"mine"}}]}"#,
    r#"{"choices":[{"index":0,"message":{"content":"x","tool_calls":null}}],"usage":null}"#,
    r#"{"choices":[{"index":0,"message":{"tool_calls":[{"function":{"name":"f"}},{"id":"","function":null}]}}]}"#,
    r#"{"choices":[{"index":0,"message":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.1,"top_logprobs":[]}]}}]}"#,
    // Refused: not a completion, wrong types, duplicates, trailing bytes.
    r#"not json"#,
    r#"{}"#,
    r#"{"choices":[]}"#,
    r#"[1]"#,
    r#"{"choices":[{"index":1,"message":{"content":"x"}}]}"#,
    r#"{"choices":[{"index":0,"message":{"content":1}}]}"#,
    r#"{"choices":[{"index":0,"message":{"content":"a","content":"b"}}]}"#,
    r#"{"choices":[{"index":0,"message":{"content":"x"}}]} x"#,
    r#"{"choices":[{"index":0,"message":{"content":"\ud800"}}]}"#,
    r#"{"choices":[{"index":0,"message":{"content":"x"}}],"usage":{"prompt_tokens":-1}}"#,
    r#"{"model":1,"choices":[{"index":0,"message":{"content":"x"}}]}"#,
];

#[test]
fn json_answers() {
    let bench = std::fs::read(common::repo_root().join("benches/fixtures/chat.json")).unwrap();
    let mut bodies: Vec<&[u8]> = JSON_ANSWERS.iter().map(|b| b.as_bytes()).collect();
    bodies.push(&bench);
    let mut all = String::new();
    for body in bodies {
        let whole = answer(FOLD, 200, "application/json", [body]);
        let pieces = answer(FOLD, 200, "application/json", body.chunks(5));
        assert_eq!(pieces, whole);
        all.push_str(&format!("### {}\n{whole}\n", String::from_utf8_lossy(body)));
    }
    pinned("json_answers", all);
}
