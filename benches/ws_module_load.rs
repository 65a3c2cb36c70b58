//! Module mode's WebSocket sockets under load and faults, through the real Envoy with the
//! module serving the transport (`envoy/envoy-module.yaml`, no processor), the module at its
//! defaults (`ws_max_unread_bytes` 4 MiB, `ws_max_socket_bytes` 64 MiB, `ws_max_total_bytes`
//! 128 MiB). Three runs, each on a fresh Envoy:
//!
//! 1. **Load and slow readers.** `SLOW` sockets each ask for a long stream (an event of about
//!    8 KiB every 50 ms for a minute) and read one event every 200 ms with a small receive
//!    buffer, so that Envoy holds what they leave unread; meanwhile `SOCKETS` other sockets
//!    each run `LANES` lanes side by side (`stream_id`), each lane `TURNS` turns
//!    (continuations), which must all complete. A slow reader ends in
//!    one of the documented ways (`response.failed` and 1008 past `ws_max_unread_bytes`, 1013
//!    past the shared budget) or is still reading after `SLOW_FOR`, when it goes. Envoy's RSS
//!    before, and its peak (`VmHWM`), against the documented bound per socket
//!    (`ws_max_socket_bytes`) times the sockets (asserted), and against the shared budget
//!    (`ws_max_total_bytes`, plus Envoy's 1 MiB write-buffer watermark per socket: printed,
//!    not asserted; the first runs, before the output of a response in flight was counted in
//!    what a socket holds, went over it).
//!    `SLOW_PACE_MS=0` reads the long streams as fast as they come (their cost without the
//!    slow reading); `RUNS=load,sigterm,drain,failure` picks runs.
//! 2. **Drain.** `SOCKETS` sockets each with a response in flight that outlasts the drain time
//!    (`drain_seconds` 5): Envoy gets SIGTERM (then, on another Envoy, `POST
//!    /drain_listeners?graceful`); each socket must see `response.failed`
//!    (`server_shutting_down`) and close 1001, or a terminal event and 1001, within the drain
//!    time and 2 s. None may hang.
//! 3. **An upstream failing mid-stream.** `SOCKETS` sockets each ask for an answer whose
//!    upstream connection closes after two chunks: each must see `error` and
//!    `response.failed`, then complete a next turn on the same socket.
//!
//! 4. **Clients that do not read** (`RUNS=noread`, not in the default runs), each from its own
//!    address (`tests/common/noread.rs`): `NOREAD` clients that each write 8 MiB of pings, then
//!    `NOREAD` that each send `response.create`s answered at once (`generate: false`) until
//!    Envoy ends their socket, then 4 clients that read, each running 100,000 such turns on
//!    one socket (`NOREAD_KINDS=ping,flood,read` picks some). For each, Envoy's RSS before
//!    and its peak against `ws_max_total_bytes` and the documented slack (the readers: against
//!    a socket's share of it; a socket's turns once made Envoy keep ~300 bytes each), the
//!    closes Envoy's stats count, how the sockets ended once their clients read, and whether a
//!    client beside them was served. `EXTRA_ARGS` adds module settings (`--ws-turn-records
//!    false`), `BUFFER_LIMIT` sets the listener's `per_connection_buffer_limit_bytes`.
//!
//! The runs 1 to 3 open every socket from 127.0.0.1, with `ws_max_connections_per_address`
//! raised to 1,024.
//!
//! Run (a few minutes; module mode only, a release module):
//! `cargo build --release -p responses-module && RESPONSES_MODULE_DIR=target/release cargo bench --bench ws_module_load`.
//! Results: docs/performance.md#module-modes-sockets-under-load.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::memory::{mib, resident as memory};
use common::{Mode, ServerThread, Stack};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

