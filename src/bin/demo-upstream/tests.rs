//! The demo upstream's answers.

use super::demo::*;
use serde_json::{json, Value};

fn plan_json(v: Value) -> Completion {
    plan(v.to_string().as_bytes()).expect("valid request")
}

fn text(c: &Completion) -> &str {
    match &c.answer {
        Answer::Text(t) => t,
        other => panic!("expected text, got {other:?}"),
    }
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer"},
                "verbose": {"type": "boolean"}
            },
            "required": ["location", "unit", "days"]
        }
    }})
}

/// Parses frames back into JSON chunks (all but `[DONE]`).
fn chunks(frames: &[String]) -> Vec<Value> {
    frames
        .iter()
        .map(|f| {
            f.strip_prefix("data: ")
                .unwrap()
                .strip_suffix("\n\n")
                .unwrap()
        })
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn echoes_the_last_user_message() {
    let c = plan_json(json!({"model": "m", "messages": [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": "hi   there\nfriend"},
    ]}));
    assert_eq!(
        text(&c),
        "Hello! This is the demo upstream. You said: hi there friend"
    );
    assert_eq!(c.model, "m");
    assert_eq!(c.finish_reason, "stop");
    assert_eq!(c.prompt_tokens, 5);
    assert_eq!(c.completion_tokens, 11);
    assert!(!c.stream);
}

#[test]
fn array_content_takes_text_parts_and_counts_images() {
    let c = plan_json(json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        {"type": "text", "text": "this?"},
        {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}},
    ]}]}));
    assert_eq!(
        text(&c),
        "Hello! This is the demo upstream. You said: what is this? (and 2 images)"
    );
    assert_eq!(c.model, MODEL_ID);
}

#[test]
fn long_input_is_cut_to_200_chars() {
    let long = "é".repeat(150) + " " + &"x".repeat(300);
    let c = plan_json(json!({"messages": [{"role": "user", "content": long}]}));
    let echoed = text(&c)
        .strip_prefix("Hello! This is the demo upstream. You said: ")
        .unwrap();
    assert_eq!(echoed.chars().count(), MAX_ECHO_CHARS);
}

#[test]
fn tools_and_a_user_turn_give_one_tool_call() {
    let c = plan_json(json!({
        "model": "m",
        "messages": [{"role": "user", "content": "weather?"}],
        "tools": [weather_tool(), {"type": "function", "function": {"name": "other"}}],
    }));
    assert_eq!(c.finish_reason, "tool_calls");
    let Answer::ToolCall { name, arguments } = &c.answer else {
        panic!("expected a tool call, got {:?}", c.answer)
    };
    assert_eq!(name, "get_weather");
    let args: Value = serde_json::from_str(arguments).unwrap();
    assert_eq!(
        args,
        json!({"location": FIXED_STRING_ARG, "unit": "celsius", "days": 1})
    );
    let body = completion_json(&c, "id1", 7);
    assert_eq!(
        body["choices"][0]["message"]["tool_calls"][0]["id"],
        TOOL_CALL_ID
    );
    assert_eq!(body["choices"][0]["message"]["content"], Value::Null);
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
}

#[test]
fn tool_choice_none_or_named_is_honoured() {
    let tools = json!([{"type": "function", "function": {"name": "first"}}, weather_tool()]);
    let messages = json!([{"role": "user", "content": "hi"}]);
    let none = plan_json(json!({"messages": messages, "tools": tools, "tool_choice": "none"}));
    assert!(matches!(none.answer, Answer::Text(_)));
    let named = plan_json(json!({"messages": messages, "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}));
    assert!(matches!(named.answer, Answer::ToolCall { ref name, .. } if name == "get_weather"));
    let first = plan_json(json!({"messages": messages, "tools": tools}));
    assert!(
        matches!(first.answer, Answer::ToolCall { ref name, ref arguments } if name == "first" && arguments == "{}")
    );
}

#[test]
fn a_tool_result_is_echoed() {
    let c = plan_json(json!({
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": TOOL_CALL_ID,
                "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"SF\"}"}}]},
            {"role": "tool", "tool_call_id": TOOL_CALL_ID, "content": "sunny, 20 C"},
        ],
        "tools": [weather_tool()],
    }));
    assert_eq!(text(&c), "The tool returned: sunny, 20 C");
    assert_eq!(c.finish_reason, "stop");
    // 1 (weather?) + 2 (arguments) + 3 (tool result)
    assert_eq!(c.prompt_tokens, 6);
}

