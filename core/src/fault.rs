//! Deliberate panics, for tests only: built with the feature `fault-injection`, the exchange
//! panics when a piece of a body (the client's or the upstream's) holds [`PANIC_MARKER`], so
//! that end-to-end tests can check that a bug fails one exchange, with an envelope or a cut
//! stream, and that Envoy (module) or the processor (ext_proc) keeps serving.
//!
//! Production builds never have the feature: only the tests enable it (the root package's
//! dev-dependency for the processor, `deploy/test.sh` for the module), so the check below does
//! not exist in a release binary or shared object.

/// The bytes that make a fault-injection build panic.
pub const PANIC_MARKER: &str = "__responses_core_panic__";

/// Panics if `bytes` hold the marker (fault-injection builds only).
#[cfg(feature = "fault-injection")]
pub(crate) fn check(bytes: &[u8]) {
    if memchr::memmem::find(bytes, PANIC_MARKER.as_bytes()).is_some() {
        panic!("fault injection: {PANIC_MARKER} in a body");
    }
}
