//! Compressed request bodies through the real Envoy (both modes: `RESPONSES_E2E_MODE=module`):
//! the translator decodes them itself (core/src/request_encoding.rs), so every coding
//! (`gzip`, `deflate` as zlib or raw, `br`, `zstd`, stacked) is translated like a plain body
//! and the upstream receives plain Chat JSON without `content-encoding`; a decompression bomb
//! of each coding stops at the request cap (413, the upstream never called, the translator's
//! memory bounded by the cap, not by the bomb); the cap is on the decoded size; a coding the
//! translator does not decode is a 415 naming it, a body that is not what its coding says a
//! 400. Answers are not compressed unless the operator adds Envoy's compressor (checked with
//! it added). Hostile bodies (two codings in every order and three, bodies of nothing that a
//! decoder must read through, layers of nothing inside another, the cap's size of each) end
//! as documented, none forwarded, while a normal request sent beside each is answered. A body
//! refused for its JSON is read within a budget of its size, its error worded without a tree
//! of it: three of the issue's gzipped arrays at once raise the translator's peak memory by
//! little more than their decoded size.

use crate::common;

use std::io::Read;
use std::time::Duration;

use common::compressed::{self, compress, Compressor, EmptyBlock};
use common::{Reply, ScriptedUpstream, Stack};
use serde_json::{json, Value};

/// Long: a debug build's brotli decoder takes up to ~30 s for a body at the budget (below).
const TIMEOUT: Duration = Duration::from_secs(180);

fn completion(text: &str) -> Value {
    json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
}

/// The `content-encoding` of a coding of [`Compressor::new`] (which has `raw-deflate` too).
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

const CODINGS_SENT: [&str; 5] = ["gzip", "deflate", "raw-deflate", "br", "zstd"];

#[tokio::test]
async fn every_coding_is_translated_and_the_upstream_gets_plain_json() {
    let upstream = ScriptedUpstream::start();
    let stack = Stack::start(upstream.port(), &[]);
    let mut cases: Vec<(String, String, Vec<u8>)> = Vec::new();
    for coding in CODINGS_SENT {
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
    for coding in CODINGS_SENT {
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
    assert_eq!(upstream.requests().len(), CODINGS_SENT.len());

    // The encoded bytes count against the same cap (module mode gathers them before decoding
    // them on a work thread): gzip's stored blocks make a body of the cap's size a little
    // larger encoded; just under, both sizes are within.
    let stored = |body: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
        std::io::Write::write_all(&mut e, body).unwrap();
        e.finish().unwrap()
    };
    let under = stored(&request_of(CAP - 64));
    assert!(under.len() <= CAP, "{} bytes", under.len());
    let just_over = stored(&request_of(CAP));
    assert!(just_over.len() > CAP, "{} bytes", just_over.len());
    let far_over = stored(&request_of(4 * CAP));
    upstream.push(Reply::json(200, &completion("ok")));
    let answer = post(stack.envoy.port(), &[("content-encoding", "gzip")], under).await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    for (what, body) in [("just over", just_over), ("far over", far_over)] {
        let answer = post(stack.envoy.port(), &[("content-encoding", "gzip")], body).await;
        assert_eq!(answer.status, 413, "{what}");
        assert_eq!(
            answer.json()["error"]["code"],
            "request_too_large",
            "{what}"
        );
    }
    assert_eq!(upstream.requests().len(), CODINGS_SENT.len() + 1);
    let chat = upstream.requests().last().unwrap().json();
    assert_eq!(
        chat["model"], "m",
        "the one under the cap went upstream translated"
    );
}

/// Module mode, with no room for waiting work (`RESPONSES_MODULE_WORK_QUEUE=0`): a costly
/// body (compressed, or of 1 MiB or more) is refused with a 503 the client may retry, never
/// read on Envoy's worker nor sent upstream; other requests go on.
#[tokio::test]
async fn with_the_work_threads_full_a_costly_body_is_a_503() {
    if !common::only_module("the module's work threads (ext_proc: tokio's blocking pool)") {
        return;
    }
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| Reply::json(200, &completion("ok")));
    let config = common::stack::module_bootstrap(
        "{}",
        common::envoy::Ports {
            upstream: upstream.port(),
            extproc: 0,
            listener: 0,
            ws: 1,
            calls: 0,
            otlp: 1,
        },
    );
    let envoy = common::Envoy::start_with_env(&config, &[("RESPONSES_MODULE_WORK_QUEUE", "0")]);
    let small = json!({"model": "m", "input": "hi"})
        .to_string()
        .into_bytes();
    for (what, headers, body) in [
        (
            "gzip",
            vec![("content-encoding", "gzip")],
            compress("gzip", &small),
        ),
        ("1 MiB plain", vec![], request_of(1 << 20)),
    ] {
        let answer = post(envoy.port(), &headers, body).await;
        assert_eq!(
            answer.status,
            503,
            "{what}: {}",
            String::from_utf8_lossy(&answer.body)
        );
        assert_eq!(
            answer.json()["error"]["code"],
            "server_is_overloaded",
            "{what}"
        );
    }
    assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());
    // Just under the costly size, plain: read on the worker, translated.
    let answer = post(envoy.port(), &[], request_of((1 << 20) - 1)).await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(upstream.requests().len(), 1);
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
        let before = common::memory::resident(pid, "VmHWM:");
        let answer = post(stack.envoy.port(), &[("content-encoding", coding)], body).await;
        let after = common::memory::resident(pid, "VmHWM:");
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
        // The client's listener's chain, the first (module mode's internal listener shares
        // it).
        common::examples::after_first_line(config, "          http_filters:", COMPRESSOR)
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

