//! "The clients people really use", end to end: real Envoy (`envoy/envoy.yaml`) + the
//! `responses-extproc` binary + an upstream, driven by
//!
//! * the official `openai` Python SDK and the `openai-agents` SDK
//!   (`tests/clients/python/*.py`, run with `.venv/bin/python`),
//! * the official `openai` npm SDK (`tests/clients/node/*.mjs`, run with `node`),
//! * a Codex-shaped request sent raw (namespace and hosted tools, reasoning, encrypted
//!   reasoning, Codex's headers) against a scripted upstream that records what it gets, the
//!   request shape the real Codex CLI 0.169.0 sends, against the demo, and the requests the
//!   real Codex CLI 0.171.0 sent with `openai_base_url`, replayed byte for byte.
//!
//! The client scripts assert the answers of the deterministic demo upstream (`src/demo.rs`),
//! or of a scripted upstream (`openai_reasoning.py`), and exit non-zero on any mismatch: a
//! test passes only if its script exits 0. The SDKs are installed by
//! `deploy/install-clients.sh` (pinned versions); when they are missing the tests fail and say
//! so. The real Codex CLI is opt-in: `tests/clients/codex/run.sh`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::schema::assert_valid_sse;
use common::{
    client, repo_root, DemoUpstream, Envoy, Gate, Reply, ScriptedUpstream, Stack, TempDir,
};
use serde_json::{json, Value};

/// Longest a client script may run (each takes a few seconds; generous for loaded machines).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(90);
const INSTALL_HINT: &str = "run `bash deploy/install-clients.sh` (installs the pinned client \
                            SDKs into .venv and tests/clients/node/node_modules)";

// ---- the stack ----

/// The translating Envoy (either mode) + an upstream; all stopped on Drop.
struct ClientStack {
    // Drop order: Envoy and the processor first, then the upstream.
    stack: Stack,
    /// One of the three is set.
    _demo: Option<DemoUpstream>,
    scripted: Option<ScriptedUpstream>,
    _triggers: Option<common::RecordingDemo>,
    /// The processor's reasoning key file, when it has one.
    _keys: Option<TempDir>,
}

impl ClientStack {
    /// With the in-process demo upstream and the processor's defaults.
    fn demo() -> ClientStack {
        let demo = DemoUpstream::start();
        ClientStack {
            stack: Stack::start(demo.port(), &[]),
            _demo: Some(demo),
            scripted: None,
            _triggers: None,
            _keys: None,
        }
    }

    /// With a scripted upstream and extra processor flags.
    fn scripted(upstream: ScriptedUpstream, processor_args: &[&str]) -> ClientStack {
        ClientStack {
            stack: Stack::start(upstream.port(), processor_args),
            _demo: None,
            scripted: Some(upstream),
            _triggers: None,
            _keys: None,
        }
    }

    /// With a scripted upstream, extra processor flags and the WebSocket transport.
    fn scripted_ws(upstream: ScriptedUpstream, processor_args: &[&str]) -> ClientStack {
        ClientStack {
            stack: Stack::with_websocket(upstream.port(), processor_args),
            _demo: None,
            scripted: Some(upstream),
            _triggers: None,
            _keys: None,
        }
    }

    /// The demo with its test triggers (`refuse`, `think`: tests/common/upstream.rs), the
    /// WebSocket transport and a reasoning key (sealed reasoning, compaction).
    fn triggers_ws() -> ClientStack {
        let keys = TempDir::new("client-keys");
        let key_file = keys.path().join("keys");
        std::fs::write(
            &key_file,
            "k1:BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\n",
        )
        .expect("write the key file");
        let demo = common::RecordingDemo::with_triggers();
        let key_arg = key_file.to_str().expect("a UTF-8 temp path");
        ClientStack {
            stack: Stack::with_websocket(demo.port(), &["--reasoning-keys-file", key_arg]),
            _demo: None,
            scripted: None,
            _triggers: Some(demo),
            _keys: Some(keys),
        }
    }

    /// What the scripted upstream received (empty for the demo).
    fn upstream_requests(&self) -> Vec<common::RecordedRequest> {
        self.scripted
            .as_ref()
            .map(ScriptedUpstream::requests)
            .unwrap_or_default()
    }

    /// The scripted upstream's own URL (a client releases its held replies there), or
    /// nothing.
    fn scripted_url(&self) -> String {
        self.scripted
            .as_ref()
            .map(|u| u.url(""))
            .unwrap_or_default()
    }

    /// The `OPENAI_BASE_URL` of the clients.
    fn base_url(&self) -> String {
        self.stack.envoy.url("/v1")
    }
}

// ---- the installed clients ----

/// `name==version` lines of a pip requirements file.
fn pins(path: &Path) -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_once("=="))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// PEP 503 normalisation, as in installed `.dist-info` directory names (`openai_agents`).
fn normalise(name: &str) -> String {
    name.to_ascii_lowercase().replace(['-', '.'], "_")
}

/// `.venv/bin/python`, after checking that every pinned client package is installed in the
/// pinned version; panics with the install hint otherwise.
fn python() -> PathBuf {
    let root = repo_root();
    let python = root.join(".venv/bin/python");
    assert!(
        python.is_file(),
        "{} does not exist: {INSTALL_HINT}",
        python.display()
    );
    let lib = root.join(".venv/lib");
    let mut installed = Vec::new();
    for pydir in std::fs::read_dir(&lib).into_iter().flatten().flatten() {
        let site = pydir.path().join("site-packages");
        for entry in std::fs::read_dir(site).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(".dist-info") {
                installed.push(normalise(stem));
            }
        }
    }
    let requirements = root.join("tests/clients/python/requirements.txt");
    let wanted = pins(&requirements);
    assert!(!wanted.is_empty(), "no pins in {}", requirements.display());
    for (name, version) in wanted {
        let dist = normalise(&format!("{name}-{version}"));
        assert!(
            installed.contains(&dist),
            "{name}=={version} is not installed in .venv: {INSTALL_HINT}"
        );
    }
    python
}

/// `node`, after checking that tests/clients/node/node_modules has the pinned openai SDK.
fn node() -> PathBuf {
    let dir = repo_root().join("tests/clients/node");
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("package.json")).expect("read package.json"),
    )
    .expect("package.json is JSON");
    let installed = dir.join("node_modules/openai/package.json");
    let installed: Option<Value> = std::fs::read_to_string(&installed)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let want = &manifest["dependencies"]["openai"];
    assert!(
        installed.as_ref().is_some_and(|i| &i["version"] == want),
        "tests/clients/node/node_modules does not have openai {want}: {INSTALL_HINT}"
    );
    let node = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("node"))
        .find(|p| p.is_file());
    node.unwrap_or_else(|| panic!("`node` (Node >= 20) is not on PATH"))
}

