//! The event hooks Envoy calls (`envoy_dynamic_module_on_*`), each a thin shell around the
//! [`Filter`]: every one catches unwinding, because a panic crossing `extern "C"` aborts
//! Envoy and drops every connection. A panic in a stream's hook fails that exchange only
//! ([`Filter::on_panic`]); a panic while creating a config or a filter refuses it (NULL).
//!
//! Envoy 1.40 refuses a module that lacks any hook it looks up, including those of features
//! this filter never uses (HTTP callouts and streams, scheduling, watermarks): they are here
//! as no-ops. `.ci/module-symbols` checks the list against the Envoy binary.
//!
//! No `unsafe` here: what touches Envoy's pointers and buffers is the host layer's
//! ([`host::ffi`]). The lint is denied rather than forbidden only because `#[no_mangle]`, which
//! every export needs, counts as unsafe code to it: it is allowed on the exports alone.
#![deny(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};

use responses_core::environment::System;
use responses_core::settings::KeySource;

use crate::config::{FilterConfig, KeyFile};
use crate::filter::{BodyStatus, HeadersStatus, TrailersStatus};
use crate::host::ffi::{
    self as abi, EnvoyBuffer, EnvoyFilter, EnvoyHttpHeader, FilterConfigEnvoyPtr,
    FilterConfigModulePtr, FilterEnvoyPtr, FilterModulePtr,
};
use crate::host::{self, Envoy, Level};

