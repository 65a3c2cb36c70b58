//! The WebSocket transport's memory budgets under 200 greedy connections, through the real
//! Envoy (ext_proc mode: the processor serves the sockets), the processor at its defaults
//! (`--ws-max-socket-bytes` 64 MiB, `--ws-max-total-bytes` 128 MiB, 16 MiB messages).
//!
//! 200 sockets are opened (each its own caller, as 200 API keys would be), then each pushes
//! past its budget: a `generate: false` preloading a context of `BIG` bytes of text (held
//! twice: its JSON and its parsed copy), a continuation of it with as much again (in flight:
//! the upstream answers slowly), then a new request of as much queued behind it. Each
//! connection should end with 1008 (its own limit) or 1013 (all connections' budget, try again
//! later). Two runs: all 200 pushing at once, then the same in pairs (where a connection's
//! own limit is reached before the shared one). For each: the close codes seen, the
//! processor's peak RSS (`VmHWM`, reset between the runs through `/proc/<pid>/clear_refs`)
//! against the 256 MiB limit of deploy/kubernetes/, and Envoy's for reference.
//!
//! Then clients that do not read (`tests/common/noread.rs`), each from its own address: 200
//! that each write 8 MiB of pings, and 20 that each send `response.create`s answered at once
//! (`generate: false`) until the processor ends their socket; for each run the processor's and
//! Envoy's peak RSS, how the sockets ended once their clients read, and whether a client beside
//! them was served. Envoy's buffer toward each client (16 MiB in envoy/envoy.yaml) fills before
//! the processor's socket stops taking bytes: Envoy's memory, outside the processor's budget
//! (docs/websocket.md#what-the-budget-does-not-count).
//!
//! Run: `cargo bench --bench ws_memory` (a few minutes; `RUNS=budget,noread` picks runs).
//! Results: docs/performance.md#hostile-input-through-envoy and
//! docs/performance.md#websocket-clients-that-do-not-read.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::memory::{mib, reset_peak, resident as memory};
use common::{noread, ServerThread, Stack};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::error::{Error, ProtocolError};
use tokio_tungstenite::tungstenite::Message;

const SOCKETS: usize = 200;
/// Each message's input text: under the 16 MiB message limit, and over the 64 MiB socket
/// limit once a context of it, its continuation and one more are held.
const BIG: usize = 15 << 20;
/// The memory limit of the processor's container in deploy/kubernetes/.
const LIMIT: u64 = 256 << 20;
/// How long the upstream takes to answer: the continuation stays in flight meanwhile.
const ANSWER_TIME: Duration = Duration::from_secs(3);
const TIMEOUT: Duration = Duration::from_secs(120);

/// A Chat upstream that reads each request whole, drops it, and streams a short answer
/// slowly (the harness's ScriptedUpstream keeps every request: 200 of 30 MiB).
fn slow_upstream() -> (ServerThread, u16) {
    async fn answer(request: axum::extract::Request) -> axum::response::Response {
        let _ = axum::body::to_bytes(request.into_body(), usize::MAX).await;
        let chunk = |delta: Value, finish: Value| {
            format!(
                "data: {}\n\n",
                json!({"id": "c1", "object": "chat.completion.chunk", "created": 1,
                    "model": "m", "choices": [{"index": 0, "delta": delta,
                    "finish_reason": finish}]})
            )
        };
        let chunks = vec![
            chunk(json!({"role": "assistant", "content": "ok"}), Value::Null),
            chunk(json!({}), json!("stop")),
            "data: [DONE]\n\n".to_owned(),
        ];
        let stream = futures_util::stream::unfold(chunks.into_iter(), |mut rest| async move {
            let next = rest.next()?;
            if next.starts_with("data: [DONE]") {
                tokio::time::sleep(ANSWER_TIME).await;
            }
            Some((Ok::<_, std::io::Error>(next), rest))
        });
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(axum::body::Body::from_stream(stream))
            .expect("a response")
    }
    ServerThread::spawn("slow-upstream", |listener| async move {
        let app = axum::Router::new().fallback(answer);
        let _ = axum::serve(listener, app).await;
    })
}

type Socket = common::websocket::Socket;

/// Each caller from its own address.
async fn open(port: u16, caller: usize) -> Socket {
    let key = format!("Bearer caller-{caller}");
    noread::open(
        port,
        noread::caller_address(caller),
        None,
        &[("authorization", &key)],
    )
    .await
    .unwrap_or_else(|e| panic!("upgrade {caller}: {e:?}"))
}

fn create(body: Value) -> Message {
    let mut body = body;
    body["type"] = json!("response.create");
    Message::text(body.to_string())
}