/// Runs a client script against `stack` with `OPENAI_BASE_URL`/`OPENAI_API_KEY` set, proxies
/// off, and panics (with the script's output and the stack's logs) unless it exits 0.
fn run_client(stack: &ClientStack, program: &Path, script: &str) {
    let root = repo_root();
    let script_path = root.join(script);
    assert!(script_path.is_file(), "{script} is missing");
    let dir = TempDir::new("client");
    let out_path = dir.path().join("output.log");
    let out = std::fs::File::create(&out_path).expect("create client log");
    let mut command = Command::new(program);
    command
        .arg(&script_path)
        .current_dir(&root)
        .env("OPENAI_BASE_URL", stack.base_url())
        .env("SCRIPTED_UPSTREAM_URL", stack.scripted_url())
        .env("OPENAI_API_KEY", "x")
        .env("NO_PROXY", "*")
        .env("no_proxy", "*")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .env("OPENAI_AGENTS_DISABLE_TRACING", "1")
        .env("HOME", dir.path())
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("clone log handle"))
        .stderr(out);
    for var in [
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "http_proxy",
        "https_proxy",
        "all_proxy",
        "OPENAI_ORG_ID",
        "OPENAI_PROJECT_ID",
        "OPENAI_ADMIN_KEY",
    ] {
        command.env_remove(var);
    }
    let started = Instant::now();
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {} {script}: {e}", program.display()));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the client") {
            break Some(status);
        }
        if started.elapsed() > SCRIPT_TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    let ok = status.is_some_and(|s| s.success());
    if !ok {
        panic!(
            "{script} {} after {:.1?}\n---- its output ----\n{output}\n---- processor log (tail) \
             ----\n{}\n---- envoy log (tail) ----\n{}",
            match status {
                Some(s) => format!("failed ({s})"),
                None => format!("timed out ({SCRIPT_TIMEOUT:?})"),
            },
            started.elapsed(),
            tail(&stack.stack.translator_logs(), 4000),
            tail(&stack.stack.envoy.logs(), 2000),
        );
    }
    // Visible with `--nocapture`: NOTE lines about SDK-only fields.
    print!("{script} ({:.1?}):\n{output}", started.elapsed());
}

fn tail(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

// ---- the official openai Python SDK ----

#[test]
fn python_openai_sdk_create() {
    let python = python();
    let stack = ClientStack::demo();
    run_client(&stack, &python, "tests/clients/python/openai_create.py");
}

#[test]
fn python_openai_sdk_streaming() {
    let python = python();
    let stack = ClientStack::demo();
    run_client(&stack, &python, "tests/clients/python/openai_stream.py");
}

/// Every output kind from every source, fed back in every dump style, over HTTP, SSE and the
/// WebSocket (`openai_round_trips.py`): each continuation completes.
#[test]
fn python_openai_sdk_round_trips_every_output_kind() {
    let python = python();
    let stack = ClientStack::triggers_ws();
    run_client(
        &stack,
        &python,
        "tests/clients/python/openai_round_trips.py",
    );
}

/// A vLLM-style reasoning upstream: `reasoning_content` in two chunks, then text.
fn reasoning_stream() -> Reply {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-r1", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
                   "model": "demo-model",
                   "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
        )
    };
    Reply::sse([
        chunk(json!({"role": "assistant", "content": null}), Value::Null),
        chunk(json!({"reasoning_content": "Let me "}), Value::Null),
        chunk(json!({"reasoning_content": "think."}), Value::Null),
        chunk(json!({"content": "Hi"}), Value::Null),
        chunk(json!({"content": " there."}), Value::Null),
        chunk(json!({}), json!("stop")),
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-r1", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
                   "model": "demo-model", "choices": [],
                   "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}})
        ),
        "data: [DONE]\n\n".to_string(),
    ])
}

fn chat_json(message: Value) -> Reply {
    Reply::json(
        200,
        &json!({"id": "chatcmpl-r2", "object": "chat.completion", "created": 1_700_000_000u64,
                "model": "demo-model",
                "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}}),
    )
}

#[test]
fn python_openai_sdk_gets_openai_reasoning_event_names_by_default() {
    let python = python();
    let upstream = ScriptedUpstream::with_replies([
        reasoning_stream(),
        reasoning_stream(),
        chat_json(
            json!({"role": "assistant", "content": "Hi there.", "reasoning_content": "Let me think."}),
        ),
        chat_json(json!({"role": "assistant", "content": "Done."})),
    ]);
    let stack = ClientStack::scripted(upstream, &[]);
    run_client(&stack, &python, "tests/clients/python/openai_reasoning.py");

    // Turn 2 gave the sealed reasoning back: the upstream sees it as reasoning_content.
    let requests = stack.upstream_requests();
    assert_eq!(requests.len(), 4);
    let chat = requests[3].json();
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "Hi there.", "reasoning_content": "Let me think."},
            {"role": "user", "content": "and now?"}
        ]),
        "{chat}"
    );
}

/// openai-python with `max_retries=1` against an upstream that answers 429 `retry-after: 1`,
/// then a completion (`openai_retry_after.py`): the envelope keeps the header, the SDK waits
/// what it says, and the upstream's own log shows the retry at least a second after the
/// first request.
#[test]
fn python_openai_sdk_retries_after_the_upstreams_retry_after() {
    let python = python();
    let rate_limited = Reply::json(
        429,
        &json!({"error": {"message": "Rate limit reached. Please try again in 1s.",
                          "type": "requests", "param": null, "code": "rate_limit_exceeded"}}),
    )
    .header("retry-after", "1");
    let upstream = ScriptedUpstream::with_replies([
        rate_limited,
        chat_json(json!({"role": "assistant", "content": "Hi after the wait."})),
    ]);
    let stack = ClientStack::scripted(upstream, &[]);
    run_client(
        &stack,
        &python,
        "tests/clients/python/openai_retry_after.py",
    );
    let requests = stack.upstream_requests();
    assert_eq!(requests.len(), 2, "the first request and one retry");
    let waited = requests[1].received - requests[0].received;
    println!("the upstream's log: the retry came {waited:?} after the first request");
    // The SDK waits retry-after exactly (no jitter when the server says how long); a little
    // slack for the clocks of two processes.
    assert!(
        waited >= Duration::from_millis(950),
        "the retry came {waited:?} after the first request"
    );
}

/// `client.responses.compact()` and a new chain from its output (`openai_compact.py`): what
/// the upstream was asked each time.
#[test]
fn python_openai_sdk_compact_then_a_new_chain() {
    use responses_core::translate::compact::{CONTEXT_PREFIX, PROMPT, REQUEST};
    const SUMMARY: &str = "Ada wants the number 42 remembered.";
    let python = python();
    let upstream = ScriptedUpstream::with_replies([
        chat_json(json!({"role": "assistant", "content": SUMMARY})),
        chat_json(json!({"role": "assistant", "content": "Done."})),
    ]);
    let stack = ClientStack::scripted(upstream, &[]);
    run_client(&stack, &python, "tests/clients/python/openai_compact.py");

    // Two upstream calls: the tampered item never left the processor.
    let requests = stack.upstream_requests();
    assert_eq!(requests.len(), 2);
    assert!(requests.iter().all(|r| r.path == "/v1/chat/completions"));
    // 1. The summarising request: the prompt (the instructions noted after it), the window,
    //    the request to summarise; one JSON answer.
    let chat = requests[0].json();
    let system = chat["messages"][0]["content"].as_str().unwrap_or_default();
    assert!(
        system.starts_with(PROMPT) && system.ends_with("Be brief."),
        "{chat}"
    );
    assert_eq!(
        chat["messages"].as_array().map(|m| m[1..].to_vec()),
        Some(vec![
            json!({"role": "user", "content": "My name is Ada."}),
            json!({"role": "assistant", "content": "Hello Ada."}),
            json!({"role": "user", "content": "Remember 42."}),
            json!({"role": "user", "content": REQUEST}),
        ]),
        "{chat}"
    );
    assert_eq!(chat["stream"], false);
    // 2. The next turn: the unsealed summary first, then the kept message and the new one.
    let chat = requests[1].json();
    assert_eq!(
        chat["messages"],
        json!([
            {"role": "system", "content": format!("{CONTEXT_PREFIX}{SUMMARY}")},
            {"role": "user", "content": [{"type": "text", "text": "Remember 42."}]},
            {"role": "user", "content": "Which number?"}
        ]),
        "{chat}"
    );
}

