//! Automatic compaction (`context_management`) through the driver: the summarising call as an
//! action, its answer reported back, the turn on the compacted window, the `compaction` item
//! leading the output (JSON and stream), and every way the call can fail.

use super::*;
use crate::call::AnswerHead;
use crate::exchange::CompactionOutcome;
use crate::life::CallTiming;
use crate::translate::compact::{CONTEXT_PREFIX, PROMPT};
use crate::translate::seal::Keyring;

/// A summary the fake upstream answers the summarising call with.
const SUMMARY: &[u8] = br#"{"model":"llama","choices":[{"index":0,"finish_reason":"stop","message":{"content":"They talked about cats."}}],"usage":{"prompt_tokens":100,"completion_tokens":5,"total_tokens":105}}"#;

fn keyed() -> Settings {
    Settings {
        options: Options {
            keyring: Some(Arc::new(Keyring::single("k", [1; 32]).unwrap())),
            ..Options::default()
        },
        ..Settings::default()
    }
}

/// A conversation of three user turns with a threshold its estimate crosses.
fn long(stream: bool, threshold: u64) -> Value {
    json!({
        "model": "m",
        "stream": stream,
        "instructions": "Be brief.",
        "context_management": [{"type": "compaction", "compact_threshold": threshold}],
        "input": [
            {"role": "user", "content": "Tell me about cats, at length, with every detail you know."},
            {"role": "assistant", "content": "Cats are small carnivorous mammals, domesticated long ago."},
            {"role": "user", "content": "And their whiskers?"},
            {"role": "assistant", "content": "Whiskers sense the air around them."},
            {"role": "user", "content": "Now dogs."}
        ]
    })
}

/// The request read and its summarising call asked for.
fn calling(t: &mut Test, request: &Value) -> (Call, Duration) {
    let head = [
        (":method", "POST"),
        (":path", "/v1/responses"),
        ("authorization", "Bearer client-key"),
        ("cookie", "not forwarded"),
    ];
    assert!(matches!(t.head(0, &head, false), Action::ReadBody(_)));
    let body = request.to_string();
    match t.body(1, &[body.as_bytes()], true) {
        Action::Call { call, bound } => (call, bound),
        other => panic!("no call: {other:?}"),
    }
}

fn call_answer(t: &mut Test, id: CallId, ms: u64, status: u16, body: &[u8]) -> Action {
    let now = t.at(ms);
    let pairs = [("content-type", "application/json")];
    assert!(matches!(
        AnswerHead(&pairs).report(status, |head| t.d.handle_call_head(now, id, head)),
        Action::Hold
    ));
    let (a, b) = body.split_at(body.len() / 2);
    assert!(matches!(t.d.handle_call_data(now, id, a), Action::Hold));
    assert!(matches!(t.d.handle_call_data(now, id, b), Action::Hold));
    t.d.handle_call_end(t.at(ms + 1), id)
}

fn compaction_of(events: &[Event]) -> Option<crate::exchange::Compaction> {
    finished(events)[0].summary.compaction
}

