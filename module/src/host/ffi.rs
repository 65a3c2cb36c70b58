//! What the hooks (`crate::hooks`) exchange with Envoy: the ABI's types of their signatures,
//! and every operation on the values Envoy passes them (buffers, its pointers, the module's
//! own config and filter objects it holds for us). The hooks stay free of `unsafe`: each
//! function here is safe to call with the values of the current hook, which are the only
//! ones there are (no code outside the host layer can make one).
//!
//! What Envoy holds for the module (a filter config, a stream's filter) is whatever the floor
//! above defines: this layer is generic over it and names none of it. Each such value is
//! handed over [`Tagged`] with its type, and read back only as that type.

use std::any::TypeId;
use std::cell::{Cell, RefCell, UnsafeCell};
use std::collections::VecDeque;
use std::ffi::{c_char, c_void};

use responses_core::metrics::Kind;

pub use super::abi::{
    BodyStatus, BootstrapConfigEnvoyPtr, BootstrapConfigModulePtr, BootstrapEnvoyPtr,
    BootstrapModulePtr, EnvoyBuffer, EnvoyHttpHeader, EventCb, EventContext, FilterConfigEnvoyPtr,
    FilterConfigModulePtr, FilterEnvoyPtr, FilterModulePtr, HeadersStatus, HttpStreamResetReason,
    TrailersStatus, BODY_CONTINUE, BODY_STOP_ITERATION_AND_WATERMARK,
    BODY_STOP_ITERATION_NO_BUFFER, HEADERS_CONTINUE, HEADERS_STOP_ITERATION, TRAILERS_CONTINUE,
    TRAILERS_STOP_ITERATION,
};
pub use super::timer::{DRAIN_EVENT, TIMER_EVENT};
pub use super::work::WORK_EVENT;

use super::abi::{self, ModuleBuffer};
use super::{CalloutId, CalloutReset, Envoy, HostState, MetricId};

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

/// A value Envoy holds for the module, behind one of its module pointers, its type's id first:
/// a pointer Envoy hands back is read as the type it was made of, or not at all (a mismatch
/// panics, which the hooks contain, rather than reading one type as another).
#[repr(C)]
struct Tagged<T> {
    kind: TypeId,
    value: T,
}

impl<T: 'static> Tagged<T> {
    /// `value`, boxed for Envoy to hold.
    fn into_raw(value: T) -> *const c_void {
        let tagged = Tagged {
            kind: TypeId::of::<T>(),
            value,
        };
        Box::into_raw(Box::new(tagged)).cast_const().cast()
    }

    /// The tagged value at `ptr`, checked to be a `T`.
    ///
    /// # Safety
    /// `ptr` was made by [`Tagged::into_raw`] (of some type) and is not freed yet.
    unsafe fn from_raw(ptr: *const c_void) -> *const Tagged<T> {
        // `repr(C)`: the id comes first whatever the value's type.
        let kind = unsafe { *ptr.cast::<TypeId>() };
        assert!(
            kind == TypeId::of::<T>(),
            "a module pointer read as another type than it was made of"
        );
        ptr.cast()
    }
}

/// A config as Envoy holds it: the module's, with Envoy's pointer to its own object for it
/// (which each of its filters records its stats against).
struct HeldConfig<C> {
    envoy: FilterConfigEnvoyPtr,
    config: C,
}

/// Envoy's object for a config, for the filters made with it ([`filter_to_envoy`]).
#[derive(Debug, Clone, Copy)]
pub struct ConfigEnvoy(FilterConfigEnvoyPtr);

/// A config handed to Envoy (config_new's `envoy` pointer with it), which holds it until
/// config_destroy.
pub fn config_to_envoy<C: 'static>(
    envoy: FilterConfigEnvoyPtr,
    config: C,
) -> FilterConfigModulePtr {
    FilterConfigModulePtr(Tagged::into_raw(HeldConfig { envoy, config }))
}

/// No config: Envoy refuses the filter.
pub fn no_config() -> FilterConfigModulePtr {
    FilterConfigModulePtr(std::ptr::null())
}

/// Envoy is done with a config (config_destroy), made of a `C`.
pub fn drop_config<C: 'static>(config: FilterConfigModulePtr) {
    if config.0.is_null() {
        return;
    }
    // SAFETY: made by `config_to_envoy`; Envoy destroys each config once.
    drop(unsafe { Box::from_raw(Tagged::<HeldConfig<C>>::from_raw(config.0).cast_mut()) });
}

