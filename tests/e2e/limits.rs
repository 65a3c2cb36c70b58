//! Fail closed at every size: each limit crossed from both sides (half, just under, just over,
//! twice) through the real Envoy and the translator (either mode: `tests/common/stack.rs`), in
//! both directions. Every case asserts what the upstream received (path and body) as well as
//! what the client got (status, content type, shape): within the caps everything is
//! translated; beyond them the client gets a typed envelope naming the limit (413 for
//! requests, 502 for answers) or a stream ending in `response.failed`, and nothing
//! untranslated crosses in either direction.
//!
//! The limits (docs/limits-and-failures.md): Envoy's buffer (`per_connection_buffer_limit_bytes`, 16 MiB)
//! equals the processor's `--max-request-bytes` and `--max-body-bytes` (16 MiB each); the
//! processor's gRPC message limit is derived from those caps. A processor run with lower caps
//! than Envoy's buffer shows the other side: Envoy hands over a message larger than the
//! processor reads, and the exchange still fails closed. In module mode Envoy buffers nothing
//! for the filter (it drains each piece into the core's bounded buffer): the caps are the only
//! limits, and the same cases check them.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::{client, Envoy, Reply, ScriptedUpstream, Stack};
use serde_json::{json, Value};

const MIB: usize = 1 << 20;
/// The shipped caps and Envoy buffer limit.
const LIMIT: usize = 16 * MIB;
const TIMEOUT: Duration = Duration::from_secs(120);

/// What the client got.
#[derive(Debug)]
struct Answer {
    status: u16,
    content_type: String,
    body: Bytes,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json(&self) -> Value {
        common::json::parse_strict(&self.text()).unwrap_or_else(|e| {
            panic!(
                "not strict JSON ({e}): {} {} {}",
                self.status,
                self.content_type,
                preview(&self.text())
            )
        })
    }

    /// Asserts an OpenResponses error envelope and returns its `error` object.
    #[track_caller]
    fn envelope(&self, status: u16, code: &str) -> Value {
        assert_eq!(
            (self.status, self.content_type.as_str()),
            (status, "application/json"),
            "{}",
            preview(&self.text())
        );
        let v = self.json();
        assert_eq!(
            v.as_object().map(|o| o.len()),
            Some(1),
            "{}",
            preview(&v.to_string())
        );
        let error = &v["error"];
        assert_eq!(error["code"], code, "{v}");
        assert!(
            error["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{v}"
        );
        assert!(error["type"].is_string(), "{v}");
        error.clone()
    }

    /// Asserts a translated `ResponseResource` and returns it.
    #[track_caller]
    fn response(&self) -> Value {
        assert_eq!(
            (self.status, self.content_type.as_str()),
            (200, "application/json"),
            "{}",
            preview(&self.text())
        );
        let v = self.json();
        assert_eq!(v["object"], "response", "{}", preview(&v.to_string()));
        v
    }

    /// The raw upstream form never reaches the client.
    #[track_caller]
    fn assert_nothing_raw(&self) {
        let text = self.text();
        assert!(
            !text.contains("chat.completion"),
            "untranslated upstream bytes reached the client: {}",
            preview(&text)
        );
    }
}

fn preview(s: &str) -> String {
    let mut end = s.len().min(400);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

async fn post(envoy: &Envoy, body: Vec<u8>) -> Answer {
    try_post(envoy, body)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// An answer Envoy cut mid-body: what arrived before the cut, whole, for the test to check.
struct Cut {
    error: String,
    body: Vec<u8>,
}

impl Cut {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.text();
        let shown = if text.len() <= 64 * 1024 {
            text
        } else {
            let mut start = text.len() - 600;
            while !text.is_char_boundary(start) {
                start += 1;
            }
            format!("…{}", &text[start..])
        };
        write!(
            f,
            "the answer was cut ({}) after {} bytes: {shown}",
            self.error,
            self.body.len()
        )
    }
}

/// The answer, or how it was cut.
async fn try_post(envoy: &Envoy, body: Vec<u8>) -> Result<Answer, Cut> {
    let response = client()
        .post(envoy.url("/v1/responses"))
        .header("content-type", "application/json")
        .body(body)
        .timeout(TIMEOUT)
        .send()
        .await;
    let response = match response {
        Ok(r) => r,
        // Envoy may answer 413 and close before the client has written all of a large body.
        Err(e) => panic!("request failed: {e:?}"),
    };
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let mut response = response;
    let mut body = Vec::new();
    loop {
        match response.chunk().await {
            Ok(Some(c)) => body.extend_from_slice(&c),
            Ok(None) => break,
            Err(e) => {
                return Err(Cut {
                    error: format!("{e:?}"),
                    body,
                });
            }
        }
    }
    let body = Bytes::from(body);
    Ok(Answer {
        status,
        content_type,
        body,
    })
}

/// A request of exactly `size` bytes carrying one image as a data URL (what a photo is).
fn image_request(size: usize) -> (Vec<u8>, usize) {
    let skeleton = |data: &str| {
        json!({"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "What is in this picture?"},
            {"type": "input_image", "image_url": format!("data:image/png;base64,{data}")}]}]})
        .to_string()
    };
    let overhead = skeleton("").len();
    let data = "A".repeat(size.saturating_sub(overhead));
    let body = skeleton(&data);
    assert_eq!(body.len(), size.max(overhead));
    let url_len = "data:image/png;base64,".len() + data.len();
    (body.into_bytes(), url_len)
}

