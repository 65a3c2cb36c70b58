//! What the hooks (`crate::hooks`) exchange with Envoy: the ABI's types of their signatures,
//! and every operation on the values Envoy passes them (buffers, its pointers, the module's
//! own config and filter objects it holds for us). The hooks stay free of `unsafe`: each
//! function here is safe to call with the values of the current hook, which are the only
//! ones there are (no code outside the host layer can make one).

use std::ffi::c_char;
use std::sync::Arc;

use responses_core::environment::System;
use responses_core::metrics::Kind;

pub use super::abi::{
    BodyStatus, EnvoyBuffer, EnvoyHttpHeader, FilterConfigEnvoyPtr, FilterConfigModulePtr,
    FilterEnvoyPtr, FilterModulePtr, HeadersStatus, TrailersStatus, BODY_CONTINUE,
    BODY_STOP_ITERATION_NO_BUFFER, HEADERS_CONTINUE, HEADERS_STOP_ITERATION, TRAILERS_CONTINUE,
    TRAILERS_STOP_ITERATION,
};

use super::abi::{self, ModuleBuffer};
use super::{Envoy, MetricId};
use crate::config::FilterConfig;
use crate::filter::Filter;

/// The filter Envoy runs, on the real clock and randomness.
pub type EnvoyFilter = Filter<System>;

/// The ABI version `envoy_dynamic_module_on_program_init` answers with.
pub fn abi_version() -> *const c_char {
    abi::ABI_VERSION.as_ptr().cast()
}

impl EnvoyBuffer {
    /// The bytes of a buffer Envoy passed to the current hook (valid while it runs, so for
    /// as long as the hook's argument is borrowed); empty for a null pointer.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: only Envoy makes the buffers the hooks get, valid during the hook.
        unsafe { self.as_bytes() }
    }
}

/// Envoy validates a config without serving (`envoy --mode validate`).
pub fn is_validation_mode() -> bool {
    // SAFETY: no pointers; called from config_new on the main thread.
    unsafe { abi::envoy_dynamic_module_callback_is_validation_mode() }
}

/// Defines one stat of the config being made (in config_new, with its Envoy pointer);
/// `None` if Envoy refused it.
pub fn define_metric(
    config: FilterConfigEnvoyPtr,
    kind: Kind,
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
    let define = match kind {
        Kind::Counter => abi::envoy_dynamic_module_callback_http_filter_config_define_counter,
        Kind::Gauge => abi::envoy_dynamic_module_callback_http_filter_config_define_gauge,
        Kind::Histogram => abi::envoy_dynamic_module_callback_http_filter_config_define_histogram,
    };
    // SAFETY: Envoy's config pointer during config_new; it copies the names.
    let result = unsafe { define(config, name, labels_ptr, label_names.len(), &mut id) };
    (result == 0).then_some(MetricId(id))
}

/// A config handed to Envoy, which holds it until config_destroy.
pub fn config_to_envoy(config: FilterConfig) -> FilterConfigModulePtr {
    FilterConfigModulePtr(Arc::into_raw(Arc::new(config)).cast())
}

/// No config: Envoy refuses the filter.
pub fn no_config() -> FilterConfigModulePtr {
    FilterConfigModulePtr(std::ptr::null())
}

/// Envoy is done with a config (config_destroy).
pub fn drop_config(config: FilterConfigModulePtr) {
    if config.0.is_null() {
        return;
    }
    // SAFETY: made by `config_to_envoy`; Envoy destroys each config once.
    drop(unsafe { Arc::from_raw(config.0.cast::<FilterConfig>()) });
}

/// The config a new filter runs with (a handle of its own); `None` for a refused config.
pub fn config_of(config: FilterConfigModulePtr) -> Option<Arc<FilterConfig>> {
    if config.0.is_null() {
        return None;
    }
    let ptr = config.0.cast::<FilterConfig>();
    // SAFETY: made by `config_to_envoy`; the config outlives its filters.
    unsafe {
        Arc::increment_strong_count(ptr);
        Some(Arc::from_raw(ptr))
    }
}

/// A filter handed to Envoy, which holds it until filter_destroy.
pub fn filter_to_envoy(filter: EnvoyFilter) -> FilterModulePtr {
    FilterModulePtr(Box::into_raw(Box::new(filter)).cast_const().cast())
}

/// No filter: Envoy closes the stream.
pub fn no_filter() -> FilterModulePtr {
    FilterModulePtr(std::ptr::null())
}

/// Envoy is done with a filter (filter_destroy).
pub fn drop_filter(filter: FilterModulePtr) {
    if filter.0.is_null() {
        return;
    }
    // SAFETY: made by `filter_to_envoy`; Envoy destroys each filter once.
    drop(unsafe { Box::from_raw(filter.0.cast_mut().cast::<EnvoyFilter>()) });
}

/// Runs `run` on the filter of a stream hook with Envoy as its host; `None` when
/// filter_new had failed (Envoy then closes the stream).
pub fn with_filter<R>(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
    run: impl FnOnce(Option<(&mut EnvoyFilter, &mut Envoy)>) -> R,
) -> R {
    if filter.0.is_null() {
        return run(None);
    }
    // SAFETY: the filter Box of `filter_to_envoy`, used by one worker thread at a time; the
    // Envoy pointer is this hook's, and `host` lives no longer than it.
    let (filter, mut host) = unsafe {
        (
            &mut *filter.0.cast_mut().cast::<EnvoyFilter>(),
            Envoy::new(filter_envoy),
        )
    };
    run(Some((filter, &mut host)))
}