/// The config a new filter runs with, made of a `C`, and Envoy's object for it; `None` for a
/// refused config.
pub fn config_of<'a, C: 'static>(config: FilterConfigModulePtr) -> Option<(&'a C, ConfigEnvoy)> {
    if config.0.is_null() {
        return None;
    }
    // SAFETY: made by `config_to_envoy`; the config outlives its filters (filter_new, the
    // only caller, clones what it keeps).
    let held = unsafe { &(*Tagged::<HeldConfig<C>>::from_raw(config.0)).value };
    Some((&held.config, ConfigEnvoy(held.envoy)))
}

/// An event Envoy reported while a hook of the same filter was running (re-entrance: from
/// inside one of the module's own calls), copied, to be delivered once that hook returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deferred {
    CalloutHeaders {
        id: CalloutId,
        headers: Vec<(String, String)>,
        end: bool,
    },
    CalloutData {
        id: CalloutId,
        bytes: Vec<u8>,
        end: bool,
    },
    CalloutTrailers {
        id: CalloutId,
        trailers: Vec<(String, String)>,
    },
    CalloutComplete(CalloutId),
    CalloutReset(CalloutId, CalloutReset),
    Scheduled(u64),
    WriteBlocked,
    WriteUnblocked,
    StreamComplete,
}

/// One stream's filter as Envoy holds it (its module pointer), with what the host layer keeps
/// for it and the guard against re-entrance.
///
/// Envoy calls some hooks of a filter from inside the filter's own calls, on the same thread:
/// the encoder hooks for the bytes of `send_response_*`, the callout hooks for a stream it
/// fails or resets inline, the watermark hooks when a write fills the buffer, and
/// stream-complete and destroy when a reply ends the stream. The filter is `&mut` to the hook
/// that runs, so a hook arriving meanwhile must not touch it: `busy` says one runs; such a
/// hook is answered without the filter (see `crate::hooks`) and its event kept in `deferred`,
/// delivered when the running hook returns; a destroy is postponed to then. `S`: what runs
/// the stream, the floor above's.
pub struct Slot<S> {
    busy: Cell<bool>,
    destroyed: Cell<bool>,
    deferred: RefCell<VecDeque<Deferred>>,
    watermark: Cell<u32>,
    inner: UnsafeCell<(S, HostState)>,
}

impl<S> Slot<S> {
    /// Keeps an event for when the running hook returns.
    pub fn defer(&self, event: Deferred) {
        self.deferred.borrow_mut().push_back(event);
    }

    /// Envoy reported the client's write buffer over its high watermark (true) or under its low
    /// one (false).
    pub fn watermark(&self, above: bool) {
        let n = self.watermark.get();
        self.watermark
            .set(if above { n + 1 } else { n.saturating_sub(1) });
    }
}

/// A stream handed to Envoy, which holds it until filter_destroy; `config`: Envoy's object for
/// the config it was made with (which outlives it).
pub fn filter_to_envoy<S: 'static>(stream: S, config: ConfigEnvoy) -> FilterModulePtr {
    let slot = Slot {
        busy: Cell::new(false),
        destroyed: Cell::new(false),
        deferred: RefCell::new(VecDeque::new()),
        watermark: Cell::new(0),
        inner: UnsafeCell::new((stream, HostState::new(config.0))),
    };
    FilterModulePtr(Tagged::into_raw(slot))
}

/// No filter: Envoy closes the stream.
pub fn no_filter() -> FilterModulePtr {
    FilterModulePtr(std::ptr::null())
}

/// Envoy is done with a filter (filter_destroy): freed now, or when the hook that is running
/// returns (Envoy destroyed it from inside that hook). `S`: what it was made of.
pub fn drop_filter<S: 'static>(filter: FilterModulePtr) {
    if filter.0.is_null() {
        return;
    }
    // SAFETY: made by `filter_to_envoy`, not freed yet (Envoy destroys each filter once; a
    // postponed free happens only after this call).
    unsafe {
        let slot = Tagged::<Slot<S>>::from_raw(filter.0);
        if (*slot).value.busy.get() {
            (*slot).value.destroyed.set(true);
            if super::log_enabled(super::Level::Debug) {
                super::log(
                    super::Level::Debug,
                    "responses_module: filter destroyed during one of its hooks; freed when it returns",
                );
            }
        } else {
            drop(Box::from_raw(slot.cast_mut()));
        }
    }
}

