//! The connection's rules with plain bytes: a client's frames in, frames, calls, timers and
//! events out. No socket, no clock: every time is given.

use super::*;
use crate::call::{AnswerHead, Call};
use crate::life::Finished;
use crate::metadata::MetadataValue;
use serde_json::{json, Value};
use std::cell::Cell;

const SSE: &str = "text/event-stream";
const JSON_TYPE: &str = "application/json";

/// A fixed wall clock and ids that differ per response.
#[derive(Debug, Default)]
struct Counter(Cell<u128>);

impl Environment for Counter {
    fn now(&self) -> u64 {
        1_700_000_000
    }

    fn id_seed(&self) -> u128 {
        self.0.set(self.0.get() + 1);
        self.0.get()
    }
}

fn limits() -> Limits {
    Limits {
        max_message_bytes: 64 * 1024,
        max_context_bytes: 1 << 20,
        idle_timeout: Duration::from_secs(300),
        max_age: Duration::from_secs(3600),
        max_unread_bytes: 1 << 20,
        max_socket_bytes: 16 << 20,
    }
}

/// A frame the server sent.
#[derive(Debug, Clone, PartialEq)]
enum Frame {
    Text(Value),
    Close(u16, String),
    Pong(Vec<u8>),
}

/// A client of one connection, and the clock of its inputs.
struct Client {
    conn: Connection<Counter>,
    t0: Instant,
    ms: u64,
    /// Frames received but not looked at yet (`texts` leaves the others here).
    unread: Vec<Frame>,
    /// Records polled with the calls, not looked at yet.
    records: Vec<Record>,
    /// Calls polled by `records`, not looked at yet.
    pending: Vec<CallAction>,
    /// Records stay on their way (else each is over once polled, as a host's soon is).
    hold_records: bool,
}

impl Client {
    fn new() -> Client {
        Client::with(Arc::new(Settings::default()), limits(), &[])
    }

    fn with(settings: Arc<Settings>, limits: Limits, headers: &[(&str, &str)]) -> Client {
        let t0 = Instant::now();
        let handshake = |name: &str| headers.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        Client {
            conn: Connection::new(settings, limits, Counter::default(), handshake, t0),
            t0,
            ms: 0,
            unread: Vec::new(),
            records: Vec::new(),
            pending: Vec::new(),
            hold_records: false,
        }
    }

    fn now(&self) -> Instant {
        self.t0 + Duration::from_millis(self.ms)
    }

    /// Moves the clock on by `ms`.
    fn wait(&mut self, ms: u64) {
        self.ms += ms;
    }

    fn bytes(&mut self, bytes: &[u8]) {
        let now = self.now();
        self.conn.handle_bytes(now, bytes);
    }

    fn send(&mut self, message: &[u8]) {
        self.bytes(&masked(0x1, message));
    }

    /// What the server sent since the last look.
    fn received(&mut self) -> Vec<Frame> {
        let mut out = std::mem::take(&mut self.unread);
        while let Some(bytes) = self.conn.poll_transmit() {
            out.extend(server_frames(&bytes));
        }
        out
    }

    /// The text messages the server sent, as JSON; the other frames stay for `received`.
    fn texts(&mut self) -> Vec<Value> {
        let mut texts = Vec::new();
        for f in self.received() {
            match f {
                Frame::Text(v) => texts.push(v),
                other => self.unread.push(other),
            }
        }
        texts
    }

    /// The calls to start or cancel; the records of the responses that ended are kept aside
    /// (`records`).
    fn calls(&mut self) -> Vec<CallAction> {
        self.poll_calls();
        std::mem::take(&mut self.pending)
    }

    /// The records of the responses that ended since the last look.
    fn records(&mut self) -> Vec<Record> {
        self.poll_calls();
        std::mem::take(&mut self.records)
    }

    fn poll_calls(&mut self) {
        while let Some(action) = self.conn.poll_call() {
            match action {
                CallAction::Record(record) => {
                    if !self.hold_records {
                        self.conn.handle_record_done();
                    }
                    self.records.push(record);
                }
                action => self.pending.push(action),
            }
        }
    }

    /// Sends a message that becomes a Chat call; returns the call.
    fn forward(&mut self, message: &[u8]) -> Call {
        self.send(message);
        let calls = self.calls();
        match &calls[..] {
            [CallAction::Start(call)] => call.clone(),
            other => panic!(
                "not one call started: {other:?}; sent {:?}",
                self.received()
            ),
        }
    }

    /// Sends a message that is refused: its `error` event.
    fn reject(&mut self, message: &[u8]) -> Value {
        self.send(message);
        assert!(self.calls().is_empty(), "a refused message started a call");
        let texts = self.texts();
        assert_eq!(texts.len(), 1, "{texts:?}");
        texts[0].clone()
    }

    fn head(&mut self, call: &Call, status: u16, content_type: &str) {
        let now = self.now();
        let pairs = [("content-type", content_type)];
        AnswerHead(&pairs).report(status, |head| {
            self.conn.handle_call_head(now, call.id, head)
        });
    }

    fn data(&mut self, call: &Call, bytes: &[u8]) {
        let now = self.now();
        self.conn.handle_call_data(now, call.id, bytes);
    }

    fn end(&mut self, call: &Call) {
        let now = self.now();
        self.conn.handle_call_end(now, call.id);
    }

    fn fail(&mut self, call: &Call, message: &str) {
        let now = self.now();
        self.conn
            .handle_call_failed(now, call.id, crate::call::CallFailure::Failed(message));
    }

    /// Runs `call` to its end with a stream that says `text`; returns its events.
    fn answer(&mut self, call: &Call, text: &str) -> Vec<Value> {
        self.head(call, 200, SSE);
        assert!(self.received().is_empty());
        self.data(call, chat_stream(text).as_bytes());
        self.end(call);
        let events = self.texts();
        let last = events.last().map(|e| e["type"].clone());
        assert_eq!(last, Some(json!("response.completed")), "the stream ended");
        events
    }

    fn events(&mut self) -> Vec<Event> {
        let now = self.now();
        std::iter::from_fn(|| self.conn.poll_event(now)).collect()
    }

    fn timeout(&mut self) {
        let now = self.now();
        self.conn.handle_timeout(now);
    }
}

/// A client frame: masked (RFC 6455 §5.3), FIN set.
fn masked(opcode: u8, payload: &[u8]) -> Vec<u8> {
    frame(0x80 | opcode, payload, true)
}

fn frame(first: u8, payload: &[u8], mask: bool) -> Vec<u8> {
    let bit = if mask { 0x80 } else { 0 };
    let mut f = vec![first];
    match payload.len() {
        n if n < 126 => f.push(bit | n as u8),
        n if n <= 0xFFFF => {
            f.push(bit | 126);
            f.extend((n as u16).to_be_bytes());
        }
        n => {
            f.push(bit | 127);
            f.extend((n as u64).to_be_bytes());
        }
    }
    let key = [0x37, 0xfa, 0x21, 0x3d];
    if mask {
        f.extend(key);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    } else {
        f.extend(payload);
    }
    f
}

/// The server's frames (unmasked, whole).
fn server_frames(mut bytes: &[u8]) -> Vec<Frame> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        assert_eq!(bytes[0] & 0x80, 0x80, "one frame per message");
        assert_eq!(bytes[1] & 0x80, 0, "server frames are not masked");
        let (len, at) = match bytes[1] & 0x7f {
            126 => (u16::from_be_bytes([bytes[2], bytes[3]]) as usize, 4),
            127 => (
                u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
                10,
            ),
            n => (n as usize, 2),
        };
        let payload = &bytes[at..at + len];
        out.push(match bytes[0] & 0x0f {
            0x1 => Frame::Text(serde_json::from_slice(payload).expect("one JSON object")),
            0x8 => Frame::Close(
                u16::from_be_bytes([payload[0], payload[1]]),
                String::from_utf8(payload[2..].to_vec()).unwrap(),
            ),
            0xA => Frame::Pong(payload.to_vec()),
            other => panic!("opcode {other}"),
        });
        bytes = &bytes[at + len..];
    }
    out
}

fn create(body: Value) -> Vec<u8> {
    let mut body = body;
    body["type"] = json!("response.create");
    serde_json::to_vec(&body).unwrap()
}

