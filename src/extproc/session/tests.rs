use super::*;
use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_response::Response as R, CommonResponse, HeaderMutation, HttpBody, ImmediateResponse,
};
use responses_core::call::AnswerHead;
use serde_json::{json, Value};

struct Fixed;
impl Environment for Fixed {
    fn now(&self) -> u64 {
        1_700_000_000
    }
    fn id_seed(&self) -> u128 {
        42
    }
}

fn session() -> Session<Fixed> {
    Session::new(Arc::new(Settings::default()), Fixed)
}

fn headers(pairs: &[(&str, &str)], end_of_stream: bool) -> HttpHeaders {
    HttpHeaders {
        headers: Some(HeaderMap {
            headers: pairs
                .iter()
                .map(|(k, v)| HeaderValue {
                    key: (*k).to_owned(),
                    raw_value: v.as_bytes().to_vec(),
                    ..Default::default()
                })
                .collect(),
        }),
        end_of_stream,
        ..Default::default()
    }
}

fn send(s: &mut Session<Fixed>, r: Request) -> ProcessingResponse {
    let mut answers = s.on_message(ProcessingRequest {
        request: Some(r),
        ..Default::default()
    });
    assert_eq!(answers.len(), 1, "one answer per message");
    answers.remove(0)
}

fn post(s: &mut Session<Fixed>, body: Value) -> ProcessingResponse {
    send(
        s,
        Request::RequestHeaders(headers(
            &[(":method", "POST"), (":path", "/v1/responses")],
            false,
        )),
    );
    send(
        s,
        Request::RequestBody(body_msg(body.to_string().as_bytes(), true)),
    )
}

fn body_msg(b: &[u8], end_of_stream: bool) -> HttpBody {
    HttpBody {
        body: b.to_vec(),
        end_of_stream,
        ..Default::default()
    }
}

fn common(r: &ProcessingResponse) -> &CommonResponse {
    match r.response.as_ref() {
        Some(R::RequestHeaders(h) | R::ResponseHeaders(h)) => h.response.as_ref(),
        Some(R::RequestBody(b) | R::ResponseBody(b)) => b.response.as_ref(),
        _ => None,
    }
    .expect("a common response")
}

fn immediate(r: &ProcessingResponse) -> (i32, Value) {
    match r.response.as_ref() {
        Some(R::ImmediateResponse(ImmediateResponse { status, body, .. })) => (
            status.as_ref().map_or(0, |s| s.code),
            serde_json::from_slice(body).expect("JSON error body"),
        ),
        other => panic!("expected an immediate response, got {other:?}"),
    }
}

fn set_header<'a>(m: &'a Option<HeaderMutation>, key: &str) -> Option<&'a str> {
    m.as_ref()?
        .set_headers
        .iter()
        .filter_map(|h| h.header.as_ref())
        .find(|h| h.key == key)
        .map(|h| std::str::from_utf8(&h.raw_value).unwrap_or_default())
}

fn body_of(c: &CommonResponse) -> &[u8] {
    match c.body_mutation.as_ref().and_then(|b| b.mutation.as_ref()) {
        Some(Mutation::Body(b)) => b,
        _ => &[],
    }
}

fn body_mode(r: &ProcessingResponse) -> Option<i32> {
    r.mode_override.as_ref().map(|m| m.response_body_mode)
}

#[test]
fn other_traffic_passes_through_without_body_buffering() {
    for (method, path) in [
        ("GET", "/v1/models"),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/responses"),
    ] {
        let mut s = session();
        let r = send(
            &mut s,
            Request::RequestHeaders(headers(&[(":method", method), (":path", path)], false)),
        );
        let mode = r.mode_override.expect("mode override");
        assert_eq!(mode.request_body_mode, BodySendMode::None as i32);
        assert_eq!(mode.response_body_mode, BodySendMode::None as i32);
        assert_eq!(mode.response_header_mode, 2, "response headers skipped");
        assert!(common(&r).header_mutation.is_none());
        assert!(!s.is_translating());
    }
}