/// A stream hook's access to its filter.
pub enum Entered<'a, S> {
    /// filter_new had failed (Envoy closes the stream).
    Missing,
    /// Another hook of this filter is running: this one is re-entrant.
    Busy(&'a Slot<S>),
    Free(Guard<'a, S>),
}

/// The filter, exclusively, for one hook (and the events deferred during it); frees it at the
/// end if Envoy destroyed it meanwhile.
pub struct Guard<'a, S> {
    ptr: *const Tagged<Slot<S>>,
    filter_envoy: FilterEnvoyPtr,
    _hook: std::marker::PhantomData<&'a Slot<S>>,
}

impl<S> Guard<'_, S> {
    pub fn slot(&self) -> &Slot<S> {
        // SAFETY: alive while the guard is (freed only by its drop).
        unsafe { &(*self.ptr).value }
    }

    /// Runs `run` on the stream with Envoy as its host.
    pub fn run<R>(&mut self, run: impl FnOnce(&mut S, &mut Envoy<'_>) -> R) -> R {
        let slot = self.slot();
        // SAFETY: `busy` is set while this guard lives and every other access to `inner` first
        // checks it (`enter`), so this is the only reference (`&mut self`: one `run` at a
        // time); the Envoy pointer is this hook's.
        let (stream, state) = unsafe { &mut *slot.inner.get() };
        let mut host = unsafe { Envoy::new(self.filter_envoy, state, &slot.watermark) };
        run(stream, &mut host)
    }

    /// The next event Envoy reported during this hook.
    pub fn next_deferred(&mut self) -> Option<Deferred> {
        self.slot().deferred.borrow_mut().pop_front()
    }
}

impl<S> Drop for Guard<'_, S> {
    fn drop(&mut self) {
        let slot = self.slot();
        slot.busy.set(false);
        if slot.destroyed.get() {
            // SAFETY: Envoy destroyed the filter during this hook; nothing refers to it after
            // this guard.
            drop(unsafe { Box::from_raw(self.ptr.cast_mut()) });
        }
    }
}

/// Enters a stream hook: the filter (made of an `S`), exclusively, unless a hook of it is
/// already running.
pub fn enter<'a, S: 'static>(
    filter_envoy: FilterEnvoyPtr,
    filter: FilterModulePtr,
) -> Entered<'a, S> {
    if filter.0.is_null() {
        return Entered::Missing;
    }
    // SAFETY: the Slot of `filter_to_envoy`, alive until filter_destroy (postponed while a
    // hook runs), used by one worker thread at a time; only its cells are touched here.
    let ptr = unsafe { Tagged::<Slot<S>>::from_raw(filter.0) };
    let slot = unsafe { &(*ptr).value };
    if slot.busy.replace(true) {
        return Entered::Busy(slot);
    }
    Entered::Free(Guard {
        ptr,
        filter_envoy,
        _hook: std::marker::PhantomData,
    })
}

/// Headers Envoy passed to a hook (a pointer to `count` entries, valid during the hook).
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyHeaders(*const EnvoyHttpHeader);

impl EnvoyHeaders {
    /// The entries whose name and value are UTF-8, in order; `count` is the number Envoy
    /// passed with them.
    pub fn pairs(&self, count: usize) -> Vec<(&str, &str)> {
        if self.0.is_null() || count == 0 {
            return Vec::new();
        }
        // SAFETY: Envoy's array of `count` headers, valid during the hook (which outlives the
        // borrow of `self`).
        let raw = unsafe { std::slice::from_raw_parts(self.0, count) };
        raw.iter()
            // SAFETY: as above, each entry's bytes.
            .filter_map(|h| unsafe { h.utf8() })
            .collect()
    }
}

/// Body pieces Envoy passed to a hook (a pointer to `count` buffers, valid during the hook).
#[repr(transparent)]
#[derive(Debug, Clone, Copy)]
pub struct EnvoyBuffers(*const EnvoyBuffer);

impl EnvoyBuffers {
    /// The non-empty pieces; `count` is the number Envoy passed with them.
    pub fn pieces(&self, count: usize) -> Vec<&[u8]> {
        if self.0.is_null() || count == 0 {
            return Vec::new();
        }
        // SAFETY: Envoy's array of `count` buffers, valid during the hook.
        let raw = unsafe { std::slice::from_raw_parts(self.0, count) };
        raw.iter()
            // SAFETY: each buffer's bytes, valid during the hook.
            .map(|b| unsafe { b.as_bytes() })
            .filter(|b| !b.is_empty())
            .collect()
    }
}