/// The default request cap (`--max-request-bytes`), which the hostile bodies are sized to.
const CAP: usize = 16 << 20;

/// What a body sent beside a normal request must end in.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// Translated: the upstream receives it (the check is on its Chat JSON).
    Translated(fn(&Value) -> bool),
    /// Refused with this status and code; the upstream receives nothing of it.
    Refused(u16, &'static str),
}

/// Sends `body` with `content_encoding` and, at the same time, a normal request; checks the
/// body's end, that the normal request is answered, and what the upstream received of each
/// (it answers every request with a completion).
async fn beside(
    stack: &Stack,
    upstream: &ScriptedUpstream,
    name: &str,
    content_encoding: &str,
    body: Vec<u8>,
    expect: Expect,
) {
    let before = upstream.requests().len();
    let normal_text = format!("beside {name}");
    let normal = json!({"model": "m", "input": normal_text})
        .to_string()
        .into_bytes();
    let port = stack.envoy.port();
    let coded = [("content-encoding", content_encoding)];
    let (answer, normal) = tokio::join!(post(port, &coded, body), post(port, &[], normal));
    assert_eq!(
        normal.status,
        200,
        "{name}: the normal request: {}",
        String::from_utf8_lossy(&normal.body)
    );
    assert_eq!(normal.json()["output"][0]["content"][0]["text"], "ok");
    let text = || String::from_utf8_lossy(&answer.body).into_owned();
    match expect {
        Expect::Translated(_) => assert_eq!(answer.status, 200, "{name}: {}", text()),
        Expect::Refused(status, code) => {
            assert_eq!(answer.status, status, "{name}: {}", text());
            assert_eq!(answer.json()["error"]["code"], code, "{name}: {}", text());
        }
    }
    let received = upstream.requests();
    let (normals, others): (Vec<Value>, Vec<Value>) = received[before..]
        .iter()
        .map(|r| r.json())
        .partition(|chat| chat["messages"][0]["content"] == *normal_text);
    assert_eq!(
        normals.len(),
        1,
        "{name}: the normal request went upstream once"
    );
    match expect {
        Expect::Translated(check) => {
            assert_eq!(others.len(), 1, "{name}: forwarded once");
            assert!(check(&others[0]), "{name}: the upstream got something else");
        }
        Expect::Refused(..) => assert!(others.is_empty(), "{name}: forwarded: {others:?}"),
    }
}

