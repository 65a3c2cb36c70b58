//! `demo-upstream`: the deterministic Chat Completions server of the demo and the tests. A
//! binary of its own, so that the production processor links none of it.

#![forbid(unsafe_code)]

mod demo;
mod replay;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

/// A deterministic Chat Completions server for trying the chain without a model.
#[derive(Debug, Parser)]
#[command(name = "demo-upstream", version)]
struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:18080", env = "DEMO_UPSTREAM_LISTEN")]
    listen: SocketAddr,
    /// Answer every POST with this recorded SSE body instead, one frame per write (benchmarks).
    #[arg(long)]
    replay: Option<PathBuf>,
    /// The pause between two frames of `--replay`, in milliseconds.
    #[arg(long, default_value_t = 20, requires = "replay")]
    replay_delay_ms: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let result: std::io::Result<()> = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(cli.listen).await?;
        tracing::info!(addr = %listener.local_addr()?, "demo upstream listening");
        match &cli.replay {
            Some(path) => {
                let delay = Duration::from_millis(cli.replay_delay_ms);
                let app = replay::Replay::load(path, delay)?.router();
                axum::serve(listener, app).await
            }
            None => demo::serve(listener).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "exiting");
            ExitCode::FAILURE
        }
    }
}