/// Pushes one socket past its budget; how it ended.
async fn push(socket: Socket, text: Arc<String>) -> String {
    let (mut sink, mut stream) = socket.split();
    let (id_tx, id_rx) = tokio::sync::oneshot::channel::<String>();
    // Reads until the socket ends: the close code, or how it ended without one.
    let reader = tokio::spawn(async move {
        let mut id_tx = Some(id_tx);
        let mut completed = 0;
        loop {
            match tokio::time::timeout(TIMEOUT, stream.next()).await {
                Err(_) => return format!("still open after {TIMEOUT:?}, {completed} completed"),
                Ok(None) => return "TCP closed, no close frame".to_owned(),
                Ok(Some(Err(Error::Io(_)))) => return "reset, no close frame".to_owned(),
                Ok(Some(Err(Error::Protocol(ProtocolError::ResetWithoutClosingHandshake)))) => {
                    return "TCP closed, no close frame".to_owned()
                }
                Ok(Some(Err(e))) => return format!("failed ({e})"),
                Ok(Some(Ok(Message::Close(frame)))) => {
                    return frame.map_or("close without a code".to_owned(), |f| {
                        format!("{} ({})", u16::from(f.code), f.reason)
                    })
                }
                Ok(Some(Ok(Message::Text(event)))) => {
                    let event: Value = serde_json::from_str(&event).expect("JSON");
                    if event["type"] == "response.completed" {
                        completed += 1;
                        if let Some(tx) = id_tx.take() {
                            let id = event["response"]["id"].as_str().unwrap_or("").to_owned();
                            let _ = tx.send(id);
                        }
                        if completed == 3 {
                            return "not closed: every response completed".to_owned();
                        }
                    }
                }
                Ok(Some(Ok(_))) => {}
            }
        }
    });
    let writer = async {
        let preload = json!({"model": "m", "input": text.as_str(), "generate": false});
        sink.send(create(preload)).await.ok()?;
        let id = id_rx.await.ok()?;
        let continuation =
            json!({"model": "m", "previous_response_id": id, "input": text.as_str()});
        sink.send(create(continuation)).await.ok()?;
        let queued = json!({"model": "m", "input": text.as_str()});
        sink.send(create(queued)).await.ok()
    };
    writer.await;
    let ended = reader.await.expect("reader");
    let _ = sink.close().await;
    ended
}

/// One run: every socket pushes, `at_once` of them at a time. The endings, counted.
async fn run(sockets: Vec<Socket>, at_once: usize, text: Arc<String>) -> BTreeMap<String, usize> {
    let gate = Arc::new(tokio::sync::Semaphore::new(at_once));
    let tasks: Vec<_> = sockets
        .into_iter()
        .map(|socket| {
            let (gate, text) = (gate.clone(), text.clone());
            tokio::spawn(async move {
                let _turn = gate.acquire_owned().await.expect("semaphore");
                push(socket, text).await
            })
        })
        .collect();
    let mut endings = BTreeMap::new();
    for task in tasks {
        *endings.entry(task.await.expect("socket task")).or_insert(0) += 1;
    }
    endings
}

/// The close codes the processor sent since its log was `from` bytes long (its `closing`
/// lines, at debug), counted; and the log's length now.
fn closes_sent(stack: &Stack, from: usize) -> (BTreeMap<String, usize>, usize) {
    let log = stack.processor().logs();
    let mut codes = BTreeMap::new();
    for line in log.get(from..).unwrap_or_default().lines() {
        if !line.contains("closing") {
            continue;
        }
        if let Some(code) = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("code="))
        {
            *codes.entry(code.to_owned()).or_insert(0) += 1;
        }
    }
    (codes, log.len())
}

