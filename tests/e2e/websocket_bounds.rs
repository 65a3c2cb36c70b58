//! The WebSocket transport's bounds through the real Envoy, in both modes: what a socket is
//! charged for (what it holds, never what a frame head announces; what waits for a client that
//! does not read, `ws_max_unread_bytes` and the shared budget) and who may open one (callers
//! told apart by the address Envoy sees, not by what they send; `Origin`s). Each limit from
//! both sides. The core's rules behind them are in `core/src/connection.rs` and
//! `core/src/connection/admission.rs`, tested with plain bytes there.
//!
//! Envoy listens on 127.0.0.1: a client bound to 127.0.0.2 is another address to it.

use crate::common;

use std::net::Ipv4Addr;
use std::time::Duration;

use common::{noread, tenant, wait_until, Mode, Reply, ScriptedUpstream, Stack};
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;

use super::websocket::{ask, chat_sse, closed, completed, create, response, TIMEOUT};

type Socket = common::websocket::Socket;

const HERE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const ELSEWHERE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// Opens a socket from `source` with these handshake headers, the client's receive buffer
/// `recv_buffer` bytes if given (a client that does not read: Envoy, not its kernel, then holds
/// what it leaves); the refusal's status and error code if refused.
async fn open(
    stack: &Stack,
    source: Ipv4Addr,
    headers: &[(&str, &str)],
    recv_buffer: Option<u32>,
) -> Result<Socket, (u16, String)> {
    noread::open(stack.envoy.port(), source, recv_buffer, headers).await
}

fn exhausted() -> (u16, String) {
    (429, "websocket_connections_exhausted".to_owned())
}

/// A client's masked frame head: FIN, `opcode`, a 64-bit payload length.
fn frame_head(opcode: u8, len: u64) -> Vec<u8> {
    let mut head = vec![0x80 | opcode, 0x80 | 127];
    head.extend_from_slice(&len.to_be_bytes());
    head.extend_from_slice(&[1, 2, 3, 4]);
    head
}

/// Writes `bytes` under the client's framing (the frame heads and payloads are the test's).
#[track_caller]
fn raw<'a>(socket: &'a mut Socket, bytes: &'a [u8]) -> impl std::future::Future<Output = ()> + 'a {
    let caller = std::panic::Location::caller();
    async move {
        if let Err(e) = socket.get_mut().write_all(bytes).await {
            panic!("write at {caller}: {e}");
        }
    }
}

/// The server's frames in `bytes` (unmasked, whole): opcode and payload.
fn server_frames(mut bytes: &[u8]) -> Vec<(u8, &[u8])> {
    let mut frames = Vec::new();
    while bytes.len() >= 2 {
        let (len, at) = match bytes[1] & 0x7F {
            126 => (usize::from(u16::from_be_bytes([bytes[2], bytes[3]])), 4),
            127 => (
                u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
                10,
            ),
            n => (usize::from(n), 2),
        };
        assert!(bytes.len() >= at + len, "a frame cut short");
        frames.push((bytes[0] & 0x0F, &bytes[at..at + len]));
        bytes = &bytes[at + len..];
    }
    assert!(bytes.is_empty(), "a frame head cut short");
    frames
}

/// The WebSocket closes the translator sent with `code`, from its metrics: the processor's
/// `/metrics` (ext_proc, `metrics_port`), Envoy's stats (module); `None` if they did not
/// answer in time (a busy processor).
fn closes(stack: &Stack, metrics_port: u16, code: &str) -> Option<f64> {
    let (port, path, name) = match common::mode() {
        Mode::ExtProc => (
            metrics_port,
            "/metrics",
            format!(
                "{}websocket_closes_total",
                responses_extproc::metrics::PREFIX
            ),
        ),
        Mode::Module => (
            stack.envoy.admin_port(),
            "/stats/prometheus",
            "envoy_responses_module_websocket_closes_total".to_owned(),
        ),
    };
    // Asked again while the server is too busy to answer within the GET's own timeouts.
    let (status, text) = common::wait_until("the metrics", TIMEOUT, || {
        common::envoy::http_get(port, path)
    });
    assert_eq!(status, 200, "{path}");
    // No series before the first close of a code.
    let count = common::prom::Export::parse(&text)
        .series(&name)
        .filter(|s| s.labels.get("code").map(String::as_str) == Some(code))
        .map(|s| s.value)
        .sum();
    Some(count)
}

