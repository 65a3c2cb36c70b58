//! Runs the exchanges of `benches/side_by_side.py` through the core alone, as the Envoy module
//! drives them (request body → head → the answer body), many times: a steady workload for
//! `valgrind --tool=callgrind`, whose instruction counts are stable on a busy machine where
//! timings are not.
//!
//! ```sh
//! cargo build --release -p responses-core --example exchanges
//! valgrind --tool=callgrind target/release/examples/exchanges sse 200
//! callgrind_annotate --inclusive=yes callgrind.out.<pid>
//! ```
//!
//! Arguments: the scenario, then the number of exchanges (default 100), then `driver` to run
//! each through the exchange driver as the module's hooks do (one hook per piece, its actions
//! and events included), so that the driver's own cost is the difference. It checks each
//! answer.
//! - `json`: the benchmark's tiny request, its 411-byte `chat.completion`;
//! - `sse`: the same request streamed, the 64-event llama-server stream in one piece;
//! - `codex`: a real Codex CLI turn (`benches/fixtures/codex_turn.json`, 40 KB, streamed),
//!   answered by the 64-event stream;
//! - `long`: that turn grown to 400 KB (`codex_turn_400k.json`), the same answer;
//! - `sse500`: the tiny streamed request, answered by a 500-delta vLLM stream
//!   (`chat_500.sse`) handed over one frame at a time, as a trickled stream arrives.
//!
//! The request is handed over whole (the module gathers it), the answer in one piece except
//! for `sse500`.

use std::sync::Arc;
use std::time::Instant;

use responses_core::driver::{Action, Driver, Gathering};
use responses_core::environment::Environment;
use responses_core::exchange::{
    BodyStep, Exchange, HeadStep, Operation, Reply, RequestStep, ResponseHead, Settings,
};
use responses_core::life::Event;
use responses_core::settings::ExchangeConfig;
use responses_core::sse::split_frames;
use responses_core::translate::Meta;

const JSON_ANSWER: &[u8] = include_bytes!("../../benches/fixtures/chat.json");
const SSE_ANSWER: &[u8] = include_bytes!("../../benches/fixtures/chat.sse");
const SSE_500_ANSWER: &[u8] = include_bytes!("../../benches/fixtures/chat_500.sse");
const CODEX_REQUEST: &[u8] = include_bytes!("../../benches/fixtures/codex_turn.json");
const LONG_REQUEST: &[u8] = include_bytes!("../../benches/fixtures/codex_turn_400k.json");
/// `RESPONSES_JSON` / `RESPONSES_SSE` of `benches/side_by_side.py`.
const JSON_REQUEST: &[u8] = br#"{"model": "bench-model", "input": "Say something."}"#;
const SSE_REQUEST: &[u8] =
    br#"{"model": "bench-model", "input": "Say something.", "stream": true}"#;

/// One exchange of a scenario: the request, the answer's content type and its body pieces.
struct Scenario {
    request: &'static [u8],
    content_type: &'static str,
    answer: Vec<&'static [u8]>,
}

fn scenario(kind: &str) -> Scenario {
    let (request, content_type, answer) = match kind {
        "json" => (JSON_REQUEST, "application/json", JSON_ANSWER),
        "sse" => (SSE_REQUEST, "text/event-stream", SSE_ANSWER),
        "codex" => (CODEX_REQUEST, "text/event-stream", SSE_ANSWER),
        "long" => (LONG_REQUEST, "text/event-stream", SSE_ANSWER),
        "sse500" => (SSE_REQUEST, "text/event-stream", SSE_500_ANSWER),
        other => panic!("json, sse, codex, long or sse500, not {other}"),
    };
    let answer = if kind == "sse500" {
        split_frames(answer)
    } else {
        vec![answer]
    };
    Scenario {
        request,
        content_type,
        answer,
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "sse".into());
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let scenario = scenario(&kind);
    // The module's settings by default, with a fixed sealing key (Codex asks for
    // `reasoning.encrypted_content`, which needs one).
    let config = ExchangeConfig::default();
    let (keyring, _) = config
        .keyring(|_| unreachable!("no key file"), || [7; 32])
        .expect("a key");
    let settings = Arc::new(config.exchange_settings(Some(keyring)));
    if args.next().as_deref() == Some("driver") {
        let bytes: usize = (0..n).map(|i| driven(&settings, i, &scenario)).sum();
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
        ex.request_head(|_| None);
        match ex.request_body(scenario.request, true, meta) {
            RequestStep::Forward(_) => {}
            other => panic!("not forwarded: {other:?}"),
        }
        let head = ResponseHead {
            status: 200,
            content_type: scenario.content_type,
            end_of_stream: false,
        };
        match ex.response_head(head, meta.now) {
            HeadStep::Stream | HeadStep::Gather => {}
            HeadStep::Reply(r) => panic!("replied {r:?}"),
        }
        let last = scenario.answer.len() - 1;
        for (j, piece) in scenario.answer.iter().enumerate() {
            bytes += match ex.response_body(piece, j == last, meta.now) {
                BodyStep::Send(b) => b.len(),
                BodyStep::Reply(Reply::Answer(a)) => a.body.len(),
                BodyStep::Hold => 0,
                other => panic!("not translated: {other:?}"),
            };
        }
        assert!(ex.is_finished());
    }
    println!("{n} {kind} exchanges, {bytes} bytes out");
}

/// The same clock and ids as above, as the driver's environment.
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
/// request in one piece, one hook per answer piece, the events polled after each hook); the
/// bytes the client gets.
fn driven(settings: &Arc<Settings>, i: u64, scenario: &Scenario) -> usize {
    let mut d = Driver::new(settings.clone(), Seeded(i), Gathering::Pieces);
    let mut finished = 0;
    let mut poll = |d: &mut Driver<Seeded>| {
        let now = Instant::now();
        while let Some(e) = d.poll_event(now) {
            finished += usize::from(matches!(e, Event::Finished(_)));
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
        d.handle_request_headers(Instant::now(), found, false),
        Action::ReadBody(_)
    ));
    poll(&mut d);
    let forwarded = d.handle_request_body(Instant::now(), || [scenario.request], true);
    assert!(matches!(forwarded, Action::Forward { .. }), "{forwarded:?}");
    poll(&mut d);
    let answer_head = [(":status", "200"), ("content-type", scenario.content_type)];
    let found = |name: &str| {
        answer_head
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
    };
    d.handle_response_headers(Instant::now(), found, || answer_head, false);
    poll(&mut d);
    let mut bytes = 0;
    let last = scenario.answer.len() - 1;
    for (j, piece) in scenario.answer.iter().enumerate() {
        bytes += match d.handle_response_body(Instant::now(), || [*piece], j == last) {
            Action::Send { events, .. } => events.len(),
            Action::Answer { answer, .. } => answer.body.len(),
            Action::Hold => 0,
            other => panic!("not translated: {other:?}"),
        };
        poll(&mut d);
    }
    d.handle_closed(Instant::now());
    poll(&mut d);
    assert_eq!(finished, 1, "finished once");
    bytes
}
