//! Throughput of the translation core (no gRPC, no Envoy): Chat SSE → Responses events,
//! request translation and JSON response translation.
//!
//! Run: `cargo bench --bench stream` (about 1.5 minutes). Results: `docs/performance.md`.
//!
//! Stream benchmarks translate a whole upstream body per iteration; the reported time is
//! per body, the throughput is upstream bytes per second. Divide the time by the number
//! of upstream chunks printed at start-up for the cost per chunk.

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{
    criterion_group, criterion_main, BenchmarkGroup, BenchmarkId, Criterion, SamplingMode,
    Throughput,
};
use responses_core::translate::response::completion;
use responses_core::translate::stream::StreamTranslator;
use responses_core::translate::{translate_request, Meta, Options, ResponsePlan};
use serde_json::{json, Value};

const NOW: u64 = 1_795_329_141;
const META: Meta = Meta {
    now: NOW,
    id_seed: 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef,
};

fn exchange(stream: bool) -> ResponsePlan {
    ResponsePlan::new("smollm2", stream, META, Options::default())
}

/// Words that make up the synthetic answer; a few tokens per frame as real servers send.
#[rustfmt::skip]
const WORDS: &[&str] = &[
    " the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", ".",
    " Streaming", " answers", " arrive", " as", " many", " small", " frames", ",", " each",
    " carrying", " one", " or", " two", " tokens", " of", " text", " \u{e9}t\u{e9}",
    " \"quoted\"", "\n", " \u{1f600}",
];

fn sse_frame(value: &Value) -> Vec<u8> {
    let mut f = b"data: ".to_vec();
    f.extend_from_slice(&serde_json::to_vec(value).unwrap());
    f.extend_from_slice(b"\n\n");
    f
}

fn vllm_chunk(delta: Value, finish_reason: Option<&str>) -> Value {
    json!({
        "id": "chatcmpl-99ecb8e2383f01ea",
        "object": "chat.completion.chunk",
        "created": NOW,
        "model": "smollm2",
        "choices": [{
            "index": 0,
            "delta": delta,
            "logprobs": null,
            "finish_reason": finish_reason,
            "token_ids": null
        }]
    })
}

fn usage_frame(completion_tokens: usize) -> Vec<u8> {
    sse_frame(&json!({
        "id": "chatcmpl-99ecb8e2383f01ea",
        "object": "chat.completion.chunk",
        "created": NOW,
        "model": "smollm2",
        "choices": [],
        "usage": {"prompt_tokens": 1234, "completion_tokens": completion_tokens,
                  "total_tokens": 1234 + completion_tokens}
    }))
}

/// A vLLM-like text stream of `n` content frames, one Vec per SSE frame.
fn text_stream(n: usize) -> Vec<Vec<u8>> {
    let mut frames = vec![sse_frame(&vllm_chunk(
        json!({"role": "assistant", "content": ""}),
        None,
    ))];
    for i in 0..n {
        let text: String = (0..1 + i % 3)
            .map(|k| WORDS[(i * 7 + k) % WORDS.len()])
            .collect();
        frames.push(sse_frame(&vllm_chunk(json!({"content": text}), None)));
    }
    frames.push(sse_frame(&vllm_chunk(json!({}), Some("stop"))));
    frames.push(usage_frame(2 * n));
    frames.push(b"data: [DONE]\n\n".to_vec());
    frames
}

/// A vLLM-like stream of `calls` parallel tool calls whose argument deltas interleave,
/// `n` argument frames in all, preceded by a short text.
fn tool_stream(calls: u32, n: usize) -> Vec<Vec<u8>> {
    let mut frames = vec![sse_frame(&vllm_chunk(
        json!({"role": "assistant", "content": "Let me look that up."}),
        None,
    ))];
    for c in 0..calls {
        frames.push(sse_frame(&vllm_chunk(
            json!({"content": null, "tool_calls": [{
                "id": format!("chatcmpl-tool-{c:016x}"), "type": "function", "index": c,
                "function": {"name": "apply_patch"}}]}),
            None,
        )));
    }
    for i in 0..n {
        let c = i as u32 % calls;
        let piece = match i % 4 {
            0 => "{\"path\": \"src/",
            1 => "main.rs\", \"diff\": \"@@ -1,3 +1,4 @@\\n",
            2 => "+use std::io;\\n fn main() {\\n",
            _ => "\"}",
        };
        frames.push(sse_frame(&vllm_chunk(
            json!({"content": null, "tool_calls": [{"index": c, "function": {"arguments": piece}}]}),
            None,
        )));
    }
    frames.push(sse_frame(&vllm_chunk(json!({}), Some("tool_calls"))));
    frames.push(usage_frame(n));
    frames.push(b"data: [DONE]\n\n".to_vec());
    frames
}

/// A stream whose single content frame carries `len` bytes of text (a long frame held by
/// the decoder across many pushes).
fn one_big_frame(len: usize) -> Vec<Vec<u8>> {
    let text: String = "abcdefgh".repeat(len / 8);
    vec![
        sse_frame(&vllm_chunk(json!({"content": text}), None)),
        sse_frame(&vllm_chunk(json!({}), Some("stop"))),
        b"data: [DONE]\n\n".to_vec(),
    ]
}

