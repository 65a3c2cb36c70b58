//! The request mapping, `POST /v1/responses` body → Chat Completions body, through the public
//! API: exact Chat bodies for valid requests, exact status/param/code for invalid ones, and the
//! parameters the response echoes.

mod common;

use common::schema::assert_valid;
use responses_core::openresponses::{ApiError, Code, ErrorKind};
use responses_core::translate::request::Translated;
use responses_core::translate::response::completion;
use responses_core::translate::seal::Keyring;
use responses_core::translate::{translate_request, Meta, Options};
use serde_json::{json, Value};
use std::sync::Arc;

const NOW: u64 = 1_700_000_000;

fn meta() -> Meta {
    Meta {
        now: NOW,
        id_seed: 0xfeed,
    }
}

fn strict() -> Options {
    Options {
        strict: true,
        ..Options::default()
    }
}

fn run(req: &Value, options: &Options) -> Result<Translated, ApiError> {
    translate_request(req.to_string().as_bytes(), options, meta())
}

/// The Chat body for a request that must translate.
#[track_caller]
fn chat_with(req: Value, options: &Options) -> Value {
    match run(&req, options) {
        Ok(t) => serde_json::from_slice(&t.body).expect("the Chat body is JSON"),
        Err(e) => panic!("expected {req} to translate, got {e}"),
    }
}

/// Options with reasoning keys, as the binary always has.
fn keyed() -> Options {
    Options {
        keyring: Some(Arc::new(Keyring::single("k1", [7; 32]).unwrap())),
        ..Options::default()
    }
}

#[track_caller]
fn chat(req: Value) -> Value {
    chat_with(req, &keyed())
}

/// The `messages` of the Chat body for `input`.
#[track_caller]
fn messages(input: Value) -> Value {
    chat(json!({"model": "m", "input": input}))["messages"].clone()
}

#[track_caller]
fn error_raw(body: &[u8], options: &Options) -> ApiError {
    match translate_request(body, options, meta()) {
        Ok(t) => panic!(
            "expected an error for {}, got the Chat body {}",
            String::from_utf8_lossy(body),
            String::from_utf8_lossy(&t.body)
        ),
        Err(e) => e,
    }
}

#[track_caller]
fn error(req: Value) -> ApiError {
    error_raw(req.to_string().as_bytes(), &Options::default())
}

/// Asserts a 400 `invalid_request_error` with exactly this param and code.
#[track_caller]
fn assert_400(e: &ApiError, param: Option<&str>, code: &str) {
    assert_eq!(e.status, 400, "{e}");
    assert_eq!(e.kind, ErrorKind::InvalidRequest, "{e}");
    assert_eq!(e.param.as_deref(), param, "{e}");
    assert_eq!(e.code.as_ref().map(Code::as_str), Some(code), "{e}");
    assert!(!e.message.is_empty());
}

/// A request with `input` and `extra` fields added.
fn with(extra: Value) -> Value {
    let mut req = json!({"model": "m", "input": "hi"});
    for (k, v) in extra.as_object().expect("extra is an object") {
        req[k] = v.clone();
    }
    req
}

#[track_caller]
fn field_error(extra: Value, param: &str, code: &str) {
    assert_400(&error(with(extra)), Some(param), code);
}

/// The `ResponseResource` for `req` answered by a one-message Chat completion; it is
/// also checked against the OpenResponses schema.
#[track_caller]
fn echo(req: Value) -> Value {
    let t = run(&req, &Options::default()).unwrap_or_else(|e| panic!("{e}"));
    let answer = json!({"id": "c", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}});
    let body = completion(&t.plan, answer.to_string().as_bytes(), NOW + 1)
        .unwrap_or_else(|e| panic!("{e}"));
    let resource: Value = serde_json::from_slice(&body).expect("the resource is JSON");
    assert_valid("ResponseResource", &resource);
    resource
}

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]},
           "strict": true})
}

fn time_tool() -> Value {
    json!({"type": "function", "name": "get_time"})
}

fn chat_weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
           "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]},
           "strict": true}})
}

fn chat_time_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_time"}})
}

// ---------------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------------

#[test]
fn string_input_is_one_user_message_and_the_minimal_body() {
    assert_eq!(
        chat(json!({"model": "qwen3", "input": "Hello"})),
        json!({"model": "qwen3", "messages": [{"role": "user", "content": "Hello"}]})
    );
}

#[test]
fn instructions_become_the_leading_system_message() {
    assert_eq!(
        chat(json!({"model": "m", "instructions": "Be terse.", "input": [
            {"type": "message", "role": "system", "content": "Later system."},
            {"type": "message", "role": "user", "content": "Hi"}]}))["messages"],
        json!([
            // Leading system messages become one: most chat templates accept only one.
            {"role": "system", "content": "Be terse.\n\nLater system."},
            {"role": "user", "content": "Hi"}
        ])
    );
}

#[test]
fn message_items_of_every_role_with_string_content() {
    assert_eq!(
        messages(json!([
            {"type": "message", "role": "system", "content": "sys"},
            {"type": "message", "role": "user", "content": "question"},
            {"type": "message", "role": "developer", "content": "dev"},
            {"type": "message", "role": "assistant", "content": "answer"}
        ])),
        json!([
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "question"},
            {"role": "system", "content": "dev"},
            {"role": "assistant", "content": "answer"}
        ])
    );
}

#[test]
fn messages_without_type_and_with_id_and_status_are_accepted() {
    assert_eq!(
        messages(json!([
            {"role": "user", "content": "easy form"},
            {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "done", "annotations": [], "logprobs": []}]}
        ])),
        json!([
            {"role": "user", "content": "easy form"},
            {"role": "assistant", "content": "done"}
        ])
    );
}

#[test]
fn system_and_developer_parts_are_joined_to_a_string() {
    assert_eq!(
        messages(json!([
            {"type": "message", "role": "system", "content": [
                {"type": "input_text", "text": "Be brief. "},
                {"type": "input_text", "text": "Use French."}]},
            {"type": "message", "role": "user", "content": "Bonjour"},
            {"type": "message", "role": "developer", "content": [
                {"type": "input_text", "text": "Dev rule."}]}
        ])),
        json!([
            {"role": "system", "content": "Be brief. Use French."},
            {"role": "user", "content": "Bonjour"},
            {"role": "system", "content": "Dev rule."}
        ])
    );
}

#[test]
fn user_text_parts_become_chat_text_parts() {
    assert_eq!(
        messages(json!([{"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "one"},
            {"type": "input_text", "text": "two"}]}])),
        json!([{"role": "user", "content": [
            {"type": "text", "text": "one"},
            {"type": "text", "text": "two"}]}])
    );
}

#[test]
fn input_images_by_url_and_data_url_with_detail() {
    assert_eq!(
        messages(json!([{"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Compare:"},
            {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "high"},
            {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"},
            {"type": "input_image", "image_url": "https://example.com/b.jpg", "detail": "auto"},
            {"type": "input_image", "image_url": "https://example.com/c.jpg"},
            {"type": "input_image", "image_url": "https://example.com/d.jpg", "detail": null}]}])),
        json!([{"role": "user", "content": [
            {"type": "text", "text": "Compare:"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "high"}},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/b.jpg", "detail": "auto"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/c.jpg"}},
            {"type": "image_url", "image_url": {"url": "https://example.com/d.jpg"}}]}])
    );
}

#[test]
fn input_files_become_chat_file_parts() {
    assert_eq!(
        messages(json!([{"type": "message", "role": "user", "content": [
            {"type": "input_file", "filename": "a.pdf", "file_data": "data:application/pdf;base64,JVBERi0="},
            {"type": "input_file", "file_url": "https://example.com/b.pdf"},
            {"type": "input_file", "file_data": "JVBERi0=", "file_url": null},
            {"type": "input_file", "file_url": "https://example.com/c.txt", "filename": "c.txt"}]}])),
        json!([{"role": "user", "content": [
            {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"}},
            {"type": "file", "file": {"file_url": "https://example.com/b.pdf"}},
            {"type": "file", "file": {"file_data": "JVBERi0="}},
            {"type": "file", "file": {"file_url": "https://example.com/c.txt", "filename": "c.txt"}}]}])
    );
}

#[test]
fn input_video_becomes_video_url() {
    assert_eq!(
        messages(json!([{"type": "message", "role": "user", "content": [
            {"type": "input_video", "video_url": "https://example.com/v.mp4"},
            {"type": "input_text", "text": "What happens?"}]}])),
        json!([{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}},
            {"type": "text", "text": "What happens?"}]}])
    );
}

#[test]
fn input_file_needs_exactly_one_of_data_and_url() {
    let part = |p: Value| json!({"model": "m", "input": [{"role": "user", "content": [p]}]});
    assert_400(
        &error(part(json!({"type": "input_file", "filename": "a.pdf"}))),
        Some("input[0].content[0].file_data"),
        "missing_required_parameter",
    );
    assert_400(
        &error(part(
            json!({"type": "input_file", "file_data": "eA==", "file_url": "https://x/y"}),
        )),
        Some("input[0].content[0]"),
        "invalid_value",
    );
}

#[test]
fn stored_files_are_rejected() {
    for p in [
        json!({"type": "input_file", "file_id": "file_1"}),
        json!({"type": "input_image", "file_id": "file_1"}),
    ] {
        let e = error(json!({"model": "m", "input": [{"role": "user", "content": [p]}]}));
        assert_400(
            &e,
            Some("input[0].content[0].file_id"),
            "unsupported_parameter",
        );
    }
}

#[test]
fn input_image_validation() {
    let part = |p: Value| json!({"model": "m", "input": [{"role": "user", "content": [p]}]});
    assert_400(
        &error(part(json!({"type": "input_image"}))),
        Some("input[0].content[0].image_url"),
        "missing_required_parameter",
    );
    assert_400(
        &error(part(
            json!({"type": "input_image", "image_url": "https://x/i.png", "detail": "ultra"}),
        )),
        Some("input[0].content[0].detail"),
        "invalid_value",
    );
    assert_400(
        &error(part(json!({"type": "input_video"}))),
        Some("input[0].content[0].video_url"),
        "missing_required_parameter",
    );
}

#[test]
fn assistant_history_with_output_text_and_refusal_parts() {
    assert_eq!(
        messages(json!([
            {"type": "message", "role": "user", "content": "q1"},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Part one, ", "annotations": []},
                {"type": "output_text", "text": "part two."}]},
            {"type": "message", "role": "user", "content": "q2"},
            {"type": "message", "role": "assistant", "content": [
                {"type": "refusal", "refusal": "I can't help with that."}]},
            {"type": "message", "role": "user", "content": "q3"},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Some"},
                {"type": "refusal", "refusal": "but not all"}]}
        ])),
        json!([
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "Part one, part two."},
            {"role": "user", "content": "q2"},
            {"role": "assistant", "content": null, "refusal": "I can't help with that."},
            {"role": "user", "content": "q3"},
            {"role": "assistant", "content": "Some", "refusal": "but not all"}
        ])
    );
}

#[test]
fn content_parts_foreign_to_the_role_are_rejected() {
    let cases = [
        ("user", json!({"type": "output_text", "text": "x"})),
        ("user", json!({"type": "refusal", "refusal": "x"})),
        (
            "assistant",
            json!({"type": "input_image", "image_url": "https://x/i.png"}),
        ),
        (
            "system",
            json!({"type": "input_image", "image_url": "https://x/i.png"}),
        ),
        (
            "developer",
            json!({"type": "input_file", "file_data": "eA=="}),
        ),
        ("user", json!({"type": "input_audio", "input_audio": {}})),
    ];
    for (role, part) in cases {
        let e = error(json!({"model": "m", "input": [
            {"type": "message", "role": role, "content": [part]}]}));
        assert_400(&e, Some("input[0].content[0].type"), "invalid_value");
    }
}

#[test]
fn unknown_fields_inside_items_and_parts_are_rejected() {
    let e = error(json!({"model": "m", "input": [
        {"type": "message", "role": "user", "content": "x", "name": "bob"}]}));
    assert_400(&e, Some("input[0].name"), "unknown_parameter");
    let e = error(json!({"model": "m", "input": [
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "x", "cache_control": {}}]}]}));
    assert_400(
        &e,
        Some("input[0].content[0].cache_control"),
        "unknown_parameter",
    );
}

