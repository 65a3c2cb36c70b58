//! Every knob of the processor, with its default and its environment variable.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::translate::{Options, ReasoningEvents};

#[derive(Debug, Parser)]
#[command(
    name = "responses-extproc",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("RESPONSES_EXTPROC_GIT"), ")"),
    about = "Envoy ext_proc service that serves the OpenResponses API (POST /v1/responses) \
             from any Chat Completions upstream",
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: Config,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the built-in deterministic Chat Completions server used by the demo and tests.
    DemoUpstream {
        #[arg(long, default_value = "127.0.0.1:18080", env = "DEMO_UPSTREAM_LISTEN")]
        listen: SocketAddr,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReasoningEventNames {
    /// `response.reasoning.delta` / `.done` (OpenResponses).
    Spec,
    /// `response.reasoning_text.delta` / `.done` (OpenAI).
    Openai,
}

/// Options of the ext_proc server.
#[derive(Debug, Clone, Args)]
pub struct Config {
    /// Address of the gRPC listener (ext_proc + grpc.health.v1).
    #[arg(
        long,
        default_value = "127.0.0.1:50051",
        env = "RESPONSES_EXTPROC_LISTEN"
    )]
    pub listen: SocketAddr,

    /// Request path that is translated; everything else passes through untouched.
    #[arg(
        long,
        default_value = "/v1/responses",
        env = "RESPONSES_EXTPROC_RESPONSES_PATH"
    )]
    pub responses_path: String,

    /// Upstream path a translated request is sent to.
    #[arg(
        long,
        default_value = "/v1/chat/completions",
        env = "RESPONSES_EXTPROC_CHAT_PATH"
    )]
    pub chat_path: String,

    /// Request header set to the model name, so Envoy routes can match on it.
    #[arg(
        long,
        default_value = "x-responses-model",
        env = "RESPONSES_EXTPROC_MODEL_HEADER"
    )]
    pub model_header: String,

    /// Strict mode: reject `store: true` and unknown top-level fields with 400 instead of
    /// serving them statelessly and forwarding them to the upstream.
    #[arg(long, env = "RESPONSES_EXTPROC_STRICT")]
    pub strict: bool,

    /// Event names used for streamed reasoning text.
    #[arg(
        long,
        value_enum,
        default_value = "spec",
        env = "RESPONSES_EXTPROC_REASONING_EVENTS"
    )]
    pub reasoning_events: ReasoningEventNames,

    /// Largest single upstream SSE event held while waiting for its end (bytes).
    #[arg(long, default_value_t = 1 << 20, env = "RESPONSES_EXTPROC_MAX_SSE_FRAME_BYTES")]
    pub max_sse_frame_bytes: usize,

    /// Largest text + arguments accumulated for one response (bytes); beyond it the
    /// response fails cleanly.
    #[arg(long, default_value_t = 16 << 20, env = "RESPONSES_EXTPROC_MAX_OUTPUT_BYTES")]
    pub max_output_bytes: usize,

    /// Largest upstream JSON body buffered for translation (bytes).
    #[arg(long, default_value_t = 16 << 20, env = "RESPONSES_EXTPROC_MAX_BODY_BYTES")]
    pub max_body_bytes: usize,

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

fn parse_secs(s: &str) -> Result<Duration, String> {
    s.parse::<u64>()
        .map(Duration::from_secs)
        .map_err(|e| format!("expected whole seconds: {e}"))
}

impl Config {
    /// The translation core's view of the configuration.
    pub fn translate_options(&self) -> Options {
        Options {
            strict: self.strict,
            reasoning_events: match self.reasoning_events {
                ReasoningEventNames::Spec => ReasoningEvents::Spec,
                ReasoningEventNames::Openai => ReasoningEvents::OpenAi,
            },
            max_sse_frame_bytes: self.max_sse_frame_bytes,
            max_output_bytes: self.max_output_bytes,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Cli::parse_from(["responses-extproc"]).serve
    }
}