/// Logs a panic's message in Envoy's log (instead of stderr), then unwinding continues to the
/// hook's `catch_unwind`.
fn install_panic_log() {
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        host::log(
            Level::Error,
            &format!("responses_module panicked{at}: {what}"),
        );
    }));
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const std::ffi::c_char {
    match catch_unwind(install_panic_log) {
        Ok(()) => abi::abi_version(),
        Err(_) => std::ptr::null(),
    }
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: FilterConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> FilterConfigModulePtr {
    config_new(config_envoy, &name, &config)
}

/// Out of the export, so that the lint sees its body.
fn config_new(
    config_envoy: FilterConfigEnvoyPtr,
    name: &EnvoyBuffer,
    config: &EnvoyBuffer,
) -> FilterConfigModulePtr {
    let made = catch_unwind(AssertUnwindSafe(|| {
        let (name, json) = (name.bytes(), config.bytes());
        let key_file = if abi::is_validation_mode() {
            KeyFile::Skip
        } else {
            KeyFile::Read
        };
        let config = FilterConfig::new(json, key_file, &mut |kind, metric, labels| {
            abi::define_metric(config_envoy, kind, metric, labels)
        });
        let name = String::from_utf8_lossy(name);
        match config {
            Ok(config) => {
                let level = if config.key_source == KeySource::Ephemeral {
                    Level::Warn
                } else {
                    Level::Info
                };
                let keys = match config.key_source {
                    KeySource::Ephemeral => "no reasoning keys configured: encrypted_content is sealed with a random key of this Envoy process only (set reasoning_keys_file for several replicas or restarts)",
                    KeySource::File => "reasoning keys loaded from reasoning_keys_file",
                    KeySource::Text => "reasoning keys loaded from reasoning_keys",
                };
                host::log(level, &format!("responses_module filter `{name}`: {keys}"));
                abi::config_to_envoy(config)
            }
            Err(e) => {
                host::log(
                    Level::Error,
                    &format!("responses_module filter `{name}`: config refused: {e}"),
                );
                abi::no_config()
            }
        }
    }));
    made.unwrap_or_else(|_| abi::no_config())
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(
    config: FilterConfigModulePtr,
) {
    let _ = catch_unwind(|| abi::drop_config(config));
}

/// Per-route settings are not supported: a route enables or disables the filter with
/// Envoy's generic `FilterConfig { disabled }`. An empty per-route config is accepted (Envoy
/// asks for one), anything else refused, so that it is not silently ignored.
#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const std::ffi::c_void {
    per_route_config_new(&config)
}

/// Out of the export, so that the lint sees its body.
fn per_route_config_new(config: &EnvoyBuffer) -> *const std::ffi::c_void {
    static EMPTY: u8 = 0;
    let accepted = catch_unwind(|| {
        let json = config.bytes();
        let trimmed: Vec<u8> = json
            .iter()
            .copied()
            .filter(|b| !b.is_ascii_whitespace())
            .collect();
        trimmed.is_empty() || trimmed == b"{}"
    })
    .unwrap_or(false);
    if accepted {
        return std::ptr::addr_of!(EMPTY).cast();
    }
    let _ = catch_unwind(|| {
        host::log(
            Level::Error,
            "responses_module: per-route settings are not supported; enable or disable the filter per route with envoy.config.route.v3.FilterConfig",
        )
    });
    std::ptr::null()
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(
    _config: *const std::ffi::c_void,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: FilterConfigModulePtr,
    _filter_envoy: FilterEnvoyPtr,
) -> FilterModulePtr {
    let made = catch_unwind(|| {
        abi::config_of(config).map_or_else(abi::no_filter, |c| {
            abi::filter_to_envoy(EnvoyFilter::new(c, System))
        })
    });
    made.unwrap_or_else(|_| abi::no_filter())
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: FilterModulePtr) {
    let _ = catch_unwind(|| abi::drop_filter(filter));
}

/// Runs one hook on a filter, containing any panic: `hook`'s result, or else `on_panic`'s
/// verdict after the filter ended the exchange ([`Filter::on_panic`]: true if the current
/// data may pass).
fn with_filter<R>(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    hook: impl FnOnce(&mut EnvoyFilter, &mut Envoy) -> R,
    on_panic: impl FnOnce(bool) -> R,
) -> R {
    abi::with_filter(filter_envoy, filter, |found| {
        // filter_new failed: Envoy closes the stream; never let anything pass meanwhile.
        let Some((filter, host)) = found else {
            return on_panic(false);
        };
        match catch_unwind(AssertUnwindSafe(|| hook(filter, host))) {
            Ok(result) => result,
            Err(_) => {
                let pass =
                    catch_unwind(AssertUnwindSafe(|| filter.on_panic(host))).unwrap_or_else(|_| {
                        // Even the ending failed: cut the stream.
                        let _ = catch_unwind(AssertUnwindSafe(|| crate::host::Host::reset(host)));
                        false
                    });
                on_panic(pass)
            }
        }
    })
}

fn headers_status(s: HeadersStatus) -> abi::HeadersStatus {
    match s {
        HeadersStatus::Continue => abi::HEADERS_CONTINUE,
        HeadersStatus::Stop => abi::HEADERS_STOP_ITERATION,
    }
}

fn body_status(s: BodyStatus) -> abi::BodyStatus {
    match s {
        BodyStatus::Continue => abi::BODY_CONTINUE,
        BodyStatus::Stop => abi::BODY_STOP_ITERATION_NO_BUFFER,
    }
}

fn trailers_status(s: TrailersStatus) -> abi::TrailersStatus {
    match s {
        TrailersStatus::Continue => abi::TRAILERS_CONTINUE,
        TrailersStatus::Stop => abi::TRAILERS_STOP_ITERATION,
    }
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    end_of_stream: bool,
) -> abi::HeadersStatus {
    with_filter(
        filter_envoy,
        filter,
        |f, host| headers_status(f.request_headers(host, end_of_stream)),
        |_| abi::HEADERS_STOP_ITERATION,
    )
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    end_of_stream: bool,
) -> abi::BodyStatus {
    with_filter(
        filter_envoy,
        filter,
        |f, host| body_status(f.request_body(host, end_of_stream)),
        |_| abi::BODY_STOP_ITERATION_NO_BUFFER,
    )
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
) -> abi::TrailersStatus {
    with_filter(
        filter_envoy,
        filter,
        |f, host| trailers_status(f.request_trailers(host)),
        |_| abi::TRAILERS_STOP_ITERATION,
    )
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    end_of_stream: bool,
) -> abi::HeadersStatus {
    with_filter(
        filter_envoy,
        filter,
        |f, host| headers_status(f.response_headers(host, end_of_stream)),
        |_| abi::HEADERS_STOP_ITERATION,
    )
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    end_of_stream: bool,
) -> abi::BodyStatus {
    with_filter(
        filter_envoy,
        filter,
        |f, host| body_status(f.response_body(host, end_of_stream)),
        |pass| {
            if pass {
                abi::BODY_CONTINUE
            } else {
                abi::BODY_STOP_ITERATION_NO_BUFFER
            }
        },
    )
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
) -> abi::TrailersStatus {
    with_filter(
        filter_envoy,
        filter,
        |f, host| trailers_status(f.response_trailers(host)),
        |pass| {
            if pass {
                abi::TRAILERS_CONTINUE
            } else {
                abi::TRAILERS_STOP_ITERATION
            }
        },
    )
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
) {
    with_filter(
        filter_envoy,
        filter,
        |f, host| f.stream_complete(host),
        |_| (),
    );
}

/// Envoy's local reply is about to be sent: it passes the response hooks next, where the
/// core turns it into an envelope; nothing to do here.
#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _response_code: u32,
    _details: EnvoyBuffer,
    _reset_imminent: bool,
) -> u32 {
    0
}

// Hooks of features this filter never uses (it starts no callouts, schedules nothing and is
// never a terminal filter), required by Envoy 1.40 all the same.

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
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
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
    _trailers: *mut EnvoyHttpHeader,
    _trailers_size: usize,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _stream_id: u64,
    _reason: u32,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
    _event_id: u64,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _config_envoy: FilterConfigEnvoyPtr,
    _config: FilterConfigModulePtr,
    _event_id: u64,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _config_envoy: FilterConfigEnvoyPtr,
    _config: FilterConfigModulePtr,
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
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_headers(
    _config_envoy: FilterConfigEnvoyPtr,
    _config: FilterConfigModulePtr,
    _stream_id: u64,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_data(
    _config_envoy: FilterConfigEnvoyPtr,
    _config: FilterConfigModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_trailers(
    _config_envoy: FilterConfigEnvoyPtr,
    _config: FilterConfigModulePtr,
    _stream_id: u64,
    _trailers: *mut EnvoyHttpHeader,
    _trailers_size: usize,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_complete(
    _config_envoy: FilterConfigEnvoyPtr,
    _config: FilterConfigModulePtr,
    _stream_id: u64,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_reset(
    _config_envoy: FilterConfigEnvoyPtr,
    _config: FilterConfigModulePtr,
    _stream_id: u64,
    _reason: u32,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
) {
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _filter_envoy: FilterEnvoyPtr,
    _filter: FilterModulePtr,
) {
}
