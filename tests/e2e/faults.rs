//! Upstream, processor and Envoy faults, end to end through a real Envoy and the
//! translator (either mode, `tests/common/stack.rs`; the processor's own faults in ext_proc
//! mode, a panic in both). Each test pins down what the client sees when something breaks
//! (an error envelope, a failed stream, or a cut stream where Envoy gives the processor no
//! chance to answer), and that the next request through the same Envoy works.
//! `docs/limits-and-failures.md` tabulates the outcomes and the Envoy settings that shape
//! them.
//!
//! Timeouts are shortened by substituting the repository's settings in the generated Envoy
//! config (`stream_idle_timeout: 300s` → 2 s, `message_timeout: 5s` → 1 s), so the file runs in
//! well under a minute.

use crate::common;

use std::io::Read;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::schema::assert_valid_sse;
use common::sse::parse_sse;
use common::{
    client, free_port, log_tail, port_accepts, wait_until, Envoy, Gate, Reply, ScriptedUpstream,
    Stack, TempDir,
};
use serde_json::{json, Value};

/// Longest any single client read may take (the stalls below last 2 s).
const TIMEOUT: Duration = Duration::from_secs(15);
/// The shortened `stream_idle_timeout` of the stall tests.
const IDLE_TIMEOUT: &str = "2s";

// ---- upstream answers ----

fn chunk(text: &str) -> String {
    let chunk = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]});
    format!("data: {chunk}\n\n")
}

fn finish_chunk() -> String {
    let chunk = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
    format!("data: {chunk}\n\n")
}

const DONE: &str = "data: [DONE]\n\n";

/// A complete, well-formed streamed answer: "Hello".
fn good_stream() -> Reply {
    Reply::sse([chunk("Hel"), chunk("lo"), finish_chunk(), DONE.to_string()])
}

fn completion(text: &str) -> Value {
    json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
}

fn json_request() -> Value {
    json!({"model": "m", "input": "hi"})
}

fn stream_request() -> Value {
    json!({"model": "m", "input": "hi", "stream": true})
}

// ---- the client side ----

/// Everything the client got: status, content type, the body bytes that arrived, and how the
/// body ended (`None`: cleanly; `Some(error)`: the connection was cut).
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: Option<String>,
    body: String,
    cut: Option<String>,
    elapsed: Duration,
}

impl Answer {
    /// The `error` object of an error envelope, after checking the envelope's shape.
    #[track_caller]
    fn envelope(&self, status: u16, kind: &str, code: &str) -> Value {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.content_type.as_deref(),
            Some("application/json"),
            "{self:?}"
        );
        assert!(self.cut.is_none(), "{self:?}");
        let v: Value = common::json::parse_strict(&self.body)
            .unwrap_or_else(|e| panic!("not strict JSON ({e}): {self:?}"));
        let error = v["error"].clone();
        assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{v}");
        assert_eq!(error["type"], kind, "{v}");
        assert_eq!(error["code"], code, "{v}");
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert!(error.get("param").is_some(), "{v}");
        error
    }

    /// The names of the complete SSE events that arrived (`[DONE]` included as `[DONE]`).
    fn event_names(&self) -> Vec<String> {
        parse_sse(&self.body)
            .into_iter()
            .map(|e| {
                if e.data == "[DONE]" {
                    return "[DONE]".to_string();
                }
                e.event.unwrap_or_default()
            })
            .collect()
    }

    /// A stream cut by Envoy: 200 with SSE headers, some events, then the body breaks off
    /// without a terminal event or `[DONE]`.
    #[track_caller]
    fn assert_cut_stream(&self) {
        assert_eq!(self.status, 200, "{self:?}");
        assert_eq!(
            self.content_type.as_deref(),
            Some("text/event-stream"),
            "{self:?}"
        );
        assert!(self.cut.is_some(), "the body should break off: {self:?}");
        let names = self.event_names();
        assert_eq!(
            names.first().map(String::as_str),
            Some("response.created"),
            "{names:?}"
        );
        for terminal in [
            "response.completed",
            "response.failed",
            "response.incomplete",
            "[DONE]",
        ] {
            assert!(
                !names.iter().any(|n| n == terminal),
                "{terminal} in {names:?}"
            );
        }
    }
}

/// A response being read.
struct Reading {
    status: u16,
    content_type: Option<String>,
    response: reqwest::Response,
    body: Vec<u8>,
    started: Instant,
}

impl Reading {
    async fn start(envoy: &Envoy, body: &Value) -> Reading {
        let started = Instant::now();
        let response = client()
            .post(envoy.url("/v1/responses"))
            .json(body)
            .timeout(TIMEOUT)
            .send()
            .await
            .expect("send the request");
        Reading::new(response, started)
    }

    fn new(response: reqwest::Response, started: Instant) -> Reading {
        Reading {
            status: response.status().as_u16(),
            content_type: response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            response,
            body: Vec::new(),
            started,
        }
    }

