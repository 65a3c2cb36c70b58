//! The malformed-request corpus, end to end: every body in `tests/fixtures/bad_requests/`
//! (listed with its expected answer in `cases.json`) is POSTed to `/v1/responses` through a
//! real Envoy and the `responses-extproc` binary, and must get an error envelope
//! `{"error":{"message","type":"invalid_request_error","param","code"}}` with the expected
//! status, `param` and `code`, served as `application/json`, without the upstream ever being
//! called. Two oversize bodies are generated here instead of stored: one over Envoy's 8 MiB
//! buffer (413 from Envoy, turned into an envelope by the processor) and one over the
//! processor's `--max-request-bytes` (413 from the processor).
//!
//! Content type: the processor does not look at the request's `content-type`; it parses every
//! `/v1/responses` body as JSON. Non-JSON bodies get 400 `invalid_json` whatever their content
//! type (the corpus sends some under `text/plain`, form, multipart, none), and a JSON body under
//! a wrong content type is served (checked at the end).
//!
//! Cases marked `known_bug` in the manifest do not behave as expected yet: the test checks
//! that they still misbehave (so fixing one makes the test fail until the mark is removed) and
//! allows them to reach the upstream.
//!
//! One stack serves every case; all mismatches are reported together at the end.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::schema::errors as schema_errors;
use common::{client, repo_root, Reply, ScriptedUpstream, Stack};
use serde_json::{json, Value};

const MIN_CASES: usize = 60;
const TIMEOUT: Duration = Duration::from_secs(20);

struct Case {
    name: String,
    body: Vec<u8>,
    content_type: Option<String>,
    status: u16,
    param: Option<String>,
    code: Option<String>,
    known_bug: Option<String>,
}

fn opt_str(v: &Value) -> Option<String> {
    v.as_str().map(str::to_owned)
}

/// The stored cases (from `cases.json`) and the processor arguments they assume.
fn stored_cases() -> (Vec<String>, Vec<Case>) {
    let dir = repo_root().join("tests/fixtures/bad_requests");
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(dir.join("cases.json")).expect("read bad_requests/cases.json"),
    )
    .expect("cases.json is JSON");
    let args = manifest["processor_args"]
        .as_array()
        .expect("processor_args")
        .iter()
        .map(|a| a.as_str().expect("string argument").to_owned())
        .collect();
    let mut listed = BTreeSet::new();
    let cases = manifest["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .map(|c| {
            let file = c["file"].as_str().expect("file").to_owned();
            assert!(listed.insert(file.clone()), "{file} is listed twice");
            Case {
                body: std::fs::read(dir.join(&file)).unwrap_or_else(|e| panic!("read {file}: {e}")),
                name: file,
                content_type: opt_str(&c["content_type"]),
                status: u16::try_from(c["status"].as_u64().expect("status")).expect("status"),
                param: opt_str(&c["param"]),
                code: opt_str(&c["code"]),
                known_bug: opt_str(&c["known_bug"]),
            }
        })
        .collect();
    // Every file in the directory is a case: none is forgotten in the manifest.
    for entry in std::fs::read_dir(&dir).expect("read bad_requests/") {
        let name = entry.expect("dir entry").file_name();
        let name = name.to_string_lossy();
        assert!(
            name == "cases.json" || listed.contains(name.as_ref()),
            "tests/fixtures/bad_requests/{name} is not listed in cases.json"
        );
    }
    (args, cases)
}

/// A JSON request body of exactly `size` bytes (a long `input`).
fn body_of_size(size: usize) -> Vec<u8> {
    let head = br#"{"model":"m","input":""#;
    let tail = br#""}"#;
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(head);
    body.resize(size - tail.len(), b'a');
    body.extend_from_slice(tail);
    body
}

fn generated_cases() -> Vec<Case> {
    let too_large = |name: &str, size: usize| Case {
        name: name.to_owned(),
        body: body_of_size(size),
        content_type: Some("application/json".into()),
        status: 413,
        param: None,
        code: Some("request_too_large".into()),
        known_bug: None,
    };
    vec![
        // Envoy's per_connection_buffer_limit_bytes (8 MiB) answers first: the processor
        // only sees the response headers of Envoy's 413.
        too_large("generated: 9 MiB body (over Envoy's buffer)", 9 << 20),
        // Under Envoy's limit, over --max-request-bytes (1 MiB in cases.json).
        too_large("generated: 2 MiB body (over --max-request-bytes)", 2 << 20),
    ]
}

