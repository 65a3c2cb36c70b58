//! The part of Envoy's dynamic-module ABI this module uses: types and the callbacks Envoy
//! exports (the hooks Envoy calls are in `hooks`). Private to the host layer: nothing else
//! calls Envoy, and the values Envoy hands the hooks (pointers, buffers) can be made only
//! here (their fields are the host layer's), so the host's safe functions over them are only
//! ever given what Envoy passed.
//!
//! Written from `source/extensions/dynamic_modules/abi/abi.h` of envoyproxy/envoy (facts and
//! signatures only), and checked against the Envoy 1.40.0 binary: every callback declared here
//! is one it exports (`.ci/module-symbols` runs `nm -D` on both), and its ABI version is
//! [`ABI_VERSION`]. Only what the adapter calls is declared.

#![allow(non_camel_case_types)]

use std::ffi::c_char;
use std::os::raw::c_void;

/// The ABI version Envoy 1.40.0 expects from `envoy_dynamic_module_on_program_init` (a
/// mismatch only warns; NULL refuses the module).
pub const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// `envoy_dynamic_module_type_envoy_buffer`: bytes owned by Envoy.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyBuffer {
    pub(super) ptr: *const c_char,
    pub(super) length: usize,
}

impl EnvoyBuffer {
    pub(super) const EMPTY: EnvoyBuffer = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    /// The bytes, valid for the current hook (Envoy's contract); empty for a null pointer.
    ///
    /// # Safety
    /// `ptr` must point to `length` readable bytes that outlive `'a`.
    pub(super) unsafe fn as_bytes<'a>(self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            &[]
        } else {
            // SAFETY: the caller's contract.
            unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.length) }
        }
    }
}

/// `envoy_dynamic_module_type_module_buffer`: bytes owned by the module.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const c_char,
    pub length: usize,
}

impl ModuleBuffer {
    /// A null buffer: for `set_header`, "remove the header".
    pub const NULL: ModuleBuffer = ModuleBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    pub fn from(bytes: &[u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: bytes.as_ptr().cast::<c_char>(),
            length: bytes.len(),
        }
    }
}

/// `envoy_dynamic_module_type_module_http_header`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleHttpHeader {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
}

/// `envoy_dynamic_module_type_module_key_value_pair`: a key and a string value, owned by the
/// module.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ModuleKeyValue {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
}

/// `envoy_dynamic_module_type_envoy_http_header`: a header owned by Envoy (what
/// `envoy_dynamic_module_callback_http_get_headers` fills in).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyHttpHeader {
    pub key_ptr: *const c_char,
    pub key_length: usize,
    pub value_ptr: *const c_char,
    pub value_length: usize,
}

impl EnvoyHttpHeader {
    /// The name and value, if both are UTF-8.
    ///
    /// # Safety
    /// Both pointers must point to their lengths of readable bytes that outlive `'a`.
    pub(super) unsafe fn utf8<'a>(&self) -> Option<(&'a str, &'a str)> {
        // SAFETY: the caller's.
        let (name, value) = unsafe {
            (
                EnvoyBuffer {
                    ptr: self.key_ptr,
                    length: self.key_length,
                }
                .as_bytes(),
                EnvoyBuffer {
                    ptr: self.value_ptr,
                    length: self.value_length,
                }
                .as_bytes(),
            )
        };
        Some((
            std::str::from_utf8(name).ok()?,
            std::str::from_utf8(value).ok()?,
        ))
    }
}

/// `envoy_dynamic_module_type_http_header_type`.
pub type HeaderType = u32;
pub const REQUEST_HEADER: HeaderType = 0;
pub const RESPONSE_HEADER: HeaderType = 2;

/// `envoy_dynamic_module_type_http_body_type`.
pub type BodyType = u32;
pub const RECEIVED_REQUEST_BODY: BodyType = 0;
pub const BUFFERED_REQUEST_BODY: BodyType = 1;
pub const RECEIVED_RESPONSE_BODY: BodyType = 2;
pub const BUFFERED_RESPONSE_BODY: BodyType = 3;

