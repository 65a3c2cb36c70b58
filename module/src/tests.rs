//! The filter against the fake Envoy: each way an exchange goes, with plain bytes.

use proptest::prelude::*;
use responses_core::driver::{DETAILS_ANSWER, DETAILS_REQUEST};
use responses_core::metadata::{MetadataValue, METADATA_NAMESPACE};
use responses_core::metrics::Metric;
use serde_json::{json, Value};

use crate::fake::{self, FakeEnvoy, FakeHost, FakeSpan, OwnAnswer, Step};
use crate::host::ffi::Deferred;
use crate::host::{Callout, CalloutId, CalloutRefused, CalloutReset, Host, Level, Side, Terminal};
use crate::status::{BodyStatus, HeadersStatus};

const POST: [(&str, &str); 3] = [
    (":method", "POST"),
    (":path", "/v1/responses"),
    ("x-request-id", "req-1"),
];

fn envoy() -> FakeEnvoy {
    FakeEnvoy::new(fake::config("{}"))
}

fn post(envoy: &mut FakeEnvoy, body: &Value) {
    let mut headers = POST.to_vec();
    headers.push(("accept-encoding", "gzip"));
    envoy.request_headers(&headers, false);
    envoy.request_body(body.to_string().as_bytes(), true);
}

fn upstream_json(envoy: &FakeEnvoy) -> Value {
    assert!(envoy.upstream.ended);
    serde_json::from_slice(&envoy.upstream.body).expect("the upstream got JSON")
}

fn header<'a>(headers: &'a Option<Vec<(String, String)>>, name: &str) -> Option<&'a str> {
    headers
        .as_ref()?
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn metadata(envoy: &FakeEnvoy, key: &str) -> Option<MetadataValue> {
    envoy
        .host
        .metadata
        .get(&(METADATA_NAMESPACE.to_owned(), key.to_owned()))
        .cloned()
}

const CHAT: &str = r#"{"model":"llama","choices":[{"index":0,"finish_reason":"stop","message":{"content":"yo"}}],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}"#;

#[test]
fn other_traffic_passes_untouched() {
    let mut e = envoy();
    e.request_headers(&[(":method", "GET"), (":path", "/v1/models")], true);
    assert!(e.upstream.ended);
    assert_eq!(header(&e.upstream.headers, ":path"), Some("/v1/models"));
    e.response_headers(200, "application/json", false);
    e.response_body(b"{\"data\":[]}", true);
    assert_eq!(e.client.body, b"{\"data\":[]}");
    assert_eq!(header(&e.client.headers, "content-length"), Some("7"));
    e.complete();
    assert!(e.host.metadata.is_empty() && e.host.counters.is_empty());
}

