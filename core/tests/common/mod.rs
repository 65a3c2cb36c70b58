//! What the core's suites share (and the end-to-end harness, `tests/common/`, borrows):
//!
//! * [`json`]: the JSON reader every body and event goes through, which refuses duplicate keys;
//! * [`sse`]: SSE body parsing;
//! * [`schema`]: validation against the official OpenResponses OpenAPI document
//!   (`tests/fixtures/openresponses/openapi.json`);
//! * [`stream_rules`]: the rules every translated event stream obeys;
//! * [`snapshot`]: the snapshot suites' update switch and byte-pinned texts;
//! * [`recorded`]: the recorded upstream failures (`tests/fixtures/upstream_errors/`).
//!
//! Paths are from the repository root: the fixtures are shared with the end-to-end suites.
// Each suite uses a different part.
#![allow(dead_code, unused_imports)]

pub mod json;
pub mod recorded;
pub mod schema;
pub mod snapshot;
pub mod sse;
pub mod stream_rules;

use std::path::{Path, PathBuf};

/// The repository root (the parent of `core/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("core/ is inside the repository")
        .to_path_buf()
}
