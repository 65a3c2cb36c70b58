//! The driver with plain inputs: heads as lookups, bodies as byte pieces, times as instants a
//! test picks (so the timing it reports is exact).

use std::time::Duration;

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::driver::HeaderEdit;
use crate::exchange::Outcome;
use crate::life::Finished;
use crate::openresponses::Code;
use crate::translate::Options;
use crate::upstream_failure::KeptHeader;

mod compaction;

struct Fixed;

impl Environment for Fixed {
    fn now(&self) -> u64 {
        1_700_000_000
    }
    fn id_seed(&self) -> u128 {
        7
    }
}

const CHUNK: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
const ROLE: &[u8] = b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
const END: &[u8] =
    b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
const CHAT: &[u8] = br#"{"model":"llama","choices":[{"index":0,"finish_reason":"stop","message":{"content":"yo"}}],"usage":{"prompt_tokens":11,"completion_tokens":7,"total_tokens":18}}"#;

/// A driver, and the instant its host's callbacks are timed from.
struct Test {
    d: Driver<Fixed>,
    t0: Instant,
}

impl Test {
    fn new(gathering: Gathering) -> Test {
        Test::with(Settings::default(), gathering)
    }

    fn with(settings: Settings, gathering: Gathering) -> Test {
        Test {
            d: Driver::new(Arc::new(settings), Fixed, gathering),
            t0: Instant::now(),
        }
    }

    fn at(&self, ms: u64) -> Instant {
        self.t0 + Duration::from_millis(ms)
    }

    fn head(&mut self, ms: u64, pairs: &[(&str, &str)], end: bool) -> Action {
        let now = self.at(ms);
        self.d.handle_request_headers(now, lookup(pairs), end)
    }

    fn post(&mut self, ms: u64) -> Action {
        self.head(
            ms,
            &[(":method", "POST"), (":path", "/v1/responses")],
            false,
        )
    }

    fn body(&mut self, ms: u64, pieces: &[&[u8]], end: bool) -> Action {
        let now = self.at(ms);
        self.d
            .handle_request_body(now, || pieces.iter().copied(), end)
    }

    fn answer_head(&mut self, ms: u64, status: &str, content_type: &str, end: bool) -> Action {
        self.answer_head_with(
            ms,
            &[(":status", status), ("content-type", content_type)],
            end,
        )
    }

    fn answer_head_with(&mut self, ms: u64, pairs: &[(&str, &str)], end: bool) -> Action {
        let now = self.at(ms);
        self.d
            .handle_response_headers(now, lookup(pairs), || pairs.iter().copied(), end)
    }

    fn answer(&mut self, ms: u64, pieces: &[&[u8]], end: bool) -> Action {
        let now = self.at(ms);
        self.d
            .handle_response_body(now, || pieces.iter().copied(), end)
    }

    /// Every event due at `ms`.
    fn events(&mut self, ms: u64) -> Vec<Event> {
        let now = self.at(ms);
        std::iter::from_fn(|| self.d.poll_event(now)).collect()
    }

    /// A request forwarded upstream (events polled at once).
    fn forwarded(&mut self, request: Value) {
        assert!(matches!(self.post(0), Action::ReadBody(_)));
        let body = request.to_string();
        assert!(matches!(
            self.body(1, &[body.as_bytes()], true),
            Action::Forward { .. }
        ));
        self.events(1);
    }
}

fn lookup<'h>(pairs: &'h [(&'h str, &'h str)]) -> impl Fn(&str) -> Option<&'h str> + 'h {
    move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

fn set(edits: &Edits, name: &str) -> Option<String> {
    edits.iter().find_map(|e| match e {
        HeaderEdit::Set(n, v) if n == name => Some(v.to_string()),
        _ => None,
    })
}

fn removes(edits: &Edits, name: &str) -> bool {
    edits
        .iter()
        .any(|e| matches!(e, HeaderEdit::Remove(n) if *n == name))
}

fn finished(events: &[Event]) -> Vec<&Finished> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Finished(f) => Some(&**f),
            _ => None,
        })
        .collect()
}

