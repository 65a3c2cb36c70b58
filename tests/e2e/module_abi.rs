//! What Envoy 1.40's dynamic-module ABI gives a filter that serves a WebSocket itself, proven
//! through the real Envoy with the module's ABI probe (module/src/probe.rs, built with the
//! `abi-probe` feature, which the root package's dev-dependency turns on in the test build) and a real WebSocket
//! client: the upgrade answered with `send_response_headers`, frames in the request-body hook
//! and out with `send_response_data`, streaming callouts to a cluster (chunk by chunk, reset,
//! refused, a client gone mid-call), timers on the worker, the downstream watermarks, Envoy's
//! drain through the module's bootstrap extension (with and without it, and on SIGTERM), and
//! HTTP/2's extended CONNECT. docs/websocket.md ("Module mode: what Envoy 1.40's ABI gives")
//! records what these show. Module mode only: the probe is the module's.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

use common::envoy::{http_get, http_post};
use common::websocket::Socket;
use common::{free_port, only_module, repo_root, wait_until, Envoy, Gate, Reply, ScriptedUpstream};

const WHY: &str = "the ABI probe is the module's";
const TIMEOUT: Duration = Duration::from_secs(20);

/// The fixture's Envoy in front of `upstream`, with the module's bootstrap extension or
/// without it; the module's debug lines on (they say which hooks Envoy re-entered).
fn start(upstream: &ScriptedUpstream, drain_extension: bool) -> Envoy {
    let path = repo_root().join("tests/fixtures/module_abi/envoy.yaml");
    let mut config = std::fs::read_to_string(&path).expect("read the fixture");
    if !drain_extension {
        let begin = config.find("# drain extension: begin").expect("marker");
        let end = config.find("# drain extension: end").expect("marker");
        config.replace_range(begin..end, "");
    }
    let config = config
        .replace("UPSTREAM_PORT", &upstream.port().to_string())
        .replace("REFUSED_PORT", &free_port().to_string());
    let envoy = Envoy::start_with_config(&config);
    let (status, _) =
        http_post(envoy.admin_port(), "/logging?dynamic_modules=debug").expect("admin answers");
    assert_eq!(status, 200);
    assert!(
        !envoy.logs().contains("config refused"),
        "the module has the probe (build it with --features abi-probe): {}",
        envoy.logs()
    );
    envoy
}

async fn connect(envoy: &Envoy) -> Socket {
    let url = format!("ws://127.0.0.1:{}/probe", envoy.port());
    let (socket, response) = tokio::time::timeout(TIMEOUT, tokio_tungstenite::connect_async(url))
        .await
        .expect("the handshake in time")
        .expect("a completed handshake (the client checked Sec-WebSocket-Accept)");
    assert_eq!(response.status(), 101);
    socket
}

async fn say(socket: &mut Socket, command: &str) {
    socket
        .send(Message::text(command))
        .await
        .expect("the socket takes the message");
}

/// The next message: its text (binary: `[binary N]`; a close: `[close CODE]`).
async fn next(socket: &mut Socket) -> String {
    loop {
        let message = tokio::time::timeout(TIMEOUT, socket.next())
            .await
            .expect("a message in time")
            .expect("the socket is open")
            .expect("a readable message");
        return match message {
            Message::Text(text) => text.to_string(),
            Message::Binary(bytes) => format!("[binary {}]", bytes.len()),
            Message::Close(frame) => format!("[close {}]", frame.map_or(0, |f| u16::from(f.code))),
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
        };
    }
}

/// The id in `callout <id> started`.
fn started(message: &str) -> u64 {
    message
        .strip_prefix("callout ")
        .and_then(|m| m.strip_suffix(" started"))
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("expected `callout <id> started`, got {message:?}"))
}

/// The probe's and the module's lines in Envoy's log.
fn module_log(envoy: &Envoy) -> Vec<String> {
    envoy
        .logs()
        .lines()
        .filter_map(|l| {
            l.split_once("[dynamic_modules] [:] ")
                .map(|(_, m)| m.to_owned())
        })
        .collect()
}