fn completion(text: &str) -> Value {
    json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
}

/// A Chat JSON answer whose body is `size` bytes.
fn completion_of_size(size: usize) -> (Vec<u8>, usize) {
    let overhead = completion("").to_string().len();
    let text = "x".repeat(size - overhead);
    let body = completion(&text).to_string();
    assert_eq!(body.len(), size);
    (body.into_bytes(), text.len())
}

fn chunk(text: &str) -> String {
    let chunk = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]});
    format!("data: {chunk}\n\n")
}

fn stream_end() -> String {
    let chunk = json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
    format!("data: {chunk}\n\ndata: [DONE]\n\n")
}

/// An SSE answer with `total` bytes of text in deltas of `delta` bytes, as one string.
fn sse_body(total: usize, delta: usize) -> String {
    let piece = "y".repeat(delta);
    let mut body = String::with_capacity(total + total / 8);
    let mut sent = 0;
    while sent < total {
        let n = delta.min(total - sent);
        body.push_str(&chunk(&piece[..n]));
        sent += n;
    }
    body.push_str(&stream_end());
    body
}

/// Splits a body into writes of `size` bytes, written back to back: a flood.
fn flood(body: &str, size: usize) -> Reply {
    let chunks: Vec<Bytes> = body
        .as_bytes()
        .chunks(size)
        .map(Bytes::copy_from_slice)
        .collect();
    Reply::sse(chunks).with_delay(Duration::ZERO)
}