fn code(error: &ErrorReply) -> Value {
    serde_json::from_slice::<Value>(&error.body).unwrap()["error"]["code"].clone()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn other_traffic_passes_and_tells_nothing() {
    for (method, path) in [("GET", "/v1/models"), ("POST", "/v1/chat/completions")] {
        let mut t = Test::new(Gathering::Pieces);
        assert!(matches!(
            t.head(0, &[(":method", method), (":path", path)], false),
            Action::Pass
        ));
        let mut read = false;
        let now = t.at(1);
        let action = t.d.handle_request_body(
            now,
            || {
                read = true;
                [&b"{}"[..]]
            },
            true,
        );
        assert!(matches!(action, Action::Pass));
        assert!(!read, "the host's body is not even looked at");
        assert!(matches!(
            t.answer_head(2, "200", "application/json", false),
            Action::Pass
        ));
        assert!(matches!(t.answer(3, &[b"{}"], true), Action::Pass));
        let now = t.at(4);
        t.d.handle_closed(now);
        assert!(t.events(4).is_empty());
        assert!(!t.d.is_ours());
    }
}

#[test]
fn a_json_exchange_is_forwarded_gathered_and_answered() {
    let mut t = Test::new(Gathering::Pieces);
    let Action::ReadBody(edits) = t.post(0) else {
        panic!("the request's body is read")
    };
    assert!(removes(&edits, "accept-encoding"));
    assert!(matches!(&t.events(0)[..], [Event::Claimed { elapsed }] if *elapsed == ms(0)));
    // The body in pieces: held until its end, then translated.
    assert!(matches!(
        t.body(1, &[br#"{"model":"m","#], false),
        Action::Hold
    ));
    let Action::Forward { edits, request } = t.body(2, &[br#""input":"#, br#""hi"}"#], true) else {
        panic!("not forwarded")
    };
    assert_eq!(
        set(&edits, ":path").as_deref(),
        Some("/v1/chat/completions")
    );
    assert_eq!(set(&edits, "x-responses-model").as_deref(), Some("m"));
    // No model map: the name sent is the one asked for.
    assert_eq!(
        set(&edits, "x-responses-upstream-model").as_deref(),
        Some("m")
    );
    assert_eq!(
        set(&edits, "content-length"),
        Some(request.body.len().to_string())
    );
    let chat: Value = serde_json::from_slice(&request.body).unwrap();
    assert_eq!(chat["messages"][0]["content"], "hi");
    assert_eq!(chat["model"], "m");
    assert!(t.events(3).is_empty());
    // The answer: gathered in pieces, then replaced whole, as a 200 whatever the 2xx.
    let Action::ReadBody(edits) = t.answer_head(10, "201", "application/json", false) else {
        panic!("not gathered")
    };
    assert!(removes(&edits, "content-length"));
    assert!(matches!(t.answer(11, &[&CHAT[..30]], false), Action::Hold));
    let Action::Answer { edits, answer } = t.answer(20, &[&CHAT[30..]], true) else {
        panic!("not answered")
    };
    assert_eq!(set(&edits, ":status").as_deref(), Some("200"));
    assert_eq!(
        set(&edits, "content-length"),
        Some(answer.body.len().to_string())
    );
    let v: Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(v["output"][0]["content"][0]["text"], "yo");
    // Told once, when it ended: its summary, and its time. Callbacks count as busy until
    // their last poll: the one at 2 ms for 1 ms (polled at 3), the last for 5 ms.
    let events = t.events(25);
    let [Event::Finished(f)] = &events[..] else {
        panic!("{events:?}")
    };
    assert!(!f.cut);
    assert_eq!(f.summary.outcome, Outcome::Translated);
    assert_eq!(f.summary.usage.map(|u| u.output_tokens), Some(7));
    assert_eq!(f.timing.total, ms(25));
    assert_eq!(f.timing.first_output, None);
    assert_eq!(f.timing.translation, ms(1 + 5));
    let now = t.at(30);
    t.d.handle_closed(now);
    assert!(t.events(30).is_empty(), "once");
}

/// The model map changes the Chat request's `model` only: the model header keeps the name
/// asked for (routes and rate limits keyed on it), the upstream model header carries the
/// name sent, and the answer (its `model`; no upstream `openai-model` header, which Codex
/// compares with the name it asked for) and the summary (logs, metrics, traces) keep the name
/// asked for, in JSON, in a stream and in a compaction alike. A name no entry matches passes
/// as sent.
#[test]
fn the_model_map_renames_the_chat_model_only() {
    use crate::model_map::{ModelAlias, ModelMap};
    use crate::translate::seal::Keyring;

    let aliases: Vec<ModelAlias> = ["gpt-*=qwen3", "gpt-5.4=qwen3-coder"]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
    let settings = Arc::new(Settings {
        options: Options {
            model_map: Arc::new(ModelMap::new(&aliases)),
            keyring: Some(Arc::new(Keyring::single("k", [1; 32]).unwrap())),
            ..Options::default()
        },
        ..Settings::default()
    });
    for (path, asked, sent, stream) in [
        ("/v1/responses", "gpt-5.4", "qwen3-coder", false),
        ("/v1/responses", "gpt-5.4", "qwen3-coder", true),
        ("/v1/responses", "gpt-4o-mini", "qwen3", false),
        ("/v1/responses/compact", "gpt-5.4", "qwen3-coder", false),
        ("/v1/responses", "llama", "llama", false),
        ("/v1/responses", "llama", "llama", true),
    ] {
        let case = format!("{path} {asked} stream={stream}");
        let mut t = Test {
            d: Driver::new(settings.clone(), Fixed, Gathering::Pieces),
            t0: Instant::now(),
        };
        let Action::ReadBody(_) = t.head(0, &[(":method", "POST"), (":path", path)], false) else {
            panic!("{case}: not read")
        };
        let body = json!({"model": asked, "input": "hi", "stream": stream}).to_string();
        let Action::Forward { edits, request } = t.body(1, &[body.as_bytes()], true) else {
            panic!("{case}: not forwarded")
        };
        assert_eq!(
            set(&edits, "x-responses-model").as_deref(),
            Some(asked),
            "{case}"
        );
        assert_eq!(
            set(&edits, "x-responses-upstream-model").as_deref(),
            Some(sent),
            "{case}"
        );
        assert_eq!(
            (request.model.as_str(), request.chat_model.as_str()),
            (asked, sent)
        );
        let chat: Value = serde_json::from_slice(&request.body).unwrap();
        assert_eq!(chat["model"], sent, "{case}");
        // The upstream names the model that answered, as vLLM does: the name it was sent.
        let answered = if stream {
            let chunk = json!({"model": sent, "choices": [{"index": 0,
                "delta": {"content": "yo"}, "finish_reason": "stop"}]});
            let head = [
                (":status", "200"),
                ("content-type", "text/event-stream"),
                ("openai-model", sent),
            ];
            let Action::OpenStream(edits) = t.answer_head_with(2, &head, false) else {
                panic!("{case}: no stream")
            };
            assert!(removes(&edits, "openai-model"), "{case}");
            let Action::Send { events: bytes, .. } = t.answer(
                3,
                &[format!("data: {chunk}\n\ndata: [DONE]\n\n").as_bytes()],
                true,
            ) else {
                panic!("{case}: not streamed")
            };
            let text = String::from_utf8(bytes.to_vec()).unwrap();
            let models: Vec<Value> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .filter_map(|e| e.get("response").map(|r| r["model"].clone()))
                .collect();
            assert!(models.len() >= 2, "{case}: {text}");
            models
        } else {
            let answer = json!({"model": sent, "choices": [{"index": 0, "finish_reason": "stop",
                "message": {"content": "yo"}}]});
            let head = [
                (":status", "200"),
                ("content-type", "application/json"),
                ("openai-model", sent),
            ];
            let Action::ReadBody(edits) = t.answer_head_with(2, &head, false) else {
                panic!("{case}: not gathered")
            };
            assert!(removes(&edits, "openai-model"), "{case}");
            let Action::Answer { answer: a, .. } =
                t.answer(3, &[answer.to_string().as_bytes()], true)
            else {
                panic!("{case}: not answered")
            };
            let v: Value = serde_json::from_slice(&a.body).unwrap();
            if path.ends_with("compact") {
                assert_eq!(v["object"], "response.compaction", "{case}: {v}");
                vec![]
            } else {
                vec![v["model"].clone()]
            }
        };
        assert!(answered.iter().all(|m| *m == asked), "{case}: {answered:?}");
        let events = t.events(4);
        let [f] = &finished(&events)[..] else {
            panic!("{case}: {events:?}")
        };
        assert_eq!(f.summary.outcome, Outcome::Translated, "{case}");
        assert_eq!(f.summary.model.as_deref(), Some(asked), "{case}");
        assert_eq!(f.summary.upstream_model.as_deref(), Some(sent), "{case}");
    }
}

/// A body in pieces is gathered into a buffer of its `content-length`: right, short, long,
/// over the cap or not a number, the request forwarded is the same.
#[test]
fn a_body_in_pieces_forwards_the_same_whatever_length_it_announced() {
    let pieces: [&[u8]; 3] = [br#"{"model":"m","#, br#""input":"#, br#""hi"}"#];
    let length = pieces.iter().map(|p| p.len()).sum::<usize>().to_string();
    let forwarded = |announced: Option<&str>| {
        let mut t = Test::new(Gathering::Pieces);
        let mut head = vec![(":method", "POST"), (":path", "/v1/responses")];
        head.extend(announced.map(|n| ("content-length", n)));
        assert!(matches!(t.head(0, &head, false), Action::ReadBody(_)));
        assert!(matches!(t.body(1, &pieces[..1], false), Action::Hold));
        let Action::Forward { request, .. } = t.body(2, &pieces[1..], true) else {
            panic!("not forwarded")
        };
        request.body
    };
    let expected = forwarded(None);
    for announced in [&length[..], "3", "70000", "18446744073709551615", "x"] {
        assert_eq!(forwarded(Some(announced)), expected, "{announced}");
    }
}

#[test]
fn a_stream_opens_shows_output_and_closes() {
    let mut t = Test::new(Gathering::Whole);
    t.forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    let Action::OpenStream(edits) = t.answer_head(10, "200", "text/event-stream", false) else {
        panic!("not streamed")
    };
    assert_eq!(set(&edits, ":status").as_deref(), Some("200"));
    assert_eq!(set(&edits, "cache-control").as_deref(), Some("no-cache"));
    assert!(removes(&edits, "content-length"));
    assert!(matches!(&t.events(10)[..], [Event::StreamOpened]));
    // No output yet: the role alone.
    let Action::Send {
        events: bytes,
        end: false,
    } = t.answer(12, &[ROLE], false)
    else {
        panic!("not sent")
    };
    assert!(String::from_utf8_lossy(&bytes).contains("response.created"));
    assert!(t.events(12).is_empty());
    // A piece cut mid-event, in two slices: the text goes out once whole.
    let (a, b) = CHUNK.split_at(20);
    assert!(matches!(t.answer(14, &[a], false), Action::Send { .. }));
    let Action::Send { events: bytes, .. } = t.answer(15, &[b], false) else {
        panic!("not sent")
    };
    assert!(String::from_utf8_lossy(&bytes).contains("\"delta\":\"Hi\""));
    assert!(matches!(&t.events(16)[..], [Event::FirstOutput { elapsed }] if *elapsed == ms(16)));
    let Action::Send {
        events: bytes,
        end: true,
    } = t.answer(20, &[END], true)
    else {
        panic!("not ended")
    };
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("event: response.completed") && text.ends_with("data: [DONE]\n\n"));
    let events = t.events(21);
    let [Event::StreamClosed, Event::Finished(f)] = &events[..] else {
        panic!("{events:?}")
    };
    assert_eq!(f.summary.outcome, Outcome::Translated);
    assert_eq!(f.timing.first_output, Some(ms(16)));
    // The upstream goes on after [DONE]: nothing more reaches the client.
    assert!(matches!(
        t.answer(22, &[CHUNK], true),
        Action::Send { events: bytes, .. } if bytes.is_empty()
    ));
    assert!(t.events(23).is_empty());
}

#[test]
fn a_stream_answering_a_json_request_is_folded() {
    let mut t = Test::new(Gathering::Whole);
    t.forwarded(json!({"model": "m", "input": "hi"}));
    assert!(matches!(
        t.answer_head(2, "200", "text/event-stream", false),
        Action::ReadBody(_)
    ));
    let whole = [CHUNK, END].concat();
    let Action::Answer { answer, .. } = t.answer(3, &[&whole], true) else {
        panic!("not folded")
    };
    assert_eq!(answer.body.content_type(), exchange::JSON);
    let v: Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(v["output"][0]["content"][0]["text"], "Hi");
    assert_eq!(finished(&t.events(3)).len(), 1);
}

#[test]
fn refused_requests_are_replies_and_the_reply_passes_back() {
    // An invalid body.
    let mut t = Test::new(Gathering::Pieces);
    t.post(0);
    let Action::Reply { error, cause } = t.body(1, &[b"[1]"], true) else {
        panic!("not refused")
    };
    assert_eq!((error.status(), cause), (400, Cause::Request));
    assert_eq!(cause.details(), DETAILS_REQUEST);
    let events = t.events(2);
    let [Event::Claimed { .. }, Event::Finished(f)] = &events[..] else {
        panic!("{events:?}")
    };
    assert_eq!(f.summary.outcome, Outcome::Failed);
    assert_eq!(
        f.summary.error_code.as_ref().map(Code::as_str),
        code(&error).as_str()
    );
    // The host shows our reply to the response callbacks: it passes untouched.
    assert!(matches!(
        t.answer_head(3, "400", "application/json", false),
        Action::Pass
    ));
    assert!(matches!(t.answer(4, &[&error.body], true), Action::Pass));
    // Later request pieces are dropped.
    assert!(matches!(t.body(5, &[b"more"], true), Action::Hold));
    assert!(t.events(6).is_empty());

    // No body at all: refused at the head.
    let mut t = Test::new(Gathering::Pieces);
    let Action::Reply { error, .. } =
        t.head(0, &[(":method", "POST"), (":path", "/v1/responses")], true)
    else {
        panic!("not refused")
    };
    assert_eq!(code(&error), "missing_body");
    assert_eq!(finished(&t.events(0)).len(), 1);

    // Over the cap, before its end.
    let settings = Settings {
        options: Options {
            max_request_bytes: 100,
            ..Options::default()
        },
        ..Settings::default()
    };
    let mut t = Test::with(settings, Gathering::Pieces);
    t.post(0);
    assert!(matches!(t.body(1, &[&[b'x'; 60]], false), Action::Hold));
    let Action::Reply { error, .. } = t.body(2, &[&[b'x'; 60]], false) else {
        panic!("not refused")
    };
    assert_eq!(
        (error.status(), code(&error)),
        (413, json!("request_too_large"))
    );
}

#[test]
fn upstream_errors_and_a_full_host_buffer_are_envelopes() {
    // The upstream's 429, gathered and replaced.
    let mut t = Test::new(Gathering::Pieces);
    t.forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    assert!(matches!(
        t.answer_head(2, "429", "application/json", false),
        Action::ReadBody(_)
    ));
    let Action::Reply { error, cause } = t.answer(3, &[br#"{"error":{"message":"slow"}}"#], true)
    else {
        panic!("no envelope")
    };
    assert_eq!((error.status(), cause), (429, Cause::Answer));
    assert!(String::from_utf8_lossy(&error.body).contains("slow"));
    assert_eq!(finished(&t.events(3)).len(), 1);

    // A host that hands gathered bodies whole: a piece before the end means its buffer is
    // full, and the answer ends there.
    let mut t = Test::new(Gathering::Whole);
    t.forwarded(json!({"model": "m", "input": "hi"}));
    t.answer_head(2, "200", "application/json", false);
    let Action::Reply { error, .. } = t.answer(3, &[&CHAT[..30]], false) else {
        panic!("no envelope")
    };
    assert_eq!(
        (error.status(), code(&error)),
        (502, json!("upstream_response_too_large"))
    );

    // The host answered before anything was forwarded (Envoy's 413): never an upstream
    // error.
    let mut t = Test::new(Gathering::Pieces);
    t.post(0);
    t.body(1, &[b"{\"model\":"], false);
    t.answer_head(2, "413", "text/plain", false);
    let Action::Reply { error, .. } = t.answer(3, &[b"Payload Too Large"], true) else {
        panic!("no envelope")
    };
    assert_eq!(
        (error.status(), code(&error)),
        (413, json!("request_too_large"))
    );
}

#[test]
fn an_upstream_error_keeps_the_headers_a_client_retries_by() {
    let head = [
        (":status", "429"),
        ("content-type", "application/json"),
        ("retry-after", "1"),
        ("x-ratelimit-remaining-requests", "0"),
        ("set-cookie", "a=b"),
    ];
    let kept = [
        KeptHeader::new("retry-after", "1"),
        KeptHeader::new("x-ratelimit-remaining-requests", "0"),
    ];
    // A stream asked for, refused before it opened: the envelope, with the kept headers.
    let mut t = Test::new(Gathering::Pieces);
    t.forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    assert!(matches!(
        t.answer_head_with(2, &head, false),
        Action::ReadBody(_)
    ));
    let Action::Reply { error, .. } = t.answer(3, &[br#"{"error":{"message":"slow"}}"#], true)
    else {
        panic!("no envelope")
    };
    assert_eq!((error.status(), &error.headers[..]), (429, &kept[..]));
    // The same without a body: answered at the head.
    let mut t = Test::new(Gathering::Whole);
    t.forwarded(json!({"model": "m", "input": "hi"}));
    let Action::Reply { error, .. } = t.answer_head_with(2, &head, true) else {
        panic!("no envelope")
    };
    assert_eq!((error.status(), &error.headers[..]), (429, &kept[..]));
    // A success's headers are not even read (OpenAI sends x-ratelimit-* on every answer).
    let mut t = Test::new(Gathering::Pieces);
    t.forwarded(json!({"model": "m", "input": "hi"}));
    let pairs = [(":status", "200"), ("content-type", "application/json")];
    let now = t.at(2);
    let action = t.d.handle_response_headers(
        now,
        lookup(&pairs),
        || -> [(&str, &str); 0] { panic!("a success's headers read") },
        false,
    );
    assert!(matches!(action, Action::ReadBody(_)));
    let Action::Answer { answer, .. } = t.answer(3, &[CHAT], true) else {
        panic!("not answered")
    };
    assert_eq!(answer.status, 200);
}

#[test]
fn a_stream_without_a_body_is_answered_whole_at_its_head() {
    let mut t = Test::new(Gathering::Pieces);
    t.forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    let Action::Answer { edits, answer } = t.answer_head(2, "200", "text/event-stream", true)
    else {
        panic!("not answered")
    };
    assert_eq!(
        set(&edits, "content-type").as_deref(),
        Some(exchange::EVENT_STREAM)
    );
    assert!(removes(&edits, "content-length"));
    let text = String::from_utf8_lossy(&answer.body);
    assert!(text.contains("event: response.failed") && text.ends_with("data: [DONE]\n\n"));
    let events = t.events(3);
    assert!(
        !events.iter().any(|e| matches!(e, Event::StreamOpened)),
        "{events:?}"
    );
    assert_eq!(finished(&events)[0].summary.outcome, Outcome::Failed);
}

#[test]
fn trailers_end_bodies_that_had_no_end() {
    // The answer's stream.
    let mut t = Test::new(Gathering::Pieces);
    t.forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    t.answer_head(2, "200", "text/event-stream", false);
    t.answer(3, &[CHUNK], false);
    let now = t.at(4);
    let Action::Send {
        events: bytes,
        end: true,
    } = t.d.handle_response_trailers(now)
    else {
        panic!("no ending")
    };
    assert!(String::from_utf8_lossy(&bytes).ends_with("data: [DONE]\n\n"));
    assert_eq!(finished(&t.events(4)).len(), 1);
    let now = t.at(5);
    assert!(
        matches!(t.d.handle_response_trailers(now), Action::Pass),
        "ended"
    );
    // A gathered answer.
    let mut t = Test::new(Gathering::Pieces);
    t.forwarded(json!({"model": "m", "input": "hi"}));
    t.answer_head(2, "200", "application/json", false);
    t.answer(3, &[CHAT], false);
    let now = t.at(4);
    assert!(matches!(
        t.d.handle_response_trailers(now),
        Action::Answer { .. }
    ));
    // The request's body.
    let mut t = Test::new(Gathering::Pieces);
    t.post(0);
    t.body(1, &[br#"{"model":"m","input":"hi"}"#], false);
    let now = t.at(2);
    assert!(matches!(
        t.d.handle_request_trailers(now),
        Action::Forward { .. }
    ));
    let now = t.at(3);
    assert!(
        matches!(t.d.handle_request_trailers(now), Action::Pass),
        "forwarded"
    );
}

#[test]
fn an_exchange_the_host_ends_first_is_cut() {
    let mut t = Test::new(Gathering::Pieces);
    t.forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    t.answer_head(2, "200", "text/event-stream", false);
    t.answer(3, &[CHUNK], false);
    t.events(4);
    let now = t.at(50);
    t.d.handle_closed(now);
    let events = t.events(50);
    let [Event::StreamClosed, Event::Finished(f)] = &events[..] else {
        panic!("{events:?}")
    };
    assert!(f.cut);
    assert_eq!(f.summary.outcome, Outcome::Open);
    assert_eq!(f.timing.total, ms(50));
    assert_eq!(f.timing.first_output, Some(ms(4)));
    let now = t.at(60);
    t.d.handle_closed(now);
    assert!(t.events(60).is_empty(), "once");
}

#[test]
fn a_failure_ends_the_exchange_with_what_can_still_be_sent() {
    // Before the answer: an envelope, in place of anything else.
    let mut t = Test::new(Gathering::Pieces);
    t.post(0);
    t.body(1, &[b"{\"model\":"], false);
    let now = t.at(2);
    let Action::Reply { error, cause } = t.d.handle_failure(now, Failure::Panic) else {
        panic!("no envelope")
    };
    assert_eq!((error.status(), cause), (500, Cause::Answer));
    assert_eq!(code(&error), "internal_error");
    assert_eq!(finished(&t.events(2)).len(), 1);
    let now = t.at(3);
    assert!(
        matches!(t.d.handle_failure(now, Failure::Panic), Action::Hold),
        "already"
    );
    assert!(matches!(t.body(4, &[b"x"], true), Action::Hold));

    // Mid-stream: the stream's failed ending, then nothing more of the upstream.
    let mut t = Test::new(Gathering::Pieces);
    t.forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    t.answer_head(2, "200", "text/event-stream", false);
    t.answer(3, &[CHUNK], false);
    let now = t.at(4);
    let Action::Send {
        events: bytes,
        end: true,
    } = t.d.handle_failure(now, Failure::Panic)
    else {
        panic!("no ending")
    };
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("event: response.failed") && text.ends_with("data: [DONE]\n\n"));
    let events = t.events(4);
    let f = finished(&events);
    assert_eq!(f.len(), 1);
    assert_eq!(
        f[0].summary.error_code.as_ref().map(Code::as_str),
        Some("internal_error")
    );
    assert!(!f[0].cut);
    assert!(matches!(
        t.answer(5, &[b"data: raw\n\n"], true),
        Action::Send { events: bytes, .. } if bytes.is_empty()
    ));
    let now = t.at(6);
    t.d.handle_closed(now);
    assert!(t.events(6).is_empty());

    // An unreadable message while the request arrives: it is too large.
    let mut t = Test::new(Gathering::Whole);
    t.post(0);
    let now = t.at(1);
    let Action::Reply { error, .. } = t.d.handle_failure(now, Failure::Unreadable) else {
        panic!("no envelope")
    };
    assert_eq!(error.status(), 413);
    // Mid-stream: the stream's ending, too large.
    let mut t = Test::new(Gathering::Whole);
    t.forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    t.answer_head(2, "200", "text/event-stream", false);
    let now = t.at(3);
    let Action::Send { events: bytes, .. } = t.d.handle_failure(now, Failure::Unreadable) else {
        panic!("no ending")
    };
    assert!(String::from_utf8_lossy(&bytes).contains("response_too_large"));

    // Traffic that is not ours: an envelope all the same (nothing may pass after a panic),
    // and nothing to record.
    let mut t = Test::new(Gathering::Pieces);
    t.head(0, &[(":method", "GET"), (":path", "/")], true);
    let now = t.at(1);
    assert!(matches!(
        t.d.handle_failure(now, Failure::Panic),
        Action::Reply { .. }
    ));
    assert!(t.events(1).is_empty());

    // After the answer went out whole: only a reset is left.
    let mut t = Test::new(Gathering::Pieces);
    t.forwarded(json!({"model": "m", "input": "hi"}));
    t.answer_head(2, "200", "application/json", false);
    t.answer(3, &[CHAT], true);
    let now = t.at(4);
    assert!(matches!(
        t.d.handle_failure(now, Failure::Panic),
        Action::Reset { .. }
    ));
}

#[test]
fn a_second_head_after_the_streams_is_a_reset() {
    let mut t = Test::new(Gathering::Pieces);
    t.forwarded(json!({"model": "m", "input": "hi", "stream": true}));
    t.answer_head(2, "200", "text/event-stream", false);
    let Action::Reset { error, .. } = t.answer_head(3, "503", "text/plain", false) else {
        panic!("not reset")
    };
    assert_eq!(error.status(), 500);
    let events = t.events(3);
    assert!(matches!(
        &events[..],
        [Event::StreamOpened, Event::StreamClosed, Event::Finished(_)]
    ));
}

#[test]
fn an_answer_to_an_unseen_request_is_ours_and_never_passes() {
    // ext_proc's per-route mode can skip the request's head: the first callback claims it.
    let mut t = Test::new(Gathering::Whole);
    assert!(matches!(
        t.answer_head(0, "200", "application/json", false),
        Action::ReadBody(_)
    ));
    assert!(t.d.is_ours());
    let Action::Reply { error, .. } = t.answer(1, &[CHAT], true) else {
        panic!("not replaced")
    };
    assert!((400..600).contains(&error.status()));
    let events = t.events(1);
    assert!(matches!(
        &events[..],
        [Event::Claimed { .. }, Event::Finished(_)]
    ));
}

/// One callback of a random sequence.
#[derive(Debug, Clone)]
enum Input {
    RequestBody(Vec<u8>, bool),
    RequestTrailers,
    ResponseHeaders(u16, &'static str, bool),
    ResponseBody(Vec<u8>, bool),
    ResponseTrailers,
    Fail(bool),
}

fn input() -> impl Strategy<Value = Input> {
    let body = prop_oneof![
        Just(br#"{"model":"m","input":"hi"}"#.to_vec()),
        Just(br#"{"model":"m","input":"hi","stream":true}"#.to_vec()),
        Just(CHUNK.to_vec()),
        Just(END.to_vec()),
        Just(CHAT.to_vec()),
        proptest::collection::vec(any::<u8>(), 0..300),
    ];
    prop_oneof![
        (body.clone(), any::<bool>()).prop_map(|(b, end)| Input::RequestBody(b, end)),
        Just(Input::RequestTrailers),
        (
            prop_oneof![Just(200u16), Just(201), Just(413), Just(429), Just(503)],
            prop_oneof![
                Just("application/json"),
                Just("text/event-stream"),
                Just("text/plain"),
                Just("")
            ],
            any::<bool>()
        )
            .prop_map(|(s, c, end)| Input::ResponseHeaders(s, c, end)),
        (body, any::<bool>()).prop_map(|(b, end)| Input::ResponseBody(b, end)),
        Just(Input::ResponseTrailers),
        any::<bool>().prop_map(Input::Fail),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]
    /// Whatever the host reports, in any order: an exchange that is ours is told finished
    /// exactly once (by the end of the host's callbacks), a stream opened is closed, the first
    /// output is told at most once, and no body the host brought passes untouched unless it is
    /// our own reply coming back.
    #[test]
    fn prop_every_exchange_is_told_once(
        whole in any::<bool>(),
        skip_head in any::<bool>(),
        inputs in proptest::collection::vec(input(), 0..12),
    ) {
        let settings = Settings {
            max_body_bytes: 256,
            options: Options {
                max_request_bytes: 256,
                max_output_bytes: 256,
                max_sse_frame_bytes: 128,
                ..Options::default()
            },
            ..Settings::default()
        };
        let gathering = if whole { Gathering::Whole } else { Gathering::Pieces };
        let mut t = Test::with(settings, gathering);
        let mut events = Vec::new();
        if !skip_head {
            t.post(0);
            events.extend(t.events(0));
        }
        let mut replied = false;
        for (i, input) in inputs.into_iter().enumerate() {
            let ms = i as u64 + 1;
            let now = t.at(ms);
            let (action, body) = match &input {
                Input::RequestBody(b, end) => (t.body(ms, &[b.as_slice()], *end), !b.is_empty()),
                Input::RequestTrailers => (t.d.handle_request_trailers(now), false),
                Input::ResponseHeaders(s, c, end) => {
                    (t.answer_head(ms, &s.to_string(), c, *end), false)
                }
                Input::ResponseBody(b, end) => (t.answer(ms, &[b.as_slice()], *end), !b.is_empty()),
                Input::ResponseTrailers => (t.d.handle_response_trailers(now), false),
                Input::Fail(panic) => {
                    let why = if *panic { Failure::Panic } else { Failure::Unreadable };
                    (t.d.handle_failure(now, why), false)
                }
            };
            prop_assert!(
                !(body && matches!(action, Action::Pass)) || replied,
                "{input:?} passed untouched"
            );
            replied |= matches!(action, Action::Reply { .. });
            events.extend(t.events(ms));
        }
        let now = t.at(100);
        t.d.handle_closed(now);
        events.extend(t.events(100));
        let count = |f: fn(&Event) -> bool| events.iter().filter(|e| f(e)).count();
        let ours = usize::from(t.d.is_ours());
        prop_assert_eq!(count(|e| matches!(e, Event::Claimed { .. })), ours);
        prop_assert_eq!(count(|e| matches!(e, Event::Finished(_))), ours, "{:?}", events);
        prop_assert_eq!(
            count(|e| matches!(e, Event::StreamOpened)),
            count(|e| matches!(e, Event::StreamClosed))
        );
        let outputs = count(|e| matches!(e, Event::FirstOutput { .. }));
        prop_assert!(outputs <= 1, "{} first outputs", outputs);
        prop_assert!(ours == 0 || matches!(events.last(), Some(Event::Finished(_))));
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

#[test]
fn an_offloading_host_reads_a_costly_body_through_work_and_only_then() {
    let offloading = || Test {
        d: Driver::new(Arc::new(Settings::default()), Fixed, Gathering::Pieces).offloading(),
        t0: Instant::now(),
    };
    let gzipped = [
        (":method", "POST"),
        (":path", "/v1/responses"),
        ("content-encoding", "gzip"),
    ];
    let request = br#"{"model":"m","input":"hi"}"#;
    let encoded = gzip(request);
    let (first, rest) = encoded.split_at(encoded.len() / 2);

    // Compressed: gathered encoded, then handed over whole; the request holds meanwhile.
    let mut t = offloading();
    assert!(matches!(t.head(0, &gzipped, false), Action::ReadBody(_)));
    assert!(matches!(t.body(1, &[first], false), Action::Hold));
    let Action::Work(work) = t.body(2, &[rest], true) else {
        panic!("a compressed body is work")
    };
    assert_eq!(work.len(), encoded.len(), "held encoded");
    let now = t.at(3);
    assert!(matches!(t.d.handle_request_trailers(now), Action::Hold));
    assert!(matches!(t.body(3, &[b"more"], true), Action::Hold));
    let worked = std::thread::spawn(move || work.run()).join().unwrap();
    let now = t.at(4);
    let Action::Forward { request: up, .. } = t.d.handle_work_done(now, worked) else {
        panic!("forwarded once read")
    };
    let chat: Value = serde_json::from_slice(&up.body).unwrap();
    assert_eq!(chat["messages"][0]["content"], "hi");

    // The exchange ends while its body is read: the result is no one's, the exchange was cut.
    let mut t = offloading();
    t.head(0, &gzipped, false);
    let Action::Work(work) = t.body(1, &[&encoded], true) else {
        panic!("work")
    };
    let now = t.at(2);
    t.d.handle_closed(now);
    let now = t.at(3);
    assert!(matches!(
        t.d.handle_work_done(now, work.run()),
        Action::Hold
    ));
    let events = t.events(3);
    let ends = finished(&events);
    assert_eq!(ends.len(), 1);
    assert!(ends[0].cut);

    // Plain: small is read in place, 1 MiB or more is work.
    let mut t = offloading();
    t.post(0);
    assert!(matches!(
        t.body(1, &[request], true),
        Action::Forward { .. }
    ));
    let large = json!({"model": "m", "input": "x".repeat(exchange::COSTLY_BODY_BYTES)});
    let mut t = offloading();
    t.post(0);
    let Action::Work(work) = t.body(1, &[large.to_string().as_bytes()], true) else {
        panic!("a large body is work")
    };
    let now = t.at(2);
    assert!(matches!(
        t.d.handle_work_done(now, work.run()),
        Action::Forward { .. }
    ));

    // Refused: a 503 to retry, and nothing more of the request passes.
    let mut t = offloading();
    t.head(0, &gzipped, false);
    assert!(matches!(t.body(1, &[&encoded], true), Action::Work(_)));
    let now = t.at(2);
    let Action::Reply { error, cause } = t.d.handle_work_refused(now) else {
        panic!("an envelope")
    };
    assert_eq!((error.status(), cause), (503, Cause::Request));
    assert_eq!(code(&error), "server_is_overloaded");

    // A host that does not offload reads it in place (the processor, on its blocking pool).
    let mut t = Test::new(Gathering::Pieces);
    t.head(0, &gzipped, false);
    assert!(matches!(
        t.body(1, &[&encoded], true),
        Action::Forward { .. }
    ));
}

#[test]
fn envoys_reply_while_the_body_is_worked_on_ended_by_trailers_is_an_envelope() {
    let mut t = Test {
        d: Driver::new(Arc::new(Settings::default()), Fixed, Gathering::Pieces).offloading(),
        t0: Instant::now(),
    };
    let head = [
        (":method", "POST"),
        (":path", "/v1/responses"),
        ("content-encoding", "gzip"),
    ];
    t.head(0, &head, false);
    let Action::Work(work) = t.body(1, &[&gzip(br#"{"model":"m","input":"hi"}"#)], true) else {
        panic!("work")
    };
    assert!(matches!(
        t.answer_head(2, "200", "application/json", false),
        Action::ReadBody(_)
    ));
    let now = t.at(3);
    assert!(matches!(
        t.d.handle_response_trailers(now),
        Action::Reply { .. }
    ));
    let now = t.at(4);
    assert!(matches!(
        t.d.handle_work_done(now, work.run()),
        Action::Hold
    ));
}
