//! Arbitrary Envoy hook sequences into the in-process module's filter (see `checks::module`).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::module(data);
});