/// A Chat stream that says `text` and stops.
fn chat_stream(text: &str) -> String {
    let chunk = |delta: Value, finish: Option<&str>| {
        format!(
            "data: {}\n\n",
            json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut s = chunk(json!({"role": "assistant", "content": text}), None);
    s.push_str(&chunk(json!({}), Some("stop")));
    s.push_str("data: [DONE]\n\n");
    s
}

fn chat(call: &Call) -> Value {
    serde_json::from_slice(&call.body).unwrap()
}

fn code(frame: &Value) -> &str {
    frame["error"]["code"].as_str().unwrap_or("")
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

fn id_of(events: &[Value]) -> String {
    events.last().unwrap()["response"]["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn finished(events: &[Event]) -> Vec<Finished> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Response {
                event: life::Event::Finished(f),
                ..
            } => Some((**f).clone()),
            _ => None,
        })
        .collect()
}

fn closed(events: &[Event]) -> Vec<(u16, &'static str)> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Closed { code, reason } => Some((code.0, reason.as_str())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_create_streams_events_as_messages_numbered_from_zero() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "hi"})));
    assert!(call
        .headers
        .contains(&(Cow::Borrowed("accept"), SSE.to_owned())));
    let chat = chat(&call);
    assert_eq!(
        chat["stream"],
        json!(true),
        "every response on a socket is streamed"
    );
    assert_eq!(chat["messages"], json!([{"role": "user", "content": "hi"}]));
    assert!(c.conn.exchange().is_some());

    let events = c.answer(&call, "Hello");
    let types = types(&events);
    assert_eq!(types.first(), Some(&"response.created"));
    assert_eq!(types.last(), Some(&"response.completed"));
    assert!(types.contains(&"response.output_text.delta"));
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], json!(i), "{e}");
    }
    // The next response numbers its events from 0 again; the finished call is not
    // cancelled.
    assert!(c.calls().is_empty());
    let call = c.forward(&create(json!({"model": "m", "input": "again"})));
    assert_eq!(c.answer(&call, "x")[0]["sequence_number"], json!(0));
}

#[test]
fn the_handshakes_credentials_go_on_to_each_call() {
    let mut c = Client::with(
        Arc::new(Settings::default()),
        limits(),
        &[
            ("authorization", "Bearer k"),
            ("cookie", "c"),
            ("x-request-id", "r1"),
        ],
    );
    let call = c.forward(&create(json!({"model": "big", "input": "hi"})));
    let header = |name: &str| {
        call.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(header("authorization"), Some("Bearer k"));
    assert_eq!(header("x-request-id"), Some("r1"));
    assert_eq!(header("x-responses-model"), Some("big"));
    assert_eq!(header("cookie"), None);
    assert_eq!(call.path, "/v1/chat/completions");
}

#[test]
fn a_continuation_sends_the_whole_context_and_echoes_the_id() {
    let mut c = Client::new();
    let call = c.forward(&create(
        json!({"model": "m", "instructions": "be brief", "input": "first question"}),
    ));
    let id = id_of(&c.answer(&call, "first answer"));
    assert!(c.conn.context_bytes() > 0);

    let call = c.forward(&create(json!({"model": "m", "previous_response_id": id,
        "input": [{"role": "user", "content": "second question"}]})));
    // Instructions are not carried over (as over HTTP, each request gives its own).
    assert_eq!(
        chat(&call)["messages"],
        json!([
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "first answer"},
            {"role": "user", "content": "second question"}
        ])
    );
    let events = c.answer(&call, "second answer");
    assert_eq!(
        events.last().unwrap()["response"]["previous_response_id"],
        json!(id)
    );
    // The continuation is now the context: a third turn sees all three.
    let second = id_of(&events);
    let call = c.forward(&create(
        json!({"model": "m", "previous_response_id": second, "input": "third"}),
    ));
    assert_eq!(chat(&call)["messages"].as_array().unwrap().len(), 5);
}

#[test]
fn only_the_last_response_can_be_continued() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    let first = id_of(&c.answer(&call, "a"));
    let call = c.forward(&create(json!({"model": "m", "input": "two"})));
    c.answer(&call, "b");
    let frame = c.reject(&create(
        json!({"model": "m", "previous_response_id": first, "input": "x"}),
    ));
    assert_eq!(code(&frame), "previous_response_not_found");
    assert_eq!(frame["status"], json!(400));
    assert_eq!(frame["type"], json!("error"));
    assert_eq!(frame["error"]["param"], json!("previous_response_id"));
}

#[test]
fn an_unknown_id_leaves_the_context_in_place() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    let id = id_of(&c.answer(&call, "a"));
    let frame = c.reject(&create(
        json!({"model": "m", "previous_response_id": "resp_other", "input": "x"}),
    ));
    assert_eq!(code(&frame), "previous_response_not_found");
    c.forward(&create(
        json!({"model": "m", "previous_response_id": id, "input": "x"}),
    ));
}

#[test]
fn a_failed_continuation_evicts_the_context() {
    // A 400 of ours, an upstream's error, a failed translation, and a failed stream each
    // evict what they continued.
    let failures: [fn(&mut Client, &str) -> Vec<Value>; 4] = [
        // The official suite's `websocket-failed-continuation-evicts-cache`: an output whose
        // call is in neither the kept context nor the request.
        |c, id| {
            let frame = c.reject(&create(
                json!({"model": "m", "previous_response_id": id, "input": [
                {"type": "function_call_output", "call_id": "call_openresponses_missing",
                 "output": "No matching tool call exists in the previous response."}]}),
            ));
            assert_eq!(frame["error"]["param"], "input[2].call_id", "{frame}");
            assert!(frame["error"]["message"].as_str().unwrap().starts_with(
                "No tool call found for function call output with call_id call_openresponses_missing."
            ));
            vec![frame]
        },
        |c, id| {
            let call = c.forward(&create(
                json!({"model": "m", "previous_response_id": id, "input": "x"}),
            ));
            c.head(&call, 500, JSON_TYPE);
            c.data(&call, br#"{"error":{"message":"boom"}}"#);
            c.end(&call);
            c.texts()
        },
        |c, id| {
            vec![
                c.reject(&create(json!({"model": "m", "previous_response_id": id,
                "input": "x", "temperature": "hot"}))),
            ]
        },
        |c, id| {
            let call = c.forward(&create(
                json!({"model": "m", "previous_response_id": id, "input": "x"}),
            ));
            c.head(&call, 200, SSE);
            c.data(
                &call,
                b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"par\"}}]}\n\n",
            );
            c.fail(&call, "reset");
            c.texts()
        },
    ];
    for fail in failures {
        let mut c = Client::new();
        let call = c.forward(&create(json!({"model": "m", "input": "one"})));
        let id = id_of(&c.answer(&call, "a"));
        let frames = fail(&mut c, &id);
        let last = frames.last().unwrap();
        assert!(
            last["type"] == "error" || last["type"] == "response.failed",
            "{last}"
        );
        assert!(c.conn.exchange().is_none());
        let frame = c.reject(&create(
            json!({"model": "m", "previous_response_id": id, "input": "x"}),
        ));
        assert_eq!(code(&frame), "previous_response_not_found", "{frame}");
        assert_eq!(c.conn.context_bytes(), 0);
    }
}

/// The kept context counts as the request's items: an output may answer a call the kept
/// response made.
#[test]
fn an_output_may_answer_a_call_of_the_kept_context() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "weather?",
        "tools": [{"type": "function", "name": "get_weather"}]})));
    c.head(&call, 200, SSE);
    let tool = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,",
        "\"id\":\"call_w\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\",",
        "\"arguments\":\"{}\"}}]}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: [DONE]\n\n"
    );
    c.data(&call, tool.as_bytes());
    c.end(&call);
    let id = id_of(&c.texts());
    let call = c.forward(&create(
        json!({"model": "m", "previous_response_id": id, "input": [
        {"type": "function_call_output", "call_id": "call_w", "output": "sunny"}]}),
    ));
    assert_eq!(
        chat(&call)["messages"][2],
        json!({"role": "tool", "tool_call_id": "call_w", "content": "sunny"})
    );
}

/// A compaction (Codex's `compaction_trigger`) replaces what it summarised: continuing it
/// sends the sealed summary, not the window again.
#[test]
fn the_context_of_a_compaction_is_its_summary() {
    let settings = Arc::new(Settings {
        options: crate::translate::Options {
            keyring: Some(Arc::new(
                crate::translate::seal::Keyring::single("k1", [9; 32]).unwrap(),
            )),
            ..crate::translate::Options::default()
        },
        ..Settings::default()
    });
    let mut c = Client::with(settings, limits(), &[]);
    let call = c.forward(&create(json!({"model": "m", "input": [
        {"role": "user", "content": "I am Ada"}, {"type": "compaction_trigger"}]})));
    let done = c.answer(&call, "The user is Ada.");
    assert_eq!(
        done.last().unwrap()["response"]["output"][0]["type"],
        "compaction"
    );
    let id = id_of(&done);
    let call = c.forward(&create(
        json!({"model": "m", "previous_response_id": id, "input": "Who am I?"}),
    ));
    assert_eq!(
        chat(&call)["messages"],
        json!([
            {"role": "system", "content": format!("{}The user is Ada.", crate::translate::compact::CONTEXT_PREFIX)},
            {"role": "user", "content": "Who am I?"}
        ])
    );
}