#[test]
fn a_turns_record_carries_its_metadata_once_and_a_guess_gets_404() {
    use envoy_types::pb::google::protobuf::value::Kind;
    use responses_core::metadata::{record::Record, MetadataValue};
    let settings = Arc::new(Settings::default());
    let fields = vec![
        ("total_tokens", MetadataValue::Num(18.0)),
        ("socket_id", MetadataValue::Str("up-1".into())),
    ];
    let record = Record::new(&settings.exchange, 7, Vec::new(), fields);
    settings.records.file(record.token, record.fields.clone());
    let head = |path: &str| {
        Request::RequestHeaders(headers(&[(":method", "POST"), (":path", path)], true))
    };
    let mut s = Session::new(settings.clone(), Fixed);
    let r = send(&mut s, head(&record.path));
    // Passed on (Envoy answers it), with the turn's summary for the access log and the charge.
    let mode = r.mode_override.as_ref().expect("mode override");
    assert_eq!(mode.request_body_mode, BodySendMode::None as i32);
    assert!(common(&r).header_mutation.is_none());
    let md = r.dynamic_metadata.expect("the record's metadata");
    let Some(Kind::StructValue(ns)) = md.fields[METADATA_NAMESPACE].kind.clone() else {
        panic!("a struct under {METADATA_NAMESPACE}");
    };
    let get = |k: &str| ns.fields.get(k).and_then(|v| v.kind.clone());
    assert_eq!(get("total_tokens"), Some(Kind::NumberValue(18.0)));
    assert_eq!(get("socket_id"), Some(Kind::StringValue("up-1".into())));
    assert!(settings.records.is_empty(), "taken");
    // Once only; a token it never filed is a guess.
    for path in [
        record.path.clone(),
        format!("/v1/responses/turns/{:032x}", 8),
    ] {
        let mut s = Session::new(settings.clone(), Fixed);
        let r = send(&mut s, head(&path));
        assert!(r.dynamic_metadata.is_none());
        let (status, body) = immediate(&r);
        assert_eq!(status, 404, "{body}");
        assert_eq!(body["error"]["code"], "not_found");
    }
}

#[test]
fn translated_request_rewrites_path_length_model_and_route() {
    let mut s = session();
    let r = post(&mut s, json!({"model": "llama", "input": "hi"}));
    let c = common(&r);
    assert!(c.clear_route_cache);
    assert_eq!(
        set_header(&c.header_mutation, ":path"),
        Some("/v1/chat/completions")
    );
    assert_eq!(
        set_header(&c.header_mutation, "x-responses-model"),
        Some("llama")
    );
    let body = body_of(c);
    assert_eq!(
        set_header(&c.header_mutation, "content-length"),
        Some(body.len().to_string().as_str())
    );
    let chat: Value = serde_json::from_slice(body).unwrap();
    assert_eq!(
        chat,
        json!({"model": "llama", "messages": [{"role": "user", "content": "hi"}]})
    );
}

#[test]
fn query_string_does_not_hide_the_responses_path() {
    let mut s = session();
    let r = send(
        &mut s,
        Request::RequestHeaders(headers(
            &[(":method", "POST"), (":path", "/v1/responses?x=1")],
            false,
        )),
    );
    assert!(r.mode_override.is_none());
    assert!(s.is_translating());
}

#[test]
fn bodiless_and_invalid_requests_get_400_without_upstream() {
    let mut s = session();
    let r = send(
        &mut s,
        Request::RequestHeaders(headers(
            &[(":method", "POST"), (":path", "/v1/responses")],
            true,
        )),
    );
    assert_eq!(immediate(&r).0, 400);

    let mut s = session();
    let (status, body) = immediate(&post(&mut s, json!({"model": "m"})));
    assert_eq!(status, 400);
    assert_eq!(body["error"]["param"], "input");
    assert_eq!(body["error"]["type"], "invalid_request_error");
}