/// The `output_text.done` text of a translated stream, or the failure code; panics on
/// anything untranslated or unterminated.
fn stream_outcome(answer: &Answer) -> Result<usize, String> {
    assert_eq!(
        (answer.status, answer.content_type.as_str()),
        (200, "text/event-stream"),
        "{}",
        preview(&answer.text())
    );
    answer.assert_nothing_raw();
    let text = answer.text();
    assert!(
        text.starts_with("event: response.created\n"),
        "{}",
        preview(&text)
    );
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "{}",
        preview(&text[text.len().saturating_sub(400)..])
    );
    let last = text
        .rsplit("\n\n")
        .find(|e| e.starts_with("event: response."))
        .expect("a terminal event");
    let data = last.split_once("\ndata: ").expect("data line").1;
    let v: Value = serde_json::from_str(data).expect("terminal event JSON");
    match v["type"].as_str() {
        Some("response.completed") => Ok(v["response"]["output"][0]["content"][0]["text"]
            .as_str()
            .expect("output text")
            .len()),
        Some("response.failed") => Err(v["response"]["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()),
        other => panic!("unexpected terminal event {other:?}"),
    }
}

/// Requests around the 16 MiB request limit: translated whole up to it (a 12 MiB photo
/// included), a 413 envelope beyond it; the upstream gets the Chat request or nothing.
#[tokio::test]
async fn request_sizes_around_the_request_limit() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| Reply::json(200, &completion("a cat")));
    let stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;

    for (size, within) in [
        (LIMIT / 2, true),
        (12 * MIB, true),
        (LIMIT - 4096, true),
        (LIMIT + 4096, false),
        (2 * LIMIT, false),
    ] {
        let before = upstream.requests().len();
        let (body, url_len) = image_request(size);
        let answer = post(envoy, body).await;
        let received = upstream.requests();
        if within {
            let v = answer.response();
            assert_eq!(v["output"][0]["content"][0]["text"], "a cat");
            assert_eq!(received.len(), before + 1, "size {size}");
            let up = received.last().unwrap();
            assert_eq!(up.path, "/v1/chat/completions", "size {size}");
            let chat = up.json();
            assert_eq!(
                chat["messages"][0]["content"][1]["image_url"]["url"]
                    .as_str()
                    .map(str::len),
                Some(url_len),
                "size {size}: the image reached the upstream whole"
            );
        } else {
            answer.envelope(413, "request_too_large");
            assert_eq!(
                received.len(),
                before,
                "size {size}: the upstream was called"
            );
        }
    }
}

/// With caps below Envoy's buffer, Envoy hands over messages larger than the processor reads
/// (its gRPC limit is derived from the caps): the exchange still fails with an envelope, and
/// nothing reaches the upstream untranslated (the old failure: a clean end of the gRPC
/// stream, on which Envoy forwarded the raw request to `/v1/responses`). In module mode the
/// same bodies, many times the caps, check that the caps hold far beyond them.
#[tokio::test]
async fn messages_over_the_processor_grpc_limit_fail_closed() {
    let upstream = ScriptedUpstream::start();
    let stack = Stack::start(
        upstream.port(),
        &[
            "--max-request-bytes",
            "1048576",
            "--max-body-bytes",
            "1048576",
            "--max-output-bytes",
            "1048576",
        ],
    );
    let envoy = &stack.envoy;

    // Its own cap: 413 naming the flag, from the processor.
    let (body, _) = image_request(MIB + 4096);
    let error = post(envoy, body).await.envelope(413, "request_too_large");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("--max-request-bytes"),
        "{error}"
    );
    // Over its gRPC message limit (3 MiB here), within Envoy's buffer.
    for size in [5 * MIB, 7 * MIB, 12 * MIB] {
        let (body, _) = image_request(size);
        post(envoy, body).await.envelope(413, "request_too_large");
    }
    assert!(
        upstream.requests().is_empty(),
        "{:?}",
        upstream
            .requests()
            .iter()
            .map(|r| &r.path)
            .collect::<Vec<_>>()
    );

    // A JSON answer over the cap and over the gRPC limit: 502, never the raw Chat object.
    for size in [MIB + 4096, 5 * MIB, 7 * MIB, 12 * MIB] {
        let (answer, _) = completion_of_size(size);
        upstream.push(Reply::raw(200, "application/json", answer));
        let answer = post(envoy, br#"{"model":"m","input":"hi"}"#.to_vec()).await;
        answer.envelope(502, "upstream_response_too_large");
    }
    // A stream flooding in writes over the gRPC limit: the client gets `response.failed`
    // (for the output cap, or in answer to the chunk Envoy could not hand over), then a clean
    // end, or a reset when a later chunk is over the limit (the processor cannot read on, even
    // to discard); never raw bytes. Which of these happens depends on how Envoy coalesces the
    // writes, so each is accepted and checked whole.
    upstream.push(flood(&sse_body(12 * MIB, 256 * 1024), 6 * MIB));
    match try_post(
        envoy,
        br#"{"model":"m","input":"hi","stream":true}"#.to_vec(),
    )
    .await
    {
        Ok(answer) => {
            let code = stream_outcome(&answer).expect_err("12 MiB over a 1 MiB output cap");
            assert!(code.contains("too_large"), "{code}");
        }
        // The whole of what arrived is checked, not the preview: a cut answer is translated
        // events ending in `response.failed`, then nothing.
        Err(cut) => {
            let text = cut.text();
            assert!(text.starts_with("event: response.created\n"), "{cut}");
            assert!(!text.contains("chat.completion"), "{cut}");
            let failed = text
                .rfind("event: response.failed\n")
                .unwrap_or_else(|| panic!("no response.failed before the cut: {cut}"));
            let event = &text[failed..];
            let data = event
                .split_once("\ndata: ")
                .and_then(|(_, rest)| rest.split_once("\n\n"))
                .unwrap_or_else(|| panic!("response.failed was cut: {cut}"));
            let failed: Value = serde_json::from_str(data.0).expect("event JSON");
            let code = failed["response"]["error"]["code"].as_str().unwrap_or("");
            assert!(code.contains("too_large"), "{code}: {cut}");
            assert!(
                data.1.is_empty() || data.1 == "data: [DONE]\n\n",
                "events after response.failed: {}",
                preview(data.1)
            );
        }
    }
    for r in upstream.requests() {
        assert_eq!(r.path, "/v1/chat/completions");
    }
}

