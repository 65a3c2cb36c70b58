//! The event hooks Envoy calls (`envoy_dynamic_module_on_*`), each a thin shell around the
//! [`Filter`]: every one catches unwinding, because a panic crossing `extern "C"` aborts
//! Envoy and drops every connection. A panic in a stream's hook fails that exchange only
//! ([`Filter::on_panic`]); a panic while creating a config or a filter refuses it (NULL).
//!
//! Envoy 1.40 refuses a module that lacks any hook it looks up, including those of features
//! this filter never uses (HTTP callouts and streams, scheduling, watermarks): they are here
//! as no-ops. `.ci/module-symbols` checks the list against the Envoy binary.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use responses_core::environment::System;
use responses_core::settings::KeySource;

use crate::abi::{self, EnvoyBuffer, EnvoyHttpHeader, ModuleBuffer};
use crate::config::{FilterConfig, KeyFile, MetricKind};
use crate::filter::{BodyStatus, Filter, HeadersStatus, TrailersStatus};
use crate::host::{self, Envoy, Level, MetricId};

type EnvoyFilter = Filter<System>;

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

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const std::ffi::c_char {
    match catch_unwind(install_panic_log) {
        Ok(()) => abi::ABI_VERSION.as_ptr().cast(),
        Err(_) => std::ptr::null(),
    }
}

fn define_metric(
    config: abi::FilterConfigEnvoyPtr,
    kind: MetricKind,
    name: &str,
    labels: &[&str],
) -> Option<MetricId> {
    let mut label_names: Vec<ModuleBuffer> = labels
        .iter()
        .map(|l| ModuleBuffer::from(l.as_bytes()))
        .collect();
    let mut id = 0usize;
    let name = ModuleBuffer::from(name.as_bytes());
    let labels_ptr = if label_names.is_empty() {
        std::ptr::null_mut()
    } else {
        label_names.as_mut_ptr()
    };
    // SAFETY: Envoy's config pointer during config_new; it copies the names.
    let result = unsafe {
        match kind {
            MetricKind::Counter => {
                abi::envoy_dynamic_module_callback_http_filter_config_define_counter(
                    config,
                    name,
                    labels_ptr,
                    label_names.len(),
                    &mut id,
                )
            }
            MetricKind::Gauge => {
                abi::envoy_dynamic_module_callback_http_filter_config_define_gauge(
                    config,
                    name,
                    labels_ptr,
                    label_names.len(),
                    &mut id,
                )
            }
            MetricKind::Histogram => {
                abi::envoy_dynamic_module_callback_http_filter_config_define_histogram(
                    config,
                    name,
                    labels_ptr,
                    label_names.len(),
                    &mut id,
                )
            }
        }
    };
    (result == 0).then_some(MetricId(id))
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: abi::FilterConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> abi::FilterConfigModulePtr {
    let made = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: Envoy's buffers, valid during this hook.
        let (name, json) = unsafe { (name.as_bytes(), config.as_bytes()) };
        // SAFETY: no pointers; config_new runs on the main thread.
        let key_file = if unsafe { abi::envoy_dynamic_module_callback_is_validation_mode() } {
            KeyFile::Skip
        } else {
            KeyFile::Read
        };
        let config = FilterConfig::new(json, key_file, &mut |kind, metric, labels| {
            define_metric(config_envoy, kind, metric, labels)
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
                Arc::into_raw(Arc::new(config)).cast()
            }
            Err(e) => {
                host::log(
                    Level::Error,
                    &format!("responses_module filter `{name}`: config refused: {e}"),
                );
                std::ptr::null()
            }
        }
    }));
    made.unwrap_or(std::ptr::null())
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(
    config: abi::FilterConfigModulePtr,
) {
    if config.is_null() {
        return;
    }
    // SAFETY: made by Arc::into_raw in config_new; Envoy destroys each config once.
    let _ = catch_unwind(|| drop(unsafe { Arc::from_raw(config.cast::<FilterConfig>()) }));
}