// ---------------------------------------------------------------------------------------------
// Function calls, their outputs, and reasoning
// ---------------------------------------------------------------------------------------------

#[test]
fn function_call_and_output_round_trip() {
    assert_eq!(
        messages(json!([
            {"type": "message", "role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
             "arguments": "{\"city\":\"Paris\"}", "status": "completed"},
            {"type": "function_call_output", "call_id": "call_1", "output": "{\"temp\":21}"}
        ])),
        json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\":21}"}
        ])
    );
}

#[test]
fn consecutive_function_calls_merge_into_one_assistant_message() {
    assert_eq!(
        messages(json!([
            {"type": "message", "role": "user", "content": "Paris and Rome?"},
            {"type": "function_call", "call_id": "a", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "b", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
            {"type": "function_call_output", "call_id": "a", "output": "sunny"},
            {"type": "function_call_output", "call_id": "b", "output": "rainy"},
            {"type": "function_call", "call_id": "c", "name": "get_time", "arguments": "{}"}
        ])),
        json!([
            {"role": "user", "content": "Paris and Rome?"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "b", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "b", "content": "rainy"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
        ])
    );
}

#[test]
fn function_calls_merge_into_the_preceding_assistant_text() {
    assert_eq!(
        messages(json!([
            {"type": "message", "role": "user", "content": "Weather?"},
            {"type": "message", "role": "assistant", "content": [
                {"type": "output_text", "text": "Let me check."}]},
            {"type": "function_call", "call_id": "a", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "b", "name": "get_time", "arguments": "{}"}
        ])),
        json!([
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
        ])
    );
}

#[test]
fn function_call_output_with_text_parts() {
    assert_eq!(
        messages(json!([
            {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "id": "fco_1", "status": "completed",
             "output": [{"type": "input_text", "text": "line 1\n"}, {"type": "input_text", "text": "line 2"}]}
        ])),
        json!([
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "line 1\nline 2"}
        ])
    );
}

#[test]
fn function_call_output_with_non_text_parts_is_rejected() {
    let e = error(json!({"model": "m", "input": [
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a",
         "output": [{"type": "input_image", "image_url": "https://x/i.png"}]}]}));
    assert_400(&e, Some("input[1].output[0].type"), "invalid_value");
}

#[test]
fn function_call_items_need_their_fields() {
    let fc = json!({"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"});
    for (field, param) in [
        ("call_id", "input[0].call_id"),
        ("name", "input[0].name"),
        ("arguments", "input[0].arguments"),
    ] {
        let mut item = fc.clone();
        item.as_object_mut().unwrap().remove(field);
        assert_400(
            &error(json!({"model": "m", "input": [item]})),
            Some(param),
            "missing_required_parameter",
        );
    }
    let mut item = fc.clone();
    item["arguments"] = json!({"city": "Paris"});
    assert_400(
        &error(json!({"model": "m", "input": [item]})),
        Some("input[0].arguments"),
        "invalid_type",
    );
    assert_400(
        &error(json!({"model": "m", "input": [fc,
            {"type": "function_call_output", "call_id": "a"}]})),
        Some("input[1].output"),
        "missing_required_parameter",
    );
    assert_400(
        &error(json!({"model": "m", "input": [fc,
            {"type": "function_call_output", "call_id": "a", "output": 42}]})),
        Some("input[1].output"),
        "invalid_type",
    );
}

#[test]
fn reasoning_content_goes_to_the_following_assistant_message() {
    assert_eq!(
        messages(json!([
            {"type": "message", "role": "user", "content": "2+2?"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "Add them."}]},
            {"type": "message", "role": "assistant", "content": "4"}
        ])),
        json!([
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Add them."}
        ])
    );
}

#[test]
fn reasoning_summary_is_used_when_there_is_no_content() {
    assert_eq!(
        messages(json!([
            {"type": "message", "role": "user", "content": "2+2?"},
            {"type": "reasoning", "summary": [
                {"type": "summary_text", "text": "First."},
                {"type": "summary_text", "text": "Second."}]},
            {"type": "message", "role": "assistant", "content": "4"}
        ])),
        json!([
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "First.\nSecond."}
        ])
    );
}

#[test]
fn reasoning_content_wins_over_summary() {
    assert_eq!(
        messages(json!([
            {"type": "reasoning",
             "summary": [{"type": "summary_text", "text": "short"}],
             "content": [{"type": "reasoning_text", "text": "long thoughts"}]},
            {"type": "message", "role": "assistant", "content": "answer"}
        ])),
        json!([{"role": "assistant", "content": "answer", "reasoning_content": "long thoughts"}])
    );
}

#[test]
fn reasoning_before_function_calls_starts_a_new_assistant_message() {
    assert_eq!(
        messages(json!([
            {"type": "message", "role": "assistant", "content": "Earlier answer."},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Need weather."}]},
            {"type": "function_call", "call_id": "a", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call", "call_id": "b", "name": "get_time", "arguments": "{}"}
        ])),
        json!([
            {"role": "assistant", "content": "Earlier answer."},
            {"role": "assistant", "content": null, "reasoning_content": "Need weather.", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}
        ])
    );
}

#[test]
fn empty_and_unfollowed_reasoning_is_dropped() {
    assert_eq!(
        messages(json!([
            {"type": "reasoning", "summary": []},
            {"type": "message", "role": "assistant", "content": "a"},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "dangling"}]},
            {"type": "message", "role": "user", "content": "u"}
        ])),
        json!([
            {"role": "assistant", "content": "a"},
            {"role": "user", "content": "u"}
        ])
    );
}

#[test]
fn reasoning_parts_of_the_wrong_type_are_rejected() {
    let e = error(json!({"model": "m", "input": [
        {"type": "reasoning", "summary": [{"type": "output_text", "text": "x"}]}]}));
    assert_400(&e, Some("input[0].summary[0].type"), "invalid_value");
}

#[test]
fn a_whole_agent_loop_in_order() {
    let c = chat(json!({
        "model": "m",
        "instructions": "You are a travel agent.",
        "input": [
            {"type": "message", "role": "developer", "content": "Prefer metric units."},
            {"type": "message", "role": "user", "content": [
                {"type": "input_text", "text": "Where is this, and what's the weather?"},
                {"type": "input_image", "image_url": "data:image/jpeg;base64,/9j/4AAQ", "detail": "low"}]},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Looks like Paris."}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "That's Paris."}]},
            {"type": "function_call", "call_id": "call_w", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_w", "output": "18C"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Report it."}]},
            {"type": "message", "role": "assistant", "content": "It is 18C in Paris."},
            {"type": "message", "role": "user", "content": "Thanks!"}
        ],
        "tools": [weather_tool()],
        "tool_choice": "auto",
        "temperature": 0.7
    }));
    assert_eq!(
        c,
        json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": "You are a travel agent.\n\nPrefer metric units."},
                {"role": "user", "content": [
                    {"type": "text", "text": "Where is this, and what's the weather?"},
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,/9j/4AAQ", "detail": "low"}}]},
                {"role": "assistant", "content": "That's Paris.", "reasoning_content": "Looks like Paris.",
                 "tool_calls": [{"id": "call_w", "type": "function",
                                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_w", "content": "18C"},
                {"role": "assistant", "content": "It is 18C in Paris.", "reasoning_content": "Report it."},
                {"role": "user", "content": "Thanks!"}
            ],
            "tools": [chat_weather_tool()],
            "tool_choice": "auto",
            "temperature": 0.7
        })
    );
}

// ---------------------------------------------------------------------------------------------
// Tools
// ---------------------------------------------------------------------------------------------

#[test]
fn flat_function_tools_become_nested_chat_tools() {
    let c = chat(json!({"model": "m", "input": "hi", "tools": [
        weather_tool(),
        time_tool(),
        {"type": "function", "name": "lax", "strict": false, "description": null, "parameters": null}
    ]}));
    assert_eq!(
        c["tools"],
        json!([
            chat_weather_tool(),
            chat_time_tool(),
            {"type": "function", "function": {"name": "lax", "strict": false}}
        ])
    );
    assert!(c.get("tool_choice").is_none(), "{c}");
}

#[test]
fn empty_tools_list_sends_no_tools() {
    assert_eq!(
        chat(with(json!({"tools": []}))),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    );
}

#[test]
fn tool_choice_strings_pass_through() {
    for choice in ["auto", "none", "required"] {
        let c = chat(with(json!({"tools": [time_tool()], "tool_choice": choice})));
        assert_eq!(c["tool_choice"], json!(choice));
        assert_eq!(c["tools"], json!([chat_time_tool()]));
    }
}

#[test]
fn tool_choice_for_a_named_function() {
    let c = chat(with(json!({"tools": [weather_tool(), time_tool()],
        "tool_choice": {"type": "function", "name": "get_time"}})));
    assert_eq!(
        c["tool_choice"],
        json!({"type": "function", "function": {"name": "get_time"}})
    );
    assert_eq!(c["tools"], json!([chat_weather_tool(), chat_time_tool()]));
}

#[test]
fn allowed_tools_restricts_the_tool_list() {
    let three = json!([weather_tool(), time_tool(), {"type": "function", "name": "third"}]);
    let c = chat(with(
        json!({"tools": three, "tool_choice": {"type": "allowed_tools",
        "mode": "required",
        "tools": [{"type": "function", "name": "get_time"}, {"type": "function", "name": "third"}]}}),
    ));
    assert_eq!(c["tool_choice"], json!("required"));
    assert_eq!(
        c["tools"],
        json!([chat_time_tool(), {"type": "function", "function": {"name": "third"}}])
    );

    // `mode` defaults to auto.
    let c = chat(with(
        json!({"tools": three, "tool_choice": {"type": "allowed_tools",
        "tools": [{"type": "function", "name": "get_weather"}]}}),
    ));
    assert_eq!(c["tool_choice"], json!("auto"));
    assert_eq!(c["tools"], json!([chat_weather_tool()]));

    let c = chat(with(
        json!({"tools": three, "tool_choice": {"type": "allowed_tools",
        "mode": "none", "tools": [{"type": "function", "name": "get_weather"}]}}),
    ));
    assert_eq!(c["tool_choice"], json!("none"));
}

#[test]
fn tool_choice_naming_an_undefined_tool_is_rejected() {
    field_error(
        json!({"tools": [time_tool()], "tool_choice": {"type": "function", "name": "nope"}}),
        "tool_choice.name",
        "invalid_value",
    );
    field_error(
        json!({"tool_choice": {"type": "function", "name": "get_time"}}),
        "tool_choice.name",
        "invalid_value",
    );
    field_error(
        json!({"tools": [time_tool()], "tool_choice": {"type": "allowed_tools", "mode": "auto",
            "tools": [{"type": "function", "name": "get_time"}, {"type": "function", "name": "nope"}]}}),
        "tool_choice.tools[1].name",
        "invalid_value",
    );
}

#[test]
fn malformed_tool_choice_is_rejected() {
    let tools = json!([time_tool()]);
    for (choice, param, code) in [
        (json!("any"), "tool_choice", "invalid_value"),
        (json!(3), "tool_choice", "invalid_type"),
        (
            json!({"name": "get_time"}),
            "tool_choice.type",
            "missing_required_parameter",
        ),
        (
            json!({"type": "web_search"}),
            "tool_choice.type",
            "invalid_value",
        ),
        (
            json!({"type": "function"}),
            "tool_choice.name",
            "missing_required_parameter",
        ),
        (
            json!({"type": "function", "name": 1}),
            "tool_choice.name",
            "invalid_type",
        ),
        (
            json!({"type": "allowed_tools", "mode": "sometimes", "tools": [{"type": "function", "name": "get_time"}]}),
            "tool_choice.mode",
            "invalid_value",
        ),
        (
            json!({"type": "allowed_tools"}),
            "tool_choice.tools",
            "missing_required_parameter",
        ),
        (
            json!({"type": "allowed_tools", "tools": "get_time"}),
            "tool_choice.tools",
            "invalid_type",
        ),
        (
            json!({"type": "allowed_tools", "tools": []}),
            "tool_choice.tools",
            "invalid_value",
        ),
        (
            json!({"type": "allowed_tools", "tools": [{"type": "function"}]}),
            "tool_choice.tools[0].name",
            "missing_required_parameter",
        ),
    ] {
        field_error(json!({"tools": tools, "tool_choice": choice}), param, code);
    }
}

#[test]
fn tool_choice_without_tools_is_not_sent_upstream() {
    // vLLM rejects `tool_choice` without `tools`; without tools the model answers in text.
    for choice in ["auto", "none"] {
        assert_eq!(
            chat(with(json!({"tool_choice": choice}))),
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        );
    }
    field_error(
        json!({"tool_choice": "required"}),
        "tool_choice",
        "invalid_value",
    );
}

#[test]
fn parallel_tool_calls_passes_through() {
    for p in [true, false] {
        let c = chat(with(
            json!({"tools": [time_tool()], "parallel_tool_calls": p}),
        ));
        assert_eq!(c["parallel_tool_calls"], json!(p));
    }
    field_error(
        json!({"parallel_tool_calls": "yes"}),
        "parallel_tool_calls",
        "invalid_type",
    );
}

#[test]
fn parallel_tool_calls_without_tools_is_echoed_but_not_sent() {
    assert_eq!(
        chat(with(json!({"parallel_tool_calls": false}))),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    );
    assert_eq!(
        echo(with(json!({"parallel_tool_calls": false})))["parallel_tool_calls"],
        json!(false)
    );
}

#[test]
fn invalid_tools_are_rejected() {
    for (tool, param, code) in [
        (
            json!({"type": "function", "name": 7}),
            "tools[0].name",
            "invalid_type",
        ),
        (
            json!({"type": "function"}),
            "tools[0].name",
            "missing_required_parameter",
        ),
        (
            json!({"name": "f"}),
            "tools[0].type",
            "missing_required_parameter",
        ),
        (
            json!({"type": "function", "name": ""}),
            "tools[0].name",
            "invalid_value",
        ),
        (
            json!({"type": "function", "name": "has space"}),
            "tools[0].name",
            "invalid_value",
        ),
        (
            json!({"type": "function", "name": "dotted.name"}),
            "tools[0].name",
            "invalid_value",
        ),
        (
            json!({"type": "function", "name": "x".repeat(65)}),
            "tools[0].name",
            "invalid_value",
        ),
        (
            json!({"type": "function", "name": "f", "parameters": "{}"}),
            "tools[0].parameters",
            "invalid_type",
        ),
        (
            json!({"type": "function", "name": "f", "strict": "yes"}),
            "tools[0].strict",
            "invalid_type",
        ),
        (
            json!({"type": "function", "name": "f", "description": 1}),
            "tools[0].description",
            "invalid_type",
        ),
        (
            json!({"type": "function", "name": "f", "function": {}}),
            "tools[0].function",
            "unknown_parameter",
        ),
        (json!("get_time"), "tools[0]", "invalid_type"),
    ] {
        field_error(json!({"tools": [tool]}), param, code);
    }
    // A name of 64 characters from the allowed set is fine.
    let long = "A-z_0".repeat(12) + "abcd";
    assert_eq!(long.len(), 64);
    let c = chat(with(json!({"tools": [{"type": "function", "name": long}]})));
    assert_eq!(c["tools"][0]["function"]["name"], json!(long));
    field_error(
        json!({"tools": {"type": "function"}}),
        "tools",
        "invalid_type",
    );
    field_error(
        json!({"tools": [time_tool(), weather_tool(), time_tool()]}),
        "tools[2].name",
        "invalid_value",
    );
}

// ---------------------------------------------------------------------------------------------
// Sampling and output shape
// ---------------------------------------------------------------------------------------------

#[test]
fn sampling_parameters_map_to_chat() {
    assert_eq!(
        chat(with(
            json!({"max_output_tokens": 256, "temperature": 0.5, "top_p": 0.9,
            "presence_penalty": -1.5, "frequency_penalty": 2})
        )),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
               "max_completion_tokens": 256, "temperature": 0.5, "top_p": 0.9,
               "presence_penalty": -1.5, "frequency_penalty": 2.0})
    );
}

