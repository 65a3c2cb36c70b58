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
use crate::translate::{seal::Keyring, Options};
pub use session::{Environment, Session, System};

/// What the adapter needs from the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub responses_path: String,
    pub chat_path: String,
    pub model_header: String,
    pub max_body_bytes: usize,
    /// Log bodies (prompts, completions) at debug level: a debugging aid, off by default.
    pub log_content: bool,
    /// How Envoy hands us SSE answers: STREAMED or FULL_DUPLEX_STREAMED.
    pub stream_body_mode: StreamBodyMode,
    pub options: Options,
}

impl Settings {
    /// `keyring`: from [`Config::keyring`], `None` to turn `encrypted_content` off.
    pub fn from_config(config: &Config, keyring: Option<Arc<Keyring>>) -> Self {
        Settings {
            responses_path: config.responses_path.clone(),
            chat_path: config.chat_path.clone(),
            model_header: config.model_header.to_ascii_lowercase(),
            max_body_bytes: config.max_body_bytes,
            log_content: config.log_content,
            stream_body_mode: config.stream_body_mode,
            options: config.translate_options(keyring),
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
            loop {
                let req = match inbound.message().await {
                    Ok(Some(req)) => req,
                    // Envoy closes or resets the stream when the exchange is over: normal.
                    Ok(None) => break,
                    Err(status) => {
                        tracing::debug!(code = ?status.code(), "ext_proc stream ended by Envoy");
                        break;
                    }
                };
                // A bug in one exchange must not take the process down: end only its stream.
                let answers =
                    std::panic::catch_unwind(AssertUnwindSafe(|| session.on_message(req)));
                let answers = match answers {
                    Ok(answers) => answers,
                    Err(_) => {
                        tracing::error!("panic while processing an exchange; ending its stream");
                        let _ = tx
                            .send(Err(Status::internal("responses-extproc internal error")))
                            .await;
                        break;
                    }
                };
                let mut sent = true;
                for answer in answers {
                    sent = tx.send(Ok(answer)).await.is_ok();
                    if !sent {
                        break;
                    }
                }
                if !sent {
                    break;
                }
            }
            // Envoy ends the stream mid-exchange when the client disconnects, the upstream
            // resets or a timeout fires; the client then got a cut answer (no terminal event).
            // Logged at info, with the request id: at debug (above) operators could not tell
            // these from normal ends.
            if session.is_unfinished() {
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
