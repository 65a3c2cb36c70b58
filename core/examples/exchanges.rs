//! Runs the exchanges of `benches/side_by_side.py` through the core alone, as the Envoy module
//! drives them (request body → head → the whole answer body in one piece), many times: a
//! steady workload for `valgrind --tool=callgrind`, whose instruction counts are stable on a
//! busy machine where timings are not.
//!
//! ```sh
//! cargo build --release -p responses-core --example exchanges
//! valgrind --tool=callgrind target/release/examples/exchanges sse 200
//! callgrind_annotate --inclusive=yes callgrind.out.<pid>
//! ```
//!
//! Arguments: `json` or `sse` (the benchmark's 411-byte `chat.completion` or its 64-event
//! llama-server stream), then the number of exchanges (default 100), then `driver` to run each
//! through the exchange driver as the module's hooks do (its actions and events included), so
//! that the driver's own cost is the difference. It checks each answer.

use std::sync::Arc;
use std::time::Instant;

use responses_core::driver::{Action, Driver, Event, Gathering};
use responses_core::environment::Environment;
use responses_core::exchange::{
    BodyStep, Exchange, HeadStep, Operation, Reply, RequestStep, ResponseHead, Settings,
};
use responses_core::translate::Meta;

const JSON_ANSWER: &[u8] = include_bytes!("../../benches/fixtures/chat.json");
const SSE_ANSWER: &[u8] = include_bytes!("../../benches/fixtures/chat.sse");
/// `RESPONSES_JSON` / `RESPONSES_SSE` of `benches/side_by_side.py`.
const JSON_REQUEST: &[u8] = br#"{"model": "bench-model", "input": "Say something."}"#;
const SSE_REQUEST: &[u8] =
    br#"{"model": "bench-model", "input": "Say something.", "stream": true}"#;

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "sse".into());
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let (request, content_type, answer) = match kind.as_str() {
        "json" => (JSON_REQUEST, "application/json", JSON_ANSWER),
        "sse" => (SSE_REQUEST, "text/event-stream", SSE_ANSWER),
        other => panic!("json or sse, not {other}"),
    };
    let settings = Arc::new(Settings::default());
    if args.next().as_deref() == Some("driver") {
        let bytes: usize = (0..n)
            .map(|i| driven(&settings, i, request, content_type, answer))
            .sum();
        println!("{n} {kind} exchanges through the driver, {bytes} bytes out");
        return;
    }
    let mut bytes = 0;
    for i in 0..n {
        let meta = Meta {
            now: 1_795_329_141 + i,
            id_seed: u128::from(i) << 64 | 0x0123_4567_89ab_cdef,
        };
        let mut ex = Exchange::new(settings.clone(), Operation::Create);
        ex.identify_client(|_| None);
        let RequestStep::Forward(_) = ex.request_body(request, true, meta) else {
            panic!("not forwarded");
        };
        let head = ResponseHead {
            status: 200,
            content_type,
            end_of_stream: false,
        };
        let out = match ex.response_head(head, meta.now) {
            HeadStep::Stream | HeadStep::Gather => ex.response_body(answer, true, meta.now),
            HeadStep::Reply(r) => panic!("replied {r:?}"),
        };
        let body = match out {
            BodyStep::Send(b) => b,
            BodyStep::Reply(Reply::Answer(a)) => a.body,
            other => panic!("not translated: {other:?}"),
        };
        assert!(ex.is_finished());
        bytes += body.len();
    }
    println!("{n} {kind} exchanges, {bytes} bytes out");
}

/// The module's fixed clock for the example: the same `created_at` and ids as above.
struct Seeded(u64);

impl Environment for Seeded {
    fn now(&self) -> u64 {
        1_795_329_141 + self.0
    }
    fn id_seed(&self) -> u128 {
        u128::from(self.0) << 64 | 0x0123_4567_89ab_cdef
    }
}

/// One exchange through the driver, fed as the module's hooks feed it (a lookup per head, the
/// body in one piece, the events polled after each hook); the bytes the client gets.
fn driven(
    settings: &Arc<Settings>,
    i: u64,
    request: &[u8],
    content_type: &str,
    answer: &[u8],
) -> usize {
    let mut d = Driver::new(settings.clone(), Seeded(i), Gathering::Pieces);
    let mut events = 0;
    let mut poll = |d: &mut Driver<Seeded>| {
        while let Some(e) = d.poll_event(Instant::now()) {
            events += usize::from(matches!(e, Event::Finished(_)));
        }
    };
    let request_head = [(":method", "POST"), (":path", "/v1/responses")];
    let found = |name: &str| {
        request_head
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
    };
    assert!(matches!(
        d.request_headers(Instant::now(), found, false),
        Action::ReadBody(_)
    ));
    poll(&mut d);
    let forwarded = d.request_body(Instant::now(), || [request], true);
    assert!(matches!(forwarded, Action::Forward { .. }), "{forwarded:?}");
    poll(&mut d);
    let answer_head = [(":status", "200"), ("content-type", content_type)];
    let found = |name: &str| {
        answer_head
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
    };
    d.response_headers(Instant::now(), found, false);
    poll(&mut d);
    let out = match d.response_body(Instant::now(), || [answer], true) {
        Action::Send { bytes, .. } => bytes.len(),
        Action::Answer { answer, .. } => answer.body.len(),
        other => panic!("not translated: {other:?}"),
    };
    poll(&mut d);
    d.closed(Instant::now());
    poll(&mut d);
    assert_eq!(events, 1, "finished once");
    out
}
