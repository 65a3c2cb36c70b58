//! The properties the fuzz targets check, shared with `tests/fuzz_corpus.rs`, which replays
//! the committed corpus through them in every `cargo test` (the CI smoke run).

use responses_extproc::translate::{
    stream::StreamTranslator, translate_request, Exchange, Meta, Options,
};

/// Arbitrary bytes as a `POST /v1/responses` body: Ok with a JSON Chat request, or a typed
/// 4xx error; never a panic.
pub fn request(data: &[u8]) {
    for strict in [false, true] {
        let options = Options {
            strict,
            ..Options::default()
        };
        match translate_request(data, &options, Meta { now: 1, id_seed: 7 }) {
            Ok(t) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&t.body).expect("the Chat body is JSON");
                assert!(v["messages"].is_array());
            }
            Err(e) => assert!((400..500).contains(&e.status), "{e}"),
        }
    }
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

/// An upstream SSE body cut at `cuts`: never a panic, exactly one terminal event then
/// `[DONE]`, and the same bytes however the body is split.
pub fn stream(body: &[u8], cuts: &[usize], small_limits: bool) {
    let options = if small_limits {
        Options {
            max_sse_frame_bytes: 64,
            max_output_bytes: 256,
            ..Options::default()
        }
    } else {
        Options::default()
    };
    let mut cuts: Vec<usize> = cuts.iter().map(|&c| c % (body.len() + 1)).collect();
    cuts.sort_unstable();
    let split = translate(body, &cuts, &options);
    let whole = translate(body, &[], &options);
    assert_eq!(split, whole, "output depends on how the body was split");

    let text = std::str::from_utf8(&whole).expect("events are UTF-8");
    assert!(text.ends_with("data: [DONE]\n\n"));
    let terminals = ["completed", "incomplete", "failed"]
        .iter()
        .map(|t| text.matches(&format!("\nevent: response.{t}\n")).count())
        .sum::<usize>();
    assert_eq!(terminals, 1, "exactly one terminal event");
}