#[test]
fn sampling_range_boundaries_are_accepted() {
    let c = chat(with(
        json!({"temperature": 0, "top_p": 1, "presence_penalty": 2,
        "frequency_penalty": -2, "max_output_tokens": 1}),
    ));
    assert_eq!(c["temperature"], json!(0.0));
    assert_eq!(c["top_p"], json!(1.0));
    assert_eq!(c["presence_penalty"], json!(2.0));
    assert_eq!(c["frequency_penalty"], json!(-2.0));
    assert_eq!(c["max_completion_tokens"], json!(1));
    let c = chat(with(json!({"temperature": 2.0, "top_p": 0.0})));
    assert_eq!(
        (c["temperature"].clone(), c["top_p"].clone()),
        (json!(2.0), json!(0.0))
    );
}

#[test]
fn sampling_out_of_range_is_rejected() {
    for (field, value) in [
        ("temperature", json!(2.01)),
        ("temperature", json!(-0.1)),
        ("top_p", json!(1.5)),
        ("top_p", json!(-0.01)),
        ("presence_penalty", json!(2.5)),
        ("presence_penalty", json!(-3)),
        ("frequency_penalty", json!(-2.1)),
        ("frequency_penalty", json!(9)),
        ("max_output_tokens", json!(0)),
        ("max_output_tokens", json!(-5)),
        ("max_output_tokens", json!(12.5)),
        ("max_output_tokens", json!(5_000_000_000u64)),
        ("top_logprobs", json!(21)),
        ("max_tool_calls", json!(0)),
    ] {
        field_error(json!({ field: value }), field, "invalid_value");
    }
}

#[test]
fn sampling_wrong_types_are_rejected() {
    for (field, value, code) in [
        ("temperature", json!("0.5"), "invalid_type"),
        ("top_p", json!(true), "invalid_type"),
        ("max_output_tokens", json!("100"), "invalid_type"),
        ("presence_penalty", json!([0]), "invalid_type"),
    ] {
        field_error(json!({ field: value }), field, code);
    }
}

#[test]
fn null_optional_fields_count_as_absent() {
    assert_eq!(
        chat(with(
            json!({"instructions": null, "temperature": null, "top_p": null,
            "max_output_tokens": null, "tools": null, "tool_choice": null, "text": null,
            "reasoning": null, "metadata": null, "previous_response_id": null,
            "include": null, "top_logprobs": null, "safety_identifier": null})
        )),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    );
}

/// `null` is absent everywhere, whatever the key: top level (neither forwarded nor refused,
/// strict mode included), items, content parts, tools, nested objects, tool_choice. This is
/// what `model_dump()` writes for every field a client never set, newer ones included.
#[test]
fn null_means_absent_at_every_level() {
    let req = json!({"model": "m", "newer_top_level_field": null, "stream_options": null,
        "input": [
            {"type": "message", "role": "user", "newer": null, "status": null, "id": null,
             "content": [{"type": "input_text", "text": "hi", "newer": null},
                         {"type": "input_image", "image_url": "https://x/i.png", "detail": null,
                          "file_id": null, "newer": null}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}",
             "newer": null, "status": null, "id": null},
            {"type": "function_call_output", "call_id": "c1", "output": "ok", "newer": null},
            {"type": "reasoning", "summary": null, "content": null, "encrypted_content": null,
             "newer": null}],
        "tools": [{"type": "function", "name": "f", "description": null, "parameters": null,
                   "strict": null, "newer": null}],
        "tool_choice": {"type": "allowed_tools", "mode": null, "newer": null,
                        "tools": [{"type": "function", "name": "f", "newer": null}]},
        "reasoning": {"effort": null, "summary": null, "newer": null},
        "text": {"format": null, "verbosity": null, "newer": null}});
    let expected = json!({"model": "m",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"},
                {"type": "image_url", "image_url": {"url": "https://x/i.png"}}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "tool_choice": "auto"});
    assert_eq!(chat(req.clone()), expected);
    assert_eq!(chat_with(req, &strict()), expected);
}

/// Except where the field carries the content: a call's `call_id`, its arguments, an output,
/// an image's only source, a message's content. `null` there is a missing field.
#[test]
fn null_on_a_field_that_carries_the_content_is_missing() {
    let cases = [
        (
            json!({"type": "function_call", "call_id": null, "name": "f", "arguments": "{}"}),
            "input[0].call_id",
        ),
        (
            json!({"type": "function_call", "call_id": "c", "name": "f", "arguments": null}),
            "input[0].arguments",
        ),
        (
            json!({"type": "function_call_output", "call_id": null, "output": "x"}),
            "input[0].call_id",
        ),
        (
            json!({"type": "message", "role": "user", "content": null}),
            "input[0].content",
        ),
        (
            json!({"type": "message", "role": "user", "content": [
            {"type": "input_image", "image_url": null, "file_id": null}]}),
            "input[0].content[0].image_url",
        ),
        (
            json!({"type": "custom_tool_call", "call_id": "c", "name": "n", "input": null}),
            "input[0].input",
        ),
    ];
    for (item, param) in cases {
        let e = error(json!({"model": "m", "input": [item]}));
        assert_400(&e, Some(param), "missing_required_parameter");
    }
}

#[test]
fn stream_true_asks_for_usage() {
    assert_eq!(
        chat(with(
            json!({"stream": true, "stream_options": {"include_obfuscation": false}})
        )),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
               "stream": true, "stream_options": {"include_usage": true}})
    );
    let t = run(&with(json!({"stream": true})), &Options::default()).unwrap();
    assert!(t.plan.is_stream());
    assert_eq!(t.plan.model(), "m");
}

#[test]
fn stream_false_sends_no_stream_fields() {
    let t = run(&with(json!({"stream": false})), &Options::default()).unwrap();
    assert!(!t.plan.is_stream());
    let c: Value = serde_json::from_slice(&t.body).unwrap();
    assert_eq!(
        c,
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    );
    field_error(json!({"stream": "true"}), "stream", "invalid_type");
}

#[test]
fn text_format_json_object() {
    let c = chat(with(json!({"text": {"format": {"type": "json_object"}}})));
    assert_eq!(c["response_format"], json!({"type": "json_object"}));
}

#[test]
fn text_format_json_schema() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}},
                        "required": ["a"], "additionalProperties": false});
    let c = chat(with(
        json!({"text": {"format": {"type": "json_schema", "name": "answer",
        "description": "The answer", "schema": schema, "strict": true}}}),
    ));
    assert_eq!(
        c["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "answer",
            "description": "The answer", "schema": schema, "strict": true}})
    );
    let c = chat(with(
        json!({"text": {"format": {"type": "json_schema", "name": "a", "schema": {}}}}),
    ));
    assert_eq!(
        c["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "a", "schema": {}}})
    );
}

#[test]
fn text_format_text_and_verbosity() {
    let c = chat(with(
        json!({"text": {"format": {"type": "text"}, "verbosity": "low"}}),
    ));
    assert!(c.get("response_format").is_none(), "{c}");
    assert_eq!(c["verbosity"], json!("low"));
}

#[test]
fn invalid_text_format_is_rejected() {
    for (text, param, code) in [
        (
            json!({"format": {"type": "xml"}}),
            "text.format.type",
            "invalid_value",
        ),
        (
            json!({"format": {}}),
            "text.format.type",
            "missing_required_parameter",
        ),
        (
            json!({"format": {"type": "json_schema", "schema": {}}}),
            "text.format.name",
            "missing_required_parameter",
        ),
        (
            json!({"format": {"type": "json_schema", "name": "a"}}),
            "text.format.schema",
            "missing_required_parameter",
        ),
        (
            json!({"format": {"type": "json_schema", "name": "a", "schema": "{}"}}),
            "text.format.schema",
            "invalid_type",
        ),
        (
            json!({"format": {"type": "json_object", "extra": 1}}),
            "text.format.extra",
            "unknown_parameter",
        ),
        (
            json!({"verbosity": "max"}),
            "text.verbosity",
            "invalid_value",
        ),
        (json!({"other": 1}), "text.other", "unknown_parameter"),
        (json!("json"), "text", "invalid_type"),
    ] {
        field_error(json!({ "text": text }), param, code);
    }
}

