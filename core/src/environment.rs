//! The clock and the randomness the sans-IO core takes from its callers (adapters pass
//! [`System`]; tests pass fixed values).

/// What the caller provides for each request: the clock and fresh randomness.
pub trait Environment {
    fn now(&self) -> u64;
    fn id_seed(&self) -> u128;
    /// The monotonic clock a host reads for the `now` of the core's inputs (timers compare
    /// with it): the real one, unless a test host moves its own.
    fn instant(&self) -> std::time::Instant {
        std::time::Instant::now()
    }
}

/// The real clock and OS randomness.
#[derive(Debug, Clone, Copy, Default)]
pub struct System;

impl Environment for System {
    fn now(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    }

    fn id_seed(&self) -> u128 {
        uuid::Uuid::new_v4().as_u128()
    }
}
