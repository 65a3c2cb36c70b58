//! The core's integration suites, one binary (`cargo test -p responses-core --test main`): the
//! translation and the rules of an exchange through the public API, with plain bytes, no
//! Envoy and no network. Unit tests of private code stay beside it in `core/src/`.
//!
//! | module | what it proves |
//! |---|---|
//! | [`snapshots`] | every translation case as a file (`core/tests/snapshots/`) |
//! | [`answer_snapshots`] | what the client gets for recorded and edge-case Chat answers, byte for byte |
//! | [`request_pins`] | the request surface and the fuzz corpus through the core, pinned (`core/tests/pins/`) |
//! | [`request_translate`] | the request mapping's properties a snapshot cannot state |
//! | [`stream_translate`] | the stream translator over any chunking and any generated upstream stream |
//! | [`upstream_errors`] | the recorded upstream failures (`tests/fixtures/upstream_errors/`) mapped |
//! | [`no_duplicate_keys`] | no object, event or frame the core writes has a key twice |

mod common;

mod answer_snapshots;
mod no_duplicate_keys;
mod request_pins;
mod request_translate;
mod snapshots;
mod stream_translate;
mod upstream_errors;