#[test]
fn reasoning_effort_maps_to_reasoning_effort() {
    field_error(
        json!({"reasoning": {"effort": 3}}),
        "reasoning.effort",
        "invalid_type",
    );
    // Every effort of openai-python 3.54's `ReasoningEffort`, and whatever comes next: the
    // upstream decides what its model supports.
    for effort in [
        "none", "minimal", "low", "medium", "high", "xhigh", "max", "future",
    ] {
        let c = chat(with(
            json!({"reasoning": {"effort": effort, "summary": "auto"}}),
        ));
        assert_eq!(c["reasoning_effort"], json!(effort));
        assert!(c.get("reasoning").is_none(), "{c}");
    }
    let c = chat(with(json!({"reasoning": {"summary": "detailed"}})));
    assert!(c.get("reasoning_effort").is_none(), "{c}");
    // OpenAI's serving choices with no Chat equivalent: validated, not sent.
    let c = chat(with(
        json!({"reasoning": {"effort": "low", "context": "all_turns",
        "mode": "pro", "generate_summary": "auto"}}),
    ));
    assert_eq!(
        c,
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
               "reasoning_effort": "low"})
    );
    field_error(
        json!({"reasoning": {"context": "forever"}}),
        "reasoning.context",
        "invalid_value",
    );
    field_error(
        json!({"reasoning": {"summary": "long"}}),
        "reasoning.summary",
        "invalid_value",
    );
    field_error(
        json!({"reasoning": {"budget": 1}}),
        "reasoning.budget",
        "unknown_parameter",
    );
}

#[test]
fn logprobs_include_and_top_logprobs() {
    let base = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let mut expect = base.clone();
    expect["logprobs"] = json!(true);
    expect["top_logprobs"] = json!(5);
    assert_eq!(
        chat(with(
            json!({"include": ["message.output_text.logprobs"], "top_logprobs": 5})
        )),
        expect
    );
    // The include alone asks for sampled-token logprobs only.
    let mut expect = base.clone();
    expect["logprobs"] = json!(true);
    assert_eq!(
        chat(with(json!({"include": ["message.output_text.logprobs"]}))),
        expect
    );
    // top_logprobs > 0 implies logprobs.
    let c = chat(with(json!({"top_logprobs": 3})));
    assert_eq!(
        (c["logprobs"].clone(), c["top_logprobs"].clone()),
        (json!(true), json!(3))
    );
    // Neither: nothing is sent.
    assert_eq!(
        chat(with(
            json!({"top_logprobs": 0, "include": ["reasoning.encrypted_content"]})
        )),
        base
    );
}

#[test]
fn unknown_include_values_are_rejected() {
    field_error(
        json!({"include": ["message.output_text.logprobs", "file_search_call.result"]}),
        "include[1]",
        "invalid_value",
    );
    field_error(json!({"include": [1]}), "include[0]", "invalid_type");
    field_error(
        json!({"include": "message.output_text.logprobs"}),
        "include",
        "invalid_type",
    );
}

#[test]
fn safety_identifier_becomes_user() {
    let c = chat(with(json!({"safety_identifier": "user-42"})));
    assert_eq!(c["user"], json!("user-42"));
    field_error(
        json!({"safety_identifier": "u".repeat(65)}),
        "safety_identifier",
        "invalid_value",
    );
    field_error(
        json!({"safety_identifier": 42}),
        "safety_identifier",
        "invalid_type",
    );
}

#[test]
fn echo_only_fields_are_not_sent_upstream() {
    assert_eq!(
        chat(with(json!({
            "metadata": {"k": "v"}, "truncation": "auto", "service_tier": "flex",
            "prompt_cache_key": "pk", "max_tool_calls": 3, "store": false,
            "background": false, "include": ["reasoning.encrypted_content"]}))),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    );
    field_error(
        json!({"truncation": "middle"}),
        "truncation",
        "invalid_value",
    );
    field_error(json!({"service_tier": 1}), "service_tier", "invalid_type");
}

#[test]
fn metadata_validation() {
    let sixteen: serde_json::Map<String, Value> =
        (0..16).map(|i| (format!("k{i}"), json!("v"))).collect();
    chat(with(json!({"metadata": sixteen})));
    let mut seventeen = sixteen.clone();
    seventeen.insert("k16".into(), json!("v"));
    field_error(json!({"metadata": seventeen}), "metadata", "invalid_value");

    let key64 = "k".repeat(64);
    chat(with(json!({"metadata": {key64: "v"}})));
    let key65 = "k".repeat(65);
    field_error(
        json!({"metadata": {key65.clone(): "v"}}),
        &format!("metadata.{key65}"),
        "invalid_value",
    );

    // Lengths count characters, not bytes.
    chat(with(json!({"metadata": {"k": "é".repeat(512)}})));
    field_error(
        json!({"metadata": {"k": "v".repeat(513)}}),
        "metadata.k",
        "invalid_value",
    );
    field_error(json!({"metadata": {"n": 1}}), "metadata.n", "invalid_type");
    field_error(
        json!({"metadata": {"n": null}}),
        "metadata.n",
        "invalid_type",
    );
    field_error(json!({"metadata": ["a"]}), "metadata", "invalid_type");
}

// ---------------------------------------------------------------------------------------------
// Unknown fields and strict mode
// ---------------------------------------------------------------------------------------------

#[test]
fn unknown_top_level_fields_are_forwarded_verbatim() {
    assert_eq!(
        chat(with(
            json!({"top_k": 20, "chat_template_kwargs": {"enable_thinking": false},
            "repetition_penalty": 1.1, "temperature": 0.2})
        )),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
               "temperature": 0.2, "top_k": 20,
               "chat_template_kwargs": {"enable_thinking": false}, "repetition_penalty": 1.1})
    );
}

#[test]
fn unknown_fields_never_override_translated_ones() {
    let c = chat(with(
        json!({"messages": [{"role": "user", "content": "smuggled"}],
        "model": "m", "safety_identifier": "s", "user": "other"}),
    ));
    assert_eq!(c["messages"], json!([{"role": "user", "content": "hi"}]));
    assert_eq!(c["user"], json!("s"));
}

#[test]
fn strict_mode_rejects_unknown_fields() {
    for field in ["top_k", "chat_template_kwargs"] {
        let req = with(json!({ field: 1 }));
        let e = error_raw(req.to_string().as_bytes(), &strict());
        assert_400(&e, Some(field), "unknown_parameter");
    }
    // Known fields are fine in strict mode.
    assert_eq!(
        chat_with(with(json!({"temperature": 1, "store": false})), &strict()),
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 1.0})
    );
}

/// `/v1/responses/compact` follows the same rule for fields outside the API: the upstream's
/// own are forwarded, provider extensions dropped, and strict mode refuses them.
#[test]
fn compact_requests_share_the_unknown_field_rule() {
    use responses_core::translate::compact;
    let req = with(json!({"top_k": 20, "acme:trace": true}));
    let body = req.to_string();
    let chat: Value = serde_json::from_slice(
        &compact::translate(body.as_bytes(), &keyed(), meta())
            .expect("compact request")
            .body,
    )
    .expect("the Chat body is JSON");
    assert_eq!(chat["top_k"], json!(20));
    assert!(chat.get("acme:trace").is_none(), "{chat}");

    let strict_keyed = Options {
        strict: true,
        ..keyed()
    };
    match compact::translate(body.as_bytes(), &strict_keyed, meta()) {
        Ok(t) => panic!("strict mode forwarded {}", String::from_utf8_lossy(&t.body)),
        Err(e) => assert_400(&e, Some("top_k"), "unknown_parameter"),
    }
}

// ---------------------------------------------------------------------------------------------
// The stateless tier
// ---------------------------------------------------------------------------------------------

#[test]
fn previous_response_id_is_not_found() {
    let e = error(with(json!({"previous_response_id": "resp_123"})));
    assert_400(
        &e,
        Some("previous_response_id"),
        "previous_response_not_found",
    );
    assert!(e.message.contains("resp_123"), "{}", e.message);
}

#[test]
fn background_conversation_and_prompt_are_rejected() {
    field_error(
        json!({"background": true}),
        "background",
        "unsupported_parameter",
    );
    field_error(
        json!({"conversation": "conv_1"}),
        "conversation",
        "unsupported_parameter",
    );
    field_error(
        json!({"conversation": {"id": "conv_1"}}),
        "conversation",
        "unsupported_parameter",
    );
    field_error(
        json!({"prompt": {"id": "pmpt_1"}}),
        "prompt",
        "unsupported_parameter",
    );
    field_error(json!({"background": "no"}), "background", "invalid_type");
    // background: false is served.
    chat(with(json!({"background": false})));
}

#[test]
fn item_references_are_rejected() {
    for item in [
        json!({"type": "item_reference", "id": "msg_1"}),
        json!({"id": "msg_1"}),
    ] {
        let e = error(json!({"model": "m", "input": [
            {"role": "user", "content": "hi"}, item]}));
        assert_400(&e, Some("input[1]"), "unsupported_parameter");
    }
}

#[test]
fn store_true_is_served_statelessly_by_default_and_rejected_in_strict_mode() {
    let c = chat(with(json!({"store": true})));
    assert!(c.get("store").is_none(), "{c}");
    assert_eq!(echo(with(json!({"store": true})))["store"], json!(false));
    assert_eq!(echo(with(json!({"store": false})))["store"], json!(false));

    let e = error_raw(
        with(json!({"store": true})).to_string().as_bytes(),
        &strict(),
    );
    assert_400(&e, Some("store"), "unsupported_parameter");
    chat_with(with(json!({"store": false})), &strict());
    field_error(json!({"store": "no"}), "store", "invalid_type");
}

// ---------------------------------------------------------------------------------------------
// Invalid bodies
// ---------------------------------------------------------------------------------------------

#[test]
fn non_json_bodies_are_rejected() {
    for body in [&b"not json"[..], b"", b"{\"model\": \"m\",", b"\xff\xfe"] {
        let e = error_raw(body, &Options::default());
        assert_eq!((e.status, e.kind), (400, ErrorKind::InvalidRequest), "{e}");
        assert_eq!(e.param, None);
        assert_eq!(e.code.as_ref().map(Code::as_str), Some("invalid_json"));
    }
}

#[test]
fn non_object_bodies_are_rejected() {
    for body in ["[]", "[{\"model\": \"m\"}]", "\"hi\"", "42", "true", "null"] {
        let e = error_raw(body.as_bytes(), &Options::default());
        assert_eq!((e.status, e.kind), (400, ErrorKind::InvalidRequest), "{e}");
        assert_eq!(e.param, None);
        assert_eq!(e.code.as_ref().map(Code::as_str), Some("invalid_json"));
    }
}

#[test]
fn model_is_required_and_not_empty() {
    assert_400(
        &error(json!({"input": "hi"})),
        Some("model"),
        "missing_required_parameter",
    );
    assert_400(
        &error(json!({"model": null, "input": "hi"})),
        Some("model"),
        "missing_required_parameter",
    );
    assert_400(
        &error(json!({"model": "", "input": "hi"})),
        Some("model"),
        "invalid_value",
    );
    assert_400(
        &error(json!({"model": 4, "input": "hi"})),
        Some("model"),
        "invalid_type",
    );
}

#[test]
fn input_is_required_and_not_empty() {
    assert_400(
        &error(json!({"model": "m"})),
        Some("input"),
        "missing_required_parameter",
    );
    assert_400(
        &error(json!({"model": "m", "input": null})),
        Some("input"),
        "missing_required_parameter",
    );
    assert_400(
        &error(json!({"model": "m", "input": ""})),
        Some("input"),
        "invalid_value",
    );
    assert_400(
        &error(json!({"model": "m", "input": []})),
        Some("input"),
        "invalid_value",
    );
    assert_400(
        &error(json!({"model": "m", "input": {"role": "user", "content": "hi"}})),
        Some("input"),
        "invalid_type",
    );
}

#[test]
fn wrong_types_are_named_at_every_level() {
    for (req, param) in [
        (
            json!({"model": "m", "input": [{"type": "message", "role": "user", "content": 5}]}),
            "input[0].content",
        ),
        (json!({"model": "m", "input": ["hi"]}), "input[0]"),
        (
            json!({"model": "m", "input": [{"type": 3, "role": "user", "content": "x"}]}),
            "input[0].type",
        ),
        (
            json!({"model": "m", "input": [{"type": "message", "role": "user", "content": "x", "id": 1}]}),
            "input[0].id",
        ),
        (
            json!({"model": "m", "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": 1}]}]}),
            "input[0].content[0].text",
        ),
        (
            json!({"model": "m", "input": [{"type": "message", "role": "user", "content": ["hi"]}]}),
            "input[0].content[0]",
        ),
        (
            json!({"model": "m", "input": "hi", "tools": [{"type": "function", "name": 1}]}),
            "tools[0].name",
        ),
        (
            json!({"model": "m", "input": "hi", "temperature": "hot"}),
            "temperature",
        ),
        (
            json!({"model": "m", "input": "hi", "instructions": ["a"]}),
            "instructions",
        ),
        (
            json!({"model": "m", "input": "hi", "reasoning": "high"}),
            "reasoning",
        ),
        (
            json!({"model": "m", "input": "hi", "stream_options": {"include_obfuscation": 1}}),
            "stream_options.include_obfuscation",
        ),
    ] {
        assert_400(&error(req), Some(param), "invalid_type");
    }
}

