//! End-to-end test harness, shared by the suites of `tests/` (`tests/e2e/`, `tests/docs/`,
//! `tests/load.rs`) and `benches/stream_modes.rs`. The parts that need no network (`json`,
//! `schema`, `sse`, the recorded failures) are the core's test helpers (`core/tests/common/`),
//! shared from there.
//!
//! * [`stack::Stack`]: a translating Envoy in the run's mode (`RESPONSES_E2E_MODE`): the
//!   processor beside `envoy/envoy.yaml` (ext_proc), or the module in `envoy/envoy-module.yaml`;
//! * [`envoy::Envoy`]: a real Envoy running `envoy/envoy.yaml` (ports substituted);
//! * [`processor::Processor`]: the `responses-extproc` binary; [`processor::PassthroughProcessor`]:
//!   an in-process ext_proc server that changes nothing (to test Envoy wiring on its own);
//! * [`upstream::ScriptedUpstream`]: a Chat Completions stand-in answering from a per-test script
//!   and recording every request; [`upstream::DemoUpstream`]: the built-in demo, in-process;
//! * [`codex`]: Codex CLI 0.171's recorded OpenAI-mode requests and what each becomes;
//! * [`recorded`]: the recorded upstream failures (tests/fixtures/upstream_errors/), each as a
//!   scripted reply;
//! * [`schema`]: validation against the official OpenResponses OpenAPI document;
//! * [`compressed`]: compressed request bodies, hostile shapes included;
//! * [`memory`]: a process's resident memory (`/proc`); [`noread`]: WebSocket clients that do
//!   not read;
//! * [`sse`]: SSE body parsing; [`json`]: the JSON reader every received body and event goes
//!   through, which refuses duplicate keys;
//! * [`prom::Export`]: a Prometheus text export, read (the processor's and Envoy's);
//! * [`prometheus::Prometheus`]: a real Prometheus scraping the exports, and its query API;
//! * [`otlp::OtlpReceiver`]: an OTLP trace receiver recording the spans it is sent (over TLS
//!   too); [`pki::Pki`]: throwaway certificates for the TLS tests.
//!
//! Every test gets its own ports (servers bind port 0, or a fresh free port), so tests run in
//! parallel. Every child process and server thread is stopped on Drop, also when a test panics.
//! In-process servers run on their own thread and runtime, so tests may be sync or async, and a
//! test that blocks does not stall them.
// Each test file uses a different part of the harness.
#![allow(dead_code, unused_imports)]

pub mod codex;
pub mod compressed;
pub mod envoy;
pub mod examples;
pub mod llama;
pub mod memory;
pub mod noread;
pub mod otlp;
pub mod pki;
pub mod processor;
pub mod prom;
pub mod prometheus;
pub mod recorded;
pub mod stack;
pub mod tenant;
pub mod upstream;
pub mod websocket;

pub use responses_testkit::{json, schema, sse};

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub use envoy::Envoy;
pub use processor::{Listen, PassthroughProcessor, Processor, Spawn};
pub use stack::{mode, only_ext_proc, only_module, Mode, Stack};
pub use upstream::{DemoUpstream, Gate, RecordedRequest, RecordingDemo, Reply, ScriptedUpstream};

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A port on 127.0.0.1 that was free a moment ago (for children that cannot report the port
/// they bound). Prefer binding port 0 in-process.
///
/// Picked below the kernel's ephemeral range: a port from bind(0) is ephemeral, and between
/// the pick and the child's bind any outgoing connection of a parallel test (or of Envoy) may
/// be given it as its local port (seen in CI: Envoy's "Address already in use"). Below the
/// range only another pick can take it, and picks in this process never repeat.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOWEST: u32 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = ephemeral_low.saturating_sub(LOWEST);
    if span >= 1_000 {
        // Another test binary running at the same time starts elsewhere in the span.
        let start = std::process::id().wrapping_mul(7_919) % span;
        for _ in 0..span {
            let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
            let port = u16::try_from(LOWEST + offset).expect("below the ephemeral range");
            if TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// Whether something accepts TCP connections on 127.0.0.1:`port`.
pub fn port_accepts(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// Polls `ready` every 25 ms until it returns `Some`, or panics after `timeout` with `what`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut ready: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = ready() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// A fresh directory under the system temp dir, removed on Drop.
pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> TempDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = std::env::temp_dir().join(format!(
            "responses-extproc-{prefix}-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An HTTP client that never uses a proxy from the environment.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("build reqwest client")
}

/// The last `max` bytes of a log file (lossy UTF-8), for panic messages.
pub fn log_tail(path: &std::path::Path, max: usize) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = bytes.len().saturating_sub(max);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

/// An async server running on its own thread and runtime; stopped (and joined) on Drop.
pub struct ServerThread {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ServerThread {
    /// Binds 127.0.0.1:0 on a new thread, then runs `serve(listener)` there until Drop.
    /// Returns the bound port.
    pub fn spawn<F, Fut>(name: &str, serve: F) -> (ServerThread, u16)
    where
        F: FnOnce(tokio::net::TcpListener) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (port_tx, port_rx) = std::sync::mpsc::channel::<u16>();
        let thread = std::thread::Builder::new()
            .name(format!("test-{name}"))
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("tokio runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                        .await
                        .expect("bind 127.0.0.1:0");
                    let port = listener.local_addr().expect("local addr").port();
                    port_tx.send(port).expect("report port");
                    tokio::select! {
                        _ = serve(listener) => {}
                        _ = stop_rx => {}
                    }
                });
                // Dropping `rt` here cancels every task still running (open streams).
            })
            .expect("spawn server thread");
        let port = port_rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{name} did not start"));
        (
            ServerThread {
                stop: Some(stop_tx),
                thread: Some(thread),
            },
            port,
        )
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