/// Everything wrong with one answer (empty: as expected).
fn check(case: &Case, status: u16, content_type: Option<&str>, body: &[u8]) -> Vec<String> {
    let mut wrong = Vec::new();
    if status != case.status {
        wrong.push(format!("status {status}, expected {}", case.status));
    }
    if content_type != Some("application/json") {
        wrong.push(format!("content-type {content_type:?}"));
    }
    let envelope: Value = match common::json::parse_strict(&String::from_utf8_lossy(body)) {
        Ok(v) => v,
        Err(e) => {
            wrong.push(format!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(body)
            ));
            return wrong;
        }
    };
    let error = &envelope["error"];
    let keys: BTreeSet<&str> = error
        .as_object()
        .map(|o| o.keys().map(String::as_str).collect())
        .unwrap_or_default();
    if envelope.as_object().map(|o| o.len()) != Some(1)
        || keys != BTreeSet::from(["message", "type", "param", "code"])
    {
        wrong.push(format!("not an error envelope: {envelope}"));
        return wrong;
    }
    if error["type"] != "invalid_request_error" {
        wrong.push(format!("type {}", error["type"]));
    }
    match error["message"].as_str() {
        Some(m) if m.trim().is_empty() => wrong.push("empty message".into()),
        // The upstream was never involved: a message blaming it misleads the client.
        Some(m) if m.to_ascii_lowercase().contains("upstream") => {
            wrong.push(format!("message mentions the upstream: {m:?}"));
        }
        Some(_) => {}
        None => wrong.push(format!("message {}", error["message"])),
    }
    if opt_str(&error["param"]) != case.param
        || !(error["param"].is_string() || error["param"].is_null())
    {
        wrong.push(format!(
            "param {}, expected {:?}",
            error["param"], case.param
        ));
    }
    let code_unchecked = case.known_bug.is_some() && case.code.is_none();
    if !code_unchecked && opt_str(&error["code"]) != case.code {
        wrong.push(format!("code {}, expected {:?}", error["code"], case.code));
    }
    for e in schema_errors("ErrorPayload", error) {
        wrong.push(format!("ErrorPayload schema: {e}"));
    }
    wrong
}

#[tokio::test]
async fn malformed_requests_get_error_envelopes_and_never_reach_the_upstream() {
    let (args, mut cases) = stored_cases();
    cases.extend(generated_cases());
    assert!(
        cases.len() >= MIN_CASES,
        "the corpus has {} cases; the issue asks for at least {MIN_CASES}",
        cases.len()
    );

    let upstream = ScriptedUpstream::start();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let stack = Stack::start(upstream.port(), &args);
    let envoy = &stack.envoy;
    let http = client();
    let url = envoy.url("/v1/responses");

    let mut failures = Vec::new();
    let mut known_bugs_reaching_upstream = 0;
    for case in &cases {
        let before = upstream.requests().len();
        let mut request = http.post(&url).body(case.body.clone()).timeout(TIMEOUT);
        if let Some(ct) = &case.content_type {
            request = request.header("content-type", ct);
        }
        let response = match request.send().await {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("{}: request failed: {e}", case.name));
                continue;
            }
        };
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.bytes().await.unwrap_or_default();
        let mut wrong = check(case, status, content_type.as_deref(), &body);
        let reached = upstream.requests().len() > before;
        match &case.known_bug {
            None if reached => wrong.push("the request reached the upstream".into()),
            None => {}
            Some(bug) if wrong.is_empty() => {
                wrong.push(format!(
                    "behaves as expected now: remove its known_bug mark ({bug})"
                ));
            }
            // Still accepted (or otherwise not rejected), as recorded.
            Some(_) if status != case.status => {
                wrong.clear();
                known_bugs_reaching_upstream += usize::from(reached);
            }
            // Rejected now, but not as expected: report the rest.
            Some(bug) => wrong.push(format!("(marked known_bug: {bug})")),
        }
        if !wrong.is_empty() {
            failures.push(format!(
                "{}:\n    {}\n    answer: {status} {}",
                case.name,
                wrong.join("\n    "),
                String::from_utf8_lossy(&body[..body.len().min(400)])
            ));
        }
    }

    assert!(
        failures.is_empty(),
        "{} of {} cases answered wrongly:\n{}\n--- processor log (tail) ---\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n"),
        tail(&stack.translator_logs(), 3000)
    );
    // Only the recorded known bugs (accepted malformed bodies) may have reached the upstream.
    assert_eq!(
        upstream.requests().len(),
        known_bugs_reaching_upstream,
        "the upstream received requests for malformed bodies"
    );

    // The same stack still serves a good request; and the request content-type is not
    // looked at: a JSON body is served under text/plain or with no content-type at all.
    upstream.set_default(|| {
        Reply::json(
            200,
            &json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
        )
    });
    for content_type in [Some("application/json"), Some("text/plain"), None] {
        let before = upstream.requests().len();
        let mut request = http
            .post(&url)
            .body(r#"{"model":"m","input":"hi"}"#)
            .timeout(TIMEOUT);
        if let Some(ct) = content_type {
            request = request.header("content-type", ct);
        }
        let response = request.send().await.expect("good request");
        assert_eq!(response.status(), 200, "content-type {content_type:?}");
        let answer: Value = common::json::strict(&response.text().await.expect("an answer"));
        assert_eq!(answer["output"][0]["content"][0]["text"], "ok");
        let sent = &upstream.requests()[before];
        assert_eq!(sent.path, "/v1/chat/completions");
        assert_eq!(sent.header("content-type"), Some("application/json"));
    }

    let mut stack = stack;
    assert!(stack.translator_running(), "the translator exited");
    assert!(
        !stack.translator_logs().contains("panic"),
        "the translator panicked:\n{}",
        tail(&stack.translator_logs(), 3000)
    );
}

fn tail(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}