/// An upstream answering every request with a completion.
fn answering_upstream() -> ScriptedUpstream {
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| Reply::json(200, &completion("ok")));
    upstream
}

/// A stack for the hostile bodies. In ext_proc mode the processor answers the request beside
/// a hostile body after that body's decoding (see the adapter's notes in docs/limits-and-
/// failures.md#compressed-requests), and the tests' translators are debug builds: their
/// decoders (generic code, compiled unoptimized into the core) take up to ten times as long
/// as the release build's that benches/decode.rs measures, brotli's about 35 times (0.7 µs a
/// byte: the budget's 36 MB of metadata blocks take ~25 s). Envoy's message_timeout (5 s)
/// would turn that into a 504: raised here, since the tests check outcomes, never times.
fn hostile_stack(upstream: &ScriptedUpstream) -> Stack {
    Stack::start_with(upstream.port(), &[], |config| {
        config.replace("message_timeout: 5s", "message_timeout: 150s")
    })
}

#[tokio::test]
async fn two_codings_in_every_order_are_translated_and_a_third_is_a_415() {
    let upstream = answering_upstream();
    let stack = hostile_stack(&upstream);
    let plain = json!({"model": "m", "input": "case"}).to_string();
    let sent = |chat: &Value| chat["messages"][0]["content"] == "case";
    for first in compressed::CODINGS {
        let once = compress(first, plain.as_bytes());
        beside(
            &stack,
            &upstream,
            first,
            first,
            once.clone(),
            Expect::Translated(sent),
        )
        .await;
        for second in compressed::CODINGS {
            let twice = compress(second, &once);
            let listed = format!("{first}, {second}");
            beside(
                &stack,
                &upstream,
                &listed,
                &listed,
                twice.clone(),
                Expect::Translated(sent),
            )
            .await;
            for third in compressed::CODINGS {
                let listed = format!("{first}, {second}, {third}");
                let body = compress(third, &twice);
                let refused = Expect::Refused(415, "unsupported_content_encoding");
                beside(&stack, &upstream, &listed, &listed, body, refused).await;
            }
        }
    }
}

#[tokio::test]
async fn bodies_of_nothing_at_the_cap_are_read_through_and_layers_of_nothing_refused() {
    let upstream = answering_upstream();
    let stack = hostile_stack(&upstream);
    let nothing = Expect::Refused(400, "missing_body");
    let too_large = Expect::Refused(413, "request_too_large");
    // One layer, the encoded cap's worth: read to the end where the budget allows it (zstd's
    // frames and brotli's metadata, a unit a byte), a body of nothing, refused as such; over
    // the budget where each deflate block is charged for the codes it may build (a block of
    // a few bytes is 200 units) or each brotli meta-block for its tables.
    let single: [(&str, &str, Vec<u8>, Expect); 9] = [
        (
            "empty members",
            "gzip",
            compressed::gzip_empty_members(CAP),
            too_large,
        ),
        (
            "empty dynamic blocks",
            "gzip",
            compressed::gzip_empty_blocks(EmptyBlock::Dynamic, CAP),
            too_large,
        ),
        (
            "empty fixed blocks",
            "deflate",
            compressed::deflate_empty_blocks(EmptyBlock::Fixed, CAP),
            too_large,
        ),
        (
            "empty dynamic blocks",
            "deflate",
            compressed::deflate_empty_blocks(EmptyBlock::Dynamic, CAP),
            too_large,
        ),
        (
            "empty frames",
            "zstd",
            compressed::zstd_empty_frames(CAP),
            nothing,
        ),
        (
            "empty blocks",
            "zstd",
            compressed::zstd_empty_blocks(CAP),
            nothing,
        ),
        (
            "skippable frames",
            "zstd",
            compressed::zstd_skippable_frames(0, CAP),
            nothing,
        ),
        (
            "metadata blocks",
            "br",
            compressed::brotli_metadata_blocks(CAP),
            nothing,
        ),
        (
            "small meta-blocks",
            "br",
            compressed::flushed("br", 16, CAP / 4 + (1 << 20)),
            too_large,
        ),
    ];
    for (shape, coding, body, expect) in single {
        let size = body.len();
        assert!(
            size <= CAP && size > CAP / 4,
            "{coding} {shape}: {size} bytes"
        );
        beside(
            &stack,
            &upstream,
            &format!("{coding} {shape}"),
            coding,
            body,
            expect,
        )
        .await;
    }
    // A layer of nothing beyond the budget (twice the cap and an eighth) inside each coding:
    // the outer decoder makes it from little, the inner one would read it for nothing.
    for inner in compressed::CODINGS {
        let layer = compressed::empty_stream(inner, 2 * CAP + CAP / 8 + (1 << 20));
        for outer in compressed::CODINGS {
            let body = compress(outer, &layer);
            assert!(body.len() < CAP / 8, "{inner} in {outer}: {}", body.len());
            let listed = format!("{inner}, {outer}");
            beside(&stack, &upstream, &listed, &listed, body, too_large).await;
        }
    }
    // The issue's: zstd making a zstd skippable frame of 4 GiB.
    let bomb = compressed::zstd_of_skippable(64 << 20);
    beside(
        &stack,
        &upstream,
        "zstd of a skippable frame",
        "zstd, zstd",
        bomb,
        too_large,
    )
    .await;
}

