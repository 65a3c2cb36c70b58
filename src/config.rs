//! Every knob of the processor, with its default and its environment variable.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, Parser, ValueEnum};

use std::sync::Arc;

use chacha20poly1305::aead::{rand_core::RngCore, OsRng};

use responses_core::settings::ExchangeConfig;
pub use responses_core::settings::KeySource;
use responses_core::translate::seal::Keyring;

#[derive(Debug, Parser)]
#[command(
    name = "responses-extproc",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("RESPONSES_EXTPROC_GIT"), ")"),
    about = "Envoy ext_proc service that serves the OpenResponses API (POST /v1/responses) \
             from any Chat Completions upstream"
)]
pub struct Cli {
    #[command(flatten)]
    pub serve: Config,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The body mode asked of Envoy for SSE answers (see envoy/envoy.yaml for the measurement).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StreamBodyMode {
    /// STREAMED: Envoy sends each chunk and waits for its answer.
    Streamed,
    /// FULL_DUPLEX_STREAMED: chunks and answers flow independently (trailers sent too).
    FullDuplexStreamed,
}

/// Options of the ext_proc server.
#[derive(Debug, Clone, Args)]
pub struct Config {
    /// Address of the gRPC listener (ext_proc + grpc.health.v1): `HOST:PORT`, or
    /// `unix:/path/to.sock` for a Unix domain socket.
    #[arg(
        long,
        default_value = "127.0.0.1:50051",
        env = "RESPONSES_EXTPROC_LISTEN"
    )]
    pub listen: Listen,

    /// PEM certificate chain: serve gRPC over TLS (with --tls-key).
    #[arg(long, requires = "tls_key", env = "RESPONSES_EXTPROC_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert", env = "RESPONSES_EXTPROC_TLS_KEY")]
    pub tls_key: Option<PathBuf>,

    /// PEM CA bundle: require and verify client certificates (mTLS). Needs --tls-cert.
    #[arg(long, requires = "tls_cert", env = "RESPONSES_EXTPROC_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,

    /// Debug aid: log request bodies and translated answers at debug level. They contain
    /// prompts and completions; never enable it on production traffic.
    #[arg(long, env = "RESPONSES_EXTPROC_LOG_CONTENT")]
    pub log_content: bool,

    /// The settings every adapter shares (routing, translation, caps, sealing keys):
    /// defined once in the core, the Envoy module reads them from its filter config
    /// under the same names (`--max-body-bytes` is `max_body_bytes`).
    #[command(flatten)]
    pub exchange: ExchangeConfig,

    /// Body mode for SSE answers: `streamed` or `full-duplex-streamed` (equal on token-paced
    /// streams, measured in envoy/envoy.yaml; full duplex helps only with unpaced upstreams).
    #[arg(
        long,
        value_enum,
        default_value = "streamed",
        env = "RESPONSES_EXTPROC_STREAM_BODY_MODE"
    )]
    pub stream_body_mode: StreamBodyMode,

    /// Threads serving exchanges. 1 by default, a current-thread runtime: no work stealing
    /// and no wake-ups across threads, the least CPU per exchange (benches/side_by_side.py:
    /// 36-38 vs 54-57 us per JSON exchange with 2 workers, and Envoy's own cost drops too).
    /// One thread keeps up with about three Envoy workers; a large translation (a 16 MiB
    /// body takes tens of milliseconds) holds up the others meanwhile. Raise it with Envoy's
    /// --concurrency.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..), env = "RESPONSES_EXTPROC_WORKER_THREADS")]
    pub worker_threads: u16,

    /// Address of the admin HTTP listener serving Prometheus metrics at /metrics
    /// (e.g. 127.0.0.1:9464). Off when unset.
    #[arg(long, env = "RESPONSES_EXTPROC_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Export one span per exchange (OpenTelemetry GenAI conventions, in the caller's trace)
    /// and push the metrics (the GenAI conventions' instruments among them) over OTLP to this
    /// collector, e.g. http://127.0.0.1:4317 (gRPC; with OTEL_EXPORTER_OTLP_PROTOCOL=
    /// http/protobuf, the base URL of /v1/traces and /v1/metrics). https:// is TLS, verified
    /// by OTEL_EXPORTER_OTLP_CERTIFICATE or the system's roots (mTLS:
    /// OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and _CLIENT_KEY). Off when unset, unless
    /// OTEL_EXPORTER_OTLP_ENDPOINT (or its _TRACES_ / _METRICS_ form, for that signal) is set;
    /// OTEL_TRACES_EXPORTER=none or OTEL_METRICS_EXPORTER=none turns one signal off.
    #[arg(long, env = "RESPONSES_EXTPROC_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// Debug aid: record request and answer bodies on the spans. They contain prompts and
    /// completions; never enable it on production traffic.
    #[arg(long, env = "RESPONSES_EXTPROC_TRACE_CONTENT")]
    pub trace_content: bool,

    /// Serve the WebSocket transport of `/v1/responses` on this address (`HOST:PORT`); Envoy
    /// routes upgrade requests here (envoy/envoy.yaml, cluster `responses_ws`). Off if unset.
    #[arg(long, env = "RESPONSES_EXTPROC_WS_LISTEN")]
    pub ws_listen: Option<SocketAddr>,

    /// Where the processor sends its own Chat requests (+ --chat-path: the WebSocket
    /// transport's, an automatic compaction's): back into Envoy, so that its routes, load
    /// balancing and rate limits apply; envoy/envoy.yaml's loopback listener
    /// `responses_calls`, which keeps their model headers for the routes by model.
    #[arg(
        long,
        default_value = "http://127.0.0.1:10001",
        env = "RESPONSES_EXTPROC_WS_UPSTREAM"
    )]
    pub ws_upstream: String,

    /// How long in-flight requests may run after SIGTERM/SIGINT before the process exits.
    #[arg(long, default_value = "30", value_parser = parse_secs, env = "RESPONSES_EXTPROC_DRAIN_SECONDS")]
    pub drain_seconds: Duration,

    /// Log format.
    #[arg(
        long,
        value_enum,
        default_value = "text",
        env = "RESPONSES_EXTPROC_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
}