/// `envoy_dynamic_module_type_log_level`.
pub type LogLevel = u32;

/// `envoy_dynamic_module_type_metrics_result` (0: success).
pub type MetricsResult = u32;

/// `envoy_dynamic_module_type_http_filter_stream_reset_reason`: 0 is `LocalReset`.
pub type StreamResetReason = u32;
pub const LOCAL_RESET: StreamResetReason = 0;

/// The statuses the hooks return (Envoy's `FilterHeadersStatus`, `FilterDataStatus`,
/// `FilterTrailersStatus` as the ABI numbers them).
pub type HeadersStatus = u32;
pub const HEADERS_CONTINUE: HeadersStatus = 0;
pub const HEADERS_STOP_ITERATION: HeadersStatus = 1;
pub type BodyStatus = u32;
pub const BODY_CONTINUE: BodyStatus = 0;
/// Envoy keeps the piece in the stream's buffer (with what it kept before); over the buffer's
/// high watermark it stops reading the client until the filter drains it.
pub const BODY_STOP_ITERATION_AND_WATERMARK: BodyStatus = 2;
pub const BODY_STOP_ITERATION_NO_BUFFER: BodyStatus = 3;
pub type TrailersStatus = u32;
pub const TRAILERS_CONTINUE: TrailersStatus = 0;
pub const TRAILERS_STOP_ITERATION: TrailersStatus = 1;

/// `envoy_dynamic_module_type_http_callout_init_result`: what starting a callout stream
/// returned.
pub type CalloutInitResult = u32;
pub const CALLOUT_INIT_SUCCESS: CalloutInitResult = 0;
pub const CALLOUT_INIT_MISSING_REQUIRED_HEADERS: CalloutInitResult = 1;
pub const CALLOUT_INIT_CLUSTER_NOT_FOUND: CalloutInitResult = 2;
// 3, DuplicateCalloutId: no longer returned (Envoy picks the ids).
pub const CALLOUT_INIT_CANNOT_CREATE_REQUEST: CalloutInitResult = 4;

/// `envoy_dynamic_module_type_attribute_id`: which of Envoy's attributes
/// (`request.protocol`: 10, after request.path, url_path, host, scheme, method, headers,
/// referer, useragent, time and id; `source.address`: 24, after request.query, duration, size,
/// total_size and response.code, code_details, flags, grpc_status, headers, trailers, size,
/// total_size, backend_latency).
pub type AttributeId = u32;
pub const ATTRIBUTE_REQUEST_PROTOCOL: AttributeId = 10;
/// The downstream address as Envoy sees it (`ip:port`: the connection's peer, or the client
/// Envoy's `x-forwarded-for` rules trust).
pub const ATTRIBUTE_SOURCE_ADDRESS: AttributeId = 24;

/// `envoy_dynamic_module_type_http_stream_reset_reason` (Envoy's
/// `AsyncClient::StreamResetReason`, in this order).
pub type HttpStreamResetReason = u32;

/// `envoy_dynamic_module_type_http_filter_scheduler_module_ptr`: a scheduler Envoy made for one
/// filter (a weak reference to it: committing after the filter is gone does nothing), owned by
/// the module until `..._scheduler_delete`. Committing it is the one callback Envoy allows from
/// any thread.
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct SchedulerPtr(pub(super) *mut c_void);

/// `envoy_dynamic_module_type_bootstrap_extension_config_scheduler_module_ptr`: like the
/// filter's, for the bootstrap extension's config: a commit (from any thread) reaches
/// `on_bootstrap_extension_config_scheduled` on Envoy's main thread.
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct BootstrapSchedulerPtr(pub(super) *mut c_void);

/// `envoy_dynamic_module_type_event_cb`: a completion Envoy passes to a hook, with its context.
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct EventCb(pub(super) Option<unsafe extern "C" fn(context: *mut c_void)>);
/// The context Envoy passes with an [`EventCb`].
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct EventContext(pub(super) *mut c_void);

