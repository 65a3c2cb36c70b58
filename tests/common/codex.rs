//! Codex CLI 0.171.0's requests as it sent them with `openai_base_url` (it believes it talks
//! to OpenAI), recorded in `tests/fixtures/codex/0.171-openai/` (README.md there), and the Chat
//! request each becomes (`core/tests/snapshots/recorded/codex-0.171-openai-*.json`), for the
//! end-to-end replays over HTTP and the WebSocket.

use serde_json::Value;

use super::repo_root;

const DIR: &str = "tests/fixtures/codex/0.171-openai";

/// The recorded bytes of `name` (a body or a message).
pub fn body(name: &str) -> Vec<u8> {
    let path = repo_root().join(DIR).join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The headers of the recorded head `name`, as a client sends them again: all but those of
/// the connection and the transport (`host`, `content-length`, the WebSocket handshake's own).
pub fn headers(name: &str) -> Vec<(String, String)> {
    const TRANSPORT: [&str; 7] = [
        "host",
        "content-length",
        "connection",
        "upgrade",
        "sec-websocket-key",
        "sec-websocket-version",
        "sec-websocket-extensions",
    ];
    String::from_utf8(body(name))
        .expect("a UTF-8 head")
        .lines()
        .skip(1)
        .filter_map(|line| line.split_once(": "))
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
        .filter(|(k, _)| !TRANSPORT.contains(&k.as_str()))
        .collect()
}

/// The snapshot `codex-0.171-openai-<case>.json`: what the core gives for the recording.
pub fn snapshot(case: &str) -> Value {
    let path = repo_root()
        .join("core/tests/snapshots/recorded")
        .join(format!("codex-0.171-openai-{case}.json"));
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    super::json::strict(&text)
}

/// Whether a Chat request carries anything of Codex's own bookkeeping.
pub fn has_bookkeeping(chat: &Value) -> bool {
    let text = chat.to_string();
    [
        "internal_chat_message_metadata_passthrough",
        "content_item_kinds",
        "client_metadata",
        "x-codex-installation-id",
    ]
    .iter()
    .any(|k| text.contains(k))
}