/// openai-python's typed `context_management` (`openai_context_management.py`): a compacting
/// turn's output parses (the item, then the message), the history sent back with the SDK's
/// nulls works, a stream leads with the item; the upstream got the summarising request, then
/// the compacted window. Both modes.
#[test]
fn python_openai_sdk_context_management_compacts_and_feeds_the_item_back() {
    use responses_core::translate::compact::{CONTEXT_PREFIX, PROMPT};
    const SUMMARY: &str = "The user asked about cats and whiskers.";
    let python = python();
    let upstream = ScriptedUpstream::with_replies([
        chat_json(json!({"role": "assistant", "content": SUMMARY})),
        chat_json(json!({"role": "assistant", "content": "Dogs are loyal."})),
        chat_json(json!({"role": "assistant", "content": "Birds fly."})),
        chat_json(json!({"role": "assistant", "content": SUMMARY})),
        chat_sse("Streamed."),
    ]);
    let stack = ClientStack::scripted_ws(upstream, &[]);
    run_client(
        &stack,
        &python,
        "tests/clients/python/openai_context_management.py",
    );
    let requests = stack.upstream_requests();
    assert_eq!(requests.len(), 5);
    for (i, summarising) in [(0, true), (1, false), (2, false), (3, true), (4, false)] {
        let chat = requests[i].json();
        let system = chat["messages"][0]["content"].as_str().unwrap_or_default();
        assert_eq!(system.starts_with(PROMPT), summarising, "{i}: {chat}");
    }
    for i in [1, 2, 4] {
        let chat = requests[i].json();
        let system = chat["messages"][0]["content"].as_str().unwrap_or_default();
        assert_eq!(system, format!("{CONTEXT_PREFIX}{SUMMARY}"), "{i}: {chat}");
        assert!(
            !chat["messages"].to_string().contains("whiskers?"),
            "{i}: {chat}"
        );
    }
}

/// One Chat stream event with this `delta` and `finish_reason`.
fn chat_chunk(delta: Value, finish: Value) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-ws", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
               "model": "demo-model", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    )
}

/// A Chat stream saying `text`.
fn chat_sse(text: &str) -> Reply {
    let chunk = chat_chunk;
    Reply::sse([
        chunk(json!({"role": "assistant", "content": text}), Value::Null),
        chunk(json!({}), json!("stop")),
        "data: [DONE]\n\n".to_owned(),
    ])
}

/// openai-python's `client.responses.connect()` through Envoy (`openai_websocket.py`):
/// create, continuation, unknown and evicted ids, back-to-back responses, and a new chain
/// from `responses.compact()`; what the upstream was asked each time.
#[test]
fn python_openai_sdk_websocket_connect() {
    use responses_core::translate::compact::CONTEXT_PREFIX;
    const SUMMARY: &str = "Ada wants the number 42 remembered.";
    let python = python();
    let upstream = ScriptedUpstream::with_replies([
        chat_sse("Hello Ada."),
        chat_sse("You are Ada."),
        Reply::json(500, &json!({"error": {"message": "upstream broke"}})),
        chat_sse("one"),
        chat_sse("two"),
        chat_json(json!({"role": "assistant", "content": SUMMARY})),
        chat_sse("Done."),
    ]);
    let stack = ClientStack::scripted_ws(upstream, &[]);
    run_client(&stack, &python, "tests/clients/python/openai_websocket.py");

    // Seven upstream calls: the refused ids never left the processor.
    let requests = stack.upstream_requests();
    assert_eq!(requests.len(), 7);
    assert!(requests.iter().all(|r| r.path == "/v1/chat/completions"));
    // The continuation carried the whole context: the first turn (without its instructions,
    // which are per request) and its answer, then the new message.
    assert_eq!(
        requests[1].json()["messages"],
        json!([
            {"role": "user", "content": "I am Ada."},
            {"role": "assistant", "content": "Hello Ada."},
            {"role": "user", "content": "Who am I?"}
        ])
    );
    assert_eq!(requests[1].json()["stream"], true);
    assert_eq!(requests[1].header("authorization"), Some("Bearer x"));
    // The failed continuation was the second turn's context plus "again".
    assert_eq!(
        requests[2].json()["messages"].as_array().map(Vec::len),
        Some(5)
    );
    // The new chain opened the sealed summary.
    let chat = requests[6].json();
    assert_eq!(
        chat["messages"][0],
        json!({"role": "system", "content": format!("{CONTEXT_PREFIX}{SUMMARY}")}),
        "{chat}"
    );
}

/// A Chat stream that calls `lookup` (`call_1`) with no arguments.
fn chat_tool_call_sse() -> Reply {
    let chunk = chat_chunk;
    Reply::sse([
        chunk(
            json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                   "function": {"name": "lookup", "arguments": "{}"}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        "data: [DONE]\n\n".to_owned(),
    ])
}

/// The upstream of the lanes and steering scripts (`openai_websocket_lanes.py`,
/// `openai_websocket_lanes.mjs`): three replies held after their first chunk, each released by
/// the client once it has done what must happen meanwhile.
fn lanes_upstream() -> ScriptedUpstream {
    let held = [Gate::new(), Gate::new(), Gate::new()];
    let upstream = ScriptedUpstream::with_replies([
        chat_sse("A").pause_after(1, &held[0]),
        chat_sse("B"),
        chat_sse("one"),
        chat_sse("two"),
        chat_sse("forked"),
        chat_sse("Roses.").pause_after(1, &held[1]),
        chat_sse("And the sea."),
        chat_tool_call_sse().pause_after(1, &held[2]),
        chat_sse("Quarante-deux."),
    ]);
    for gate in &held {
        upstream.released_by_client(gate);
    }
    upstream
}

/// What the upstream of [`lanes_upstream`] was asked: lane b while lane a was held, a fork of
/// lane a's context, a successor with the steer's input after the steered response, and the
/// steer first in the client's continuation after its tool call.
fn assert_lanes_requests(stack: &ClientStack) {
    let requests = stack.upstream_requests();
    let messages = |i: usize| requests[i].json()["messages"].clone();
    assert_eq!(
        requests.len(),
        9,
        "{:?}",
        requests.iter().map(|r| r.json()).collect::<Vec<_>>()
    );
    assert_eq!(messages(1), json!([{"role": "user", "content": "fast"}]));
    assert_eq!(
        messages(4),
        json!([
            {"role": "user", "content": "slow"},
            {"role": "assistant", "content": "A"},
            {"role": "user", "content": "and?"}
        ])
    );
    assert_eq!(
        messages(6),
        json!([
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Write about roses."},
            {"role": "assistant", "content": "Roses."},
            {"role": "user", "content": "Also mention the sea."}
        ])
    );
    let continuation = messages(8);
    let roles: Vec<_> = continuation
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].clone())
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "user", "tool"],
        "{continuation}"
    );
    assert_eq!(continuation[2]["content"], "In French, please.");
    assert_eq!(continuation[3]["content"], "42");
}