fn stat(envoy: &Envoy, name: &str) -> u64 {
    let (_, body) =
        http_get(envoy.admin_port(), &format!("/stats?filter=^{name}$")).expect("admin answers");
    body.split_once(": ")
        .and_then(|(_, v)| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no stat {name}: {body:?}"))
}

fn event(text: &str) -> Bytes {
    Bytes::from(format!(
        "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n"
    ))
}

#[tokio::test]
async fn the_filter_answers_the_upgrade_itself_and_echoes_frames() {
    if !only_module(WHY) {
        return;
    }
    let upstream = ScriptedUpstream::start();
    let envoy = start(&upstream, true);
    let mut socket = connect(&envoy).await;
    for text in ["hello", "again", &"x".repeat(300)] {
        say(&mut socket, &format!("echo {text}")).await;
        assert_eq!(next(&mut socket).await, text);
    }
    socket.close(None).await.expect("close");
    assert_eq!(next(&mut socket).await, "[close 1000]");
    wait_until("the filter to be destroyed", TIMEOUT, || {
        module_log(&envoy)
            .iter()
            .any(|l| l.contains("destroyed"))
            .then_some(())
    });
    let log = module_log(&envoy);
    assert!(
        log.iter()
            .any(|l| l.contains(r#"method=GET protocol=None upgrade=Some("websocket") key=true"#)),
        "{log:#?}"
    );
    // Envoy never shows the filter its own 101 and frames (no response hook runs), nor does
    // the router ever see the request: nothing went upstream.
    assert!(
        !log.iter().any(|l| l.contains("abi_probe: response_")),
        "{log:#?}"
    );
    assert!(upstream.requests().is_empty());
    // Ending the answer from inside the request-body hook ends the stream there: Envoy calls
    // stream-complete from inside it (re-entered; delivered when the hook returned).
    assert!(
        log.iter().any(|l| l.contains("stream_complete re-entered")),
        "{log:#?}"
    );
}

#[tokio::test]
async fn a_callout_streams_its_answer_chunk_by_chunk_and_the_socket_stays_open() {
    if !only_module(WHY) {
        return;
    }
    let gate = Gate::new();
    let chunks = [event("one"), event("two"), Bytes::from("data: [DONE]\n\n")];
    let upstream =
        ScriptedUpstream::with_replies([Reply::sse(chunks.clone()).pause_after(1, &gate)]);
    let envoy = start(&upstream, true);
    let mut socket = connect(&envoy).await;
    say(&mut socket, "call upstream").await;
    let id = started(&next(&mut socket).await);
    assert_eq!(next(&mut socket).await, format!("callout {id} head 200"));
    // The first chunk is in the socket while the upstream still holds the second (the gate
    // is released only below).
    let first = next(&mut socket).await;
    gate.wait_reached(TIMEOUT).await;
    assert_eq!(
        first,
        format!("callout {id} data {}", String::from_utf8_lossy(&chunks[0]))
    );
    gate.release();
    let mut rest = String::new();
    loop {
        let message = next(&mut socket).await;
        if message == format!("callout {id} complete") {
            break;
        }
        let data = message
            .strip_prefix(&format!("callout {id} data "))
            .unwrap_or_else(|| panic!("a data message, got {message:?}"));
        rest.push_str(data);
    }
    assert_eq!(
        rest,
        format!(
            "{}{}",
            String::from_utf8_lossy(&chunks[1]),
            String::from_utf8_lossy(&chunks[2])
        )
    );
    // The socket outlives the call.
    say(&mut socket, "echo still open").await;
    assert_eq!(next(&mut socket).await, "still open");
    let requests = upstream.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].method, "POST");
    assert_eq!(requests[0].path, "/v1/chat/completions");
    assert_eq!(requests[0].json()["stream"], true);
    assert_eq!(requests[0].header("host"), Some("upstream"));
}

/// An upstream whose one answer, a stream of two events, pauses after the first until `gate`
/// is released.
fn paused_after_one(gate: &Gate) -> ScriptedUpstream {
    ScriptedUpstream::with_replies([Reply::sse([event("one"), event("two")]).pause_after(1, gate)])
}

#[tokio::test]
async fn callout_resets_refusals_and_unknown_clusters_are_reported() {
    if !only_module(WHY) {
        return;
    }
    let gate = Gate::new();
    let upstream = paused_after_one(&gate);
    let envoy = start(&upstream, true);
    let mut socket = connect(&envoy).await;

    // A cluster that refuses the connection: not a reset, but Envoy's own 503 answer.
    say(&mut socket, "call refused").await;
    let id = started(&next(&mut socket).await);
    assert_eq!(next(&mut socket).await, format!("callout {id} head 503"));
    let body = next(&mut socket).await;
    assert!(
        body.starts_with(&format!("callout {id} data upstream connect error")),
        "{body}"
    );
    assert_eq!(next(&mut socket).await, format!("callout {id} complete"));

    // No such cluster: refused at once, no event follows.
    say(&mut socket, "call nowhere").await;
    assert_eq!(next(&mut socket).await, "callout refused NoCluster");

    // Reset by the filter once its head arrived: reported from inside the reset call.
    say(&mut socket, "call upstream reset").await;
    let id = started(&next(&mut socket).await);
    assert_eq!(next(&mut socket).await, format!("callout {id} head 200"));
    assert_eq!(
        next(&mut socket).await,
        format!("callout {id} reset LocalReset")
    );
    gate.release();
    say(&mut socket, "echo after").await;
    assert_eq!(next(&mut socket).await, "after");
    let log = module_log(&envoy);
    assert!(
        log.iter()
            .any(|l| l.contains("http_stream_reset re-entered")),
        "{log:#?}"
    );
    assert_eq!(upstream.requests().len(), 1);
}

#[tokio::test]
async fn a_client_gone_mid_callout_ends_it_upstream_without_an_event() {
    if !only_module(WHY) {
        return;
    }
    let gate = Gate::new();
    let upstream = paused_after_one(&gate);
    let envoy = start(&upstream, true);
    let mut socket = connect(&envoy).await;
    say(&mut socket, "call upstream").await;
    let id = started(&next(&mut socket).await);
    assert_eq!(next(&mut socket).await, format!("callout {id} head 200"));
    assert!(next(&mut socket)
        .await
        .starts_with(&format!("callout {id} data")));
    gate.wait_reached(TIMEOUT).await;
    drop(socket); // the TCP connection goes, no close frame
    wait_until("the filter to be destroyed", TIMEOUT, || {
        module_log(&envoy)
            .iter()
            .any(|l| l.contains("destroyed"))
            .then_some(())
    });
    // Envoy closed the upstream connection under the call...
    wait_until("the upstream connection to close", TIMEOUT, || {
        (stat(
            &envoy,
            "cluster.upstream.upstream_cx_destroy_local_with_active_rq",
        ) == 1)
            .then_some(())
    });
    // ... and told the filter nothing of it: the filter was destroyed first.
    let log = module_log(&envoy);
    assert!(
        !log.iter()
            .any(|l| l.contains(&format!("callout {id} reset"))
                || l.contains(&format!("callout {id} complete"))),
        "{log:#?}"
    );
    gate.release();
}

#[tokio::test]
async fn a_timer_fires_on_the_worker_and_a_disarmed_or_destroyed_one_never_does() {
    if !only_module(WHY) {
        return;
    }
    let upstream = ScriptedUpstream::start();
    let envoy = start(&upstream, true);
    let mut socket = connect(&envoy).await;
    say(&mut socket, "timer 100").await;
    assert_eq!(next(&mut socket).await, "timer armed");
    let fired = next(&mut socket).await;
    assert!(fired.starts_with("timer fired after "), "{fired}");
    assert!(fired.ends_with("same_thread=true early=false"), "{fired}");

    say(&mut socket, "disarm 50").await;
    assert_eq!(next(&mut socket).await, "timer disarmed");
    tokio::time::sleep(Duration::from_millis(300)).await;
    say(&mut socket, "echo nothing in between").await;
    assert_eq!(next(&mut socket).await, "nothing in between");

    // Armed, then the client goes: the filter is destroyed before its deadline.
    say(&mut socket, "timer 300").await;
    assert_eq!(next(&mut socket).await, "timer armed");
    drop(socket);
    wait_until("the filter to be destroyed", TIMEOUT, || {
        module_log(&envoy)
            .iter()
            .any(|l| l.contains("destroyed timer_armed=true"))
            .then_some(())
    });
    tokio::time::sleep(Duration::from_millis(600)).await;
    let log = module_log(&envoy);
    assert_eq!(
        log.iter().filter(|l| l.contains("timer fired")).count(),
        1,
        "{log:#?}"
    );
    // Envoy is fine, and the module serves on.
    let mut socket = connect(&envoy).await;
    say(&mut socket, "echo alive").await;
    assert_eq!(next(&mut socket).await, "alive");
}

#[tokio::test]
async fn the_watermark_hooks_follow_a_slow_reader() {
    if !only_module(WHY) {
        return;
    }
    let upstream = ScriptedUpstream::start();
    let envoy = start(&upstream, true);
    let mut socket = connect(&envoy).await;
    // 4 MiB at once, four times Envoy's default 1 MiB connection buffer, to a client that
    // reads nothing for a while.
    say(&mut socket, "flood 64 64").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..64 {
        assert_eq!(next(&mut socket).await, "[binary 65536]");
    }
    // The high watermark was reported from inside the writes (re-entered), so the filter
    // knew before its hook returned.
    assert_eq!(next(&mut socket).await, "flood sent blocked=true");
    say(&mut socket, "stats").await;
    let stats = next(&mut socket).await;
    let counts: Vec<u32> = stats
        .split_whitespace()
        .filter_map(|w| w.split_once('=').and_then(|(_, n)| n.parse().ok()))
        .collect();
    assert!(stats.ends_with("blocked=false"), "{stats}");
    assert!(
        counts.len() == 2 && counts[0] >= 1 && counts[0] == counts[1],
        "{stats}"
    );
    let log = module_log(&envoy);
    assert!(
        log.iter()
            .any(|l| l.contains("downstream_above_write_buffer_high_watermark re-entered")),
        "{log:#?}"
    );
}

#[tokio::test]
async fn with_the_bootstrap_extension_a_socket_hears_envoys_drain() {
    if !only_module(WHY) {
        return;
    }
    let upstream = ScriptedUpstream::start();
    let envoy = start(&upstream, true);
    let mut socket = connect(&envoy).await;
    let mut quiet = connect(&envoy).await;
    say(&mut socket, "watch-drain").await;
    assert_eq!(next(&mut socket).await, "drain watched already=false");
    let (status, _) = http_post(envoy.admin_port(), "/drain_listeners?graceful").expect("admin");
    assert_eq!(status, 200);
    assert_eq!(next(&mut socket).await, "drain started");
    assert_eq!(
        next(&mut socket).await,
        format!("[close {}]", u16::from(CloseCode::Away))
    );
    // The extension and the filter share the module's statics (one load per process): the
    // drain reached the one socket watching it, and only it.
    let log = module_log(&envoy);
    assert!(
        log.iter()
            .any(|l| l.contains("drain started: told 1 open stream(s)")),
        "{log:#?}"
    );
    say(&mut quiet, "echo untouched").await;
    assert_eq!(next(&mut quiet).await, "untouched");
    // A socket that asks after the drain began learns it at once.
    say(&mut quiet, "watch-drain").await;
    assert_eq!(next(&mut quiet).await, "drain watched already=true");
}

#[tokio::test]
async fn without_the_extension_a_socket_hears_nothing_of_the_drain() {
    if !only_module(WHY) {
        return;
    }
    let upstream = ScriptedUpstream::start();
    let envoy = start(&upstream, false);
    let mut socket = connect(&envoy).await;
    say(&mut socket, "watch-drain").await;
    assert_eq!(next(&mut socket).await, "drain watched already=false");
    let (status, _) = http_post(envoy.admin_port(), "/drain_listeners?graceful").expect("admin");
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_secs(1)).await;
    say(&mut socket, "echo still served").await;
    assert_eq!(next(&mut socket).await, "still served");
    assert!(!module_log(&envoy)
        .iter()
        .any(|l| l.contains("drain started")));
}