const SOCKETS: usize = 500;
/// Clients that do not read, in run 4.
const NOREAD: usize = 200;
const TURNS: usize = 5;
/// Lanes each turn socket runs side by side.
const LANES: usize = 4;
const SLOW: usize = 50;
/// How long a slow reader reads before it goes.
const SLOW_FOR: Duration = Duration::from_secs(60);
/// The long stream: `LONG_CHUNKS` chunks of `LONG_CHUNK` bytes of text, one every `LONG_TICK`.
const LONG_CHUNKS: usize = 1300;
const LONG_CHUNK: usize = 8 << 10;
const LONG_TICK: Duration = Duration::from_millis(50);
/// A slow reader's pace: one event per this (`SLOW_PACE_MS`; 0: as fast as it can, to tell
/// what the long streams cost from what the slow reading does).
fn slow_pace() -> Duration {
    let ms = std::env::var("SLOW_PACE_MS")
        .ok()
        .and_then(|v| v.parse().ok());
    Duration::from_millis(ms.unwrap_or(200))
}
/// The drain extension's `drain_seconds` in run 2.
const DRAIN_SECONDS: u64 = 5;
/// Envoy's default write-buffer watermark, past which the module counts unread bytes.
const WATERMARK: u64 = 1 << 20;
/// The module's defaults (core/src/settings.rs).
const MAX_SOCKET: u64 = responses_core::settings::DEFAULT_WS_MAX_SOCKET_BYTES as u64;
const MAX_TOTAL: u64 = responses_core::settings::DEFAULT_WS_MAX_TOTAL_BYTES as u64;
const TIMEOUT: Duration = Duration::from_secs(60);

/// What the upstream answers, by a marker in the request: `LONG` (the slow readers' stream),
/// `HOLD` (a chunk every 500 ms for two minutes: outlasts the drain), `FAIL` (two chunks, then
/// the connection closes), else a short answer at once.
fn upstream() -> (ServerThread, u16) {
    fn chunk(content: &str, finish: Value) -> String {
        let delta = if content.is_empty() {
            json!({})
        } else {
            json!({"content": content})
        };
        format!(
            "data: {}\n\n",
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    }
    async fn answer(request: axum::extract::Request) -> axum::response::Response {
        let body = axum::body::to_bytes(request.into_body(), usize::MAX)
            .await
            .unwrap_or_default();
        let has = |marker: &str| body.windows(marker.len()).any(|w| w == marker.as_bytes());
        // (chunks, pause before each, close the connection after them)
        let (count, text, tick, abort) = if has("LONG") {
            (LONG_CHUNKS, "x".repeat(LONG_CHUNK), LONG_TICK, false)
        } else if has("HOLD") {
            (240, "held ".to_owned(), Duration::from_millis(500), false)
        } else if has("FAIL") {
            (2, "cut ".to_owned(), Duration::from_millis(20), true)
        } else {
            (1, "ok".to_owned(), Duration::ZERO, false)
        };
        let stream = futures_util::stream::unfold(0usize, move |i| {
            let text = text.clone();
            async move {
                if i > count + 1 {
                    return None;
                }
                if i > 0 && i <= count {
                    tokio::time::sleep(tick).await;
                }
                let item = match i {
                    i if i < count => Ok(chunk(&text, Value::Null)),
                    _ if abort => Err(std::io::Error::other("upstream gone mid-stream")),
                    i if i == count => Ok(chunk("", json!("stop"))),
                    _ => Ok("data: [DONE]\n\n".to_owned()),
                };
                let stop = item.is_err();
                Some((item, if stop { count + 2 } else { i + 1 }))
            }
        });
        axum::response::Response::builder()
            .header("content-type", "text/event-stream")
            .body(axum::body::Body::from_stream(stream))
            .expect("a response")
    }
    ServerThread::spawn("bench-upstream", |listener| async move {
        let app = axum::Router::new().fallback(answer);
        let _ = axum::serve(listener, app).await;
    })
}

/// Opens a socket as caller `caller` (each its own key: a key may hold 64), with a receive
/// buffer of `recv_buffer` bytes if given (the slow readers: Envoy, not the client's
/// kernel, then holds what they leave unread).
async fn open(
    port: u16,
    caller: String,
    recv_buffer: Option<u32>,
) -> WebSocketStream<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    if let Some(size) = recv_buffer {
        socket.set_recv_buffer_size(size).expect("SO_RCVBUF");
    }
    let stream = socket
        .connect(([127, 0, 0, 1], port).into())
        .await
        .expect("connect");
    let mut request = format!("ws://127.0.0.1:{port}/v1/responses")
        .into_client_request()
        .expect("request");
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {caller}").parse().expect("a header"),
    );
    let (socket, response) = tokio_tungstenite::client_async(request, stream)
        .await
        .unwrap_or_else(|e| panic!("upgrade {caller}: {e}"));
    assert_eq!(response.status(), 101);
    socket
}