#[test]
fn over_the_threshold_the_turn_runs_on_the_compacted_window() {
    let mut t = Test::with(keyed(), Gathering::Pieces);
    let (call, bound) = calling(&mut t, &long(false, 10));
    let timeout = Settings::default().compaction_timeout;
    assert_eq!(bound, timeout + CALL_GRACE);
    assert_eq!(t.d.poll_timeout(), Some(t.at(1) + timeout));
    assert_eq!(t.d.call_in_flight(), Some(call.id));
    assert_eq!(call.path, "/v1/chat/completions");
    // The host adds the client's credentials (call::forwarded); nothing of the head is copied.
    let header = |name: &str| {
        call.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(header("authorization"), None);
    assert_eq!(header("cookie"), None);
    assert_eq!(header("accept"), Some("application/json"));
    assert_eq!(header("x-responses-model"), Some("m"));
    // The summarising request of /v1/responses/compact: its prompt, the whole window, not
    // streamed.
    let chat: Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(chat["stream"], false);
    let system = chat["messages"][0]["content"].as_str().unwrap();
    assert!(system.starts_with(PROMPT) && system.contains("Be brief."));
    assert!(call.body.windows(4).any(|w| w == b"cats"));
    assert!(t
        .events(1)
        .iter()
        .any(|e| matches!(e, Event::Claimed { .. })));

    let Action::Forward { edits, request } = call_answer(&mut t, call.id, 50, 200, SUMMARY) else {
        panic!("the turn is not forwarded")
    };
    assert_eq!(t.d.call_in_flight(), None);
    assert_eq!(
        set(&edits, "content-length"),
        Some(request.body.len().to_string())
    );
    // The turn: the instructions, the summary as context, the latest user message; the
    // earlier turns are gone.
    let chat: Value = serde_json::from_slice(&request.body).unwrap();
    let texts: Vec<String> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| format!("{}: {}", m["role"].as_str().unwrap(), m["content"]))
        .collect();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(texts[0].starts_with("system: \"Be brief."), "{texts:?}");
    assert!(
        texts[0].contains(&format!("{CONTEXT_PREFIX}They talked about cats.").replace('\n', "\\n"))
    );
    assert_eq!(texts[1], "user: \"Now dogs.\"");
    let events = t.events(51);
    let timing = events.iter().find_map(|e| match e {
        Event::Call(timing) => Some(*timing),
        _ => None,
    });
    let Some(CallTiming {
        started,
        took,
        compaction,
    }) = timing
    else {
        panic!("no call event: {events:?}")
    };
    assert_eq!((started, took), (ms(1), ms(50)));
    assert_eq!(
        compaction.map(|c| c.outcome),
        Some(CompactionOutcome::Compacted)
    );

    assert!(matches!(
        t.answer_head(60, "200", "application/json", false),
        Action::ReadBody(_)
    ));
    let Action::Answer { answer, .. } = t.answer(61, &[CHAT], true) else {
        panic!("not answered")
    };
    let v: Value = serde_json::from_slice(&answer.body).unwrap();
    let output = v["output"].as_array().unwrap();
    assert_eq!(output.len(), 2);
    assert_eq!(output[0]["type"], "compaction");
    assert!(output[0]["encrypted_content"].as_str().unwrap().len() > 20);
    assert_eq!(output[1]["content"][0]["text"], "yo");
    // Both requests were spent: usage counts them together.
    assert_eq!(v["usage"]["input_tokens"], 111);
    assert_eq!(v["usage"]["output_tokens"], 12);
    assert_eq!(v["usage"]["total_tokens"], 123);
    let events = t.events(62);
    let c = compaction_of(&events).unwrap();
    assert_eq!(c.outcome, CompactionOutcome::Compacted);
    assert_eq!(c.threshold, 10);
    assert!(c.estimate > 10);
    assert_eq!(c.usage.map(|u| u.input_tokens), Some(100));

    // The client sends its history back with the output appended: the compaction item
    // stands for what came before it, and a new threshold above the window runs no call.
    let mut next = long(false, 100_000);
    let items = next["input"].as_array_mut().unwrap();
    items.push(output[0].clone());
    items.push(json!({"role": "assistant", "content": "yo"}));
    items.push(json!({"role": "user", "content": "And birds?"}));
    let mut t = Test::with(keyed(), Gathering::Pieces);
    assert!(matches!(t.post(0), Action::ReadBody(_)));
    let body = next.to_string();
    let Action::Forward { request, .. } = t.body(1, &[body.as_bytes()], true) else {
        panic!("not forwarded")
    };
    let chat: Value = serde_json::from_slice(&request.body).unwrap();
    let roles: Vec<&str> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    // Instructions + summary, the turn's user message, the answer, the new message.
    assert_eq!(roles, ["system", "user", "assistant", "user"], "{chat}");
    assert!(!request.body.windows(8).any(|w| w == b"whiskers"));
}