/// The processor's metrics listener (ext_proc mode), added to `args`.
fn with_metrics<'a>(args: &[&'a str], listen: &'a str) -> Vec<&'a str> {
    let mut all = args.to_vec();
    if common::mode() == Mode::ExtProc {
        all.extend(["--metrics-listen", listen]);
    }
    all
}

#[tokio::test]
async fn one_address_cannot_take_every_socket_whatever_keys_it_sends() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_sse("ok"));
    // The defaults: 1,024 sockets, 64 per address, no key header.
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let per_address = responses_core::settings::DEFAULT_WS_MAX_CONNECTIONS_PER_ADDRESS;
    let mut held = Vec::new();
    for i in 0..1030 {
        let key = format!("Bearer sk-{i}");
        match open(&stack, HERE, &[("authorization", &key)], None).await {
            Ok(ws) => {
                assert!(i < per_address, "socket {i} opened");
                held.push(ws);
            }
            Err(refused) => {
                assert_eq!(refused, exhausted(), "socket {i}");
                assert!(i >= per_address, "socket {i} refused");
            }
        }
    }
    // Just under: the 64th opened; just over: the 65th and every later one did not.
    assert_eq!(held.len(), per_address);
    // A caller from another address gets a socket, and its turn.
    let mut other = open(&stack, ELSEWHERE, &[("authorization", "Bearer sk-0")], None)
        .await
        .expect("a socket for another address");
    ask(&mut other, json!({"model": "m", "input": "x"})).await;
    completed(&mut other).await;
    // A place given back is taken again.
    drop(held.pop());
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        match open(&stack, HERE, &[], None).await {
            Ok(ws) => break held.push(ws),
            Err(refused) => assert_eq!(refused, exhausted()),
        }
        assert!(tokio::time::Instant::now() < deadline, "never released");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A header of the client's own naming an address changes nothing (ext_proc: Envoy
    // replaces it; module: the filter never reads it).
    let spoofed = [(
        responses_core::connection::admission::CLIENT_ADDRESS_HEADER,
        "203.0.113.9",
    )];
    assert_eq!(
        open(&stack, HERE, &spoofed, None).await.err(),
        Some(exhausted())
    );
    // With no origin listed, a browser page's handshake is refused; API clients send none.
    assert_eq!(
        open(
            &stack,
            ELSEWHERE,
            &[("origin", "https://app.example")],
            None
        )
        .await
        .err(),
        Some((403, "origin_not_allowed".to_owned()))
    );
}

/// `--ws-key-header` naming a header Envoy sets after verifying the caller: `jwt_authn`'s
/// claim header (`tests/common/tenant.rs`: a client's own removed first, then set from a
/// verified token's `tenant` claim).
#[tokio::test]
async fn a_key_header_envoy_sets_is_a_quota_of_its_own_and_listed_origins_get_in() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_sse("ok"));
    let stack = Stack::with_websocket_edited(
        upstream.port(),
        &[
            "--ws-key-header",
            tenant::HEADER,
            "--ws-max-connections-per-key",
            "2",
            "--ws-allowed-origins",
            "https://app.example",
        ],
        tenant::from_jwt,
    );
    let (a, b) = (tenant::of("team-a"), tenant::of("team-b"));
    // One verified caller, from two addresses: two sockets, just under; a third, just over.
    let _a1 = open(&stack, HERE, &[("authorization", &a)], None)
        .await
        .unwrap();
    let _a2 = open(&stack, ELSEWHERE, &[("authorization", &a)], None)
        .await
        .unwrap();
    assert_eq!(
        open(&stack, HERE, &[("authorization", &a)], None)
            .await
            .err(),
        Some(exhausted())
    );
    // Naming another caller itself changes nothing: Envoy removed its header, set the token's.
    assert_eq!(
        open(
            &stack,
            HERE,
            &[("authorization", &a), (tenant::HEADER, "team-z")],
            None
        )
        .await
        .err(),
        Some(exhausted())
    );
    // Another verified caller from the same address gets in, and its turn.
    let mut bob = open(&stack, HERE, &[("authorization", &b)], None)
        .await
        .unwrap();
    ask(&mut bob, json!({"model": "m", "input": "x"})).await;
    completed(&mut bob).await;
    // Callers without a token share one quota, whatever they name.
    let _n1 = open(&stack, HERE, &[(tenant::HEADER, "n1")], None)
        .await
        .unwrap();
    let _n2 = open(&stack, HERE, &[(tenant::HEADER, "n2")], None)
        .await
        .unwrap();
    assert_eq!(
        open(&stack, HERE, &[(tenant::HEADER, "n3")], None)
            .await
            .err(),
        Some(exhausted())
    );
    // Listed origins get in; others are refused before any place is taken.
    let carol = tenant::of("team-c");
    let _page = open(
        &stack,
        ELSEWHERE,
        &[("authorization", &carol), ("origin", "https://app.example")],
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        open(
            &stack,
            ELSEWHERE,
            &[
                ("authorization", &carol),
                ("origin", "https://evil.example")
            ],
            None
        )
        .await
        .err(),
        Some((403, "origin_not_allowed".to_owned()))
    );
}