/// A socket's tenant is its handshake's tenant header: what it seals opens on a socket of the
/// same tenant only (400 `invalid_encrypted_content` on another's), and a socket without one
/// cannot seal (403 `missing_tenant`) but can still answer what seals nothing.
#[test]
fn a_sockets_sealed_items_are_bound_to_its_handshakes_tenant() {
    let settings = Arc::new(Settings {
        seal_tenant_header: Some("x-tenant".into()),
        options: crate::translate::Options {
            keyring: Some(Arc::new(
                crate::translate::seal::Keyring::single("k1", [9; 32]).unwrap(),
            )),
            ..crate::translate::Options::default()
        },
        ..Settings::default()
    });
    let trigger = create(json!({"model": "m", "input": [
        {"role": "user", "content": "I am Ada"}, {"type": "compaction_trigger"}]}));
    let mut a = Client::with(settings.clone(), limits(), &[("x-tenant", "team-a")]);
    let call = a.forward(&trigger);
    let done = a.answer(&call, "The user is Ada.");
    let item = done.last().unwrap()["response"]["output"][0].clone();
    assert_eq!(item["type"], "compaction");
    let next = create(json!({"model": "m", "input": [item, {"role": "user", "content": "Who?"}]}));

    let mut again = Client::with(settings.clone(), limits(), &[("x-tenant", "team-a")]);
    let call = again.forward(&next);
    assert!(chat(&call)["messages"][0]["content"]
        .as_str()
        .unwrap()
        .ends_with("The user is Ada."));

    let mut b = Client::with(settings.clone(), limits(), &[("x-tenant", "team-b")]);
    let err = b.reject(&next);
    assert_eq!(err["status"], 400);
    assert_eq!(err["error"]["code"], "invalid_encrypted_content");
    assert_eq!(err["error"]["param"], "input[0].encrypted_content");

    let mut none = Client::with(settings, limits(), &[]);
    let err = none.reject(&trigger);
    assert_eq!(err["status"], 403);
    assert_eq!(err["error"]["code"], "missing_tenant");
    none.forward(&create(json!({"model": "m", "input": "hi"})));
}

#[test]
fn a_failed_fresh_response_keeps_the_context() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    let id = id_of(&c.answer(&call, "a"));
    let call = c.forward(&create(json!({"model": "m", "input": "two"})));
    c.head(&call, 503, JSON_TYPE);
    c.data(&call, b"{}");
    c.end(&call);
    let frame = &c.texts()[0];
    assert_eq!(frame["type"], json!("error"));
    assert_eq!(frame["status"], json!(503));
    c.forward(&create(
        json!({"model": "m", "previous_response_id": id, "input": "x"}),
    ));
}

#[test]
fn an_upstream_error_event_carries_its_kept_headers_and_token_counts() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    let head = [
        ("content-type", "application/json"),
        ("retry-after", "1"),
        ("x-ratelimit-remaining-requests", "0"),
        ("set-cookie", "a=b"),
    ];
    let now = c.now();
    AnswerHead(&head).report(429, |head| c.conn.handle_call_head(now, call.id, head));
    c.data(&call, br#"{"error":{"message":"slow down"}}"#);
    c.end(&call);
    let kept = json!({"retry-after": "1", "x-ratelimit-remaining-requests": "0"});
    assert_eq!(
        c.texts(),
        [
            json!({"type": "error", "status": 429, "headers": kept, "error": {
            "type": "rate_limit_error", "code": "rate_limit_exceeded", "message": "slow down",
            "param": null, "headers": kept}})
        ]
    );
    // A context overflow with the counts as fields (llama.cpp): 400, the counts in `error`.
    let call = c.forward(&create(json!({"model": "m", "input": "two"})));
    c.head(&call, 400, JSON_TYPE);
    c.data(&call, br#"{"error":{"code":400,"message":"request (9 tokens) exceeds the available context size (8 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":9,"n_ctx":8}}"#);
    c.end(&call);
    assert_eq!(
        c.texts(),
        [json!({"type": "error", "status": 400, "error": {
            "type": "invalid_request_error", "code": "context_length_exceeded",
            "message": "request (9 tokens) exceeds the available context size (8 tokens), try increasing it",
            "param": "input", "n_prompt_tokens": 9, "n_ctx": 8}})]
    );
    // A success's headers are not read.
    let call = c.forward(&create(json!({"model": "m", "input": "three"})));
    let now = c.now();
    let head = crate::call::ReportedHead {
        status: 200,
        header: &|n| (n == "content-type").then_some(SSE),
        every: &|| panic!("a success's headers read"),
    };
    c.conn.handle_call_head(now, call.id, head);
}

#[test]
fn transport_fields_are_rejected_unless_they_agree_with_the_socket() {
    for (field, value) in [
        ("stream", json!(false)),
        ("stream", json!("yes")),
        ("background", json!(true)),
        ("stream_options", json!({})),
        ("stream_options", json!({"include_obfuscation": false})),
    ] {
        let mut c = Client::new();
        let mut body = json!({"model": "m", "input": "x"});
        body[field] = value.clone();
        let frame = c.reject(&create(body));
        assert_eq!(code(&frame), "unsupported_parameter", "{field}: {value}");
        assert_eq!(frame["error"]["param"], json!(field));
        assert_eq!(frame["status"], json!(400));
    }
    // What Codex sends on its sockets: accepted, the transport streams anyway.
    let mut c = Client::new();
    let call = c.forward(&create(
        json!({"model": "m", "input": "x", "stream": true, "background": false}),
    ));
    assert_eq!(chat(&call)["stream"], json!(true));
    // A client's dump of its own request: every transport field `null`, which is absent.
    let mut c = Client::new();
    let call = c.forward(&create(
        json!({"model": "m", "input": "x", "stream": null, "background": null,
               "stream_options": null, "stream_id": null, "generate": null,
               "previous_response_id": null}),
    ));
    assert_eq!(chat(&call)["stream"], json!(true));
}

#[test]
fn generate_false_preloads_a_context_without_the_upstream() {
    let mut c = Client::new();
    c.send(&create(json!({"model": "m", "instructions": "be brief",
        "input": [{"role": "user", "content": "context"}], "generate": false})));
    assert!(c.calls().is_empty(), "generate: false went upstream");
    assert!(c.conn.exchange().is_none());
    let events = c.texts();
    assert_eq!(
        types(&events),
        [
            "response.created",
            "response.in_progress",
            "response.completed"
        ]
    );
    let response = &events[2]["response"];
    assert_eq!(response["output"], json!([]));
    assert_eq!(response["instructions"], json!("be brief"));
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], json!(i));
    }
    // The next request continues it with only its new items.
    let id = response["id"].as_str().unwrap();
    let call = c.forward(&create(
        json!({"model": "m", "previous_response_id": id, "input": "question"}),
    ));
    assert_eq!(
        chat(&call)["messages"],
        json!([{"role": "user", "content": "context"}, {"role": "user", "content": "question"}])
    );
    // Codex's prewarm: instructions and tools, no input at all.
    let mut c = Client::new();
    c.send(&create(
        json!({"model": "m", "instructions": "be brief", "input": [],
        "tools": [{"type": "function", "name": "f"}], "generate": false}),
    ));
    assert!(c.calls().is_empty());
    let events = c.texts();
    assert_eq!(
        events.last().unwrap()["type"],
        "response.completed",
        "{events:?}"
    );
    let id = id_of(&events);
    let call = c.forward(&create(
        json!({"model": "m", "previous_response_id": id, "input": "question"}),
    ));
    assert_eq!(
        chat(&call)["messages"],
        json!([{"role": "user", "content": "question"}])
    );
    // Only a preload may have none.
    let frame = Client::new().reject(&create(json!({"model": "m", "input": []})));
    assert_eq!(code(&frame), "invalid_value");
    // generate must be a boolean.
    let frame = Client::new().reject(&create(
        json!({"model": "m", "input": "x", "generate": "no"}),
    ));
    assert_eq!(code(&frame), "invalid_type");
}

