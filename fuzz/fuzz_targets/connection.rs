//! Everything a host feeds one WebSocket connection, as a script (see `checks::connection`).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::connection(data);
});
