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
//! llama-server stream), then the number of exchanges (default 100). It checks each answer.

use std::sync::Arc;

use responses_core::exchange::{
    BodyStep, Exchange, HeadStep, Operation, RequestStep, ResponseHead, Settings,
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
    let mut bytes = 0;
    for i in 0..n {
        let meta = Meta {
            now: 1_795_329_141 + i,
            id_seed: u128::from(i) << 64 | 0x0123_4567_89ab_cdef,
        };
        let mut ex = Exchange::new(settings.clone(), Operation::Create);
        ex.request_head(|_| None);
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
            BodyStep::Reply(r) if r.translated => r.body,
            other => panic!("not translated: {other:?}"),
        };
        assert!(ex.is_finished());
        bytes += body.len();
    }
    println!("{n} {kind} exchanges, {bytes} bytes out");
}