/// Splits a recorded SSE body into frames (each ending with its blank line).
fn split_frames(body: &[u8]) -> Vec<Vec<u8>> {
    responses_core::sse::split_frames(body)
        .into_iter()
        .map(<[u8]>::to_vec)
        .collect()
}

fn rechunk(frames: &[Vec<u8>], size: usize) -> Vec<Vec<u8>> {
    frames.concat().chunks(size).map(<[u8]>::to_vec).collect()
}

/// Translates the whole body, chunk by chunk, and returns the number of bytes produced
/// (each output is passed through `black_box` so nothing is optimised away).
fn translate_stream<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> usize {
    translate_collect(chunks, |_| {})
}

/// As [`translate_stream`], handing every output to `sink`.
fn translate_collect<'a>(
    chunks: impl IntoIterator<Item = &'a [u8]>,
    mut sink: impl FnMut(&[u8]),
) -> usize {
    let mut t = StreamTranslator::new(exchange(true));
    let mut out = 0;
    for c in chunks {
        let b = black_box(t.push(black_box(c), NOW));
        sink(&b);
        out += b.len();
    }
    let b = t.finish(NOW);
    sink(&b);
    assert!(t.is_done());
    out + b.len()
}

/// Checks once, outside the measurement, that the input translates into a finished answer
/// (`response.completed`, or `response.incomplete` for the fixtures cut by `max_tokens`;
/// never `response.failed`), and prints its size.
fn describe(name: &str, chunks: &[&[u8]]) {
    let bytes: usize = chunks.iter().map(|c| c.len()).sum();
    let mut all = Vec::new();
    let out = translate_collect(chunks.iter().copied(), |b| all.extend_from_slice(b));
    let text = String::from_utf8(all).expect("UTF-8 events");
    let ended = ["completed", "incomplete"]
        .iter()
        .any(|t| text.contains(&format!("event: response.{t}\n")));
    assert!(
        ended && !text.contains("event: response.failed\n") && text.ends_with("data: [DONE]\n\n"),
        "{name} did not translate into a completed (or incomplete) response"
    );
    eprintln!(
        "input {name}: {bytes} upstream bytes in {} chunks -> {out} bytes of Responses events",
        chunks.len()
    );
}

fn as_slices(chunks: &[Vec<u8>]) -> Vec<&[u8]> {
    chunks.iter().map(Vec::as_slice).collect()
}

fn configure<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(3));
    g.sample_size(30);
    g
}

fn bench_text(c: &mut Criterion) {
    let frames = text_stream(2000);
    let body_len: usize = frames.iter().map(Vec::len).sum();
    let inputs = [
        ("synthetic-2000/per-frame", frames.clone()),
        ("synthetic-2000/16KiB", rechunk(&frames, 16 << 10)),
    ];
    let mut g = configure(c, "text_stream");
    g.throughput(Throughput::Bytes(body_len as u64));
    for (name, chunks) in &inputs {
        describe(name, &as_slices(chunks));
        g.bench_with_input(BenchmarkId::from_parameter(name), chunks, |b, chunks| {
            b.iter(|| translate_stream(chunks.iter().map(Vec::as_slice)))
        });
    }
    g.finish();

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/upstream");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("tests/fixtures/upstream")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sse"))
        .collect();
    files.sort();
    let mut g = configure(c, "fixture_stream");
    for path in files {
        let body = std::fs::read(&path).unwrap();
        let chunks = split_frames(&body);
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        describe(&format!("{name}/per-frame"), &as_slices(&chunks));
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(BenchmarkId::new(name, "per-frame"), &chunks, |b, chunks| {
            b.iter(|| translate_stream(chunks.iter().map(Vec::as_slice)))
        });
    }
    g.finish();
}

fn bench_bytewise(c: &mut Criterion) {
    let mut g = configure(c, "bytewise");
    // One iteration takes tens of milliseconds: the same number of iterations per sample.
    g.sampling_mode(SamplingMode::Flat);
    let inputs = [
        ("synthetic-500", text_stream(500).concat()),
        ("synthetic-2000", text_stream(2000).concat()),
        ("one-frame-16KiB", one_big_frame(16 << 10).concat()),
        ("one-frame-128KiB", one_big_frame(128 << 10).concat()),
    ];
    for (name, body) in &inputs {
        describe(
            &format!("bytewise/{name}"),
            &body.chunks(1).collect::<Vec<_>>(),
        );
        g.throughput(Throughput::Bytes(body.len() as u64));
        g.bench_with_input(BenchmarkId::from_parameter(name), body, |b, body| {
            b.iter(|| translate_stream(body.chunks(1)))
        });
    }
    g.finish();
}

fn bench_tools(c: &mut Criterion) {
    let mut g = configure(c, "tool_stream");
    let inputs = [
        ("1-call-1000/per-frame", tool_stream(1, 1000)),
        ("3-calls-interleaved-1000/per-frame", tool_stream(3, 1000)),
    ];
    for (name, chunks) in &inputs {
        describe(name, &as_slices(chunks));
        let bytes: usize = chunks.iter().map(Vec::len).sum();
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_with_input(BenchmarkId::from_parameter(name), chunks, |b, chunks| {
            b.iter(|| translate_stream(chunks.iter().map(Vec::as_slice)))
        });
    }
    g.finish();
}