#[test]
fn a_json_exchange_is_translated_both_ways() {
    let mut e = envoy();
    post(&mut e, &json!({"model": "m", "input": "hi"}));
    // The request: rewritten for the Chat route, which Envoy computes again.
    let chat = upstream_json(&e);
    assert_eq!(chat["messages"][0]["content"], "hi");
    assert_eq!(
        header(&e.upstream.headers, ":path"),
        Some("/v1/chat/completions")
    );
    assert_eq!(header(&e.upstream.headers, "x-responses-model"), Some("m"));
    assert_eq!(header(&e.upstream.headers, "accept-encoding"), None);
    let length = e.upstream.body.len().to_string();
    assert_eq!(
        header(&e.upstream.headers, "content-length"),
        Some(length.as_str())
    );
    assert_eq!(e.host.route_cache_cleared, 1);
    // The answer: the head is held while the body is gathered, then both are replaced.
    e.response_headers(200, "application/json", false);
    assert!(e.client.headers.is_none(), "head held");
    e.response_body(&CHAT.as_bytes()[..20], false);
    assert!(e.client.headers.is_none() && e.client.body.is_empty());
    e.response_body(&CHAT.as_bytes()[20..], true);
    let answer: Value = serde_json::from_slice(&e.client.body).unwrap();
    assert_eq!(answer["object"], "response");
    assert_eq!(answer["output"][0]["content"][0]["text"], "yo");
    let length = e.client.body.len().to_string();
    assert_eq!(
        header(&e.client.headers, "content-length"),
        Some(length.as_str())
    );
    e.complete();
    e.assert_fail_closed("/v1/chat/completions");
    // The summary, as ext_proc reports it: same namespace, same keys.
    assert_eq!(metadata(&e, "total_tokens"), Some(MetadataValue::Num(18.0)));
    assert_eq!(
        metadata(&e, "outcome"),
        Some(MetadataValue::Str("translated".into()))
    );
    assert_eq!(
        metadata(&e, "upstream_model"),
        Some(MetadataValue::Str("llama".into()))
    );
    // And the stats.
    let m = fake::config("{}").metrics;
    let key = |id: crate::host::MetricId, labels: &[&str]| {
        (
            id.0,
            labels.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
    };
    let exchanges = m.id(Metric::Exchanges);
    assert_eq!(
        e.host
            .counters
            .get(&key(exchanges, &["create", "false", "translated", ""])),
        Some(&1)
    );
    let tokens = m.id(Metric::Tokens);
    assert_eq!(
        e.host.counters.get(&key(tokens, &["m", "llama", "input"])),
        Some(&11)
    );
    assert_eq!(
        e.host.counters.get(&key(tokens, &["m", "llama", "output"])),
        Some(&7)
    );
}

#[test]
fn a_stream_is_translated_as_it_comes() {
    let mut e = envoy();
    post(
        &mut e,
        &json!({"model": "m", "input": "hi", "stream": true}),
    );
    assert_eq!(upstream_json(&e)["stream"], true);
    e.response_headers(200, "text/event-stream", false);
    assert_eq!(
        header(&e.client.headers, "content-type"),
        Some("text/event-stream")
    );
    assert_eq!(header(&e.client.headers, "content-length"), None);
    e.response_body(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"He",
        false,
    );
    e.response_body(b"llo\"}}]}\n\n", false);
    let so_far = String::from_utf8(e.client.body.clone()).unwrap();
    assert!(so_far.contains("\"delta\":\"Hello\""), "{so_far}");
    assert_eq!(e.host.gauges.values().sum::<i64>(), 1, "a stream in flight");
    e.response_body(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
        true,
    );
    let text = String::from_utf8(e.client.body.clone()).unwrap();
    assert!(text.contains("event: response.completed\n") && text.ends_with("data: [DONE]\n\n"));
    assert!(e.client.ended);
    e.complete();
    e.assert_fail_closed("/v1/chat/completions");
    assert_eq!(e.host.gauges.values().sum::<i64>(), 0);
    assert_eq!(metadata(&e, "stream"), Some(MetadataValue::Bool(true)));
}

#[test]
fn bad_requests_get_envelopes_and_nothing_goes_upstream() {
    let mut e = envoy();
    post(&mut e, &json!({"model": "m"}));
    let r = e.client.reply.clone().expect("a reply");
    assert_eq!((r.status, r.details.as_str()), (400, DETAILS_REQUEST));
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(e.upstream.headers.is_none());
    assert_eq!(metadata(&e, "status"), Some(MetadataValue::Num(400.0)));
    // No body at all.
    let mut e = envoy();
    e.request_headers(&POST, true);
    assert_eq!(e.client.reply.as_ref().map(|r| r.status), Some(400));
    assert!(e.upstream.headers.is_none());
}

#[test]
fn a_request_over_the_cap_is_refused_before_its_end() {
    let mut e = FakeEnvoy::new(fake::config(r#"{"max_request_bytes": 100}"#));
    e.request_headers(&POST, false);
    e.request_body(&[b'x'; 60], false);
    assert!(e.client.reply.is_none());
    e.request_body(&[b'x'; 60], false);
    let r = e
        .client
        .reply
        .clone()
        .expect("413 before the end of the body");
    assert_eq!(r.status, 413);
    assert!(e.upstream.headers.is_none());
    e.request_body(b"more", true);
    assert!(e.upstream.headers.is_none());
}

#[test]
fn upstream_errors_and_envoys_replies_become_envelopes() {
    // The upstream's 429, with its message.
    let mut e = envoy();
    post(
        &mut e,
        &json!({"model": "m", "input": "hi", "stream": true}),
    );
    e.response_headers_with(
        429,
        "application/json",
        &[("retry-after", "1"), ("x-ratelimit-remaining-tokens", "0")],
        false,
    );
    e.response_body(br#"{"error":{"message":"slow down"}}"#, true);
    let r = e.client.reply.clone().expect("an envelope");
    assert_eq!((r.status, r.details.as_str()), (429, DETAILS_ANSWER));
    assert!(String::from_utf8_lossy(&r.body).contains("slow down"));
    // With the headers a client retries by.
    assert_eq!(
        r.headers,
        [
            ("retry-after".to_owned(), "1".to_owned()),
            ("x-ratelimit-remaining-tokens".to_owned(), "0".to_owned())
        ]
    );
    // Envoy's 503 (no upstream) passes the response hooks too.
    let mut e = envoy();
    post(&mut e, &json!({"model": "m", "input": "hi"}));
    e.response_headers(503, "text/plain", false);
    e.response_body(b"upstream connect error", true);
    let r = e.client.reply.clone().expect("an envelope");
    assert_eq!(r.status, 503);
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(v["error"]["code"], "upstream_unavailable");
    // Envoy's 413 before anything was forwarded: never called an upstream error.
    let mut e = envoy();
    e.request_headers(&POST, false);
    e.request_body(b"{\"model\":", false);
    e.response_headers(413, "text/plain", false);
    e.response_body(b"Payload Too Large", true);
    let r = e.client.reply.clone().expect("an envelope");
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        (r.status, v["error"]["code"].as_str()),
        (413, Some("request_too_large"))
    );
    // A head without a body.
    let mut e = envoy();
    post(&mut e, &json!({"model": "m", "input": "hi"}));
    e.response_headers(500, "", true);
    assert_eq!(e.client.reply.as_ref().map(|r| r.status), Some(500));
    e.assert_fail_closed("/v1/chat/completions");
}

#[test]
fn an_answer_over_the_cap_is_a_502_and_a_stream_without_a_body_fails_cleanly() {
    let mut e = FakeEnvoy::new(fake::config(r#"{"max_body_bytes": 64}"#));
    post(&mut e, &json!({"model": "m", "input": "hi"}));
    e.response_headers(200, "application/json", false);
    e.response_body(&[b' '; 50], false);
    e.response_body(&[b' '; 50], false);
    let r = e.client.reply.clone().expect("502");
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        (r.status, v["error"]["code"].as_str()),
        (502, Some("upstream_response_too_large"))
    );
    assert_eq!(
        metadata(&e, "error_code"),
        Some(MetadataValue::Str("upstream_response_too_large".into()))
    );

    let mut e = envoy();
    post(
        &mut e,
        &json!({"model": "m", "input": "hi", "stream": true}),
    );
    e.response_headers(200, "text/event-stream", true);
    let text = String::from_utf8(e.client.body.clone()).unwrap();
    assert!(text.contains("event: response.failed\n") && text.ends_with("data: [DONE]\n\n"));
    assert!(e.client.ended);
    e.assert_fail_closed("/v1/chat/completions");
}

#[test]
fn a_stream_ended_by_trailers_gets_its_last_events() {
    let mut e = envoy();
    post(
        &mut e,
        &json!({"model": "m", "input": "hi", "stream": true}),
    );
    e.response_headers(200, "text/event-stream", false);
    e.response_body(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n",
        false,
    );
    e.response_trailers();
    let text = String::from_utf8(e.client.body.clone()).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    e.assert_fail_closed("/v1/chat/completions");
}

#[test]
fn a_panic_ends_the_exchange_with_what_can_still_be_sent() {
    // Before the answer: an envelope.
    let mut e = envoy();
    e.request_headers(&POST, false);
    e.request_body(b"{\"model\":", false);
    e.panic();
    let r = e.client.reply.clone().expect("an envelope");
    assert_eq!(r.status, 500);
    assert!(e.upstream.headers.is_none());
    // Mid-stream: the stream's failed ending, then nothing more of the upstream.
    let mut e = envoy();
    post(
        &mut e,
        &json!({"model": "m", "input": "hi", "stream": true}),
    );
    e.response_headers(200, "text/event-stream", false);
    e.response_body(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n",
        false,
    );
    e.panic();
    let text = String::from_utf8(e.client.body.clone()).unwrap();
    assert!(text.contains("event: response.failed\n") && text.ends_with("data: [DONE]\n\n"));
    e.response_body(b"data: raw upstream bytes\n\n", true);
    assert!(!String::from_utf8_lossy(&e.client.body).contains("raw upstream"));
    e.complete();
    e.assert_fail_closed("/v1/chat/completions");
    assert_eq!(
        metadata(&e, "error_code"),
        Some(MetadataValue::Str("internal_error".into()))
    );
}

/// Envoy's header-set call can fail (it has no header map at that point): a refused edit ends
/// the exchange in an envelope (or, once a stream has started, its failed ending), never a
/// request half rewritten sent on, nor an answer half translated.
#[test]
fn a_header_edit_envoy_refuses_ends_the_exchange_in_an_envelope() {
    // The request's model header, refused: nothing goes upstream.
    let mut e = envoy();
    e.host.refused_headers = vec!["x-responses-model".into()];
    post(&mut e, &json!({"model": "m", "input": "hi"}));
    let r = e.client.reply.clone().expect("an envelope");
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        (r.status, v["error"]["code"].as_str()),
        (500, Some("internal_error"))
    );
    assert!(e.upstream.headers.is_none() && e.upstream.body.is_empty());
    assert_eq!(e.host.route_cache_cleared, 0);
    e.assert_fail_closed("/v1/chat/completions");
    // Edits of the answer's head, refused: a stream's and a JSON answer's.
    for (header, stream, content_type, body) in [
        (
            "cache-control",
            true,
            "text/event-stream",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n",
        ),
        ("content-length", false, "application/json", CHAT),
    ] {
        let mut e = envoy();
        post(
            &mut e,
            &json!({"model": "m", "input": "hi", "stream": stream}),
        );
        assert!(e.upstream.ended);
        e.host.refused_headers = vec![header.into()];
        e.response_headers(200, content_type, false);
        e.response_body(body.as_bytes(), true);
        e.complete();
        assert!(
            !String::from_utf8_lossy(&e.client.body).contains("\"choices\""),
            "{header}: {:?}",
            String::from_utf8_lossy(&e.client.body)
        );
        e.assert_fail_closed("/v1/chat/completions");
        assert_eq!(
            metadata(&e, "error_code"),
            Some(MetadataValue::Str("internal_error".into())),
            "{header}"
        );
    }
}

#[test]
fn the_clients_event_names_follow_its_headers() {
    let reasoning =
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n";
    for (agent, name) in [
        ("OpenAI/Python 3.57.0", "response.reasoning_text.delta"),
        ("curl/8.5.0", "response.reasoning.delta"),
    ] {
        let mut e = envoy();
        let mut headers = POST.to_vec();
        headers.push(("user-agent", agent));
        e.request_headers(&headers, false);
        e.request_body(br#"{"model":"m","input":"hi","stream":true}"#, true);
        e.response_headers(200, "text/event-stream", false);
        e.response_body(reasoning, false);
        let text = String::from_utf8(e.client.body.clone()).unwrap();
        assert!(
            text.contains(&format!("event: {name}\n")),
            "{agent}: {text}"
        );
    }
}

#[test]
fn a_cut_exchange_is_counted_as_cut() {
    let mut e = envoy();
    post(
        &mut e,
        &json!({"model": "m", "input": "hi", "stream": true}),
    );
    e.response_headers(200, "text/event-stream", false);
    e.complete();
    let m = fake::config("{}").metrics;
    let cut = (
        m.id(Metric::Exchanges).0,
        vec!["create".to_string(), "true".into(), "cut".into(), "".into()],
    );
    assert_eq!(e.host.counters.get(&cut), Some(&1));
    assert_eq!(e.host.gauges.values().sum::<i64>(), 0);
    assert!(e.host.metadata.is_empty(), "no summary for a cut exchange");
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// A request whose body is costly to read (compressed, or of 1 MiB or more): the filter holds
/// it and hands the reading to a work thread; the worker goes on meanwhile.
fn post_costly(e: &mut FakeEnvoy, body: &[u8], compressed: bool) {
    let mut headers = POST.to_vec();
    if compressed {
        headers.push(("content-encoding", "gzip"));
    }
    e.request_headers(&headers, false);
    let (first, rest) = body.split_at(body.len() / 2);
    e.request_body(first, false);
    e.request_body(rest, true);
}

#[test]
fn a_costly_body_is_read_on_a_work_thread_then_goes_upstream_translated() {
    let request = json!({"model": "m", "input": "hi"}).to_string();
    let large = json!({"model": "m", "input": "x".repeat(1 << 20)}).to_string();
    let cases: [(&str, Vec<u8>, bool); 3] = [
        ("gzip", gzip(request.as_bytes()), true),
        ("a plain body of 1 MiB", large.clone().into_bytes(), false),
        ("a gzipped one of 1 MiB", gzip(large.as_bytes()), true),
    ];
    for (what, body, compressed) in cases {
        let mut e = envoy();
        e.hold_work = true;
        post_costly(&mut e, &body, compressed);
        assert_eq!(e.host.works_started, 1, "{what}");
        assert!(
            e.upstream.headers.is_none() && e.upstream.body.is_empty(),
            "{what}: held while read"
        );
        assert!(e.client.reply.is_none());
        assert!(e.finish_work(), "{what}");
        let chat = upstream_json(&e);
        assert_eq!(chat["model"], "m", "{what}");
        assert_eq!(
            header(&e.upstream.headers, ":path"),
            Some("/v1/chat/completions")
        );
        assert_eq!(
            header(&e.upstream.headers, "content-encoding"),
            None,
            "{what}"
        );
        e.response_headers(200, "application/json", false);
        e.response_body(CHAT.as_bytes(), true);
        let answer: Value = serde_json::from_slice(&e.client.body).unwrap();
        assert_eq!(answer["status"], "completed", "{what}");
        e.complete();
        e.assert_fail_closed("/v1/chat/completions");
    }
    // Small and plain: read on the worker, as before.
    let mut e = envoy();
    post_costly(&mut e, request.as_bytes(), false);
    assert_eq!(e.host.works_started, 0);
    assert!(e.upstream.ended);
}

#[test]
fn a_costly_body_that_is_bad_refused_or_panics_ends_in_its_envelope() {
    let refused = |e: &FakeEnvoy| {
        let reply = e.client.reply.clone().expect("an envelope");
        let body: Value = serde_json::from_slice(&reply.body).unwrap();
        assert!(e.upstream.headers.is_none(), "nothing went upstream");
        (
            reply.status,
            body["error"]["code"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    };
    // Not gzip at all: decoded on the work thread, refused there.
    let mut e = envoy();
    post_costly(&mut e, b"not gzip at all", true);
    assert_eq!(e.host.works_started, 1);
    assert_eq!(refused(&e), (400, "invalid_encoded_body".to_owned()));
    e.complete();
    e.assert_fail_closed("/v1/chat/completions");
    // The work threads' queue is full: a 503 to retry.
    let mut e = envoy();
    e.host.refuse_work = true;
    post_costly(&mut e, &gzip(b"{}"), true);
    assert_eq!(refused(&e), (503, "server_is_overloaded".to_owned()));
    e.complete();
    // The work panicked: the exchange fails, the worker is untouched.
    let mut e = envoy();
    e.hold_work = true;
    post_costly(&mut e, &gzip(b"{}"), true);
    assert!(e.finish_work_as(true));
    assert_eq!(refused(&e), (500, "internal_error".to_owned()));
    e.complete();
    e.assert_fail_closed("/v1/chat/completions");
}

#[test]
fn a_stream_that_ends_while_its_body_is_read_takes_no_result() {
    let mut e = envoy();
    e.hold_work = true;
    post_costly(&mut e, &gzip(br#"{"model":"m","input":"hi"}"#), true);
    e.complete();
    assert!(e.finish_work(), "the work ran");
    assert!(e.upstream.headers.is_none() && e.client.reply.is_none());
    let m = fake::config("{}").metrics;
    let cut = (
        m.id(Metric::Exchanges).0,
        vec![
            "create".to_string(),
            "false".into(),
            "cut".into(),
            "".into(),
        ],
    );
    assert_eq!(e.host.counters.get(&cut), Some(&1), "{:?}", e.host.counters);
    // A late result delivered all the same (a scheduler event racing the end) changes nothing.
    let mut e = envoy();
    e.hold_work = true;
    post_costly(&mut e, &gzip(br#"{"model":"m","input":"hi"}"#), true);
    e.complete();
    let work = e.host.work.take().unwrap();
    e.filter.work_done(&mut e.host, Some(work.run()));
    assert!(e.upstream.headers.is_none() && e.host.replies.is_empty() && !e.host.continued);
}

#[test]
fn the_filters_own_reply_passes_its_response_hooks() {
    let mut e = envoy();
    post(&mut e, &json!({"model": "m"}));
    // As Envoy would show the local reply to the filter (checked inside the fake too).
    e.host.response_headers = vec![(":status".into(), "400".into())];
    assert_eq!(
        e.filter.response_headers(&mut e.host, false),
        HeadersStatus::Continue
    );
    e.host.received[1] = b"{}".to_vec();
    e.host.in_body_hook[1] = true;
    assert_eq!(
        e.filter.response_body(&mut e.host, true),
        BodyStatus::Continue
    );
    assert_eq!(e.host.body(Side::Response), vec![&b"{"[..], &b"}"[..]]);
}

fn step() -> impl Strategy<Value = Step> {
    let body = prop_oneof![
        (0..fake::BODIES.len()).prop_map(|i| fake::BODIES[i].to_vec()),
        (0..fake::GZIPPED.len()).prop_map(|i| fake::GZIPPED[i].to_vec()),
        proptest::collection::vec(any::<u8>(), 0..400),
    ];
    prop_oneof![
        (body.clone(), any::<bool>()).prop_map(|(bytes, end)| Step::RequestBody { bytes, end }),
        (
            0..fake::STATUSES.len(),
            0..fake::CONTENT_TYPES.len(),
            any::<bool>()
        )
            .prop_map(|(s, c, end)| Step::ResponseHeaders {
                status: fake::STATUSES[s],
                content_type: fake::CONTENT_TYPES[c],
                end
            }),
        (body, any::<bool>()).prop_map(|(bytes, end)| Step::ResponseBody { bytes, end }),
        Just(Step::RequestTrailers),
        Just(Step::ResponseTrailers),
        Just(Step::Panic),
        Just(Step::Work),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]
    /// For any sequence of hooks, bodies and sizes around small caps, once a request is ours
    /// nothing untranslated reaches the upstream or the client (`fake::run_script` checks
    /// after every step).
    #[test]
    fn prop_nothing_untranslated_passes(
        compact in any::<bool>(),
        headers_end in any::<bool>(),
        compressed in any::<bool>(),
        steps in proptest::collection::vec(step(), 0..12),
    ) {
        let path = if compact { "/v1/responses/compact" } else { "/v1/responses?x=1" };
        fake::run_script(path, &fake::Script { headers_end, compressed, steps });
    }
}

/// The fuzz target's decoding (`fake::script`), on the seeds of `fuzz/corpus/module`.
#[test]
fn fuzz_scripts_decode_into_whole_exchanges() {
    let run = |data: &[u8]| {
        let script = fake::script(data);
        let e = fake::run_script("/v1/responses", &script);
        (e, script.steps)
    };
    let (e, steps) = run(&[0x00, 0x00, 0x43, 0x02, 0x12, 0x03, 0x02, 0x03, 0x45]);
    let text = String::from_utf8(e.client.body.clone()).unwrap();
    assert!(
        text.contains("event: response.completed\n"),
        "{steps:?}: {text}"
    );
    let (e, steps) = run(&[0x00, 0x00, 0x42, 0x02, 0x05, 0x03, 0x41]);
    assert_eq!(e.client.reply.map(|r| r.status), Some(429), "{steps:?}");
    let (e, steps) = run(&[0x00, 0x00, 0x43, 0x02, 0x12, 0x03, 0x02, 0x06, 0x00]);
    let text = String::from_utf8(e.client.body.clone()).unwrap();
    assert!(
        text.contains("event: response.failed\n"),
        "{steps:?}: {text}"
    );
    // Compressed (bit 1): the gzipped stream request is read as work, then answered.
    let (e, steps) = run(&[
        0x02, 0x00, 0x43, 0x06, 0x01, 0x02, 0x12, 0x03, 0x02, 0x03, 0x45,
    ]);
    assert_eq!(e.host.works_started, 1, "{steps:?}");
    assert!(matches!(steps[1], fake::Step::Work), "{steps:?}");
    let text = String::from_utf8(e.client.body.clone()).unwrap();
    assert!(
        text.contains("event: response.completed\n"),
        "{steps:?}: {text}"
    );
    // The answer's head before the work is done: Envoy's own reply, never translated.
    let (e, steps) = run(&[0x02, 0x00, 0x43, 0x02, 0x12, 0x06, 0x01]);
    assert!(e.upstream.headers.is_none(), "{steps:?}");
    assert!(
        e.client.reply.is_some() || e.client.reset,
        "{steps:?}: {:?}",
        e.client
    );
}

/// A translated answer is a 200, whatever 2xx the upstream answered with (the fuzz target
/// found a 201 stream going out as 201).
#[test]
fn translated_answers_are_200_whatever_the_upstreams_2xx() {
    let mut e = envoy();
    post(
        &mut e,
        &json!({"model": "m", "input": "hi", "stream": true}),
    );
    e.response_headers(201, "text/event-stream", false);
    assert_eq!(header(&e.client.headers, ":status"), Some("200"));
    let mut e = envoy();
    post(&mut e, &json!({"model": "m", "input": "hi"}));
    e.response_headers(201, "application/json", false);
    e.response_body(CHAT.as_bytes(), true);
    assert_eq!(header(&e.client.headers, ":status"), Some("200"));
    e.assert_fail_closed("/v1/chat/completions");
}

/// A fake Envoy that traces the request (its span starts empty).
fn traced() -> FakeEnvoy {
    let mut e = envoy();
    e.host.span = Some(FakeSpan::default());
    e
}

fn span(e: &FakeEnvoy) -> &FakeSpan {
    e.host.span.as_ref().expect("a traced request")
}

fn tag<'a>(e: &'a FakeEnvoy, key: &str) -> Option<&'a str> {
    span(e).tags.get(key).map(String::as_str)
}

#[test]
fn envoys_span_gets_the_exchanges_attributes_and_name() {
    let mut e = traced();
    post(
        &mut e,
        &json!({"model": "m", "input": "a secret prompt", "temperature": 0.25,
            "max_output_tokens": 64}),
    );
    e.response_headers(200, "application/json", false);
    assert!(span(&e).tags.is_empty(), "tagged at the end only");
    let chat = r#"{"id":"c1","model":"llama","choices":[{"index":0,"finish_reason":"stop","message":{"content":"a private completion"}}],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18,"prompt_tokens_details":{"cached_tokens":3},"completion_tokens_details":{"reasoning_tokens":2}}}"#;
    e.response_body(chat.as_bytes(), true);
    e.complete();
    let answer: Value = serde_json::from_slice(&e.client.body).unwrap();
    assert_eq!(span(&e).name.as_deref(), Some("chat m"));
    assert_eq!(
        (span(&e).tag_calls, span(&e).lost),
        (1, 0),
        "one batch, in time"
    );
    for (key, value) in [
        ("gen_ai.operation.name", "chat"),
        ("gen_ai.provider.name", "openai"),
        ("gen_ai.request.model", "m"),
        ("gen_ai.request.stream", "false"),
        ("gen_ai.request.temperature", "0.25"),
        ("gen_ai.request.max_tokens", "64"),
        ("gen_ai.response.id", answer["id"].as_str().unwrap()),
        ("gen_ai.response.model", "llama"),
        ("gen_ai.response.finish_reasons", r#"["stop"]"#),
        ("gen_ai.usage.input_tokens", "11"),
        ("gen_ai.usage.output_tokens", "7"),
        ("gen_ai.usage.cache_read.input_tokens", "3"),
        ("gen_ai.usage.reasoning.output_tokens", "2"),
        ("http.response.status_code", "200"),
        ("responses_extproc.outcome", "translated"),
        ("responses_extproc.operation", "create"),
        ("responses_extproc.transport", "module"),
    ] {
        assert_eq!(tag(&e, key), Some(value), "{key}: {:?}", span(&e).tags);
    }
    // The answer's usage, as the client got it.
    assert_eq!(answer["usage"]["input_tokens"], 11);
    for absent in [
        "gen_ai.request.top_p",
        "gen_ai.response.time_to_first_chunk",
        "error.type",
    ] {
        assert_eq!(tag(&e, absent), None, "{absent}");
    }
    let busy: f64 = tag(&e, "responses_extproc.translation.duration")
        .unwrap()
        .parse()
        .unwrap();
    assert!(busy > 0.0);
    // Never the prompt or the completion.
    for value in span(&e).tags.values() {
        assert!(
            !value.contains("secret") && !value.contains("private"),
            "{value}"
        );
    }
    assert!(span(&e).events.is_empty());
}

#[test]
fn a_streams_first_output_is_an_event_on_envoys_span() {
    let mut e = traced();
    post(
        &mut e,
        &json!({"model": "m", "input": "hi", "stream": true}),
    );
    e.response_headers(200, "text/event-stream", false);
    e.response_body(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
        false,
    );
    assert!(span(&e).events.is_empty(), "no output yet");
    e.response_body(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n",
        false,
    );
    assert_eq!(span(&e).events, ["first_token"]);
    e.response_body(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\ndata: [DONE]\n\n",
        true,
    );
    e.complete();
    assert_eq!(span(&e).events, ["first_token"], "once");
    assert_eq!(tag(&e, "gen_ai.request.stream"), Some("true"));
    assert_eq!(
        tag(&e, "gen_ai.response.finish_reasons"),
        Some(r#"["length"]"#)
    );
    assert_eq!(tag(&e, "gen_ai.usage.output_tokens"), Some("2"));
    assert_eq!(tag(&e, "responses_extproc.outcome"), Some("translated"));
    let ttfc: f64 = tag(&e, "gen_ai.response.time_to_first_chunk")
        .expect("a stream's first output")
        .parse()
        .unwrap();
    assert!(ttfc >= 0.0);
}

#[test]
fn failed_refused_cut_and_panicked_exchanges_tag_their_error() {
    // The upstream's 429: the envelope's code.
    let mut e = traced();
    post(&mut e, &json!({"model": "m", "input": "hi"}));
    e.response_headers(429, "application/json", false);
    e.response_body(
        br#"{"error":{"message":"slow down","code":"rate_limited"}}"#,
        true,
    );
    let r = e.client.reply.clone().expect("an envelope");
    let envelope: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(
        tag(&e, "error.type"),
        envelope["error"]["code"].as_str(),
        "{:?}",
        span(&e).tags
    );
    assert_eq!(tag(&e, "http.response.status_code"), Some("429"));
    assert_eq!(tag(&e, "responses_extproc.outcome"), Some("failed"));
    assert_eq!(span(&e).name.as_deref(), Some("chat m"));
    assert_eq!(tag(&e, "gen_ai.usage.input_tokens"), None);
    assert_eq!(span(&e).lost, 0, "tagged before the reply ended the span");
    // Refused before its model was read: Envoy's span keeps its name.
    let mut e = traced();
    e.request_headers(&POST, false);
    e.request_body(b"[1]", true);
    let r = e.client.reply.clone().expect("an envelope");
    let envelope: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(tag(&e, "error.type"), envelope["error"]["code"].as_str());
    assert_eq!(tag(&e, "gen_ai.request.model"), None);
    assert_eq!(span(&e).name, None);
    assert_eq!(span(&e).lost, 0, "tagged before the reply ended the span");
    // A panic mid-stream: tagged with the stream's failed ending.
    let mut e = traced();
    post(
        &mut e,
        &json!({"model": "m", "input": "hi", "stream": true}),
    );
    e.response_headers(200, "text/event-stream", false);
    e.panic();
    assert_eq!(tag(&e, "error.type"), Some("internal_error"));
    e.complete();
    assert_eq!((span(&e).tag_calls, span(&e).lost), (1, 0));
    // Cut by Envoy mid-stream: Envoy has finished its span when it says so; nothing is
    // tagged, nothing is attempted.
    let mut e = traced();
    post(
        &mut e,
        &json!({"model": "m", "input": "hi", "stream": true}),
    );
    e.response_headers(200, "text/event-stream", false);
    e.complete();
    assert_eq!(
        span(&e),
        &FakeSpan {
            finished: true,
            ..FakeSpan::default()
        }
    );
}

#[test]
fn without_tracing_the_span_is_looked_up_and_nothing_else() {
    let mut e = envoy();
    post(
        &mut e,
        &json!({"model": "m", "input": "hi", "stream": true}),
    );
    e.response_headers(200, "text/event-stream", false);
    e.response_body(
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n",
        true,
    );
    e.complete();
    assert!(e.client.ended);
    // At the first output and at the end; each finds no span (the fake would panic on a
    // tag without one).
    assert_eq!(e.host.span_lookups, 2);
    assert!(e.host.span.is_none());
}

// What Envoy reports of a stream the filter answers itself (callouts, timer, drain,
// watermarks), to an HTTP exchange, which starts none of it.

#[test]
fn an_exchange_resets_a_callout_it_did_not_start_and_is_otherwise_unmoved() {
    let mut e = envoy();
    post(&mut e, &json!({"model": "m", "input": "hi"}));
    // Envoy reports a callout this exchange never started (a stale or foreign id): the
    // exchange cancels it, at each event that says it still runs.
    e.callout_headers(7, 200, &[("content-type", "text/event-stream")], false);
    e.callout_data(7, b"data: {}\n\n", false);
    e.callout_trailers(7, &[("x-end", "1")]);
    assert_eq!(e.host.callout_resets, [7, 7, 7]);
    e.callout_complete(7);
    e.callout_reset(7, CalloutReset::RemoteReset);
    assert_eq!(
        e.host.callout_resets.len(),
        3,
        "its last events need nothing"
    );
    let warned = e.host.logs.borrow().iter().any(|(level, line)| {
        *level == Level::Warn && line.contains("callout 7 this exchange did not start")
    });
    assert!(warned);
    // A timer, drain or watermark event reaches it only if Envoy misroutes one: nothing moves.
    assert!(!e.fire_timer(), "nothing armed");
    e.host.timer = Some(std::time::Instant::now());
    assert!(e.fire_timer());
    e.host.drain_watched = true;
    e.drain();
    e.watermark(true);
    e.watermark(false);
    assert!(e.host.callouts.is_empty());
    assert_eq!(e.host.answer, OwnAnswer::default());
    assert!(e.host.timer.is_none());
    assert!(e.client.reply.is_none() && !e.client.reset);
    // The exchange goes on as if nothing happened.
    e.response_headers(200, "application/json", false);
    e.response_body(CHAT.as_bytes(), true);
    assert!(e.client.ended);
    let answer: Value = serde_json::from_slice(&e.client.body).unwrap();
    assert_eq!(answer["status"], "completed");
    e.assert_fail_closed("/v1/chat/completions");
}

#[test]
fn the_fake_keeps_envoys_rules_for_callouts() {
    let mut host = FakeHost::default();
    let head = [
        (":method", "POST"),
        (":path", "/v1/chat/completions"),
        ("host", "upstream"),
    ];
    fn callout<'a>(headers: &'a [(&'a str, &'a str)]) -> Callout<'a> {
        Callout {
            cluster: "upstream",
            headers,
            body: b"{",
            end: false,
            timeout: None,
        }
    }
    assert_eq!(
        host.start_callout(&callout(&[(":method", "POST"), (":path", "/")])),
        Err(CalloutRefused::MissingHeaders)
    );
    let head = &head[..];
    assert_eq!(host.start_callout(&callout(head)), Ok(CalloutId(1)));
    assert_eq!(host.start_callout(&callout(head)), Ok(CalloutId(2)));
    host.refuse_callouts = Some(CalloutRefused::NoCluster);
    assert_eq!(
        host.start_callout(&callout(head)),
        Err(CalloutRefused::NoCluster)
    );
    // The request body goes on until it ends.
    assert!(host.send_callout_data(CalloutId(1), b"}", true));
    assert!(!host.send_callout_data(CalloutId(1), b"more", false));
    assert_eq!(host.callouts[&1].body, b"{}");
    assert!(host.send_callout_trailers(CalloutId(2), &[("x", "y")]));
    assert!(host.callouts[&2].ended);
    // A reset is reported from inside the call (delivered after it); an unknown id is ignored.
    host.reset_callout(CalloutId(1));
    host.reset_callout(CalloutId(9));
    assert_eq!(
        Vec::from(host.reported.clone()),
        [Deferred::CalloutReset(
            CalloutId(1),
            CalloutReset::LocalReset
        )]
    );
    assert_eq!(host.callout_resets, [1, 9]);
    assert!(!host.send_callout_trailers(CalloutId(1), &[]));
    // Timer, drain and watermark state.
    let at = std::time::Instant::now();
    host.arm_timer(at);
    assert_eq!(host.timer, Some(at));
    host.disarm_timer();
    assert_eq!(host.timer, None);
    assert!(!host.watch_drain());
    host.draining = true;
    assert!(host.watch_drain());
    assert!(!host.write_blocked());
    // The filter's own answer: a head with :status, data, trailers that end it.
    host.send_headers(&[(":status", "101"), ("upgrade", "websocket")], false);
    host.send_data(b"\x81\x02hi", false);
    host.send_trailers(&[("x-done", "1")]);
    assert!(host.answer.ended);
    assert_eq!(host.answer.body, b"\x81\x02hi");
}

#[test]
#[should_panic(expected = "answer data after its end")]
fn the_fake_refuses_answer_data_after_its_end() {
    let mut host = FakeHost::default();
    host.send_headers(&[(":status", "200")], true);
    host.send_data(b"late", false);
}

// An automatic compaction (`context_management`): its summarising call is a callout to
// `upstream_cluster` while Envoy holds the request; the compacted turn then resumes it.

/// Three user turns, over a threshold of 50 estimated tokens.
fn compacting(stream: bool) -> Value {
    json!({"model": "m", "stream": stream, "store": false,
    "context_management": [{"type": "compaction", "compact_threshold": 50}],
    "input": [
        {"role": "user", "content": "Tell me about cats, at length, with every detail you know."},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Cats are small carnivorous mammals.", "annotations": []}]},
        {"role": "user", "content": "And their whiskers?"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Whiskers sense the air around them.", "annotations": []}]},
        {"role": "user", "content": "Now dogs."}
    ]})
}

const SUMMARY: &str = r#"{"model":"m","choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"The user asked about cats and whiskers."}}],"usage":{"prompt_tokens":90,"completion_tokens":9,"total_tokens":99}}"#;

fn post_compacting(e: &mut FakeEnvoy, stream: bool) {
    e.request_headers(
        &[
            (":method", "POST"),
            (":path", "/v1/responses"),
            (":authority", "api.example"),
            ("authorization", "Bearer sk-client"),
            ("cookie", "session=secret"),
            ("x-request-id", "req-1"),
            ("traceparent", CLIENT_TRACEPARENT),
            ("tracestate", "client=1"),
        ],
        false,
    );
    e.request_body(compacting(stream).to_string().as_bytes(), true);
}

const CLIENT_TRACEPARENT: &str = "00-11111111111111111111111111111111-2222222222222222-01";

#[test]
fn an_untraced_side_call_carries_the_clients_trace_context() {
    let mut e = envoy();
    post_compacting(&mut e, false);
    let call = e.host.callouts.values().next().expect("a callout");
    let head = |name: &str| {
        call.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(head("traceparent"), Some(CLIENT_TRACEPARENT));
    assert_eq!(head("tracestate"), Some("client=1"));
}

#[test]
fn a_due_compaction_is_a_callout_then_the_compacted_turn_goes_upstream() {
    let mut e = envoy();
    e.host.span = Some(FakeSpan::default());
    post_compacting(&mut e, false);
    // Held: nothing upstream yet; one callout, bounded by the timer.
    assert!(e.upstream.headers.is_none() && e.upstream.body.is_empty());
    assert_eq!(e.host.callouts.len(), 1);
    let (&id, call) = e.host.callouts.iter().next().unwrap();
    assert_eq!(call.cluster, "responses_loopback");
    assert!(call.ended);
    let head = |name: &str| {
        call.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(head(":path"), Some("/v1/chat/completions"));
    assert_eq!(head(":authority"), Some("api.example"));
    assert_eq!(head("authorization"), Some("Bearer sk-client"));
    assert_eq!(head("cookie"), None);
    // It continues the exchange's span (Envoy's for the stream), not the client's.
    let stream_span = format!("00-{}-00000000000000ff-01", fake::FAKE_TRACE_ID);
    assert_eq!(head("traceparent"), Some(stream_span.as_str()));
    assert_eq!(head("tracestate"), None);
    let length = call.body.len().to_string();
    assert_eq!(head("content-length"), Some(length.as_str()));
    let chat: Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(chat["stream"], false);
    assert!(chat["messages"].to_string().contains("whiskers?"));
    assert!(e.host.timer.is_some());
    // Its answer, in two pieces: the turn, on the compacted window, resumes the request.
    e.callout_headers(id, 200, &[("content-type", "application/json")], false);
    e.callout_data(id, &SUMMARY.as_bytes()[..30], false);
    assert!(e.upstream.headers.is_none());
    e.callout_data(id, &SUMMARY.as_bytes()[30..], true);
    assert!(e.host.timer.is_none(), "disarmed");
    assert_eq!(e.host.callout_resets, Vec::<u64>::new());
    let chat = upstream_json(&e);
    let sent = chat["messages"].to_string();
    assert!(sent.contains("cats and whiskers") && sent.contains("Now dogs."));
    assert!(!sent.contains("whiskers?"), "{sent}");
    assert_eq!(
        header(&e.upstream.headers, ":path"),
        Some("/v1/chat/completions")
    );
    let length = e.upstream.body.len().to_string();
    assert_eq!(
        header(&e.upstream.headers, "content-length"),
        Some(length.as_str())
    );
    e.response_headers(200, "application/json", false);
    e.response_body(CHAT.as_bytes(), true);
    e.complete();
    let answer: Value = serde_json::from_slice(&e.client.body).unwrap();
    assert_eq!(answer["output"][0]["type"], "compaction", "{answer}");
    assert_eq!(answer["output"][1]["content"][0]["text"], "yo");
    assert_eq!(answer["usage"]["input_tokens"], 101, "{answer}");
    let span = e.host.span.as_ref().unwrap();
    assert!(span.events.iter().any(|ev| ev == "compaction"), "{span:?}");
    assert_eq!(
        metadata(&e, "compaction"),
        Some(MetadataValue::Str("compacted".into()))
    );
    e.assert_fail_closed("/v1/chat/completions");
}

#[test]
fn a_failing_hanging_or_refused_side_call_ends_with_its_envelope() {
    type Case = fn(&mut FakeEnvoy, u64);
    let cases: [(&str, Case, u16, &str); 6] = [
        (
            "500",
            |e, id| {
                e.callout_headers(id, 500, &[("content-type", "application/json")], false);
                e.callout_data(id, br#"{"error":{"message":"boom"}}"#, true);
            },
            500,
            "server_error",
        ),
        (
            "garbage",
            |e, id| {
                e.callout_headers(id, 200, &[("content-type", "application/json")], false);
                e.callout_data(id, b"{not json", true);
            },
            502,
            "upstream_invalid_response",
        ),
        (
            "reset",
            |e, id| {
                e.callout_headers(id, 200, &[("content-type", "application/json")], false);
                e.callout_reset(id, CalloutReset::RemoteReset);
            },
            503,
            "upstream_unavailable",
        ),
        (
            "no status",
            |e, id| {
                let f = &mut e.filter;
                f.callout_headers(&mut e.host, CalloutId(id), &[], false);
            },
            503,
            "upstream_unavailable",
        ),
        (
            "hang",
            |e, id| {
                e.callout_headers(id, 200, &[("content-type", "application/json")], false);
                assert!(e.fire_timer());
            },
            504,
            "upstream_timeout",
        ),
        ("refused", |_, _| {}, 503, "upstream_unavailable"),
    ];
    for stream in [false, true] {
        for (what, run, status, code) in cases {
            let mut e = envoy();
            if what == "refused" {
                e.host.refuse_callouts = Some(CalloutRefused::NoCluster);
            }
            post_compacting(&mut e, stream);
            if let Some(&id) = e.host.callouts.keys().next() {
                run(&mut e, id);
                // An open callout is cancelled once its answer is no longer read.
                if what == "hang" || what == "no status" {
                    assert_eq!(e.host.callout_resets, [id], "{what}");
                }
            }
            let reply = e
                .host
                .replies
                .last()
                .cloned()
                .unwrap_or_else(|| panic!("{what}"));
            assert_eq!(reply.status, status, "{what} stream={stream}");
            let v: Value = serde_json::from_slice(&reply.body).unwrap();
            assert_eq!(v["error"]["code"], code, "{what}: {v}");
            assert!(
                v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("context_management"),
                "{what}: {v}"
            );
            assert!(e.upstream.headers.is_none(), "{what}: the turn is not sent");
            assert!(e.host.timer.is_none(), "{what}: disarmed");
            e.complete();
            e.assert_fail_closed("/v1/chat/completions");
        }
    }
}

#[test]
fn a_side_call_still_running_when_the_stream_ends_is_reset() {
    let mut e = envoy();
    post_compacting(&mut e, false);
    let id = *e.host.callouts.keys().next().unwrap();
    e.complete();
    assert_eq!(e.host.callout_resets, [id]);
    assert!(e.host.timer.is_none());
    assert!(e.upstream.headers.is_none());
    // Its late events are no one's.
    e.callout_headers(id, 200, &[("content-type", "application/json")], false);
    assert!(e.upstream.headers.is_none() && e.client.reply.is_none());
}

#[test]
fn a_turns_record_gets_its_metadata_once_and_a_guess_gets_404() {
    use responses_core::exchange::Settings;
    use responses_core::metadata::record::Record;
    use responses_core::metadata::MetadataValue;
    let fields = vec![
        ("total_tokens", MetadataValue::Num(18.0)),
        ("socket_id", MetadataValue::Str("up-1".into())),
    ];
    let record = Record::new(&Settings::default(), uuid(), Vec::new(), fields);
    crate::record::RECORDS.file(record.token, record.fields.clone());
    // As the internal listener's filter gets it: the metadata set, the request passed on
    // (Envoy's route answers it).
    let mut e = envoy();
    e.request_headers(&[(":method", "POST"), (":path", &record.path)], true);
    assert!(e.upstream.ended, "passed on");
    let md = |e: &FakeEnvoy, key: &str| {
        e.host
            .metadata
            .get(&("responses_extproc".to_owned(), key.to_owned()))
            .cloned()
    };
    assert_eq!(md(&e, "total_tokens"), Some(MetadataValue::Num(18.0)));
    assert_eq!(md(&e, "socket_id"), Some(MetadataValue::Str("up-1".into())));
    e.response_headers(204, "", true);
    e.complete();
    // Taken once: again, or a guess, is a 404 and nothing is set.
    for path in [
        record.path.clone(),
        format!("/v1/responses/turns/{:032x}", uuid()),
    ] {
        let mut e = envoy();
        e.request_headers(&[(":method", "POST"), (":path", &path)], true);
        let reply = e.client.reply.clone().expect("a local reply");
        assert_eq!(reply.status, 404);
        let body: Value = serde_json::from_slice(&reply.body).unwrap();
        assert_eq!(body["error"]["code"], "not_found", "{body}");
        assert!(e.host.metadata.is_empty());
        assert!(e.upstream.headers.is_none(), "nothing passed on");
    }
}

/// A token no other test files.
fn uuid() -> u128 {
    use responses_core::environment::{Environment, System};
    System.id_seed()
}