#[test]
fn a_compacting_stream_starts_with_the_compaction_item() {
    let mut t = Test::with(keyed(), Gathering::Whole);
    let (call, _) = calling(&mut t, &long(true, 10));
    // The summarising call itself is one JSON answer.
    let chat: Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(chat["stream"], false);
    let Action::Forward { request, .. } = call_answer(&mut t, call.id, 5, 200, SUMMARY) else {
        panic!("the turn is not forwarded")
    };
    let chat: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(chat["stream"], true);
    assert!(matches!(
        t.answer_head(10, "200", "text/event-stream", false),
        Action::OpenStream(_)
    ));
    let mut text = String::new();
    for piece in [ROLE, CHUNK] {
        if let Action::Send { events, .. } = t.answer(11, &[piece], false) {
            text.push_str(&String::from_utf8_lossy(&events));
        }
    }
    // The compaction item is not the model's output: the first output is the text.
    let events = t.events(11);
    assert!(matches!(
        events.iter().find(|e| matches!(e, Event::FirstOutput { .. })),
        Some(Event::FirstOutput { elapsed }) if *elapsed == ms(11)
    ));
    let Action::Send { events, end: true } = t.answer(12, &[END], true) else {
        panic!("not ended")
    };
    text.push_str(&String::from_utf8_lossy(&events));
    let data: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let order: Vec<String> = data
        .iter()
        .map(|e| {
            let kind = e["type"].as_str().unwrap();
            match e.get("item") {
                Some(item) => format!(
                    "{kind} {} {}",
                    e["output_index"],
                    item["type"].as_str().unwrap()
                ),
                None => kind.to_owned(),
            }
        })
        .collect();
    // The order of a compacting stream, pinned.
    assert_eq!(
        order,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added 0 compaction",
            "response.compaction.compacting",
            "response.output_item.done 0 compaction",
            "response.output_item.added 1 message",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done 1 message",
            "response.completed",
        ],
        "{text}"
    );
    let seqs: Vec<u64> = data
        .iter()
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1), "{seqs:?}");
    // Added with nothing sealed yet, done with the sealed summary; the completed response
    // lists it first.
    assert_eq!(data[2]["item"]["encrypted_content"], "");
    assert_eq!(data[3]["item_id"], data[2]["item"]["id"]);
    assert!(data[4]["item"]["encrypted_content"].as_str().unwrap().len() > 20);
    let completed = &data.last().unwrap()["response"];
    assert_eq!(completed["output"][0], data[4]["item"]);
    assert_eq!(completed["output"][1]["type"], "message");
    assert_eq!(
        compaction_of(&t.events(13)).map(|c| c.outcome),
        Some(CompactionOutcome::Compacted)
    );
}

/// The client's cap is on its answer: the summarising call goes without it (a summary cut at
/// the turn's `max_output_tokens` would lose the conversation), and the turn after it has it.
/// The sampling parameters go to both.
#[test]
fn the_summarising_call_goes_without_the_clients_output_cap() {
    let mut t = Test::with(keyed(), Gathering::Pieces);
    let mut request = long(false, 10);
    request["max_output_tokens"] = json!(16);
    request["temperature"] = json!(0.5);
    let (call, _) = calling(&mut t, &request);
    let chat: Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(chat.get("max_completion_tokens"), None, "{chat}");
    assert_eq!(chat["temperature"], 0.5);
    let Action::Forward { request, .. } = call_answer(&mut t, call.id, 50, 200, SUMMARY) else {
        panic!("the turn is not forwarded")
    };
    let chat: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(chat["max_completion_tokens"], 16);
    assert_eq!(chat["temperature"], 0.5);
}