/// Runs a lanes and steering script against [`lanes_upstream`], then checks what the upstream
/// was asked.
fn run_lanes_script(program: &Path, script: &str) {
    let stack = ClientStack::scripted_ws(lanes_upstream(), &[]);
    run_client(&stack, program, script);
    assert_lanes_requests(&stack);
}

/// openai-python's lanes and steering over `client.responses.connect()`
/// (`openai_websocket_lanes.py`): two lanes side by side, FIFO on one, a fork across lanes,
/// every event's `stream_id`, a steer's successor, a steer pending on a tool call, and the
/// failures a client can cause.
#[test]
fn python_openai_sdk_websocket_lanes_and_steering() {
    run_lanes_script(&python(), "tests/clients/python/openai_websocket_lanes.py");
}

/// openai-node's `ResponsesWS` runs the same lanes and steering script
/// (`openai_websocket_lanes.mjs`) against the same upstream.
#[test]
fn node_openai_sdk_websocket_lanes_and_steering() {
    run_lanes_script(&node(), "tests/clients/node/openai_websocket_lanes.mjs");
}

/// The default `--reasoning-events auto` through Envoy: each client gets the names it parses,
/// from the headers it really sends (captured from openai-python 3.57, openai-node 7.57 and
/// Codex 0.169), and the request header overrides. Raw requests, so the headers are exact.
#[tokio::test]
async fn reasoning_event_names_follow_the_client() {
    struct Case {
        who: &'static str,
        headers: &'static [(&'static str, &'static str)],
        expected: &'static str,
    }
    const SPEC: &str = "response.reasoning.delta";
    const OPENAI: &str = "response.reasoning_text.delta";
    let cases = [
        Case {
            who: "no identity (curl, a spec client)",
            headers: &[("user-agent", "curl/8.5.0")],
            expected: SPEC,
        },
        Case {
            who: "openai-python",
            headers: &[
                ("user-agent", "OpenAI/Python 3.57.0"),
                ("x-stainless-lang", "python"),
            ],
            expected: OPENAI,
        },
        Case {
            who: "openai-node",
            headers: &[
                ("user-agent", "OpenAI/JS 7.57.0"),
                ("x-stainless-lang", "js"),
            ],
            expected: OPENAI,
        },
        Case {
            who: "Codex",
            headers: &[
                ("originator", "codex_exec"),
                (
                    "user-agent",
                    "codex_exec/0.169.0 (Debian 12.0.0; x86_64) xterm",
                ),
            ],
            expected: OPENAI,
        },
        Case {
            who: "openai-python asking for the spec's names",
            headers: &[
                ("x-stainless-lang", "python"),
                ("x-responses-reasoning-events", "spec"),
            ],
            expected: SPEC,
        },
        Case {
            who: "a spec client asking for OpenAI's",
            headers: &[("x-responses-reasoning-events", "openai")],
            expected: OPENAI,
        },
    ];
    let upstream = ScriptedUpstream::with_replies(cases.iter().map(|_| reasoning_stream()));
    let stack = ClientStack::scripted(upstream, &[]);
    for Case {
        who,
        headers,
        expected,
    } in cases
    {
        let mut request = client()
            .post(stack.stack.envoy.url("/v1/responses"))
            .json(&json!({"model": "demo-model", "input": "hi", "stream": true}));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200, "{who}");
        let events = assert_valid_sse(&response.text().await.unwrap());
        let reasoning: Vec<&str> = events
            .iter()
            .map(|(name, _)| name.as_str())
            .filter(|name| name.contains("reasoning"))
            .collect();
        let done = expected.replace(".delta", ".done");
        assert_eq!(reasoning, [expected, expected, done.as_str()], "{who}");
    }
}