/// JSON answers around the 16 MiB answer limit: translated up to it, a 502 envelope naming
/// the limit beyond it.
#[tokio::test]
async fn json_answer_sizes_around_the_body_limit() {
    let upstream = ScriptedUpstream::start();
    let stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;

    for (size, within) in [
        (LIMIT / 2, true),
        (LIMIT - 64 * 1024, true),
        (LIMIT + 64 * 1024, false),
        (2 * LIMIT, false),
    ] {
        let (body, text_len) = completion_of_size(size);
        upstream.push(Reply::raw(200, "application/json", body));
        let answer = post(envoy, br#"{"model":"m","input":"hi"}"#.to_vec()).await;
        answer.assert_nothing_raw();
        if within {
            let v = answer.response();
            assert_eq!(
                v["output"][0]["content"][0]["text"].as_str().map(str::len),
                Some(text_len),
                "size {size}"
            );
        } else {
            let error = answer.envelope(502, "upstream_response_too_large");
            assert!(
                error["message"]
                    .as_str()
                    .unwrap()
                    .contains("--max-body-bytes"),
                "{error}"
            );
        }
    }
    assert!(upstream
        .requests()
        .iter()
        .all(|r| r.path == "/v1/chat/completions"));
}

/// Streams written as fast as the network allows, in any chunking: translated while the
/// output is within `--max-output-bytes` (16 MiB), a clean `response.failed` beyond it.
#[tokio::test]
async fn flooding_streams_are_translated_or_fail_cleanly() {
    let upstream = ScriptedUpstream::start();
    // What is tested is the translation of a flood, not the processor's clock: a debug build
    // on a loaded machine may take more than Envoy's 5 s per message on an 8 MiB piece (then
    // a clean 504 envelope, which `processor_timeout`'s own tests cover).
    let stack = Stack::start_with(upstream.port(), &[], |config| {
        config.replace("message_timeout: 5s", "message_timeout: 25s")
    });
    let envoy = &stack.envoy;

    for (text, delta, write, within) in [
        (8 * MIB, 64 * 1024, 1024 * 1024, true),
        (8 * MIB, 4096, 16 * 1024, true),
        (LIMIT - MIB, 256 * 1024, 8 * MIB, true),
        (24 * MIB, 256 * 1024, 4 * MIB, false),
        (40 * MIB, 512 * 1024, 40 * MIB + MIB, false),
    ] {
        eprintln!("flood: {text} bytes of text, deltas of {delta}, writes of {write}");
        upstream.push(flood(&sse_body(text, delta), write));
        let answer = try_post(
            envoy,
            br#"{"model":"m","input":"hi","stream":true}"#.to_vec(),
        )
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e}\ntranslator:\n{}\nenvoy:\n{}\n{}",
                stack.translator_logs(),
                envoy.logs(),
                envoy.admin_url("/stats?filter=ext_proc")
            )
        });
        match stream_outcome(&answer) {
            Ok(n) => {
                assert!(within, "{text} bytes of text completed over the cap");
                assert_eq!(n, text);
            }
            Err(code) => {
                assert!(!within, "{text} bytes of text failed: {code}");
                assert_eq!(code, "response_too_large");
            }
        }
    }
}

