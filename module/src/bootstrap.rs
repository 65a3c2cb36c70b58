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
//! On SIGTERM (or `/quitquitquit`) Envoy runs its shutdown hooks with the workers still
//! serving, and exits once each has called its completion: the extension tells the watching
//! filters as for a drain, and completes once every one of them has ended its stream, or after
//! `drain_seconds` (the extension's config, `{"drain_seconds": 30}` by default, as the
//! processor's `--drain-seconds`), on Envoy's main thread (the config's scheduler).
//!
//! Envoy requires every hook below of a module loaded as a bootstrap extension (it refuses
//! the config if one is missing); only config_new and _destroy, drain_started, shutdown and
//! config_scheduled do anything. Envoy holds its listeners until the config signals it is
//! ready, which config_new does at once. Like every hook, each catches panics. No `unsafe`
//! here but the exports' `no_mangle`.
#![deny(unsafe_code)]

use std::panic::catch_unwind;
use std::sync::atomic::Ordering;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use crate::drain::{drain_time, DRAIN, DRAIN_SECONDS};
use crate::host::ffi::{
    self as abi, BootstrapConfigEnvoyPtr, BootstrapConfigModulePtr, BootstrapEnvoyPtr,
    BootstrapModulePtr, Completion, EnvoyBuffer, EnvoyHttpHeader, EventCb, EventContext,
    MainThread,
};
use crate::host::{self, Level};

/// The config's scheduler (Envoy's main thread), while the config lives.
static MAIN: Mutex<Option<MainThread>> = Mutex::new(None);
/// Envoy's shutdown completion, until the streams are done.
static COMPLETION: Mutex<Option<Completion>> = Mutex::new(None);
/// The scheduler event that runs the completion.
const SHUTDOWN_DONE: u64 = 1;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The extension's config: nothing (every default) or `{"drain_seconds": N}`.
fn drain_seconds(config: &[u8]) -> Result<u64, String> {
    if config.iter().all(u8::is_ascii_whitespace) {
        return Ok(DRAIN_SECONDS);
    }
    let value: serde_json::Value =
        serde_json::from_slice(config).map_err(|e| format!("extension_config: {e}"))?;
    let object = value.as_object().ok_or("extension_config: a JSON object")?;
    if let Some(key) = object.keys().find(|k| *k != "drain_seconds") {
        return Err(format!(
            "extension_config: unknown field `{key}` (expected drain_seconds)"
        ));
    }
    match object.get("drain_seconds") {
        None => Ok(DRAIN_SECONDS),
        Some(n) => n
            .as_u64()
            .ok_or_else(|| "extension_config: drain_seconds is a whole number of seconds".into()),
    }
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_config_new(
    config_envoy: BootstrapConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> BootstrapConfigModulePtr {
    catch_unwind(|| {
        let name = String::from_utf8_lossy(name.bytes());
        match drain_seconds(config.bytes()) {
            Ok(seconds) => {
                DRAIN.store(seconds, Ordering::Relaxed);
                *lock(&MAIN) = Some(MainThread::new(config_envoy));
                host::log(
                    Level::Info,
                    &format!(
                        "responses_module bootstrap extension `{name}`: its filters hear Envoy's \
                         drain; a shutdown waits up to {seconds} s for them"
                    ),
                );
                abi::bootstrap_config_ready(config_envoy)
            }
            Err(e) => {
                host::log(
                    Level::Error,
                    &format!("responses_module bootstrap extension `{name}`: {e}"),
                );
                abi::no_bootstrap_config()
            }
        }
    })
    .unwrap_or_else(|_| abi::no_bootstrap_config())
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_config_destroy(
    _config: BootstrapConfigModulePtr,
) {
    let _ = catch_unwind(|| drop(lock(&MAIN).take()));
}

/// The shutdown's wait is over (on the main thread): Envoy may exit.
#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_config_scheduled(
    _config_envoy: BootstrapConfigEnvoyPtr,
    _config: BootstrapConfigModulePtr,
    event_id: u64,
) {
    if event_id == SHUTDOWN_DONE {
        let _ = catch_unwind(|| {
            if let Some(completion) = lock(&COMPLETION).take() {
                host::log(
                    Level::Info,
                    "responses_module: shutdown: done waiting (the streams ended, or drain_seconds)",
                );
                completion.complete();
            }
        });
    }
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

/// Envoy is exiting (SIGTERM, `/quitquitquit`), its workers running until the completion is
/// called: the filters watching the drain are told, and the completion waits until their
/// streams have ended, or `drain_seconds`.
#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_bootstrap_extension_shutdown(
    _extension_envoy: BootstrapEnvoyPtr,
    _extension: BootstrapModulePtr,
    completion: EventCb,
    context: EventContext,
) {
    let completion = Completion::new(completion, context);
    let waited = catch_unwind(|| {
        if lock(&MAIN).is_none() {
            return Err(completion);
        }
        *lock(&COMPLETION) = Some(completion);
        let grace = drain_time();
        let told = host::timers().shutdown(
            Instant::now() + grace + responses_core::connection::DRAIN_CLOSE_MARGIN,
            Box::new(|| {
                if let Some(main) = lock(&MAIN).as_ref() {
                    main.commit(SHUTDOWN_DONE);
                }
            }),
        );
        host::log(
            Level::Info,
            &format!(
                "responses_module: Envoy's shutdown: told {told} open stream(s); waiting up to \
                 {} s for the streams told of the drain",
                grace.as_secs()
            ),
        );
        Ok(())
    });
    match waited {
        Ok(Ok(())) => {}
        // No way back to the main thread (or a panic): Envoy exits now.
        Ok(Err(completion)) => completion.complete(),
        Err(_) => {
            if let Some(completion) = lock(&COMPLETION).take() {
                completion.complete();
            }
        }
    }
}

fn drain(why: &str) {
    let told = host::timers().drain();
    host::log(
        Level::Info,
        &format!("responses_module: Envoy's {why}: told {told} open stream(s)"),
    );
}

// Hooks of features the extension does not use (it registers no admin handler, file watch,
// timer or callout, and enables no cluster or listener lifecycle: Envoy never calls these),
// required all the same.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_extension_config_is_empty_or_drain_seconds() {
        assert_eq!(drain_seconds(b""), Ok(DRAIN_SECONDS));
        assert_eq!(drain_seconds(b" {} "), Ok(DRAIN_SECONDS));
        assert_eq!(drain_seconds(br#"{"drain_seconds": 5}"#), Ok(5));
        for (bad, why) in [
            (
                &br#"{"drain_second": 5}"#[..],
                "unknown field `drain_second`",
            ),
            (br#"{"drain_seconds": "5"}"#, "whole number"),
            (br#"{"drain_seconds": -1}"#, "whole number"),
            (b"[5]", "a JSON object"),
            (b"{", "extension_config"),
        ] {
            let err = drain_seconds(bad).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
    }
}
