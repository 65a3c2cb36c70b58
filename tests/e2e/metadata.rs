//! Usage in Envoy's dynamic metadata, end to end: the translator reports each translated
//! exchange in the namespace `responses_extproc` (ext_proc: accepted by the shipped config's
//! `metadata_options`; the module sets it directly, same namespace and keys), and an access log format with `%DYNAMIC_METADATA(...)%` shows the
//! model, the response id, the outcome and the token counts, for a JSON and a streamed answer
//! and for a rejected request; and which operation it was (`create` or `compact`).

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
];

/// The shipped config (either mode's) with a JSON access log of our metadata written to `path`.
fn with_access_log(config: String, path: &std::path::Path) -> String {
    let mut format = String::from("                    request_id: \"%REQ(X-REQUEST-ID)%\"\n");
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
    config.replacen("          stat_prefix: responses\n", &access_log, 1)
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
