//! Translates one request body many times, through the core alone (`translate_request`, as
//! the exchange does for a whole body): a steady workload for `valgrind --tool=callgrind`,
//! whose instruction counts hold on a busy machine where timings do not.
//!
//! ```sh
//! cargo build --release -p responses-core --example requests
//! valgrind --tool=callgrind target/release/examples/requests codex 20
//! valgrind --tool=callgrind target/release/examples/requests codex 120
//! ```
//!
//! The difference of two runs divided by the difference of their counts is the cost of one
//! translation (the start-up and the reading of the file cancel out). Arguments: `codex`
//! (`benches/fixtures/codex_turn.json`, 40 KB), `history` (`codex_history.json`), `long`
//! (`codex_turn_400k.json`, 400 KB), `tiny` (`{"model":…,"input":"…"}`) or a file's path; then
//! the number of translations (default 100).

use std::sync::Arc;

use responses_core::translate::seal::Keyring;
use responses_core::translate::{translate_request, Meta, Options};

fn main() {
    let mut args = std::env::args().skip(1);
    let kind = args.next().unwrap_or_else(|| "codex".into());
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/../benches/fixtures/");
    let body = match kind.as_str() {
        "tiny" => br#"{"model": "bench-model", "input": "Say something."}"#.to_vec(),
        "codex" => std::fs::read(format!("{fixtures}codex_turn.json")).expect("fixture"),
        "history" => std::fs::read(format!("{fixtures}codex_history.json")).expect("fixture"),
        "long" => std::fs::read(format!("{fixtures}codex_turn_400k.json")).expect("fixture"),
        path => std::fs::read(path).expect("a request body"),
    };
    // Codex asks for `reasoning.encrypted_content`, which needs a key.
    let options = Options {
        keyring: Some(Arc::new(Keyring::single("k1", [7; 32]).expect("a key"))),
        ..Options::default()
    };
    let mut out = 0;
    for i in 0..n {
        let meta = Meta {
            now: 1_700_000_000 + i,
            id_seed: u128::from(i),
        };
        let t = translate_request(&body, &options, meta).expect("a valid request");
        out += t.body.len();
    }
    println!("{n} translations of {} bytes, {out} bytes out", body.len());
}