#[test]
fn message_items_need_a_valid_role_and_content() {
    assert_400(
        &error(json!({"model": "m", "input": [{"type": "message", "content": "x"}]})),
        Some("input[0].role"),
        "missing_required_parameter",
    );
    assert_400(
        &error(
            json!({"model": "m", "input": [{"type": "message", "role": "tool", "content": "x"}]}),
        ),
        Some("input[0].role"),
        "invalid_value",
    );
    assert_400(
        &error(json!({"model": "m", "input": [{"type": "message", "role": "user"}]})),
        Some("input[0].content"),
        "missing_required_parameter",
    );
    assert_400(
        &error(json!({"model": "m", "input": [{"content": "x"}]})),
        Some("input[0].type"),
        "missing_required_parameter",
    );
}

#[test]
fn unknown_item_types_are_rejected() {
    for kind in ["web_search_call", "mcp_call", "messages", "program"] {
        let e = error(json!({"model": "m", "input": [
            {"role": "user", "content": "hi"}, {"type": kind, "foo": 1}]}));
        assert_400(&e, Some("input[1].type"), "invalid_value");
    }
}

#[test]
fn unknown_content_part_types_are_rejected() {
    let e = error(json!({"model": "m", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "image", "url": "x"}]}]}));
    assert_400(&e, Some("input[0].content[1].type"), "invalid_value");
    let e = error(json!({"model": "m", "input": [
        {"role": "user", "content": [{"text": "no type"}]}]}));
    assert_400(
        &e,
        Some("input[0].content[0].type"),
        "missing_required_parameter",
    );
}

#[test]
fn errors_render_the_openresponses_envelope() {
    let e = error(json!({"model": "m", "input": "hi", "temperature": 3}));
    let body: Value = serde_json::from_slice(&e.to_body()).unwrap();
    assert_eq!(body["error"]["type"], json!("invalid_request_error"));
    assert_eq!(body["error"]["param"], json!("temperature"));
    assert_eq!(body["error"]["code"], json!("invalid_value"));
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("temperature"));
}

// ---------------------------------------------------------------------------------------------
// The echo in the response
// ---------------------------------------------------------------------------------------------

#[test]
fn echo_defaults_for_a_minimal_request() {
    let r = echo(json!({"model": "m", "input": "hi"}));
    assert_eq!(r["id"], json!(format!("resp_{:032x}", 0xfeed)));
    assert_eq!(r["object"], json!("response"));
    assert_eq!(r["created_at"], json!(NOW));
    assert_eq!(r["completed_at"], json!(NOW + 1));
    assert_eq!(r["model"], json!("m"));
    assert_eq!(r["status"], json!("completed"));
    for (key, value) in [
        ("instructions", Value::Null),
        ("tools", json!([])),
        ("tool_choice", json!("auto")),
        ("temperature", json!(1.0)),
        ("top_p", json!(1.0)),
        ("presence_penalty", json!(0.0)),
        ("frequency_penalty", json!(0.0)),
        ("top_logprobs", json!(0)),
        ("max_output_tokens", Value::Null),
        ("max_tool_calls", Value::Null),
        ("parallel_tool_calls", json!(true)),
        ("truncation", json!("disabled")),
        ("text", json!({"format": {"type": "text"}})),
        ("reasoning", Value::Null),
        ("store", json!(false)),
        ("background", json!(false)),
        ("service_tier", json!("default")),
        ("metadata", json!({})),
        ("safety_identifier", Value::Null),
        ("prompt_cache_key", Value::Null),
        ("previous_response_id", Value::Null),
    ] {
        assert_eq!(r[key], value, "{key}");
    }
}

#[test]
fn echo_of_tools_in_responses_form() {
    let r = echo(with(json!({"tools": [weather_tool(), time_tool()],
        "tool_choice": {"type": "function", "name": "get_weather"}, "parallel_tool_calls": false})));
    assert_eq!(
        r["tools"],
        json!([
            weather_tool(),
            {"type": "function", "name": "get_time", "description": null, "parameters": null, "strict": null}
        ])
    );
    assert_eq!(
        r["tool_choice"],
        json!({"type": "function", "name": "get_weather"})
    );
    assert_eq!(r["parallel_tool_calls"], json!(false));
}

#[test]
fn echo_of_tool_choice_strings_and_allowed_tools() {
    for choice in ["auto", "none", "required"] {
        let r = echo(with(json!({"tools": [time_tool()], "tool_choice": choice})));
        assert_eq!(r["tool_choice"], json!(choice));
    }
    // The echo lists every tool (not only the allowed ones) and completes `mode`.
    let r = echo(with(json!({"tools": [weather_tool(), time_tool()],
        "tool_choice": {"type": "allowed_tools", "tools": [{"type": "function", "name": "get_time"}]}})));
    assert_eq!(
        r["tool_choice"],
        json!({"type": "allowed_tools", "mode": "auto",
               "tools": [{"type": "function", "name": "get_time"}]})
    );
    assert_eq!(r["tools"].as_array().unwrap().len(), 2);
    // Without tools the choice is still echoed, although it is not sent upstream.
    assert_eq!(
        echo(with(json!({"tool_choice": "none"})))["tool_choice"],
        json!("none")
    );
}

#[test]
fn echo_of_sampling_and_limits() {
    let r = echo(with(
        json!({"temperature": 0.3, "top_p": 0.8, "presence_penalty": 0.5,
        "frequency_penalty": -0.5, "max_output_tokens": 64, "max_tool_calls": 2,
        "top_logprobs": 4}),
    ));
    assert_eq!(r["temperature"], json!(0.3));
    assert_eq!(r["top_p"], json!(0.8));
    assert_eq!(r["presence_penalty"], json!(0.5));
    assert_eq!(r["frequency_penalty"], json!(-0.5));
    assert_eq!(r["max_output_tokens"], json!(64));
    assert_eq!(r["max_tool_calls"], json!(2));
    assert_eq!(r["top_logprobs"], json!(4));
}

#[test]
fn echo_of_instructions_metadata_and_identifiers() {
    let r = echo(with(
        json!({"instructions": "Be kind.", "metadata": {"team": "a", "run": "7"},
        "safety_identifier": "sid", "prompt_cache_key": "pck", "truncation": "auto",
        "service_tier": "priority", "store": true}),
    ));
    assert_eq!(r["instructions"], json!("Be kind."));
    assert_eq!(r["metadata"], json!({"team": "a", "run": "7"}));
    assert_eq!(r["safety_identifier"], json!("sid"));
    assert_eq!(r["prompt_cache_key"], json!("pck"));
    assert_eq!(r["truncation"], json!("auto"));
    assert_eq!(r["service_tier"], json!("priority"));
    assert_eq!(r["store"], json!(false));
}

#[test]
fn echo_of_text_and_reasoning() {
    let r = echo(with(
        json!({"text": {"format": {"type": "json_object"}, "verbosity": "high"},
        "reasoning": {"effort": "low"}}),
    ));
    assert_eq!(
        r["text"],
        json!({"format": {"type": "json_object"}, "verbosity": "high"})
    );
    assert_eq!(r["reasoning"], json!({"effort": "low", "summary": null}));
}

#[test]
fn echo_of_a_json_schema_format() {
    // Not run through `echo()`: the fixture's JsonSchemaResponseFormat only allows a null
    // `schema`, which would reject every real schema.
    let t = run(
        &with(
            json!({"text": {"format": {"type": "json_schema", "name": "n",
            "schema": {"type": "object"}}}}),
        ),
        &Options::default(),
    )
    .unwrap();
    let answer = json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"content": "{}"}}]});
    let r: Value =
        serde_json::from_slice(&completion(&t.plan, answer.to_string().as_bytes(), 1).unwrap())
            .unwrap();
    assert_eq!(
        r["text"],
        json!({"format": {"type": "json_schema", "name": "n", "description": null,
                          "schema": {"type": "object"}, "strict": false}})
    );
}

#[test]
fn logprobs_requested_are_returned_in_the_output() {
    let t = run(
        &with(json!({"include": ["message.output_text.logprobs"]})),
        &Options::default(),
    )
    .unwrap();
    let answer = json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"content": "A"},
        "logprobs": {"content": [{"token": "A", "logprob": -0.5, "top_logprobs": []}]}}]});
    let r: Value =
        serde_json::from_slice(&completion(&t.plan, answer.to_string().as_bytes(), 1).unwrap())
            .unwrap();
    assert_eq!(
        r["output"][0]["content"][0]["logprobs"],
        json!([{"token": "A", "logprob": -0.5, "bytes": [65], "top_logprobs": []}])
    );
}

#[test]
fn translation_is_deterministic() {
    let req = with(json!({"tools": [weather_tool()], "temperature": 0.1, "top_k": 5}));
    let a = run(&req, &Options::default()).unwrap();
    let b = run(&req, &Options::default()).unwrap();
    assert_eq!(a.body, b.body);
    assert_eq!(a.plan.id(), b.plan.id());
}

// ---- The long tail: namespaces, hosted tools, roles, extensions, limits, sealed reasoning ----

use responses_core::translate::{DeveloperRole, HostedTools};

fn response_of(t: &Translated, chat_answer: Value) -> Value {
    let out = completion(&t.plan, chat_answer.to_string().as_bytes(), NOW).unwrap();
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn namespace_tools_are_flattened_and_restored_on_calls() {
    let req = json!({"model": "m", "input": "hi", "tools": [
        {"type": "namespace", "name": "mcp_git", "description": "git tools", "tools": [
            {"type": "function", "name": "status", "parameters": {"type": "object"}}]},
        weather_tool()]});
    let t = run(&req, &keyed()).unwrap();
    let c: Value = serde_json::from_slice(&t.body).unwrap();
    let names: Vec<&str> = c["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mcp_git__status", "get_weather"]);
    let r = response_of(
        &t,
        json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "mcp_git__status", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}}]}),
    );
    assert_eq!(r["output"][0]["name"], "status");
    assert_eq!(r["output"][0]["namespace"], "mcp_git");
    assert_eq!(r["output"][1]["name"], "get_weather");
    assert!(r["output"][1].get("namespace").is_none());
    // The call comes back in history with its namespace: flat again for the upstream.
    assert_eq!(
        messages(
            json!([{"type": "function_call", "call_id": "c1", "name": "status",
                         "namespace": "mcp_git", "arguments": "{}"}])
        )[0]["tool_calls"][0]["function"]["name"],
        "mcp_git__status"
    );
}

/// Codex's `apply_patch`, as Codex 0.169 declares it (grammar shortened).
fn apply_patch_tool() -> Value {
    json!({"type": "custom", "name": "apply_patch",
           "description": "Use the `apply_patch` tool to edit files.",
           "format": {"type": "grammar", "syntax": "lark",
                      "definition": "start: begin_patch hunk+ end_patch"}})
}