#[tokio::test]
async fn on_sigterm_the_extension_tells_the_sockets_before_envoy_exits() {
    if !only_module(WHY) {
        return;
    }
    let upstream = ScriptedUpstream::start();
    let mut envoy = start(&upstream, true);
    let mut socket = connect(&envoy).await;
    say(&mut socket, "watch-drain").await;
    assert_eq!(next(&mut socket).await, "drain watched already=false");
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &envoy.pid().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    assert_eq!(next(&mut socket).await, "drain started");
    assert_eq!(
        next(&mut socket).await,
        format!("[close {}]", u16::from(CloseCode::Away))
    );
    wait_until("Envoy to exit", TIMEOUT, || {
        (!envoy.is_running()).then_some(())
    });
    let log = module_log(&envoy);
    assert!(
        log.iter()
            .any(|l| l.contains("shutdown: told 1 open stream(s)")),
        "{log:#?}"
    );
    // Envoy exited once the socket had ended (its completion waited for it).
    let destroyed = log.iter().position(|l| l.contains("abi_probe: destroyed"));
    let done = log
        .iter()
        .position(|l| l.contains("shutdown: done waiting"));
    assert!(destroyed.is_some() && destroyed < done, "{log:#?}");
}

#[tokio::test]
async fn on_sigterm_envoy_waits_for_a_socket_told_of_it_up_to_drain_seconds() {
    if !only_module(WHY) {
        return;
    }
    let upstream = ScriptedUpstream::start();
    let mut envoy = start(&upstream, true);
    let mut socket = connect(&envoy).await;
    // This one hears the drain but keeps its socket open.
    say(&mut socket, "watch-drain keep").await;
    assert_eq!(next(&mut socket).await, "drain watched already=false");
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &envoy.pid().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    assert_eq!(next(&mut socket).await, "drain started");
    // Envoy serves on meanwhile (the fixture's drain_seconds is 3)...
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(envoy.is_running());
    say(&mut socket, "echo during the shutdown").await;
    assert_eq!(next(&mut socket).await, "during the shutdown");
    // ... then exits, cutting the socket (no close frame: the filter sent none).
    let end = tokio::time::timeout(TIMEOUT, socket.next())
        .await
        .expect("the end in time");
    assert!(
        !matches!(end, Some(Ok(Message::Close(_)))),
        "cut, not closed: {end:?}"
    );
    wait_until("Envoy to exit", TIMEOUT, || {
        (!envoy.is_running()).then_some(())
    });
    let log = module_log(&envoy);
    assert!(
        log.iter().any(|l| l.contains("waiting up to 3 s")),
        "{log:#?}"
    );
    assert!(
        log.iter().any(|l| l.contains("shutdown: done waiting")),
        "{log:#?}"
    );
}

