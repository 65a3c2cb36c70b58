//! The recorded upstream failures of `tests/fixtures/upstream_errors/` (the core's test helper,
//! `core/tests/common/recorded.rs`), and a scripted [`Reply`] that answers with one, as that
//! server would.

use super::repo_root;
use super::upstream::Reply;

#[path = "../../core/tests/common/recorded.rs"]
mod fixtures;

pub use fixtures::{fixtures, Fixture};

impl Fixture {
    /// The upstream's answer, as the server sends it (a stream one event at a time).
    pub fn reply(&self) -> Reply {
        let mut reply = if self.is_stream() {
            Reply::sse_text(&self.body)
        } else {
            Reply::raw(self.status, &self.content_type(), self.body.clone())
        };
        for (name, value) in &self.headers {
            reply = reply.header(name, value);
        }
        reply
    }
}