/// A server that always streams, asked for one JSON object: the stream is folded into one
/// `ResponseResource` (within `--max-body-bytes`), promptly, or a 502 envelope beyond it.
#[tokio::test]
async fn stream_answering_a_json_request_is_folded() {
    let upstream = ScriptedUpstream::start();
    let stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;

    upstream.push(Reply::sse([chunk("Hel"), chunk("lo"), stream_end()]));
    let answer = post(envoy, br#"{"model":"m","input":"hi"}"#.to_vec()).await;
    let v = answer.response();
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"][0]["content"][0]["text"], "Hello");

    // Cut short (no finish_reason, no [DONE]): an envelope, not a half answer.
    upstream.push(Reply::sse([chunk("Hel")]));
    let answer = post(envoy, br#"{"model":"m","input":"hi"}"#.to_vec()).await;
    answer.envelope(502, "upstream_stream_truncated");

    // Over the answer limit: 502 naming it.
    upstream.push(flood(&sse_body(LIMIT + MIB, 256 * 1024), MIB));
    let answer = post(envoy, br#"{"model":"m","input":"hi"}"#.to_vec()).await;
    answer.envelope(502, "upstream_response_too_large");
}

/// One upstream SSE event around `--max-sse-frame-bytes` (1 MiB): held and translated up to
/// it, a clean `response.failed` (`upstream_event_too_large`) beyond it.
#[tokio::test]
async fn sse_event_sizes_around_the_frame_limit() {
    let upstream = ScriptedUpstream::start();
    let stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;
    let frame_overhead = chunk("").len();
    for (event, within) in [
        (MIB / 2, true),
        (MIB - 1024, true),
        (MIB + 1024, false),
        (2 * MIB, false),
    ] {
        let text = "q".repeat(event - frame_overhead);
        // The event is written in small pieces: the processor must hold it until its end.
        let body = format!("{}{}", chunk(&text), stream_end());
        upstream.push(flood(&body, 64 * 1024));
        let answer = post(
            envoy,
            br#"{"model":"m","input":"hi","stream":true}"#.to_vec(),
        )
        .await;
        match stream_outcome(&answer) {
            Ok(n) => {
                assert!(within, "a {event}-byte event was translated");
                assert_eq!(n, text.len());
            }
            Err(code) => {
                assert!(!within, "a {event}-byte event failed: {code}");
                assert_eq!(code, "upstream_event_too_large");
            }
        }
    }
}

/// Input items and content parts around their caps (set low here): 400 naming the field
/// beyond them, and the upstream is not called.
#[tokio::test]
async fn item_and_part_caps_through_envoy() {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| Reply::json(200, &completion("ok")));
    let stack = Stack::start(
        upstream.port(),
        &["--max-input-items", "64", "--max-part-bytes", "65536"],
    );
    let envoy = &stack.envoy;

    for (items, within) in [(32, true), (64, true), (65, false), (128, false)] {
        let input: Vec<Value> = (0..items)
            .map(|i| json!({"role": "user", "content": format!("message {i}")}))
            .collect();
        let before = upstream.requests().len();
        let answer = post(
            envoy,
            json!({"model": "m", "input": input})
                .to_string()
                .into_bytes(),
        )
        .await;
        if within {
            answer.response();
            let chat = upstream.requests().last().unwrap().json();
            assert_eq!(chat["messages"].as_array().map(Vec::len), Some(items));
        } else {
            assert_eq!(
                answer.envelope(400, "too_many_input_items")["param"],
                "input"
            );
            assert_eq!(upstream.requests().len(), before);
        }
    }
    for (part, within) in [
        (32 * 1024, true),
        (65536, true),
        (65537, false),
        (131_072, false),
    ] {
        let body = json!({"model": "m", "input": [{"role": "user", "content": [
            {"type": "input_text", "text": "x".repeat(part)}]}]});
        let before = upstream.requests().len();
        let answer = post(envoy, body.to_string().into_bytes()).await;
        if within {
            answer.response();
            assert_eq!(upstream.requests().len(), before + 1);
        } else {
            let error = answer.envelope(400, "content_too_large");
            assert!(
                error["param"]
                    .as_str()
                    .unwrap()
                    .starts_with("input[0].content[0]"),
                "{error}"
            );
            assert_eq!(upstream.requests().len(), before);
        }
    }
}

/// The `model` goes on as the model header Envoy routes on, so it must be a header value:
/// at most `MAX_MODEL_BYTES` (1 KiB), no control character. Around the limit (half, at, one
/// over, far over) and with the characters Envoy refuses in a header (CR, LF, NUL) or HTTP
/// does (other controls), streamed or not: within, translated with the model in the header and
/// the body; beyond, a 400 `invalid_value` naming `model` and nothing upstream.
#[tokio::test]
async fn model_names_around_the_header_limit() {
    use responses_core::translate::request::MAX_MODEL_BYTES;

    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| Reply::json(200, &completion("ok")));
    let stack = Stack::start(upstream.port(), &[]);
    let envoy = &stack.envoy;

    let sizes = [
        ("half", MAX_MODEL_BYTES / 2, true),
        ("at", MAX_MODEL_BYTES, true),
        ("one over", MAX_MODEL_BYTES + 1, false),
        ("far over", MIB, false),
    ];
    for (what, size, within) in sizes {
        // Ends in a two-byte character: the cap counts bytes.
        let model = format!("{}é", "m".repeat(size - 2));
        assert_eq!(model.len(), size);
        let before = upstream.requests().len();
        let answer = post(
            envoy,
            json!({"model": model, "input": "hi"})
                .to_string()
                .into_bytes(),
        )
        .await;
        if within {
            assert_eq!(answer.response()["model"], json!(model), "{what}");
            let request = upstream.requests().pop().expect("a Chat request");
            // Bytes: a header value's non-ASCII bytes are not `to_str`'s.
            assert_eq!(
                request
                    .headers
                    .get("x-responses-model")
                    .map(|v| v.as_bytes()),
                Some(model.as_bytes()),
                "{what}"
            );
            assert_eq!(request.json()["model"], json!(model), "{what}");
        } else {
            let error = answer.envelope(400, "invalid_value");
            assert_eq!(error["param"], "model", "{what}");
            assert_eq!(upstream.requests().len(), before, "{what}");
        }
    }
    for model in ["m\nx-evil: 1", "m\r", "m\u{0}", "\u{1}m", "m\u{7f}"] {
        for stream in [false, true] {
            let answer = post(
                envoy,
                json!({"model": model, "input": "hi", "stream": stream})
                    .to_string()
                    .into_bytes(),
            )
            .await;
            let error = answer.envelope(400, "invalid_value");
            assert_eq!(error["param"], "model", "{model:?}");
            assert_eq!(error["type"], "invalid_request_error", "{model:?}");
        }
    }
    assert_eq!(
        upstream.requests().len(),
        2,
        "only the two within the limit"
    );
}