fn create(body: Value) -> Message {
    let mut body = body;
    body["type"] = json!("response.create");
    Message::text(body.to_string())
}

/// One message from the socket: an event's JSON, or how the socket ended.
enum Next {
    Event(Value),
    Closed(String),
}

async fn next<S: AsyncRead + AsyncWrite + Unpin>(
    socket: &mut WebSocketStream<S>,
    timeout: Duration,
) -> Next {
    loop {
        match tokio::time::timeout(timeout, socket.next()).await {
            Err(_) => return Next::Closed(format!("HUNG: nothing for {timeout:?}")),
            Ok(None) => return Next::Closed("TCP closed, no close frame".into()),
            Ok(Some(Err(e))) => return Next::Closed(format!("no close frame ({e})")),
            Ok(Some(Ok(Message::Close(frame)))) => {
                return Next::Closed(frame.map_or("close without a code".into(), |f| {
                    u16::from(f.code).to_string()
                }))
            }
            Ok(Some(Ok(Message::Text(text)))) => {
                return Next::Event(serde_json::from_str(&text).expect("JSON"))
            }
            Ok(Some(Ok(_))) => {}
        }
    }
}

fn terminal(event: &Value) -> bool {
    matches!(
        event["type"].as_str(),
        Some("response.completed" | "response.failed" | "response.incomplete")
    )
}

/// One turn: the terminal event's type (and the error code of a failed one), or how the
/// socket ended before it.
async fn turn<S: AsyncRead + AsyncWrite + Unpin>(
    socket: &mut WebSocketStream<S>,
    body: Value,
) -> Result<Value, String> {
    socket.send(create(body)).await.map_err(|e| e.to_string())?;
    loop {
        match next(socket, TIMEOUT).await {
            Next::Event(event) if terminal(&event) => return Ok(event),
            Next::Event(_) => {}
            Next::Closed(how) => return Err(how),
        }
    }
}