#[test]
fn bad_messages_get_error_events_and_the_socket_goes_on() {
    let mut c = Client::new();
    for (message, expected) in [
        (&b"{not json"[..], "invalid_json"),
        (br#"[1,2]"#, "invalid_json"),
        (br#"{"type":"response.cancel"}"#, "unknown_event_type"),
        (
            br#"{"model":"m","input":"x"}"#,
            "missing_required_parameter",
        ),
        (
            br#"{"type":"response.create","model":"m"}"#,
            "missing_required_parameter",
        ),
        (
            br#"{"type":"response.create","type":"response.create","model":"m","input":"x"}"#,
            "duplicate_key",
        ),
        (
            br#"{"type":"response.create","model":"m","input":"x","stream_id":5}"#,
            "invalid_type",
        ),
    ] {
        let frame = c.reject(message);
        assert_eq!(
            code(&frame),
            expected,
            "{}",
            String::from_utf8_lossy(message)
        );
        assert!(c.conn.exchange().is_none());
    }
    c.bytes(&masked(0x2, b"{}"));
    assert_eq!(code(&c.texts()[0]), "invalid_message");
    let refused: Vec<_> = c
        .events()
        .into_iter()
        .filter(|e| matches!(e, Event::Refused { status: 400, .. }))
        .collect();
    assert_eq!(refused.len(), 8, "each refusal told, none a response");
    assert!(!c.conn.is_closed());
    c.forward(&create(json!({"model": "m", "input": "still here"})));
}

#[test]
fn the_message_size_limit_from_both_sides() {
    let limit = limits().max_message_bytes;
    let message = |size: usize| {
        let base = create(json!({"model": "m", "input": ""}));
        create(json!({"model": "m", "input": "a".repeat(size - base.len())}))
    };
    let mut c = Client::new();
    assert_eq!(message(limit).len(), limit);
    c.forward(&message(limit));
    // One byte over: read, refused with 413, and the socket goes on.
    let mut c = Client::new();
    let frame = c.reject(&message(limit + 1));
    assert_eq!(
        (code(&frame), frame["status"].as_u64()),
        ("request_too_large", Some(413))
    );
    // Twice the limit is still read, refused with 413, and the socket goes on.
    let mut c = Client::new();
    c.bytes(&masked(0x1, &vec![b' '; 2 * limit]));
    assert_eq!(code(&c.texts()[0]), "request_too_large");
    assert!(c.conn.wants_input());
    // One byte more is refused from its frame head: what came before is answered, then its
    // 413, then 1009.
    c.send(&create(
        json!({"model": "m", "input": "x", "temperature": "hot"}),
    ));
    let mut head = masked(0x1, &vec![b' '; 2 * limit + 1]);
    head.truncate(20);
    c.bytes(&head);
    assert!(!c.conn.wants_input());
    let frames = c.received();
    assert_eq!(frames.len(), 3, "{frames:?}");
    assert!(matches!(&frames[0], Frame::Text(v) if code(v) == "invalid_type"));
    assert!(matches!(&frames[1], Frame::Text(v) if code(v) == "request_too_large"));
    assert_eq!(frames[2], Frame::Close(1009, "message too large".into()));
    // The client's close, or the linger, ends it.
    assert!(!c.conn.is_closed());
    c.wait(CLOSE_LINGER.as_millis() as u64);
    c.timeout();
    assert!(c.conn.is_closed());
}

#[test]
fn a_context_over_its_cap_is_not_kept_and_says_so() {
    let small = Limits {
        max_context_bytes: 2048,
        ..limits()
    };
    let mut c = Client::with(Arc::new(Settings::default()), small, &[]);
    let call = c.forward(&create(json!({"model": "m", "input": "x".repeat(1500)})));
    let id = id_of(&c.answer(&call, "a"));
    assert_eq!(c.conn.context_bytes(), 0);
    let frame = c.reject(&create(
        json!({"model": "m", "previous_response_id": id, "input": "x"}),
    ));
    assert_eq!(code(&frame), "previous_response_not_found");
    let message = frame["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("larger than this server keeps"),
        "{message}"
    );
}

#[test]
fn an_upstream_failure_mid_stream_ends_with_response_failed() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "x"})));
    c.head(&call, 200, SSE);
    c.data(
        &call,
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"half\"}}]}\n\n",
    );
    assert!(c.conn.exchange().is_some());
    c.texts();
    c.fail(&call, "reset");
    let events = c.texts();
    let types = types(&events);
    assert_eq!(types.last(), Some(&"response.failed"));
    assert!(types.contains(&"error"));
    assert!(c.conn.exchange().is_none());
    // A failed call is not cancelled: it is over.
    assert!(c.calls().is_empty());
}

#[test]
fn an_upstream_that_never_answers_ends_with_an_error_event() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "x"})));
    c.fail(&call, "connection refused");
    let frames = c.texts();
    assert_eq!(frames[0]["type"], json!("error"));
    assert_eq!(code(&frames[0]), "upstream_unavailable");
    assert!(c.conn.exchange().is_none());
}

#[test]
fn messages_wait_their_turn_in_a_bounded_queue() {
    let mut c = Client::new();
    let first = c.forward(&create(json!({"model": "m", "input": "one"})));
    for i in 0..MAX_QUEUED_MESSAGES {
        assert!(c.conn.wants_input(), "{i}");
        c.send(&create(json!({"model": "m", "input": format!("q{i}")})));
    }
    assert!(!c.conn.wants_input(), "a full queue stops the reading");
    assert!(c.calls().is_empty(), "one response at a time");
    c.answer(&first, "a");
    // The terminal event of one starts the next, in order (the first call, whose end was
    // still on its way, is stopped).
    let calls = c.calls();
    let [CallAction::Cancel(old), CallAction::Start(next)] = &calls[..] else {
        panic!("{calls:?}")
    };
    assert_eq!(*old, first.id);
    assert_eq!(chat(next)["messages"][0]["content"], "q0");
    assert!(c.conn.wants_input());
    // A host that cannot stop reading and keeps feeding is cut off.
    let mut c = Client::new();
    c.forward(&create(json!({"model": "m", "input": "one"})));
    for i in 0..=2 * MAX_QUEUED_MESSAGES {
        c.send(&create(json!({"model": "m", "input": format!("q{i}")})));
    }
    assert!(matches!(&c.calls()[..], [CallAction::Cancel(_)]));
    assert_eq!(
        c.received().last(),
        Some(&Frame::Close(1008, "too many messages in flight".into()))
    );
    assert_eq!(finished(&c.events()).len(), 1);
}

#[test]
fn pings_are_answered_and_keep_nothing_alive() {
    let mut c = Client::new();
    let idle = limits().idle_timeout.as_millis() as u64;
    assert_eq!(c.conn.poll_timeout(), Some(c.t0 + limits().idle_timeout));
    c.wait(idle / 2);
    c.bytes(&masked(0x9, b"are you there"));
    assert_eq!(c.received(), [Frame::Pong(b"are you there".to_vec())]);
    c.bytes(&masked(0xA, b"unsolicited"));
    assert!(c.received().is_empty());
    // The idle timer still runs from the connection's start.
    assert_eq!(c.conn.poll_timeout(), Some(c.t0 + limits().idle_timeout));
    c.wait(idle / 2);
    c.timeout();
    assert_eq!(c.received(), [Frame::Close(1000, "idle timeout".into())]);
    assert_eq!(closed(&c.events()), [(1000, "idle timeout")]);
    // A message restarts it; a response in flight holds it off.
    let mut c = Client::new();
    c.wait(idle - 1);
    let call = c.forward(&create(json!({"model": "m", "input": "x"})));
    c.wait(idle);
    c.timeout();
    assert!(c.received().is_empty());
    c.answer(&call, "a");
    assert_eq!(c.conn.poll_timeout(), Some(c.now() + limits().idle_timeout));
}

#[test]
fn the_maximum_age_ends_the_connection_after_the_response_in_flight() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    c.send(&create(json!({"model": "m", "input": "queued"})));
    c.wait(limits().max_age.as_millis() as u64);
    assert!(c.conn.poll_timeout().unwrap() <= c.now());
    c.timeout();
    assert!(c.received().is_empty(), "the response in flight goes on");
    c.head(&call, 200, SSE);
    c.data(&call, chat_stream("a").as_bytes());
    c.end(&call);
    let events = c.texts();
    let last = &events[events.len() - 1];
    assert_eq!(code(last), "websocket_connection_limit_reached");
    assert_eq!(events[events.len() - 2]["type"], "response.completed");
    assert!(c.calls().is_empty(), "the queued message never starts");
    c.wait(1);
    c.bytes(&masked(0x8, &1000u16.to_be_bytes()));
    assert!(c.conn.is_closed());
    assert_eq!(closed(&c.events()), [(1000, "maximum connection age")]);
}