/// The bootstrap extension's pointers: its config (Envoy's and the module's) and the
/// extension itself (Envoy's and the module's).
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct BootstrapConfigEnvoyPtr(pub(super) *mut c_void);
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct BootstrapConfigModulePtr(pub(super) *const c_void);
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct BootstrapEnvoyPtr(pub(super) *mut c_void);
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct BootstrapModulePtr(pub(super) *const c_void);

/// Pointers Envoy hands out (`*_envoy_ptr`) and the module's own (`*_module_ptr`), each a
/// type of its own (the pointer, as the ABI passes it) that only the host layer reads or makes.
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct FilterEnvoyPtr(pub(super) *mut c_void);
/// `envoy_dynamic_module_type_span_envoy_ptr`: the stream's active span, owned by Envoy, valid
/// for the stream's lifetime (the module never finishes it).
pub type SpanEnvoyPtr = *mut c_void;
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct FilterConfigEnvoyPtr(pub(super) *mut c_void);
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct FilterModulePtr(pub(super) *const c_void);
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct FilterConfigModulePtr(pub(super) *const c_void);

unsafe extern "C" {
    pub fn envoy_dynamic_module_callback_log(level: LogLevel, message: ModuleBuffer);
    pub fn envoy_dynamic_module_callback_log_enabled(level: LogLevel) -> bool;
    /// Envoy runs `--mode validate` (main thread only).
    pub fn envoy_dynamic_module_callback_is_validation_mode() -> bool;

    pub fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        config: FilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        counter_id: *mut usize,
    ) -> MetricsResult;
    pub fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
        config: FilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        gauge_id: *mut usize,
    ) -> MetricsResult;
    pub fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
        config: FilterConfigEnvoyPtr,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_length: usize,
        histogram_id: *mut usize,
    ) -> MetricsResult;
    /// The stats are recorded against a config (from any of its filters' hooks): the label
    /// values are made into Envoy's stat names in a pool of the call's own, freed as it
    /// returns (checked against the 1.40.0 binary), where the `http_filter_*` calls keep them
    /// in the filter's pool until the filter goes.
    pub fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        config: FilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;
    pub fn envoy_dynamic_module_callback_http_filter_config_increment_gauge(
        config: FilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;
    pub fn envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
        config: FilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;
    pub fn envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
        config: FilterConfigEnvoyPtr,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_length: usize,
        value: u64,
    ) -> MetricsResult;

    pub fn envoy_dynamic_module_callback_http_get_header(
        filter: FilterEnvoyPtr,
        header_type: HeaderType,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;
    /// The number of entries of a header map (a header with several values counts once per
    /// value); 0 when the map does not exist in this hook. Checked against the 1.40.0 binary's
    /// disassembly: two arguments, the size returned (no out-pointer).
    pub fn envoy_dynamic_module_callback_http_get_headers_size(
        filter: FilterEnvoyPtr,
        header_type: HeaderType,
    ) -> usize;
    /// Fills `result_headers` (at least `get_headers_size` entries) with every entry of a
    /// header map, valid until the end of the hook or a header of it is set.
    pub fn envoy_dynamic_module_callback_http_get_headers(
        filter: FilterEnvoyPtr,
        header_type: HeaderType,
        result_headers: *mut EnvoyHttpHeader,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_set_header(
        filter: FilterEnvoyPtr,
        header_type: HeaderType,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterEnvoyPtr,
        status_code: u32,
        headers: *mut ModuleHttpHeader,
        headers_length: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );

    pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        filter: FilterEnvoyPtr,
        body_type: BodyType,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: FilterEnvoyPtr,
        body_type: BodyType,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_get_body_size(
        filter: FilterEnvoyPtr,
        body_type: BodyType,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_append_body(
        filter: FilterEnvoyPtr,
        body_type: BodyType,
        data: ModuleBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_drain_body(
        filter: FilterEnvoyPtr,
        body_type: BodyType,
        number_of_bytes: usize,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_set_dynamic_metadata_number(
        filter: FilterEnvoyPtr,
        namespace: ModuleBuffer,
        key: ModuleBuffer,
        value: f64,
    );
    pub fn envoy_dynamic_module_callback_http_set_dynamic_metadata_string_batch(
        filter: FilterEnvoyPtr,
        namespace: ModuleBuffer,
        entries: *const ModuleKeyValue,
        entries_length: usize,
    );
    pub fn envoy_dynamic_module_callback_http_set_dynamic_metadata_bool(
        filter: FilterEnvoyPtr,
        namespace: ModuleBuffer,
        key: ModuleBuffer,
        value: bool,
    );

    pub fn envoy_dynamic_module_callback_http_clear_route_cache(filter: FilterEnvoyPtr);
    /// Resumes a request whose decoding a hook stopped: Envoy sends on its head and what its
    /// buffer holds (called outside the hooks, from a callout's event).
    pub fn envoy_dynamic_module_callback_http_filter_continue_decoding(filter: FilterEnvoyPtr);

    /// Null when the stream is not traced (no tracer in the HCM: Envoy's `NullSpan`).
    pub fn envoy_dynamic_module_callback_http_get_active_span(
        filter: FilterEnvoyPtr,
    ) -> SpanEnvoyPtr;
    /// Sets each key to its value (strings) on the span. Not in the header this file was
    /// first written from; its shape was read from the 1.40.0 binary (`objdump -d`): a null
    /// span is ignored, then `tags_length` entries of four words each (key pointer and length,
    /// value pointer and length, as [`ModuleKeyValue`]), each passed to the span's `setTag`.
    pub fn envoy_dynamic_module_callback_http_span_set_tag_batch(
        span: SpanEnvoyPtr,
        tags: *const ModuleKeyValue,
        tags_length: usize,
    );
    pub fn envoy_dynamic_module_callback_http_span_set_operation(
        span: SpanEnvoyPtr,
        operation: ModuleBuffer,
    );
    /// An event on the span, stamped with the filter's dispatcher time (now).
    pub fn envoy_dynamic_module_callback_http_span_log(
        filter: FilterEnvoyPtr,
        span: SpanEnvoyPtr,
        event: ModuleBuffer,
    );
    /// A child of `span` (Envoy's egress config), started now, owned by the module until
    /// `child_span_finish`; null if Envoy made none. The child is a span like the active one
    /// (tags, operation, log, ids). Checked against the 1.40.0 binary: filter, span, then the
    /// operation name as a buffer by value.
    pub fn envoy_dynamic_module_callback_http_span_spawn_child(
        filter: FilterEnvoyPtr,
        span: SpanEnvoyPtr,
        operation: ModuleBuffer,
    ) -> SpanEnvoyPtr;
    /// Finishes (exports) a child span and frees it.
    pub fn envoy_dynamic_module_callback_http_child_span_finish(span: SpanEnvoyPtr);
    /// The span's trace id and span id as its tracer writes them (W3C's lowercase hex for
    /// OpenTelemetry), valid until the next such call on this thread; false if it has none.
    pub fn envoy_dynamic_module_callback_http_span_get_trace_id(
        span: SpanEnvoyPtr,
        result: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_span_get_span_id(
        span: SpanEnvoyPtr,
        result: *mut EnvoyBuffer,
    ) -> bool;
    /// A string attribute of the stream (`result` valid during the hook); false if Envoy has
    /// none. Checked against the 1.40.0 binary: three arguments, the result one buffer.
    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        filter: FilterEnvoyPtr,
        attribute: AttributeId,
        result: *mut EnvoyBuffer,
    ) -> bool;
    /// The stream's buffer limit: the listener's `per_connection_buffer_limit_bytes` (1 MiB by
    /// default), the high watermark of the client's write buffer; 0 if Envoy has none.
    pub fn envoy_dynamic_module_callback_http_get_buffer_limit(filter: FilterEnvoyPtr) -> u64;
    pub fn envoy_dynamic_module_callback_http_filter_reset_stream(
        filter: FilterEnvoyPtr,
        reason: StreamResetReason,
        details: ModuleBuffer,
    );

    // The filter's own streaming reply (it answers the client itself, e.g. a WebSocket's 101
    // and frames): Envoy encodes each through the encoder filters (ours among them, re-entered
    // inline: `host::ffi` guards that). Checked against the 1.40.0 binary: each returns at once
    // once the filter is destroyed.
    pub fn envoy_dynamic_module_callback_http_send_response_headers(
        filter: FilterEnvoyPtr,
        headers: *mut ModuleHttpHeader,
        headers_length: usize,
        end_stream: bool,
    );
    pub fn envoy_dynamic_module_callback_http_send_response_data(
        filter: FilterEnvoyPtr,
        data: ModuleBuffer,
        end_stream: bool,
    );
    pub fn envoy_dynamic_module_callback_http_send_response_trailers(
        filter: FilterEnvoyPtr,
        trailers: *mut ModuleHttpHeader,
        trailers_length: usize,
    );

    // Streaming callouts: an HTTP stream of the filter's own to a cluster (Envoy's async
    // client), its answer reported to the `on_http_filter_http_stream_*` hooks under the id
    // Envoy wrote to `stream_id_out`. The request needs `:method`, `:path` and `host`
    // (`:authority`). A timeout of 0 is none. Envoy resets every stream still open when the
    // filter is destroyed, without reporting it.
    pub fn envoy_dynamic_module_callback_http_filter_start_http_stream(
        filter: FilterEnvoyPtr,
        stream_id_out: *mut u64,
        cluster_name: ModuleBuffer,
        headers: *mut ModuleHttpHeader,
        headers_length: usize,
        body: ModuleBuffer,
        end_stream: bool,
        timeout_milliseconds: u64,
    ) -> CalloutInitResult;
    /// False: no such stream (ended, reset, or never started).
    pub fn envoy_dynamic_module_callback_http_stream_send_data(
        filter: FilterEnvoyPtr,
        stream_id: u64,
        data: ModuleBuffer,
        end_stream: bool,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_stream_send_trailers(
        filter: FilterEnvoyPtr,
        stream_id: u64,
        trailers: *mut ModuleHttpHeader,
        trailers_length: usize,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_filter_reset_http_stream(
        filter: FilterEnvoyPtr,
        stream_id: u64,
    );

    // The filter's scheduler: `commit` (from any thread) posts `event_id` to the filter's
    // worker, where Envoy calls `on_http_filter_scheduled` if the filter is still there. In the
    // 1.40.0 binary the scheduler is the filter's weak pointer alone (16 bytes); `new` needs
    // the filter's dispatcher, set once its decoder callbacks are (call it from a stream hook).
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_new(
        filter: FilterEnvoyPtr,
    ) -> SchedulerPtr;
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
        scheduler: SchedulerPtr,
        event_id: u64,
    );
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: SchedulerPtr);

    // The bootstrap config's scheduler (its weak pointer, in the 1.40.0 binary, as the
    // filter's).
    pub fn envoy_dynamic_module_callback_bootstrap_extension_config_scheduler_new(
        config: BootstrapConfigEnvoyPtr,
    ) -> BootstrapSchedulerPtr;
    pub fn envoy_dynamic_module_callback_bootstrap_extension_config_scheduler_commit(
        scheduler: BootstrapSchedulerPtr,
        event_id: u64,
    );
    pub fn envoy_dynamic_module_callback_bootstrap_extension_config_scheduler_delete(
        scheduler: BootstrapSchedulerPtr,
    );

    /// Envoy holds its listeners back (an init target of each bootstrap extension config)
    /// until the extension's config calls this: the module does it at once in config_new.
    pub fn envoy_dynamic_module_callback_bootstrap_extension_config_signal_init_complete(
        config: BootstrapConfigEnvoyPtr,
    );
}
