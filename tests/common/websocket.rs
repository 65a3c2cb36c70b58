//! A client's side of the WebSocket transport, for the suites that drive it.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

/// A client connection to Envoy's `/v1/responses` WebSocket.
pub type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// How long one message may take.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The next message, as JSON (panics on a close, a binary message or a timeout; pings and
/// pongs are skipped).
pub async fn recv(socket: &mut Socket) -> Value {
    loop {
        let message = tokio::time::timeout(TIMEOUT, socket.next())
            .await
            .expect("a message in time")
            .expect("the socket is open")
            .expect("a readable message");
        match message {
            Message::Text(text) => {
                return super::json::parse_strict(&text)
                    .expect("each message is one JSON object, each key once")
            }
            Message::Ping(_) | Message::Pong(_) => continue,
            other => panic!("expected a text message, got {other:?}"),
        }
    }
}
