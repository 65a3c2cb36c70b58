//! Arbitrary call sequences into one exchange (see `checks::exchange`).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::exchange(data);
});
