//! The event hooks Envoy calls (`envoy_dynamic_module_on_*`), each a thin shell around the
//! [`Filter`]: every one catches unwinding, because a panic crossing `extern "C"` aborts
//! Envoy and drops every connection. A panic in a stream's hook fails that exchange only
//! ([`Filter::on_panic`]); a panic while creating a config or a filter refuses it (NULL).
//!
//! Envoy 1.40 refuses a module that lacks any hook it looks up, including those of features
//! this filter never uses (one-shot HTTP callouts, the config's own callouts and scheduler):
//! they are here as no-ops. `.ci/module-symbols` checks the list against the Envoy binary.
//! The hooks of a stream the filter answers itself (callout streams, the scheduler, the
//! downstream watermarks) go to the filter's entry points (`Filter::callout_*`, ...).
//!
//! Re-entrance: Envoy calls some hooks from inside the filter's own calls (the host layer's
//! [`Slot`](crate::host::ffi::Slot) says which; it holds a [`Stream`], which the host layer
//! knows only as a type it is given). Such a hook never touches the filter: an
//! encoder hook passes the filter's own bytes (`Continue`), an event is kept and delivered
//! once the running hook returns, a destroy waits for it.
//!
//! No `unsafe` here: what touches Envoy's pointers and buffers is the host layer's
//! ([`host::ffi`]). The lint is denied rather than forbidden only because `#[no_mangle]`, which
//! every export needs, counts as unsafe code to it: it is allowed on the exports alone.
#![deny(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use responses_core::environment::System;
use responses_core::settings::KeySource;

use crate::config::{FilterConfig, KeyFile};
use crate::filter::Filter;
use crate::host::ffi::{
    self as abi, Deferred, EnvoyBuffer, EnvoyBuffers, EnvoyHeaders, EnvoyHttpHeader,
    FilterConfigEnvoyPtr, FilterConfigModulePtr, FilterEnvoyPtr, FilterModulePtr,
    HttpStreamResetReason,
};
use crate::host::{self, CalloutId, Envoy, Host, Level, Terminal};
use crate::status::{BodyStatus, HeadersStatus, TrailersStatus};

/// The filter Envoy runs, on the real clock and randomness.
pub type EnvoyFilter = Filter<System>;

/// A filter config as Envoy holds it: the exchange's (or, in a test build, the ABI probe's,
/// chosen by its `filter_name`).
pub enum Configured {
    Exchange(Arc<FilterConfig>),
    #[cfg(feature = "abi-probe")]
    Probe,
}

/// What Envoy runs for a stream: the exchange's filter (or, in a test build, the ABI probe).
pub enum Stream {
    Exchange(EnvoyFilter),
    #[cfg(feature = "abi-probe")]
    Probe(crate::probe::Probe),
}

type Entered<'a> = abi::Entered<'a, Stream>;
type Guard<'a> = abi::Guard<'a, Stream>;
type Slot = abi::Slot<Stream>;

/// `$body` with `$f` bound to the stream's filter, whichever it is.
macro_rules! on_stream {
    ($stream:expr, $f:ident => $body:expr) => {
        match $stream {
            Stream::Exchange($f) => $body,
            #[cfg(feature = "abi-probe")]
            Stream::Probe($f) => $body,
        }
    };
}

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
        #[cfg(feature = "abi-probe")]
        if name == crate::probe::FILTER_NAME {
            host::log(
                Level::Warn,
                "responses_module: the ABI probe filter (a test build's; never in production)",
            );
            return abi::config_to_envoy(config_envoy, Configured::Probe);
        }
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
                abi::config_to_envoy(config_envoy, Configured::Exchange(Arc::new(config)))
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
    let _ = catch_unwind(|| abi::drop_config::<Configured>(config));
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
    let made = catch_unwind(|| match abi::config_of::<Configured>(config) {
        None => abi::no_filter(),
        Some((Configured::Exchange(c), envoy)) => {
            abi::filter_to_envoy(Stream::Exchange(EnvoyFilter::new(c.clone(), System)), envoy)
        }
        #[cfg(feature = "abi-probe")]
        Some((Configured::Probe, envoy)) => {
            abi::filter_to_envoy(Stream::Probe(crate::probe::Probe::new()), envoy)
        }
    });
    made.unwrap_or_else(|_| abi::no_filter())
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(filter: FilterModulePtr) {
    let _ = catch_unwind(|| abi::drop_filter::<Stream>(filter));
}