#[test]
fn json_answer_is_buffered_and_translated() {
    let mut s = session();
    post(&mut s, json!({"model": "m", "input": "hi"}));
    let r = send(
        &mut s,
        Request::ResponseHeaders(headers(
            &[
                (":status", "200"),
                ("content-type", "application/json"),
                ("content-length", "99"),
            ],
            false,
        )),
    );
    assert_eq!(body_mode(&r), Some(BodySendMode::BufferedPartial as i32));
    assert_eq!(
        common(&r)
            .header_mutation
            .as_ref()
            .map(|m| m.remove_headers.clone()),
        Some(vec!["content-length".to_owned(), "openai-model".to_owned()])
    );
    let chat =
        json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "yo"}}]});
    let r = send(
        &mut s,
        Request::ResponseBody(body_msg(chat.to_string().as_bytes(), true)),
    );
    let c = common(&r);
    let out: Value = serde_json::from_slice(body_of(c)).unwrap();
    assert_eq!(out["object"], "response");
    assert_eq!(out["output"][0]["content"][0]["text"], "yo");
    assert_eq!(out["created_at"], 1_700_000_000);
    assert_eq!(
        set_header(&c.header_mutation, "content-length"),
        Some(body_of(c).len().to_string().as_str())
    );
}

#[test]
fn json_answer_over_the_body_cap_is_502_also_in_one_message() {
    let exchange = responses_core::exchange::Settings {
        max_body_bytes: 64,
        ..Default::default()
    };
    let settings = Settings {
        exchange: Arc::new(exchange),
        ..Settings::default()
    };
    let mut s = Session::new(Arc::new(settings), Fixed);
    post(&mut s, json!({"model": "m", "input": "hi"}));
    send(
        &mut s,
        Request::ResponseHeaders(headers(
            &[(":status", "200"), ("content-type", "application/json")],
            false,
        )),
    );
    let chat = json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"content": "x".repeat(100)}}]});
    let (status, body) = immediate(&send(
        &mut s,
        Request::ResponseBody(body_msg(chat.to_string().as_bytes(), true)),
    ));
    assert_eq!(status, 502);
    assert_eq!(body["error"]["code"], "upstream_response_too_large");
}