#[test]
fn custom_tools_become_one_string_parameter_functions_and_their_calls_come_back() {
    let req = json!({"model": "m", "input": "hi", "tools": [apply_patch_tool(),
        {"type": "custom", "name": "note"}, weather_tool()],
        "tool_choice": {"type": "custom", "name": "apply_patch"}});
    let t = run(&req, &keyed()).unwrap();
    let c: Value = serde_json::from_slice(&t.body).unwrap();
    let grammar = "The input must match this lark grammar:\nstart: begin_patch hunk+ end_patch";
    assert_eq!(
        c["tools"][0],
        json!({"type": "function", "function": {
            "name": "apply_patch",
            "description": format!("Use the `apply_patch` tool to edit files.\n\n{grammar}"),
            "parameters": {"type": "object",
                "properties": {"input": {"type": "string",
                    "description": format!("The tool's input: free text, not JSON. {grammar}")}},
                "required": ["input"], "additionalProperties": false}}})
    );
    assert_eq!(
        c["tools"][1]["function"]["parameters"]["properties"]["input"]["description"],
        "The tool's input: free text, not JSON."
    );
    assert!(c["tools"][1]["function"].get("description").is_none());
    assert_eq!(
        c["tool_choice"],
        json!({"type": "function", "function": {"name": "apply_patch"}})
    );

    // The upstream's call of the function is a custom_tool_call with the input decoded.
    let patch = "*** Begin Patch\n*** Add File: a.txt\n+hello\n*** End Patch";
    let args = json!({"input": patch}).to_string();
    let r = response_of(
        &t,
        json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "apply_patch", "arguments": args}},
            {"id": "c2", "type": "function", "function": {"name": "note", "arguments": "not json"}},
            {"id": "c3", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]}}]}),
    );
    assert_eq!(
        r["output"][0],
        json!({"type": "custom_tool_call", "id": r["output"][0]["id"], "call_id": "c1",
               "name": "apply_patch", "input": patch})
    );
    assert!(r["output"][0]["id"].as_str().unwrap().starts_with("ctc_"));
    // A model that did not wrap the input in JSON: the tool gets what it wrote.
    assert_eq!(r["output"][1]["input"], "not json");
    assert_eq!(r["output"][2]["type"], "function_call");
    // Only function tools are echoed (the schema has no custom form); the choice as sent.
    assert_eq!(r["tools"].as_array().unwrap().len(), 1);
    assert_eq!(
        r["tool_choice"],
        json!({"type": "custom", "name": "apply_patch"})
    );
}

#[test]
fn custom_tool_history_becomes_assistant_tool_calls_and_tool_messages() {
    let patch = "*** Begin Patch\n*** End Patch";
    assert_eq!(
        messages(json!([
            {"type": "message", "role": "user", "content": "fix it"},
            {"type": "custom_tool_call", "id": "ctc_1", "call_id": "c1", "name": "apply_patch",
             "input": patch, "status": "completed"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done!"}
        ])),
        json!([
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "apply_patch", "arguments": json!({"input": patch}).to_string()}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "Done!"}
        ])
    );
}

#[test]
fn custom_tools_that_cannot_be_mapped_are_400() {
    let tool = |extra: Value| {
        let mut t = json!({"type": "custom", "name": "apply_patch"});
        for (k, v) in extra.as_object().unwrap() {
            t[k] = v.clone();
        }
        with(json!({"tools": [t]}))
    };
    assert_400(
        &error(tool(
            json!({"format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}),
        )),
        Some("tools[0].format.syntax"),
        "invalid_value",
    );
    assert_400(
        &error(tool(
            json!({"format": {"type": "grammar", "syntax": "lark"}}),
        )),
        Some("tools[0].format.definition"),
        "missing_required_parameter",
    );
    assert_400(
        &error(tool(json!({"format": {"type": "json"}}))),
        Some("tools[0].format.type"),
        "invalid_value",
    );
    assert_400(
        &error(tool(json!({"cache_control": {}}))),
        Some("tools[0].cache_control"),
        "unknown_parameter",
    );
    assert_400(
        &error(with(json!({"tools": [{"type": "custom"}]}))),
        Some("tools[0].name"),
        "missing_required_parameter",
    );
    assert_400(
        &error(with(
            json!({"input": [{"type": "custom_tool_call", "call_id": "c1", "name": "x"}]}),
        )),
        Some("input[0].input"),
        "missing_required_parameter",
    );
    assert_400(
        &error(with(
            json!({"tools": [apply_patch_tool()], "tool_choice": {"type": "custom", "name": "other"}}),
        )),
        Some("tool_choice.name"),
        "invalid_value",
    );
}

#[test]
fn hosted_tools_are_dropped_by_default_or_rejected() {
    let req = with(
        json!({"tools": [{"type": "web_search"}, weather_tool(), {"type": "file_search", "vector_store_ids": []}]}),
    );
    let c = chat(req.clone());
    assert_eq!(c["tools"], json!([chat_weather_tool()]));
    let reject = Options {
        hosted_tools: HostedTools::Reject,
        ..Options::default()
    };
    let e = error_raw(req.to_string().as_bytes(), &reject);
    assert_400(&e, Some("tools[0].type"), "unsupported_tool");
}

#[test]
fn developer_role_is_configurable() {
    let req = json!({"model": "m", "instructions": "be brief", "input": [
        {"type": "message", "role": "developer", "content": "use metric units"},
        {"type": "message", "role": "user", "content": "hi"}]});
    let dev = Options {
        developer_role: DeveloperRole::Developer,
        ..Options::default()
    };
    assert_eq!(
        chat_with(req.clone(), &dev)["messages"],
        json!([{"role": "developer", "content": "be brief\n\nuse metric units"},
               {"role": "user", "content": "hi"}])
    );
    assert_eq!(chat(req)["messages"][0]["role"], "system");
    // A developer message later in the conversation stays where it is.
    let late = json!({"model": "m", "input": [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "message", "role": "developer", "content": "now be formal"}]});
    assert_eq!(
        chat_with(late, &dev)["messages"][1],
        json!({"role": "developer", "content": "now be formal"})
    );
}

#[test]
fn provider_extensions_are_dropped() {
    let c = chat(
        json!({"model": "m", "acme:priority": "high", "top_k": 5, "input": [
        {"type": "acme:trace", "data": 1},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "hi"}, {"type": "acme:hint", "x": 1}]}]}),
    );
    assert_eq!(
        c,
        json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
               "top_k": 5})
    );
    // Other unknown item types stay errors.
    assert_400(
        &error(json!({"model": "m", "input": [{"type": "web_search_call"}]})),
        Some("input[0].type"),
        "invalid_value",
    );
}

#[test]
fn configured_limits_are_typed_errors() {
    let small = Options {
        max_input_items: 2,
        max_part_bytes: 8,
        max_request_bytes: 200,
        ..Options::default()
    };
    let three = json!({"model": "m", "input": [
        {"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "user", "content": "c"}]});
    assert_400(
        &error_raw(three.to_string().as_bytes(), &small),
        Some("input"),
        "too_many_input_items",
    );
    let big_part = json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "123456789"}]}]});
    assert_400(
        &error_raw(big_part.to_string().as_bytes(), &small),
        Some("input[0].content[0].text"),
        "content_too_large",
    );
    let huge = json!({"model": "m", "input": "x".repeat(300)});
    let e = error_raw(huge.to_string().as_bytes(), &small);
    assert_eq!(
        (e.status, e.code.as_ref().map(Code::as_str)),
        (413, Some("request_too_large"))
    );
}

#[test]
fn sealed_reasoning_round_trips_and_tampering_is_rejected() {
    let req = json!({"model": "m", "input": "2+2?", "include": ["reasoning.encrypted_content"]});
    let t = run(&req, &keyed()).unwrap();
    let r = response_of(
        &t,
        json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"reasoning": "two plus two is four", "content": "4"}}]}),
    );
    assert_valid("ResponseResource", &r);
    let sealed = r["output"][0]["encrypted_content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(!sealed.contains("four"));

    // The next turn carries the reasoning item back: the upstream sees the text again.
    let mut reasoning = r["output"][0].clone();
    reasoning["content"] = json!([]);
    let history = json!([{"role": "user", "content": "2+2?"}, reasoning, r["output"][1].clone(),
                         {"role": "user", "content": "and 3+3?"}]);
    let m = messages(history.clone());
    assert_eq!(m[1]["reasoning_content"], "two plus two is four");
    assert_eq!(m[1]["content"], "4");

    // Without the include, no blob.
    let plain = run(&json!({"model": "m", "input": "x"}), &keyed()).unwrap();
    let r2 = response_of(
        &plain,
        json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"reasoning": "t", "content": "4"}}]}),
    );
    assert!(r2["output"][0].get("encrypted_content").is_none());

    // Tampered, foreign, or sealed under a key we do not have: 400, no plaintext anywhere.
    let mut bytes = sealed.into_bytes();
    let last = bytes.len() - 1;
    bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
    for blob in [String::from_utf8(bytes).unwrap(), "opaque".to_owned()] {
        let mut item = reasoning.clone();
        item["encrypted_content"] = json!(blob);
        let e = error_raw(
            json!({"model": "m", "input": [item, {"role": "user", "content": "q"}]})
                .to_string()
                .as_bytes(),
            &keyed(),
        );
        assert_400(
            &e,
            Some("input[0].encrypted_content"),
            "invalid_encrypted_content",
        );
        assert!(!e.message.contains("four"));
    }
    let other_key = Options {
        keyring: Some(Arc::new(Keyring::single("k2", [9; 32]).unwrap())),
        ..Options::default()
    };
    let e = error_raw(
        json!({"model": "m", "input": history})
            .to_string()
            .as_bytes(),
        &other_key,
    );
    assert_400(
        &e,
        Some("input[1].encrypted_content"),
        "invalid_encrypted_content",
    );
    // No keys at all: asking for sealed reasoning is a clear 400.
    assert_400(&error(req), Some("include"), "unsupported_parameter");
}

#[test]
fn max_tool_calls_caps_the_output() {
    let req = with(json!({"tools": [weather_tool(), time_tool()], "max_tool_calls": 1}));
    let t = run(&req, &keyed()).unwrap();
    let r = response_of(
        &t,
        json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]}}]}),
    );
    let out = r["output"].as_array().unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["call_id"], "c1");
    assert_eq!(r["max_tool_calls"], 1);
}