/// A callout's reset reason, as Envoy numbers it.
pub fn reset_reason(reason: HttpStreamResetReason) -> CalloutReset {
    CalloutReset::from_abi(reason)
}

/// The bootstrap extension's config: the module keeps nothing for it (a non-null token).
/// Envoy holds its listeners until the config signals it is ready: at once.
pub fn bootstrap_config_ready(config: BootstrapConfigEnvoyPtr) -> BootstrapConfigModulePtr {
    // SAFETY: Envoy's config pointer during config_new.
    unsafe {
        abi::envoy_dynamic_module_callback_bootstrap_extension_config_signal_init_complete(config)
    };
    static TOKEN: u8 = 0;
    BootstrapConfigModulePtr(std::ptr::addr_of!(TOKEN).cast())
}

/// No bootstrap config: Envoy refuses it.
pub fn no_bootstrap_config() -> BootstrapConfigModulePtr {
    BootstrapConfigModulePtr(std::ptr::null())
}

/// The bootstrap extension itself: nothing kept either.
pub fn bootstrap_extension() -> BootstrapModulePtr {
    static TOKEN: u8 = 0;
    BootstrapModulePtr(std::ptr::addr_of!(TOKEN).cast())
}

/// The completion Envoy passed to the shutdown hook (it exits once it is called), kept until
/// the module is done.
pub struct Completion {
    callback: EventCb,
    context: EventContext,
}

// SAFETY: kept across threads only to be called back on Envoy's main thread (see
// `bootstrap`), where Envoy made it.
unsafe impl Send for Completion {}

impl Completion {
    pub fn new(callback: EventCb, context: EventContext) -> Completion {
        Completion { callback, context }
    }

    /// Calls it (once: it is consumed).
    pub fn complete(self) {
        if let Some(callback) = self.callback.0 {
            // SAFETY: Envoy's completion and its context (only Envoy makes either), once.
            unsafe { callback(self.context.0) }
        }
    }
}

/// The bootstrap config's scheduler: a commit, from any thread, reaches
/// `on_bootstrap_extension_config_scheduled` on Envoy's main thread. Deleted on drop.
pub struct MainThread(abi::BootstrapSchedulerPtr);

// SAFETY: Envoy's scheduler is made to be committed from any thread; the module deletes it
// only when no commit can run (it is behind a lock).
unsafe impl Send for MainThread {}

impl MainThread {
    /// In config_new, with Envoy's config pointer.
    pub fn new(config: BootstrapConfigEnvoyPtr) -> MainThread {
        // SAFETY: Envoy's config pointer during config_new.
        MainThread(unsafe {
            abi::envoy_dynamic_module_callback_bootstrap_extension_config_scheduler_new(config)
        })
    }

    pub fn commit(&self, event_id: u64) {
        // SAFETY: a live scheduler (deleted only on drop).
        unsafe {
            abi::envoy_dynamic_module_callback_bootstrap_extension_config_scheduler_commit(
                self.0, event_id,
            )
        }
    }
}

