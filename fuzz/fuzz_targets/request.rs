//! Arbitrary bytes as a `POST /v1/responses` body: the translator must answer Ok or a typed
//! 4xx error, never panic, and an Ok must be a JSON Chat request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use responses_extproc::translate::{translate_request, Meta, Options};

fuzz_target!(|data: &[u8]| {
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
});
