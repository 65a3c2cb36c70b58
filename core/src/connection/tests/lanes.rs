//! Lanes (`stream_id`) and steering (`response.steer`).

use super::*;

fn lane_create(lane: &str, body: Value) -> Vec<u8> {
    let mut body = body;
    body["stream_id"] = json!(lane);
    create(body)
}

fn steer(target: &str, input: Value) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"type": "response.steer", "previous_response_id": target, "input": input}),
    )
    .unwrap()
}

/// The calls started since the last look (a finishing call's cancel aside).
fn started(c: &mut Client) -> Vec<Call> {
    c.calls()
        .into_iter()
        .filter_map(|a| match a {
            CallAction::Start(call) => Some(call),
            _ => None,
        })
        .collect()
}

/// Opens a response's stream: its head and a first chunk; returns its id and first events.
fn open(c: &mut Client, call: &Call) -> (String, Vec<Value>) {
    c.head(call, 200, SSE);
    let first = json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                       "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": null}]});
    c.data(call, format!("data: {first}\n\n").as_bytes());
    let events = c.texts();
    let id = events[0]["response"]["id"].as_str().unwrap().to_owned();
    (id, events)
}

/// The text of the Chat request's last message.
fn last_message(call: &Call) -> Value {
    chat(call)["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone()
}

/// A Chat stream that calls `name` with `{}` as call `call_id`.
fn tool_call_stream(call_id: &str, name: &str) -> String {
    let chunk = |delta: Value, finish: Option<&str>| {
        format!(
            "data: {}\n\n",
            json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut s = chunk(
        json!({"role": "assistant", "tool_calls": [{"index": 0, "id": call_id, "type": "function",
               "function": {"name": name, "arguments": "{}"}}]}),
        None,
    );
    s.push_str(&chunk(json!({}), Some("tool_calls")));
    s.push_str("data: [DONE]\n\n");
    s
}

#[test]
fn lanes_run_side_by_side_each_in_order_and_every_event_echoes_its_lane() {
    let mut c = Client::new();
    c.send(&lane_create("a", json!({"model": "m", "input": "one"})));
    c.send(&lane_create("b", json!({"model": "m", "input": "two"})));
    c.send(&lane_create("a", json!({"model": "m", "input": "three"})));
    let calls = started(&mut c);
    assert_eq!(
        calls.len(),
        2,
        "one call per lane: the second of lane a waits"
    );
    assert_eq!(last_message(&calls[0])["content"], "one");
    assert_eq!(last_message(&calls[1])["content"], "two");

    // Lane b ends first; lane a's first response is still in flight.
    let b = c.answer(&calls[1], "B");
    assert!(b.iter().all(|e| e["stream_id"] == "b"), "{b:?}");
    assert!(c.calls().is_empty(), "lane a's next waits for its first");
    let a = c.answer(&calls[0], "A");
    assert!(a.iter().all(|e| e["stream_id"] == "a"), "{a:?}");
    let next = started(&mut c);
    let [third] = &next[..] else {
        panic!("{next:?}")
    };
    assert_eq!(last_message(third)["content"], "three");
    let events = c.answer(third, "C");
    assert!(events.iter().all(|e| e["stream_id"] == "a"));
    assert_eq!(events[0]["sequence_number"], 0, "numbered per response");

    // Without a stream_id, no stream_id.
    let call = c.forward(&create(json!({"model": "m", "input": "x"})));
    let events = c.answer(&call, "D");
    assert!(events.iter().all(|e| e.get("stream_id").is_none()));
}

#[test]
fn a_lane_forks_from_the_last_response_of_another() {
    let mut c = Client::new();
    let call = c.forward(&lane_create("a", json!({"model": "m", "input": "hello"})));
    let first = id_of(&c.answer(&call, "hi there"));
    let call = c.forward(&lane_create(
        "b",
        json!({"model": "m", "input": "and then?", "previous_response_id": first}),
    ));
    let messages = chat(&call)["messages"].clone();
    let contents: Vec<_> = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].clone())
        .collect();
    assert_eq!(
        contents,
        [json!("hello"), json!("hi there"), json!("and then?")]
    );
    let events = c.answer(&call, "more");
    assert_eq!(events[0]["stream_id"], "b");
    assert_eq!(events[0]["response"]["previous_response_id"], json!(first));
    // A fork copies: lane a still continues its own response.
    let call = c.forward(&lane_create(
        "a",
        json!({"model": "m", "input": "again", "previous_response_id": first}),
    ));
    assert_eq!(chat(&call)["messages"].as_array().unwrap().len(), 3);
    c.answer(&call, "yes");
}

#[test]
fn lanes_are_capped_and_the_one_beyond_is_refused_on_its_lane() {
    let mut c = Client::new();
    for i in 0..MAX_LANES {
        let call = c.forward(&lane_create(
            &format!("l{i}"),
            json!({"model": "m", "input": "x"}),
        ));
        c.answer(&call, "kept");
    }
    let error = c.reject(&lane_create(
        "one-more",
        json!({"model": "m", "input": "x"}),
    ));
    assert_eq!(code(&error), "too_many_lanes");
    assert_eq!(error["stream_id"], "one-more");
    assert_eq!(error["error"]["param"], "stream_id");
    // The lanes that exist go on, and so does the lane without a name.
    let call = c.forward(&lane_create("l0", json!({"model": "m", "input": "x"})));
    c.answer(&call, "still");
    let call = c.forward(&create(json!({"model": "m", "input": "x"})));
    c.answer(&call, "unnamed");
}

#[test]
fn a_lane_or_a_steer_written_with_escapes_is_refused_not_misrouted() {
    let mut c = Client::new();
    let error =
        c.reject(br#"{"type":"response.create","model":"m","input":"x","stream\u005fid":"a"}"#);
    assert_eq!(code(&error), "invalid_value");
    assert_eq!(error["error"]["param"], "stream_id");
    let error =
        c.reject(br#"{"type":"response\u002esteer","previous_response_id":"r","input":"x"}"#);
    assert_eq!(code(&error), "invalid_value");
    // The lane of a plain key, whatever else is escaped (its value read as JSON reads it).
    let call =
        c.forward(br#"{"type":"response.create","model":"m","input":"x","stream_id":"\u0061"}"#);
    assert_eq!(c.answer(&call, "ok")[0]["stream_id"], "a");
    let call =
        c.forward(br#"{"type":"response.create","model":"m","input":"\u0078","stream_id":"a"}"#);
    assert_eq!(c.answer(&call, "ok")[0]["stream_id"], "a");
}

#[test]
fn lanes_without_anything_kept_make_room() {
    let mut c = Client::new();
    for i in 0..2 * MAX_LANES {
        // A refused message keeps nothing on its lane.
        let error = c.reject(&lane_create(&format!("l{i}"), json!({"model": "m"})));
        assert_eq!(code(&error), "missing_required_parameter");
        assert_eq!(error["stream_id"], format!("l{i}"));
    }
}

#[test]
fn a_steer_is_accepted_and_its_successor_continues_the_response_with_its_input() {
    let mut c = Client::new();
    let call = c.forward(&lane_create(
        "a",
        json!({"model": "m", "input": "write a poem", "instructions": "be brief", "temperature": 0.5}),
    ));
    let (id, created) = open(&mut c, &call);
    c.send(&steer(&id, json!("make it about the sea")));
    let accepted = c.texts();
    assert_eq!(types(&accepted), ["response.steer.accepted"]);
    assert_eq!(accepted[0]["steer"]["previous_response_id"], json!(id));
    assert!(accepted[0]["steer"]["id"]
        .as_str()
        .unwrap()
        .starts_with("steer_"));
    assert_eq!(accepted[0]["stream_id"], "a");
    let numbers: Vec<_> = created
        .iter()
        .chain(&accepted)
        .map(|e| e["sequence_number"].as_u64().unwrap())
        .collect();
    assert_eq!(
        numbers,
        (0..numbers.len() as u64).collect::<Vec<_>>(),
        "numbered among the response's"
    );

    // The response completes; its successor starts at once, on the same lane.
    c.data(&call, chat_stream("roses").as_bytes());
    c.end(&call);
    let events = c.texts();
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    assert_eq!(
        events.last().unwrap()["sequence_number"].as_u64().unwrap(),
        (created.len() + accepted.len() + events.len()) as u64 - 1
    );
    let next = started(&mut c);
    let [successor] = &next[..] else {
        panic!("no successor: {next:?}")
    };
    let body = chat(successor);
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages[0]["content"], "be brief", "its settings inherited");
    assert_eq!(body["temperature"], 0.5);
    let contents: Vec<_> = messages[1..].iter().map(|m| m["content"].clone()).collect();
    assert_eq!(
        contents,
        [
            json!("write a poem"),
            json!("roses"),
            json!("make it about the sea")
        ]
    );
    let events = c.answer(successor, "waves");
    assert_eq!(events[0]["type"], "response.created");
    assert_eq!(events[0]["stream_id"], "a");
    assert_eq!(events[0]["response"]["previous_response_id"], json!(id));
    // Its life and its record are a response's like any other.
    let done = finished(&c.events());
    assert_eq!(done.len(), 2);
    assert_eq!(
        done[1].summary.response_id,
        events[0]["response"]["id"].as_str().map(str::to_owned)
    );
    assert_eq!(
        c.records().len(),
        2,
        "a record per turn, the successor's too"
    );
}

#[test]
fn a_steer_waits_for_the_clients_tool_output_then_goes_first_in_its_continuation() {
    let mut c = Client::new();
    let tools = json!([{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]);
    let call = c.forward(&create(
        json!({"model": "m", "input": "look it up", "tools": tools}),
    ));
    let (id, _) = open(&mut c, &call);
    c.send(&steer(&id, json!([{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "in French"}]}])));
    assert_eq!(types(&c.texts()), ["response.steer.accepted"]);
    c.data(&call, tool_call_stream("call_1", "lookup").as_bytes());
    c.end(&call);
    let events = c.texts();
    let tail: Vec<_> = types(&events).into_iter().rev().take(2).collect();
    assert_eq!(tail, ["response.steer.pending", "response.completed"]);
    let pending = events.last().unwrap();
    assert_eq!(pending["reason"], "waiting_for_required_input");
    assert_eq!(
        pending["required_input"],
        json!([{"type": "function_call_output", "call_id": "call_1", "name": "lookup"}])
    );
    assert!(
        c.calls().is_empty(),
        "no successor: the client's tool output comes first"
    );

    let call = c.forward(&create(json!({
        "model": "m", "previous_response_id": id, "tools": tools,
        "input": [{"type": "function_call_output", "call_id": "call_1", "output": "42"}]
    })));
    let messages = chat(&call)["messages"].as_array().unwrap().clone();
    let roles: Vec<_> = messages
        .iter()
        .map(|m| m["role"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(roles, ["user", "assistant", "user", "tool"]);
    assert_eq!(messages[2]["content"][0]["text"], "in French");
    c.answer(&call, "quarante-deux");
}

#[test]
fn steers_that_cannot_commit_come_back_with_their_code() {
    let mut c = Client::with(
        Arc::new(Settings::default()),
        Limits {
            max_context_bytes: 2000,
            ..limits()
        },
        &[],
    );
    let failed = |c: &mut Client, message: &[u8]| {
        c.send(message);
        let texts = c.texts();
        assert_eq!(types(&texts), ["response.steer.failed"], "{texts:?}");
        texts[0].clone()
    };
    // Nothing by that id.
    let f = failed(&mut c, &steer("resp_nope", json!("x")));
    assert_eq!(f["error"]["code"], "response_not_found");
    assert_eq!(f["steer"]["input"], "x", "the input given back");
    assert!(f["steer"].get("id").is_none(), "no id was allocated");

    let call = c.forward(&lane_create("a", json!({"model": "m", "input": "hi"})));
    let (id, _) = open(&mut c, &call);
    // Only user messages steer; only the three fields.
    for bad in [
        steer(&id, json!([{"type": "message", "role": "assistant", "content": "x"}])),
        steer(&id, json!([{"type": "function_call_output", "call_id": "c", "output": "x"}])),
        steer(&id, json!([])),
        serde_json::to_vec(&json!({"type": "response.steer", "previous_response_id": id, "input": "x", "stream_id": "a"})).unwrap(),
        serde_json::to_vec(&json!({"type": "response.steer", "input": "x"})).unwrap(),
    ] {
        let f = failed(&mut c, &bad);
        assert_eq!(f["error"]["code"], "invalid_input", "{}", String::from_utf8_lossy(&bad));
        assert_eq!(f["error"]["type"], "invalid_request_error");
    }
    // At most MAX_PENDING_STEERS.
    for _ in 0..MAX_PENDING_STEERS {
        c.send(&steer(&id, json!("more")));
        assert_eq!(types(&c.texts()), ["response.steer.accepted"]);
    }
    let f = failed(&mut c, &steer(&id, json!("one too many")));
    assert_eq!(f["error"]["code"], "too_many_pending_steers");
    assert_eq!(f["stream_id"], "a");

    // The response's context is over what is kept: no successor can continue it.
    c.data(&call, chat_stream(&"long ".repeat(500)).as_bytes());
    c.end(&call);
    let texts = c.texts();
    let failures: Vec<_> = texts
        .iter()
        .filter(|e| e["type"] == "response.steer.failed")
        .collect();
    assert_eq!(failures.len(), MAX_PENDING_STEERS);
    assert!(failures
        .iter()
        .all(|f| f["error"]["code"] == "successor_creation_failed"
            && f["steer"]["id"].as_str().unwrap().starts_with("steer_")
            && f["steer"]["input"] == "more"));
    assert!(c.calls().is_empty());

    // A response that has ended.
    let f = failed(&mut c, &steer(&id, json!("late")));
    assert_eq!(f["error"]["code"], "response_already_completed");

    // A response that failed.
    let call = c.forward(&lane_create("b", json!({"model": "m", "input": "hi"})));
    let (id, _) = open(&mut c, &call);
    c.send(&steer(&id, json!("x")));
    assert_eq!(types(&c.texts()), ["response.steer.accepted"]);
    c.fail(&call, "reset");
    let texts = c.texts();
    let f = texts
        .iter()
        .find(|e| e["type"] == "response.steer.failed")
        .expect("told");
    assert_eq!(f["error"]["code"], "response_not_active");
    let f = failed(&mut c, &steer(&id, json!("late")));
    assert_eq!(f["error"]["code"], "response_not_active");
}

#[test]
fn responses_with_automatic_compaction_are_not_steered() {
    use crate::translate::seal::Keyring;
    let mut settings = Settings::default();
    settings.options.keyring = Some(Arc::new(Keyring::single("k", [5; 32]).unwrap()));
    let mut c = Client::with(Arc::new(settings), limits(), &[]);
    let call = c.forward(&create(json!({
        "model": "m", "input": "hi",
        "context_management": [{"type": "compaction", "compact_threshold": 1_000_000}]
    })));
    let (id, _) = open(&mut c, &call);
    c.send(&steer(&id, json!("x")));
    let texts = c.texts();
    assert_eq!(
        texts[0]["error"]["code"], "steering_not_supported",
        "{texts:?}"
    );
}