/// Four sockets each send the head of a text frame as large as the decoder reads (twice
/// `max_request_bytes`: 32 MiB), then nothing. Before, each announced length was reserved and
/// charged to the shared budget (128 MiB), and every other socket was closed with 1013 as soon
/// as it held a byte.
#[tokio::test]
async fn four_sockets_announcing_32_mib_frames_do_not_disturb_a_fifths_turn() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_sse("ok"));
    let stack = Stack::with_websocket(upstream.port(), &[]);
    let read_limit = 2 * responses_core::translate::limits::MAX_REQUEST_BYTES as u64;
    let mut heads = Vec::new();
    for i in 0..4 {
        let mut ws = open(&stack, HERE, &[], None).await.unwrap();
        raw(&mut ws, &frame_head(0x1, read_limit)).await;
        // Some of the frame, for all but the first.
        raw(&mut ws, &vec![b'x'; i * 1000]).await;
        heads.push(ws);
    }
    let mut fifth = open(&stack, ELSEWHERE, &[], None).await.unwrap();
    for turn in 0..3 {
        ask(
            &mut fifth,
            json!({"model": "m", "input": format!("turn {turn}")}),
        )
        .await;
        completed(&mut fifth).await;
    }
    // Just over what the decoder reads: refused from its head (1009), the others untouched.
    let mut over = open(&stack, HERE, &[], None).await.unwrap();
    raw(&mut over, &frame_head(0x1, read_limit + 1)).await;
    match tokio::time::timeout(TIMEOUT, over.next())
        .await
        .expect("an answer")
    {
        Some(Ok(Message::Text(text))) => {
            assert!(text.contains("request_too_large"), "{text}");
            let end = closed(&mut over).await;
            assert!(matches!(end, Some(CloseCode::Size) | None), "{end:?}");
        }
        Some(Ok(Message::Close(frame))) => {
            assert_eq!(frame.map(|f| f.code), Some(CloseCode::Size));
        }
        other => panic!("{other:?}"),
    }
    ask(&mut fifth, json!({"model": "m", "input": "still served"})).await;
    completed(&mut fifth).await;
    assert_eq!(upstream.requests().len(), 4, "the fifth's turns only");
}

/// What arrives of a frame is charged as it arrives: over the budget, the socket whose bytes
/// took it there closes (1013) and the others go on.
#[tokio::test]
async fn the_bytes_of_a_frame_count_as_they_arrive() {
    const BUDGET: usize = 8 << 20;
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_sse("ok"));
    let budget = BUDGET.to_string();
    let metrics_port = common::free_port();
    let listen = format!("127.0.0.1:{metrics_port}");
    let args = with_metrics(&["--ws-max-total-bytes", &budget], &listen);
    let stack = Stack::with_websocket(upstream.port(), &args);
    let read_limit = 2 * responses_core::translate::limits::MAX_REQUEST_BYTES as u64;
    // 3 MiB of a 4 MiB frame: at most 4 MiB held (the buffer doubles as bytes come), under.
    let mut under = open(&stack, HERE, &[], None).await.unwrap();
    raw(&mut under, &frame_head(0x1, 4 << 20)).await;
    raw(&mut under, &vec![b'x'; 3 << 20]).await;
    let mut fifth = open(&stack, ELSEWHERE, &[], None).await.unwrap();
    ask(&mut fifth, json!({"model": "m", "input": "x"})).await;
    completed(&mut fifth).await;
    // 10 MiB of another: over the 8 MiB budget with it alone. (Its close frame may be lost to
    // the reset of the bytes it still sent: the translator's count says.)
    let mut over = open(&stack, HERE, &[], None).await.unwrap();
    raw(&mut over, &frame_head(0x1, read_limit)).await;
    let _ = over.get_mut().write_all(&vec![b'y'; 10 << 20]).await;
    wait_until("a 1013 close", TIMEOUT, || {
        (closes(&stack, metrics_port, "1013") == Some(1.0)).then_some(())
    });
    let end = closed(&mut over).await;
    assert!(matches!(end, Some(CloseCode::Again) | None), "{end:?}");
    ask(&mut fifth, json!({"model": "m", "input": "y"})).await;
    completed(&mut fifth).await;
    // The first is still open: the rest of its message is read, and answered (it is no JSON).
    raw(&mut under, &vec![b'x'; 1 << 20]).await;
    let event = common::websocket::recv(&mut under).await;
    assert_eq!(event["error"]["code"], "invalid_json", "{event}");
}