/// Per-route settings are not supported: a route enables or disables the filter with
/// Envoy's generic `FilterConfig { disabled }`. An empty per-route config is accepted (Envoy
/// asks for one), anything else refused, so that it is not silently ignored.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const std::ffi::c_void {
    static EMPTY: u8 = 0;
    let accepted = catch_unwind(|| {
        // SAFETY: Envoy's buffer, valid during this hook.
        let json = unsafe { config.as_bytes() };
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

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(
    _config: *const std::ffi::c_void,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: abi::FilterConfigModulePtr,
    _filter_envoy: abi::FilterEnvoyPtr,
) -> abi::FilterModulePtr {
    if config.is_null() {
        return std::ptr::null();
    }
    let made = catch_unwind(|| {
        // SAFETY: the config outlives its filters; a new Arc handle for this filter.
        let config = unsafe {
            Arc::increment_strong_count(config.cast::<FilterConfig>());
            Arc::from_raw(config.cast::<FilterConfig>())
        };
        Box::into_raw(Box::new(EnvoyFilter::new(config, System))).cast_const()
    });
    made.map_or(std::ptr::null(), |f| f.cast())
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: abi::FilterModulePtr) {
    if filter.is_null() {
        return;
    }
    // SAFETY: made by Box::into_raw in filter_new; Envoy destroys each filter once.
    let _ =
        catch_unwind(|| drop(unsafe { Box::from_raw(filter.cast_mut().cast::<EnvoyFilter>()) }));
}

/// Runs one hook on a filter, containing any panic: `hook`'s result, or else `on_panic`'s
/// verdict after the filter ended the exchange ([`Filter::on_panic`]: true if the current
/// data may pass).
fn with_filter<R>(
    filter_envoy: abi::FilterEnvoyPtr,
    filter: abi::FilterModulePtr,
    hook: impl FnOnce(&mut EnvoyFilter, &mut Envoy) -> R,
    on_panic: impl FnOnce(bool) -> R,
) -> R {
    if filter.is_null() {
        // filter_new failed: Envoy closes the stream; never let anything pass meanwhile.
        return on_panic(false);
    }
    // SAFETY: the filter Box of filter_new, used by one worker thread at a time; the Envoy
    // pointer is this hook's.
    let (filter, mut host) = unsafe {
        (
            &mut *filter.cast_mut().cast::<EnvoyFilter>(),
            Envoy::new(filter_envoy),
        )
    };
    match catch_unwind(AssertUnwindSafe(|| hook(filter, &mut host))) {
        Ok(result) => result,
        Err(_) => {
            let pass = catch_unwind(AssertUnwindSafe(|| filter.on_panic(&mut host)))
                .unwrap_or_else(|_| {
                    // Even the ending failed: cut the stream.
                    let _ = catch_unwind(AssertUnwindSafe(|| crate::host::Host::reset(&mut host)));
                    false
                });
            on_panic(pass)
        }
    }
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

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    filter_envoy: abi::FilterEnvoyPtr,
    filter: abi::FilterModulePtr,
    end_of_stream: bool,
) -> abi::HeadersStatus {
    with_filter(
        filter_envoy,
        filter,
        |f, host| headers_status(f.request_headers(host, end_of_stream)),
        |_| abi::HEADERS_STOP_ITERATION,
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    filter_envoy: abi::FilterEnvoyPtr,
    filter: abi::FilterModulePtr,
    end_of_stream: bool,
) -> abi::BodyStatus {
    with_filter(
        filter_envoy,
        filter,
        |f, host| body_status(f.request_body(host, end_of_stream)),
        |_| abi::BODY_STOP_ITERATION_NO_BUFFER,
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    filter_envoy: abi::FilterEnvoyPtr,
    filter: abi::FilterModulePtr,
) -> abi::TrailersStatus {
    with_filter(
        filter_envoy,
        filter,
        |f, host| trailers_status(f.request_trailers(host)),
        |_| abi::TRAILERS_STOP_ITERATION,
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    filter_envoy: abi::FilterEnvoyPtr,
    filter: abi::FilterModulePtr,
    end_of_stream: bool,
) -> abi::HeadersStatus {
    with_filter(
        filter_envoy,
        filter,
        |f, host| headers_status(f.response_headers(host, end_of_stream)),
        |_| abi::HEADERS_STOP_ITERATION,
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    filter_envoy: abi::FilterEnvoyPtr,
    filter: abi::FilterModulePtr,
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

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    filter_envoy: abi::FilterEnvoyPtr,
    filter: abi::FilterModulePtr,
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

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    filter_envoy: abi::FilterEnvoyPtr,
    filter: abi::FilterModulePtr,
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
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    _filter_envoy: abi::FilterEnvoyPtr,
    _filter: abi::FilterModulePtr,
    _response_code: u32,
    _details: EnvoyBuffer,
    _reset_imminent: bool,
) -> u32 {
    0
}

// Hooks of features this filter never uses (it starts no callouts, schedules nothing and is
// never a terminal filter), required by Envoy 1.40 all the same.

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _filter_envoy: abi::FilterEnvoyPtr,
    _filter: abi::FilterModulePtr,
    _callout_id: u64,
    _result: u32,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _body_chunks: *mut EnvoyBuffer,
    _body_chunks_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _filter_envoy: abi::FilterEnvoyPtr,
    _filter: abi::FilterModulePtr,
    _stream_id: u64,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _filter_envoy: abi::FilterEnvoyPtr,
    _filter: abi::FilterModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _filter_envoy: abi::FilterEnvoyPtr,
    _filter: abi::FilterModulePtr,
    _stream_id: u64,
    _trailers: *mut EnvoyHttpHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _filter_envoy: abi::FilterEnvoyPtr,
    _filter: abi::FilterModulePtr,
    _stream_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _filter_envoy: abi::FilterEnvoyPtr,
    _filter: abi::FilterModulePtr,
    _stream_id: u64,
    _reason: u32,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _filter_envoy: abi::FilterEnvoyPtr,
    _filter: abi::FilterModulePtr,
    _event_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _config_envoy: abi::FilterConfigEnvoyPtr,
    _config: abi::FilterConfigModulePtr,
    _event_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _config_envoy: abi::FilterConfigEnvoyPtr,
    _config: abi::FilterConfigModulePtr,
    _callout_id: u64,
    _result: u32,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _body_chunks: *mut EnvoyBuffer,
    _body_chunks_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_headers(
    _config_envoy: abi::FilterConfigEnvoyPtr,
    _config: abi::FilterConfigModulePtr,
    _stream_id: u64,
    _headers: *mut EnvoyHttpHeader,
    _headers_size: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_data(
    _config_envoy: abi::FilterConfigEnvoyPtr,
    _config: abi::FilterConfigModulePtr,
    _stream_id: u64,
    _data: *const EnvoyBuffer,
    _data_count: usize,
    _end_stream: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_trailers(
    _config_envoy: abi::FilterConfigEnvoyPtr,
    _config: abi::FilterConfigModulePtr,
    _stream_id: u64,
    _trailers: *mut EnvoyHttpHeader,
    _trailers_size: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_complete(
    _config_envoy: abi::FilterConfigEnvoyPtr,
    _config: abi::FilterConfigModulePtr,
    _stream_id: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_http_stream_reset(
    _config_envoy: abi::FilterConfigEnvoyPtr,
    _config: abi::FilterConfigModulePtr,
    _stream_id: u64,
    _reason: u32,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _filter_envoy: abi::FilterEnvoyPtr,
    _filter: abi::FilterModulePtr,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _filter_envoy: abi::FilterEnvoyPtr,
    _filter: abi::FilterModulePtr,
) {
}
