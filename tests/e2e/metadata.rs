//! Usage in Envoy's dynamic metadata, end to end: the translator reports each translated
//! exchange in the namespace `responses_extproc` (ext_proc: accepted by the shipped config's
//! `metadata_options`; the module sets it directly, same namespace and keys), and an access log format with `%DYNAMIC_METADATA(...)%` shows the
//! model, the response id, the outcome and the token counts, for a JSON and a streamed answer
//! and for a rejected request; and which operation it was (`create` or `compact`). Each turn
//! of a WebSocket is one line too (its record's), with the same keys and its socket's id.

use crate::common;

use std::time::Duration;

use common::{client, wait_until, Reply, ScriptedUpstream, Stack, TempDir};
use serde_json::{json, Value};

const FIELDS: &[&str] = &[
    "operation",
    "response_id",
    "model",
    "upstream_model",
    "outcome",
    "status",
    "error_code",
    "stream",
    "input_tokens",
    "output_tokens",
    "total_tokens",
    "cached_tokens",
    "reasoning_tokens",
    "socket_id",
];

/// The shipped config (either mode's) with a JSON access log of our metadata written to `path`
/// (and the listener of the translator's own requests: responses_calls, or responses_loopback in module mode).
fn with_access_log(config: String, path: &std::path::Path) -> String {
    let mut format = String::from(
        "                    request_id: \"%REQ(X-REQUEST-ID)%\"\n                    path: \"%REQ(:PATH)%\"\n",
    );
    for f in FIELDS {
        format.push_str(&format!(
            "                    {f}: \"%DYNAMIC_METADATA(responses_extproc:{f})%\"\n"
        ));
    }
    let access_log = format!(
        "          stat_prefix: responses
          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {}
              log_format:
                json_format:
{format}",
        path.display()
    );
    assert_eq!(
        config.matches("          stat_prefix: responses\n").count(),
        1
    );
    // The listener the translator's own requests (a turn's Chat request and record) enter:
    // responses_calls (ext_proc mode), the internal listener responses_loopback (module mode).
    let mut config = config.replacen("          stat_prefix: responses\n", &access_log, 1);
    for own in ["responses_calls", "responses_loopback"] {
        config = config.replacen(
            &format!("          stat_prefix: {own}\n"),
            &access_log.replace("stat_prefix: responses\n", &format!("stat_prefix: {own}\n")),
            1,
        );
    }
    config
}

fn log_lines(path: &std::path::Path, n: usize) -> Vec<Value> {
    wait_until("the access log", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(path).ok()?;
        let lines: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        (lines.len() >= n).then_some(lines)
    })
}