/// A chat stream of `deltas` chunks of `size` characters each.
fn long_answer(deltas: usize, size: usize) -> Reply {
    let chunk = format!(
        "data: {}\n\n",
        json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {"content": "z".repeat(size)},
                            "finish_reason": null}]})
    );
    let end = format!(
        "data: {}\n\ndata: [DONE]\n\n",
        json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    );
    // In writes of about 256 KiB.
    let per_write = (256 << 10) / chunk.len() + 1;
    let mut writes: Vec<String> = (0..deltas.div_ceil(per_write))
        .map(|w| chunk.repeat(per_write.min(deltas - w * per_write)))
        .collect();
    writes.push(end);
    Reply::sse(writes)
}

/// Envoy's buffer toward each client at 1 MiB in both modes (the module's config leaves
/// Envoy's default; envoy/envoy.yaml sets 16 MiB, for the bodies ext_proc buffers whole).
fn envoy_buffer_of_1_mib(config: String) -> String {
    config.replace(
        "per_connection_buffer_limit_bytes: 16777216",
        "per_connection_buffer_limit_bytes: 1048576",
    )
}

/// `--ws-max-unread-bytes` in both modes: a client that reads nothing of a long answer gets
/// the events it did not read dropped, `response.failed` and a 1008 close; one whose answer's
/// events all fit in the bound reads them late and gets it whole. In ext_proc mode the
/// processor's socket writer tells the connection when the socket stops taking bytes (before,
/// it awaited each write: nothing was counted and the socket hung until the client read).
#[tokio::test]
async fn a_client_that_does_not_read_gets_its_response_failed_and_1008() {
    const UNREAD: usize = 1 << 20;
    let upstream = ScriptedUpstream::start();
    let metrics_port = common::free_port();
    let listen = format!("127.0.0.1:{metrics_port}");
    let unread = UNREAD.to_string();
    let args = with_metrics(&["--ws-max-unread-bytes", &unread], &listen);
    let stack = Stack::with_websocket_edited(upstream.port(), &args, envoy_buffer_of_1_mib);
    // Under: an answer whose events (about 0.7 MiB) all fit in the bound, read after it ended.
    upstream.push(long_answer(1000, 500));
    let mut late = open(&stack, HERE, &[], Some(noread::RECV_BUFFER))
        .await
        .unwrap();
    ask(&mut late, json!({"model": "m", "input": "under"})).await;
    upstream.wait_for_requests(1, TIMEOUT).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let events = response(&mut late).await;
    let deltas = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .count();
    assert_eq!(deltas, 1000);
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    // Over: about 19 MiB of events (14 MB of text, under max_output_bytes), read by nobody.
    upstream.push(long_answer(28_000, 500));
    let mut idle = open(&stack, HERE, &[], Some(noread::RECV_BUFFER))
        .await
        .unwrap();
    ask(&mut idle, json!({"model": "m", "input": "over"})).await;
    wait_until("a 1008 close", Duration::from_secs(120), || {
        (closes(&stack, metrics_port, "1008") == Some(1.0)).then_some(())
    });
    // Now it reads, at once and as fast as it can (the translator gives its last bytes a
    // second to leave, as Envoy does): a prefix of the stream, its failure, the close.
    let mut bytes = Vec::new();
    let mut piece = vec![0u8; 1 << 20];
    loop {
        use tokio::io::AsyncReadExt;
        match tokio::time::timeout(TIMEOUT, idle.get_mut().read(&mut piece)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => bytes.extend_from_slice(&piece[..n]),
            Err(_) => panic!("the socket did not end"),
        }
    }
    let frames = server_frames(&bytes);
    let (close, rest) = frames.split_last().expect("frames");
    assert_eq!(
        close.0,
        0x8,
        "a close frame last, after {} frames",
        rest.len()
    );
    assert_eq!(close.1[..2], 1008u16.to_be_bytes());
    let text = |f: &(u8, &[u8])| String::from_utf8_lossy(f.1).into_owned();
    let failed = text(rest.last().expect("an event"));
    assert!(failed.contains(r#""type":"response.failed""#), "{failed}");
    let deltas = rest
        .iter()
        .filter(|f| text(f).contains(r#""type":"response.output_text.delta""#))
        .count();
    assert!(
        deltas < 28_000,
        "the events it did not read were dropped: {deltas}"
    );
    // The socket beside it was never disturbed.
    upstream.push(chat_sse("beside"));
    ask(&mut late, json!({"model": "m", "input": "after"})).await;
    completed(&mut late).await;
}

/// Clients that do not read: four send `response.create`s answered at once (`generate:
/// false`), one pings. Each fills the buffers toward it, then the connection stops reading it
/// (no more answers than the host takes): its writes stall. Module mode: what Envoy holds
/// toward each (its buffer limit, 1 MiB) and keeps of its bytes counts in the budget (4 MiB),
/// so the four cannot all stay (1013; how many go is a race: a closed socket's bytes in Envoy's
/// buffers stay counted until Envoy ends its stream, so the last one may go too); ext_proc mode: the processor holds a piece and a read
/// per socket, so none closes (Envoy's own buffers are its memory,
/// docs/websocket.md#what-the-budget-does-not-count). The pinger piles up nothing and is not
/// closed: when it reads at last, it gets a pong for each read of its pings at most, and its
/// turn; so does a client from elsewhere once the flooders are gone.
#[tokio::test]
async fn clients_that_do_not_read_are_charged_for_what_waits_for_them() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| chat_sse("ok"));
    let metrics_port = common::free_port();
    let listen = format!("127.0.0.1:{metrics_port}");
    let args = with_metrics(&["--ws-max-total-bytes", "4194304"], &listen);
    let stack = Stack::with_websocket_edited(upstream.port(), &args, envoy_buffer_of_1_mib);
    // 16 MiB of pings, in writes of 1 MiB.
    let mut pinger = open(&stack, HERE, &[], Some(noread::RECV_BUFFER))
        .await
        .unwrap();
    assert!(noread::write(&mut pinger, &noread::pings(8000), 16).await);
    // Creates until the socket stops taking them (a write that does not end in 2 s) or ends.
    let creates = noread::creates(1000);
    let mut flooders = Vec::new();
    for _ in 0..4 {
        let mut flooder = open(&stack, HERE, &[], Some(noread::RECV_BUFFER))
            .await
            .unwrap();
        for batch in 0.. {
            assert!(batch < 1000, "the socket never stopped taking creates");
            let wrote = tokio::time::timeout(
                Duration::from_secs(2),
                noread::write(&mut flooder, &creates, 1),
            )
            .await;
            if wrote != Ok(true) {
                break;
            }
        }
        flooders.push(flooder);
    }
    let expected = match common::mode() {
        Mode::Module => wait_until("a 1013 close", TIMEOUT, || {
            closes(&stack, metrics_port, "1013").filter(|n| *n >= 1.0)
        }),
        Mode::ExtProc => 0.0,
    };
    let closed = closes(&stack, metrics_port, "1013");
    match common::mode() {
        // The flooders, and only they (the pinger stays).
        Mode::Module => assert!(
            closed.is_some_and(|n| n >= expected && n <= 4.0),
            "{closed:?}"
        ),
        Mode::ExtProc => assert_eq!(closed, Some(0.0)),
    }
    drop(flooders);
    // The pinger reads at last: a pong for each read of its pings at most, then its turn.
    pinger
        .send(create(json!({"model": "m", "input": "awake"})))
        .await
        .unwrap();
    let mut pongs = 0;
    loop {
        match tokio::time::timeout(TIMEOUT, pinger.next())
            .await
            .expect("in time")
        {
            Some(Ok(Message::Pong(_))) => pongs += 1,
            Some(Ok(Message::Text(text))) if text.contains(r#""type":"response.completed""#) => {
                break
            }
            Some(Ok(_)) => {}
            other => panic!("{other:?}"),
        }
    }
    // About one a read of the pings (16 KiB or more), never one a ping.
    assert!(
        (1..4096).contains(&pongs),
        "{pongs} pongs for 128,000 pings"
    );
    let mut beside = open(&stack, ELSEWHERE, &[], None).await.unwrap();
    ask(&mut beside, json!({"model": "m", "input": "beside"})).await;
    completed(&mut beside).await;
    assert_eq!(closes(&stack, metrics_port, "1013"), Some(expected));
}
