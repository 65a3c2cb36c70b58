//! Compressed request bodies through the real Envoy (both modes: `RESPONSES_E2E_MODE=module`):
//! the translator decodes them itself (core/src/request_encoding.rs), so every coding
//! (`gzip`, `deflate` as zlib or raw, `br`, `zstd`, stacked) is translated like a plain body
//! and the upstream receives plain Chat JSON without `content-encoding`; a decompression bomb
//! of each coding stops at the request cap (413, the upstream never called, the translator's
//! memory bounded by the cap, not by the bomb); the cap is on the decoded size; a coding the
//! translator does not decode is a 415 naming it, a body that is not what its coding says a
//! 400. Answers are not compressed unless the operator adds Envoy's compressor (checked with
//! it added).

use crate::common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{Reply, ScriptedUpstream, Stack};
use serde_json::{json, Value};

const TIMEOUT: Duration = Duration::from_secs(60);

fn completion(text: &str) -> Value {
    json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
}

/// A streaming compressor of one coding.
enum Compressor {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Zlib(flate2::write::ZlibEncoder<Vec<u8>>),
    Raw(flate2::write::DeflateEncoder<Vec<u8>>),
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::Encoder<'static, Vec<u8>>),
}

impl Compressor {
    /// `coding` as named in `content-encoding`; `raw-deflate` is `deflate` without zlib's
    /// wrapping (as some browsers send it).
    fn new(coding: &str) -> Compressor {
        let level = flate2::Compression::best();
        match coding {
            "gzip" => Compressor::Gzip(flate2::write::GzEncoder::new(Vec::new(), level)),
            "deflate" => Compressor::Zlib(flate2::write::ZlibEncoder::new(Vec::new(), level)),
            "raw-deflate" => Compressor::Raw(flate2::write::DeflateEncoder::new(Vec::new(), level)),
            "br" => Compressor::Brotli(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                1 << 16,
                5,
                22,
            ))),
            "zstd" => Compressor::Zstd(zstd::Encoder::new(Vec::new(), 19).unwrap()),
            other => panic!("no compressor for {other}"),
        }
    }

    fn write(&mut self, data: &[u8]) {
        match self {
            Compressor::Gzip(e) => e.write_all(data),
            Compressor::Zlib(e) => e.write_all(data),
            Compressor::Raw(e) => e.write_all(data),
            Compressor::Brotli(e) => e.write_all(data),
            Compressor::Zstd(e) => e.write_all(data),
        }
        .unwrap();
    }

    fn finish(self) -> Vec<u8> {
        match self {
            Compressor::Gzip(e) => e.finish().unwrap(),
            Compressor::Zlib(e) => e.finish().unwrap(),
            Compressor::Raw(e) => e.finish().unwrap(),
            Compressor::Brotli(e) => e.into_inner(),
            Compressor::Zstd(e) => e.finish().unwrap(),
        }
    }
}

fn compress(coding: &str, data: &[u8]) -> Vec<u8> {
    let mut c = Compressor::new(coding);
    c.write(data);
    c.finish()
}