    /// Reads on until the body holds `needle` (e.g. a delta: the stream is under way).
    async fn until(&mut self, needle: &str) {
        while !String::from_utf8_lossy(&self.body).contains(needle) {
            let chunk = tokio::time::timeout(TIMEOUT, self.response.chunk())
                .await
                .unwrap_or_else(|_| panic!("no {needle} within {TIMEOUT:?}"))
                .expect("body")
                .unwrap_or_else(|| panic!("the body ended before {needle}"));
            self.body.extend_from_slice(&chunk);
        }
    }

    /// Reads to the end of the body, or until the connection is cut.
    async fn finish(mut self) -> Answer {
        let cut = loop {
            match tokio::time::timeout(TIMEOUT, self.response.chunk()).await {
                Err(_) => panic!(
                    "no end of body within {TIMEOUT:?}; got {}",
                    String::from_utf8_lossy(&self.body)
                ),
                Ok(Ok(Some(c))) => self.body.extend_from_slice(&c),
                Ok(Ok(None)) => break None,
                Ok(Err(e)) => break Some(format!("{e:?}")),
            }
        };
        Answer {
            status: self.status,
            content_type: self.content_type,
            body: String::from_utf8_lossy(&self.body).into_owned(),
            cut,
            elapsed: self.started.elapsed(),
        }
    }
}

async fn read_answer(response: reqwest::Response, started: Instant) -> Answer {
    Reading::new(response, started).finish().await
}

async fn post(envoy: &Envoy, body: &Value) -> Answer {
    Reading::start(envoy, body).await.finish().await
}

/// The next request after a fault: a JSON and a streamed request both succeed.
async fn assert_next_requests_work(envoy: &Envoy, upstream: &ScriptedUpstream) {
    upstream.push(Reply::json(200, &completion("ok")));
    let answer = post(envoy, &json_request()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let v: Value = serde_json::from_str(&answer.body).expect("JSON answer");
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["output"][0]["content"][0]["text"], "ok", "{v}");

    upstream.push(good_stream());
    let answer = post(envoy, &stream_request()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.cut.is_none(), "{answer:?}");
    let events = assert_valid_sse(&answer.body);
    assert_eq!(
        events.last().map(|(n, _)| n.as_str()),
        Some("response.completed")
    );
    assert!(answer.body.ends_with(DONE));
}

/// The bootstrap with each `(from, to)` substituted (each `from` exactly once).
fn substitute(mut config: String, substitutions: &[(&str, &str)]) -> String {
    for (from, to) in substitutions {
        assert_eq!(
            config.matches(from).count(),
            1,
            "the Envoy config must contain `{from}` exactly once"
        );
        config = config.replace(from, to);
    }
    config
}

/// The bootstrap with every connection manager's `stream_idle_timeout: 300s` at
/// [`IDLE_TIMEOUT`]: the listener's, and in module mode the internal listener's, which the
/// WebSocket transport's Chat requests enter (one for each connection manager, as the file
/// holds).
fn shorter_idle(config: String) -> String {
    let from = "stream_idle_timeout: 300s";
    let managers = config
        .matches("- name: envoy.filters.network.http_connection_manager")
        .count();
    assert_eq!(
        config.matches(from).count(),
        managers,
        "the Envoy config must contain `{from}` once per connection manager"
    );
    config.replace(from, &format!("stream_idle_timeout: {IDLE_TIMEOUT}"))
}