#[test]
fn a_drain_lets_the_response_finish_then_closes_with_1001() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    let deadline = c.now() + Duration::from_secs(30);
    let now = c.now();
    c.conn.handle_drain(now, Duration::from_secs(30));
    assert_eq!(c.conn.poll_timeout(), Some(deadline));
    c.send(&create(json!({"model": "m", "input": "late"})));
    c.answer(&call, "a");
    assert!(c.calls().is_empty());
    let frames = c.received();
    assert_eq!(frames, [Frame::Close(1001, "server shutting down".into())]);
    // Past its deadline, the response in flight fails.
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    c.head(&call, 200, SSE);
    let now = c.now();
    c.conn.handle_drain(now, Duration::from_secs(1));
    c.wait(1000);
    c.timeout();
    let frames = c.received();
    let texts: Vec<&Value> = frames
        .iter()
        .filter_map(|f| match f {
            Frame::Text(v) => Some(v),
            _ => None,
        })
        .collect();
    assert_eq!(texts.last().unwrap()["type"], "response.failed");
    assert_eq!(
        texts.last().unwrap()["response"]["error"]["code"],
        "server_shutting_down"
    );
    assert_eq!(
        frames.last(),
        Some(&Frame::Close(1001, "server shutting down".into()))
    );
    assert!(matches!(&c.calls()[..], [CallAction::Cancel(id)] if *id == call.id));
}

#[test]
fn the_clients_close_is_echoed_and_cuts_the_response_in_flight() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    c.head(&call, 200, SSE);
    c.bytes(&masked(0x8, &[&4000u16.to_be_bytes()[..], b"bye"].concat()));
    assert_eq!(c.received(), [Frame::Close(4000, String::new())]);
    assert!(c.conn.is_closed());
    assert!(matches!(&c.calls()[..], [CallAction::Cancel(id)] if *id == call.id));
    let events = c.events();
    let f = finished(&events);
    assert_eq!((f.len(), f[0].cut), (1, true));
    assert_eq!(f[0].summary.outcome, Outcome::Open);
    // Late news of the cancelled call changes nothing.
    c.data(&call, chat_stream("late").as_bytes());
    assert!(c.received().is_empty() && c.events().is_empty());
}

#[test]
fn protocol_errors_close_with_their_code() {
    // RFC 6455 §5.1: an unmasked client frame; §8.1: text that is not UTF-8.
    for (bytes, code) in [
        (frame(0x81, b"{}", false), 1002),
        (masked(0x1, &[0xff, 0xfe]), 1007),
    ] {
        let mut c = Client::new();
        c.bytes(&bytes);
        assert_eq!(c.received(), [Frame::Close(code, "protocol error".into())]);
        assert!(!c.conn.wants_input());
    }
}

/// The bytes of frames each of `chunks` makes the connection send (a client that reads).
fn framed_per_chunk(limits: Limits, chunks: &[&[u8]]) -> Vec<usize> {
    let mut c = Client::with(Arc::new(Settings::default()), limits, &[]);
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    c.head(&call, 200, SSE);
    c.received();
    chunks
        .iter()
        .map(|chunk| {
            c.data(&call, chunk);
            std::iter::from_fn(|| c.conn.poll_transmit())
                .map(|b| b.len())
                .sum()
        })
        .collect()
}

#[test]
fn a_reader_too_slow_ends_its_response_and_the_connection() {
    let bound = 8192;
    let small = Limits {
        max_unread_bytes: bound,
        ..limits()
    };
    let chunk = format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"content": "x".repeat(1000)}}]})
    );
    let chunks = vec![chunk.as_bytes(); 20];
    // How many chunks' events fit in the bound, from a client that reads them.
    let sizes = framed_per_chunk(small, &chunks);
    let fit = sizes
        .iter()
        .scan(0, |sum, n| {
            *sum += n;
            Some(*sum)
        })
        .take_while(|sum| *sum <= bound)
        .count();
    assert!((2..19).contains(&fit), "{sizes:?}");
    let mut c = Client::with(Arc::new(Settings::default()), small, &[]);
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    c.head(&call, 200, SSE);
    c.received();
    let now = c.now();
    c.conn.handle_writable(now, false);
    // Up to the bound the events wait in the connection, counted, none handed over.
    let held = c.conn.held();
    for chunk in &chunks[..fit] {
        c.data(&call, chunk);
        assert!(c.conn.poll_transmit().is_none(), "handed over unread");
    }
    assert!(!c.conn.is_closed(), "just under the bound");
    assert!(
        c.conn.held() >= held + sizes[..fit].iter().sum::<usize>(),
        "what waits is counted"
    );
    // One chunk more: the frames it did not read are dropped, the response fails and the
    // connection ends.
    c.data(&call, chunks[fit]);
    assert!(c.conn.is_closed(), "just over the bound");
    let frames = c.received();
    assert_eq!(
        frames.last(),
        Some(&Frame::Close(1008, "client too slow".into()))
    );
    let texts: Vec<&Value> = frames
        .iter()
        .filter_map(|f| match f {
            Frame::Text(v) => Some(v),
            _ => None,
        })
        .collect();
    assert_eq!(
        texts.last().map(|v| v["type"].as_str()),
        Some(Some("response.failed"))
    );
    assert!(
        texts
            .iter()
            .all(|v| v["type"] != "response.output_text.delta"),
        "the unread deltas are dropped: {texts:?}"
    );
    assert!(matches!(&c.calls()[..], [CallAction::Cancel(id)] if *id == call.id));
    let f = finished(&c.events());
    assert_eq!(f[0].summary.outcome, Outcome::Failed);
    // A client that reads again resets the count, and gets what waited, in order.
    let mut c = Client::with(Arc::new(Settings::default()), small, &[]);
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    c.head(&call, 200, SSE);
    c.received();
    let mut deltas = 0;
    for chunk in &chunks {
        let now = c.now();
        c.conn.handle_writable(now, false);
        c.data(&call, chunk);
        assert!(c.conn.poll_transmit().is_none());
        let now = c.now();
        c.conn.handle_writable(now, true);
        deltas += c
            .texts()
            .iter()
            .filter(|v| v["type"] == "response.output_text.delta")
            .count();
    }
    assert!(!c.conn.is_closed());
    assert_eq!(deltas, chunks.len());
}

#[test]
fn a_client_that_pings_and_does_not_read_gets_one_pong_for_the_last_ping() {
    let mut c = Client::new();
    let now = c.now();
    c.conn.handle_writable(now, false);
    let held = c.conn.held();
    for i in 0..1000 {
        c.bytes(&masked(0x9, format!("ping {i}").as_bytes()));
    }
    assert!(c.received().is_empty(), "nothing handed over");
    assert!(c.conn.held() < held + 128, "{} held", c.conn.held());
    assert!(!c.conn.is_closed());
    let now = c.now();
    c.conn.handle_writable(now, true);
    assert_eq!(c.received(), [Frame::Pong(b"ping 999".to_vec())]);
    // A client that reads gets a pong for each ping that came after the host took the last;
    // pings in one piece, one pong for the last.
    c.bytes(&masked(0x9, b"a"));
    assert_eq!(c.received(), [Frame::Pong(b"a".to_vec())]);
    c.bytes(&masked(0x9, b"b"));
    assert_eq!(c.received(), [Frame::Pong(b"b".to_vec())]);
    let mut piece = masked(0x9, b"c");
    piece.extend(masked(0x9, b"d"));
    c.bytes(&piece);
    assert_eq!(c.received(), [Frame::Pong(b"d".to_vec())]);
}

