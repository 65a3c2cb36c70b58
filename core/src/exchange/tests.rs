//! The rules with plain bytes: no Envoy, no gRPC.
use super::*;
use crate::openresponses::Code;
use crate::translate::{compact, Meta};
use serde_json::{json, Value};

const META: Meta = Meta {
    now: 1_700_000_000,
    id_seed: 7,
};

fn settings(max_request: usize, max_body: usize) -> Arc<Settings> {
    Arc::new(Settings {
        max_body_bytes: max_body,
        options: Options {
            max_request_bytes: max_request,
            ..Options::default()
        },
        ..Settings::default()
    })
}

fn forwarded(body: Value) -> Exchange {
    let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
    match ex.request_body(body.to_string().as_bytes(), true, META) {
        RequestStep::Forward(_) => ex,
        other => panic!("not forwarded: {other:?}"),
    }
}

/// The room gathered for a body in pieces after its first piece.
fn room_after_first_piece(announced: usize, first: usize) -> usize {
    let mut ex = Exchange::new(settings(16 << 20, 1 << 20), Operation::Create);
    ex.expect_request_bytes(announced);
    let piece = vec![b' '; first];
    assert!(matches!(
        ex.request_body(&piece, false, META),
        RequestStep::Hold
    ));
    match &ex.state {
        State::Request { body, .. } => body.capacity(),
        _ => unreachable!("still reading the request"),
    }
}

#[test]
fn a_body_in_pieces_gets_room_for_its_length_but_not_for_a_length_it_only_announced() {
    // A 400 KB turn whose first piece is Envoy's 16 KB: room for all of it at once.
    assert!(room_after_first_piece(400_000, 16_384) >= 400_000);
    // The cap announced, one byte sent: room for a few bytes, not for 16 MiB.
    assert!(room_after_first_piece(16 << 20, 1) < 4096);
    // Over the cap: bounded by the cap, then by what came.
    assert!(room_after_first_piece(usize::MAX, 16_384) <= 2 * RESERVE_AHEAD * 16_384);
    // No length: the piece itself.
    assert!(room_after_first_piece(0, 100) >= 100);
}

fn head(status: u16, content_type: &str) -> ResponseHead<'_> {
    ResponseHead {
        status,
        content_type,
        end_of_stream: false,
    }
}

fn error(r: &Reply) -> &ErrorReply {
    match r {
        Reply::Error(e) => e,
        Reply::Answer(a) => panic!("not an envelope: {a:?}"),
    }
}

fn envelope(r: &ErrorReply) -> Value {
    assert_eq!(r.content_type(), JSON);
    assert_eq!(r.status(), r.error.status);
    serde_json::from_slice::<Value>(&r.body).unwrap()["error"].clone()
}

#[test]
fn a_compressed_body_is_decoded_and_an_unknown_coding_is_a_415() {
    let body = json!({"model": "m", "input": "hi"}).to_string();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, body.as_bytes()).unwrap();
    let gz = gz.finish().unwrap();
    let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
    ex.request_head(|name| (name == "content-encoding").then_some("gzip"));
    let (a, b) = gz.split_at(gz.len() / 2);
    assert!(matches!(ex.request_body(a, false, META), RequestStep::Hold));
    let RequestStep::Forward(up) = ex.request_body(b, true, META) else {
        panic!("not forwarded");
    };
    let chat: Value = serde_json::from_slice(&up.body).unwrap();
    assert_eq!(chat["messages"][0]["content"], "hi");
    // A decoded body over the cap is refused as a plain one is.
    let mut ex = Exchange::new(settings(20, 1 << 20), Operation::Create);
    ex.request_head(|name| (name == "content-encoding").then_some("gzip"));
    let RequestStep::Reply(r) = ex.request_body(&gz, true, META) else {
        panic!("not refused");
    };
    assert_eq!(
        (r.status(), envelope(&r)["code"].as_str()),
        (413, Some("request_too_large"))
    );

    let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
    ex.request_head(|name| (name == "content-encoding").then_some("compress"));
    let RequestStep::Reply(r) = ex.request_body(b"x\x9c", false, META) else {
        panic!("not refused");
    };
    assert_eq!(r.status(), 415);
    assert_eq!(envelope(&r)["code"], "unsupported_content_encoding");
    assert!(envelope(&r)["message"]
        .as_str()
        .unwrap()
        .contains("'compress'"));
    assert_eq!(ex.summary().outcome, Outcome::Failed);
    // Never encoded: read as usual.
    for encoding in [None, Some("identity")] {
        let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
        ex.request_head(|name| encoding.filter(|_| name == "content-encoding"));
        assert!(matches!(
            ex.request_body(body.as_bytes(), true, META),
            RequestStep::Forward(_)
        ));
    }
}

