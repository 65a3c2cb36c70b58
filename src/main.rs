//! `responses-extproc`: CLI, logging, the gRPC server and its graceful shutdown.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::ExternalProcessorServer;
use std::future::Future;

use responses_extproc::config::{Cli, Config, KeySource, Listen, LogFormat};
use responses_extproc::extproc::{Processor, Settings};
use responses_extproc::metrics::{Metrics, Push};
use responses_extproc::traces::Traces;
use responses_extproc::upstream::Upstream;
use responses_extproc::websocket::{Server as WsServer, WsSettings};
use std::sync::Arc;
use tokio::net::{TcpListener, UnixListener};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_stream::StreamExt;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tracing_subscriber::EnvFilter;

/// The descriptor set of the services we serve (build.rs, from proto/).
const REFLECTION_DESCRIPTORS: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/reflection_descriptor.bin"));

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logs(cli.serve.log_format);
    // One worker: a current-thread runtime (no work stealing, no cross-thread wake-ups).
    let mut builder = match cli.serve.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(usize::from(n));
            b
        }
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(serve(cli.serve));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "exiting");
            ExitCode::FAILURE
        }
    }
}

fn init_logs(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.fmt_fields(responses_extproc::logs::Logfmt).init(),
    }
}

async fn serve(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    config.exchange.validate()?;
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_serving::<ExternalProcessorServer<Processor>>()
        .await;
    let (keyring, key_source) = config.keyring()?;
    match key_source {
        KeySource::Ephemeral => tracing::warn!(
            "no reasoning keys configured: encrypted_content is sealed with a random key of this \
             process only (set --reasoning-keys-file for several replicas or restarts)"
        ),
        source => tracing::info!(
            ?source,
            active_key = keyring.active_id(),
            "reasoning keys loaded"
        ),
    }
    let mut settings = Settings::from_config(&config, Some(keyring));
    // The processor's own calls (automatic compaction) go back through Envoy.
    settings.upstream = Some(Arc::new(Upstream::new(
        &config.ws_upstream,
        &settings.exchange.chat_path,
    )?));
    // Metrics: scraped (--metrics-listen), pushed over OTLP (--otlp-endpoint, or the standard
    // OTEL_EXPORTER_OTLP_* variables; the exporter runs on this runtime), or both.
    let push = Push::start(&config)?;
    if config.metrics_listen.is_some() || push.is_some() {
        settings.metrics = Some(Arc::new(Metrics::new(config.exchange.label_policy(), push)));
    }
    if let (Some(addr), Some(metrics)) = (config.metrics_listen, &settings.metrics) {
        let listener = TcpListener::bind(addr).await?;
        tracing::info!(url = %format!("http://{addr}/metrics"), "serving metrics");
        tokio::spawn(serve_metrics(listener, metrics.clone()));
    }
    // Traces (--otlp-endpoint, or the standard OTEL_EXPORTER_OTLP_* variables); the exporter
    // runs on this runtime.
    let traces = Traces::start(&config, settings.metrics.clone())?.map(Arc::new);
    settings.traces = traces.clone();
    let ws = match config.ws_listen {
        Some(addr) => {
            let listener = TcpListener::bind(addr).await?;
            let ws_settings = WsSettings {
                exchange: settings.exchange.clone(),
                limits: config.exchange.socket_limits(),
                upstream: config.ws_upstream.clone(),
                admission: config.exchange.admission_rules(),
                drain: config.drain_seconds,
                metrics: settings.metrics.clone(),
                traces: settings.traces.clone(),
                log_content: config.log_content,
                records: settings.records.clone(),
            };
            tracing::info!(
                listen = %addr,
                upstream = %config.ws_upstream,
                max_connections = config.exchange.ws_max_connections,
                "serving the WebSocket transport"
            );
            Some(WsServer::start(listener, ws_settings)?)
        }
        None => None,
    };
    let settings_metrics = settings.metrics.clone();
    let processor = Processor::new(settings);

    let mut builder = tonic::transport::Server::builder();
    if let (Some(cert), Some(key)) = (&config.tls_cert, &config.tls_key) {
        let mut tls = ServerTlsConfig::new().identity(Identity::from_pem(
            std::fs::read(cert).map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?,
            std::fs::read(key).map_err(|e| format!("--tls-key {}: {e}", key.display()))?,
        ));
        if let Some(ca) = &config.tls_client_ca {
            // mTLS: only clients (Envoy) presenting a certificate signed by this CA get in.
            tls = tls.client_ca_root(Certificate::from_pem(
                std::fs::read(ca).map_err(|e| format!("--tls-client-ca {}: {e}", ca.display()))?,
            ));
        }
        builder = builder.tls_config(tls)?;
    }
    // gRPC server reflection (`grpcurl list`, `describe`): the descriptors build.rs made
    // from proto/, and tonic-health's.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(REFLECTION_DESCRIPTORS)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let router = builder
        .add_service(health)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .add_service(
            ExternalProcessorServer::new(processor)
                .max_decoding_message_size(config.grpc_max_message_bytes()),
        );

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async {
        let _ = stop_rx.await;
    };
    let server: std::pin::Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>>>> =
        match &config.listen {
            Listen::Tcp(addr) => {
                let listener = TcpListener::bind(addr).await?;
                // Every ext_proc answer is a small write Envoy waits for: without TCP_NODELAY,
                // Nagle's algorithm meets Envoy's delayed ACKs and adds ~40 ms per exchange.
                let incoming = TcpListenerStream::new(listener).map(|conn| {
                    conn.inspect(|stream| {
                        if let Err(e) = stream.set_nodelay(true) {
                            tracing::warn!(error = %e, "cannot set TCP_NODELAY");
                        }
                    })
                });
                Box::pin(router.serve_with_incoming_shutdown(incoming, stop))
            }
            Listen::Unix(path) => {
                // A socket file left by a previous run would make bind fail.
                if path.exists() {
                    std::fs::remove_file(path)?;
                }
                let listener = UnixListener::bind(path)?;
                Box::pin(
                    router.serve_with_incoming_shutdown(UnixListenerStream::new(listener), stop),
                )
            }
        };
    tracing::info!(
        listen = %config.listen,
        tls = config.tls_cert.is_some(),
        mtls = config.tls_client_ca.is_some(),
        version = env!("CARGO_PKG_VERSION"),
        git = env!("RESPONSES_EXTPROC_GIT"),
        responses_path = %config.exchange.responses_path,
        chat_path = %config.exchange.chat_path,
        strict = config.exchange.strict,
        "responses-extproc listening"
    );
    if config.log_content {
        tracing::warn!("--log-content is on: prompts and completions are logged at debug level");
    }
    let mut server = server;

    tokio::select! {
        result = &mut server => return result.map_err(Into::into),
        () = shutdown_signal() => {}
    }
    // Drain: report NOT_SERVING so health-checking Envoys move away, stop accepting, and
    // let in-flight exchanges finish within the drain period. The overall status ("") too:
    // it is what a probe naming no service asks (the shipped manifests' grpc probes).
    tracing::info!(
        drain_seconds = config.drain_seconds.as_secs(),
        "shutting down: draining"
    );
    reporter
        .set_not_serving::<ExternalProcessorServer<Processor>>()
        .await;
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    let _ = stop_tx.send(());
    // WebSocket connections finish their response in flight (up to the drain period), then
    // close (1001): their close frames get a moment more.
    let ws_drained = async {
        if let Some(ws) = &ws {
            let grace = config.drain_seconds + responses_core::connection::DRAIN_CLOSE_MARGIN;
            if tokio::time::timeout(grace, ws.drain()).await.is_err() {
                tracing::warn!("drain period over; exiting with WebSocket connections still open");
            }
        }
    };
    let server_drained = tokio::time::timeout(config.drain_seconds, server);
    match tokio::join!(server_drained, ws_drained).0 {
        Ok(result) => result?,
        Err(_) => tracing::warn!("drain period over; exiting with exchanges still open"),
    }
    if let Listen::Unix(path) = &config.listen {
        let _ = std::fs::remove_file(path);
    }
    // The spans and metrics of the last exchanges, if the collector takes them quickly.
    if let Some(traces) = &traces {
        traces.shutdown(std::time::Duration::from_secs(5)).await;
    }
    if let Some(metrics) = &settings_metrics {
        metrics.shutdown(std::time::Duration::from_secs(5)).await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// The admin listener: GET /metrics (Prometheus text format).
async fn serve_metrics(listener: TcpListener, metrics: Arc<Metrics>) {
    use axum::{http::header, routing::get, Router};
    let app = Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move {
                (
                    [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
                    metrics.render(),
                )
            }
        }),
    );
    if let Err(e) = axum::serve(listener, app).await {
        tracing::error!(error = %e, "metrics listener failed");
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}
