//! responses-extproc in-process: the sans-IO core inside Envoy, as a dynamic module.
//!
//! A shared object (`libresponses_module.so`) that Envoy 1.40 loads by the name
//! `responses_module` and runs as a native HTTP filter in its workers: the same
//! [`responses_core::driver::Driver`] as the ext_proc service, fed from Envoy's filter hooks
//! instead of gRPC messages, with direct access to headers and body buffers.
//!
//! - [`hooks`]: the `envoy_dynamic_module_on_*` functions Envoy calls, each catching panics;
//! - [`bootstrap`]: the same module as a bootstrap extension, through which its filters hear
//!   Envoy's drain;
//! - [`filter`]: one exchange, the driver's actions and events onto a [`host::Host`];
//! - [`host`]: that small trait, its implementation over the ABI, and what the hooks exchange
//!   with Envoy ([`host::ffi`]); the ABI's types and the Envoy callbacks used, declared by
//!   hand, are private to it;
//! - [`config`]: the filter's JSON config (the processor's settings) and its Envoy stats;
//! - [`record`]: the ledger of the WebSocket turns' records, shared by the sockets and the
//!   filter on the records' route;
//! - `fake` (tests, and feature `testkit`): a fake Envoy, so the filter is tested (and fuzzed)
//!   with plain bytes;
//! - `probe` (feature `abi-probe`, tests only): a filter that exercises the host layer's
//!   streaming replies, callouts, timers, watermarks and drain through the real Envoy.
//!
//! No async runtime and no I/O stack: the core, serde_json and the ABI (and one thread of the
//! module's own, for timers: `host::timer`). `unsafe` lives in the host layer alone: every
//! other module forbids it, and `hooks` and `bootstrap` deny it but for the `#[no_mangle]` of
//! their exports.

pub mod bootstrap;
#[forbid(unsafe_code)]
pub mod callout;
#[forbid(unsafe_code)]
pub mod config;
#[forbid(unsafe_code)]
pub mod drain;
#[cfg(any(test, feature = "testkit"))]
#[forbid(unsafe_code)]
pub mod fake;
#[forbid(unsafe_code)]
pub mod filter;
pub mod hooks;
pub mod host;
#[cfg(feature = "abi-probe")]
#[forbid(unsafe_code)]
pub mod probe;
#[forbid(unsafe_code)]
pub mod record;
#[forbid(unsafe_code)]
pub mod report;
#[forbid(unsafe_code)]
pub mod socket;
#[forbid(unsafe_code)]
pub mod status;

#[cfg(test)]
#[forbid(unsafe_code)]
mod tests;