#[test]
fn an_upstream_error_keeps_the_headers_a_client_retries_by() {
    let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
    ex.upstream_headers([
        ("retry-after", "7"),
        ("x-ratelimit-remaining-requests", "0"),
        ("content-length", "60"),
    ]);
    ex.response_head(head(429, "application/json"), 1);
    let BodyStep::Reply(Reply::Error(r)) = ex.response_body(
        br#"{"object":"error","message":"slow down","type":"RateLimitError","code":429}"#,
        true,
        1,
    ) else {
        panic!("no reply");
    };
    assert_eq!(r.status(), 429);
    assert_eq!(envelope(&r)["code"], "rate_limit_exceeded");
    assert_eq!(envelope(&r)["message"], "slow down");
    assert_eq!(
        r.headers,
        [
            KeptHeader::new("retry-after", "7"),
            KeptHeader::new("x-ratelimit-remaining-requests", "0")
        ]
    );
    assert_eq!(
        ex.summary().error_code,
        Some(ErrorCode::RateLimitExceeded.into())
    );
}

#[test]
fn a_context_overflow_is_400_before_a_stream_and_inside_one() {
    let overflow = r#"{"error":{"code":400,"message":"request (9 tokens) exceeds the available context size (8 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9,"n_ctx":8}}"#;
    let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    ex.response_head(head(400, "application/json"), 1);
    let BodyStep::Reply(Reply::Error(r)) = ex.response_body(overflow.as_bytes(), true, 1) else {
        panic!("no reply");
    };
    assert_eq!(r.status(), 400);
    let e = envelope(&r);
    assert_eq!(
        (&e["code"], &e["param"]),
        (&json!("context_length_exceeded"), &json!("input"))
    );
    assert_eq!((&e["n_prompt_tokens"], &e["n_ctx"]), (&json!(9), &json!(8)));
    // The same error inside a stream folded for a JSON client: the request's fault, 400.
    let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
    ex.response_head(head(200, "text/event-stream"), 1);
    let frame = format!("data: {overflow}\n\n");
    let BodyStep::Reply(Reply::Error(r)) = ex.response_body(frame.as_bytes(), true, 1) else {
        panic!("no reply");
    };
    assert_eq!(
        (r.status(), envelope(&r)["code"].as_str()),
        (400, Some("context_length_exceeded"))
    );
}

const CHUNK: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
const END: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";

#[test]
fn routes_only_posts_to_the_responses_path() {
    let s = Settings::default();
    assert_eq!(route(&s, "POST", "/v1/responses"), Some(Operation::Create));
    assert_eq!(
        route(&s, "POST", "/v1/responses?x=1"),
        Some(Operation::Create)
    );
    assert_eq!(route(&s, "GET", "/v1/responses"), None);
    assert_eq!(route(&s, "POST", "/v1/responses/x"), None);
    assert_eq!(
        route(&s, "POST", "/v1/responses/compact"),
        Some(Operation::Compact)
    );
    assert_eq!(
        route(&s, "POST", "/v1/responses/compact?a=b"),
        Some(Operation::Compact)
    );
    assert_eq!(route(&s, "GET", "/v1/responses/compact"), None);
    assert_eq!(route(&s, "POST", "/v1/responses/compact/x"), None);
    assert_eq!(route(&s, "POST", "/v1/responsescompact"), None);
    assert_eq!(route(&s, "POST", "/v1/chat/completions"), None);
}

#[test]
fn request_in_pieces_is_translated_once_whole() {
    let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
    let body = json!({"model": "m", "input": "hi"}).to_string();
    let (a, b) = body.as_bytes().split_at(5);
    assert!(matches!(ex.request_body(a, false, META), RequestStep::Hold));
    let RequestStep::Forward(up) = ex.request_body(b, true, META) else {
        panic!("not forwarded");
    };
    let chat: Value = serde_json::from_slice(&up.body).unwrap();
    assert_eq!(chat["messages"][0]["content"], "hi");
    assert_eq!((up.model.as_str(), up.stream), ("m", false));
    assert_eq!(
        ex.summary().response_id.as_deref(),
        Some("resp_00000000000000000000000000000007")
    );
}

