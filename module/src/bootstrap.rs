//! The module as an Envoy bootstrap extension: how its HTTP filters hear Envoy's drain.
//!
//! An HTTP filter is told nothing when Envoy starts draining (`POST /drain_listeners?graceful`,
//! a hot restart, or SIGTERM's shutdown), so a WebSocket it serves would stay open until
//! Envoy cuts it. A bootstrap extension is told
//! (`envoy_dynamic_module_on_bootstrap_extension_drain_started`, on the main thread): loaded
//! from the same shared object as the filter (the same `dynamic_module_config.name`), it
//! shares the filter's statics (Envoy loads a module once per process), so it tells the
//! timer service (`host::timer`), which commits the drain event to every filter that watches
//! it (`Terminal::watch_drain`), each on its own worker. In Envoy's bootstrap:
//!
//! ```yaml
//! bootstrap_extensions:
//! - name: envoy.bootstrap.dynamic_modules
//!   typed_config:
//!     "@type": type.googleapis.com/envoy.extensions.bootstrap.dynamic_modules.v3.DynamicModuleBootstrapExtension
//!     dynamic_module_config: {name: responses_module}
//!     extension_name: drain
//! ```
//!
//! Envoy requires every hook below of a module loaded as a bootstrap extension (it refuses
//! the config if one is missing); only config_new, drain_started and shutdown do anything.
//! Envoy holds its listeners until the config signals it is ready, which config_new does at
//! once. Like every hook, each catches panics. No `unsafe` here but the exports' `no_mangle`.
#![deny(unsafe_code)]

use std::panic::catch_unwind;

use crate::host::ffi::{
    self as abi, BootstrapConfigEnvoyPtr, BootstrapConfigModulePtr, BootstrapEnvoyPtr,
    BootstrapModulePtr, EnvoyBuffer, EnvoyHttpHeader, EventCb, EventContext,
};
use crate::host::{self, Level};

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_config_new(
    config_envoy: BootstrapConfigEnvoyPtr,
    name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> BootstrapConfigModulePtr {
    catch_unwind(|| {
        host::log(
            Level::Info,
            &format!(
                "responses_module bootstrap extension `{}`: its filters hear Envoy's drain",
                String::from_utf8_lossy(name.bytes())
            ),
        );
        abi::bootstrap_config_ready(config_envoy)
    })
    .unwrap_or_else(|_| abi::no_bootstrap_config())
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_config_destroy(
    _config: BootstrapConfigModulePtr,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_new(
    _config: BootstrapConfigModulePtr,
    _extension_envoy: BootstrapEnvoyPtr,
) -> BootstrapModulePtr {
    abi::bootstrap_extension()
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_destroy(
    _extension: BootstrapModulePtr,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_server_initialized(
    _extension_envoy: BootstrapEnvoyPtr,
    _extension: BootstrapModulePtr,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_worker_thread_initialized(
    _extension_envoy: BootstrapEnvoyPtr,
    _extension: BootstrapModulePtr,
) {
}

/// Envoy started draining: every filter watching the drain is told, on its worker.
#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_drain_started(
    _extension_envoy: BootstrapEnvoyPtr,
    _extension: BootstrapModulePtr,
) {
    let _ = catch_unwind(|| drain("drain started"));
}

/// Envoy is exiting (SIGTERM, `/quitquitquit`), with its workers still running until the
/// completion is called: the filters watching the drain are told (if they were not already),
/// then Envoy may exit at once. A socket gets what its filter sends on the drain event only
/// if its worker runs that event before Envoy stops the workers.
#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_shutdown(
    _extension_envoy: BootstrapEnvoyPtr,
    _extension: BootstrapModulePtr,
    completion: EventCb,
    context: EventContext,
) {
    let _ = catch_unwind(|| {
        if !host::timers().draining() {
            drain("shutdown");
        }
    });
    abi::complete(completion, context);
}

fn drain(why: &str) {
    let told = host::timers().drain();
    host::log(
        Level::Info,
        &format!("responses_module: Envoy's {why}: told {told} open stream(s)"),
    );
}

// Hooks of features the extension does not use (it registers no admin handler, file watch,
// timer, callout or scheduler, and enables no cluster or listener lifecycle: Envoy never
// calls these), required all the same.

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_config_scheduled(
    _config_envoy: BootstrapConfigEnvoyPtr,
    _config: BootstrapConfigModulePtr,
    _event_id: u64,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_http_callout_done(
    _config_envoy: BootstrapConfigEnvoyPtr,
    _config: BootstrapConfigModulePtr,
    _callout_id: u64,
    _result: u32,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _body_chunks: *mut EnvoyBuffer,
    _body_chunks_size: usize,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_timer_fired(
    _config_envoy: BootstrapConfigEnvoyPtr,
    _config: BootstrapConfigModulePtr,
    _timer: *mut std::ffi::c_void,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_file_changed(
    _config_envoy: BootstrapConfigEnvoyPtr,
    _config: BootstrapConfigModulePtr,
    _path: EnvoyBuffer,
    _events: u32,
) {
}

/// No admin handler is registered, so Envoy never asks; 404 if it did.
#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_admin_request(
    _config_envoy: BootstrapConfigEnvoyPtr,
    _config: BootstrapConfigModulePtr,
    _method: EnvoyBuffer,
    _path: EnvoyBuffer,
    _body: EnvoyBuffer,
) -> u32 {
    404
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_cluster_add_or_update(
    _config_envoy: BootstrapConfigEnvoyPtr,
    _config: BootstrapConfigModulePtr,
    _cluster_name: EnvoyBuffer,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_cluster_removal(
    _config_envoy: BootstrapConfigEnvoyPtr,
    _config: BootstrapConfigModulePtr,
    _cluster_name: EnvoyBuffer,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_listener_add_or_update(
    _config_envoy: BootstrapConfigEnvoyPtr,
    _config: BootstrapConfigModulePtr,
    _listener_name: EnvoyBuffer,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_listener_removal(
    _config_envoy: BootstrapConfigEnvoyPtr,
    _config: BootstrapConfigModulePtr,
    _listener_name: EnvoyBuffer,
) {
}
