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
use std::collections::VecDeque;

use tokio_stream::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::config::{Config, StreamBodyMode};
use crate::metrics::Metrics;
use crate::traces::Traces;
use crate::upstream::{self, Upstream, UpstreamEvent};
use responses_core::call::{CallFailure, CallId};
use responses_core::exchange;
use responses_core::log::Logged;
use responses_core::metadata::record::Ledger;
use responses_core::translate::seal::Keyring;
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
    /// Where finished exchanges are recorded (`--metrics-listen`); none: not recorded.
    pub metrics: Option<Arc<Metrics>>,
    /// The tracer (`--otlp-endpoint`); none: no spans.
    pub traces: Option<Arc<Traces>>,
    /// The HTTP client of the processor's own calls (an automatic compaction's summarising
    /// request) back through Envoy (`--ws-upstream`); none: such a call fails (503).
    pub upstream: Option<Arc<Upstream>>,
    /// The WebSocket turns' records the sockets filed, which their requests' exchanges take
    /// (shared with the WebSocket listener).
    pub records: Arc<Ledger>,
}

impl Settings {
    /// `keyring`: from [`Config::keyring`], `None` to turn `encrypted_content` off.
    pub fn from_config(config: &Config, keyring: Option<Arc<Keyring>>) -> Self {
        Settings {
            exchange: Arc::new(config.exchange_settings(keyring)),
            log_content: config.log_content,
            stream_body_mode: config.stream_body_mode,
            metrics: None,
            traces: None,
            upstream: None,
            records: Arc::default(),
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
        let mut session = Session::new(self.settings.clone(), System);
        // With tracing on Envoy opens this stream with its span's context in the gRPC
        // metadata (`traceparent`, `tracestate`): the exchange's span continues that trace.
        if let Some(traces) = &self.settings.traces {
            let metadata = request.metadata();
            session.set_trace_parent(
                traces.parent(|name| metadata.get(name).and_then(|v| v.to_str().ok())),
            );
        }
        let relay = Relay {
            inbound: request.into_inner(),
            session,
            settings: self.settings.clone(),
            pending: VecDeque::new(),
            ended: false,
            calling: None,
        };
        // The answers are produced as tonic asks for them: no task and no channel per
        // exchange (measured: the spawn + channel hop cost ~15% of the processor's CPU per
        // JSON exchange). Envoy waits for each answer, so reading on demand loses nothing.
        let answers = futures_util::stream::unfold(relay, |mut d| async move {
            loop {
                if let Some(answer) = d.pending.pop_front() {
                    return Some((answer, d));
                }
                if d.ended {
                    return None;
                }
                d.step().await;
            }
        });
        Ok(Response::new(Box::pin(answers)))
    }
}

/// One exchange's gRPC stream: Envoy's messages in, the session's answers out, and the
/// exchange's own call carried.
struct Relay {
    inbound: Streaming<ProcessingRequest>,
    session: Session,
    settings: Arc<Settings>,
    /// Answers not yet handed to tonic.
    pending: VecDeque<Result<ProcessingResponse, Status>>,
    /// No more messages will be read.
    ended: bool,
    /// The exchange's own call in flight: the request body's answer waits for it.
    calling: Option<Calling>,
}

/// A call of the exchange's own (an automatic compaction's summarising request).
struct Calling {
    id: CallId,
    call: upstream::Call,
}

impl Relay {
    /// Reads one message and queues its answers, or ends the stream; while the exchange's own
    /// call is in flight, whichever comes first: its next event, the timer the exchange asks
    /// for (its deadline), or Envoy's message (or end).
    async fn step(&mut self) {
        let message = match self.calling.as_mut() {
            None => self.inbound.message().await,
            Some(c) => {
                let wake = self.session.poll_timeout();
                tokio::select! {
                    message = self.inbound.message() => message,
                    event = c.call.next() => return self.call_event(event),
                    () = sleep_until(wake), if wake.is_some() => {
                        return self.call_step(|s, _| s.handle_timeout());
                    }
                }
            }
        };
        let req = match message {
            Ok(Some(req)) => req,
            Ok(None) => return self.end_by_envoy(),
            // A message over the gRPC message limit: Envoy still waits for an answer.
            Err(status) if status.code() == tonic::Code::OutOfRange => {
                tracing::warn!(
                    request_id = %self.session.request_id(),
                    error = %status.message(),
                    "Envoy sent a message over the gRPC message limit; failing the exchange"
                );
                return self.fail(true, status);
            }
            // Envoy reset the stream (client gone, upstream reset, a timeout): what we send
            // now is dropped, harmlessly; the error status keeps the end unclean.
            Err(status) => {
                tracing::debug!(code = ?status.code(), "ext_proc stream ended by Envoy");
                self.end_by_envoy();
                self.pending.push_back(Err(status));
                return;
            }
        };
        // A bug in one exchange must not take the process down: fail only it.
        let answered = if self.costly(&req) {
            // Off the runtime's thread, so that the other exchanges it serves go on meanwhile.
            let placeholder = Session::new(self.settings.clone(), System);
            let mut session = std::mem::replace(&mut self.session, placeholder);
            let work = tokio::task::spawn_blocking(move || {
                let answered =
                    std::panic::catch_unwind(AssertUnwindSafe(|| session.on_message(req)));
                (session, answered)
            });
            match work.await {
                Ok((session, answered)) => {
                    self.session = session;
                    answered
                }
                // The blocking pool refused the task (shutting down): the exchange is lost.
                Err(_) => Err(Box::new("the blocking task did not run") as Box<_>),
            }
        } else {
            let session = &mut self.session;
            std::panic::catch_unwind(AssertUnwindSafe(|| session.on_message(req)))
        };
        self.answered(answered);
    }