/// Waits until the translator logs a cut exchange (on a line holding `request_id`). Polled
/// asynchronously: closing a dropped client connection is a task of the test's runtime.
async fn wait_for_log(stack: &Stack, request_id: &str) {
    let deadline = Instant::now() + TIMEOUT;
    while !stack.translator_logs().lines().any(|l| {
        l.contains(request_id)
            && l.contains("exchange ended by Envoy before its answer was complete")
    }) {
        assert!(
            Instant::now() < deadline,
            "the translator did not log the cut exchange:\n{}",
            tail(&stack.translator_logs())
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The translator (the processor, or Envoy with the module) still runs and never panicked.
#[track_caller]
fn assert_alive(stack: &mut Stack) {
    assert!(stack.translator_running(), "the translator exited");
    let logs = stack.translator_logs();
    assert!(
        !logs.contains("panic"),
        "the translator panicked:\n{}",
        tail(&logs)
    );
}

fn tail(s: &str) -> &str {
    let mut start = s.len().saturating_sub(3000);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

// ---- a switchable TCP front for the upstream cluster ----

#[derive(Clone, Copy)]
enum Mode {
    /// Accept and read, never answer.
    BlackHole,
    /// Relay bytes to 127.0.0.1:port.
    Forward(u16),
}

/// The port Envoy's upstream cluster points at. Until [`Front::listen`] nothing listens there
/// (connections are refused); then it is a black hole or a relay to a [`ScriptedUpstream`],
/// switchable at any time. Stopped on Drop.
struct Front {
    port: u16,
    mode: Arc<Mutex<Mode>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Front {
    fn unbound() -> Front {
        Front {
            port: free_port(),
            mode: Arc::new(Mutex::new(Mode::BlackHole)),
            stop: Arc::default(),
            thread: None,
        }
    }

    fn set(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    fn listen(&mut self, mode: Mode) {
        self.set(mode);
        let listener = TcpListener::bind(("127.0.0.1", self.port))
            .unwrap_or_else(|e| panic!("bind the reserved port {}: {e}", self.port));
        listener.set_nonblocking(true).expect("nonblocking");
        let (mode, stop) = (self.mode.clone(), self.stop.clone());
        self.thread = Some(std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        conn.set_nonblocking(false).expect("blocking");
                        let mode = *mode.lock().unwrap();
                        std::thread::spawn(move || serve(conn, mode));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        }));
    }
}

fn serve(mut conn: TcpStream, mode: Mode) {
    match mode {
        Mode::BlackHole => {
            let mut sink = [0u8; 4096];
            while matches!(conn.read(&mut sink), Ok(n) if n > 0) {}
        }
        Mode::Forward(port) => {
            let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", port)) else {
                return;
            };
            let (Ok(mut conn2), Ok(mut upstream2)) = (conn.try_clone(), upstream.try_clone())
            else {
                return;
            };
            let up = std::thread::spawn(move || {
                let _ = std::io::copy(&mut conn2, &mut upstream2);
                let _ = upstream2.shutdown(Shutdown::Write);
            });
            let _ = std::io::copy(&mut upstream, &mut conn);
            let _ = conn.shutdown(Shutdown::Write);
            let _ = up.join();
        }
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

// ---- a processor the test can kill, freeze and restart on the same port ----

/// The `responses-extproc` binary on a fixed port (the harness's `Processor` picks a new port
/// on each start; a restart must come back where Envoy's `extproc` cluster points).
struct OwnProcessor {
    child: Child,
    /// Holds the log; handed to the next process on a restart.
    dir: Option<TempDir>,
}

impl OwnProcessor {
    fn start(port: u16, dir: TempDir) -> OwnProcessor {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.path().join("processor.log"))
            .expect("open processor log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_responses-extproc"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .spawn()
            .expect("spawn responses-extproc");
        wait_until("responses-extproc to listen", TIMEOUT, || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "responses-extproc exited ({status}):\n{}",
                    log_tail(&dir.path().join("processor.log"), 3000)
                );
            }
            port_accepts(port).then_some(())
        });
        OwnProcessor {
            child,
            dir: Some(dir),
        }
    }

    /// Sends a signal; for `-STOP`, also waits until every thread of the process is stopped
    /// (`kill` returns before that, and a loaded machine may let the process run on for
    /// milliseconds: long enough to serve the request meant to find it frozen).
    fn signal(&self, signal: &str) {
        let pid = self.child.id();
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed");
        if signal == "-STOP" {
            wait_until("the processor to stop", TIMEOUT, || {
                all_threads_stopped(pid).then_some(())
            });
        }
    }

    /// SIGKILL: no drain, open gRPC streams die with the process.
    fn kill(mut self) -> TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.dir.take().expect("the log directory")
    }

    fn logs(&self) -> String {
        let dir = self.dir.as_ref().expect("the log directory");
        log_tail(&dir.path().join("processor.log"), 100_000)
    }
}

/// Whether every thread of process `pid` is in state `T` (stopped), per `/proc` (Linux).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            return false;
        };
        // `pid (comm) state ...`: the state follows the last ')'.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next());
        if !matches!(state, Some("T" | "t")) {
            return false;
        }
        any = true;
    }
    any
}

impl Drop for OwnProcessor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- the faults ----

/// Nothing listens on the upstream port: Envoy's connect fails, it answers 503 itself, and the
/// processor turns that into an envelope (JSON and stream requests alike: no stream has
/// started). Once the upstream is up, the next request works.
#[tokio::test]
async fn upstream_refusing_connections_gets_503_envelopes() {
    let upstream = ScriptedUpstream::start();
    let mut front = Front::unbound();
    let mut stack = Stack::start(front.port, &[]);
    let envoy = &stack.envoy;

    for request in [json_request(), stream_request()] {
        let answer = post(envoy, &request).await;
        let error = answer.envelope(503, "server_error", "upstream_unavailable");
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("connect"), "{message}");
    }

    front.listen(Mode::Forward(upstream.port()));
    assert_next_requests_work(envoy, &upstream).await;
    assert_eq!(upstream.requests().len(), 2);
    assert_alive(&mut stack);
}