#[test]
fn below_the_threshold_or_without_the_field_nothing_is_compacted() {
    for request in [
        long(false, 1_000_000),
        {
            let mut r = long(false, 10);
            r.as_object_mut().unwrap().remove("context_management");
            r
        },
        // One user message: nothing before it to compact.
        json!({"model": "m", "input": "hi",
               "context_management": [{"type": "compaction", "compact_threshold": 1}]}),
        // No threshold: the model's window is unknown here.
        {
            let mut r = long(false, 10);
            r["context_management"] = json!([{"type": "compaction"}]);
            r
        },
    ] {
        let mut t = Test::with(keyed(), Gathering::Pieces);
        t.forwarded(request.clone());
        assert!(matches!(
            t.answer_head(2, "200", "application/json", false),
            Action::ReadBody(_)
        ));
        let Action::Answer { answer, .. } = t.answer(3, &[CHAT], true) else {
            panic!("not answered")
        };
        let v: Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(v["output"][0]["type"], "message", "{request}");
        assert_eq!(compaction_of(&t.events(4)), None);
    }
}

#[test]
fn bad_context_management_is_refused_naming_the_param() {
    for (entries, param, code) in [
        (
            json!([{"type": "truncate"}]),
            "context_management[0].type",
            "invalid_value",
        ),
        (
            json!([{"type": "compaction", "compact_threshold": 0}]),
            "context_management[0].compact_threshold",
            "invalid_value",
        ),
        (
            json!([{"type": "compaction", "compact_threshold": -5}]),
            "context_management[0].compact_threshold",
            "invalid_value",
        ),
        (
            json!([{"type": "compaction", "compact_threshold": "1000"}]),
            "context_management[0].compact_threshold",
            "invalid_type",
        ),
        (
            json!([{"type": "compaction", "compact_threshold": 1.5}]),
            "context_management[0].compact_threshold",
            "invalid_value",
        ),
        (
            json!([{"type": "compaction", "ratio": 2}]),
            "context_management[0].ratio",
            "unknown_parameter",
        ),
        (
            json!([{"compact_threshold": 5}]),
            "context_management[0].type",
            "missing_required_parameter",
        ),
        (
            json!([{"type": "compaction"}, {"type": "compaction"}]),
            "context_management[1]",
            "invalid_value",
        ),
        (
            json!({"type": "compaction"}),
            "context_management",
            "invalid_type",
        ),
        (
            json!(["compaction"]),
            "context_management[0]",
            "invalid_type",
        ),
    ] {
        let mut t = Test::with(keyed(), Gathering::Pieces);
        assert!(matches!(t.post(0), Action::ReadBody(_)));
        let body = json!({"model": "m", "input": "hi", "context_management": entries}).to_string();
        let Action::Reply { error, .. } = t.body(1, &[body.as_bytes()], true) else {
            panic!("{entries}: not refused")
        };
        let v: Value = serde_json::from_slice(&error.body).unwrap();
        assert_eq!(error.status(), 400, "{entries}: {v}");
        assert_eq!(v["error"]["param"], param, "{entries}: {v}");
        assert_eq!(v["error"]["code"], code, "{entries}: {v}");
    }
    // Without keys, a compaction could not be sealed: refused, whatever the estimate.
    let mut t = Test::new(Gathering::Pieces);
    assert!(matches!(t.post(0), Action::ReadBody(_)));
    let body = long(false, 1_000_000).to_string();
    let Action::Reply { error, .. } = t.body(1, &[body.as_bytes()], true) else {
        panic!("not refused without keys")
    };
    let v: Value = serde_json::from_slice(&error.body).unwrap();
    assert_eq!(v["error"]["code"], "compaction_unavailable", "{v}");
    assert_eq!(v["error"]["param"], "context_management", "{v}");
}

