//! Every spelling of the Responses paths meets the Responses routes, in both modes: the
//! shipped Envoy configs normalise a path before any filter or route sees it (`normalize_path`,
//! `merge_slashes`, `path_with_escaped_slashes_action`), so an escape, a dot segment or a
//! doubled slash an upstream would decode cannot step around the translation or the direct
//! replies (a Chat server with its own `/v1/responses`, such as vLLM, would otherwise answer
//! in our place). The requests are written on a raw socket: an HTTP client library would
//! normalise some of these paths itself.

use crate::common;

use std::time::Duration;

use common::{Reply, ScriptedUpstream, Stack};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TIMEOUT: Duration = Duration::from_secs(20);

/// An answer read off the socket: its status, headers (lowercased names) and body.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// `method path` with `body` (JSON), exactly as written, on a new connection closed after it.
async fn send(port: u16, method: &str, path: &str, body: &str) -> Answer {
    let mut socket = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(TIMEOUT, socket.read_to_end(&mut raw))
        .await
        .expect("Envoy answers and closes")
        .unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head");
    let status = head[9..12].parse().unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    Answer {
        status,
        head: head.to_ascii_lowercase(),
        body,
    }
}

/// A chunked body's data.
fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    loop {
        let (size, after) = rest.split_once("\r\n").expect("a chunk size");
        let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
        if size == 0 {
            return body;
        }
        body.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

fn chat_answer() -> Reply {
    Reply::json(
        200,
        &json!({"id": "c", "object": "chat.completion", "model": "m",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "Hi."}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}),
    )
}

#[tokio::test]
async fn every_spelling_of_the_responses_paths_meets_the_responses_routes() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(chat_answer);
    let stack = Stack::start(upstream.port(), &[]);
    let port = stack.envoy.port();
    let create = json!({"model": "m", "input": "hi"}).to_string();

    // Translated: each reaches the upstream as a Chat request and comes back a response.
    let spellings = [
        "/v1/%72esponses",
        "/v1/resp%6Fnses",
        "//v1//responses",
        "/v1/./responses",
        "/v1/x/../responses",
    ];
    for path in spellings {
        let answer = send(port, "POST", path, &create).await;
        assert_eq!(answer.status, 200, "{path}: {}", answer.body);
        let body: Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(body["object"], "response", "{path}: {body}");
        assert_eq!(body["output"][0]["content"][0]["text"], "Hi.", "{path}");
    }
    let requests = upstream.requests();
    assert_eq!(requests.len(), spellings.len(), "{requests:?}");
    for request in &requests {
        assert_eq!(request.path, "/v1/chat/completions");
        assert_eq!(request.json()["messages"][0]["content"], "hi");
    }

    // The stored-response paths get our 404, however spelt: never the upstream's own.
    for (method, path) in [
        ("GET", "/v1/%72esponses/resp_1"),
        ("GET", "/v1//responses/resp_1"),
        ("DELETE", "/v1/responses/../responses/resp_1"),
        ("POST", "/v1/%72esponses/resp_1/cancel"),
    ] {
        let answer = send(port, method, path, "").await;
        assert_eq!(answer.status, 404, "{method} {path}: {}", answer.body);
        let body: Value = serde_json::from_str(&answer.body).unwrap();
        assert_eq!(
            body["error"]["code"], "not_found",
            "{method} {path}: {body}"
        );
    }

    // An escaped slash is sent back to be asked again under its one spelling.
    let answer = send(port, "POST", "/v1%2Fresponses", &create).await;
    assert_eq!(answer.status, 307, "{}", answer.head);
    assert!(
        answer.head.contains("\r\nlocation: /v1/responses\r\n"),
        "{}",
        answer.head
    );
    assert_eq!(
        upstream.requests().len(),
        spellings.len(),
        "nothing more upstream"
    );
}