#[tokio::test]
async fn a_body_at_the_cap_in_each_coding() {
    let upstream = answering_upstream();
    let stack = hostile_stack(&upstream);
    // 16 MiB of base64 text (6 bits a byte: an image, say) is 12 MiB in each coding: within
    // the budget but brotli's (two units a byte read, one a byte written: base64 fits in br up
    // to about 0.85 of the cap). (4 KiB under the cap: the translated request is a little
    // larger than the client's, and Envoy's buffer, in ext_proc mode, is the cap's size.)
    let json = compressed::request_of_base64(CAP - 4096);
    let whole = |chat: &Value| {
        chat["messages"][0]["content"].as_str().is_some_and(|t| {
            t.len() > CAP - 4096 - 100
                && t.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '+' || c == '/')
        })
    };
    for coding in compressed::CODINGS {
        let body = compress(coding, &json);
        assert!(body.len() > CAP / 2, "{coding}: {}", body.len());
        let expect = if coding == "br" {
            Expect::Refused(413, "request_too_large")
        } else {
            Expect::Translated(whole)
        };
        beside(
            &stack,
            &upstream,
            &format!("{coding} of base64"),
            coding,
            body,
            expect,
        )
        .await;
    }
    // Text compresses 5 times: the cap's worth of it in br is well within the budget.
    let body = compress("br", &compressed::request_of_words(CAP - 4096));
    assert!(body.len() < CAP / 4, "{}", body.len());
    let words = |chat: &Value| {
        chat["messages"][0]["content"]
            .as_str()
            .is_some_and(|t| t.len() > CAP - 4096 - 100)
    };
    beside(
        &stack,
        &upstream,
        "br of text",
        "br",
        body,
        Expect::Translated(words),
    )
    .await;
}