/// A `custom` tool (Codex's `apply_patch`) through Envoy with openai-python: the upstream sees
/// a function with one string parameter, the client a typed `custom_tool_call` (streamed with
/// the `response.custom_tool_call_input.*` events) and its history goes back as a tool call.
#[test]
fn python_openai_sdk_custom_tool_round_trip() {
    let python = python();
    let patch = "*** Begin Patch\n*** Add File: hello.txt\n+Hello, \"world\"!\n*** End Patch\n";
    let args = json!({"input": patch}).to_string();
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
                   "model": "demo-model", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let (a, b) = args.split_at(args.len() / 2);
    let stream = Reply::sse([
        chunk(
            json!({"role": "assistant", "tool_calls": [{"index": 0, "id": "call_patch_1", "type": "function",
                   "function": {"name": "apply_patch", "arguments": a}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": b}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        "data: [DONE]\n\n".to_string(),
    ]);
    let call = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_patch_1", "type": "function",
                      "function": {"name": "apply_patch", "arguments": args}}]});
    let upstream = ScriptedUpstream::with_replies([
        stream,
        chat_json(call.clone()),
        chat_json(json!({"role": "assistant", "content": "Patched."})),
    ]);
    let stack = ClientStack::scripted(upstream, &[]);
    run_client(
        &stack,
        &python,
        "tests/clients/python/openai_custom_tool.py",
    );

    let requests = stack.upstream_requests();
    assert_eq!(requests.len(), 3);
    let first = requests[0].json();
    assert_eq!(
        first["tools"][0]["function"]["name"], "apply_patch",
        "{first}"
    );
    assert_eq!(
        first["tools"][0]["function"]["parameters"]["required"],
        json!(["input"]),
        "{first}"
    );
    let last = requests[2].json();
    assert_eq!(
        last["messages"],
        json!([
            {"role": "user", "content": "add hello.txt"},
            call,
            {"role": "tool", "tool_call_id": "call_patch_1", "content": "Done!"}
        ]),
        "{last}"
    );
}

// ---- the openai-agents SDK ----

/// The built-in tools (`shell`, `local_shell`, `apply_patch`) round trips, Codex's
/// `compaction_trigger` and the `phase` of output messages, with openai-python's typed models,
/// against the demo.
#[test]
fn python_openai_sdk_builtin_tools_compaction_trigger_and_phase() {
    let python = python();
    let stack = ClientStack::demo();
    run_client(
        &stack,
        &python,
        "tests/clients/python/openai_builtin_tools.py",
    );
}

#[test]
fn python_openai_agents_tool_loop() {
    let python = python();
    let stack = ClientStack::demo();
    run_client(&stack, &python, "tests/clients/python/agents_run.py");
}

/// openai-agents with a reasoning upstream: the function-tool loop, JSON and streamed; the
/// reasoning goes back to the upstream with the call in the second turn.
#[test]
fn python_openai_agents_tool_loop_with_reasoning() {
    let python = python();
    let args = json!({"location": "Paris"}).to_string();
    let call = json!({"id": "call_w1", "type": "function", "function": {"name": "get_weather", "arguments": args}});
    let turn1_json = chat_json(
        json!({"role": "assistant", "content": null, "reasoning_content": "Checking the weather.", "tool_calls": [call]}),
    );
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-a", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
                   "model": "demo-model", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let turn1_stream = Reply::sse([
        chunk(
            json!({"role": "assistant", "reasoning_content": "Checking "}),
            Value::Null,
        ),
        chunk(json!({"reasoning_content": "the weather."}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_w1", "type": "function",
                                     "function": {"name": "get_weather", "arguments": args}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        "data: [DONE]\n\n".to_string(),
    ]);
    let turn2_stream = Reply::sse([
        chunk(
            json!({"role": "assistant", "content": "It is sunny."}),
            Value::Null,
        ),
        chunk(json!({}), json!("stop")),
        "data: [DONE]\n\n".to_string(),
    ]);
    let upstream = ScriptedUpstream::with_replies([
        turn1_json,
        chat_json(json!({"role": "assistant", "content": "It is sunny."})),
        turn1_stream,
        turn2_stream,
    ]);
    let stack = ClientStack::scripted(upstream, &[]);
    run_client(&stack, &python, "tests/clients/python/agents_reasoning.py");
    let requests = stack.upstream_requests();
    assert_eq!(requests.len(), 4);
    for second in [&requests[1], &requests[3]] {
        let messages = second.json()["messages"].clone();
        let assistant = messages
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "assistant")
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            assistant["reasoning_content"], "Checking the weather.",
            "{messages}"
        );
        assert_eq!(assistant["tool_calls"][0]["id"], "call_w1", "{messages}");
    }
}

// ---- the official openai npm SDK ----

#[test]
fn node_openai_sdk_create() {
    let node = node();
    let stack = ClientStack::demo();
    run_client(&stack, &node, "tests/clients/node/openai_create.mjs");
}

#[test]
fn node_openai_sdk_streaming() {
    let node = node();
    let stack = ClientStack::demo();
    run_client(&stack, &node, "tests/clients/node/openai_stream.mjs");
}

/// Every output kind from every source, fed back as received and as a JSON round trip, over
/// HTTP, SSE and the WebSocket (`openai_round_trips.mjs`): each continuation completes.
#[test]
fn node_openai_sdk_round_trips_every_output_kind() {
    let node = node();
    let stack = ClientStack::triggers_ws();
    run_client(&stack, &node, "tests/clients/node/openai_round_trips.mjs");
}

#[test]
fn node_openai_sdk_reasoning_events_are_the_ones_it_declares() {
    let node = node();
    let upstream = ScriptedUpstream::with_replies([reasoning_stream(), reasoning_stream()]);
    let stack = ClientStack::scripted(upstream, &[]);
    run_client(&stack, &node, "tests/clients/node/openai_reasoning.mjs");
}

// ---- the AI SDK (`ai` + `@ai-sdk/open-responses`) ----

#[test]
fn node_ai_sdk_generate_and_stream_text_with_a_tool() {
    let node = node();
    let stack = ClientStack::demo();
    run_client(&stack, &node, "tests/clients/node/ai_sdk.mjs");
}

#[test]
fn node_ai_sdk_reasoning() {
    let node = node();
    let upstream = ScriptedUpstream::with_replies([
        reasoning_stream(),
        chat_json(
            json!({"role": "assistant", "content": "Hi there.", "reasoning_content": "Let me think."}),
        ),
    ]);
    let stack = ClientStack::scripted(upstream, &[]);
    run_client(&stack, &node, "tests/clients/node/ai_sdk_reasoning.mjs");
    let requests = stack.upstream_requests();
    assert_eq!(requests.len(), 2);
    // The AI SDK parses only OpenAI's reasoning event names; its user agent gets them
    // (core/src/client.rs).
    let agent = requests[0].headers["user-agent"].to_str().unwrap();
    assert!(
        agent.starts_with("ai-sdk/open-responses/1.0.39 "),
        "{agent}"
    );
}

// ---- a Codex-shaped request ----

/// Codex's base instructions are several KB of text.
fn codex_instructions() -> String {
    let paragraph = "You are a coding agent running in the Codex CLI, a terminal-based coding \
                     assistant. You are expected to be precise, safe, and helpful. Use the \
                     tools you are given to read files and run commands; keep going until the \
                     user's query is completely resolved before ending your turn.\n\n";
    paragraph.repeat(12)
}

fn codex_tools() -> Value {
    json!([
        {
            "type": "function",
            "name": "shell",
            "description": "Runs a shell command and returns its output.",
            "strict": false,
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {"type": "array", "items": {"type": "string"}},
                    "workdir": {"type": "string"},
                    "timeout_ms": {"type": "number"}
                },
                "required": ["command"],
                "additionalProperties": false
            }
        },
        {
            "type": "namespace",
            "name": "mcp_fs",
            "description": "Tools of the MCP server `fs`: read files of the workspace.",
            "tools": [{
                "type": "function",
                "name": "read",
                "description": "Reads a file.",
                "parameters": {
                    "type": "object",
                    "properties": {"path": {"type": "string"}},
                    "required": ["path"]
                }
            }]
        },
        {"type": "web_search"}
    ])
}

/// The request body Codex (`codex_cli_rs`) sends, with the given input items.
fn codex_request(input: Value) -> Value {
    json!({
        "model": "gpt-oss-120b",
        "instructions": codex_instructions(),
        "input": input,
        "tools": codex_tools(),
        "tool_choice": "auto",
        "parallel_tool_calls": false,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": false,
        "stream": true,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "0199a0c4-5b8e-7b31-9d62-3f3a1c2b4d5e"
    })
}

fn user_message(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

/// A vLLM-style upstream stream: reasoning, then one call of `mcp_fs__read`.
fn upstream_reasoning_then_call() -> Reply {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-cx1", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
                   "model": "gpt-oss-120b",
                   "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
        )
    };
    Reply::sse([
        chunk(json!({"role": "assistant", "content": null}), Value::Null),
        chunk(
            json!({"reasoning_content": "The user wants README.md; "}),
            Value::Null,
        ),
        chunk(
            json!({"reasoning_content": "read it with mcp_fs."}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_fs_1", "type": "function",
                   "function": {"name": "mcp_fs__read", "arguments": ""}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"path\":"}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"README.md\"}"}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-cx1", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
                   "model": "gpt-oss-120b", "choices": [],
                   "usage": {"prompt_tokens": 900, "completion_tokens": 20, "total_tokens": 920}})
        ),
        "data: [DONE]\n\n".to_string(),
    ])
}

fn upstream_text(text: &str) -> Reply {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-cx2", "object": "chat.completion.chunk", "created": 1_700_000_001u64,
                   "model": "gpt-oss-120b",
                   "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]})
        )
    };
    Reply::sse([
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": text}), Value::Null),
        chunk(json!({}), json!("stop")),
        "data: [DONE]\n\n".to_string(),
    ])
}

/// POSTs a Codex-shaped streaming request with Codex's headers; returns the validated events.
async fn codex_post(envoy: &Envoy, body: &Value) -> Vec<(String, Value)> {
    let response = client()
        .post(envoy.url("/v1/responses"))
        .header("authorization", "Bearer x")
        .header("accept", "text/event-stream")
        .header("OpenAI-Beta", "responses=experimental")
        .header("session_id", "0199a0c4-5b8e-7b31-9d62-3f3a1c2b4d5e")
        .header("originator", "codex_cli_rs")
        .header(
            "user-agent",
            "codex_cli_rs/0.169.0 (Linux; x86_64) (codex-exec)",
        )
        .json(body)
        .send()
        .await
        .expect("send the Codex-shaped request");
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let text = response.text().await.expect("read the stream");
    assert_eq!(status, 200, "Codex-shaped request: {text}");
    assert!(
        content_type.starts_with("text/event-stream"),
        "content-type {content_type}: {text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "no [DONE]:\n{text}");
    assert_valid_sse(&text)
}

fn event<'a>(events: &'a [(String, Value)], name: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, v)| v)
        .collect()
}