/// RFC 8441: the WebSocket over an HTTP/2 stream (`CONNECT` with `:protocol: websocket`),
/// which Envoy allows with `http2_protocol_options.allow_connect` (the route's
/// `upgrade_configs: websocket` covers both forms).
#[tokio::test]
async fn http2_extended_connect_reaches_the_filter_as_an_upgrade() {
    if !only_module(WHY) {
        return;
    }
    let upstream = ScriptedUpstream::start();
    let envoy = start(&upstream, true);
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", envoy.port()))
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    // Envoy's SETTINGS (SETTINGS_ENABLE_CONNECT_PROTOCOL) arrive on the connection's task.
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !client.is_extended_connect_protocol_enabled() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "Envoy's settings in time"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let request = http::Request::builder()
        .method("CONNECT")
        .uri(format!("http://127.0.0.1:{}/probe", envoy.port()))
        .header("sec-websocket-version", "13")
        .extension(h2::ext::Protocol::from_static("websocket"))
        .body(())
        .expect("request");
    let (response, mut send) = client.send_request(request, false).expect("send");
    let response = tokio::time::timeout(TIMEOUT, response)
        .await
        .expect("an answer in time")
        .expect("an answer");
    // The filter's 101 goes out as HTTP/2's 200 (Envoy's codec turns it around).
    assert_eq!(response.status(), 200);
    // A masked text frame "echo over h2", as a client sends it.
    let payload = b"echo over h2";
    let mask = [1u8, 2, 3, 4];
    let mut frame = vec![0x81, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&mask);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    send.send_data(Bytes::from(frame), false).expect("data");
    let mut body = response.into_body();
    let data = tokio::time::timeout(TIMEOUT, body.data())
        .await
        .expect("data in time")
        .expect("a data frame")
        .expect("readable");
    assert_eq!(&data[..], b"\x81\x07over h2");
    // Envoy shows the filter the HTTP/1.1 form of the upgrade (GET, `upgrade: websocket`,
    // no `:protocol`), without a Sec-WebSocket-Key (RFC 8441 has none: no accept is due).
    let log = module_log(&envoy);
    assert!(
        log.iter().any(|l| l
            .ends_with(r#"request_headers method=GET protocol=None upgrade=Some("websocket") key=false end=false"#)),
        "{log:#?}"
    );
}