#[test]
fn streams_seal_reasoning_and_cap_tool_calls_too() {
    use responses_core::translate::stream::StreamTranslator;
    let req = with(
        json!({"stream": true, "include": ["reasoning.encrypted_content"],
                          "tools": [weather_tool(), time_tool()], "max_tool_calls": 1}),
    );
    let t = run(&req, &keyed()).unwrap();
    let mut s = StreamTranslator::new(t.plan);
    let body = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hmm\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[",
        "{\"index\":0,\"id\":\"c1\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{}\"}},",
        "{\"index\":1,\"id\":\"c2\",\"function\":{\"name\":\"get_time\",\"arguments\":\"{}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n"
    );
    let mut out = s.push(body.as_bytes(), NOW).to_vec();
    out.extend_from_slice(&s.finish(NOW));
    let text = String::from_utf8(out).unwrap();
    let completed: Value = text
        .split("\n\n")
        .filter_map(|f| f.strip_prefix("event: response.completed\ndata: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .next()
        .expect("a completed event");
    let output = completed["response"]["output"].as_array().unwrap();
    assert_eq!(output.len(), 2, "reasoning + one call: {output:?}");
    assert!(output[0]["encrypted_content"]
        .as_str()
        .is_some_and(|b| !b.contains("hmm")));
    assert_eq!(output[1]["call_id"], "c1");
    assert!(
        !text.contains(r#""call_id":"c2""#),
        "the dropped call never reaches the client"
    );
}

#[test]
fn streamed_logprobs_count_toward_the_output_cap() {
    use responses_core::translate::stream::StreamTranslator;
    let tight = Options {
        max_output_bytes: 2_000,
        ..keyed()
    };
    let t = run(
        &with(
            json!({"stream": true, "include": ["message.output_text.logprobs"], "top_logprobs": 5}),
        ),
        &tight,
    )
    .unwrap();
    let mut s = StreamTranslator::new(t.plan);
    let top: Vec<Value> = (0..5)
        .map(|i| json!({"token": format!("tok{i}"), "logprob": -1.0}))
        .collect();
    let frame = json!({"choices": [{"index": 0, "delta": {"content": "a"},
        "logprobs": {"content": [{"token": "a", "logprob": -0.1, "top_logprobs": top}]}}]});
    let mut out = Vec::new();
    for _ in 0..200 {
        out.extend_from_slice(&s.push(format!("data: {frame}\n\n").as_bytes(), NOW));
    }
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("event: response.failed"),
        "tiny text, large logprobs: capped"
    );
    assert!(text.contains("response_too_large"));
    // The first deltas did carry their logprobs.
    assert!(text.contains(r#""logprobs":[{"token":"a""#));
}

#[test]
fn codex_client_metadata_is_not_forwarded() {
    let req = with(json!({"client_metadata": {"installation_id": "i-1", "session_id": "s-1"}}));
    let c = chat(req.clone());
    assert!(c.get("client_metadata").is_none(), "{c}");
    assert!(run(&req, &strict()).is_ok(), "strict mode accepts it too");
    field_error(
        json!({"client_metadata": "x"}),
        "client_metadata",
        "invalid_type",
    );
}

// ---------------------------------------------------------------------------------------------
// The 2026 surface of openai-python 3.54 / openai-node 7.57: what clients send back
// ---------------------------------------------------------------------------------------------

/// What `model_dump()` of each output kind writes (every field of the SDK's model, `null`
/// when unset), plus what the SDKs' `parse()` and stream helpers add, goes back upstream as
/// if the client had sent only the fields that mean something.
#[test]
fn the_sdks_dumps_of_every_output_kind_continue() {
    let dumped = json!([
        {"type": "message", "role": "user", "content": "weather?", "phase": null},
        {"id": "rs_1", "type": "reasoning", "summary": [], "status": null,
         "content": [{"type": "reasoning_text", "text": "look it up"}], "encrypted_content": null},
        {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
         "phase": "commentary",
         "content": [{"type": "output_text", "text": "Checking.", "annotations": [],
                      "logprobs": null, "parsed": null}]},
        {"id": "fc_1", "type": "function_call", "call_id": "c1", "name": "get_weather",
         "arguments": "{\"city\":\"Paris\"}", "status": "completed", "namespace": null,
         "async": null, "caller": null, "parsed_arguments": {"city": "Paris"}},
        {"id": "ctc_1", "type": "custom_tool_call", "call_id": "c2", "name": "note",
         "input": "x", "namespace": null, "async": false, "caller": {"type": "direct"}},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny", "id": null,
         "status": null, "name": "get_weather", "namespace": null, "caller": null},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "ok", "caller": null},
        {"id": "msg_2", "type": "message", "role": "assistant", "status": "completed",
         "phase": "final_answer",
         "content": [{"type": "output_text", "text": "Sunny.", "annotations": [],
                      "logprobs": [], "parsed": {"answer": "Sunny."}},
                     {"type": "refusal", "refusal": "no more"}]}
    ]);
    assert_eq!(
        messages(dumped),
        json!([
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "Checking.", "reasoning_content": "look it up",
             "tool_calls": [
                {"id": "c1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "c2", "type": "function",
                 "function": {"name": "note", "arguments": "{\"input\":\"x\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            {"role": "tool", "tool_call_id": "c2", "content": "ok"},
            {"role": "assistant", "content": "Sunny.", "refusal": "no more"}
        ])
    );
    // `phase` is one of the SDKs' two values.
    let e = error(json!({"model": "m", "input": [
        {"role": "assistant", "content": "x", "phase": "thinking"}]}));
    assert_400(&e, Some("input[0].phase"), "invalid_value");
    // `caller` is a caller.
    let e = error(json!({"model": "m", "input": [
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}",
         "caller": {"type": "robot"}}]}));
    assert_400(&e, Some("input[0].caller.type"), "invalid_value");
}

/// The user message `responses.compact()` keeps, as openai-python dumps it: `phase: null`,
/// and `annotations` / `logprobs` inside its `input_text`.
#[test]
fn the_kept_message_of_a_compaction_goes_back_as_dumped() {
    assert_eq!(
        messages(json!([{"id": "msg_1", "type": "message", "role": "user",
            "status": "completed", "phase": null,
            "content": [{"type": "input_text", "text": "hi", "annotations": null,
                         "logprobs": null, "prompt_cache_breakpoint": null}]}])),
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    );
    assert_eq!(
        messages(json!([{"type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "hi", "annotations": [],
                         "logprobs": []}]}])),
        json!([{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    );
}

#[test]
fn content_part_hints_are_accepted_and_detail_original_is_high() {
    let breakpoint = json!({"mode": "explicit", "ttl": "30m"});
    assert_eq!(
        messages(json!([{"role": "user", "content": [
            {"type": "input_text", "text": "see", "prompt_cache_breakpoint": breakpoint},
            {"type": "input_image", "image_url": "https://x/i.png", "detail": "original",
             "file_id": null, "prompt_cache_breakpoint": breakpoint},
            {"type": "input_file", "file_url": "https://x/f.pdf", "detail": "low",
             "file_id": null, "prompt_cache_breakpoint": null}]}])),
        json!([{"role": "user", "content": [
            {"type": "text", "text": "see"},
            {"type": "image_url", "image_url": {"url": "https://x/i.png", "detail": "high"}},
            {"type": "file", "file": {"file_url": "https://x/f.pdf"}}]}])
    );
    let e = error(json!({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_file", "file_url": "https://x/f.pdf", "detail": "original"}]}]}));
    assert_400(&e, Some("input[0].content[0].detail"), "invalid_value");
    let e = error(json!({"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "x", "prompt_cache_breakpoint": "here"}]}]}));
    assert_400(
        &e,
        Some("input[0].content[0].prompt_cache_breakpoint"),
        "invalid_type",
    );
}

#[test]
fn tool_hints_are_accepted_and_namespaces_hold_custom_tools() {
    let req = json!({"model": "m", "input": "hi", "tools": [
        {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": true,
         "allowed_callers": ["direct", "programmatic"], "defer_loading": true,
         "output_schema": {"type": "object"}, "async": false},
        {"type": "custom", "name": "c", "allowed_callers": null, "defer_loading": false,
         "async": true},
        {"type": "namespace", "name": "ns", "description": "d", "tools": [
            {"type": "function", "name": "g", "async": true, "output_schema": null},
            {"type": "custom", "name": "h", "description": "free text"}]}]});
    let t = run(&req, &keyed()).unwrap();
    let c: Value = serde_json::from_slice(&t.body).unwrap();
    let names: Vec<&str> = c["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["f", "c", "ns__g", "ns__h"]);
    assert_eq!(
        c["tools"][0],
        json!({"type": "function", "function": {"name": "f",
               "parameters": {"type": "object"}, "strict": true}})
    );
    assert_eq!(
        c["tools"][3]["function"]["parameters"]["required"],
        json!(["input"])
    );
    // A namespaced custom tool's call comes back as a custom_tool_call with its namespace.
    let r = response_of(
        &t,
        json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "ns__h", "arguments": "{\"input\":\"text\"}"}}]}}]}),
    );
    assert_eq!(r["output"][0]["type"], "custom_tool_call");
    assert_eq!(r["output"][0]["name"], "h");
    assert_eq!(r["output"][0]["namespace"], "ns");
    assert_eq!(r["output"][0]["input"], "text");
    // And goes upstream flat again.
    assert_eq!(
        messages(
            json!([{"type": "custom_tool_call", "call_id": "c1", "name": "h",
            "namespace": "ns", "input": "text"}])
        )[0]["tool_calls"][0]["function"]["name"],
        "ns__h"
    );
    let e = error(with(json!({"tools": [{"type": "function", "name": "f",
        "allowed_callers": ["anyone"]}]})));
    assert_400(&e, Some("tools[0].allowed_callers[0]"), "invalid_value");
    let e = error(with(json!({"tools": [{"type": "namespace", "name": "ns",
        "description": "d", "tools": [{"type": "shell"}]}]})));
    assert_400(&e, Some("tools[0].tools[0].type"), "invalid_value");
}

#[test]
fn service_tiers_are_echoed_as_sent_and_hosted_includes_accepted() {
    for tier in [
        "auto",
        "default",
        "flex",
        "scale",
        "priority",
        "fast",
        "ultrafast",
    ] {
        let t = run(&with(json!({"service_tier": tier})), &Options::default()).unwrap();
        let r = response_of(
            &t,
            json!({"choices": [{"index": 0, "finish_reason": "stop",
                "message": {"content": "ok"}}]}),
        );
        assert_eq!(r["service_tier"], tier);
    }
    let c = chat(with(json!({"include": [
        "file_search_call.results", "web_search_call.results",
        "web_search_call.action.sources", "message.input_image.image_url",
        "computer_call_output.output.image_url", "code_interpreter_call.outputs",
        "reasoning.encrypted_content"]})));
    assert_eq!(
        c,
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    );
}

/// A tool output must answer a call of the context (OpenAI: `No tool call found for function
/// call output with call_id ...`), for every kind of output.
#[test]
fn an_output_without_its_call_is_400_naming_the_item() {
    let outputs = [
        json!({"type": "function_call_output", "call_id": "nope", "output": "x"}),
        json!({"type": "custom_tool_call_output", "call_id": "nope", "output": "x"}),
        json!({"type": "shell_call_output", "call_id": "nope", "output": []}),
        json!({"type": "apply_patch_call_output", "call_id": "nope", "status": "completed"}),
    ];
    for output in outputs {
        let e = error(json!({"model": "m", "input": [
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            output.clone()]}));
        assert_400(&e, Some("input[2].call_id"), "invalid_value");
        assert!(
            e.message.starts_with("No tool call found for ")
                && e.message.contains("with call_id nope")
                && e.message.contains("'input[2]'"),
            "{e}"
        );
    }
    let e = error(json!({"model": "m", "input": [
        {"type": "local_shell_call_output", "id": "nope", "output": "{}"}]}));
    assert_400(&e, Some("input[0].id"), "invalid_value");
    // The output before its call does not answer it either.
    let e = error(json!({"model": "m", "input": [
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]}));
    assert_400(&e, Some("input[0].call_id"), "invalid_value");
}

// ---- Client-executed built-in tools: shell, local_shell, apply_patch ----

#[test]
fn builtin_tools_become_functions_with_the_actions_parameters() {
    let req = json!({"model": "m", "input": "hi", "tools": [
        {"type": "shell", "environment": {"type": "local"}},
        {"type": "local_shell"},
        {"type": "apply_patch", "allowed_callers": ["direct"]}],
        "tool_choice": {"type": "apply_patch"}});
    let t = run(&req, &keyed()).unwrap();
    let c: Value = serde_json::from_slice(&t.body).unwrap();
    let tools = c["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 3);
    assert_eq!(tools[0]["function"]["name"], "shell");
    assert_eq!(
        tools[0]["function"]["parameters"]["properties"]["commands"],
        json!({"type": "array", "items": {"type": "string"},
               "description": "The shell commands to run, in order."})
    );
    assert_eq!(
        tools[0]["function"]["parameters"]["required"],
        json!(["commands"])
    );
    assert_eq!(tools[1]["function"]["name"], "local_shell");
    assert_eq!(
        tools[1]["function"]["parameters"]["required"],
        json!(["command"])
    );
    assert_eq!(tools[2]["function"]["name"], "apply_patch");
    assert_eq!(
        tools[2]["function"]["parameters"]["properties"]["type"]["enum"],
        json!(["create_file", "update_file", "delete_file"])
    );
    assert_eq!(
        c["tool_choice"],
        json!({"type": "function", "function": {"name": "apply_patch"}})
    );
    // Echoed as sent; the built-ins are not echoed in `tools` (the schema has no such form).
    let r = response_of(
        &t,
        json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"content": "ok"}}]}),
    );
    assert_eq!(r["tool_choice"], json!({"type": "apply_patch"}));
    assert_eq!(r["tools"], json!([]));
}

#[test]
fn a_shell_in_a_hosted_container_is_a_hosted_tool_and_computer_is_always_400() {
    let hosted = json!({"type": "shell", "environment": {"type": "container_auto"}});
    let c = chat(with(json!({"tools": [hosted.clone()]})));
    assert!(c.get("tools").is_none(), "{c}");
    let reject = Options {
        hosted_tools: responses_core::translate::HostedTools::Reject,
        ..Options::default()
    };
    let e = error_raw(
        with(json!({"tools": [hosted]})).to_string().as_bytes(),
        &reject,
    );
    assert_400(&e, Some("tools[0].type"), "unsupported_tool");
    for kind in ["computer", "computer_use_preview"] {
        let e = error(with(json!({"tools": [{"type": kind}]})));
        assert_400(&e, Some("tools[0].type"), "unsupported_tool");
        assert!(e.message.contains("computer use"), "{e}");
    }
    // A function named like a built-in, beside it: one name, two tools.
    let e = error(with(json!({"tools": [{"type": "shell"},
        {"type": "function", "name": "shell"}]})));
    assert_400(&e, Some("tools[1].name"), "invalid_value");
}