/// The `content-encoding` of a coding of [`Compressor::new`].
fn header(coding: &str) -> &str {
    if coding == "raw-deflate" {
        "deflate"
    } else {
        coding
    }
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

const CODINGS: [&str; 5] = ["gzip", "deflate", "raw-deflate", "br", "zstd"];

#[tokio::test]
async fn every_coding_is_translated_and_the_upstream_gets_plain_json() {
    let upstream = ScriptedUpstream::start();
    let stack = Stack::start(upstream.port(), &[]);
    let mut cases: Vec<(String, String, Vec<u8>)> = Vec::new();
    for coding in CODINGS {
        let text = format!("hello in {coding}");
        let plain = json!({"model": "m", "input": text}).to_string();
        cases.push((
            header(coding).to_owned(),
            text,
            compress(coding, plain.as_bytes()),
        ));
    }
    // Stacked: gzip applied first, then br; undone br first.
    let text = "hello in gzip then br".to_owned();
    let plain = json!({"model": "m", "input": text}).to_string();
    let stacked = compress("br", &compress("gzip", plain.as_bytes()));
    cases.push(("gzip, br".to_owned(), text, stacked));
    for (sent, (coding, text, body)) in cases.into_iter().enumerate() {
        upstream.push(Reply::json(200, &completion("ok")));
        let answer = post(stack.envoy.port(), &[("content-encoding", &coding)], body).await;
        assert_eq!(
            answer.status,
            200,
            "{coding}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        let v = answer.json();
        assert_eq!(v["output"][0]["content"][0]["text"], "ok", "{coding}: {v}");
        // The upstream got the translated request, plain: no coding left on its head.
        let requests = upstream.wait_for_requests(sent + 1, TIMEOUT).await;
        let chat = &requests[sent];
        assert_eq!(chat.path, "/v1/chat/completions", "{coding}");
        assert_eq!(chat.header("content-encoding"), None, "{coding}");
        let length: usize = chat.header("content-length").unwrap().parse().unwrap();
        assert_eq!(length, chat.body.len(), "{coding}");
        let json = chat.json();
        assert_eq!(json["model"], "m", "{coding}: {json}");
        assert_eq!(json["messages"][0]["content"], *text, "{coding}: {json}");
    }
}

#[tokio::test]
async fn an_unknown_coding_is_a_415_and_a_body_that_is_not_its_coding_a_400() {
    let upstream = ScriptedUpstream::start();
    let stack = Stack::start(upstream.port(), &[]);
    let plain = json!({"model": "m", "input": "hi"}).to_string();
    for (coding, body, status, code) in [
        (
            "x-custom",
            plain.clone().into_bytes(),
            415,
            "unsupported_content_encoding",
        ),
        (
            "gzip, compress",
            compress("gzip", plain.as_bytes()),
            415,
            "unsupported_content_encoding",
        ),
        (
            "gzip",
            plain.clone().into_bytes(),
            400,
            "invalid_encoded_body",
        ),
        (
            "br",
            compress("gzip", plain.as_bytes()),
            400,
            "invalid_encoded_body",
        ),
    ] {
        let answer = post(stack.envoy.port(), &[("content-encoding", coding)], body).await;
        let text = String::from_utf8_lossy(&answer.body).into_owned();
        assert_eq!(answer.status, status, "{coding}: {text}");
        let error = &answer.json()["error"];
        assert_eq!(error["type"], "invalid_request_error", "{coding}: {error}");
        assert_eq!(error["code"], code, "{coding}: {error}");
        if status == 415 {
            let named = coding.rsplit(", ").next().unwrap();
            let message = error["message"].as_str().unwrap();
            assert!(message.contains(&format!("'{named}'")), "{coding}: {error}");
        }
    }
    assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());
}

/// A JSON request of exactly `size` bytes.
fn request_of(size: usize) -> Vec<u8> {
    let empty = json!({"model": "m", "input": ""}).to_string();
    let text = "a".repeat(size - empty.len());
    let body = json!({"model": "m", "input": text})
        .to_string()
        .into_bytes();
    assert_eq!(body.len(), size);
    body
}

#[tokio::test]
async fn the_cap_holds_on_the_decoded_size() {
    const CAP: usize = 64 * 1024;
    let upstream = ScriptedUpstream::start();
    let cap = CAP.to_string();
    let stack = Stack::start(upstream.port(), &["--max-request-bytes", &cap]);
    for coding in CODINGS {
        let under = compress(coding, &request_of(CAP));
        let over = compress(coding, &request_of(CAP + 1));
        assert!(over.len() < CAP / 16, "{coding}: {} bytes", over.len());
        upstream.push(Reply::json(200, &completion("ok")));
        let answer = post(
            stack.envoy.port(),
            &[("content-encoding", header(coding))],
            under,
        )
        .await;
        assert_eq!(
            answer.status,
            200,
            "{coding}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        let answer = post(
            stack.envoy.port(),
            &[("content-encoding", header(coding))],
            over,
        )
        .await;
        assert_eq!(
            answer.status,
            413,
            "{coding}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        assert_eq!(
            answer.json()["error"]["code"],
            "request_too_large",
            "{coding}"
        );
    }
    // Only the requests under the cap went upstream.
    assert_eq!(upstream.requests().len(), CODINGS.len());
}

/// Peak resident memory so far (VmHWM) of a process, in bytes.
fn peak_memory(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM");
    kb * 1024
}

/// A JSON request whose text is `size` bytes of one character, compressed in pieces (never
/// held whole).
fn bomb(coding: &str, size: usize) -> Vec<u8> {
    let piece = vec![b'0'; 1 << 20];
    let mut c = Compressor::new(coding);
    c.write(br#"{"model": "m", "input": ""#);
    for _ in 0..size / piece.len() {
        c.write(&piece);
    }
    c.write(br#""}"#);
    c.finish()
}

#[tokio::test]
async fn a_bomb_of_each_coding_stops_at_the_cap() {
    const BOMB: usize = 1 << 30;
    let upstream = ScriptedUpstream::start();
    let stack = Stack::start(upstream.port(), &[]);
    // The translator: the processor (ext_proc mode) or Envoy itself (module mode).
    let pid = stack
        .processor
        .as_ref()
        .map_or(stack.envoy.pid(), |p| p.pid());
    for coding in ["gzip", "deflate", "br", "zstd"] {
        let body = bomb(coding, BOMB);
        let size = body.len();
        let before = peak_memory(pid);
        let answer = post(stack.envoy.port(), &[("content-encoding", coding)], body).await;
        let after = peak_memory(pid);
        println!(
            "{coding} bomb ({size} bytes, {} MiB decoded): {}; the translator's peak memory {} -> {} MiB",
            BOMB >> 20,
            answer.status,
            before >> 20,
            after >> 20
        );
        assert_eq!(
            answer.status,
            413,
            "{coding}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        let error = &answer.json()["error"];
        assert_eq!(error["code"], "request_too_large", "{coding}: {error}");
        // The cap (16 MiB) and a coding's window at most, never the bomb.
        assert!(
            after.saturating_sub(before) < 96 << 20,
            "{coding}: the translator's peak memory grew by {} MiB",
            (after - before) >> 20
        );
    }
    assert!(upstream.requests().is_empty(), "a bomb was forwarded");
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
