//! The ext_proc side: the real `responses-extproc` binary, or an in-process passthrough.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request, processing_response, BodyResponse, CommonResponse, HeaderMutation,
    HeadersResponse, ProcessingRequest, ProcessingResponse, TrailersResponse,
};
use futures_util::Stream;

use super::{free_port, log_tail, port_accepts, wait_until, ServerThread, TempDir};

const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// Where a spawned binary listens.
pub enum Listen {
    /// 127.0.0.1, a free port.
    Tcp,
    Unix(PathBuf),
}

/// How to run one of the package's binaries: `<program> --listen <addr> <args>` with `env`
/// (and, if `clean_rust_log`, without an inherited `RUST_LOG`).
pub struct Spawn<'a> {
    /// Names the process in failures.
    pub what: &'a str,
    /// The binary: `responses-extproc` (the default) or `demo-upstream`.
    pub program: &'a str,
    pub listen: Listen,
    pub args: &'a [&'a str],
    pub env: &'a [(&'a str, &'a str)],
    pub clean_rust_log: bool,
}

impl Default for Spawn<'_> {
    fn default() -> Self {
        Spawn {
            what: "responses-extproc",
            program: env!("CARGO_BIN_EXE_responses-extproc"),
            listen: Listen::Tcp,
            args: &[],
            env: &[],
            clean_rust_log: false,
        }
    }
}

/// A `responses-extproc` process (the ext_proc server or the demo upstream), its stdout and
/// stderr in a log file; killed on Drop.
pub struct Processor {
    child: Child,
    port: Option<u16>,
    log: PathBuf,
    _dir: TempDir,
}

impl Processor {
    /// Runs `responses-extproc --listen 127.0.0.1:<free port> <extra_args>` and waits until
    /// the port accepts TCP.
    pub fn start(extra_args: &[&str]) -> Processor {
        Processor::start_with_env(extra_args, &[])
    }

    /// Like [`Processor::start`], with extra environment variables (e.g. `RUST_LOG`).
    pub fn start_with_env(extra_args: &[&str], env: &[(&str, &str)]) -> Processor {
        Processor::spawn(Spawn {
            args: extra_args,
            env,
            ..Spawn::default()
        })
    }

    /// Runs the binary as `spec` says and waits until it accepts connections (TCP: the port;
    /// Unix: the socket).
    pub fn spawn(spec: Spawn<'_>) -> Processor {
        let what = spec.what;
        let dir = TempDir::new("processor");
        let log = dir.path().join("processor.log");
        // A free port is picked before the child binds it: if another process takes it in
        // between, the child exits and we try again with another port.
        for _attempt in 0..3 {
            let (listen_arg, port) = match &spec.listen {
                Listen::Tcp => {
                    let port = free_port();
                    (format!("127.0.0.1:{port}"), Some(port))
                }
                Listen::Unix(path) => (format!("unix:{}", path.display()), None),
            };
            let log_file = std::fs::File::create(&log).expect("create processor log");
            let mut command = Command::new(spec.program);
            command.arg("--listen").arg(&listen_arg).args(spec.args);
            if spec.clean_rust_log {
                command.env_remove("RUST_LOG");
            }
            let mut child = command
                .envs(spec.env.iter().copied())
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().expect("clone log handle"))
                .stderr(log_file)
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {what}: {e}"));
            let ready = wait_until(what, STARTUP_TIMEOUT, || {
                if let Ok(Some(status)) = child.try_wait() {
                    return Some(Err(status));
                }
                let up = match (&spec.listen, port) {
                    (_, Some(port)) => port_accepts(port),
                    (Listen::Unix(path), None) => std::os::unix::net::UnixStream::connect(path)
                        .map(drop)
                        .is_ok(),
                    (Listen::Tcp, None) => false,
                };
                up.then_some(Ok(()))
            });
            match ready {
                // Still alive after accepting: the address is ours.
                Ok(()) if matches!(child.try_wait(), Ok(None)) => {
                    return Processor {
                        child,
                        port,
                        log,
                        _dir: dir,
                    };
                }
                _ if port.is_some() && log_tail(&log, 4000).contains("in use") => {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                _ => {
                    let _ = child.kill();
                    let status = child.wait();
                    panic!(
                        "{what} {listen_arg} {:?} exited during startup ({status:?}):\n{}",
                        spec.args,
                        log_tail(&log, 4000)
                    );
                }
            }
        }
        panic!("{what} could not bind a free port in 3 attempts");
    }