#[tokio::test]
async fn codex_shaped_request_streams_with_namespace_tools() {
    let upstream = ScriptedUpstream::with_replies([
        upstream_reasoning_then_call(),
        upstream_text("README.md says hello."),
    ]);
    let stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;

    // ---- turn 1: the model thinks, then calls mcp_fs.read ----
    let context = user_message(
        "<environment_context>\n  <cwd>/work/project</cwd>\n  <approval_policy>never</approval_policy>\n  <sandbox_mode>read-only</sandbox_mode>\n  <shell>bash</shell>\n</environment_context>",
    );
    let ask = user_message("What does README.md say?");
    let events = codex_post(envoy, &codex_request(json!([context, ask]))).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"response.created"), "{names:?}");
    assert_eq!(names.last(), Some(&"response.completed"), "{names:?}");

    // What the upstream got: flattened namespace tools, no hosted tool, Chat fields only.
    let requests = upstream.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, "/v1/chat/completions");
    assert_eq!(
        requests[0].header("x-responses-model"),
        Some("gpt-oss-120b")
    );
    let chat = requests[0].json();
    let tool_names: Vec<&str> = chat["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        tool_names,
        ["shell", "mcp_fs__read"],
        "upstream tools: {chat}"
    );
    assert!(
        chat["tools"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["type"] == "function"),
        "only function tools upstream (web_search dropped): {chat}"
    );
    assert_eq!(
        chat["tools"][1]["function"]["parameters"]["required"],
        json!(["path"])
    );
    assert_eq!(chat["tool_choice"], "auto");
    assert_eq!(chat["parallel_tool_calls"], false);
    assert_eq!(chat["reasoning_effort"], "medium");
    assert_eq!(chat["stream"], true);
    assert_eq!(chat["stream_options"], json!({"include_usage": true}));
    let messages = chat["messages"].as_array().expect("messages");
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(messages[0]["content"], codex_instructions());
    assert_eq!(messages.len(), 3, "system + two user messages: {chat}");
    for key in [
        "instructions",
        "input",
        "include",
        "store",
        "reasoning",
        "prompt_cache_key",
        "max_output_tokens",
    ] {
        assert!(
            chat.get(key).is_none(),
            "`{key}` must not reach the upstream: {chat}"
        );
    }

    // What the client got: the call under its namespace, reasoning sealed for the next turn.
    let done: Vec<&Value> = event(&events, "response.output_item.done")
        .into_iter()
        .map(|e| &e["item"])
        .collect();
    assert_eq!(done.len(), 2, "a reasoning item and a call: {done:?}");
    let reasoning = done[0];
    assert_eq!(reasoning["type"], "reasoning");
    let sealed = reasoning["encrypted_content"].as_str().unwrap_or_default();
    assert!(
        !sealed.is_empty(),
        "include asked for encrypted_content: {reasoning}"
    );
    let call = done[1];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "read", "{call}");
    assert_eq!(call["namespace"], "mcp_fs", "{call}");
    assert_eq!(call["call_id"], "call_fs_1");
    assert_eq!(call["arguments"], "{\"path\":\"README.md\"}");
    for added in event(&events, "response.output_item.added") {
        if added["item"]["type"] == "function_call" {
            assert_eq!(added["item"]["name"], "read", "{added}");
            assert_eq!(added["item"]["namespace"], "mcp_fs", "{added}");
        }
    }
    let completed = &event(&events, "response.completed")[0]["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(
        completed["output"],
        json!(done),
        "terminal output == done items"
    );
    assert_eq!(completed["store"], false);
    assert_eq!(completed["parallel_tool_calls"], false);
    assert_eq!(completed["tool_choice"], "auto");
    assert_eq!(
        completed["prompt_cache_key"],
        "0199a0c4-5b8e-7b31-9d62-3f3a1c2b4d5e"
    );
    assert_eq!(completed["reasoning"]["effort"], "medium");
    assert_eq!(completed["usage"]["input_tokens"], 900);
    assert_eq!(completed["usage"]["output_tokens"], 20);

    // ---- turn 2: Codex sends everything back, with the call's output ----
    let output = json!({"type": "function_call_output", "call_id": "call_fs_1",
                        "output": "# Project\nhello"});
    let input = json!([context, ask, reasoning, call, output]);
    let events = codex_post(envoy, &codex_request(input)).await;
    assert_eq!(
        events.last().map(|(n, _)| n.as_str()),
        Some("response.completed")
    );
    let text: String = event(&events, "response.output_text.delta")
        .iter()
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(text, "README.md says hello.");

    let requests = upstream.requests();
    assert_eq!(requests.len(), 2);
    let chat = requests[1].json();
    let messages = chat["messages"].as_array().expect("messages");
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(
        roles,
        ["system", "user", "user", "assistant", "tool"],
        "{chat}"
    );
    let assistant = &messages[3];
    assert_eq!(
        assistant["tool_calls"][0]["function"]["name"], "mcp_fs__read",
        "the namespaced call goes back under its flat name: {chat}"
    );
    assert_eq!(assistant["tool_calls"][0]["id"], "call_fs_1");
    assert_eq!(
        assistant["reasoning_content"], "The user wants README.md; read it with mcp_fs.",
        "the sealed reasoning is restored for the upstream: {chat}"
    );
    assert_eq!(messages[4]["tool_call_id"], "call_fs_1");
    assert_eq!(messages[4]["content"], "# Project\nhello");
}

// ---- the request shape of the real Codex CLI 0.169.0 ----