#[test]
fn max_completion_tokens_cuts_the_answer() {
    let c = plan_json(json!({"messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 3}));
    assert_eq!(text(&c), "Hello! This is");
    assert_eq!(c.finish_reason, "length");
    assert_eq!(c.completion_tokens, 3);
    let legacy = plan_json(json!({"messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2}));
    assert_eq!(text(&legacy), "Hello! This");
    let enough = plan_json(json!({"messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 100}));
    assert_eq!(enough.finish_reason, "stop");
}

#[test]
fn bad_requests_are_rejected() {
    assert!(plan(b"{not json").unwrap_err().contains("parse"));
    assert!(plan(b"[]").unwrap_err().contains("object"));
    assert!(plan(b"{}").unwrap_err().contains("messages"));
    assert!(plan(br#"{"messages":[]}"#)
        .unwrap_err()
        .contains("messages"));
    assert!(plan(br#"{"messages":[{"content":"x"}]}"#)
        .unwrap_err()
        .contains("role"));
}

#[test]
fn error_messages_never_quote_the_prompt() {
    let err = plan(br#"{"messages": [{"role": "user", "content": "secret words"}"#).unwrap_err();
    assert!(!err.contains("secret"), "{err}");
}

#[test]
fn non_streaming_body_has_usage() {
    let c = plan_json(json!({"model": "m", "messages": [{"role": "user", "content": "a b c"}]}));
    let body = completion_json(&c, "chatcmpl-x", 42);
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "m");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 11, "total_tokens": 14})
    );
    assert!(body["choices"][0]["message"]
        .get("reasoning_content")
        .is_none());
}

#[test]
fn text_stream_adds_up_to_the_text() {
    let c = plan_json(json!({"model": "m", "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "hi"}]}));
    let frames = stream_frames(&c, "chatcmpl-x", 42);
    assert_eq!(frames.last().unwrap(), "data: [DONE]\n\n");
    let chunks = chunks(&frames);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, text(&c));
    // role chunk + 9 words + finish chunk + usage chunk
    assert_eq!(chunks.len(), 1 + 9 + 1 + 1);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "stop");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 9);
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
}

#[test]
fn usage_chunk_only_when_asked() {
    let c = plan_json(json!({"stream": true, "messages": [{"role": "user", "content": "hi"}]}));
    let chunks = chunks(&stream_frames(&c, "x", 1));
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
}

#[test]
fn tool_call_stream_sends_id_then_argument_fragments() {
    let c = plan_json(
        json!({"stream": true, "messages": [{"role": "user", "content": "weather?"}],
        "tools": [weather_tool()]}),
    );
    let chunks = chunks(&stream_frames(&c, "x", 1));
    let first = &chunks[1]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(first["id"], TOOL_CALL_ID);
    assert_eq!(first["function"]["name"], "get_weather");
    let fragments: Vec<&str> = chunks[2..]
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert!(fragments.len() > 2);
    let Answer::ToolCall { arguments, .. } = &c.answer else {
        unreachable!()
    };
    assert_eq!(fragments.concat(), *arguments);
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );
}

async fn start() -> (String, tokio::task::JoinHandle<std::io::Result<()>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    (base, tokio::spawn(serve(listener)))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

#[tokio::test]
async fn http_routes() {
    let (base, server) = start().await;
    let client = client();

    let health = client.get(format!("{base}/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);

    let models: Value = client
        .get(format!("{base}/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL_ID);

    let bad = client
        .post(format!("{base}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body("{oops")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let bad: Value = bad.json().await.unwrap();
    assert_eq!(bad["error"]["type"], "invalid_request_error");

    let missing = client.get(format!("{base}/nope")).send().await.unwrap();
    assert_eq!(missing.status(), 404);

    let answer: Value = client
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "Hello! This is the demo upstream. You said: hi"
    );
    server.abort();
}

#[tokio::test]
async fn http_stream_is_event_stream() {
    let (base, server) = start().await;
    let response = client()
        .post(format!("{base}/v1/chat/completions"))
        .json(
            &json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let started = std::time::Instant::now();
    let body = response.text().await.unwrap();
    // 13 frames, 12 delays of 20 ms between them
    assert!(started.elapsed() >= CHUNK_DELAY * 10);
    assert!(body.starts_with("data: {"));
    assert!(body.ends_with("data: [DONE]\n\n"));
    assert_eq!(body.matches("\n\n").count(), 13);
    server.abort();
}

#[test]
fn summarises_a_compact_request() {
    let prompt = responses_core::translate::compact::PROMPT;
    let c = plan_json(json!({"messages": [
        {"role": "system", "content": prompt},
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": [{"type": "text", "text": "Remember 42."}]},
        {"role": "user", "content": responses_core::translate::compact::REQUEST}
    ]}));
    assert_eq!(
        text(&c),
        "Summary of the conversation: the user said: My name is Ada. / Remember 42."
    );
    // The same words without the instruction are an ordinary echo.
    let c = plan_json(
        json!({"messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": "hi"}]}),
    );
    assert!(text(&c).starts_with("Hello!"));
}

/// The functions the processor offers for the client-executed built-ins get arguments a
/// client can run (and the processor turns into `shell_call`, `apply_patch_call`, ...).
#[test]
fn builtin_functions_get_runnable_arguments() {
    for (name, arguments) in [
        ("shell", json!({"commands": ["echo hello"]})),
        ("local_shell", json!({"command": ["echo", "hello"]})),
        (
            "apply_patch",
            json!({"type": "create_file", "path": "hello.txt", "diff": "+hello\n"}),
        ),
    ] {
        let c = plan_json(json!({"messages": [{"role": "user", "content": "go"}],
            "tools": [weather_tool(), {"type": "function", "function": {"name": name,
                "parameters": {"type": "object", "properties": {}, "required": []}}}],
            "tool_choice": {"type": "function", "function": {"name": name}}}));
        assert_eq!(
            c.answer,
            Answer::ToolCall {
                name: name.to_owned(),
                arguments: arguments.to_string()
            }
        );
    }
}

#[test]
fn replay_frames_are_the_body_cut_after_each_blank_line() {
    let body = b"data: {\"a\":1}\n\n: keep-alive\n\ndata: [DONE]\n\ntail";
    let frames = responses_core::sse::split_frames(body);
    assert_eq!(
        frames,
        [
            &b"data: {\"a\":1}\n\n"[..],
            b": keep-alive\n\n",
            b"data: [DONE]\n\n",
            b"tail"
        ]
    );
    assert_eq!(frames.concat(), body);
}

#[tokio::test]
async fn replay_answers_every_post_with_the_recorded_body() {
    let body = b"data: {\"x\":1}\n\ndata: {\"x\":2}\n\ndata: [DONE]\n\n";
    let app = crate::replay::Replay::new(body, std::time::Duration::from_millis(1)).router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    for path in ["/v1/chat/completions", "/anything"] {
        let resp = client()
            .post(format!("{base}{path}"))
            .body("{}")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        assert_eq!(&resp.bytes().await.unwrap()[..], body);
    }
    server.abort();
}