    /// The TCP port (panics for a Unix socket listener).
    pub fn port(&self) -> u16 {
        self.port.expect("a TCP listener")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The processor's log so far (stdout and stderr).
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Processor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An in-process ext_proc server that lets everything through unchanged (it answers every
/// message with an empty CONTINUE response), optionally setting request headers. It records
/// the kind of every message Envoy sends. Stopped on Drop.
pub struct PassthroughProcessor {
    port: u16,
    seen: Arc<Mutex<Vec<&'static str>>>,
    _server: ServerThread,
}

#[derive(Clone)]
struct Passthrough {
    seen: Arc<Mutex<Vec<&'static str>>>,
    set_request_headers: Arc<Vec<(String, String)>>,
}

type ResponseStream =
    Pin<Box<dyn Stream<Item = Result<ProcessingResponse, tonic::Status>> + Send + 'static>>;

#[tonic::async_trait]
impl ExternalProcessor for Passthrough {
    type ProcessStream = ResponseStream;

    async fn process(
        &self,
        request: tonic::Request<tonic::Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<ResponseStream>, tonic::Status> {
        let mut inbound = request.into_inner();
        let this = self.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                let Some(response) = this.answer(message) else {
                    break;
                };
                let response = ProcessingResponse {
                    response: Some(response),
                    ..Default::default()
                };
                if tx.send(Ok(response)).await.is_err() {
                    break;
                }
            }
        });
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

impl Passthrough {
    fn answer(&self, message: ProcessingRequest) -> Option<processing_response::Response> {
        use processing_request::Request as In;
        use processing_response::Response as Out;
        let mutation = || CommonResponse {
            header_mutation: Some(HeaderMutation {
                set_headers: self
                    .set_request_headers
                    .iter()
                    .map(|(k, v)| HeaderValueOption {
                        header: Some(HeaderValue {
                            key: k.clone(),
                            raw_value: v.clone().into_bytes(),
                            ..Default::default()
                        }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let (kind, out) = match message.request? {
            // Set the headers with the last request message Envoy waits for: the body when
            // there is one (like the real processor, which sets them after reading the body).
            In::RequestHeaders(h) => (
                "request_headers",
                Out::RequestHeaders(HeadersResponse {
                    response: h.end_of_stream.then(mutation),
                }),
            ),
            In::RequestBody(_) => (
                "request_body",
                Out::RequestBody(BodyResponse {
                    response: Some(mutation()),
                }),
            ),
            In::RequestTrailers(_) => (
                "request_trailers",
                Out::RequestTrailers(TrailersResponse::default()),
            ),
            In::ResponseHeaders(_) => (
                "response_headers",
                Out::ResponseHeaders(HeadersResponse::default()),
            ),
            In::ResponseBody(_) => ("response_body", Out::ResponseBody(BodyResponse::default())),
            In::ResponseTrailers(_) => (
                "response_trailers",
                Out::ResponseTrailers(TrailersResponse::default()),
            ),
        };
        self.seen.lock().unwrap().push(kind);
        Some(out)
    }
}

impl PassthroughProcessor {
    pub fn start() -> PassthroughProcessor {
        PassthroughProcessor::with_request_headers(&[])
    }

    /// A passthrough that also sets these request headers (as the real processor sets
    /// `x-responses-model`), in its answer to the last request message.
    pub fn with_request_headers(headers: &[(&str, &str)]) -> PassthroughProcessor {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let service = Passthrough {
            seen: seen.clone(),
            set_request_headers: Arc::new(
                headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
        };
        let (server, port) =
            ServerThread::spawn("passthrough-extproc", move |listener| async move {
                let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                let _ = tonic::transport::Server::builder()
                    .add_service(ExternalProcessorServer::new(service))
                    .serve_with_incoming(incoming)
                    .await;
            });
        PassthroughProcessor {
            port,
            seen,
            _server: server,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The kinds of message received so far (`request_headers`, `request_body`, ...).
    pub fn seen(&self) -> Vec<&'static str> {
        self.seen.lock().unwrap().clone()
    }
}