/// What `codex exec` 0.169.0 sent (captured through this stack; long texts shortened): no
/// `instructions` (its base instructions are a `developer` message), items with ids,
/// `client_metadata`, a `namespace` of sub-agent tools, `web_search` with
/// `external_web_access`, `reasoning` without effort, and its own headers.
fn codex_0_169_request(extra_input: &[Value]) -> Value {
    let mut input = vec![
        json!({"type": "message", "id": "msg_f80511fc-d40c-520b-bec5-104beb6ee274", "role": "developer",
               "content": [{"type": "input_text", "text": codex_instructions()}]}),
        json!({"type": "message", "id": "msg_01a20233-b5d6-7602-a01b-51a4b55f4f66", "role": "developer",
               "content": [{"type": "input_text", "text": "<skills_instructions>\n## Skills\nNone.\n</skills_instructions>"}]}),
        json!({"type": "message", "id": "msg_01a20233-b5d6-7602-a01b-51bdaecc08d1", "role": "user",
               "content": [{"type": "input_text", "text": "<environment_context>\n  <cwd>/tmp/project</cwd>\n  <shell>bash</shell>\n</environment_context>"}]}),
        json!({"type": "message", "id": "msg_01a20233-b5df-78a2-9962-0c8335cd77a1", "role": "user",
               "content": [{"type": "input_text", "text": "say hi"}]}),
    ];
    input.extend(extra_input.iter().cloned());
    let agent_fn = |name: &str| {
        json!({"type": "function", "name": name, "description": format!("{name} a sub-agent."), "strict": false,
               "parameters": {"type": "object", "properties": {"id": {"type": "string"}},
                              "required": ["id"], "additionalProperties": false}})
    };
    json!({
        "model": "demo",
        "input": input,
        "tools": [
            {"type": "function", "name": "exec_command",
             "description": "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
             "strict": false,
             "parameters": {"type": "object",
                            "properties": {"cmd": {"type": "string", "description": "Shell command to execute."},
                                           "login": {"type": "boolean"},
                                           "sandbox_permissions": {"type": "string", "enum": ["use_default", "require_escalated"]},
                                           "yield_time_ms": {"type": "number"}},
                            "required": ["cmd"], "additionalProperties": false}},
            {"type": "function", "name": "write_stdin", "description": "Writes to a session.", "strict": false,
             "parameters": {"type": "object", "properties": {"session_id": {"type": "number"}, "chars": {"type": "string"}},
                            "required": ["session_id"], "additionalProperties": false}},
            {"type": "namespace", "name": "multi_agent_v1", "description": "Tools for spawning and managing sub-agents.",
             "tools": [agent_fn("spawn_agent"), agent_fn("wait_agent")]},
            {"type": "web_search", "external_web_access": false}
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "reasoning": {"summary": "auto"},
        "store": false,
        "stream": true,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "01a20233-b57f-7dd2-bccc-910ca071d72b",
        "client_metadata": {
            "x-codex-installation-id": "7eaf2d15-7915-4fa9-b321-ee0bcc6de630",
            "thread_id": "01a20233-b57f-7dd2-bccc-910ca071d72b",
            "turn_id": "01a20233-b594-7611-9301-d5311da31d6a",
            "session_id": "01a20233-b57f-7dd2-bccc-910ca071d72b"
        }
    })
}

async fn codex_0_169_post(envoy: &Envoy, body: &Value) -> Vec<(String, Value)> {
    let response = client()
        .post(envoy.url("/v1/responses"))
        .header("authorization", "Bearer x")
        .header("accept", "text/event-stream")
        .header("originator", "codex_exec")
        .header("session-id", "01a20233-b57f-7dd2-bccc-910ca071d72b")
        .header("thread-id", "01a20233-b57f-7dd2-bccc-910ca071d72b")
        .header(
            "x-client-request-id",
            "01a20233-b57f-7dd2-bccc-910ca071d72b",
        )
        .header("x-codex-beta-features", "remote_compaction_v2")
        .header(
            "x-codex-window-id",
            "01a20233-b57f-7dd2-bccc-910ca071d72b:0",
        )
        .header(
            "x-codex-turn-metadata",
            r#"{"request_kind":"turn","model":"demo"}"#,
        )
        .header(
            "user-agent",
            "codex_exec/0.169.0 (Debian 12.0.0; x86_64) xterm (codex_exec; 0.169.0)",
        )
        .json(body)
        .send()
        .await
        .expect("send the Codex 0.169 request");
    let status = response.status();
    let text = response.text().await.expect("read the stream");
    assert_eq!(status, 200, "Codex 0.169 request: {text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "no [DONE]:\n{text}");
    assert_valid_sse(&text)
}

/// The loop `codex exec "say hi"` ran against the demo: the demo calls Codex's first tool
/// (`exec_command`, `cmd` set to the demo's fixed string), Codex sends the command's output
/// back, the demo answers with text.
#[tokio::test]
async fn codex_0_169_request_shape_completes_a_tool_loop_with_the_demo() {
    let demo = DemoUpstream::start();
    let stack = Stack::start(demo.port(), &[]);
    let envoy = &stack.envoy;

    let events = codex_0_169_post(envoy, &codex_0_169_request(&[])).await;
    assert_eq!(
        events.last().map(|(n, _)| n.as_str()),
        Some("response.completed")
    );
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["status"], "completed");
    let output = completed["output"].as_array().expect("output");
    assert_eq!(output.len(), 1, "one call: {completed}");
    let call = &output[0];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "exec_command");
    assert!(call.get("namespace").is_none(), "{call}");
    assert_eq!(call["call_id"], common::upstream::demo::TOOL_CALL_ID);
    let arguments = json!({"cmd": common::upstream::demo::FIXED_STRING_ARG}).to_string();
    assert_eq!(call["arguments"], arguments.as_str());

    // Turn 2, as Codex sends it: the call as received, and its output with Codex's own id.
    let command_output = "Process exited with code 127\nOutput:\nbash: San: command not found\n";
    let turn2 = codex_0_169_request(&[
        call.clone(),
        json!({"type": "function_call_output", "id": "fco_01a20233-b821-7ac2-9b79-6320cc4a39b7",
               "call_id": call["call_id"], "output": command_output}),
    ]);
    let events = codex_0_169_post(envoy, &turn2).await;
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["status"], "completed", "{completed}");
    let text = completed["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    let normalised = command_output
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert_eq!(text, format!("The tool returned: {normalised}"));
}

// ---- the real Codex CLI 0.171.0 with `openai_base_url` ----

/// POSTs a recorded Codex 0.171 request (`tests/fixtures/codex/0.171-openai/<name>.json`) with
/// its recorded headers; the events of its stream.
async fn codex_0_171_post(envoy: &Envoy, name: &str) -> Vec<(String, Value)> {
    let mut request = client().post(envoy.url("/v1/responses"));
    for (k, v) in common::codex::headers(&format!("{name}.head")) {
        request = request.header(k, v);
    }
    let response = request
        .body(common::codex::body(&format!("{name}.json")))
        .send()
        .await
        .expect("send the recorded request");
    let status = response.status();
    let text = response.text().await.expect("read the stream");
    assert_eq!(status, 200, "{name}: {text}");
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "{name}: no [DONE]:\n{text}"
    );
    // Not schema-checked: custom tool calls are OpenAI's, not in the OpenResponses schema.
    common::sse::parse_sse_json(&text)
}

/// What Codex 0.171 sent when it believed it talked to OpenAI (`openai_base_url`: items with
/// `internal_chat_message_metadata_passthrough`, its tools in an `additional_tools` item),
/// over HTTP, replayed through Envoy + the demo: the turn gets the demo's call of Codex's
/// `exec`, the next request (the call and its output) a text; the upstream gets the Chat
/// request the snapshots state for each, none of Codex's bookkeeping in it.
#[tokio::test]
async fn codex_0_171_openai_mode_requests_complete_a_tool_loop_with_the_demo() {
    let demo = common::RecordingDemo::start();
    let stack = Stack::start(demo.port(), &[]);
    let envoy = &stack.envoy;

    let events = codex_0_171_post(envoy, "http-turn").await;
    let completed = &events.last().expect("events").1["response"];
    assert_eq!(completed["status"], "completed", "{completed}");
    let call = &completed["output"][0];
    assert_eq!(call["type"], "custom_tool_call", "{completed}");
    assert_eq!(call["name"], "exec");
    assert_eq!(call["namespace"], "functions");
    assert_eq!(call["call_id"], common::upstream::demo::TOOL_CALL_ID);
    assert_eq!(call["input"], common::upstream::demo::FIXED_STRING_ARG);

    let events = codex_0_171_post(envoy, "http-tool-output").await;
    let completed = &events.last().expect("events").1["response"];
    assert_eq!(completed["status"], "completed", "{completed}");
    let text = completed["output"][0]["content"][0]["text"]
        .as_str()
        .unwrap_or_default();
    assert!(
        text.starts_with("The tool returned: Script failed"),
        "{completed}"
    );

    let chats: Vec<Value> = demo
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .map(|r| r.json())
        .collect();
    assert_eq!(chats.len(), 2, "{chats:?}");
    for (chat, case) in chats.iter().zip(["http-turn", "http-tool-output"]) {
        assert!(!common::codex::has_bookkeeping(chat), "{case}: {chat}");
        assert!(
            *chat == common::codex::snapshot(case)["chat"],
            "{case}: the upstream got another Chat request than the snapshot's"
        );
    }
}