/// Runs one hook on a filter, containing any panic: `hook`'s result, or else `on_panic`'s
/// verdict after the filter ended the exchange ([`Filter::on_panic`]: true if the current
/// data may pass). Re-entered (another hook of the filter is running), `reentrant` answers
/// instead, without the filter. Then the events Envoy reported during the hook are delivered.
///
/// [`Filter::on_panic`]: crate::filter::Filter::on_panic
fn with_filter<R>(
    name: &str,
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    hook: impl FnOnce(&mut Stream, &mut Envoy<'_>) -> R,
    on_panic: impl FnOnce(bool) -> R,
    reentrant: impl FnOnce(&Slot) -> R,
) -> R {
    match abi::enter::<Stream>(filter_envoy, filter) {
        // filter_new failed: Envoy closes the stream; never let anything pass meanwhile.
        Entered::Missing => on_panic(false),
        Entered::Busy(slot) => {
            if host::log_enabled(Level::Debug) {
                host::log(
                    Level::Debug,
                    &format!("responses_module: {name} re-entered during another hook"),
                );
            }
            reentrant(slot)
        }
        Entered::Free(mut guard) => {
            let result = contained(&mut guard, hook, on_panic);
            while let Some(event) = guard.next_deferred() {
                contained(
                    &mut guard,
                    |stream, host| deliver(stream, host, event),
                    |_| (),
                );
            }
            result
        }
    }
}

/// One call into the filter, a panic in it contained.
fn contained<R>(
    guard: &mut Guard<'_>,
    hook: impl FnOnce(&mut Stream, &mut Envoy<'_>) -> R,
    on_panic: impl FnOnce(bool) -> R,
) -> R {
    guard.run(|stream, host| {
        match catch_unwind(AssertUnwindSafe(|| hook(&mut *stream, &mut *host))) {
            Ok(result) => result,
            Err(_) => {
                let pass = catch_unwind(AssertUnwindSafe(
                    || on_stream!(stream, f => f.on_panic(host)),
                ))
                .unwrap_or_else(|_| {
                    // Even the ending failed: cut the stream.
                    let _ = catch_unwind(AssertUnwindSafe(|| Host::reset(host)));
                    false
                });
                on_panic(pass)
            }
        }
    })
}

/// An event Envoy reported during a hook, to the filter.
fn deliver(stream: &mut Stream, host: &mut Envoy<'_>, event: Deferred) {
    match event {
        Deferred::CalloutHeaders { id, headers, end } => {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            on_stream!(stream, f => f.callout_headers(host, id, &headers, end));
        }
        Deferred::CalloutData { id, bytes, end } => {
            on_stream!(stream, f => f.callout_data(host, id, &[bytes.as_slice()], end));
        }
        Deferred::CalloutTrailers { id, trailers } => {
            let trailers: Vec<(&str, &str)> = trailers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            on_stream!(stream, f => f.callout_trailers(host, id, &trailers));
        }
        Deferred::CalloutComplete(id) => on_stream!(stream, f => f.callout_complete(host, id)),
        Deferred::CalloutReset(id, reason) => {
            on_stream!(stream, f => f.callout_reset(host, id, reason));
        }
        Deferred::Scheduled(event_id) => scheduled(stream, host, event_id),
        // Told from the filter's scheduler, once Envoy is out of the write or close that
        // crossed the watermark ([`Envoy::tell_watermark`]).
        Deferred::WriteBlocked | Deferred::WriteUnblocked => host.tell_watermark(),
        Deferred::StreamComplete => on_stream!(stream, f => f.stream_complete(host)),
    }
}

/// A scheduler event: the filter's timer (unless disarmed or armed again since the commit),
/// Envoy's drain, its work's result, or a watermark the client's write buffer crossed.
fn scheduled(stream: &mut Stream, host: &mut Envoy<'_>, event_id: u64) {
    match event_id {
        abi::TIMER_EVENT if host.timer_due() => {
            on_stream!(stream, f => f.timer_fired(host));
        }
        abi::DRAIN_EVENT => on_stream!(stream, f => f.drain_started(host)),
        // The buffer's state now, whichever watermarks it crossed meanwhile.
        host::WRITE_EVENT => {
            if host.write_blocked() {
                on_stream!(stream, f => f.write_blocked(host));
            } else {
                on_stream!(stream, f => f.write_unblocked(host));
            }
        }
        abi::WORK_EVENT => {
            if let Some(worked) = host.take_worked() {
                on_stream!(stream, f => f.work_done(host, worked));
            }
        }
        _ => {}
    }
}

/// A hook that only reports an event: delivered now, or kept until the running hook returns.
fn report(name: &str, filter_envoy: FilterEnvoyPtr, filter: FilterModulePtr, event: Deferred) {
    let event = std::cell::Cell::new(Some(event));
    with_filter(
        name,
        filter_envoy,
        filter,
        |stream, host| {
            if let Some(event) = event.take() {
                deliver(stream, host, event);
            }
        },
        |_| (),
        |slot| {
            if let Some(event) = event.take() {
                slot.defer(event);
            }
        },
    );
}

/// A request hook re-entered: never expected (the filter's calls do not decode); the data is
/// held, nothing passes untranslated.
fn unexpected(hook: &str) {
    host::log(
        Level::Error,
        &format!("responses_module: Envoy re-entered {hook} during another hook; held"),
    );
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
        BodyStatus::Keep => abi::BODY_STOP_ITERATION_AND_WATERMARK,
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
        "request_headers",
        filter_envoy,
        filter,
        |s, host| headers_status(on_stream!(s, f => f.request_headers(host, end_of_stream))),
        |_| abi::HEADERS_STOP_ITERATION,
        |_| {
            unexpected("request_headers");
            abi::HEADERS_STOP_ITERATION
        },
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
        "request_body",
        filter_envoy,
        filter,
        |s, host| body_status(on_stream!(s, f => f.request_body(host, end_of_stream))),
        |_| abi::BODY_STOP_ITERATION_NO_BUFFER,
        |_| {
            unexpected("request_body");
            abi::BODY_STOP_ITERATION_NO_BUFFER
        },
    )
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
) -> abi::TrailersStatus {
    with_filter(
        "request_trailers",
        filter_envoy,
        filter,
        |s, host| trailers_status(on_stream!(s, f => f.request_trailers(host))),
        |_| abi::TRAILERS_STOP_ITERATION,
        |_| {
            unexpected("request_trailers");
            abi::TRAILERS_STOP_ITERATION
        },
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
        "response_headers",
        filter_envoy,
        filter,
        |s, host| headers_status(on_stream!(s, f => f.response_headers(host, end_of_stream))),
        |_| abi::HEADERS_STOP_ITERATION,
        // The filter's own answer (`send_response_headers`), on its way out.
        |_| abi::HEADERS_CONTINUE,
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
        "response_body",
        filter_envoy,
        filter,
        |s, host| body_status(on_stream!(s, f => f.response_body(host, end_of_stream))),
        |pass| {
            if pass {
                abi::BODY_CONTINUE
            } else {
                abi::BODY_STOP_ITERATION_NO_BUFFER
            }
        },
        |_| abi::BODY_CONTINUE,
    )
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
) -> abi::TrailersStatus {
    with_filter(
        "response_trailers",
        filter_envoy,
        filter,
        |s, host| trailers_status(on_stream!(s, f => f.response_trailers(host))),
        |pass| {
            if pass {
                abi::TRAILERS_CONTINUE
            } else {
                abi::TRAILERS_STOP_ITERATION
            }
        },
        |_| abi::TRAILERS_CONTINUE,
    )
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
) {
    report(
        "stream_complete",
        filter_envoy,
        filter,
        Deferred::StreamComplete,
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

// The hooks of a stream the filter answers itself: its callouts' answers, its scheduler
// (the timer service's and the drain's commits), the client's write buffer.

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    stream_id: u64,
    headers: EnvoyHeaders,
    headers_size: usize,
    end_stream: bool,
) {
    let id = CalloutId(stream_id);
    with_filter(
        "http_stream_headers",
        filter_envoy,
        filter,
        |s, host| {
            let headers = headers.pairs(headers_size);
            on_stream!(s, f => f.callout_headers(host, id, &headers, end_stream));
        },
        |_| (),
        |slot| {
            slot.defer(Deferred::CalloutHeaders {
                id,
                headers: owned(&headers.pairs(headers_size)),
                end: end_stream,
            })
        },
    );
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    stream_id: u64,
    data: EnvoyBuffers,
    data_count: usize,
    end_stream: bool,
) {
    let id = CalloutId(stream_id);
    with_filter(
        "http_stream_data",
        filter_envoy,
        filter,
        |s, host| {
            let pieces = data.pieces(data_count);
            on_stream!(s, f => f.callout_data(host, id, &pieces, end_stream));
        },
        |_| (),
        |slot| {
            slot.defer(Deferred::CalloutData {
                id,
                bytes: data.pieces(data_count).concat(),
                end: end_stream,
            })
        },
    );
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    stream_id: u64,
    trailers: EnvoyHeaders,
    trailers_size: usize,
) {
    let id = CalloutId(stream_id);
    with_filter(
        "http_stream_trailers",
        filter_envoy,
        filter,
        |s, host| {
            let trailers = trailers.pairs(trailers_size);
            on_stream!(s, f => f.callout_trailers(host, id, &trailers));
        },
        |_| (),
        |slot| {
            slot.defer(Deferred::CalloutTrailers {
                id,
                trailers: owned(&trailers.pairs(trailers_size)),
            })
        },
    );
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    stream_id: u64,
) {
    report(
        "http_stream_complete",
        filter_envoy,
        filter,
        Deferred::CalloutComplete(CalloutId(stream_id)),
    );
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    stream_id: u64,
    reason: HttpStreamResetReason,
) {
    report(
        "http_stream_reset",
        filter_envoy,
        filter,
        Deferred::CalloutReset(CalloutId(stream_id), abi::reset_reason(reason)),
    );
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    event_id: u64,
) {
    report(
        "scheduled",
        filter_envoy,
        filter,
        Deferred::Scheduled(event_id),
    );
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
) {
    watermark(filter_envoy, filter, true);
}

#[allow(unsafe_code)] // for #[no_mangle] alone
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
) {
    watermark(filter_envoy, filter, false);
}

/// The watermark state is the host's at once (so a filter asking in the same hook knows);
/// the event follows.
fn watermark(filter_envoy: FilterEnvoyPtr, filter: FilterModulePtr, above: bool) {
    let event = if above {
        Deferred::WriteBlocked
    } else {
        Deferred::WriteUnblocked
    };
    let name = if above {
        "downstream_above_write_buffer_high_watermark"
    } else {
        "downstream_below_write_buffer_low_watermark"
    };
    match abi::enter::<Stream>(filter_envoy, filter) {
        Entered::Missing => return,
        Entered::Busy(slot) => slot.watermark(above),
        // (The guard ends here: `report` enters again.)
        Entered::Free(guard) => guard.slot().watermark(above),
    }
    report(name, filter_envoy, filter, event);
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

// Hooks of features this filter never uses (one-shot callouts, the config's own callouts and
// scheduler), required by Envoy 1.40 all the same.

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