/// The issue's body: `{"a":[0,0,…]}x`, `zeros` zeros then a byte after the end (8.3 million
/// zeros: 16.6 MB, under the cap), as JSON text.
pub fn zeros_then_a_byte(zeros: usize) -> Vec<u8> {
    let mut text = Vec::with_capacity(2 * zeros + 8);
    text.extend_from_slice(br#"{"a":["#);
    text.extend_from_slice(&b"0,".repeat(zeros - 1));
    text.extend_from_slice(br#"0]}x"#);
    text
}

/// What three requests at once may raise the translator's peak memory by: each holds its
/// decoded body (16.6 MB) and, while it is read, what the JSON reader builds within its
/// budget (nothing of a value it only checks); the issue's goal for three.
pub const THREE_AT_ONCE: u64 = 160 << 20;

#[tokio::test]
async fn three_gzipped_arrays_at_once_are_refused_within_the_json_budget() {
    const ZEROS: usize = 8_300_000;
    let upstream = answering_upstream();
    let stack = hostile_stack(&upstream);
    let pid = stack
        .processor
        .as_ref()
        .map_or(stack.envoy.pid(), |p| p.pid());
    let text = zeros_then_a_byte(ZEROS);
    assert!(text.len() <= CAP, "{}", text.len());
    let body = compress("gzip", &text);
    assert!(body.len() < 64 << 10, "{} bytes gzipped", body.len());
    // Warm: the translator's first request allocates what every later one reuses.
    let warm = post(
        stack.envoy.port(),
        &[("content-encoding", "gzip")],
        body.clone(),
    )
    .await;
    assert_eq!(warm.status, 400);
    let reset = common::memory::reset_peak(pid);
    let before = common::memory::resident(pid, "VmHWM:");
    let port = stack.envoy.port();
    let gz = [("content-encoding", "gzip")];
    let (a, b, c) = tokio::join!(
        post(port, &gz, body.clone()),
        post(port, &gz, body.clone()),
        post(port, &gz, body.clone())
    );
    let after = common::memory::resident(pid, "VmHWM:");
    println!(
        "three of {} bytes ({} gzipped) at once: the translator's peak memory {} -> {} \
         (+{}; peak reset: {reset})",
        text.len(),
        body.len(),
        common::memory::mib(before),
        common::memory::mib(after),
        common::memory::mib(after.saturating_sub(before))
    );
    let column = format!("trailing characters at line 1 column {}", text.len());
    for answer in [&a, &b, &c] {
        assert_eq!(
            answer.status,
            400,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        let error = &answer.json()["error"];
        assert_eq!(error["code"], "invalid_json", "{error}");
        let message = error["message"].as_str().unwrap_or_default();
        assert!(message.contains(&column), "{message}");
    }
    assert!(
        after.saturating_sub(before) < THREE_AT_ONCE,
        "the translator's peak memory grew by {}",
        common::memory::mib(after - before)
    );
    assert!(upstream.requests().is_empty(), "{:?}", upstream.requests());
}

#[tokio::test]
async fn a_body_of_tiny_values_is_refused_at_its_budget_and_the_densest_request_is_translated() {
    // Where the reader builds nodes (`input`): a body of millions of tiny values is refused
    // with a 413 where its nodes would pass 6 bytes for each of its bytes; one of a thousand
    // one-word messages, the densest clients send, is translated.
    let upstream = answering_upstream();
    let stack = hostile_stack(&upstream);
    let port = stack.envoy.port();
    let mut values = br#"{"model":"m","input":["#.to_vec();
    values.extend_from_slice(&b"{},".repeat(4_000_000));
    values.extend_from_slice(br#"{}]}"#);
    let answer = post(
        port,
        &[("content-encoding", "gzip")],
        compress("gzip", &values),
    )
    .await;
    assert_eq!(
        answer.status,
        413,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let error = &answer.json()["error"];
    assert_eq!(error["code"], "request_too_large", "{error}");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("too many JSON values")),
        "{error}"
    );
    let item = json!({"type": "message", "role": "user", "content": "hi"});
    let items: Vec<Value> = (0..1000).map(|_| item.clone()).collect();
    let dense = json!({"model": "m", "input": items})
        .to_string()
        .into_bytes();
    let answer = post(port, &[], dense).await;
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let received = upstream.requests();
    assert_eq!(received.len(), 1, "only the dense request went upstream");
    assert_eq!(
        received[0].json()["messages"].as_array().map(Vec::len),
        Some(1000)
    );
}