#[test]
fn request_caps_hold_on_both_sides() {
    let body = json!({"model": "m", "input": "x".repeat(100)}).to_string();
    let fits = Exchange::new(settings(body.len(), 1), Operation::Create).request_body(
        body.as_bytes(),
        true,
        META,
    );
    assert!(matches!(fits, RequestStep::Forward(_)));
    let mut ex = Exchange::new(settings(body.len() - 1, 1), Operation::Create);
    let RequestStep::Reply(r) = ex.request_body(body.as_bytes(), true, META) else {
        panic!("over the cap");
    };
    assert_eq!(r.status(), 413);
    assert_eq!(envelope(&r)["code"], "request_too_large");
    assert!(ex.is_finished());
    // Also when it arrives in pieces: refused as soon as the pieces exceed the cap.
    let mut ex = Exchange::new(settings(10, 1), Operation::Create);
    assert!(matches!(
        ex.request_body(b"{\"model\":", false, META),
        RequestStep::Hold
    ));
    assert!(matches!(
        ex.request_body(b"\"m\"", false, META),
        RequestStep::Reply(_)
    ));
    // No body at all.
    let mut ex = Exchange::new(settings(10, 1), Operation::Create);
    let RequestStep::Reply(r) = ex.request_body(b"", true, META) else {
        panic!("no body");
    };
    assert_eq!(envelope(&r)["code"], "missing_body");
}

#[test]
fn json_answer_is_gathered_then_translated() {
    let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
    assert!(matches!(
        ex.response_head(head(200, "application/json; charset=utf-8"), 1),
        HeadStep::Gather
    ));
    let body =
        json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "yo"}}]})
            .to_string();
    let (a, b) = body.as_bytes().split_at(10);
    assert!(matches!(ex.response_body(a, false, 1), BodyStep::Hold));
    let BodyStep::Reply(r) = ex.response_body(b, true, 1) else {
        panic!("no reply");
    };
    let Reply::Answer(r) = r else {
        panic!("not translated: {r:?}");
    };
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["output"][0]["content"][0]["text"], "yo");
    assert_eq!(ex.summary().outcome, Outcome::Translated);
    assert_eq!(ex.summary().finish_reason.as_deref(), Some("stop"));
}

#[test]
fn the_summary_has_the_parameters_set_and_the_finish_reason() {
    let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": true,
        "temperature": 0.25, "max_output_tokens": 64}));
    assert_eq!(
        ex.summary().params,
        Params {
            temperature: Some(0.25),
            max_output_tokens: Some(64),
            ..Params::default()
        },
        "only what the request set"
    );
    assert_eq!(ex.summary().finish_reason, None);
    ex.response_head(head(200, "text/event-stream"), 1);
    assert!(!ex.has_output());
    ex.response_body(CHUNK.as_bytes(), false, 1);
    assert!(ex.has_output(), "the first output went with this call");
    assert_eq!(
        ex.summary().finish_reason,
        None,
        "not before the stream ends"
    );
    let length =
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n";
    ex.response_body(length.as_bytes(), true, 1);
    assert_eq!(ex.summary().finish_reason.as_deref(), Some("length"));
    // The first output and the end in one call: the output is still reported.
    let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    ex.response_head(head(200, "text/event-stream"), 1);
    ex.response_body(format!("{CHUNK}{END}").as_bytes(), true, 1);
    assert!(ex.is_finished() && ex.has_output());
    // Folded for a JSON request: nothing was streamed.
    let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
    ex.response_head(head(200, "text/event-stream"), 1);
    ex.response_body(format!("{CHUNK}{END}").as_bytes(), true, 1);
    assert!(!ex.has_output());
    let ex = forwarded(json!({"model": "m", "input": "hi", "top_p": 0.5,
        "presence_penalty": -1, "frequency_penalty": 1.5}));
    assert_eq!(
        ex.summary().params,
        Params {
            top_p: Some(0.5),
            presence_penalty: Some(-1.0),
            frequency_penalty: Some(1.5),
            ..Params::default()
        }
    );
}