/// A socket running `LANES` lanes side by side, each `TURNS` turns, each turn a continuation
/// of its lane's one before: how many completed.
async fn turns(port: u16, caller: usize) -> Result<usize, String> {
    let mut socket = open(port, format!("turns-{caller}"), None).await;
    let ask = |lane: usize, i: usize, previous: Option<&str>| {
        let mut body =
            json!({"model": "m", "input": format!("turn {i}"), "stream_id": format!("l{lane}")});
        if let Some(id) = previous {
            body["previous_response_id"] = json!(id);
        }
        create(body)
    };
    for lane in 0..LANES {
        socket
            .send(ask(lane, 0, None))
            .await
            .map_err(|e| e.to_string())?;
    }
    let mut done = [0; LANES];
    while done.iter().any(|d| *d < TURNS) {
        let event = match next(&mut socket, TIMEOUT).await {
            Next::Event(event) if terminal(&event) => event,
            Next::Event(_) => continue,
            Next::Closed(how) => return Err(how),
        };
        let lane = event["stream_id"]
            .as_str()
            .and_then(|l| l.strip_prefix('l')?.parse::<usize>().ok())
            .filter(|l| *l < LANES)
            .ok_or_else(|| format!("a terminal event without its lane: {event}"))?;
        if event["type"] != "response.completed" {
            return Err(format!(
                "lane {lane}, turn {}: {}",
                done[lane], event["type"]
            ));
        }
        done[lane] += 1;
        if done[lane] < TURNS {
            let id = event["response"]["id"].as_str();
            socket
                .send(ask(lane, done[lane], id))
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    let _ = socket.close(None).await;
    Ok(LANES * TURNS)
}

/// A slow reader on a long stream: how it ended, and after how long.
async fn slow_reader(port: u16, caller: usize) -> String {
    let mut socket = open(port, format!("slow-{caller}"), Some(16 << 10)).await;
    let start = Instant::now();
    if let Err(e) = socket
        .send(create(json!({"model": "m", "input": "LONG"})))
        .await
    {
        return format!("send failed ({e})");
    }
    let mut failed = None;
    loop {
        if start.elapsed() >= SLOW_FOR {
            let _ = socket.close(None).await;
            return "still reading after 60 s, then went".into();
        }
        match next(&mut socket, TIMEOUT).await {
            Next::Event(event) if terminal(&event) => {
                if event["type"] == "response.completed" {
                    return format!("completed in {:.0} s", start.elapsed().as_secs_f64());
                }
                failed = Some(event["response"]["error"]["code"].clone());
            }
            Next::Event(_) => {}
            Next::Closed(how) => {
                // Whole tens of seconds: a histogram, not 50 lines.
                let at = start.elapsed().as_secs() / 10 * 10;
                return match failed {
                    Some(code) => format!(
                        "response.failed ({code}), close {how}, at {at}-{} s",
                        at + 10
                    ),
                    None => format!(
                        "close {how} without a terminal event, at {at}-{} s",
                        at + 10
                    ),
                };
            }
        }
        tokio::time::sleep(slow_pace()).await;
    }
}

fn counted(counts: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = counts
        .iter()
        .map(|(what, n)| format!("{n} × {what}"))
        .collect();
    parts.join("; ")
}

fn module_stack(upstream_port: u16) -> Stack {
    let extra = std::env::var("EXTRA_ARGS").unwrap_or_default();
    let mut args = vec!["--ws-max-connections-per-address", "1024"];
    args.extend(extra.split_whitespace());
    Stack::with_websocket_in(Mode::Module, upstream_port, &args, |config| {
        let config = match std::env::var("BUFFER_LIMIT") {
            Ok(limit) => config.replacen(
                "    # No per_connection_buffer_limit_bytes",
                &format!("    per_connection_buffer_limit_bytes: {limit}\n    #"),
                1,
            ),
            Err(_) => config,
        };
        let drain = "    extension_name: drain\n";
        assert_eq!(config.matches(drain).count(), 1, "the drain extension");
        config.replace(
            drain,
            &format!(
                "{drain}    extension_config:\n      \"@type\": type.googleapis.com/google.protobuf.StringValue\n      value: '{{\"drain_seconds\": {DRAIN_SECONDS}}}'\n"
            ),
        )
    })
}

/// Run 1: the turns and the slow readers together; Envoy's memory.
fn load(
    runtime: &tokio::runtime::Runtime,
    upstream_port: u16,
    sockets: usize,
    slow: usize,
) -> bool {
    let stack = module_stack(upstream_port);
    let (port, pid) = (stack.envoy.port(), stack.envoy.pid());
    let before = memory(pid, "VmRSS:");
    let start = Instant::now();
    let (turn_results, slow_endings) = runtime.block_on(async {
        let readers: Vec<_> = (0..slow)
            .map(|n| tokio::spawn(slow_reader(port, n)))
            .collect();
        // Let the slow readers fall behind before the turns start.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let turners: Vec<_> = (0..sockets).map(|n| tokio::spawn(turns(port, n))).collect();
        let mut results = BTreeMap::new();
        for t in turners {
            let key = match t.await.expect("turn task") {
                Ok(n) => format!("{n} turns completed"),
                Err(e) => format!("FAILED: {e}"),
            };
            *results.entry(key).or_insert(0) += 1;
        }
        let turns_took = start.elapsed();
        let mut endings = BTreeMap::new();
        for r in readers {
            *endings.entry(r.await.expect("reader task")).or_insert(0) += 1;
        }
        ((results, turns_took), endings)
    });
    let peak = memory(pid, "VmHWM:");
    let growth = peak.saturating_sub(before);
    let all = (sockets + slow) as u64;
    let bound = all * MAX_SOCKET;
    // What the shared budget and Envoy's watermark leave Envoy to hold for the sockets.
    let budget_bound = MAX_TOTAL + all * WATERMARK;
    let (results, turns_took) = turn_results;
    println!(
        "\n### 1. {sockets} sockets × {LANES} lanes × {TURNS} turns beside {slow} slow readers"
    );
    println!(
        "turn sockets: {} (the turns took {:.1} s)",
        counted(&results),
        turns_took.as_secs_f64()
    );
    println!("slow readers: {}", counted(&slow_endings));
    println!(
        "Envoy RSS before {}, peak (VmHWM) {}: growth {} ({:.0} KiB per socket); bound \
         {all} × ws_max_socket_bytes = {}: {}; the shared budget (ws_max_total_bytes + {all} × \
         Envoy's 1 MiB write-buffer watermark) = {}: {}",
        mib(before),
        mib(peak),
        mib(growth),
        growth as f64 / all as f64 / 1024.0,
        mib(bound),
        if growth <= bound { "under" } else { "OVER" },
        mib(budget_bound),
        if growth <= budget_bound {
            "under"
        } else {
            "OVER"
        },
    );
    let turns_ok =
        results.len() == 1 && results.contains_key(&format!("{} turns completed", LANES * TURNS));
    let slow_ok = slow_endings.keys().all(|e| {
        e.starts_with("still reading")
            || e.starts_with("completed")
            || e.contains("close 1008")
            || e.contains("close 1013")
    });
    turns_ok && slow_ok && growth <= bound
}

/// Run 2: every socket has a response in flight that outlasts the drain time; Envoy drains
/// (`sigterm`: SIGTERM, else `POST /drain_listeners?graceful`). Each socket's ending, and
/// whether it came within the drain time and 2 s.
fn drain(
    runtime: &tokio::runtime::Runtime,
    upstream_port: u16,
    sockets: usize,
    sigterm: bool,
) -> bool {
    let mut stack = module_stack(upstream_port);
    let port = stack.envoy.port();
    let (admin, pid) = (stack.envoy.admin_port(), stack.envoy.pid());
    let limit = Duration::from_secs(DRAIN_SECONDS + 2);
    let (endings, late, exited) = runtime.block_on(async {
        let (started_tx, _) = tokio::sync::broadcast::channel::<Instant>(1);
        let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel::<()>(sockets);
        let tasks: Vec<_> = (0..sockets)
            .map(|n| {
                let mut started = started_tx.subscribe();
                let ready = ready_tx.clone();
                tokio::spawn(async move {
                    let mut socket = open(port, format!("drain-{n}"), None).await;
                    socket
                        .send(create(json!({"model": "m", "input": "HOLD"})))
                        .await
                        .expect("send");
                    // In flight once its text has begun.
                    loop {
                        match next(&mut socket, TIMEOUT).await {
                            Next::Event(e) if e["type"] == "response.output_text.delta" => break,
                            Next::Event(_) => {}
                            Next::Closed(how) => {
                                return (format!("ended before the drain: {how}"), Duration::ZERO)
                            }
                        }
                    }
                    ready.send(()).await.expect("ready");
                    let at = started.recv().await.expect("the drain's start");
                    let mut terminal_event = None;
                    loop {
                        match next(&mut socket, limit + Duration::from_secs(10)).await {
                            Next::Event(e) if terminal(&e) => {
                                let code = e["response"]["error"]["code"].as_str().unwrap_or("");
                                terminal_event =
                                    Some(format!("{} ({code})", e["type"].as_str().unwrap_or("")));
                            }
                            Next::Event(_) => {}
                            Next::Closed(how) => {
                                let took = at.elapsed();
                                let what = match terminal_event {
                                    Some(t) => format!("{t}, close {how}"),
                                    None => format!("close {how} without a terminal event"),
                                };
                                return (what, took);
                            }
                        }
                    }
                })
            })
            .collect();
        drop(ready_tx);
        for _ in 0..sockets {
            ready_rx.recv().await.expect("every socket in flight");
        }
        let at = Instant::now();
        if sigterm {
            let status = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .expect("kill");
            assert!(status.success());
        } else {
            let (status, _) =
                common::envoy::http_post(admin, "/drain_listeners?graceful&skip_exit")
                    .expect("admin answers");
            assert_eq!(status, 200);
        }
        started_tx.send(at).expect("sockets listening");
        let mut endings = BTreeMap::new();
        let mut late = Duration::ZERO;
        for t in tasks {
            let (what, took) = t.await.expect("socket task");
            late = late.max(took);
            *endings.entry(what).or_insert(0) += 1;
        }
        let mut exited = None;
        if sigterm {
            while at.elapsed() < limit + Duration::from_secs(10) {
                if !stack.envoy.is_running() {
                    exited = Some(at.elapsed());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        (endings, late, exited)
    });
    let how = if sigterm {
        "SIGTERM"
    } else {
        "POST /drain_listeners?graceful"
    };
    println!("\n### 2. {how}, {sockets} sockets each with a response in flight (drain_seconds {DRAIN_SECONDS})");
    println!(
        "endings: {}; the last socket ended {:.2} s after the drain began (limit {} s){}",
        counted(&endings),
        late.as_secs_f64(),
        limit.as_secs(),
        match exited {
            Some(t) => format!("; Envoy exited after {:.2} s", t.as_secs_f64()),
            None if sigterm => "; Envoy STILL RUNNING".into(),
            None => String::new(),
        }
    );
    let expected = "response.failed (server_shutting_down), close 1001";
    endings.len() == 1
        && endings.contains_key(expected)
        && late <= limit
        && (!sigterm || exited.is_some())
}

/// Run 3: the upstream fails mid-stream for every socket; then each runs one more turn.
fn upstream_failure(runtime: &tokio::runtime::Runtime, upstream_port: u16, sockets: usize) -> bool {
    let stack = module_stack(upstream_port);
    let port = stack.envoy.port();
    let start = Instant::now();
    let endings = runtime.block_on(async {
        let tasks: Vec<_> = (0..sockets)
            .map(|n| {
                tokio::spawn(async move {
                    let mut socket = open(port, format!("fail-{n}"), None).await;
                    socket
                        .send(create(json!({"model": "m", "input": "FAIL"})))
                        .await
                        .expect("send");
                    let mut error_event = false;
                    let failed = loop {
                        match next(&mut socket, TIMEOUT).await {
                            Next::Event(e) if e["type"] == "error" => error_event = true,
                            Next::Event(e) if terminal(&e) => break e,
                            Next::Event(_) => {}
                            Next::Closed(how) => {
                                return format!("close {how} before a terminal event")
                            }
                        }
                    };
                    let code = failed["response"]["error"]["code"]
                        .as_str()
                        .unwrap_or("")
                        .to_owned();
                    let after =
                        match turn(&mut socket, json!({"model": "m", "input": "again"})).await {
                            Ok(e) => e["type"].as_str().unwrap_or("").to_owned(),
                            Err(how) => format!("close {how}"),
                        };
                    let _ = socket.close(None).await;
                    format!(
                        "{}{} ({code}), next turn {after}",
                        if error_event { "error + " } else { "" },
                        failed["type"].as_str().unwrap_or("")
                    )
                })
            })
            .collect();
        let mut endings = BTreeMap::new();
        for t in tasks {
            *endings.entry(t.await.expect("socket task")).or_insert(0) += 1;
        }
        endings
    });
    println!("\n### 3. The upstream fails mid-stream, {sockets} sockets");
    println!(
        "endings: {} ({:.1} s)",
        counted(&endings),
        start.elapsed().as_secs_f64()
    );
    endings.len() == 1
        && endings.keys().all(|e| {
            e.starts_with("error + response.failed") && e.ends_with("next turn response.completed")
        })
}

/// A client beside them: how its turn ended.
async fn beside(port: u16) -> String {
    let mut socket = open(port, "beside".into(), None).await;
    match turn(&mut socket, json!({"model": "m", "input": "beside"})).await {
        Ok(e) => e["type"].as_str().unwrap_or("").to_owned(),
        Err(how) => format!("close {how}"),
    }
}

/// The closes Envoy's stats count, by code.
fn closes(stack: &Stack) -> BTreeMap<String, usize> {
    let (_, text) = common::envoy::http_get(stack.envoy.admin_port(), "/stats/prometheus")
        .expect("Envoy's stats");
    common::prom::Export::parse(&text)
        .series("envoy_responses_module_websocket_closes_total")
        .filter(|s| s.value > 0.0)
        .map(|s| (s.labels["code"].clone(), s.value as usize))
        .collect()
}

/// Run 4: clients that do not read, then clients that read (`NOREAD_KINDS`: `ping`, `flood`,
/// `read`, comma-separated; all by default); Envoy's memory.
fn noread(runtime: &tokio::runtime::Runtime, upstream_port: u16, n: usize, batches: usize) -> bool {
    println!("\n### 4. {n} clients that do not read, each from its own address");
    println!(
        "\n| clients | Envoy RSS before | peak (VmHWM) | growth | closes (Envoy's stats) | endings once they read | a client beside |"
    );
    println!("|---|---:|---:|---:|---|---|---|");
    let kinds = std::env::var("NOREAD_KINDS").unwrap_or_else(|_| "ping,flood,read".into());
    let mut ok = true;
    for kind in kinds.split(',') {
        let stack = module_stack(upstream_port);
        let (port, pid) = (stack.envoy.port(), stack.envoy.pid());
        let before = memory(pid, "VmRSS:");
        let (endings, beside) = runtime.block_on(async {
            let endings = match kind {
                "ping" => Some(common::noread::pingers(port, n, 8).await),
                "flood" => Some(common::noread::flooders(port, n, batches).await),
                _ => None,
            };
            if !common::port_accepts(port) {
                let log = stack.envoy.logs();
                panic!("Envoy is gone: {}", &log[log.len().saturating_sub(6000)..]);
            }
            let beside = beside(port).await;
            let endings = match endings {
                Some(sockets) => {
                    counted(&common::noread::endings(sockets, Duration::from_secs(10)).await)
                }
                None => readers(port, n.min(READERS), batches).await,
            };
            (endings, beside)
        });
        let peak = memory(pid, "VmHWM:");
        let growth = peak.saturating_sub(before);
        let what = match kind {
            "ping" => format!("{n} × 8 MiB of pings"),
            "flood" => format!("{n} × creates until closed"),
            _ => format!("{} that read, × {batches},000 turns", n.min(READERS)),
        };
        println!(
            "| {what} | {} | {} | {} | {:?} | {endings} | {beside} |",
            mib(before),
            mib(peak),
            mib(growth),
            closes(&stack),
        );
        ok &= growth <= noread_bound(n, kind);
    }
    ok
}

/// Clients that read what they are sent, each from its own address: `batches` batches of
/// 1,000 `response.create`s answered at once, then the client closes. How they ended.
async fn readers(port: u16, n: usize, batches: usize) -> String {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            tokio::spawn(async move {
                let address = common::noread::caller_address(i);
                let ws = common::noread::open(port, address, None, &[])
                    .await
                    .expect("a socket");
                let (mut sink, mut stream) = ws.split();
                let reader = tokio::spawn(async move {
                    let mut completed = 0usize;
                    while let Some(Ok(Message::Text(text))) = stream.next().await {
                        completed += usize::from(text.contains("\"response.completed\""));
                    }
                    completed
                });
                for j in 0..batches * 1000 {
                    let body = json!({"model": "m", "input": format!("{j}"), "generate": false});
                    if sink.send(create(body)).await.is_err() {
                        break;
                    }
                }
                // Time for the last answers, then the client closes.
                tokio::time::sleep(Duration::from_secs(2)).await;
                let _ = sink.close().await;
                reader.await.unwrap_or(0)
            })
        })
        .collect();
    let mut endings = BTreeMap::new();
    for t in tasks {
        let completed = t.await.expect("reader");
        *endings
            .entry(format!("{completed} turns completed"))
            .or_insert(0) += 1;
    }
    counted(&endings)
}

/// Clients that read in run 4 (each runs `batches` × 1,000 turns).
const READERS: usize = 4;

/// What run 4 may grow Envoy by: `ws_max_total_bytes` plus the documented slack
/// (docs/websocket.md#what-the-budget-does-not-count): per socket, Envoy's write buffer below
/// its watermark and one piece of 64 KiB, and the turns' records on their way (at most
/// `MAX_RECORDS_IN_FLIGHT`, each a request through Envoy's internal listeners, about
/// `RECORD_SLACK` of Envoy's memory). Clients that read hold none of it for long: their
/// growth must stay under a socket's share.
fn noread_bound(n: usize, kind: &str) -> u64 {
    let records = responses_core::connection::MAX_RECORDS_IN_FLIGHT as u64 * RECORD_SLACK;
    match kind {
        "read" => READERS as u64 * (WATERMARK + (64 << 10) + records) + (16 << 20),
        _ => MAX_TOTAL + n as u64 * (WATERMARK + (64 << 10) + records),
    }
}

/// Envoy's memory for one turn's record on its way (a callout into the internal listener
/// `responses_loopback`, its stream there, and the one to `responses_records`): measured,
/// not counted (docs/websocket.md#what-the-budget-does-not-count).
const RECORD_SLACK: u64 = 64 << 10;

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` does not: keep that run small.
    let quick = !std::env::args().any(|a| a == "--bench");
    let (sockets, slow) = if quick { (4, 2) } else { (SOCKETS, SLOW) };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (_upstream, upstream_port) = upstream();
    println!(
        "module mode, Envoy --concurrency 1, {sockets} sockets ({slow} slow readers in run 1)"
    );
    let mut ok = Vec::new();
    if quick {
        // The smoke run of `cargo test`: every path, briefly (no minute of slow reading).
        ok.push((
            "upstream failure",
            upstream_failure(&runtime, upstream_port, sockets),
        ));
        ok.push(("drain", drain(&runtime, upstream_port, sockets, false)));
        ok.push((
            "clients that do not read",
            // Two batches of creates each: the flooders' path, briefly.
            noread(&runtime, upstream_port, sockets, 2),
        ));
    } else {
        // `RUNS=load,sigterm,drain,failure` (the default: all).
        let runs = std::env::var("RUNS").unwrap_or_else(|_| "load,sigterm,drain,failure".into());
        let runs: Vec<&str> = runs.split(',').collect();
        if runs.contains(&"load") {
            ok.push(("load", load(&runtime, upstream_port, sockets, slow)));
        }
        if runs.contains(&"sigterm") {
            ok.push(("SIGTERM", drain(&runtime, upstream_port, sockets, true)));
        }
        if runs.contains(&"drain") {
            let drained = drain(&runtime, upstream_port, sockets, false);
            ok.push(("drain_listeners", drained));
        }
        if runs.contains(&"failure") {
            let failed = upstream_failure(&runtime, upstream_port, sockets);
            ok.push(("upstream failure", failed));
        }
        if runs.contains(&"noread") {
            ok.push((
                "clients that do not read",
                noread(&runtime, upstream_port, NOREAD, 100),
            ));
        }
    }
    let failed: Vec<_> = ok
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(what, _)| *what)
        .collect();
    assert!(failed.is_empty(), "not as documented: {failed:?}");
    println!("\nevery run as documented");
}