impl Drop for MainThread {
    fn drop(&mut self) {
        // SAFETY: made by scheduler_new, deleted once.
        unsafe {
            abi::envoy_dynamic_module_callback_bootstrap_extension_config_scheduler_delete(self.0)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a stream runs, as far as this layer knows: anything.
    struct Hosted;

    fn stream() -> FilterModulePtr {
        filter_to_envoy(Hosted, ConfigEnvoy(CONFIG_ENVOY))
    }

    // The Envoy pointers are never dereferenced here (no host call is made).
    const ENVOY: FilterEnvoyPtr = FilterEnvoyPtr(std::ptr::null_mut());
    const CONFIG_ENVOY: FilterConfigEnvoyPtr = FilterConfigEnvoyPtr(std::ptr::null_mut());

    // The Envoy callbacks that the code under test links (a log line, the deletes of a
    // scheduler and of child spans in the filter's drop glue), defined for the test binary,
    // which has no Envoy. Envoy logs nothing here, and no scheduler or span exists to delete.
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_log_enabled(_level: abi::LogLevel) -> bool {
        false
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_log(_level: abi::LogLevel, _message: ModuleBuffer) {
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_delete(
        _scheduler: abi::SchedulerPtr,
    ) {
        panic!("no scheduler exists in these tests");
    }
    #[no_mangle]
    extern "C" fn envoy_dynamic_module_callback_http_child_span_finish(_span: abi::SpanEnvoyPtr) {
        panic!("no child span exists in these tests");
    }

    #[test]
    fn a_hook_entered_during_another_is_busy_and_its_events_wait_for_it() {
        let ptr = stream();
        let Entered::Free(mut guard) = enter::<Hosted>(ENVOY, ptr) else {
            panic!("the first hook has the filter");
        };
        let Entered::Busy(slot) = enter::<Hosted>(ENVOY, ptr) else {
            panic!("a hook during it is re-entrant");
        };
        slot.defer(Deferred::CalloutComplete(CalloutId(3)));
        slot.watermark(true);
        slot.defer(Deferred::WriteBlocked);
        assert_eq!(guard.slot().watermark.get(), 1, "the state changes at once");
        assert_eq!(
            guard.next_deferred(),
            Some(Deferred::CalloutComplete(CalloutId(3)))
        );
        assert_eq!(guard.next_deferred(), Some(Deferred::WriteBlocked));
        assert_eq!(guard.next_deferred(), None);
        drop(guard);
        // The hook returned: the next one has the filter again.
        let Entered::Free(guard) = enter::<Hosted>(ENVOY, ptr) else {
            panic!("free again");
        };
        guard.slot().watermark(false);
        guard.slot().watermark(false);
        assert_eq!(guard.slot().watermark.get(), 0, "never below zero");
        drop(guard);
        drop_filter::<Hosted>(ptr);
    }

    #[test]
    fn a_filter_destroyed_during_its_hook_is_freed_when_the_hook_returns() {
        let ptr = stream();
        let Entered::Free(mut guard) = enter::<Hosted>(ENVOY, ptr) else {
            panic!("free");
        };
        drop_filter::<Hosted>(ptr);
        // Still usable until the hook returns.
        assert!(guard.slot().destroyed.get());
        guard.slot().defer(Deferred::StreamComplete);
        assert_eq!(guard.next_deferred(), Some(Deferred::StreamComplete));
        drop(guard); // frees it (a double free or a leak would show under Miri/ASan)
        assert!(matches!(
            enter::<Hosted>(ENVOY, no_filter()),
            Entered::Missing
        ));
    }

    #[test]
    fn a_pointer_is_read_only_as_the_type_it_was_made_of() {
        let config = config_to_envoy(CONFIG_ENVOY, 7u32);
        assert_eq!(config_of::<u32>(config).map(|(c, _)| c), Some(&7));
        let read_as_other = std::panic::catch_unwind(|| config_of::<u64>(config).map(|(c, _)| *c));
        assert!(read_as_other.is_err(), "a u32 config read as a u64");
        drop_config::<u32>(config);
        assert!(config_of::<u32>(no_config()).is_none());

        let ptr = stream();
        let entered_as_other =
            std::panic::catch_unwind(|| matches!(enter::<u8>(ENVOY, ptr), Entered::Free(_)));
        assert!(
            entered_as_other.is_err(),
            "a stream entered as another type"
        );
        // The failed entry touched nothing: the filter is free.
        assert!(matches!(enter::<Hosted>(ENVOY, ptr), Entered::Free(_)));
        drop_filter::<Hosted>(ptr);
    }

    #[test]
    fn envoys_header_and_buffer_arrays_are_read_as_given() {
        let header = |k: &'static [u8], v: &'static [u8]| EnvoyHttpHeader {
            key_ptr: k.as_ptr().cast(),
            key_length: k.len(),
            value_ptr: v.as_ptr().cast(),
            value_length: v.len(),
        };
        let raw = [
            header(b":status", b"200"),
            header(b"x-bin", b"\xff"),
            header(b"content-type", b"text/event-stream"),
        ];
        let headers = EnvoyHeaders(raw.as_ptr());
        assert_eq!(
            headers.pairs(raw.len()),
            [(":status", "200"), ("content-type", "text/event-stream")],
            "a value that is not UTF-8 is left out"
        );
        assert_eq!(headers.pairs(1), [(":status", "200")]);
        assert!(EnvoyHeaders(std::ptr::null()).pairs(3).is_empty());
        let pieces = [
            EnvoyBuffer {
                ptr: b"data: ".as_ptr().cast(),
                length: 6,
            },
            EnvoyBuffer::EMPTY,
            EnvoyBuffer {
                ptr: b"{}".as_ptr().cast(),
                length: 2,
            },
        ];
        let buffers = EnvoyBuffers(pieces.as_ptr());
        assert_eq!(buffers.pieces(3), [&b"data: "[..], &b"{}"[..]]);
        assert!(EnvoyBuffers(std::ptr::null()).pieces(2).is_empty());
    }
}
