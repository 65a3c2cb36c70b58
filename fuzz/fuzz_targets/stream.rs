//! An upstream SSE body cut into arbitrary chunks: the translator must never panic, must end
//! with exactly one terminal event followed by `[DONE]`, and must give the same bytes however
//! the body is split.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use responses_extproc::translate::{stream::StreamTranslator, Exchange, Meta, Options};

#[derive(Debug, Arbitrary)]
struct Input {
    body: Vec<u8>,
    cuts: Vec<u16>,
    small_limits: bool,
}

fn translate(body: &[u8], cuts: &[usize], options: &Options) -> Vec<u8> {
    let exchange = Exchange::new("m", true, Meta { now: 1, id_seed: 7 }, options.clone());
    let mut t = StreamTranslator::new(exchange);
    let mut out = Vec::new();
    let mut at = 0;
    for &cut in cuts {
        let cut = cut.clamp(at, body.len());
        out.extend_from_slice(&t.push(&body[at..cut], 2));
        at = cut;
    }
    out.extend_from_slice(&t.push(&body[at..], 2));
    out.extend_from_slice(&t.finish(3));
    assert!(t.is_done());
    out
}

fuzz_target!(|input: Input| {
    let options = if input.small_limits {
        Options {
            max_sse_frame_bytes: 64,
            max_output_bytes: 256,
            ..Options::default()
        }
    } else {
        Options::default()
    };
    let mut cuts: Vec<usize> = input.cuts.iter().map(|&c| usize::from(c) % (input.body.len() + 1)).collect();
    cuts.sort_unstable();
    let split = translate(&input.body, &cuts, &options);
    let whole = translate(&input.body, &[], &options);
    assert_eq!(split, whole, "output depends on how the body was split");

    let text = std::str::from_utf8(&whole).expect("events are UTF-8");
    assert!(text.ends_with("data: [DONE]\n\n"));
    let terminals = text
        .matches("\nevent: response.completed\n")
        .chain(text.matches("\nevent: response.incomplete\n"))
        .chain(text.matches("\nevent: response.failed\n"))
        .count();
    assert_eq!(terminals, 1, "exactly one terminal event");
});
