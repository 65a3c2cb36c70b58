//! Arbitrary bytes as a `POST /v1/responses` body (see `checks::request`).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::request(data));