/// A Codex-like request: ~8 KB of instructions, 10 function tools, 20 input items
/// (messages, function calls and their outputs, reasoning), streaming. Codex also sends
/// `include: ["reasoning.encrypted_content"]`; it is left out here because its handling
/// depends on whether reasoning keys are configured, which `Options::default()` has not.
fn codex_request() -> Vec<u8> {
    let paragraph = "You are a coding agent running in a terminal. Follow the user's \
        instructions precisely, prefer small verifiable changes, run the tests after editing, \
        and explain what you changed and why in a short summary at the end. ";
    let instructions = paragraph.repeat(8 * 1024 / paragraph.len() + 1);
    let tools: Vec<Value> = (0..10)
        .map(|i| {
            json!({
                "type": "function",
                "name": format!("tool_{i}"),
                "description": format!("Tool number {i}: runs a command in the workspace and returns its output."),
                "strict": false,
                "parameters": {
                    "type": "object",
                    "properties": {
                        "command": {"type": "array", "items": {"type": "string"},
                                    "description": "The command and its arguments."},
                        "workdir": {"type": "string", "description": "Working directory."},
                        "timeout_ms": {"type": "number", "description": "Timeout in milliseconds."}
                    },
                    "required": ["command"],
                    "additionalProperties": false
                }
            })
        })
        .collect();
    let mut input = vec![
        json!({"type": "message", "role": "developer",
               "content": [{"type": "input_text", "text": "<environment_context>cwd: /home/dev/project, shell: bash</environment_context>"}]}),
        json!({"type": "message", "role": "user",
               "content": [{"type": "input_text", "text": "The stream benchmark is a placeholder: write it and run it."}]}),
    ];
    for i in 0..4 {
        input.push(json!({"type": "reasoning", "summary": [],
            "content": [{"type": "reasoning_text", "text": format!("I should look at file {i} first.")}]}));
        input.push(json!({"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": format!("Reading file {i}."), "annotations": []}]}));
        input.push(json!({"type": "function_call", "call_id": format!("call_{i}"), "name": "tool_0",
            "arguments": format!("{{\"command\":[\"sed\",\"-n\",\"1,200p\",\"src/file{i}.rs\"],\"workdir\":\"/home/dev/project\"}}")}));
        input.push(
            json!({"type": "function_call_output", "call_id": format!("call_{i}"),
            "output": "fn main() {\n    println!(\"hello\");\n}\n".repeat(20)}),
        );
    }
    input.push(json!({"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Looks good, continue."}]}));
    input.push(json!({"type": "message", "role": "user", "content": "And keep it short."}));
    assert_eq!(input.len(), 20);
    serde_json::to_vec(&json!({
        "model": "smollm2",
        "instructions": instructions,
        "input": input,
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": false,
        "stream": true,
        "prompt_cache_key": "0199c3b2-4a8e-7d31-9f0e-2b6c1d5e8a47",
        "text": {"verbosity": "low"}
    }))
    .unwrap()
}

/// A non-streamed Chat answer with reasoning, ~2 KB of text and one tool call.
fn chat_completion() -> Vec<u8> {
    let text: String = (0..400).map(|i| WORDS[i % WORDS.len()]).collect();
    serde_json::to_vec(&json!({
        "id": "chatcmpl-99ecb8e2383f01ea",
        "object": "chat.completion",
        "created": NOW,
        "model": "smollm2",
        "choices": [{
            "index": 0,
            "message": {
                "role": "assistant",
                "reasoning_content": "The user wants the weather; I will call the tool.",
                "content": text,
                "tool_calls": [{"id": "chatcmpl-tool-95600400ec02a8b8", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]
            },
            "logprobs": null,
            "finish_reason": "tool_calls"
        }],
        "usage": {"prompt_tokens": 1234, "completion_tokens": 456, "total_tokens": 1690}
    }))
    .unwrap()
}

fn bench_json(c: &mut Criterion) {
    let mut g = configure(c, "json");
    let request = codex_request();
    let options = Options::default();
    translate_request(&request, &options, META).expect("the Codex-like request is valid");
    eprintln!("input codex-request: {} bytes", request.len());
    g.throughput(Throughput::Bytes(request.len() as u64));
    g.bench_function("request/codex-like", |b| {
        b.iter(|| translate_request(black_box(&request), &options, META).unwrap())
    });

    let answer = chat_completion();
    let ex = exchange(false);
    completion(&ex, &answer, NOW).expect("the chat.completion is valid");
    eprintln!("input chat-completion: {} bytes", answer.len());
    g.throughput(Throughput::Bytes(answer.len() as u64));
    g.bench_function("response/chat-completion", |b| {
        b.iter(|| completion(&ex, black_box(&answer), NOW).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench_text, bench_bytewise, bench_tools, bench_json);
criterion_main!(benches);