#[test]
fn an_upstream_error_keeps_its_retry_headers_on_the_immediate_response() {
    let mut s = session();
    post(&mut s, json!({"model": "m", "input": "hi", "stream": true}));
    send(
        &mut s,
        Request::ResponseHeaders(headers(
            &[
                (":status", "429"),
                ("content-type", "application/json"),
                ("retry-after", "1"),
                ("x-ratelimit-reset-requests", "1s"),
            ],
            false,
        )),
    );
    let r = send(
        &mut s,
        Request::ResponseBody(body_msg(br#"{"error":{"message":"slow down"}}"#, true)),
    );
    let (status, body) = immediate(&r);
    assert_eq!(
        (status, &body["error"]["code"]),
        (429, &json!("rate_limit_exceeded"))
    );
    let Some(R::ImmediateResponse(reply)) = r.response.as_ref() else {
        unreachable!("checked above")
    };
    for (name, value) in [
        ("content-type", "application/json"),
        ("retry-after", "1"),
        ("x-ratelimit-reset-requests", "1s"),
    ] {
        assert_eq!(set_header(&reply.headers, name), Some(value), "{name}");
    }
}

#[test]
fn event_stream_is_translated_chunk_by_chunk() {
    let mut s = session();
    post(&mut s, json!({"model": "m", "input": "hi", "stream": true}));
    let r = send(
        &mut s,
        Request::ResponseHeaders(headers(
            &[(":status", "200"), ("content-type", "text/event-stream")],
            false,
        )),
    );
    assert_eq!(body_mode(&r), Some(BodySendMode::Streamed as i32));
    let c = common(&r);
    assert_eq!(
        set_header(&c.header_mutation, "content-type"),
        Some("text/event-stream")
    );
    assert!(c
        .header_mutation
        .as_ref()
        .unwrap()
        .remove_headers
        .contains(&"content-length".to_owned()));

    let first = send(
        &mut s,
        Request::ResponseBody(body_msg(
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"He",
            false,
        )),
    );
    let text = String::from_utf8(body_of(common(&first)).to_vec()).unwrap();
    assert!(text.starts_with("event: response.created\n"));
    assert!(
        !text.contains("output_text.delta"),
        "an incomplete frame is held"
    );
    let second = send(
        &mut s,
        Request::ResponseBody(body_msg(b"llo\"}}]}\n\n", false)),
    );
    let text = String::from_utf8(body_of(common(&second)).to_vec()).unwrap();
    assert!(text.contains("\"delta\":\"Hello\""));
    let end = send(&mut s, Request::ResponseBody(body_msg(b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n", true)));
    let text = String::from_utf8(body_of(common(&end)).to_vec()).unwrap();
    assert!(text.contains("event: response.completed\n"));
    assert!(text.ends_with("data: [DONE]\n\n"));
}

#[test]
fn upstream_errors_become_envelopes_with_their_status() {
    let mut s = session();
    post(&mut s, json!({"model": "m", "input": "hi"}));
    let r = send(
        &mut s,
        Request::ResponseHeaders(headers(
            &[(":status", "429"), ("content-type", "application/json")],
            false,
        )),
    );
    assert_eq!(body_mode(&r), Some(BodySendMode::BufferedPartial as i32));
    let r = send(
        &mut s,
        Request::ResponseBody(body_msg(
            br#"{"error":{"message":"busy","code":"rate"}}"#,
            true,
        )),
    );
    let (status, body) = immediate(&r);
    assert_eq!(status, 429);
    assert_eq!(body["error"]["message"], "busy");
    assert_eq!(body["error"]["type"], "rate_limit_error");
}

#[test]
fn stream_requested_but_json_answered_is_502() {
    let mut s = session();
    post(&mut s, json!({"model": "m", "input": "hi", "stream": true}));
    send(
        &mut s,
        Request::ResponseHeaders(headers(
            &[(":status", "200"), ("content-type", "application/json")],
            false,
        )),
    );
    let r = send(
        &mut s,
        Request::ResponseBody(body_msg(b"{\"choices\":[]}", true)),
    );
    let (status, body) = immediate(&r);
    assert_eq!(status, 502);
    assert_eq!(body["error"]["code"], "upstream_invalid_response");
}

#[test]
fn envoy_local_replies_are_not_translated() {
    // 413 before the body reached us: the upstream was never called.
    let mut s = session();
    send(
        &mut s,
        Request::RequestHeaders(headers(
            &[(":method", "POST"), (":path", "/v1/responses")],
            false,
        )),
    );
    send(
        &mut s,
        Request::ResponseHeaders(headers(
            &[(":status", "413"), ("content-type", "text/plain")],
            false,
        )),
    );
    let (status, body) = immediate(&send(
        &mut s,
        Request::ResponseBody(body_msg(b"Payload Too Large", true)),
    ));
    assert_eq!(status, 413);
    assert_eq!(body["error"]["code"], "request_too_large");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(
        !body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("upstream"),
        "the upstream never saw this request: {body}"
    );

    // 503 with no body at all, after forwarding.
    let mut s = session();
    post(&mut s, json!({"model": "m", "input": "hi", "stream": true}));
    let r = send(
        &mut s,
        Request::ResponseHeaders(headers(&[(":status", "503")], true)),
    );
    let (status, body) = immediate(&r);
    assert_eq!(status, 503);
    assert_eq!(body["error"]["type"], "server_error");
}

#[test]
fn full_duplex_mode_answers_with_streamed_responses_and_ends_on_trailers() {
    use envoy_types::pb::envoy::service::ext_proc::v3::StreamedBodyResponse;
    let settings = Settings {
        stream_body_mode: StreamBodyMode::FullDuplexStreamed,
        ..Settings::default()
    };
    let mut s = Session::new(Arc::new(settings), Fixed);
    post(&mut s, json!({"model": "m", "input": "hi", "stream": true}));
    let r = send(
        &mut s,
        Request::ResponseHeaders(headers(
            &[(":status", "200"), ("content-type", "text/event-stream")],
            false,
        )),
    );
    let mode = r.mode_override.expect("mode override");
    assert_eq!(
        mode.response_body_mode,
        BodySendMode::FullDuplexStreamed as i32
    );
    assert_eq!(
        mode.response_trailer_mode, 1,
        "trailers are sent in full duplex"
    );
    let streamed = |r: &ProcessingResponse| match common(r)
        .body_mutation
        .as_ref()
        .and_then(|b| b.mutation.as_ref())
    {
        Some(Mutation::StreamedResponse(StreamedBodyResponse {
            body,
            end_of_stream,
            ..
        })) => (String::from_utf8(body.clone()).unwrap(), *end_of_stream),
        other => panic!("expected a streamed response, got {other:?}"),
    };
    let r = send(&mut s, Request::ResponseBody(body_msg(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":\"stop\"}]}\n\n", false)));
    let (text, eos) = streamed(&r);
    assert!(text.contains("\"delta\":\"Hi\"") && !eos);
    let answers = s.on_message(ProcessingRequest {
        request: Some(Request::ResponseTrailers(Default::default())),
        ..Default::default()
    });
    assert_eq!(answers.len(), 2, "the last events, then the trailers");
    let (text, eos) = streamed(&answers[0]);
    assert!(
        eos && text.contains("event: response.completed") && text.ends_with("data: [DONE]\n\n")
    );
    assert!(matches!(answers[1].response, Some(R::ResponseTrailers(_))));
}

#[test]
fn empty_event_stream_ends_with_a_failed_response() {
    let mut s = session();
    post(&mut s, json!({"model": "m", "input": "hi", "stream": true}));
    let r = send(
        &mut s,
        Request::ResponseHeaders(headers(
            &[(":status", "200"), ("content-type", "text/event-stream")],
            true,
        )),
    );
    let c = common(&r);
    assert_eq!(c.status, ResponseStatus::ContinueAndReplace as i32);
    let text = String::from_utf8(body_of(c).to_vec()).unwrap();
    assert!(text.contains("event: response.failed\n"));
    assert!(text.ends_with("data: [DONE]\n\n"));
}

/// The headers in each `forward_rules.allowed_headers` block of a config (a prefix pattern
/// as `prefix <value>`).
fn forwarded(config: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut lines = config.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "forward_rules:" {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let block = lines
            .by_ref()
            .take_while(|l| l.len() - l.trim_start().len() > indent)
            .filter_map(|l| {
                let l = l.trim();
                let exact = l.strip_prefix("- exact: ").map(|v| ("", v));
                exact.or_else(|| l.strip_prefix("- prefix: ").map(|v| ("prefix ", v)))
            })
            .map(|(kind, v)| format!("{kind}{}", v.trim_matches('"')))
            .collect();
        blocks.push(block);
    }
    blocks
}

/// Envoy forwards exactly the headers the processor reads, in every shipped config that
/// defines the filter (the examples and the Kubernetes ConfigMaps are checked against
/// envoy/envoy.yaml by their own tests).
#[test]
fn envoy_forwards_exactly_the_headers_read() {
    let mut expected: Vec<String> = HEADERS_READ.iter().map(|h| h.to_string()).collect();
    expected.extend(HEADER_PREFIXES_READ.iter().map(|p| format!("prefix {p}")));
    expected.sort();
    for (name, config, blocks) in [
        (
            "envoy/envoy.yaml",
            include_str!("../../../envoy/envoy.yaml"),
            1,
        ),
        (
            "deploy/istio/envoyfilter.yaml",
            include_str!("../../../deploy/istio/envoyfilter.yaml"),
            2,
        ),
    ] {
        let found = forwarded(config);
        assert_eq!(found.len(), blocks, "{name}: forward_rules blocks");
        for mut block in found {
            block.sort();
            assert_eq!(block, expected, "{name}");
        }
    }
}

#[test]
fn the_last_answer_carries_the_summary_as_envoy_metadata() {
    use envoy_types::pb::google::protobuf::value::Kind;
    let mut s = session();
    let r = post(&mut s, json!({"model": "m", "input": "hi"}));
    assert!(r.dynamic_metadata.is_none(), "not before the end");
    send(
        &mut s,
        Request::ResponseHeaders(headers(
            &[(":status", "200"), ("content-type", "application/json")],
            false,
        )),
    );
    let chat = json!({"model": "llama-3", "choices": [{"index": 0, "finish_reason": "stop",
        "message": {"content": "yo"}}], "usage": {"prompt_tokens": 11, "completion_tokens": 7,
        "total_tokens": 18, "prompt_tokens_details": {"cached_tokens": 3}}});
    let r = send(
        &mut s,
        Request::ResponseBody(body_msg(chat.to_string().as_bytes(), true)),
    );
    let md = r.dynamic_metadata.expect("metadata at the end");
    let Some(Kind::StructValue(ns)) = md.fields[METADATA_NAMESPACE].kind.clone() else {
        panic!("a struct under {METADATA_NAMESPACE}");
    };
    let get = |k: &str| ns.fields.get(k).and_then(|v| v.kind.clone());
    assert_eq!(get("input_tokens"), Some(Kind::NumberValue(11.0)));
    assert_eq!(get("output_tokens"), Some(Kind::NumberValue(7.0)));
    assert_eq!(get("total_tokens"), Some(Kind::NumberValue(18.0)));
    assert_eq!(get("cached_tokens"), Some(Kind::NumberValue(3.0)));
    assert_eq!(get("reasoning_tokens"), Some(Kind::NumberValue(0.0)));
    assert_eq!(get("model"), Some(Kind::StringValue("m".into())));
    assert_eq!(
        get("upstream_model"),
        Some(Kind::StringValue("llama-3".into()))
    );
    assert_eq!(get("outcome"), Some(Kind::StringValue("translated".into())));
    assert_eq!(get("operation"), Some(Kind::StringValue("create".into())));
    assert_eq!(get("status"), Some(Kind::NumberValue(200.0)));
    assert!(matches!(get("response_id"), Some(Kind::StringValue(id)) if id.starts_with("resp_")));

    // A rejected request too, with its error code.
    let mut s = session();
    let r = post(&mut s, json!({"model": "m"}));
    let md = r.dynamic_metadata.expect("metadata on the rejection");
    let Some(Kind::StructValue(ns)) = md.fields[METADATA_NAMESPACE].kind.clone() else {
        panic!("a struct");
    };
    assert_eq!(
        ns.fields["outcome"].kind,
        Some(Kind::StringValue("failed".into()))
    );
    assert_eq!(ns.fields["status"].kind, Some(Kind::NumberValue(400.0)));
}

mod fail_closed {
    //! For any sequence of Envoy messages and sizes, once a request is ours no answer
    //! lets untranslated bytes pass.
    use super::*;
    use proptest::prelude::*;

    /// One message Envoy could send, with small sizes around small caps.
    #[derive(Debug, Clone)]
    enum Msg {
        RequestBody {
            body: Vec<u8>,
            eos: bool,
        },
        ResponseHeaders {
            status: u16,
            content_type: &'static str,
            eos: bool,
        },
        ResponseBody {
            body: Vec<u8>,
            eos: bool,
        },
        ResponseTrailers,
    }

    fn body() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            Just(br#"{"model":"m","input":"hi"}"#.to_vec()),
            Just(br#"{"model":"m","input":"hi","stream":true}"#.to_vec()),
            Just(b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n".to_vec()),
            Just(b"data: [DONE]\n\n".to_vec()),
            Just(
                br#"{"choices":[{"index":0,"finish_reason":"stop","message":{"content":"yo"}}]}"#
                    .to_vec()
            ),
            proptest::collection::vec(any::<u8>(), 0..600),
        ]
    }

    fn msg() -> impl Strategy<Value = Msg> {
        prop_oneof![
            (body(), any::<bool>()).prop_map(|(body, eos)| Msg::RequestBody { body, eos }),
            (
                prop_oneof![Just(200u16), Just(413), Just(429), Just(500), Just(503)],
                prop_oneof![
                    Just("application/json"),
                    Just("text/event-stream"),
                    Just("text/plain"),
                    Just("")
                ],
                any::<bool>()
            )
                .prop_map(|(status, content_type, eos)| Msg::ResponseHeaders {
                    status,
                    content_type,
                    eos
                }),
            (body(), any::<bool>()).prop_map(|(body, eos)| Msg::ResponseBody { body, eos }),
            Just(Msg::ResponseTrailers),
        ]
    }

    fn small_caps(full_duplex: bool) -> Settings {
        let exchange = responses_core::exchange::Settings {
            max_body_bytes: 256,
            options: responses_core::translate::Options {
                max_request_bytes: 256,
                max_output_bytes: 256,
                max_sse_frame_bytes: 128,
                ..Default::default()
            },
            ..Default::default()
        };
        Settings {
            exchange: Arc::new(exchange),
            log_content: false,
            stream_body_mode: if full_duplex {
                StreamBodyMode::FullDuplexStreamed
            } else {
                StreamBodyMode::Streamed
            },
            // Recorded too: no message sequence may upset the metrics either.
            metrics: Some(Arc::new(crate::metrics::Metrics::new(
                Default::default(),
                None,
            ))),
            traces: None,
            upstream: None,
            records: Arc::default(),
        }
    }

    /// An answer to a body message that leaves the original bytes in place.
    fn passes_body(r: &ProcessingResponse) -> bool {
        match r.response.as_ref() {
            Some(R::ImmediateResponse(_)) | Some(R::ResponseTrailers(_)) => false,
            Some(R::RequestBody(b) | R::ResponseBody(b)) => b.response.as_ref().is_none_or(|c| {
                c.body_mutation
                    .as_ref()
                    .and_then(|m| m.mutation.as_ref())
                    .is_none()
            }),
            _ => true,
        }
    }

    /// An answer to a response head that lets its body pass unread.
    fn passes_head(r: &ProcessingResponse) -> bool {
        match r.response.as_ref() {
            Some(R::ImmediateResponse(_)) => false,
            Some(R::ResponseHeaders(h)) => {
                let replaced = h
                    .response
                    .as_ref()
                    .is_some_and(|c| c.status == ResponseStatus::ContinueAndReplace as i32);
                let read = r.mode_override.as_ref().is_some_and(|m| {
                    m.response_body_mode != BodySendMode::None as i32
                        && m.response_body_mode != BodySendMode::Buffered as i32
                });
                !replaced && !read
            }
            _ => true,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn prop_nothing_untranslated_passes(
            skip_headers in any::<bool>(),
            full_duplex in any::<bool>(),
            msgs in proptest::collection::vec(msg(), 0..12),
        ) {
            let mut s = Session::new(Arc::new(small_caps(full_duplex)), Fixed);
            if !skip_headers {
                let r = send(&mut s, Request::RequestHeaders(headers(
                    &[(":method", "POST"), (":path", "/v1/responses?x=1")], false)));
                // The request body must still come to us.
                prop_assert!(r.mode_override.as_ref().is_none_or(|m| m.request_body_mode != BodySendMode::None as i32));
            }
            let mut ended = false;
            for m in msgs {
                if ended {
                    break;
                }
                let (request, is_head) = match m.clone() {
                    Msg::RequestBody { body, eos } => (Request::RequestBody(body_msg(&body, eos)), false),
                    Msg::ResponseHeaders { status, content_type, eos } => {
                        let status = status.to_string();
                        let mut h = vec![(":status", status.as_str())];
                        if !content_type.is_empty() {
                            h.push(("content-type", content_type));
                        }
                        (Request::ResponseHeaders(headers(&h, eos)), true)
                    }
                    Msg::ResponseBody { body, eos } => (Request::ResponseBody(body_msg(&body, eos)), false),
                    Msg::ResponseTrailers => (Request::ResponseTrailers(Default::default()), false),
                };
                let answers = s.on_message(ProcessingRequest { request: Some(request), ..Default::default() });
                prop_assert!(!answers.is_empty(), "every message is answered: {m:?}");
                for a in &answers {
                    if matches!(a.response, Some(R::ImmediateResponse(_))) {
                        ended = true;
                    }
                }
                if is_head {
                    prop_assert!(!passes_head(&answers[0]), "{m:?} -> {:?}", answers[0]);
                } else if !matches!(m, Msg::ResponseTrailers) {
                    prop_assert!(!passes_body(&answers[0]), "{m:?} -> {:?}", answers[0]);
                }
            }
            // And a transport failure at any point still ends in an envelope or nothing.
            for a in s.on_failure(true) {
                prop_assert!(!passes_body(&a) || matches!(a.response, Some(R::ImmediateResponse(_))));
            }
        }
    }
}

/// An automatic compaction: the request body gets no answer until the session's call is
/// reported (the stream's driver makes it); then the turn replaces the body, or the call's
/// failure is the reply. Nothing of the client's body is ever passed on.
#[test]
fn a_compaction_call_holds_the_body_answer_until_it_ends() {
    use responses_core::translate::seal::Keyring;
    let mut exchange = responses_core::exchange::Settings::default();
    exchange.options.keyring = Some(Arc::new(Keyring::single("k", [3; 32]).unwrap()));
    let settings = Arc::new(Settings {
        exchange: Arc::new(exchange),
        ..Settings::default()
    });
    let request = json!({"model": "m", "input": [
        {"role": "user", "content": "one two three four five six seven eight nine ten"},
        {"role": "assistant", "content": "eleven twelve thirteen"},
        {"role": "user", "content": "fourteen"}
    ], "context_management": [{"type": "compaction", "compact_threshold": 5}]});
    for ok in [true, false] {
        let mut s = Session::new(settings.clone(), Fixed);
        send(
            &mut s,
            Request::RequestHeaders(headers(
                &[
                    (":method", "POST"),
                    (":path", "/v1/responses"),
                    ("authorization", "Bearer k"),
                    // forward_headers' (when Envoy's forward_rules let it through).
                    ("x-client-id", "alice"),
                ],
                false,
            )),
        );
        let answers = s.on_message(ProcessingRequest {
            request: Some(Request::RequestBody(body_msg(
                request.to_string().as_bytes(),
                true,
            ))),
            ..Default::default()
        });
        assert!(answers.is_empty(), "the body's answer waits for the call");
        let (call, bound) = s.take_call().expect("a call to make");
        let grace = responses_core::driver::CALL_GRACE;
        assert_eq!(bound, std::time::Duration::from_secs(25) + grace);
        let deadline = s.poll_timeout().expect("the call's deadline");
        assert!(deadline > Instant::now() + std::time::Duration::from_secs(24));
        assert!(call
            .headers
            .iter()
            .any(|(n, v)| n == "authorization" && v == "Bearer k"));
        assert!(call
            .headers
            .iter()
            .any(|(n, v)| n == "x-client-id" && v == "alice"));
        assert_eq!(s.call_in_flight(), Some(call.id));
        let answers = if ok {
            let ct = [("content-type", "application/json")];
            let head = AnswerHead(&ct).report(200, |head| s.call_head(call.id, head));
            assert!(head.is_empty());
            let summary = br#"{"choices":[{"index":0,"message":{"content":"numbers"}}]}"#;
            assert!(s.call_data(call.id, summary).is_empty());
            s.call_end(call.id)
        } else {
            s.call_failed(call.id, CallFailure::TimedOut)
        };
        assert_eq!(answers.len(), 1);
        assert_eq!(s.call_in_flight(), None);
        if ok {
            let chat: Value = serde_json::from_slice(body_of(common(&answers[0]))).unwrap();
            let sent = chat["messages"].to_string();
            assert!(
                sent.contains("numbers") && sent.contains("fourteen"),
                "{sent}"
            );
            assert!(!sent.contains("eleven"), "{sent}");
        } else {
            let (status, v) = immediate(&answers[0]);
            assert_eq!(
                (status, v["error"]["code"].as_str()),
                (504, Some("upstream_timeout"))
            );
        }
    }
}
