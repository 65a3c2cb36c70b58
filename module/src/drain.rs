//! How long the responses in flight may run once Envoy drains: set by the bootstrap extension
//! (`crate::bootstrap`) from its config, read by the sockets (`crate::socket`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long the streams told of the drain have, by default (the processor's
/// `--drain-seconds` default).
pub(crate) const DRAIN_SECONDS: u64 = responses_core::settings::DEFAULT_DRAIN_SECONDS;

/// The config's `drain_seconds`.
pub(crate) static DRAIN: AtomicU64 = AtomicU64::new(DRAIN_SECONDS);

/// How long the responses in flight may run once Envoy drains (the extension's
/// `drain_seconds`; its default without the extension, which then tells no filter).
pub fn drain_time() -> Duration {
    Duration::from_secs(DRAIN.load(Ordering::Relaxed))
}