// ---- Codex's built-in tools and 2026 items, sent raw ----

/// A stream that says `text`, then calls `shell` and `apply_patch` (arguments in pieces).
fn upstream_text_then_builtin_calls() -> Reply {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-b1", "object": "chat.completion.chunk", "created": 1_700_000_000u64,
                   "model": "gpt-5.5", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let shell = json!({"commands": ["ls -la", "cat README.md"], "timeout_ms": 10000}).to_string();
    let patch =
        json!({"type": "update_file", "path": "README.md", "diff": "@@\n-hello\n+hello world"})
            .to_string();
    let (a, b) = shell.split_at(12);
    Reply::sse([
        chunk(
            json!({"role": "assistant", "content": "Let me look."}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_sh", "type": "function",
                   "function": {"name": "shell", "arguments": a}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": b}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 1, "id": "call_ap", "type": "function",
                   "function": {"name": "apply_patch", "arguments": patch}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        "data: [DONE]\n\n".to_string(),
    ])
}

/// Codex with OpenAI's built-in `shell` and `apply_patch` tools and a tool declared by an
/// `additional_tools` item: what the upstream gets (functions with the actions' parameters,
/// the calls and their outputs as tool calls and tool messages) and what the client gets
/// (the built-in call items and their events, the message before them as commentary).
#[tokio::test]
async fn codex_builtin_tools_round_trip_through_envoy() {
    let upstream = ScriptedUpstream::with_replies([
        upstream_text_then_builtin_calls(),
        upstream_text("Done."),
    ]);
    let stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;
    let tools =
        json!([{"type": "shell", "environment": {"type": "local"}}, {"type": "apply_patch"}]);
    let extra = json!({"type": "additional_tools", "role": "developer", "tools": [
        {"type": "function", "name": "view_image", "parameters": {"type": "object",
         "properties": {"path": {"type": "string"}}, "required": ["path"]}}]});
    let ask = user_message("Fix the README.");
    let request = |input: Value| {
        json!({"model": "gpt-5.5", "instructions": "You are Codex.", "input": input,
               "tools": tools, "tool_choice": "auto", "parallel_tool_calls": true,
               "reasoning": {"effort": "xhigh", "summary": "auto", "context": "all_turns"},
               "store": false, "stream": true, "service_tier": "fast",
               "include": ["reasoning.encrypted_content"]})
    };
    let response = client()
        .post(envoy.url("/v1/responses"))
        .json(&request(json!([ask, extra])))
        .send()
        .await
        .expect("turn 1");
    assert_eq!(response.status(), 200);
    let text = response.text().await.expect("turn 1 body");
    let events = common::sse::parse_sse_json(&text);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let shell_commands = [
        "response.shell_call_command.added",
        "response.shell_call_command.delta",
        "response.shell_call_command.done",
    ];
    assert_eq!(
        names.iter().filter(|n| shell_commands.contains(n)).count(),
        6,
        "two commands, three events each: {names:?}"
    );
    let completed = &event(&events, "response.completed")[0]["response"];
    let output = completed["output"].as_array().expect("output");
    let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["message", "shell_call", "apply_patch_call"],
        "{completed}"
    );
    assert_eq!(output[0]["phase"], "commentary");
    assert_eq!(
        output[1]["action"],
        json!({"commands": ["ls -la", "cat README.md"], "timeout_ms": 10000, "max_output_length": null})
    );
    assert_eq!(output[2]["operation"]["type"], "update_file");
    assert_eq!(completed["service_tier"], "fast");
    assert_eq!(completed["reasoning"]["effort"], "xhigh");

    // What the upstream got: the built-ins as functions, the additional tool with them.
    let chat = upstream.requests()[0].json();
    let tool_names: Vec<&str> = chat["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(tool_names, ["shell", "apply_patch", "view_image"], "{chat}");
    assert_eq!(
        chat["tools"][0]["function"]["parameters"]["required"],
        json!(["commands"])
    );
    assert_eq!(chat["reasoning_effort"], "xhigh");
    assert!(chat.get("service_tier").is_none(), "{chat}");

    // Turn 2: the items back as the client got them, with the built-ins' outputs.
    let outputs = json!([
        {"type": "shell_call_output", "call_id": "call_sh", "output": [
            {"stdout": "README.md\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]},
        {"type": "apply_patch_call_output", "call_id": "call_ap", "status": "completed"}]);
    let mut input = vec![ask.clone(), extra.clone()];
    input.extend(output.iter().cloned());
    input.extend(outputs.as_array().unwrap().iter().cloned());
    let response = client()
        .post(envoy.url("/v1/responses"))
        .json(&request(Value::Array(input)))
        .send()
        .await
        .expect("turn 2");
    assert_eq!(response.status(), 200);
    let text = response.text().await.expect("turn 2 body");
    assert!(text.contains("event: response.completed"), "{text}");
    let chat = upstream.requests()[1].json();
    let messages = chat["messages"].as_array().expect("messages");
    let roles: Vec<&str> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "tool"],
        "{chat}"
    );
    assert_eq!(messages[2]["content"], "Let me look.");
    let calls = messages[2]["tool_calls"].as_array().expect("tool calls");
    assert_eq!(calls[0]["function"]["name"], "shell");
    assert_eq!(
        calls[0]["function"]["arguments"],
        json!({"commands": ["ls -la", "cat README.md"], "timeout_ms": 10000}).to_string()
    );
    assert_eq!(calls[1]["function"]["name"], "apply_patch");
    assert_eq!(messages[3]["tool_call_id"], "call_sh");
    assert_eq!(
        messages[3]["content"],
        "[{\"stdout\":\"README.md\\n\",\"stderr\":\"\",\"outcome\":{\"type\":\"exit\",\"exit_code\":0}}]"
    );
    assert_eq!(
        messages[4]["content"],
        "{\"status\":\"completed\",\"output\":null}"
    );

    // A computer tool is refused before the upstream is asked.
    let response = client()
        .post(envoy.url("/v1/responses"))
        .json(&json!({"model": "gpt-5.5", "input": "click", "tools": [{"type": "computer"}]}))
        .send()
        .await
        .expect("computer");
    assert_eq!(response.status(), 400);
    let body: Value = response.json().await.expect("envelope");
    assert_eq!(body["error"]["code"], "unsupported_tool", "{body}");
    assert_eq!(upstream.requests().len(), 2);
}