/// Where the gRPC server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Tcp(SocketAddr),
    Unix(PathBuf),
}

impl FromStr for Listen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_prefix("unix:") {
            Some("") => Err("unix: needs a socket path".into()),
            Some(path) => Ok(Listen::Unix(PathBuf::from(path))),
            None => s
                .parse()
                .map(Listen::Tcp)
                .map_err(|e| format!("expected HOST:PORT or unix:/path ({e})")),
        }
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Tcp(a) => write!(f, "{a}"),
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    s.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|e| format!("expected whole seconds: {e}"))
}

impl Config {
    /// The exchange rules' settings (shared by every adapter); `keyring` from [`Config::keyring`].
    pub fn exchange_settings(
        &self,
        keyring: Option<Arc<Keyring>>,
    ) -> responses_core::exchange::Settings {
        self.exchange.exchange_settings(keyring)
    }

    /// The largest ext_proc message we read. Derived from the caps, so that a body within
    /// them always arrives: Envoy hands over a buffered body whole (up to its buffer limit,
    /// which the shipped config sets to the caps), and a streamed chunk may hold what piled
    /// up while it waited for us (up to that limit, plus one read). Beyond it the exchange
    /// fails with an envelope (413 / 502 / `response.failed`), never passes untranslated.
    pub fn grpc_max_message_bytes(&self) -> usize {
        self.exchange
            .max_request_bytes
            .max(self.exchange.max_body_bytes)
            .saturating_mul(2)
            .saturating_add(1 << 20)
    }

    /// The keys that seal reasoning (`encrypted_content`): from `--reasoning-keys-file`, else
    /// `RESPONSES_EXTPROC_REASONING_KEYS`, else a random key made now (the rule:
    /// [`ExchangeConfig::keyring`]).
    pub fn keyring(&self) -> Result<(Arc<Keyring>, KeySource), String> {
        self.exchange.keyring(
            |path| std::fs::read_to_string(path),
            || {
                let mut key = [0u8; 32];
                OsRng.fill_bytes(&mut key);
                key
            },
        )
    }
}

impl Default for Config {
    fn default() -> Self {
        Cli::parse_from(["responses-extproc"]).serve
    }
}

#[cfg(test)]
mod tests;
