//! WebSocket clients that do not read: their frames written raw (masked with a mask of 0s,
//! which leaves the payload as written), their sockets opened with a small receive buffer so
//! that the server's side, not their kernel, holds what they leave unread. For the tests and
//! benches that bound what such clients cost (`tests/e2e/websocket_bounds.rs`,
//! `benches/ws_memory.rs`, `benches/ws_module_load.rs`).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::MaybeTlsStream;

use super::websocket::Socket;

/// The receive buffer of a client that does not read.
pub const RECV_BUFFER: u32 = 16 << 10;

/// `count` masked pings of 125 bytes each.
pub fn pings(count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| {
            let mut ping = vec![0x89, 0x80 | 125, 0, 0, 0, 0];
            ping.extend(format!("{i:0>125}").bytes());
            ping
        })
        .collect()
}

/// `count` masked `response.create` messages answered without the upstream
/// (`generate: false`: `response.created`, `.in_progress`, `.completed`, about 1.5 KB).
pub fn creates(count: usize) -> Vec<u8> {
    (0..count)
        .flat_map(|i| {
            let text = serde_json::json!({"type": "response.create", "model": "m",
                "input": format!("{i}"), "generate": false})
            .to_string();
            let mut frame = vec![0x81, 0x80 | 126];
            frame.extend_from_slice(&(text.len() as u16).to_be_bytes());
            frame.extend_from_slice(&[0; 4]);
            frame.extend_from_slice(text.as_bytes());
            frame
        })
        .collect()
}

/// Opens `ws://127.0.0.1:<port>/v1/responses` from `source`, the receive buffer `recv_buffer`
/// bytes if given, with these handshake headers; the refusal's status and error code if
/// refused.
pub async fn open(
    port: u16,
    source: Ipv4Addr,
    recv_buffer: Option<u32>,
    headers: &[(&str, &str)],
) -> Result<Socket, (u16, String)> {
    let tcp = tokio::net::TcpSocket::new_v4().expect("socket");
    tcp.bind(SocketAddrV4::new(source, 0).into())
        .expect("bind a loopback address");
    if let Some(size) = recv_buffer {
        tcp.set_recv_buffer_size(size).expect("SO_RCVBUF");
    }
    let stream = tcp
        .connect(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port).into())
        .await
        .expect("connect to Envoy");
    let mut request = format!("ws://127.0.0.1:{port}/v1/responses")
        .into_client_request()
        .unwrap();
    for (name, value) in headers {
        let name = axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap();
        request.headers_mut().insert(name, value.parse().unwrap());
    }
    match tokio_tungstenite::client_async(request, MaybeTlsStream::Plain(stream)).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(response)) => {
            let body: serde_json::Value =
                serde_json::from_slice(response.body().as_deref().unwrap_or_default())
                    .expect("an error envelope");
            Err((
                response.status().as_u16(),
                body["error"]["code"].as_str().unwrap_or("").to_owned(),
            ))
        }
        Err(e) => panic!("not an HTTP refusal: {e}"),
    }
}

/// Writes `bytes` raw, `times` times; false once the server has gone.
pub async fn write(socket: &mut Socket, bytes: &[u8], times: usize) -> bool {
    for _ in 0..times {
        if socket.get_mut().write_all(bytes).await.is_err() {
            return false;
        }
    }
    true
}

/// Reads the socket to its end (it reads at last): its close code, or how it ended.
pub async fn ending(socket: &mut Socket, timeout: Duration) -> String {
    loop {
        match tokio::time::timeout(timeout, socket.next()).await {
            Err(_) => return "still open".to_owned(),
            Ok(Some(Ok(Message::Close(frame)))) => {
                return frame.map_or("close without a code".to_owned(), |f| {
                    format!("close {}", u16::from(f.code))
                })
            }
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(_))) | Ok(None) => return "ended without a close frame".to_owned(),
        }
    }
}

/// The `i`th of many callers: an address of its own on loopback (127.0.x.y: every one reaches
/// Envoy on 127.0.0.1), so that no quota per address applies.
pub fn caller_address(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 1 + (i / 250) as u8, 1 + (i % 250) as u8)
}

/// `n` clients, each from its own address, that each write `mib` MiB of pings and never read;
/// their sockets, still open as far as they know.
pub async fn pingers(port: u16, n: usize, mib: usize) -> Vec<Socket> {
    let pings = std::sync::Arc::new(pings(8000));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let pings = pings.clone();
            tokio::spawn(async move {
                let mut ws = open(port, caller_address(i), Some(RECV_BUFFER), &[])
                    .await
                    .expect("a socket");
                write(&mut ws, &pings, mib).await;
                ws
            })
        })
        .collect();
    let mut sockets = Vec::with_capacity(n);
    for t in tasks {
        sockets.push(t.await.expect("pinger"));
    }
    sockets
}

/// `n` clients, each from its own address, that each send `response.create`s answered at once
/// (batches of 1,000) and never read, until the server ends the socket or `batches` were sent;
/// their sockets.
pub async fn flooders(port: u16, n: usize, batches: usize) -> Vec<Socket> {
    let creates = std::sync::Arc::new(creates(1000));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let creates = creates.clone();
            tokio::spawn(async move {
                let mut ws = open(port, caller_address(i), Some(RECV_BUFFER), &[])
                    .await
                    .expect("a socket");
                for _ in 0..batches {
                    // (A server busy with the others may not read it for a while.)
                    let wrote =
                        tokio::time::timeout(Duration::from_secs(60), write(&mut ws, &creates, 1))
                            .await;
                    if wrote != Ok(true) {
                        break;
                    }
                }
                ws
            })
        })
        .collect();
    let mut sockets = Vec::with_capacity(n);
    for t in tasks {
        sockets.push(t.await.expect("flooder"));
    }
    sockets
}

/// How each socket ends once its client reads (within `timeout`), counted.
pub async fn endings(
    sockets: Vec<Socket>,
    timeout: Duration,
) -> std::collections::BTreeMap<String, usize> {
    let tasks: Vec<_> = sockets
        .into_iter()
        .map(|mut ws| tokio::spawn(async move { ending(&mut ws, timeout).await }))
        .collect();
    let mut counted = std::collections::BTreeMap::new();
    for t in tasks {
        *counted.entry(t.await.expect("reader")).or_insert(0) += 1;
    }
    counted
}