fn counted(counts: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = counts
        .iter()
        .map(|(what, n)| format!("{n} × {what}"))
        .collect();
    parts.join(", ")
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` does not: keep that run small.
    let quick = !std::env::args().any(|a| a == "--bench");
    let sockets = if quick { 4 } else { SOCKETS };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (_upstream, upstream_port) = slow_upstream();
    // The processor inherits it: its `closing` lines (with the code sent) are at debug.
    std::env::set_var("RUST_LOG", "info,responses_extproc::websocket=debug");
    let stack = Stack::with_websocket(upstream_port, &[]);
    let (processor, envoy) = (stack.processor().pid(), stack.envoy.pid());
    let port = stack.envoy.port();
    let text = Arc::new("x".repeat(BIG));
    println!(
        "{sockets} sockets, messages of {} MiB of text; processor idle: {} RSS",
        BIG >> 20,
        mib(memory(processor, "VmRSS:"))
    );
    println!(
        "\n| run | close codes sent (processor's log) | what the clients saw | took | processor peak RSS (VmHWM) | of {} | Envoy peak RSS |",
        mib(LIMIT)
    );
    println!("|---|---|---|---:|---:|---:|---:|");
    let runs = std::env::var("RUNS").unwrap_or_else(|_| "budget,noread".into());
    let mut worst = 0;
    let mut log_from = closes_sent(&stack, 0).1;
    let budget_runs = if runs.contains("budget") {
        vec![("all at once", sockets), ("two at a time", 2)]
    } else {
        Vec::new()
    };
    for (name, at_once) in budget_runs {
        let reset = reset_peak(processor) && reset_peak(envoy);
        let start = Instant::now();
        let endings = runtime.block_on(async {
            let mut open_sockets = Vec::with_capacity(sockets);
            for caller in 0..sockets {
                open_sockets.push(open(port, caller).await);
            }
            run(open_sockets, at_once, text.clone()).await
        });
        let took = start.elapsed();
        let peak = memory(processor, "VmHWM:");
        worst = worst.max(peak);
        // The processor logs a close as it sends it: give the last lines a moment.
        std::thread::sleep(Duration::from_millis(500));
        let (sent, log_len) = closes_sent(&stack, log_from);
        log_from = log_len;
        println!(
            "| {name}{} | {} | {} | {:.1} s | {} | {:.0} % | {} |",
            if reset { "" } else { " (peak not reset)" },
            counted(&sent),
            counted(&endings),
            took.as_secs_f64(),
            mib(peak),
            peak as f64 * 100.0 / LIMIT as f64,
            mib(memory(envoy, "VmHWM:"))
        );
    }
    println!(
        "\nprocessor peak: {} of {} ({}); after: {} RSS",
        mib(worst),
        mib(LIMIT),
        if worst < LIMIT { "under" } else { "OVER" },
        mib(memory(processor, "VmRSS:"))
    );
    if runs.contains("noread") {
        // The smoke run of `cargo test`: the flooders' path, briefly (two batches each).
        let (pingers, flooders, batches) = if quick { (4, 2, 2) } else { (SOCKETS, 20, 100) };
        noread_runs(
            &runtime,
            &stack,
            &mut log_from,
            pingers,
            (flooders, batches),
        );
    }
}

/// A client beside them: how its turn ended.
async fn beside(port: u16) -> String {
    let mut ws = open(port, 1000).await;
    let body = json!({"model": "m", "input": "beside"});
    if let Err(e) = ws.send(create(body)).await {
        return format!("send failed ({e})");
    }
    loop {
        match tokio::time::timeout(TIMEOUT, ws.next()).await {
            Ok(Some(Ok(Message::Text(t)))) if t.contains("\"response.completed\"") => {
                return "completed".to_owned()
            }
            Ok(Some(Ok(Message::Close(f)))) => {
                return format!("close {:?}", f.map(|f| u16::from(f.code)))
            }
            Ok(Some(Ok(_))) => {}
            other => return format!("{other:?}"),
        }
    }
}

/// Clients that do not read: the processor's and Envoy's peak RSS, the closes sent, the
/// endings, a client beside them served or not.
fn noread_runs(
    runtime: &tokio::runtime::Runtime,
    stack: &Stack,
    log_from: &mut usize,
    pingers: usize,
    (flooders, batches): (usize, usize),
) {
    let (processor, envoy) = (stack.processor().pid(), stack.envoy.pid());
    let port = stack.envoy.port();
    println!(
        "\n| clients that do not read | processor RSS before, peak | Envoy RSS before, peak | close codes sent | endings once they read | a client beside |"
    );
    println!("|---|---:|---:|---|---|---|");
    for (name, flood) in [
        (format!("{pingers} × 8 MiB of pings"), false),
        (format!("{flooders} × creates until closed"), true),
    ] {
        let before = (memory(processor, "VmRSS:"), memory(envoy, "VmRSS:"));
        let reset = reset_peak(processor) && reset_peak(envoy);
        let (endings, beside) = runtime.block_on(async {
            let sockets = if flood {
                noread::flooders(port, flooders, batches).await
            } else {
                noread::pingers(port, pingers, 8).await
            };
            let beside = beside(port).await;
            (
                noread::endings(sockets, Duration::from_secs(10)).await,
                beside,
            )
        });
        std::thread::sleep(Duration::from_millis(500));
        let (sent, log_len) = closes_sent(stack, *log_from);
        *log_from = log_len;
        println!(
            "| {name}{} | {}, {} | {}, {} | {} | {} | {beside} |",
            if reset { "" } else { " (peak not reset)" },
            mib(before.0),
            mib(memory(processor, "VmHWM:")),
            mib(before.1),
            mib(memory(envoy, "VmHWM:")),
            counted(&sent),
            counted(&endings),
        );
    }
}