#[tokio::test]
async fn access_log_shows_usage_from_the_processors_metadata() {
    let upstream = ScriptedUpstream::start();
    let dir = TempDir::new("access-log");
    let log = dir.path().join("access.log");
    let stack = Stack::start_with(upstream.port(), &[], |c| with_access_log(c, &log));
    let envoy = &stack.envoy;

    // A JSON answer.
    upstream.push(Reply::json(
        200,
        &json!({"id": "c1", "object": "chat.completion", "model": "llama-3-8b",
            "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "yo"}}],
            "usage": {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30,
                "prompt_tokens_details": {"cached_tokens": 16},
                "completion_tokens_details": {"reasoning_tokens": 4}}}),
    ));
    let v: Value = client()
        .post(envoy.url("/v1/responses"))
        .header("x-request-id", "json-1")
        .json(&json!({"model": "m", "input": "hi"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let json_id = v["id"].as_str().unwrap().to_owned();

    // A streamed answer with a trailing usage chunk.
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "c2", "object": "chat.completion.chunk", "model": "llama-3-8b",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let usage = json!({"id": "c2", "object": "chat.completion.chunk", "model": "llama-3-8b",
        "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}});
    upstream.push(Reply::sse([
        chunk(json!({"content": "Hel"}), Value::Null),
        chunk(json!({"content": "lo"}), json!("stop")),
        format!("data: {usage}\n\n"),
        "data: [DONE]\n\n".to_owned(),
    ]));
    let text = client()
        .post(envoy.url("/v1/responses"))
        .header("x-request-id", "stream-1")
        .json(&json!({"model": "m", "input": "hi", "stream": true}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");

    // A rejected request.
    let status = client()
        .post(envoy.url("/v1/responses"))
        .header("x-request-id", "bad-1")
        .json(&json!({"model": "m"}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, 400);

    // A compaction.
    upstream.push(Reply::json(
        200,
        &json!({"id": "c3", "object": "chat.completion", "model": "llama-3-8b",
            "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "a summary"}}],
            "usage": {"prompt_tokens": 40, "completion_tokens": 3, "total_tokens": 43}}),
    ));
    let v: Value = client()
        .post(envoy.url("/v1/responses/compact"))
        .header("x-request-id", "compact-1")
        .json(&json!({"model": "m", "input": "hi"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["object"], "response.compaction", "{v}");

    let lines = log_lines(&log, 4);
    let line = |id: &str| {
        lines
            .iter()
            .find(|l| l["request_id"] == id)
            .unwrap_or_else(|| panic!("no access log line for {id}: {lines:?}"))
            .clone()
    };
    let json_line = line("json-1");
    assert_eq!(json_line["response_id"], json_id.as_str(), "{json_line}");
    assert_eq!(json_line["model"], "m");
    assert_eq!(json_line["upstream_model"], "llama-3-8b");
    assert_eq!(json_line["outcome"], "translated");
    assert_eq!(json_line["stream"], false);
    assert_eq!(json_line["operation"], "create");
    for (key, n) in [
        ("input_tokens", 21),
        ("output_tokens", 9),
        ("total_tokens", 30),
        ("cached_tokens", 16),
        ("reasoning_tokens", 4),
    ] {
        assert_eq!(json_line[key], n, "{key}: {json_line}");
    }

    let stream_line = line("stream-1");
    assert_eq!(stream_line["stream"], true, "{stream_line}");
    assert_eq!(stream_line["outcome"], "translated");
    assert!(stream_line["response_id"]
        .as_str()
        .is_some_and(|id| id.starts_with("resp_")));
    for (key, n) in [
        ("input_tokens", 5),
        ("output_tokens", 2),
        ("total_tokens", 7),
    ] {
        assert_eq!(stream_line[key], n, "{key}: {stream_line}");
    }

    let bad_line = line("bad-1");
    assert_eq!(bad_line["outcome"], "failed", "{bad_line}");
    assert_eq!(bad_line["status"], 400);
    assert_eq!(bad_line["error_code"], "missing_required_parameter");

    let compact_line = line("compact-1");
    assert_eq!(compact_line["operation"], "compact", "{compact_line}");
    assert_eq!(compact_line["outcome"], "translated");
    assert_eq!(compact_line["response_id"], v["id"]);
    assert_eq!(compact_line["total_tokens"], 43);
}

#[tokio::test]
async fn each_turn_of_a_socket_is_one_access_log_line_with_what_its_client_got() {
    use common::websocket::recv;
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::{client::IntoClientRequest, Message};

    let upstream = ScriptedUpstream::start();
    let dir = TempDir::new("access-log-ws");
    let log = dir.path().join("access.log");
    let stack = Stack::with_websocket_edited(upstream.port(), &[], |c| with_access_log(c, &log));

    let mut request = stack.ws_url().into_client_request().unwrap();
    request
        .headers_mut()
        .insert("x-request-id", "socket-1".parse().unwrap());
    let (mut socket, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let turn = |upstream: &ScriptedUpstream, reply: Reply| {
        upstream.push(reply);
        let create = json!({"type": "response.create", "model": "m", "input": "hi"});
        Message::text(create.to_string())
    };
    // A turn that completes, with usage.
    let chunk = json!({"id": "c1", "object": "chat.completion.chunk", "model": "llama-3-8b",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": "yo"},
            "finish_reason": "stop"}]});
    let usage = json!({"id": "c1", "object": "chat.completion.chunk", "model": "llama-3-8b",
        "choices": [], "usage": {"prompt_tokens": 21, "completion_tokens": 9, "total_tokens": 30,
            "prompt_tokens_details": {"cached_tokens": 16},
            "completion_tokens_details": {"reasoning_tokens": 4}}});
    let message = turn(
        &upstream,
        Reply::sse([
            format!("data: {chunk}\n\n"),
            format!("data: {usage}\n\n"),
            "data: [DONE]\n\n".to_owned(),
        ]),
    );
    socket.send(message).await.unwrap();
    let completed = loop {
        let event = recv(&mut socket).await;
        if event["type"] == "response.completed" {
            break event["response"].clone();
        }
    };
    // A turn the upstream refuses.
    let message = turn(
        &upstream,
        Reply::json(
            400,
            &json!({"error": {"message": "bad model", "type": "invalid_request_error",
                "code": "model_not_supported"}}),
        ),
    );
    socket.send(message).await.unwrap();
    let error = recv(&mut socket).await;
    assert_eq!(error["type"], "error", "{error}");

    let turns = wait_until("a line per turn", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&log).ok()?;
        let lines: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["socket_id"] == "socket-1")
            .collect();
        (lines.len() >= 2).then_some(lines)
    });
    // Envoy writes its lines in batches: a third would have come with these.
    assert_eq!(turns.len(), 2, "one line per turn: {turns:?}");
    let line = |id: &Value| {
        turns
            .iter()
            .find(|l| l["response_id"] == *id)
            .unwrap_or_else(|| panic!("no line for {id}: {turns:?}"))
            .clone()
    };
    let done = line(&completed["id"]);
    assert_eq!(done["operation"], "create", "{done}");
    assert_eq!(done["outcome"], "translated");
    assert_eq!(done["stream"], true);
    assert_eq!(done["model"], "m");
    assert_eq!(done["upstream_model"], "llama-3-8b");
    assert_eq!(done["status"], 200);
    let got = &completed["usage"];
    for (key, client) in [
        ("input_tokens", &got["input_tokens"]),
        ("output_tokens", &got["output_tokens"]),
        ("total_tokens", &got["total_tokens"]),
        (
            "cached_tokens",
            &got["input_tokens_details"]["cached_tokens"],
        ),
        (
            "reasoning_tokens",
            &got["output_tokens_details"]["reasoning_tokens"],
        ),
    ] {
        assert_eq!(&done[key], client, "{key}: {done}");
    }
    assert_eq!(done["total_tokens"], 30);
    let failed = turns
        .iter()
        .find(|l| l["outcome"] == "failed")
        .unwrap_or_else(|| panic!("no failed turn: {turns:?}"));
    assert_eq!(failed["status"], error["status"], "{failed}");
    assert_eq!(failed["error_code"], error["error"]["code"], "{failed}");
    assert_eq!(failed["total_tokens"], Value::Null);

    // The socket itself: one line, its upgrade's, when it ends, with no keys of ours.
    socket.close(None).await.unwrap();
    let upgrade = wait_until("the upgrade's line", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&log).ok()?;
        let lines: Vec<Value> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["request_id"] == "socket-1" && l["path"] == "/v1/responses")
            .collect();
        (!lines.is_empty()).then_some(lines)
    });
    assert_eq!(upgrade.len(), 1, "{upgrade:?}");
    for key in FIELDS {
        assert_eq!(upgrade[0][key], Value::Null, "{key}: {upgrade:?}");
    }

    // A client's guess at a record's path: 404, nothing set, nothing upstream.
    let before = upstream.requests().len();
    let guess = client()
        .post(stack.envoy.url(&format!("/v1/responses/turns/{:032x}", 7)))
        .header("x-request-id", "guess-1")
        .send()
        .await
        .unwrap();
    assert_eq!(guess.status(), 404);
    let body: Value = guess.json().await.unwrap();
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    let line = wait_until("the guess's line", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&log).ok()?;
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|l| l["request_id"] == "guess-1")
    });
    for key in FIELDS {
        assert_eq!(line[key], Value::Null, "{key}: {line}");
    }
    assert_eq!(upstream.requests().len(), before);
}