#[test]
fn gathered_answers_over_the_cap_are_502() {
    let mut ex = Exchange::new(settings(1 << 20, 16), Operation::Create);
    ex.request_body(br#"{"model":"m","input":"hi"}"#, true, META);
    ex.response_head(head(200, "application/json"), 1);
    assert!(matches!(
        ex.response_body(&[b' '; 16], false, 1),
        BodyStep::Hold
    ));
    let BodyStep::Reply(r) = ex.response_body(b" ", true, 1) else {
        panic!("over the cap");
    };
    assert_eq!(r.status(), 502);
    assert_eq!(envelope(error(&r))["code"], "upstream_response_too_large");
    // The transport's own limit says the same.
    let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
    ex.response_head(head(200, "application/json"), 1);
    assert_eq!(ex.response_overflow().status(), 502);
}

#[test]
fn stream_answer_is_translated_as_it_comes_and_the_rest_dropped() {
    let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    assert!(matches!(
        ex.response_head(head(200, "text/event-stream"), 1),
        HeadStep::Stream
    ));
    assert!(ex.is_streaming());
    let BodyStep::Send(out) = ex.response_body(CHUNK.as_bytes(), false, 1) else {
        panic!("not sent");
    };
    let out = String::from_utf8(out.to_vec()).unwrap();
    assert!(out.starts_with("event: response.created\n") && out.contains("\"delta\":\"Hi\""));
    let BodyStep::Send(out) = ex.response_body(END.as_bytes(), false, 1) else {
        panic!("not sent");
    };
    assert!(String::from_utf8(out.to_vec())
        .unwrap()
        .ends_with("data: [DONE]\n\n"));
    assert!(ex.is_finished());
    // The upstream goes on after [DONE]: nothing more reaches the client.
    let BodyStep::Send(out) = ex.response_body(CHUNK.as_bytes(), true, 1) else {
        panic!("not answered");
    };
    assert!(out.is_empty());
}

#[test]
fn stream_answering_a_json_request_is_folded() {
    let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
    assert!(matches!(
        ex.response_head(head(200, "text/event-stream"), 1),
        HeadStep::Gather
    ));
    ex.response_body(CHUNK.as_bytes(), false, 1);
    let BodyStep::Reply(r) = ex.response_body(END.as_bytes(), true, 1) else {
        panic!("no reply");
    };
    let v: Value = serde_json::from_slice(r.body()).unwrap();
    assert_eq!(
        (v["object"].as_str(), v["status"].as_str()),
        (Some("response"), Some("completed"))
    );
    assert_eq!(v["output"][0]["content"][0]["text"], "Hi");
    // Cut short: an envelope with the stream's code, not half an answer.
    let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
    ex.response_head(head(200, "text/event-stream"), 1);
    let BodyStep::Reply(r) = ex.response_body(CHUNK.as_bytes(), true, 1) else {
        panic!("no reply");
    };
    assert_eq!(
        (r.status(), envelope(error(&r))["code"].as_str()),
        (502, Some("upstream_stream_truncated"))
    );
}

#[test]
fn unusable_answers_become_envelopes() {
    for (stream, status, content_type, code) in [
        (true, 200, "application/json", "upstream_invalid_response"),
        (false, 200, "text/html", "upstream_invalid_response"),
        (false, 429, "application/json", "rate_limit_exceeded"),
        (true, 503, "text/plain", "upstream_unavailable"),
    ] {
        let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": stream}));
        assert!(matches!(
            ex.response_head(head(status, content_type), 1),
            HeadStep::Gather
        ));
        let BodyStep::Reply(r) = ex.response_body(b"nope", true, 1) else {
            panic!("no reply");
        };
        assert_eq!(envelope(error(&r))["code"], code, "{status} {content_type}");
        assert_eq!(ex.summary().outcome, Outcome::Failed);
    }
}

#[test]
fn envoys_reply_before_forwarding_is_never_translated() {
    let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
    ex.request_body(b"{", false, META);
    assert!(matches!(
        ex.response_head(head(413, "text/plain"), 1),
        HeadStep::Gather
    ));
    let BodyStep::Reply(r) = ex.response_body(b"Payload Too Large", true, 1) else {
        panic!("no reply");
    };
    let e = envelope(error(&r));
    assert_eq!(
        (r.status(), e["code"].as_str()),
        (413, Some("request_too_large"))
    );
    assert!(!e["message"].as_str().unwrap().contains("upstream"), "{e}");
}

#[test]
fn out_of_order_calls_fail_closed() {
    // A body before any head.
    let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
    assert!(matches!(ex.response_body(b"raw", true, 1), BodyStep::Reply(r) if r.status() == 500));
    // A second head once a stream is open.
    let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    ex.response_head(head(200, "text/event-stream"), 1);
    assert!(matches!(
        ex.response_head(head(200, "text/event-stream"), 1),
        HeadStep::Reply(_)
    ));
    // A request body after forwarding.
    let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
    assert!(matches!(
        ex.request_body(b"{}", true, META),
        RequestStep::Reply(_)
    ));
}

#[test]
fn transport_failures_end_with_what_can_still_be_sent() {
    // Before any answer: an envelope.
    let mut ex = Exchange::new(settings(1 << 20, 1 << 20), Operation::Create);
    assert!(matches!(ex.overflow(1), AbortStep::Reply(r) if r.status() == 413));
    let mut ex = forwarded(json!({"model": "m", "input": "hi"}));
    assert!(matches!(ex.overflow(1), AbortStep::Reply(r) if r.status() == 502));
    // Mid-stream: the stream's failed ending.
    let mut ex = forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    ex.response_head(head(200, "text/event-stream"), 1);
    ex.response_body(CHUNK.as_bytes(), false, 1);
    let AbortStep::Send(out) = ex.abort(ErrorCode::InternalError, "boom", 1) else {
        panic!("no ending");
    };
    let out = String::from_utf8(out.to_vec()).unwrap();
    assert!(out.contains("event: response.failed\n") && out.ends_with("data: [DONE]\n\n"));
    assert_eq!(
        ex.summary().error_code.as_ref().map(Code::as_str),
        Some("internal_error")
    );
    // After the end: nothing.
    assert!(matches!(
        ex.abort(ErrorCode::InternalError, "again", 1),
        AbortStep::Nothing
    ));
}

fn keyed(max_request: usize) -> Arc<Settings> {
    let ring = crate::translate::seal::Keyring::single("k1", [7; 32]).unwrap();
    Arc::new(Settings {
        options: Options {
            max_request_bytes: max_request,
            keyring: Some(Arc::new(ring)),
            ..Options::default()
        },
        ..Settings::default()
    })
}

fn completion(text: &str) -> String {
    json!({"model": "up", "choices": [{"index": 0, "finish_reason": "stop",
           "message": {"role": "assistant", "content": text}}],
           "usage": {"prompt_tokens": 30, "completion_tokens": 5}})
    .to_string()
}

/// A compact request through the core: the Chat request sent, the client's answer.
fn compact(settings: &Arc<Settings>, body: &Value, upstream: &str) -> (Value, Value) {
    let mut ex = Exchange::new(settings.clone(), Operation::Compact);
    let RequestStep::Forward(up) = ex.request_body(body.to_string().as_bytes(), true, META) else {
        panic!("not forwarded");
    };
    assert!(!up.stream);
    assert!(matches!(
        ex.response_head(head(200, "application/json"), 1),
        HeadStep::Gather
    ));
    let BodyStep::Reply(r) = ex.response_body(upstream.as_bytes(), true, 1) else {
        panic!("no reply");
    };
    assert!(matches!(r, Reply::Answer(_)), "{:?}", r.body());
    (
        serde_json::from_slice(&up.body).unwrap(),
        serde_json::from_slice(r.body()).unwrap(),
    )
}

#[test]
fn compact_asks_for_a_summary_and_seals_it() {
    let s = keyed(1 << 20);
    let window = json!({"model": "m", "instructions": "Be brief.", "input": [
        {"role": "user", "content": "My name is Ada."},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi Ada."}]},
        {"role": "user", "content": "Remember 42."}
    ]});
    let (chat, answer) = compact(&s, &window, &completion("Ada; remember 42."));
    // The summarising request: the prompt (with the instructions noted) first, the
    // conversation, then the request to summarise.
    let msgs = chat["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 5);
    assert_eq!(msgs[0]["role"], "system");
    let sys = msgs[0]["content"].as_str().unwrap();
    assert!(sys.starts_with(compact::PROMPT) && sys.ends_with("Be brief."));
    assert_eq!(msgs[1]["content"], "My name is Ada.");
    assert_eq!(msgs[3]["content"], "Remember 42.");
    assert_eq!(msgs[4]["content"], compact::REQUEST);
    assert_eq!(chat["stream"], false);
    // The answer: the latest user message verbatim, then the sealed summary.
    assert_eq!(answer["object"], "response.compaction");
    assert_eq!(answer["id"], "resp_00000000000000000000000000000007");
    assert_eq!(answer["created_at"], META.now);
    assert_eq!(answer["usage"]["input_tokens"], 30);
    assert_eq!(answer["usage"]["total_tokens"], 35);
    let out = answer["output"].as_array().unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(
        (out[0]["type"].as_str(), out[0]["role"].as_str()),
        (Some("message"), Some("user"))
    );
    assert_eq!(
        out[0]["content"],
        json!([{"type": "input_text", "text": "Remember 42."}])
    );
    assert_eq!(out[1]["type"], "compaction");
    let blob = out[1]["encrypted_content"].as_str().unwrap();
    assert!(!blob.contains("Ada"));

    // A later request carrying the item: the summary reaches the upstream as context,
    // at the head, after the instructions.
    let next = json!({"model": "m", "instructions": "Be brief.", "input": [
        out[0], out[1], {"role": "user", "content": "What number?"}
    ]});
    let mut ex = Exchange::new(s.clone(), Operation::Create);
    let RequestStep::Forward(up) = ex.request_body(next.to_string().as_bytes(), true, META) else {
        panic!("not forwarded");
    };
    let chat: Value = serde_json::from_slice(&up.body).unwrap();
    assert_eq!(
        chat["messages"][0]["content"],
        format!("Be brief.\n\n{}Ada; remember 42.", compact::CONTEXT_PREFIX)
    );
    assert_eq!(
        chat["messages"][1]["content"],
        json!([{"type": "text", "text": "Remember 42."}])
    );
    assert_eq!(chat["messages"][2]["content"], "What number?");

    // Compacting a window that already holds a compaction: the old summary is context
    // of the new one.
    let (chat, _) = compact(&s, &next, &completion("newer"));
    let sys = chat["messages"][0]["content"].as_str().unwrap();
    assert!(sys.contains(&format!("{}Ada; remember 42.", compact::CONTEXT_PREFIX)));
}

fn rejected(settings: &Arc<Settings>, op: Operation, body: &Value) -> (u16, Value) {
    let mut ex = Exchange::new(settings.clone(), op);
    let RequestStep::Reply(r) = ex.request_body(body.to_string().as_bytes(), true, META) else {
        panic!("forwarded: {body}");
    };
    (r.status(), envelope(&r))
}

#[test]
fn compaction_items_that_do_not_open_are_400() {
    let s = keyed(1 << 20);
    let (_, answer) = compact(
        &s,
        &json!({"model": "m", "input": "hi"}),
        &completion("sum"),
    );
    let blob = answer["output"][1]["encrypted_content"].as_str().unwrap();
    let mut tampered = blob.to_owned();
    let last = tampered.pop().unwrap();
    tampered.push(if last == 'A' { 'B' } else { 'A' });
    let other = crate::translate::seal::Keyring::single("k1", [8; 32]).unwrap();
    let foreign = other.seal_for(
        crate::translate::seal::Purpose::Compaction,
        "x",
        crate::translate::seal::nonce(1, 0),
    );
    // A reasoning blob of the same keys is not a compaction.
    let reasoning = s
        .options
        .keyring
        .as_ref()
        .unwrap()
        .seal("x", crate::translate::seal::nonce(1, 0));
    for bad in [
        tampered.as_str(),
        foreign.as_str(),
        reasoning.as_str(),
        "nope",
    ] {
        let body = json!({"model": "m", "input": [
            {"type": "compaction", "encrypted_content": bad},
            {"role": "user", "content": "go on"}]});
        for op in [Operation::Create, Operation::Compact] {
            let (status, e) = rejected(&s, op, &body);
            assert_eq!(status, 400);
            assert_eq!(e["code"], "invalid_encrypted_content");
            assert_eq!(e["param"], "input[0].encrypted_content");
        }
    }
    // No keys: neither compacting nor opening.
    let plain = settings(1 << 20, 1 << 20);
    let (status, e) = rejected(
        &plain,
        Operation::Compact,
        &json!({"model": "m", "input": "hi"}),
    );
    assert_eq!(
        (status, e["code"].as_str()),
        (400, Some("compaction_unavailable"))
    );
    let (status, e) = rejected(
        &plain,
        Operation::Create,
        &json!({"model": "m", "input": [{"type": "compaction", "encrypted_content": blob}]}),
    );
    assert_eq!(
        (status, e["code"].as_str()),
        (400, Some("invalid_encrypted_content"))
    );
}

#[test]
fn compact_refuses_streams_and_keeps_the_limits() {
    let s = keyed(200);
    let (status, e) = rejected(
        &s,
        Operation::Compact,
        &json!({"model": "m", "input": "hi", "stream": true}),
    );
    assert_eq!((status, e["param"].as_str()), (400, Some("stream")));
    let (status, e) = rejected(
        &s,
        Operation::Compact,
        &json!({"model": "m", "input": "x".repeat(300)}),
    );
    assert_eq!(
        (status, e["code"].as_str()),
        (413, Some("request_too_large"))
    );
    let (status, _) = rejected(&s, Operation::Compact, &json!({"model": "m"}));
    assert_eq!(status, 400);
}

#[test]
fn compact_upstream_failures_are_envelopes() {
    let s = keyed(1 << 20);
    let body = json!({"model": "m", "input": "hi"}).to_string();
    for (status, content_type, upstream, code) in [
        (
            503,
            "application/json",
            "{}".to_owned(),
            "upstream_unavailable",
        ),
        (
            200,
            "text/event-stream",
            "data: [DONE]\n\n".to_owned(),
            "upstream_invalid_response",
        ),
        (
            200,
            "application/json",
            completion("  "),
            "upstream_invalid_response",
        ),
        (
            200,
            "application/json",
            "not json".to_owned(),
            "upstream_invalid_response",
        ),
    ] {
        let mut ex = Exchange::new(s.clone(), Operation::Compact);
        assert!(matches!(
            ex.request_body(body.as_bytes(), true, META),
            RequestStep::Forward(_)
        ));
        ex.response_head(head(status, content_type), 1);
        let BodyStep::Reply(r) = ex.response_body(upstream.as_bytes(), true, 1) else {
            panic!("no reply");
        };
        assert_eq!(envelope(error(&r))["code"], code, "{status} {content_type}");
        assert_eq!(ex.summary().outcome, Outcome::Failed);
    }
}

/// Keys, and sealed items bound to the tenant in `x-tenant` (unbound ones accepted or not).
fn tenanted(accept_unbound: bool) -> Arc<Settings> {
    let mut s = (*keyed(1 << 20)).clone();
    s.seal_tenant_header = Some("x-tenant".into());
    s.options.accept_unbound_seals = accept_unbound;
    Arc::new(s)
}

/// A request through the core with its `x-tenant` header (none: `None`): forwarded (the
/// Chat body), or refused (the envelope's status and error).
fn as_tenant(
    settings: &Arc<Settings>,
    op: Operation,
    tenant: Option<&str>,
    body: &Value,
) -> Result<Value, (u16, Value)> {
    let mut ex = Exchange::new(settings.clone(), op);
    ex.request_head(|name| (name == "x-tenant").then_some(tenant).flatten());
    match ex.request_body(body.to_string().as_bytes(), true, META) {
        RequestStep::Forward(up) => Ok(serde_json::from_slice(&up.body).unwrap()),
        RequestStep::Reply(e) => Err((e.status(), envelope(&e))),
        RequestStep::Hold => panic!("held"),
        RequestStep::Call(_) => panic!("no context_management here"),
        RequestStep::Work(_) => panic!("not offloaded"),
    }
}

/// A compaction item sealed through the core for `tenant` (the `/compact` answer's).
fn compaction_for(settings: &Arc<Settings>, tenant: Option<&str>) -> Value {
    let mut ex = Exchange::new(settings.clone(), Operation::Compact);
    ex.request_head(|name| (name == "x-tenant").then_some(tenant).flatten());
    let body = json!({"model": "m", "input": "I am Ada."});
    assert!(matches!(
        ex.request_body(body.to_string().as_bytes(), true, META),
        RequestStep::Forward(_)
    ));
    ex.response_head(head(200, "application/json"), 1);
    let BodyStep::Reply(r) = ex.response_body(completion("Ada.").as_bytes(), true, 1) else {
        panic!("no reply");
    };
    let answer: Value = serde_json::from_slice(r.body()).unwrap();
    answer["output"][1].clone()
}

/// With a tenant header: a blob sealed for one tenant opens for that tenant only (400
/// `invalid_encrypted_content` for another, on `/v1/responses` and `/compact`); a request
/// that would seal or open one without the header is 403 `missing_tenant`, one that does
/// neither is served; blobs sealed bound to no tenant open only in the migration window;
/// blobs bound to a tenant do not open where no tenant header is set.
#[test]
fn sealed_items_are_bound_to_the_requests_tenant() {
    let s = tenanted(false);
    let item = compaction_for(&s, Some("team-a"));
    assert_eq!(item["type"], "compaction");
    let next = json!({"model": "m", "input": [item, {"role": "user", "content": "Who am I?"}]});
    for op in [Operation::Create, Operation::Compact] {
        let chat = as_tenant(&s, op, Some("team-a"), &next).expect("the same tenant");
        assert!(chat.to_string().contains("Ada."), "{chat}");
        for other in ["team-b", "team-a2", "Team-a"] {
            let (status, err) = as_tenant(&s, op, Some(other), &next).unwrap_err();
            assert_eq!(status, 400, "{other}");
            assert_eq!(err["code"], "invalid_encrypted_content", "{err}");
            assert_eq!(err["param"], "input[0].encrypted_content");
            assert!(
                err["message"].as_str().unwrap().contains("another tenant"),
                "{err}"
            );
        }
    }

    // No tenant: refused wherever something would be sealed or opened.
    let missing = |op, body: &Value| {
        for tenant in [None, Some("")] {
            let (status, err) = as_tenant(&s, op, tenant, body).unwrap_err();
            assert_eq!(
                (status, err["code"].as_str()),
                (403, Some("missing_tenant"))
            );
            assert_eq!(err["type"], "permission_error");
        }
    };
    missing(Operation::Create, &next);
    missing(Operation::Compact, &json!({"model": "m", "input": "hi"}));
    missing(
        Operation::Create,
        &json!({"model": "m", "input": "hi", "include": ["reasoning.encrypted_content"]}),
    );
    missing(
        Operation::Create,
        &json!({"model": "m", "input": [{"role": "user", "content": "hi"},
                                       {"type": "compaction_trigger"}]}),
    );
    let plain = json!({"model": "m", "input": "hi"});
    assert!(as_tenant(&s, Operation::Create, None, &plain).is_ok());

    // Blobs sealed before the tenant header was set: refused, or open during migration.
    let unbound = compaction_for(&keyed(1 << 20), None);
    let old = json!({"model": "m", "input": [unbound, {"role": "user", "content": "Who?"}]});
    let (status, err) = as_tenant(&s, Operation::Create, Some("team-a"), &old).unwrap_err();
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("invalid_encrypted_content"))
    );
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("before this server bound"),
        "{err}"
    );
    let migrating = tenanted(true);
    for tenant in ["team-a", "team-b"] {
        assert!(as_tenant(&migrating, Operation::Create, Some(tenant), &old).is_ok());
    }
    // New blobs are bound even during the migration.
    let bound = compaction_for(&migrating, Some("team-a"));
    let next = json!({"model": "m", "input": [bound, {"role": "user", "content": "Who?"}]});
    assert!(as_tenant(&migrating, Operation::Create, Some("team-b"), &next).is_err());

    // A bound blob where no tenant header is set.
    let (status, err) = as_tenant(&keyed(1 << 20), Operation::Create, None, &next).unwrap_err();
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("invalid_encrypted_content"))
    );
}