/// Messages answered at once (`generate: false`) from a client that does not read: the
/// connection stops reading once a piece of answers waits for the host, and what the host
/// keeps for it counts; once the client reads, every message is answered, in order.
#[test]
fn a_client_that_does_not_read_its_answers_is_not_read_either() {
    let mut c = Client::new();
    let now = c.now();
    c.conn.handle_writable(now, false);
    let piece: Vec<u8> = (0..1000)
        .flat_map(|i| {
            masked(
                0x1,
                &create(json!({"model": "m", "input": format!("{i}"), "generate": false})),
            )
        })
        .collect();
    let mut rest = &piece[..];
    let taken = c.conn.read_bytes(now, rest);
    rest = &rest[taken..];
    assert!(!rest.is_empty(), "it stops reading");
    assert!(!c.conn.wants_input());
    let held = c.conn.held();
    assert!(held < 2 * TRANSMIT_BYTES, "{held} held");
    c.conn.set_read_buffer(now, rest.len());
    assert_eq!(
        c.conn.held(),
        held + rest.len(),
        "what the host keeps counts"
    );
    assert!(c.received().is_empty());
    // The client reads: the host takes what waits, and offers the rest as it is wanted.
    c.conn.handle_writable(now, true);
    let mut completed = Vec::new();
    for _ in 0..1000 {
        for event in c.texts() {
            if event["type"] == "response.completed" {
                completed.push(event["response"]["id"].as_str().unwrap().to_owned());
            }
        }
        if rest.is_empty() {
            break;
        }
        c.poll_calls();
        assert!(c.conn.wants_input());
        let taken = c.conn.read_bytes(now, rest);
        rest = &rest[taken..];
        c.conn.set_read_buffer(now, rest.len());
    }
    for event in c.texts() {
        if event["type"] == "response.completed" {
            completed.push(event["response"]["id"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(completed.len(), 1000);
    assert!(!c.conn.is_closed());
}

#[test]
fn frames_are_handed_over_whole_in_bounded_pieces() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    c.head(&call, 200, SSE);
    let now = c.now();
    c.conn.handle_writable(now, false);
    // Many small events, then one larger than a piece.
    let small = format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"content": "x".repeat(1000)}}]})
    );
    for _ in 0..200 {
        c.data(&call, small.as_bytes());
    }
    let big = format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"content": "y".repeat(TRANSMIT_BYTES)}}]})
    );
    c.data(&call, big.as_bytes());
    let now = c.now();
    c.conn.handle_writable(now, true);
    let mut frames = Vec::new();
    while let Some(piece) = c.conn.poll_transmit() {
        let got = server_frames(&piece);
        assert!(
            piece.len() <= TRANSMIT_BYTES || got.len() == 1,
            "{} bytes in {} frames",
            piece.len(),
            got.len()
        );
        frames.extend(got);
    }
    let deltas = frames
        .iter()
        .filter(|f| matches!(f, Frame::Text(v) if v["type"] == "response.output_text.delta"))
        .count();
    assert_eq!(deltas, 201, "every frame whole, in order");
}

#[test]
fn the_rest_of_an_upstream_body_after_the_terminal_event_is_not_read() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    c.head(&call, 200, SSE);
    // The terminal event: the call is left to end by itself, what follows it is not read.
    c.data(&call, chat_stream("a").as_bytes());
    assert_eq!(types(&c.texts()).last(), Some(&"response.completed"));
    assert!(c.calls().is_empty());
    c.data(&call, b"data: more\n\n");
    assert!(c.received().is_empty());
    // If it never ends, the next call stops it first.
    c.send(&create(json!({"model": "m", "input": "two"})));
    let calls = c.calls();
    assert!(
        matches!(&calls[..], [CallAction::Cancel(old), CallAction::Start(_)] if *old == call.id),
        "{calls:?}"
    );
}

#[test]
fn each_response_is_told_once_with_its_time() {
    let mut c = Client::new();
    assert!(matches!(&c.events()[..], [Event::Opened]));
    // A refused message is not a response.
    c.send(b"{}");
    c.received();
    assert!(matches!(
        &c.events()[..],
        [Event::Refused { status: 400, .. }]
    ));
    // A response: claimed, its stream, its first output, its end, with the time since its
    // message.
    c.wait(10);
    let call = c.forward(&create(json!({"model": "m", "input": "hi"})));
    c.wait(1);
    let events = c.events();
    assert!(
        matches!(
            &events[..],
            [Event::Response {
                event: life::Event::Claimed { .. },
                ..
            }]
        ),
        "{events:?}"
    );
    c.wait(9);
    c.head(&call, 200, SSE);
    let events = c.events();
    assert!(
        matches!(
            &events[..],
            [Event::Response {
                event: life::Event::StreamOpened,
                ..
            }]
        ),
        "{events:?}"
    );
    let stream = chat_stream("Hi");
    let (first, rest) = stream.split_at(stream.find("\n\n").unwrap() + 2);
    c.wait(10);
    c.data(&call, first.as_bytes());
    c.wait(1);
    let events = c.events();
    assert!(
        matches!(&events[..], [Event::Response { event: life::Event::FirstOutput { elapsed }, .. }] if *elapsed == Duration::from_millis(21)),
        "{events:?}"
    );
    c.wait(9);
    c.data(&call, rest.as_bytes());
    c.end(&call);
    c.wait(2);
    let events = c.events();
    assert!(
        matches!(
            &events[..],
            [
                Event::Response {
                    event: life::Event::StreamClosed,
                    ..
                },
                Event::Response {
                    event: life::Event::Finished(_),
                    ..
                }
            ]
        ),
        "{events:?}"
    );
    let f = finished(&events);
    assert!(!f[0].cut);
    assert_eq!(f[0].summary.outcome, Outcome::Translated);
    assert_eq!(f[0].timing.total, Duration::from_millis(32));
    assert_eq!(f[0].timing.first_output, Some(Duration::from_millis(21)));
    // Busy from each input to its last poll: 1 ms after the message, 1 after the first
    // piece, 2 after the last.
    assert_eq!(f[0].timing.translation, Duration::from_millis(4));
    assert!(c.events().is_empty(), "once");
    // Two `generate: false` in one read: each told, none lost.
    let preload = create(json!({"model": "m", "input": "hi", "generate": false}));
    c.bytes(&[masked(0x1, &preload), masked(0x1, &preload)].concat());
    let f = finished(&c.events());
    assert_eq!(f.len(), 2);
    assert!(f.iter().all(|f| !f.cut));
    // Cut by the transport's end mid-stream: told as cut, its outcome still open, and the
    // connection's end.
    let call = c.forward(&create(json!({"model": "m", "input": "again"})));
    c.head(&call, 200, SSE);
    let now = c.now();
    c.conn.handle_closed(now);
    let events = c.events();
    let f = finished(&events);
    assert_eq!((f.len(), f[0].cut), (1, true));
    assert_eq!(f[0].summary.outcome, Outcome::Open);
    assert_eq!(closed(&events), [(1006, "transport closed")]);
    c.conn.handle_closed(now);
    assert!(c.events().is_empty(), "once");
}

#[test]
fn what_a_connection_holds_is_bounded_alone_and_with_the_others() {
    // Alone: a response in flight and messages queued behind it, past its own limit.
    let small = Limits {
        max_socket_bytes: 4096,
        ..limits()
    };
    let mut c = Client::with(Arc::new(Settings::default()), small, &[]);
    let call = c.forward(&create(json!({"model": "m", "input": "x".repeat(1000)})));
    // The input is held as the JSON text it came as, and counted at that size, with the
    // message (the settings a steered successor inherits).
    assert!(
        (2000..2300).contains(&c.conn.held()),
        "the input and the message counted at their size: {}",
        c.conn.held()
    );
    c.send(&create(json!({"model": "m", "input": "y".repeat(1500)})));
    assert!(!c.conn.is_closed(), "{} bytes", c.conn.held());
    c.send(&create(json!({"model": "m", "input": "z".repeat(1500)})));
    assert!(c.conn.is_closed());
    assert_eq!(
        c.received().last(),
        Some(&Frame::Close(1008, "connection memory limit".into()))
    );
    assert!(matches!(&c.calls()[..], [CallAction::Cancel(id)] if *id == call.id));
    assert_eq!(closed(&c.events()), [(1008, "connection memory limit")]);
    // Together: the one whose growth takes the host's budget past its limit closes (1013);
    // the others go on, and what a connection held leaves with it.
    let budget = Arc::new(admission::Budget::new(6000));
    let mut a = Client::new();
    a.conn.share_budget(budget.clone());
    let mut b = Client::new();
    b.conn.share_budget(budget.clone());
    a.forward(&create(json!({"model": "m", "input": "x".repeat(1400)})));
    b.forward(&create(json!({"model": "m", "input": "x".repeat(500)})));
    assert!(budget.used() <= 6000, "{}", budget.used());
    b.send(&create(json!({"model": "m", "input": "x".repeat(4500)})));
    assert!(b.conn.is_closed() && !a.conn.is_closed());
    assert_eq!(
        b.received().last(),
        Some(&Frame::Close(1013, "server memory limit".into()))
    );
    assert!(budget.used() < 4000, "{}", budget.used());
    drop(a);
    drop(b);
    assert_eq!(budget.used(), 0);
}