/// The upstream closes the connection in the middle of an SSE body. Envoy resets the
/// client's stream at once and does not ask the processor, which never sees an end of body:
/// the client gets 200, the events translated so far, then a cut body (no terminal event, no
/// `[DONE]`). Contrast: an upstream body that ends cleanly but early (no finish_reason, no
/// `[DONE]`) does reach the processor, and becomes `response.failed`
/// (`upstream_stream_truncated`) + `[DONE]`. In the middle of a JSON answer (whose headers the
/// processor holds while it buffers the body), the reset makes Envoy reply 502 directly,
/// bypassing the processor: plain text, not an envelope.
#[tokio::test]
async fn upstream_reset_mid_stream_cuts_the_client_stream() {
    let upstream = ScriptedUpstream::with_replies([
        // Closed 200 ms after the last chunk: the events are through by then.
        Reply::sse([chunk("Hel"), chunk("lo")])
            .with_delay(Duration::from_millis(200))
            .then_close(),
        Reply::sse([chunk("Hel"), chunk("lo")]),
        Reply::close_mid_body(200, "application/json", r#"{"choices":"#),
    ]);
    let mut stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;

    let cut = post(envoy, &stream_request()).await;
    cut.assert_cut_stream();
    assert!(cut.body.contains("\"delta\":\"lo\""), "{cut:?}");

    let early = post(envoy, &stream_request()).await;
    assert_eq!(early.status, 200, "{early:?}");
    assert!(early.cut.is_none(), "{early:?}");
    let events = assert_valid_sse(&early.body);
    let (last, failed) = events.last().expect("events");
    assert_eq!(last, "response.failed");
    assert_eq!(
        failed["response"]["error"]["code"],
        "upstream_stream_truncated"
    );
    assert!(events.iter().any(|(n, _)| n == "error"));
    assert!(early.body.ends_with(DONE));

    // Envoy replies directly (the processor holds the answer's head): the shipped
    // local_reply_config makes it an envelope.
    let json = post(envoy, &json_request()).await;
    let error = json.envelope(502, "server_error", "bad_gateway");
    assert!(
        error["message"].as_str().unwrap().contains("reset"),
        "{json:?}"
    );

    assert_next_requests_work(envoy, &upstream).await;
    assert_alive(&mut stack);
    // The cut exchange is visible in the translator's log.
    wait_for_log(&stack, "").await;
}

/// The upstream goes silent for longer than `stream_idle_timeout` (2 s here; 300 s in
/// envoy.yaml). What the client gets depends on how far the answer got:
/// * no response headers yet (JSON or stream request): Envoy's 504 "stream timeout" goes
///   through the filter chain, so the processor answers a 504 envelope `upstream_timeout`;
/// * headers received, JSON body being gathered by the processor: Envoy replies 504
///   *directly*, bypassing ext_proc (the processor still holds the headers); the shipped
///   local_reply_config makes it the same envelope;
/// * SSE stream under way: the headers went out long ago, so Envoy can only reset the stream:
///   a cut stream, as for an upstream reset.
#[tokio::test]
async fn upstream_stalling_past_stream_idle_timeout() {
    let upstream = ScriptedUpstream::start();
    let mut front = Front::unbound();
    front.listen(Mode::BlackHole);
    let mut stack = Stack::start_with(front.port, &[], shorter_idle);
    let envoy = &stack.envoy;

    // No headers: the upstream accepted the connection and never answers.
    let (json_body, stream_body) = (json_request(), stream_request());
    let (json, stream) = tokio::join!(post(envoy, &json_body), post(envoy, &stream_body));
    for answer in [&json, &stream] {
        let error = answer.envelope(504, "server_error", "upstream_timeout");
        assert!(error["message"].as_str().unwrap().contains("timeout"));
        assert!(answer.elapsed >= Duration::from_millis(1900), "{answer:?}");
    }

    // Headers, then silence.
    front.set(Mode::Forward(upstream.port()));
    let (json_gate, stream_gate) = (Gate::new(), Gate::new());
    let body = completion("late").to_string();
    let (head, rest) = body.split_at(20);
    upstream.push(
        Reply::sse([head.to_string(), rest.to_string()])
            .header("content-type", "application/json")
            .pause_after(1, &json_gate),
    );
    upstream.push(
        Reply::sse([chunk("Hel"), chunk("lo"), finish_chunk(), DONE.to_string()])
            .pause_after(2, &stream_gate),
    );
    let json = post(envoy, &json_request()).await;
    let stream = post(envoy, &stream_request()).await;
    json_gate.release();
    stream_gate.release();

    json.envelope(504, "server_error", "upstream_timeout");
    stream.assert_cut_stream();
    assert!(
        stream.body.contains("\"delta\":\"Hel\""),
        "events before the stall arrive: {stream:?}"
    );
    assert!(stream.elapsed >= Duration::from_millis(1900), "{stream:?}");

    assert_next_requests_work(envoy, &upstream).await;
    assert_alive(&mut stack);
}

/// The shipped `local_reply_config` (each mode's file) turns Envoy's direct replies, which
/// bypass the translator, into envelopes: the idle timeout and an upstream reset while the
/// translator holds a JSON answer's headers; ext_proc mode also the 504 of a processor that
/// does not answer and the 500 of a processor that is down. Replies that do pass the
/// translator keep the codes it gives them, and other traffic keeps Envoy's own replies.
#[tokio::test]
async fn shipped_local_reply_config_makes_direct_replies_envelopes() {
    let upstream = ScriptedUpstream::start();
    let mut front = Front::unbound();
    front.listen(Mode::BlackHole);
    let shorter = [("message_timeout: 5s", "message_timeout: 1s")];
    // ext_proc: a processor the test can freeze and kill; module: the translator is Envoy.
    let (processor, envoy) = match common::mode() {
        common::Mode::ExtProc => {
            let processor_port = free_port();
            let processor = OwnProcessor::start(processor_port, TempDir::new("faults-processor"));
            let config = common::envoy::test_config(front.port, processor_port);
            (
                Some(processor),
                Envoy::start_with_config(&substitute(shorter_idle(config), &shorter)),
            )
        }
        common::Mode::Module => {
            let stack = Stack::start_with(front.port, &[], shorter_idle);
            (None, stack.envoy)
        }
    };

    // Through the translator (no response headers yet): the same code as without the mapper.
    let no_headers = post(&envoy, &json_request()).await;
    no_headers.envelope(504, "server_error", "upstream_timeout");

    // Direct replies while the translator holds a JSON answer's headers: now envelopes.
    front.set(Mode::Forward(upstream.port()));
    let gate = Gate::new();
    upstream.push(
        Reply::sse(["{\"choices\":", "[]}"])
            .header("content-type", "application/json")
            .pause_after(1, &gate),
    );
    let stalled = post(&envoy, &json_request()).await;
    gate.release();
    stalled.envelope(504, "server_error", "upstream_timeout");
    upstream.push(Reply::close_mid_body(
        200,
        "application/json",
        r#"{"choices":"#,
    ));
    let reset = post(&envoy, &json_request()).await;
    let error = reset.envelope(502, "server_error", "bad_gateway");
    assert!(
        error["message"].as_str().unwrap().contains("reset"),
        "{error}"
    );

    // The translator's own envelopes (ext_proc immediate responses, the module's local
    // replies: both count as Envoy local replies) come through unchanged: no mapper matches.
    upstream.push(Reply::json(500, &json!({"error": {"message": "boom"}})));
    let upstream_500 = post(&envoy, &json_request()).await;
    let error = upstream_500.envelope(500, "server_error", "server_error");
    assert_eq!(error["message"], "boom");
    upstream.push(Reply::json(200, &completion("not a stream")));
    post(&envoy, &stream_request()).await.envelope(
        502,
        "server_error",
        "upstream_invalid_response",
    );
    let error = post(&envoy, &json!({"model": "m"})).await.envelope(
        400,
        "invalid_request_error",
        "missing_required_parameter",
    );
    assert_eq!(error["param"], "input");
    assert_next_requests_work(&envoy, &upstream).await;

    let Some(processor) = processor else {
        eprintln!(
            "module mode: no processor to freeze or kill (the processor cases are ext_proc's)"
        );
        return;
    };
    // The processor hangs: Envoy's 504 after message_timeout is an envelope.
    processor.signal("-STOP");
    let frozen = post(&envoy, &json_request()).await;
    processor.signal("-CONT");
    frozen.envelope(504, "server_error", "processor_timeout");
    assert_next_requests_work(&envoy, &upstream).await;

    // The processor is down: Envoy's 500 is an envelope. Other traffic does not need the
    // processor, and keeps the upstream's own answers.
    let _dir = processor.kill();
    let down = post(&envoy, &json_request()).await;
    down.envelope(500, "server_error", "processor_unavailable");
    let seen = upstream.requests().len();
    let started = Instant::now();
    let other = client()
        .get(envoy.url("/v1/models"))
        .send()
        .await
        .expect("send");
    let other = read_answer(other, started).await;
    assert_eq!(upstream.requests().len(), seen + 1, "{other:?}");
    assert!(!other.body.contains("processor_unavailable"), "{other:?}");
}

/// Envoy refuses a header the translation sets, with a config the core cannot see coming:
/// the client gets an error envelope, never Envoy's empty 500, and the upstream gets nothing.
/// ext_proc: Envoy checks the processor's header edits and fails the request when one breaks
/// its rules (a `mutation_rules` that forbids the model header, with `disallow_is_error`), its
/// header limits (`max_request_headers_kb` of 1 KiB and a model of 900 bytes) or holds a
/// control character (a Chat path with one: the settings take any absolute path); the shipped
/// `local_reply_config` makes each of those replies a 500 `internal_error` envelope. Module:
/// Envoy takes the filter's edits as they are (the ABI's call only fails where Envoy has no
/// header map: `module/src/tests.rs` covers that); the limit is not checked on them, and a
/// Chat path Envoy cannot send is refused when Envoy sends the request upstream, its 503
/// passing the filter's answer hooks, which make it an envelope.
#[tokio::test]
async fn a_header_envoy_refuses_ends_in_an_envelope_never_an_empty_500() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| Reply::json(200, &completion("ok")));
    let big_model = "m".repeat(900);
    let long_model = json!({"model": big_model, "input": "hi"});
    let is_ext_proc = common::mode() == common::Mode::ExtProc;

    // A Chat path holding a control character (U+0001).
    let stack = Stack::start(
        upstream.port(),
        &["--chat-path", "/v1/chat/completions\u{1}"],
    );
    let answer = post(&stack.envoy, &json_request()).await;
    if is_ext_proc {
        let error = answer.envelope(500, "server_error", "internal_error");
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains("refused a header"),
            "{error}"
        );
    } else {
        let error = answer.envelope(503, "server_error", "upstream_unavailable");
        assert!(
            error["message"].as_str().unwrap().contains(":path"),
            "{error}"
        );
    }
    drop(stack);
    assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());

    // A header limit the model header takes the request over.
    let limit = (
        "          stat_prefix: responses\n",
        "          stat_prefix: responses\n          max_request_headers_kb: 1\n",
    );
    let stack = Stack::start_with(upstream.port(), &[], |c| substitute(c, &[limit]));
    let answer = post(&stack.envoy, &long_model).await;
    if is_ext_proc {
        answer.envelope(500, "server_error", "internal_error");
        assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());
    } else {
        // Not checked on the module's edits: translated and answered.
        assert_eq!(answer.status, 200, "{answer:?}");
        let at_upstream = upstream.requests();
        assert_eq!(at_upstream.len(), 1, "{at_upstream:?}");
        assert_eq!(
            at_upstream[0].header("x-responses-model"),
            Some(big_model.as_str())
        );
    }
    drop(stack);

    if !common::only_ext_proc("mutation_rules are the ext_proc filter's") {
        return;
    }
    let before = upstream.requests().len();
    let rules = (
        "              route_cache_action: CLEAR\n",
        "              route_cache_action: CLEAR\n              mutation_rules:\n                disallow_expression: {regex: \"x-responses-model\"}\n                disallow_is_error: true\n",
    );
    let stack = Stack::start_with(upstream.port(), &[], |c| substitute(c, &[rules]));
    for body in [json_request(), stream_request()] {
        post(&stack.envoy, &body)
            .await
            .envelope(500, "server_error", "internal_error");
    }
    assert_eq!(upstream.requests().len(), before);
    // Other traffic keeps Envoy's and the upstream's own answers.
    let other = client()
        .get(stack.envoy.url("/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 200);
}

/// A stream was asked for, the upstream answered 200 with something else (JSON, plain
/// text): no stream has started, so the client gets a 502 envelope `upstream_invalid_response`.
#[tokio::test]
async fn stream_request_answered_without_sse_gets_502() {
    let upstream = ScriptedUpstream::with_replies([
        Reply::json(200, &completion("not a stream")),
        Reply::raw(200, "text/plain", "hello"),
    ]);
    let mut stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;
    for _ in 0..2 {
        let answer = post(envoy, &stream_request()).await;
        answer.envelope(502, "server_error", "upstream_invalid_response");
    }
    assert_next_requests_work(envoy, &upstream).await;
    assert_alive(&mut stack);
}

/// One SSE event larger than `--max-sse-frame-bytes` (1 KiB here): the processor stops
/// holding it and ends the stream with `error` + `response.failed`
/// (`upstream_event_too_large`) + `[DONE]`; the rest of the upstream body is ignored.
#[tokio::test]
async fn oversized_sse_event_fails_the_stream() {
    let huge = chunk(&"x".repeat(4096));
    let upstream = ScriptedUpstream::with_replies([Reply::sse([
        chunk("Hel"),
        huge,
        chunk("lo"),
        finish_chunk(),
        DONE.to_string(),
    ])]);
    let mut stack = Stack::start(upstream.port(), &["--max-sse-frame-bytes", "1024"]);
    let envoy = &stack.envoy;

    let answer = post(envoy, &stream_request()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.cut.is_none(), "{answer:?}");
    let events = assert_valid_sse(&answer.body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let n = names.len();
    assert_eq!(names[n - 2..], ["error", "response.failed"], "{names:?}");
    assert_eq!(events[n - 2].1["error"]["code"], "upstream_event_too_large");
    let failed = &events[n - 1].1["response"];
    assert_eq!(failed["status"], "failed");
    assert_eq!(failed["error"]["code"], "upstream_event_too_large");
    // The text before the oversized event was delivered, and closed as incomplete.
    assert_eq!(failed["output"][0]["status"], "incomplete");
    assert_eq!(failed["output"][0]["content"][0]["text"], "Hel");
    assert!(answer.body.ends_with(DONE));
    assert!(!answer.body.contains("\"delta\":\"lo\""));

    assert_next_requests_work(envoy, &upstream).await;
    assert_alive(&mut stack);
}

/// A JSON answer larger than `--max-body-bytes` (2 KiB here): the processor does not
/// translate it and answers a 502 envelope `upstream_response_too_large`. (Envoy hands the
/// buffered answer over in one message: the cap must hold for that message too.)
#[tokio::test]
async fn oversized_json_answer_gets_502() {
    let upstream =
        ScriptedUpstream::with_replies([Reply::json(200, &completion(&"x".repeat(4096)))]);
    let mut stack = Stack::start(upstream.port(), &["--max-body-bytes", "2048"]);
    let envoy = &stack.envoy;
    let answer = post(envoy, &json_request()).await;
    answer.envelope(502, "server_error", "upstream_response_too_large");
    assert_next_requests_work(envoy, &upstream).await;
    assert_alive(&mut stack);
}

/// Upstream errors keep their status and message, for JSON and stream requests alike (no
/// stream has started when the error status arrives); a numeric code becomes its status's
/// word (tests/e2e/upstream_errors.rs has every recorded server shape).
#[tokio::test]
async fn upstream_429_and_500_keep_status_and_message() {
    let rate_limited = || {
        Reply::json(
            429,
            &json!({"error": {"message": "Rate limit reached for m", "type": "rate_limit",
                "param": null, "code": "rate_limit_exceeded"}}),
        )
    };
    // vLLM's error shape.
    let crashed = || {
        Reply::json(
            500,
            &json!({"object": "error", "message": "CUDA out of memory",
                "type": "InternalServerError", "param": null, "code": 500}),
        )
    };
    let upstream =
        ScriptedUpstream::with_replies([rate_limited(), rate_limited(), crashed(), crashed()]);
    let mut stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;
    for request in [json_request(), stream_request()] {
        let answer = post(envoy, &request).await;
        let error = answer.envelope(429, "rate_limit_error", "rate_limit_exceeded");
        assert_eq!(error["message"], "Rate limit reached for m");
    }
    for request in [json_request(), stream_request()] {
        let answer = post(envoy, &request).await;
        let error = answer.envelope(500, "server_error", "server_error");
        assert_eq!(error["message"], "CUDA out of memory");
    }
    assert_next_requests_work(envoy, &upstream).await;
    assert_alive(&mut stack);
}

/// The processor dies while Envoy runs (failure_mode_allow: false):
/// * a stream in flight is cut (its headers went out, Envoy can only reset it);
/// * during the outage every request, translated or not, gets Envoy's 500 with an empty body
///   (no envelope: the processor is what makes envelopes) and nothing reaches the upstream;
/// * restarted on the same port, the very next request works (Envoy reconnects per request);
/// * a processor that hangs (SIGSTOP) instead: each request fails after `message_timeout`
///   (1 s here, 5 s in envoy.yaml) with Envoy's 504, and works again once it resumes.
///
/// Module mode has no processor to lose; its counterpart is
/// `a_panic_fails_one_exchange_and_the_translator_keeps_serving` (both modes).
#[tokio::test]
async fn processor_killed_restarted_and_frozen() {
    if !common::only_ext_proc("the processor's own faults (killed, restarted, frozen)") {
        return;
    }
    let upstream = ScriptedUpstream::start();
    let port = free_port();
    let processor = OwnProcessor::start(port, TempDir::new("faults-processor"));
    let config = substitute(
        common::envoy::test_config(upstream.port(), port),
        &[("message_timeout: 5s", "message_timeout: 1s")],
    );
    let envoy = Envoy::start_with_config(&config);
    assert_next_requests_work(&envoy, &upstream).await;

    // Killed mid-stream, once the client has events.
    let gate = Gate::new();
    upstream.push(good_stream().pause_after(2, &gate));
    let mut reading = Reading::start(&envoy, &stream_request()).await;
    reading.until("\"delta\":\"lo\"").await;
    let dir = processor.kill();
    gate.release();
    let cut = reading.finish().await;
    cut.assert_cut_stream();

    // The outage.
    let seen = upstream.requests().len();
    for request in [json_request(), stream_request()] {
        let answer = post(&envoy, &request).await;
        answer.envelope(500, "server_error", "processor_unavailable");
    }
    assert_eq!(
        upstream.requests().len(),
        seen,
        "nothing reached the upstream"
    );
    // Other traffic does not need the processor (ext_proc is off on its route).
    upstream.push(Reply::json(200, &json!({"object": "list", "data": []})));
    let other = client()
        .get(envoy.url("/v1/models"))
        .send()
        .await
        .expect("send");
    assert_eq!(other.status(), 200);
    let seen = seen + 1;

    // Restarted on the same port.
    let processor = OwnProcessor::start(port, dir);
    assert_next_requests_work(&envoy, &upstream).await;

    // Frozen, then resumed.
    processor.signal("-STOP");
    let frozen = post(&envoy, &json_request()).await;
    processor.signal("-CONT");
    frozen.envelope(504, "server_error", "processor_timeout");
    assert!(frozen.elapsed >= Duration::from_millis(900), "{frozen:?}");
    assert_eq!(upstream.requests().len(), seen + 2);
    assert_next_requests_work(&envoy, &upstream).await;
    let logs = processor.logs();
    assert!(!logs.contains("panic"), "{}", tail(&logs));
}

/// The client disconnects in the middle of a stream: Envoy resets the exchange (ext_proc:
/// including the processor's gRPC stream). The translator logs the cut exchange (with its
/// request id) and keeps serving: the next request works.
#[tokio::test]
async fn client_disconnect_mid_stream_is_logged_and_survived() {
    let gate = Gate::new();
    let upstream = ScriptedUpstream::with_replies([good_stream().pause_after(2, &gate)]);
    let mut stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;

    let response = client()
        .post(envoy.url("/v1/responses"))
        .header("x-request-id", "faults-client-gone")
        .json(&stream_request())
        .timeout(TIMEOUT)
        .send()
        .await
        .expect("send");
    let mut reading = Reading::new(response, Instant::now());
    assert_eq!(reading.status, 200);
    reading.until("\"delta\":\"lo\"").await;
    // Gone: the connection is closed (not pooled: its body was not read to the end).
    drop(reading);

    wait_for_log(&stack, "faults-client-gone").await;
    gate.release();
    assert_next_requests_work(envoy, &upstream).await;
    assert_alive(&mut stack);
}

/// A bug in the translation fails that exchange only (the core panics on purpose: test builds
/// have the `fault-injection` feature, core/src/fault.rs, and panic on a marker in a body):
/// in the request, a 500 `internal_error` envelope and nothing upstream; in a gathered JSON
/// answer, the same envelope; mid-stream, the stream's failed ending. The translator keeps
/// serving: ext_proc, the processor catches the panic; module, every hook catches it (a panic
/// crossing into Envoy would abort it and drop every connection).
#[tokio::test]
async fn a_panic_fails_one_exchange_and_the_translator_keeps_serving() {
    let marker = responses_core::fault::PANIC_MARKER;
    let upstream = ScriptedUpstream::start();
    let mut stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;

    let answer = post(envoy, &json!({"model": "m", "input": marker})).await;
    answer.envelope(500, "server_error", "internal_error");
    assert!(
        upstream.requests().is_empty(),
        "nothing reached the upstream"
    );

    upstream.push(Reply::json(200, &completion(marker)));
    let answer = post(envoy, &json_request()).await;
    answer.envelope(500, "server_error", "internal_error");
    assert!(!answer.body.contains(marker));

    upstream.push(Reply::sse([
        chunk("Hel"),
        chunk(marker),
        chunk("lo"),
        finish_chunk(),
        DONE.to_string(),
    ]));
    let answer = post(envoy, &stream_request()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(answer.body.contains("\"delta\":\"Hel\""), "{answer:?}");
    assert!(!answer.body.contains(marker) && !answer.body.contains("\"delta\":\"lo\""));
    let names = answer.event_names();
    assert!(
        !names.iter().any(|n| n == "response.completed"),
        "{names:?}"
    );
    if common::mode() == common::Mode::Module || answer.cut.is_none() {
        // The module sends the failed ending and drops the rest of the upstream's body. (The
        // processor sends it too, then fails its gRPC stream, on which Envoy may cut the
        // client's stream before the ending is flushed.)
        assert!(answer.cut.is_none(), "{answer:?}");
        assert_eq!(
            names[names.len() - 2..],
            ["response.failed", "[DONE]"],
            "{names:?}"
        );
        let events = assert_valid_sse(&answer.body);
        let failed = &events.last().expect("events").1["response"];
        assert_eq!(failed["error"]["code"], "internal_error");
    }

    assert_next_requests_work(envoy, &upstream).await;
    assert!(stack.translator_running(), "the translator exited");
    let logs = stack.translator_logs();
    assert!(
        logs.contains("panic"),
        "the panics are logged:\n{}",
        tail(&logs)
    );
}

/// Answers without a body (`content-length: 0`, so Envoy reports the end with the head): a
/// stream request answered by an empty event stream gets the whole failed stream in its place
/// (`upstream_stream_truncated`); an empty 500 gets an envelope with its status. Nothing but
/// translated bytes reaches the client.
#[tokio::test]
async fn answers_without_a_body_are_replaced_whole() {
    let upstream = ScriptedUpstream::with_replies([
        Reply::raw(200, "text/event-stream", ""),
        Reply::raw(500, "text/plain", ""),
    ]);
    let mut stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;

    let answer = post(envoy, &stream_request()).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.content_type.as_deref(), Some("text/event-stream"));
    assert!(answer.cut.is_none(), "{answer:?}");
    let events = assert_valid_sse(&answer.body);
    let (last, failed) = events.last().expect("events");
    assert_eq!(last, "response.failed", "{answer:?}");
    assert_eq!(
        failed["response"]["error"]["code"],
        "upstream_stream_truncated"
    );
    assert!(answer.body.ends_with(DONE));

    post(envoy, &json_request())
        .await
        .envelope(500, "server_error", "server_error");
    assert_next_requests_work(envoy, &upstream).await;
    assert_alive(&mut stack);
}