    /// Queues a step's answers (and starts the call it asked for), or fails the exchange on
    /// a panic.
    fn answered(&mut self, answered: std::thread::Result<Vec<ProcessingResponse>>) {
        match answered {
            Ok(answers) => {
                self.pending.extend(answers.into_iter().map(Ok));
                self.start_call();
            }
            Err(_) => {
                tracing::error!(
                    request_id = %self.session.request_id(),
                    "panic while processing an exchange; failing it"
                );
                self.calling = None;
                self.fail(false, Status::internal("responses-extproc internal error"));
            }
        }
    }

    /// The call the session asked for, if any: Envoy is told to wait for it (its
    /// `message_timeout` would end the exchange first), then it is sent.
    fn start_call(&mut self) {
        let Some((call, wait)) = self.session.take_call() else {
            return;
        };
        let id = call.id;
        self.pending.push_back(Ok(ProcessingResponse {
            override_message_timeout: Some(envoy_types::pb::google::protobuf::Duration {
                seconds: i64::try_from(wait.as_secs()).unwrap_or(i64::MAX),
                nanos: i32::try_from(wait.subsec_nanos()).unwrap_or(0),
            }),
            ..ProcessingResponse::default()
        }));
        let Some(client) = self.settings.upstream.clone() else {
            let failed = CallFailure::Failed("this processor has no upstream for its own calls.");
            return self.call_step(|s, id| s.call_failed(id, failed));
        };
        tracing::debug!(
            request_id = &*Logged(self.session.request_id()).cut(),
            model = &*Logged(&call.model).cut(),
            "compaction call"
        );
        self.calling = Some(Calling {
            id,
            call: client.call(call, &self.session.trace_headers()),
        });
    }

    /// The next event of the call in flight, to the session.
    fn call_event(&mut self, event: UpstreamEvent) {
        match event {
            UpstreamEvent::Head {
                status,
                headers,
                body,
            } => {
                if let Some(c) = &mut self.calling {
                    c.call = upstream::Call::Body(body);
                }
                upstream::report_head(status, &headers, |head| {
                    self.call_step(|s, id| s.call_head(id, head))
                });
            }
            UpstreamEvent::Chunk(bytes) => self.call_step(|s, id| s.call_data(id, &bytes)),
            UpstreamEvent::End => self.call_step(|s, id| s.call_end(id)),
            UpstreamEvent::Failed(message) => {
                self.call_step(|s, id| s.call_failed(id, CallFailure::Failed(&message)))
            }
        }
    }

    /// One step of the call in flight through the session; the call is dropped once the
    /// exchange no longer waits for it.
    fn call_step(&mut self, step: impl FnOnce(&mut Session, CallId) -> Vec<ProcessingResponse>) {
        let Some(id) = self
            .calling
            .as_ref()
            .map(|c| c.id)
            .or(self.session.call_in_flight())
        else {
            return;
        };
        let session = &mut self.session;
        let answered = std::panic::catch_unwind(AssertUnwindSafe(|| step(session, id)));
        if self.session.call_in_flight() != Some(id) {
            self.calling = None;
        }
        self.answered(answered);
    }

    /// A request body whose translation may hold a thread for long (the core's rule:
    /// `Exchange::is_costly`).
    fn costly(&self, req: &ProcessingRequest) -> bool {
        use envoy_types::pb::envoy::service::ext_proc::v3::processing_request::Request;
        let Some(Request::RequestBody(body)) = &req.request else {
            return false;
        };
        self.session.is_costly(body.body.len())
    }

    /// Never a clean end after a failure: it would let Envoy carry on without us and pass
    /// untranslated bytes. First the exchange's OpenResponses ending, while Envoy still waits
    /// for an answer, then an error status, on which Envoy fails the request
    /// (failure_mode_allow: false).
    fn fail(&mut self, unreadable: bool, status: Status) {
        self.ended = true;
        let session = &mut self.session;
        let last = std::panic::catch_unwind(AssertUnwindSafe(|| session.on_failure(unreadable)))
            .unwrap_or_default();
        self.pending.extend(last.into_iter().map(Ok));
        self.pending.push_back(Err(status));
    }

    fn end_by_envoy(&mut self) {
        self.ended = true;
        self.session.closed();
    }
}

impl Drop for Relay {
    /// tonic drops the stream without polling it again when Envoy resets it.
    fn drop(&mut self) {
        self.session.closed();
    }
}

/// Sleeps until `at` (never, for `None`: the branch is disabled then).
async fn sleep_until(at: Option<std::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