/// What a host holds toward a client that does not read counts in the shared budget, at the
/// host's watermark, from when it says it cannot write to when it can again.
#[test]
fn what_the_host_holds_for_a_client_that_does_not_read_is_counted() {
    let budget = Arc::new(admission::Budget::new(10_000));
    let mut clients: Vec<Client> = (0..3).map(|_| Client::new()).collect();
    for c in &mut clients {
        c.conn.share_budget(budget.clone());
        c.conn.set_write_buffer(4000);
    }
    let now = clients[0].now();
    clients[0].conn.handle_writable(now, false);
    assert_eq!(budget.used(), 4000);
    clients[0].conn.handle_writable(now, true);
    assert_eq!(budget.used(), 0, "the host can write again");
    clients[0].conn.handle_writable(now, false);
    clients[1].conn.handle_writable(now, false);
    assert_eq!(budget.used(), 8000, "just under");
    assert!(!clients[0].conn.is_closed() && !clients[1].conn.is_closed());
    // The third takes the total past the budget: it closes (1013), the others go on.
    clients[2].conn.handle_writable(now, false);
    assert!(clients[2].conn.is_closed(), "just over");
    assert!(!clients[0].conn.is_closed() && !clients[1].conn.is_closed());
    assert_eq!(
        clients[2].received().last(),
        Some(&Frame::Close(1013, "server memory limit".into()))
    );
    clients.truncate(1);
    assert_eq!(budget.used(), 4000);
    // The piece that filled the host's buffer counts with it.
    let c = &mut clients[0];
    c.conn.handle_writable(now, true);
    c.bytes(&masked(0x9, &[b'p'; 100]));
    let pong = c.conn.poll_transmit().expect("the pong").len();
    c.conn.handle_writable(now, false);
    assert_eq!(budget.used(), 4000 + pong);
}

/// What a streamed answer's translation keeps of its output counts too: a response whose
/// output outgrows the connection's limit ends it (1008), though the client reads every event.
#[test]
fn the_output_of_the_response_in_flight_counts_toward_the_limit() {
    let small = Limits {
        max_socket_bytes: 8192,
        ..limits()
    };
    let mut c = Client::with(Arc::new(Settings::default()), small, &[]);
    let call = c.forward(&create(json!({"model": "m", "input": "hi"})));
    c.head(&call, 200, "text/event-stream");
    let delta = format!(
        "data: {}\n\n",
        json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
               "choices": [{"index": 0, "delta": {"content": "x".repeat(1000)}}]})
    );
    let mut sent = 0;
    while !c.conn.is_closed() && sent < 20 {
        c.data(&call, delta.as_bytes());
        c.received();
        sent += 1;
    }
    assert!(c.conn.is_closed(), "{} bytes held", c.conn.held());
    assert!(
        (5..=10).contains(&sent),
        "closed after {sent} KiB of output"
    );
    assert_eq!(closed(&c.events()), [(1008, "connection memory limit")]);
}

#[test]
fn content_is_told_only_when_asked() {
    let mut c = Client::new();
    c.forward(&create(json!({"model": "m", "input": "secret"})));
    assert!(!c
        .events()
        .iter()
        .any(|e| matches!(e, Event::Message { text: _, .. })));
    let mut c = Client::new();
    c.conn.record_content(true);
    let message = create(json!({"model": "m", "input": "secret"}));
    c.forward(&message);
    assert!(c
        .events()
        .iter()
        .any(|e| matches!(e, Event::Message { text: m, .. } if m[..] == message[..])));
}

/// Automatic compaction on the socket: the summarising call first (JSON, not streamed), then
/// the turn's own call on the compacted window, the `compaction` item leading its events; a
/// summarising call that outlives `compaction_timeout` is stopped and ends the response with
/// its error event.
#[test]
fn a_response_over_its_threshold_is_compacted_first() {
    use crate::translate::seal::Keyring;
    let mut settings = Settings::default();
    settings.options.keyring = Some(Arc::new(Keyring::single("k", [5; 32]).unwrap()));
    let settings = Arc::new(settings);
    let request = json!({"model": "m",
    "context_management": [{"type": "compaction", "compact_threshold": 10}],
    "input": [
        {"role": "user", "content": "Tell me about cats, at length, with every detail."},
        {"role": "assistant", "content": "Cats are small carnivorous mammals."},
        {"role": "user", "content": "Now dogs."}
    ]});
    let summary = br#"{"choices":[{"index":0,"message":{"content":"cats were discussed"}}]}"#;

    let mut c = Client::with(settings.clone(), limits(), &[("authorization", "Bearer k")]);
    let side = c.forward(&create(request.clone()));
    assert_eq!(chat(&side)["stream"], false);
    assert!(side
        .headers
        .iter()
        .any(|(n, v)| n == "authorization" && v == "Bearer k"));
    c.head(&side, 200, "application/json");
    c.data(&side, summary);
    c.end(&side);
    let calls = c.calls();
    let [CallAction::Start(turn)] = &calls[..] else {
        panic!("{calls:?}")
    };
    let sent = chat(turn)["messages"].to_string();
    assert!(
        sent.contains("cats were discussed") && sent.contains("Now dogs."),
        "{sent}"
    );
    assert!(!sent.contains("carnivorous"), "{sent}");
    let events = c.answer(turn, "Dogs bark.");
    let kinds: Vec<String> = events
        .iter()
        .map(|e| {
            let item = e["item"]["type"].as_str().unwrap_or_default();
            format!("{} {item}", e["type"].as_str().unwrap())
        })
        .collect();
    assert_eq!(
        kinds[..6],
        [
            "response.created ",
            "response.in_progress ",
            "response.output_item.added compaction",
            "response.compaction.compacting ",
            "response.output_item.done compaction",
            "response.output_item.added message",
        ],
        "{kinds:?}"
    );
    let events = c.events();
    assert!(events.iter().any(
        |e| matches!(e, Event::Response { event: life::Event::Call(t), .. }
        if t.compaction.map(|c| c.outcome) == Some(crate::exchange::CompactionOutcome::Compacted))
    ));

    // The summarising call hangs: at compaction_timeout it is stopped, and the response ends.
    let mut c = Client::with(settings, limits(), &[]);
    let side = c.forward(&create(request));
    c.head(&side, 200, "application/json");
    let timeout = Settings::default().compaction_timeout;
    assert_eq!(c.conn.poll_timeout(), Some(c.t0 + timeout));
    c.wait(timeout.as_millis() as u64);
    c.timeout();
    let calls = c.calls();
    assert!(
        matches!(&calls[..], [CallAction::Cancel(id)] if *id == side.id),
        "{calls:?}"
    );
    let frames = c.texts();
    assert_eq!(frames[0]["type"], "error", "{frames:?}");
    assert_eq!(code(&frames[0]), "upstream_timeout");
    assert!(c.conn.exchange().is_none());
}

#[test]
fn a_host_that_holds_input_reads_only_what_the_connection_wants() {
    // Twenty messages in one piece, the first held by its call: the connection reads as far
    // as its queue takes (the first, then eight waiting), the host keeps the rest.
    let mut c = Client::new();
    let messages: Vec<Vec<u8>> = (0..20)
        .map(|i| {
            masked(
                0x1,
                &create(json!({"model": "m", "input": format!("q{i}")})),
            )
        })
        .collect();
    let piece = messages.concat();
    let now = c.now();
    let read = c.conn.read_bytes(now, &piece);
    let nine: usize = messages[..1 + MAX_QUEUED_MESSAGES]
        .iter()
        .map(Vec::len)
        .sum();
    assert_eq!(read, nine);
    assert!(!c.conn.wants_input() && c.conn.reading());
    assert_eq!(
        c.conn.read_bytes(now, &piece[read..]),
        0,
        "nothing more now"
    );
    // Each response that ends makes room for one more, in order, and nothing is lost.
    let mut rest = &piece[read..];
    for i in 0..20 {
        let calls = c.calls();
        let call = calls
            .iter()
            .find_map(|a| match a {
                CallAction::Start(call) => Some(call.clone()),
                CallAction::Cancel(_) | CallAction::Record(_) => None,
            })
            .unwrap_or_else(|| panic!("turn {i}: {calls:?}"));
        assert_eq!(chat(&call)["messages"][0]["content"], format!("q{i}"));
        c.answer(&call, "a");
        let now = c.now();
        let n = c.conn.read_bytes(now, rest);
        rest = &rest[n..];
    }
    assert!(rest.is_empty());
    // Partial frames are read (the decoder holds them): a piece split anywhere reads whole.
    let mut c = Client::new();
    let one = masked(0x1, &create(json!({"model": "m", "input": "x"})));
    let now = c.now();
    assert_eq!(c.conn.read_bytes(now, &one[..5]), 5);
    assert_eq!(c.conn.read_bytes(now, &one[5..]), one.len() - 5);
    assert!(matches!(&c.calls()[..], [CallAction::Start(_)]));
    // A connection that stopped reading for good reads nothing: the host drops the bytes.
    let mut c = Client::new();
    c.bytes(&masked(0x1, &[0xff]));
    assert!(!c.conn.reading());
    let now = c.now();
    assert_eq!(c.conn.read_bytes(now, &one), 0);
}

