//! Compressed request bodies through the real Envoy (both modes: `RESPONSES_E2E_MODE=module`):
//! the shipped configs put Envoy's decompressors (gzip, br, zstd) before the translator on the
//! Responses routes, so such bodies are translated like plain ones and the upstream receives
//! plain Chat JSON; a coding Envoy does not decode (deflate, anything else) reaches the
//! translator still on the body and is refused with a 415 naming it; a decompression bomb is
//! refused without reaching the upstream and without Envoy inflating it whole. Answers are
//! not compressed unless the operator adds Envoy's compressor (checked with it added).

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{RecordedRequest, Reply, ScriptedUpstream, Stack};
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(60);

fn completion(text: &str) -> Value {
    json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
}

type Compress = fn(&[u8]) -> Vec<u8>;

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn zstd(data: &[u8]) -> Vec<u8> {
    zstd::encode_all(data, 3).unwrap()
}

fn brotli(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = brotli::CompressorWriter::new(&mut out, 4096, 5, 22);
    w.write_all(data).unwrap();
    drop(w);
    out
}

/// zlib-wrapped deflate, what `content-encoding: deflate` means (RFC 9110).
fn deflate(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    body: Vec<u8>,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {} {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

async fn post(port: u16, headers: &[(&str, &str)], body: Vec<u8>) -> Answer {
    let mut request = common::client()
        .post(format!("http://127.0.0.1:{port}/v1/responses"))
        .header("content-type", "application/json")
        .timeout(TIMEOUT)
        .body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("an answer");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.bytes().await.expect("a body").to_vec();
    Answer {
        status,
        headers,
        body,
    }
}

/// The Chat request the upstream got for the only request sent.
fn the_chat_request(upstream: &ScriptedUpstream) -> RecordedRequest {
    let requests = upstream.requests();
    assert_eq!(requests.len(), 1, "{requests:?}");
    requests.into_iter().next().unwrap()
}

#[tokio::test]
async fn gzip_br_and_zstd_bodies_are_translated() {
    let codings: [(&str, Compress); 3] = [("gzip", gzip), ("br", brotli), ("zstd", zstd)];
    for (coding, compress) in codings {
        let upstream = ScriptedUpstream::with_replies([Reply::json(200, &completion("ok"))]);
        let stack = Stack::start(upstream.port(), &[]);
        let text = format!("hello in {coding}");
        let plain = json!({"model": "m", "input": text}).to_string();
        let body = compress(plain.as_bytes());
        assert_ne!(body, plain.as_bytes());
        let answer = post(stack.envoy.port(), &[("content-encoding", coding)], body).await;
        assert_eq!(
            answer.status,
            200,
            "{coding}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        let v = answer.json();
        assert_eq!(v["output"][0]["content"][0]["text"], "ok", "{coding}: {v}");
        // The upstream got the translated request, plain: the coding is gone with the bytes.
        let chat = the_chat_request(&upstream);
        assert_eq!(chat.path, "/v1/chat/completions", "{coding}");
        assert_eq!(chat.header("content-encoding"), None, "{coding}");
        let sent = chat.json();
        assert_eq!(sent["model"], "m", "{coding}: {sent}");
        assert_eq!(sent["messages"][0]["content"], text, "{coding}: {sent}");
    }
}

#[tokio::test]
async fn a_coding_left_on_the_body_is_a_415_naming_it() {
    let upstream = ScriptedUpstream::start();
    let stack = Stack::start(upstream.port(), &[]);
    let plain = json!({"model": "m", "input": "hi"}).to_string();
    for (coding, body) in [
        ("deflate", deflate(plain.as_bytes())),
        ("x-custom", plain.clone().into_bytes()),
        // Codings stacked: Envoy decodes the first it names; the rest stays on the body.
        ("gzip, x-custom", gzip(plain.as_bytes())),
    ] {
        let answer = post(stack.envoy.port(), &[("content-encoding", coding)], body).await;
        assert_eq!(
            answer.status,
            415,
            "{coding}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        let error = &answer.json()["error"];
        assert_eq!(error["type"], "invalid_request_error", "{coding}: {error}");
        assert_eq!(
            error["code"], "unsupported_content_encoding",
            "{coding}: {error}"
        );
        let left = coding.rsplit(", ").next().unwrap();
        assert!(
            error["message"]
                .as_str()
                .unwrap()
                .contains(&format!("'{left}'")),
            "{coding}: {error}"
        );
    }
    assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());
}

/// Envoy's peak resident memory so far (VmHWM), in bytes.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb * 1024
}

/// A gigabyte of zeros inside a JSON string, compressed by `compress` in pieces (never held
/// whole).
fn bomb(compress: &str) -> Vec<u8> {
    const GIB: usize = 1 << 30;
    let zeros = vec![b'0'; 1 << 20];
    let head = br#"{"model": "m", "input": ""#;
    let tail = br#""}"#;
    match compress {
        "gzip" => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            e.write_all(head).unwrap();
            for _ in 0..GIB / zeros.len() {
                e.write_all(&zeros).unwrap();
            }
            e.write_all(tail).unwrap();
            e.finish().unwrap()
        }
        _ => {
            let mut e = zstd::Encoder::new(Vec::new(), 19).unwrap();
            e.write_all(head).unwrap();
            for _ in 0..GIB / zeros.len() {
                e.write_all(&zeros).unwrap();
            }
            e.write_all(tail).unwrap();
            e.finish().unwrap()
        }
    }
}

#[tokio::test]
async fn a_decompression_bomb_is_refused_and_never_inflated_whole() {
    for coding in ["gzip", "zstd"] {
        let upstream = ScriptedUpstream::start();
        let stack = Stack::start(upstream.port(), &[]);
        let pid = stack.envoy.pid();
        let before = peak_memory(pid);
        let body = bomb(coding);
        let size = body.len();
        let answer = post(stack.envoy.port(), &[("content-encoding", coding)], body).await;
        let after = peak_memory(pid);
        let text = String::from_utf8_lossy(&answer.body);
        eprintln!(
            "{coding} bomb of {size} bytes: {} {text}; Envoy's peak memory {} -> {} MiB",
            answer.status,
            before >> 20,
            after >> 20
        );
        let error = &answer.json()["error"];
        // Envoy's bomb protection cuts the output at 100 times each read's input: a cut that
        // is still over the request cap is a 413, a shorter one is not JSON.
        match answer.status {
            413 => assert_eq!(error["code"], "request_too_large", "{coding}: {error}"),
            400 => assert_eq!(error["code"], "invalid_json", "{coding}: {error}"),
            other => panic!("{coding}: {other} {text}"),
        }
        assert!(upstream.requests().is_empty(), "{coding}: forwarded");
        // A gigabyte was never held: Envoy grew by far less than the bomb's size.
        assert!(
            after - before < 512 << 20,
            "{coding}: Envoy's peak memory grew by {} MiB",
            (after - before) >> 20
        );
    }
}

/// Envoy's compressor, added at the head of http_filters (so that answers pass through it
/// last, after the translator), for JSON answers.
const COMPRESSOR: &str = r#"          - name: envoy.filters.http.compressor
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor
              response_direction_config:
                common_config:
                  min_content_length: 16
                  content_type: ["application/json"]
              compressor_library:
                name: gzip
                typed_config:
                  "@type": type.googleapis.com/envoy.extensions.compression.gzip.compressor.v3.Gzip
"#;

#[tokio::test]
async fn answers_are_compressed_only_when_the_operator_adds_the_compressor() {
    let request = json!({"model": "m", "input": "hi"})
        .to_string()
        .into_bytes();
    let accept = [("accept-encoding", "gzip")];

    let upstream = ScriptedUpstream::with_replies([Reply::json(200, &completion("plain"))]);
    let stack = Stack::start(upstream.port(), &[]);
    let answer = post(stack.envoy.port(), &accept, request.clone()).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-encoding"), None);
    assert_eq!(answer.json()["output"][0]["content"][0]["text"], "plain");
    drop(stack);

    let upstream = ScriptedUpstream::with_replies([Reply::json(200, &completion("squeezed"))]);
    let stack = Stack::start_with(upstream.port(), &[], |config| {
        let anchor = "          http_filters:\n";
        assert_eq!(config.matches(anchor).count(), 1);
        config.replacen(anchor, &format!("{anchor}{COMPRESSOR}"), 1)
    });
    let answer = post(stack.envoy.port(), &accept, request).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-encoding"), Some("gzip"));
    let mut plain = String::new();
    flate2::read::GzDecoder::new(answer.body.as_slice())
        .read_to_string(&mut plain)
        .expect("a gzip body");
    let v: Value = serde_json::from_str(&plain).expect("the translated answer");
    assert_eq!(v["object"], "response", "{v}");
    assert_eq!(v["output"][0]["content"][0]["text"], "squeezed", "{v}");
}
