//! The Envoy ext_proc adapter: a gRPC `ExternalProcessor` that drives one [`Session`] per
//! HTTP exchange. All protocol decisions live in `session`; this file only moves messages.

pub mod messages;
pub mod session;

use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use envoy_types::pb::envoy::service::ext_proc::v3::{
    external_processor_server::ExternalProcessor, ProcessingRequest, ProcessingResponse,
};
use tokio::sync::mpsc;
use tokio_stream::{wrappers::ReceiverStream, Stream};
use tonic::{Request, Response, Status, Streaming};

use crate::config::{Config, StreamBodyMode};
use crate::exchange;
use crate::translate::seal::Keyring;
pub use session::{Environment, Session, System};

/// What the adapter needs from the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The exchange rules' settings, shared with every other adapter.
    pub exchange: Arc<exchange::Settings>,
    /// Log bodies (prompts, completions) at debug level: a debugging aid, off by default.
    pub log_content: bool,
    /// How Envoy hands us SSE answers: STREAMED or FULL_DUPLEX_STREAMED.
    pub stream_body_mode: StreamBodyMode,
}

impl Settings {
    /// `keyring`: from [`Config::keyring`], `None` to turn `encrypted_content` off.
    pub fn from_config(config: &Config, keyring: Option<Arc<Keyring>>) -> Self {
        Settings {
            exchange: Arc::new(config.exchange_settings(keyring)),
            log_content: config.log_content,
            stream_body_mode: config.stream_body_mode,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings::from_config(&Config::default(), None)
    }
}

/// The gRPC service Envoy's ext_proc filter talks to.
#[derive(Debug, Clone)]
pub struct Processor {
    settings: Arc<Settings>,
}

impl Processor {
    pub fn new(settings: Settings) -> Self {
        Processor {
            settings: Arc::new(settings),
        }
    }
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Processor {
    type ProcessStream = ResponseStream;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let mut inbound = request.into_inner();
        // One answer per message, in order; a small buffer is enough since Envoy waits.
        let (tx, rx) = mpsc::channel(4);
        let mut session = Session::new(self.settings.clone(), System);
        tokio::spawn(async move {
            let failure = drive(&mut session, &mut inbound, &tx).await;
            let unfinished = session.is_unfinished();
            let ended_by_envoy = match &failure {
                None => true,
                Some(f) => f.kind == FailureKind::Reset,
            };
            if let Some(Failure { kind, status }) = failure {
                // Never a clean end after a failure: it would let Envoy carry on without us
                // and pass untranslated bytes. First the exchange's OpenResponses ending,
                // while Envoy still waits for an answer, then an error status, on which Envoy
                // fails the request (failure_mode_allow: false). After a reset by Envoy
                // nothing arrives, harmlessly.
                let unreadable = kind == FailureKind::Unreadable;
                let last =
                    std::panic::catch_unwind(AssertUnwindSafe(|| session.on_failure(unreadable)))
                        .unwrap_or_default();
                send_all(&tx, last).await;
                let _ = tx.send(Err(status)).await;
            }
            if unfinished && ended_by_envoy {
                // The client got a cut answer (or none).
                tracing::info!(
                    request_id = %session.request_id(),
                    "exchange ended by Envoy before its answer was complete \
                     (client disconnected, upstream reset or timeout)"
                );
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// Sends answers in order; false once Envoy is gone.
async fn send_all(
    tx: &mpsc::Sender<Result<ProcessingResponse, Status>>,
    answers: Vec<ProcessingResponse>,
) -> bool {
    for answer in answers {
        if tx.send(Ok(answer)).await.is_err() {
            return false;
        }
    }
    true
}

/// Why an exchange's gRPC stream must end with an error status.
struct Failure {
    kind: FailureKind,
    status: Status,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailureKind {
    /// Envoy sent a message over the gRPC message limit.
    Unreadable,
    /// Handling a message panicked.
    Panic,
    /// Envoy reset the stream (client gone, upstream reset, a timeout).
    Reset,
}

/// Answers Envoy's messages until the stream ends: `None` when Envoy closed it.
async fn drive(
    session: &mut Session,
    inbound: &mut Streaming<ProcessingRequest>,
    tx: &mpsc::Sender<Result<ProcessingResponse, Status>>,
) -> Option<Failure> {
    loop {
        let req = match inbound.message().await {
            Ok(Some(req)) => req,
            Ok(None) => return None,
            Err(status) if status.code() == tonic::Code::OutOfRange => {
                tracing::warn!(
                    request_id = %session.request_id(),
                    error = %status.message(),
                    "Envoy sent a message over the gRPC message limit; failing the exchange"
                );
                return Some(Failure {
                    kind: FailureKind::Unreadable,
                    status,
                });
            }
            Err(status) => {
                tracing::debug!(code = ?status.code(), "ext_proc stream ended by Envoy");
                return Some(Failure {
                    kind: FailureKind::Reset,
                    status,
                });
            }
        };
        // A bug in one exchange must not take the process down: fail only it.
        let Ok(answers) = std::panic::catch_unwind(AssertUnwindSafe(|| session.on_message(req)))
        else {
            tracing::error!(
                request_id = %session.request_id(),
                "panic while processing an exchange; failing it"
            );
            return Some(Failure {
                kind: FailureKind::Panic,
                status: Status::internal("responses-extproc internal error"),
            });
        };
        if !send_all(tx, answers).await {
            return None;
        }
    }
}