#[test]
fn builtin_calls_come_back_as_their_call_items() {
    let req = json!({"model": "m", "input": "hi", "tools": [
        {"type": "shell"}, {"type": "local_shell"}, {"type": "apply_patch"}]});
    let t = run(&req, &keyed()).unwrap();
    let call = |id: &str, name: &str, args: Value| {
        json!({"id": id, "type": "function",
               "function": {"name": name, "arguments": args.to_string()}})
    };
    let r = response_of(
        &t,
        json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
        "message": {"content": "Let me look.", "tool_calls": [
            call("c1", "shell", json!({"commands": ["ls -la", "pwd"], "timeout_ms": 5000})),
            call("c2", "local_shell", json!({"command": ["ls"], "env": {"A": "1"}})),
            call("c3", "apply_patch", json!({"type": "create_file", "path": "a.txt",
                                             "diff": "+hello"})),
            call("c4", "apply_patch", json!({"type": "delete_file", "path": "b.txt"})),
            call("c5", "shell", json!({"cmd": 1}))]}}]}),
    );
    let out = r["output"].as_array().unwrap();
    assert_eq!(out[0]["type"], "message");
    assert_eq!(out[0]["phase"], "commentary");
    assert_eq!(
        out[1],
        json!({"type": "shell_call", "id": out[1]["id"], "call_id": "c1",
               "action": {"commands": ["ls -la", "pwd"], "timeout_ms": 5000,
                          "max_output_length": null},
               "status": "completed"})
    );
    assert!(out[1]["id"].as_str().unwrap().starts_with("sh_"));
    assert_eq!(
        out[2],
        json!({"type": "local_shell_call", "id": out[2]["id"], "call_id": "c2",
               "action": {"type": "exec", "command": ["ls"], "env": {"A": "1"},
                          "timeout_ms": null, "user": null, "working_directory": null},
               "status": "completed"})
    );
    assert_eq!(
        out[3],
        json!({"type": "apply_patch_call", "id": out[3]["id"], "call_id": "c3",
               "operation": {"type": "create_file", "path": "a.txt", "diff": "+hello"},
               "status": "completed"})
    );
    assert_eq!(
        out[4]["operation"],
        json!({"type": "delete_file", "path": "b.txt"})
    );
    // Arguments that do not fit the action: the model's call as it wrote it.
    assert_eq!(
        out[5],
        json!({"type": "function_call", "id": out[5]["id"], "call_id": "c5",
               "name": "shell", "arguments": "{\"cmd\":1}", "status": "completed"})
    );
}

#[test]
fn builtin_history_becomes_assistant_tool_calls_and_tool_messages() {
    let history = json!([
        {"type": "message", "role": "user", "content": "look around"},
        {"type": "shell_call", "id": "sh_1", "call_id": "c1", "status": "completed",
         "action": {"commands": ["ls"], "timeout_ms": null, "max_output_length": 100},
         "environment": null, "caller": null, "created_by": null},
        {"type": "local_shell_call", "id": "lsh_1", "call_id": "c2", "status": "completed",
         "action": {"type": "exec", "command": ["pwd"], "env": {}, "timeout_ms": null,
                    "user": null, "working_directory": "/tmp"}},
        {"type": "apply_patch_call", "id": "apc_1", "call_id": "c3", "status": "completed",
         "operation": {"type": "update_file", "path": "a.txt", "diff": "-a\n+b"}},
        {"type": "shell_call_output", "id": "sho_1", "call_id": "c1", "status": "completed",
         "max_output_length": 100, "output": [
            {"stdout": "a.txt\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}},
            {"stdout": "", "stderr": "", "outcome": {"type": "timeout"}, "created_by": null}]},
        {"type": "local_shell_call_output", "id": "lsh_1", "output": "{\"output\":\"/tmp\"}",
         "status": null},
        {"type": "apply_patch_call_output", "call_id": "c3", "status": "failed",
         "output": "no such file"}
    ]);
    assert_eq!(
        messages(history),
        json!([
            {"role": "user", "content": "look around"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "shell",
                    "arguments": "{\"commands\":[\"ls\"],\"max_output_length\":100}"}},
                {"id": "c2", "type": "function", "function": {"name": "local_shell",
                    "arguments": "{\"command\":[\"pwd\"],\"env\":{},\"working_directory\":\"/tmp\"}"}},
                {"id": "c3", "type": "function", "function": {"name": "apply_patch",
                    "arguments": "{\"type\":\"update_file\",\"path\":\"a.txt\",\"diff\":\"-a\\n+b\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content":
                "[{\"stdout\":\"a.txt\\n\",\"stderr\":\"\",\"outcome\":{\"type\":\"exit\",\"exit_code\":0}},{\"stdout\":\"\",\"stderr\":\"\",\"outcome\":{\"type\":\"timeout\"}}]"},
            {"role": "tool", "tool_call_id": "c2", "content": "{\"output\":\"/tmp\"}"},
            {"role": "tool", "tool_call_id": "c3",
             "content": "{\"status\":\"failed\",\"output\":\"no such file\"}"}
        ])
    );
    // Their content is checked like any call's.
    for (item, param, code) in [
        (
            json!({"type": "shell_call", "call_id": "c", "action": {"commands": "ls"}}),
            "input[0].action.commands",
            "invalid_type",
        ),
        (
            json!({"type": "shell_call", "call_id": "c", "action": null}),
            "input[0].action",
            "missing_required_parameter",
        ),
        (
            json!({"type": "apply_patch_call", "call_id": "c", "status": "completed",
                "operation": {"type": "update_file", "path": "a"}}),
            "input[0].operation.diff",
            "missing_required_parameter",
        ),
        (
            json!({"type": "apply_patch_call", "call_id": "c", "status": "completed",
                "operation": {"type": "rename_file", "path": "a"}}),
            "input[0].operation.type",
            "invalid_value",
        ),
        (
            json!({"type": "local_shell_call", "call_id": "c",
                "action": {"type": "exec", "command": ["ls"], "env": {"A": 1}}}),
            "input[0].action.env.A",
            "invalid_type",
        ),
    ] {
        let e = error(json!({"model": "m", "input": [item]}));
        assert_400(&e, Some(param), code);
    }
}

// ---- Codex's 2026 items: additional_tools, compaction_trigger ----

#[test]
fn additional_tools_join_the_requests_tools() {
    let req = json!({"model": "m", "tools": [weather_tool()], "input": [
        {"type": "message", "role": "user", "content": "hi"},
        {"type": "additional_tools", "role": "developer", "id": null,
         "tools": [time_tool(), {"type": "shell"}]}],
        "tool_choice": {"type": "function", "name": "get_time"}});
    let c = chat(req);
    let names: Vec<&str> = c["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["get_weather", "get_time", "shell"]);
    assert_eq!(c["messages"], json!([{"role": "user", "content": "hi"}]));
    assert_eq!(c["tool_choice"]["function"]["name"], "get_time");
    // Errors name the tool where it was declared.
    let e = error(json!({"model": "m", "input": [
        {"type": "additional_tools", "role": "developer", "tools": [{"type": "function"}]}]}));
    assert_400(
        &e,
        Some("input[0].tools[0].name"),
        "missing_required_parameter",
    );
    let e = error(json!({"model": "m", "input": [
        {"type": "additional_tools", "role": "user", "tools": []}]}));
    assert_400(&e, Some("input[0].role"), "invalid_value");
    let e = error(json!({"model": "m", "tools": [weather_tool()], "input": [
        {"type": "additional_tools", "role": "developer", "tools": [weather_tool()]}]}));
    assert_400(&e, Some("input[0].tools[0].name"), "invalid_value");
}

#[test]
fn a_compaction_trigger_asks_the_upstream_for_a_summary() {
    let req = json!({"model": "m", "instructions": "be brief", "stream": true,
        "tools": [weather_tool()], "tool_choice": "required",
        "text": {"format": {"type": "json_object"}},
        "input": [
            {"type": "message", "role": "user", "content": "I am Ada"},
            {"type": "message", "role": "assistant", "content": "Hello Ada"},
            {"type": "compaction_trigger", "id": null, "metadata": null}]});
    let c = chat(req);
    assert_eq!(
        c,
        json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
            "messages": [
                {"role": "system", "content": format!("{}\n\nThe assistant was following these instructions, which it will be given again (do not repeat them in the summary):\nbe brief", responses_core::translate::compact::PROMPT)},
                {"role": "user", "content": "I am Ada"},
                {"role": "assistant", "content": "Hello Ada"},
                {"role": "user", "content": responses_core::translate::compact::REQUEST}]})
    );
    let e = error(json!({"model": "m", "input": [
        {"type": "compaction_trigger"}, {"role": "user", "content": "hi"}]}));
    assert_400(&e, Some("input[0]"), "invalid_value");
    // The summary travels sealed: without keys there is nothing to answer with.
    let e = error(json!({"model": "m", "input": [
        {"role": "user", "content": "hi"}, {"type": "compaction_trigger"}]}));
    assert_eq!(
        e.code.as_ref().map(Code::as_str),
        Some("compaction_unavailable"),
        "{e}"
    );
}

#[test]
fn a_compaction_triggers_answer_is_one_sealed_compaction_item_that_opens_later() {
    let req = json!({"model": "m", "input": [
        {"type": "message", "role": "user", "content": "I am Ada"},
        {"type": "compaction_trigger"}]});
    let t = run(&req, &keyed()).unwrap();
    let r = response_of(
        &t,
        json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"content": "The user is Ada.", "reasoning_content": "hmm"}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}}),
    );
    assert_eq!(r["status"], "completed");
    let out = r["output"].as_array().unwrap();
    assert_eq!(out.len(), 1, "{r}");
    assert_eq!(out[0]["type"], "compaction");
    assert!(out[0]["id"].as_str().unwrap().starts_with("cmp_"));
    assert_eq!(r["usage"]["output_tokens"], 4);
    // The item goes back like /v1/responses/compact's: its summary heads the conversation.
    let next = messages(json!([out[0].clone(), {"role": "user", "content": "Who am I?"}]));
    assert_eq!(
        next[0]["content"],
        format!(
            "{}The user is Ada.",
            responses_core::translate::compact::CONTEXT_PREFIX
        )
    );
    // No summary: 502.
    let out = completion(
        &t.plan,
        json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": " "}}]})
            .to_string()
            .as_bytes(),
        NOW,
    )
    .unwrap_err();
    assert_eq!(
        (out.status, out.code.as_ref().map(Code::as_str)),
        (502, Some("upstream_invalid_response"))
    );
}

#[test]
fn output_messages_say_their_phase() {
    let t = run(&with(json!({"tools": [weather_tool()]})), &keyed()).unwrap();
    let r = response_of(
        &t,
        json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"content": "Sunny."}}]}),
    );
    assert_eq!(r["output"][0]["phase"], "final_answer");
    let r = response_of(
        &t,
        json!({"choices": [{"index": 0, "finish_reason": "tool_calls",
            "message": {"content": "Let me check.", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"}}]}}]}),
    );
    assert_eq!(r["output"][0]["phase"], "commentary");
    // A refusal is an answer too.
    let r = response_of(
        &t,
        json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"content": null, "refusal": "no"}}]}),
    );
    assert_eq!(r["output"][0]["phase"], "final_answer");
}

/// Options of OpenAI's platform that the SDKs type on a request (not OpenResponses fields):
/// serving choices are validated and not forwarded to a Chat server, moderation is refused,
/// `user` is Chat's `user`.
#[test]
fn openai_platform_options_are_read_not_forwarded() {
    let c = chat(with(json!({
        "prompt_cache_retention": "24h",
        "prompt_cache_options": {"mode": "explicit", "ttl": "30m", "prewarm": null},
        "access_programs": {"cyber": "standard"},
        "background_options": {"completion_window": "2h"},
        "context_management": [{"type": "compaction", "compact_threshold": 1000}],
        "image": {"context_compression": "auto"},
        "moderation": null,
        "user": "u-1"})));
    assert_eq!(
        c,
        json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "user": "u-1"})
    );
    field_error(
        json!({"moderation": {"model": "omni-moderation-latest"}}),
        "moderation",
        "unsupported_parameter",
    );
    field_error(
        json!({"context_management": {"type": "compaction"}}),
        "context_management",
        "invalid_type",
    );
    // `safety_identifier` wins over the older `user`.
    let c = chat(with(json!({"user": "old", "safety_identifier": "new"})));
    assert_eq!(c["user"], "new");
}