/// Sealed reasoning is bound like compaction items: sealed for the request's tenant in the
/// answer, opened for it only.
#[test]
fn sealed_reasoning_is_bound_to_the_tenant() {
    let s = tenanted(false);
    let mut ex = Exchange::new(s.clone(), Operation::Create);
    ex.request_head(|name| (name == "x-tenant").then_some("team-a"));
    let body = json!({"model": "m", "input": "hi", "include": ["reasoning.encrypted_content"]});
    assert!(matches!(
        ex.request_body(body.to_string().as_bytes(), true, META),
        RequestStep::Forward(_)
    ));
    ex.response_head(head(200, "application/json"), 1);
    let answer = json!({"model": "up", "choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet."}}]});
    let BodyStep::Reply(r) = ex.response_body(answer.to_string().as_bytes(), true, 1) else {
        panic!("no reply");
    };
    let response: Value = serde_json::from_slice(r.body()).unwrap();
    let reasoning = response["output"][0].clone();
    assert_eq!(reasoning["type"], "reasoning");
    let next = json!({"model": "m", "input": [{"role": "user", "content": "hi"}, reasoning,
        response["output"][1], {"role": "user", "content": "Again."}]});
    let chat = as_tenant(&s, Operation::Create, Some("team-a"), &next).unwrap();
    assert_eq!(chat["messages"][1]["reasoning_content"], "Greet.");
    let (status, err) = as_tenant(&s, Operation::Create, Some("team-b"), &next).unwrap_err();
    assert_eq!(
        (status, err["code"].as_str()),
        (400, Some("invalid_encrypted_content"))
    );
    assert_eq!(err["param"], "input[1].encrypted_content");
}
