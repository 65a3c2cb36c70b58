//! A client's WebSocket bytes, cut every way, into the frame decoder (see
//! `checks::websocket_frames`).
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    checks::websocket_frames(data);
});