#[test]
fn a_host_that_fails_closes_the_connection_with_1011() {
    let mut c = Client::new();
    let call = c.forward(&create(json!({"model": "m", "input": "one"})));
    c.head(&call, 200, SSE);
    c.send(&create(json!({"model": "m", "input": "queued"})));
    let now = c.now();
    c.conn.handle_failure(now);
    assert!(c.conn.is_closed() && !c.conn.reading());
    assert_eq!(c.received(), [Frame::Close(1011, "internal error".into())]);
    assert!(matches!(&c.calls()[..], [CallAction::Cancel(id)] if *id == call.id));
    let events = c.events();
    let f = finished(&events);
    assert_eq!((f.len(), f[0].cut), (1, true));
    assert_eq!(closed(&events), [(1011, "internal error")]);
    // After our own close frame, a failure sends nothing more and tells no second close.
    let mut c = Client::new();
    c.wait(limits().idle_timeout.as_millis() as u64);
    c.timeout();
    assert_eq!(c.received(), [Frame::Close(1000, "idle timeout".into())]);
    let now = c.now();
    c.conn.handle_failure(now);
    assert!(c.received().is_empty() && c.conn.is_closed());
    assert_eq!(closed(&c.events()), [(1000, "idle timeout")]);
}

#[test]
fn only_websocket_upgrades_on_the_responses_path_open_the_transport() {
    let settings = Settings::default();
    let opens = |pairs: &[(&str, &str)]| {
        opens(&settings, |name| {
            pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
        })
    };
    assert!(opens(&[
        (":path", "/v1/responses"),
        ("upgrade", "websocket")
    ]));
    assert!(opens(&[
        (":path", "/v1/responses?x=1"),
        ("upgrade", "h2c, WebSocket")
    ]));
    assert!(opens(&[
        (":method", "CONNECT"),
        (":path", "/v1/responses"),
        (":protocol", "websocket")
    ]));
    assert!(!opens(&[(":path", "/v1/responses")]));
    assert!(!opens(&[(":path", "/v1/responses"), ("upgrade", "h2c")]));
    assert!(!opens(&[
        (":path", "/v1/responses/compact"),
        ("upgrade", "websocket")
    ]));
    assert!(!opens(&[
        (":path", "/v1/chat/completions"),
        ("upgrade", "websocket")
    ]));
}

/// The fields of a record, by key.
fn field<'r>(record: &'r Record, key: &str) -> Option<&'r MetadataValue> {
    record
        .fields
        .iter()
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

fn text(s: &str) -> Option<MetadataValue> {
    Some(MetadataValue::Str(s.to_owned()))
}

#[test]
fn each_ended_response_is_recorded_with_its_summary_its_socket_and_its_calls_headers() {
    use crate::metadata::MetadataValue::Num;
    let settings = Arc::new(Settings::default());
    let handshake = [
        ("x-request-id", "upgrade-1"),
        ("authorization", "Bearer k"),
        ("x-client-id", "alice"),
        ("cookie", "secret"),
    ];
    let mut c = Client::with(settings, limits(), &handshake);
    let call = c.forward(&create(json!({"model": "m", "input": "hi"})));
    assert!(c.records().is_empty(), "none before the response ends");
    c.head(&call, 200, SSE);
    let usage = json!({"id": "c1", "object": "chat.completion.chunk", "model": "m",
        "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 8, "total_tokens": 18}});
    let mut stream = chat_stream("hello");
    stream.insert_str(
        stream.find("data: [DONE]").unwrap(),
        &format!("data: {usage}\n\n"),
    );
    c.data(&call, stream.as_bytes());
    c.end(&call);
    let events = c.texts();
    assert_eq!(events.last().unwrap()["type"], "response.completed");
    let id = id_of(&events);
    let records = c.records();
    assert_eq!(records.len(), 1, "{records:?}");
    let r = &records[0];
    assert_eq!(r.path, format!("/v1/responses/turns/{:032x}", r.token));
    let headers: Vec<(&str, &str)> = r
        .headers
        .iter()
        .map(|(n, v)| (n.as_ref(), v.as_str()))
        .collect();
    assert_eq!(
        headers,
        [
            ("x-responses-model", "m"),
            ("x-responses-upstream-model", "m"),
            ("authorization", "Bearer k"),
            ("x-request-id", "upgrade-1"),
            ("x-client-id", "alice"),
        ],
        "the call's headers, the handshake's cookie left behind"
    );
    assert_eq!(field(r, "response_id"), text(&id).as_ref());
    assert_eq!(field(r, "outcome"), text("translated").as_ref());
    assert_eq!(field(r, "total_tokens"), Some(&Num(18.0)));
    assert_eq!(field(r, "model"), text("m").as_ref());
    assert_eq!(field(r, "socket_id"), text("upgrade-1").as_ref());

    // A response the upstream's rate limit refused: recorded as failed, with no tokens, and
    // the socket goes on.
    let call = c.forward(&create(json!({"model": "m", "input": "again"})));
    c.head(&call, 429, "text/plain");
    c.end(&call);
    let events = c.texts();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["type"], "error");
    assert_eq!(events[0]["status"], 429);
    assert_eq!(code(&events[0]), "rate_limit_exceeded");
    let records = c.records();
    assert_eq!(records.len(), 1, "{records:?}");
    let failed = &records[0];
    assert_ne!(failed.token, r.token);
    assert_eq!(field(failed, "outcome"), text("failed").as_ref());
    assert_eq!(field(failed, "status"), Some(&Num(429.0)));
    assert_eq!(
        field(failed, "error_code"),
        text("rate_limit_exceeded").as_ref()
    );
    assert_eq!(field(failed, "total_tokens"), None);
    assert_eq!(field(failed, "socket_id"), text("upgrade-1").as_ref());
    let call = c.forward(&create(json!({"model": "m", "input": "on"})));
    c.answer(&call, "ok");
    assert_eq!(c.records().len(), 1);
}

#[test]
fn with_records_off_no_turn_asks_for_one() {
    let settings = Arc::new(Settings {
        turn_records: false,
        ..Settings::default()
    });
    let mut c = Client::with(settings, limits(), &[("x-client-id", "alice")]);
    let call = c.forward(&create(json!({"model": "m", "input": "hi"})));
    c.answer(&call, "ok");
    let call = c.forward(&create(json!({"model": "m", "input": "again"})));
    c.head(&call, 429, "text/plain");
    c.end(&call);
    assert_eq!(c.texts()[0]["type"], "error");
    assert!(c.records().is_empty(), "{:?}", c.records());
    assert!(c.calls().is_empty());
}

#[test]
fn a_preload_is_recorded_and_a_response_cut_with_its_connection_is_not() {
    // No x-request-id on the upgrade: the connection makes the socket's id up, once.
    let mut c = Client::new();
    c.send(&create(
        json!({"model": "m", "input": "ctx", "generate": false}),
    ));
    assert!(c.calls().is_empty());
    assert_eq!(c.texts().last().unwrap()["type"], "response.completed");
    let records = c.records();
    assert_eq!(records.len(), 1, "{records:?}");
    let socket = field(&records[0], "socket_id").cloned();
    assert!(
        matches!(&socket, Some(MetadataValue::Str(id)) if id.starts_with("ws_")),
        "{socket:?}"
    );
    assert_eq!(field(&records[0], "outcome"), text("translated").as_ref());

    let call = c.forward(&create(json!({"model": "m", "input": "hi"})));
    c.answer(&call, "a");
    let records = c.records();
    assert_eq!(field(&records[0], "socket_id"), socket.as_ref());

    // The client goes mid-response: the response is cut, as an HTTP exchange Envoy cut.
    let call = c.forward(&create(json!({"model": "m", "input": "more"})));
    c.head(&call, 200, SSE);
    c.bytes(&masked(0x8, &1000u16.to_be_bytes()));
    assert!(c.records().is_empty());
    assert!(matches!(&c.calls()[..], [CallAction::Cancel(id)] if *id == call.id));
}

/// A client whose turns end at once (`generate: false`) cannot make the host hold a record
/// per turn: with [`MAX_RECORDS_IN_FLIGHT`] on their way, the connection reads no more, and
/// reads again once one is over.
#[test]
fn records_on_their_way_are_bounded() {
    let mut c = Client::new();
    c.hold_records = true;
    for i in 0..MAX_RECORDS_IN_FLIGHT {
        c.poll_calls();
        assert!(c.conn.wants_input(), "turn {i}");
        c.send(&create(
            json!({"model": "m", "input": format!("{i}"), "generate": false}),
        ));
        assert_eq!(c.texts().last().unwrap()["type"], "response.completed");
    }
    assert_eq!(c.records().len(), MAX_RECORDS_IN_FLIGHT);
    assert!(!c.conn.wants_input(), "a record too many on its way");
    c.conn.handle_record_done();
    assert!(c.conn.wants_input());
}

mod lanes;