/// The summarising call fails closed: each failure ends the exchange with its envelope
/// (the turn is never sent), told as a failed compaction.
#[test]
fn a_failing_summarising_call_ends_the_exchange_with_its_envelope() {
    let context_length = br#"{"error":{"message":"the request exceeds the available context size (4096 tokens)","type":"exceed_context_size_error","code":400}}"#;
    enum How {
        Status(u16, &'static [u8]),
        Failed,
        TimedOut,
    }
    for (how, status, code) in [
        (
            How::Status(200, b"not json at all"),
            502,
            "upstream_invalid_response",
        ),
        (
            How::Status(
                200,
                br#"{"choices":[{"index":0,"message":{"content":"  "}}]}"#,
            ),
            502,
            "upstream_invalid_response",
        ),
        (
            How::Status(400, context_length),
            400,
            "context_length_exceeded",
        ),
        (How::Status(503, b"{}"), 503, "upstream_unavailable"),
        (How::Failed, 503, "upstream_unavailable"),
        (How::TimedOut, 504, "upstream_timeout"),
    ] {
        let mut t = Test::with(keyed(), Gathering::Pieces);
        let (call, _) = calling(&mut t, &long(false, 10));
        let action = match how {
            How::Status(s, body) => call_answer(&mut t, call.id, 5, s, body),
            How::Failed => {
                t.d.handle_call_failed(t.at(5), call.id, CallFailure::Failed("reset"))
            }
            How::TimedOut => {
                t.d.handle_call_failed(t.at(5), call.id, CallFailure::TimedOut)
            }
        };
        let Action::Reply { error, cause } = action else {
            panic!("{code}: not replied: {action:?}")
        };
        assert_eq!(cause, Cause::Request);
        assert_eq!(error.status(), status, "{code}");
        let v: Value = serde_json::from_slice(&error.body).unwrap();
        assert_eq!(v["error"]["code"], code, "{v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("compaction")
                || v["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("ompacting"),
            "{v}"
        );
        assert_eq!(t.d.call_in_flight(), None);
        let events = t.events(7);
        assert_eq!(
            compaction_of(&events).map(|c| c.outcome),
            Some(CompactionOutcome::Failed),
            "{code}"
        );
        assert_eq!(
            finished(&events)[0].summary.outcome,
            Outcome::Failed,
            "{code}"
        );
    }
}

/// The driver owns the call's deadline: the host arms its timer for `poll_timeout`; a timer
/// that fires early changes nothing, one at the deadline ends the exchange (504), and the
/// call's late answer is no one's.
#[test]
fn the_calls_deadline_is_the_drivers() {
    let mut t = Test::with(keyed(), Gathering::Pieces);
    let (call, _) = calling(&mut t, &long(false, 10));
    let deadline = t.at(1) + t.d.settings().compaction_timeout;
    assert_eq!(t.d.poll_timeout(), Some(deadline));
    let early = deadline - Duration::from_millis(1);
    assert!(matches!(t.d.handle_timeout(early), Action::Hold));
    assert_eq!(t.d.call_in_flight(), Some(call.id));
    assert_eq!(t.d.poll_timeout(), Some(deadline));
    let Action::Reply { error, cause } = t.d.handle_timeout(deadline) else {
        panic!("not replied")
    };
    assert_eq!((error.status(), cause), (504, Cause::Request));
    let v: Value = serde_json::from_slice(&error.body).unwrap();
    assert_eq!(v["error"]["code"], "upstream_timeout", "{v}");
    assert_eq!(t.d.call_in_flight(), None);
    assert_eq!(t.d.poll_timeout(), None);
    assert!(matches!(
        t.d.handle_call_end(deadline, call.id),
        Action::Hold
    ));
    assert!(matches!(t.d.handle_timeout(deadline), Action::Hold));
}

/// Envoy ends the exchange while the call is in flight: cut, and the call's late answer is
/// ignored.
#[test]
fn an_exchange_cut_during_the_call_ignores_its_answer() {
    let mut t = Test::with(keyed(), Gathering::Pieces);
    let (call, _) = calling(&mut t, &long(false, 10));
    let now = t.at(3);
    t.d.handle_closed(now);
    let events = t.events(3);
    let f = finished(&events)[0];
    assert!(f.cut);
    assert_eq!(
        f.summary.compaction.map(|c| c.outcome.recorded()),
        Some("cut")
    );
    assert_eq!(t.d.call_in_flight(), None);
    assert!(matches!(call_answer_late(&mut t, call.id), Action::Hold));
    // A stale id is no answer either.
    let mut t = Test::with(keyed(), Gathering::Pieces);
    let (call, _) = calling(&mut t, &long(false, 10));
    let stale = CallId(call.id.0 + 1);
    assert!(matches!(t.d.handle_call_end(t.at(4), stale), Action::Hold));
    assert_eq!(t.d.call_in_flight(), Some(call.id));
}

fn call_answer_late(t: &mut Test, id: CallId) -> Action {
    let now = t.at(9);
    t.d.handle_call_end(now, id)
}

/// With sealed items bound to a tenant, an automatic compaction's item is sealed for the
/// exchange's tenant: it opens for that tenant's next request and is refused for another's.
#[test]
fn the_compaction_item_is_bound_to_the_exchanges_tenant() {
    let mut settings = keyed();
    settings.seal_tenant_header = Some("x-tenant".into());
    let settings = Arc::new(settings);
    let head = |tenant: &'static str| {
        [
            (":method", "POST"),
            (":path", "/v1/responses"),
            ("x-tenant", tenant),
        ]
    };
    let mut t = Test {
        d: Driver::new(settings.clone(), Fixed, Gathering::Pieces),
        t0: Instant::now(),
    };
    assert!(matches!(t.head(0, &head("a"), false), Action::ReadBody(_)));
    let body = long(false, 10).to_string();
    let Action::Call { call, .. } = t.body(1, &[body.as_bytes()], true) else {
        panic!("no call")
    };
    assert!(matches!(
        call_answer(&mut t, call.id, 5, 200, SUMMARY),
        Action::Forward { .. }
    ));
    assert!(matches!(
        t.answer_head(6, "200", "application/json", false),
        Action::ReadBody(_)
    ));
    let Action::Answer { answer, .. } = t.answer(7, &[CHAT], true) else {
        panic!("not answered")
    };
    let item = serde_json::from_slice::<Value>(&answer.body).unwrap()["output"][0].clone();
    assert_eq!(item["type"], "compaction");
    for (tenant, opens) in [("a", true), ("b", false)] {
        let mut t = Test {
            d: Driver::new(settings.clone(), Fixed, Gathering::Pieces),
            t0: Instant::now(),
        };
        assert!(matches!(
            t.head(0, &head(tenant), false),
            Action::ReadBody(_)
        ));
        let next = json!({"model": "m", "input": [item, {"role": "user", "content": "more"}]});
        let body = next.to_string();
        match t.body(1, &[body.as_bytes()], true) {
            Action::Forward { request, .. } => {
                assert!(opens, "{tenant}: opened");
                assert!(request.body.windows(6).any(|w| w == b"talked"));
            }
            Action::Reply { error, .. } => {
                assert!(!opens, "{tenant}: refused");
                assert_eq!(code(&error), "invalid_encrypted_content");
            }
            other => panic!("{other:?}"),
        }
    }
}

/// Envoy's own reply while the request is held for the call (a timeout, another filter's
/// reply), ended by trailers: an envelope, never the reply passing as it is (the module's
/// fake found it ending by trailers passed).
#[test]
fn envoys_reply_during_the_call_ended_by_trailers_is_an_envelope() {
    let mut t = Test::with(keyed(), Gathering::Pieces);
    let (call, _) = calling(&mut t, &long(false, 10));
    assert!(matches!(
        t.answer_head(2, "200", "application/json", false),
        Action::ReadBody(_)
    ));
    let now = t.at(3);
    let Action::Reply { error, cause } = t.d.handle_response_trailers(now) else {
        panic!("an envelope")
    };
    assert_eq!(cause, Cause::Answer);
    assert_eq!((error.status(), code(&error)), (502, json!("bad_gateway")));
    // The call's answer, late, is no one's.
    assert!(matches!(
        call_answer(&mut t, call.id, 4, 200, SUMMARY),
        Action::Hold
    ));
}
