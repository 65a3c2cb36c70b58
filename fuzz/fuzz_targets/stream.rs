//! An upstream SSE body cut into arbitrary chunks (see `checks::stream`).
#![no_main]

#[path = "../checks.rs"]
mod checks;

use arbitrary::Arbitrary;

#[derive(Debug, Arbitrary)]
struct Input {
    body: Vec<u8>,
    cuts: Vec<u16>,
    small_limits: bool,
}

libfuzzer_sys::fuzz_target!(|input: Input| {
    let cuts: Vec<usize> = input.cuts.iter().map(|&c| usize::from(c)).collect();
    checks::stream(&input.body, &cuts, input.small_limits);
});
