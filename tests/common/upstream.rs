//! Stand-ins for the Chat Completions upstream.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use serde_json::Value;

use super::ServerThread;

/// The demo upstream's server, compiled into the tests from its binary's source, to run it
/// in-process.
#[path = "../../src/bin/demo-upstream/demo.rs"]
pub mod demo;

/// One request the upstream received.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    /// Path and query, e.g. `/v1/chat/completions`.
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// When its head arrived (the upstream's log of when it was asked).
    pub received: std::time::Instant,
}

impl RecordedRequest {
    /// The body as JSON (panics if it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "upstream request body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// A pause point in a streamed reply: the upstream stops after chunk k until the test calls
/// [`Gate::release`]. [`Gate::wait_reached`] tells when the upstream got there.
#[derive(Clone)]
pub struct Gate {
    reached: Arc<AtomicBool>,
    reached_notify: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Semaphore>,
}

impl Default for Gate {
    fn default() -> Gate {
        Gate::new()
    }
}

impl Gate {
    pub fn new() -> Gate {
        Gate {
            reached: Arc::default(),
            reached_notify: Arc::default(),
            release: Arc::new(tokio::sync::Semaphore::new(0)),
        }
    }

    /// Lets the paused reply go on.
    pub fn release(&self) {
        self.release.add_permits(1);
    }

    /// Whether the reply has reached the pause point (it may have been released since).
    pub fn is_reached(&self) -> bool {
        self.reached.load(Ordering::SeqCst)
    }

    /// Waits until the reply reaches the pause point; panics after `timeout`.
    pub async fn wait_reached(&self, timeout: Duration) {
        let wait = async {
            loop {
                let notified = self.reached_notify.notified();
                if self.is_reached() {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .expect("the upstream never reached the gate");
    }

    async fn pass(&self) {
        self.reached.store(true, Ordering::SeqCst);
        self.reached_notify.notify_waiters();
        if let Ok(permit) = self.release.acquire().await {
            permit.forget();
        }
    }
}

enum ReplyBody {
    Full(Bytes),
    Chunks {
        chunks: Vec<Bytes>,
        delay: Duration,
        /// Pause after this many chunks have been written.
        gate: Option<(usize, Gate)>,
        /// Close the connection (without finishing the body) after the last chunk.
        abort: bool,
    },
}

/// A scripted answer.
pub struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: ReplyBody,
}

impl Reply {
    /// `status` with a JSON body.
    pub fn json(status: u16, body: &Value) -> Reply {
        Reply::raw(status, "application/json", body.to_string())
    }

    /// `status` with any body and content type (e.g. a 200 `text/plain` where SSE was asked).
    pub fn raw(status: u16, content_type: &str, body: impl Into<Bytes>) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), content_type.into())],
            body: ReplyBody::Full(body.into()),
        }
    }

    /// A 200 `text/event-stream` reply written one chunk at a time, 5 ms apart.
    pub fn sse<C: Into<Bytes>>(chunks: impl IntoIterator<Item = C>) -> Reply {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: ReplyBody::Chunks {
                chunks: chunks.into_iter().map(Into::into).collect(),
                delay: Duration::from_millis(5),
                gate: None,
                abort: false,
            },
        }
    }

    /// [`Reply::sse`] of a whole SSE body, one chunk per event (split after each blank line),
    /// e.g. a captured upstream stream.
    pub fn sse_text(text: &str) -> Reply {
        Reply::sse(split_sse_events(text))
    }

    /// Writes `head` (status and headers first), then closes the connection mid-body.
    pub fn close_mid_body(status: u16, content_type: &str, head: impl Into<Bytes>) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), content_type.into())],
            body: ReplyBody::Chunks {
                chunks: vec![head.into()],
                delay: Duration::ZERO,
                gate: None,
                abort: true,
            },
        }
    }

    /// Sets the pause between chunks of a chunked reply.
    pub fn with_delay(mut self, delay: Duration) -> Reply {
        if let ReplyBody::Chunks { delay: d, .. } = &mut self.body {
            *d = delay;
        }
        self
    }

    /// Pauses a chunked reply after its first `k` chunks until `gate` is released.
    pub fn pause_after(mut self, k: usize, gate: &Gate) -> Reply {
        if let ReplyBody::Chunks { gate: g, .. } = &mut self.body {
            *g = Some((k, gate.clone()));
        }
        self
    }

    /// Closes the connection after the last chunk instead of ending the body cleanly.
    pub fn then_close(mut self) -> Reply {
        if let ReplyBody::Chunks { abort, .. } = &mut self.body {
            *abort = true;
        }
        self
    }

    /// Adds (or replaces) a response header.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.into(), value.into()));
        self
    }

    pub fn status(mut self, status: u16) -> Reply {
        self.status = status;
        self
    }

    fn into_response(self) -> Response {
        let body = match self.body {
            ReplyBody::Full(bytes) => Body::from(bytes),
            ReplyBody::Chunks {
                chunks,
                delay,
                gate,
                abort,
            } => {
                let state = ChunkState {
                    chunks: chunks.into(),
                    written: 0,
                    delay,
                    gate,
                    abort,
                };
                Body::from_stream(futures_util::stream::unfold(state, ChunkState::next))
            }
        };
        let mut response = Response::new(body);
        *response.status_mut() =
            StatusCode::from_u16(self.status).expect("valid scripted status code");
        for (name, value) in self.headers {
            response.headers_mut().insert(
                HeaderName::try_from(name).expect("valid header name"),
                HeaderValue::try_from(value).expect("valid header value"),
            );
        }
        response
    }
}

struct ChunkState {
    chunks: VecDeque<Bytes>,
    written: usize,
    delay: Duration,
    gate: Option<(usize, Gate)>,
    abort: bool,
}

impl ChunkState {
    async fn next(mut self) -> Option<(std::io::Result<Bytes>, ChunkState)> {
        if let Some((k, gate)) = &self.gate {
            if self.written == *k {
                gate.pass().await;
                self.gate = None;
            }
        }
        let Some(chunk) = self.chunks.pop_front() else {
            if self.abort {
                // Give hyper time to flush what was written (it flushes when the body stream
                // is pending), then an error from the body stream makes it drop the connection.
                tokio::time::sleep(self.delay.max(Duration::from_millis(50))).await;
                self.abort = false;
                return Some((Err(std::io::Error::other("scripted mid-body close")), self));
            }
            return None;
        };
        if self.written > 0 && !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        self.written += 1;
        Some((Ok(chunk), self))
    }
}

/// Splits an SSE body into events, each with its terminating blank line.
pub fn split_sse_events(text: &str) -> Vec<Bytes> {
    let mut events = Vec::new();
    let mut rest = text;
    while let Some(end) = rest.find("\n\n") {
        events.push(Bytes::copy_from_slice(&rest.as_bytes()[..end + 2]));
        rest = &rest[end + 2..];
    }
    if !rest.is_empty() {
        events.push(Bytes::copy_from_slice(rest.as_bytes()));
    }
    events
}

type DefaultReply = Arc<dyn Fn() -> Reply + Send + Sync>;

#[derive(Default)]
struct Script {
    replies: Mutex<VecDeque<Reply>>,
    /// Gates a client releases itself, in order, with a `POST` to [`RELEASE_PATH`].
    releases: Mutex<VecDeque<Gate>>,
    default: Mutex<Option<DefaultReply>>,
    requests: Mutex<Vec<RecordedRequest>>,
    arrived: tokio::sync::Notify,
}

/// An HTTP server on 127.0.0.1 that records every request and answers with the next scripted
/// [`Reply`] (or the default one once the script is used up: a 500 JSON error unless
/// [`ScriptedUpstream::set_default`] says otherwise). Stopped on Drop.
pub struct ScriptedUpstream {
    port: u16,
    script: Arc<Script>,
    _server: ServerThread,
}

impl ScriptedUpstream {
    pub fn start() -> ScriptedUpstream {
        ScriptedUpstream::with_replies([])
    }

    pub fn with_replies(replies: impl IntoIterator<Item = Reply>) -> ScriptedUpstream {
        let script = Arc::new(Script::default());
        script.replies.lock().unwrap().extend(replies);
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(script.clone());
        let (server, port) = ServerThread::spawn("scripted-upstream", move |listener| async move {
            let _ = axum::serve(listener, app).await;
        });
        ScriptedUpstream {
            port,
            script,
            _server: server,
        }
    }

    /// Lets the client release `gate` itself (in the order given): a `POST` to
    /// [`RELEASE_PATH`] releases the next one (answered 204, not recorded). For a client
    /// script that must act while a reply is held (steer a response in flight).
    pub fn released_by_client(&self, gate: &Gate) {
        self.script.releases.lock().unwrap().push_back(gate.clone());
    }

    /// Appends a reply to the script.
    pub fn push(&self, reply: Reply) {
        self.script.replies.lock().unwrap().push_back(reply);
    }

    /// Makes the reply for every request that comes once the script is used up.
    pub fn set_default(&self, reply: impl Fn() -> Reply + Send + Sync + 'static) {
        *self.script.default.lock().unwrap() = Some(Arc::new(reply));
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port><path>`, to talk to the upstream directly.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.script.requests.lock().unwrap().clone()
    }

    /// Waits until at least `n` requests have arrived; panics after `timeout`.
    pub async fn wait_for_requests(&self, n: usize, timeout: Duration) -> Vec<RecordedRequest> {
        let wait = async {
            loop {
                let arrived = self.script.arrived.notified();
                let requests = self.requests();
                if requests.len() >= n {
                    return requests;
                }
                arrived.await;
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or_else(|_| panic!("the upstream did not receive {n} request(s)"))
    }
}

/// The path on which a client releases the next gate of
/// [`ScriptedUpstream::released_by_client`].
pub const RELEASE_PATH: &str = "/__release";

async fn handle(State(script): State<Arc<Script>>, request: Request) -> Response {
    let received = std::time::Instant::now();
    let (parts, body) = request.into_parts();
    if parts.uri.path() == RELEASE_PATH {
        let gate = script.releases.lock().unwrap().pop_front();
        let status = match gate {
            Some(gate) => {
                gate.release();
                StatusCode::NO_CONTENT
            }
            None => StatusCode::NOT_FOUND,
        };
        let mut response = Response::new(Body::empty());
        *response.status_mut() = status;
        return response;
    }
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    script.requests.lock().unwrap().push(RecordedRequest {
        received,
        method: parts.method.to_string(),
        path: parts
            .uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        headers: parts.headers,
        body,
    });
    script.arrived.notify_waiters();
    let next = script.replies.lock().unwrap().pop_front();
    let default = script.default.lock().unwrap().clone();
    let reply = next.or_else(|| default.map(|make| make()));
    reply
        .unwrap_or_else(|| {
            Reply::json(
                500,
                &serde_json::json!({"error": {"message": "ScriptedUpstream: no scripted reply left",
                    "type": "server_error", "param": null, "code": null}}),
            )
        })
        .into_response()
}

/// The demo upstream (the `demo-upstream` binary's server), in-process on 127.0.0.1.
pub struct DemoUpstream {
    port: u16,
    _server: ServerThread,
}

impl DemoUpstream {
    pub fn start() -> DemoUpstream {
        let (server, port) = ServerThread::spawn("demo-upstream", |listener| async move {
            let _ = demo::serve(listener).await;
        });
        DemoUpstream {
            port,
            _server: server,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

/// The demo upstream, in-process, recording every request it answers (to check what a
/// translated request carried, as [`ScriptedUpstream`] does, with the demo's answers).
pub struct RecordingDemo {
    port: u16,
    requests: Arc<Mutex<Vec<RecordedRequest>>>,
    _server: ServerThread,
}

impl RecordingDemo {
    pub fn start() -> RecordingDemo {
        RecordingDemo::serve(demo::router())
    }

    /// With the triggers of [`triggers`]: the output kinds the demo never makes.
    pub fn with_triggers() -> RecordingDemo {
        RecordingDemo::serve(triggers::router())
    }

    fn serve(router: axum::Router) -> RecordingDemo {
        let requests: Arc<Mutex<Vec<RecordedRequest>>> = Arc::default();
        let log = requests.clone();
        let app = router.layer(axum::middleware::from_fn(
            move |request: Request, next: axum::middleware::Next| {
                let log = log.clone();
                async move {
                    let received = std::time::Instant::now();
                    let (parts, body) = request.into_parts();
                    let body = axum::body::to_bytes(body, usize::MAX)
                        .await
                        .unwrap_or_default();
                    log.lock().unwrap().push(RecordedRequest {
                        received,
                        method: parts.method.to_string(),
                        path: parts
                            .uri
                            .path_and_query()
                            .map(|p| p.to_string())
                            .unwrap_or_default(),
                        headers: parts.headers.clone(),
                        body: body.clone(),
                    });
                    next.run(Request::from_parts(parts, Body::from(body))).await
                }
            },
        ));
        let (server, port) = ServerThread::spawn("recording-demo", move |listener| async move {
            let _ = axum::serve(listener, app).await;
        });
        RecordingDemo {
            port,
            requests,
            _server: server,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.requests.lock().unwrap().clone()
    }
}

/// The demo's answers, plus two triggers on the text of the last message when it is the
/// user's (test-only, for output kinds the demo never makes): `refuse` → the answer comes as
/// Chat's `refusal`; `think` → reasoning (`reasoning_content`, as vLLM sends it) before the
/// answer. Streams are sent at once (no pause between chunks).
pub mod triggers {
    use axum::body::{Body, Bytes};
    use axum::http::{header, StatusCode};
    use axum::response::{IntoResponse, Response};
    use serde_json::{json, Value};

    use super::demo;

    pub const REASONING: &str = "Let me think about it.";

    pub fn router() -> axum::Router {
        axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(chat))
            .fallback_service(demo::router())
            .layer(axum::extract::DefaultBodyLimit::max(16 << 20))
    }

    fn last_user_text(request: &Value) -> Option<String> {
        let last = request["messages"].as_array()?.last()?;
        if last["role"] != "user" {
            return None;
        }
        Some(match &last["content"] {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<Vec<_>>()
                .join(" "),
            _ => String::new(),
        })
    }

    async fn chat(body: Bytes) -> Response {
        let completion = match demo::plan(&body) {
            Ok(c) => c,
            Err(message) => {
                return (
                    StatusCode::BAD_REQUEST,
                    axum::Json(demo::error_json(&message, None)),
                )
                    .into_response()
            }
        };
        let request: Value = serde_json::from_slice(&body).unwrap_or_default();
        let text = last_user_text(&request).unwrap_or_default();
        let refuse = text.contains("refuse");
        let think = text.contains("think");
        let (id, created) = ("chatcmpl-trigger", 1_700_000_000);
        if !completion.stream {
            let mut answer = demo::completion_json(&completion, id, created);
            let message = &mut answer["choices"][0]["message"];
            if refuse && message["content"].is_string() {
                message["refusal"] = message["content"].take();
            }
            if think {
                message["reasoning_content"] = json!(REASONING);
            }
            return axum::Json(answer).into_response();
        }
        let mut frames = Vec::new();
        for (i, frame) in demo::stream_frames(&completion, id, created)
            .into_iter()
            .enumerate()
        {
            let data = frame.trim_start_matches("data: ").trim_end();
            let Ok(mut chunk) = serde_json::from_str::<Value>(data) else {
                frames.push(frame);
                continue;
            };
            if refuse {
                if let Some(delta) = chunk
                    .pointer_mut("/choices/0/delta")
                    .and_then(Value::as_object_mut)
                {
                    if let Some(content) = delta.remove("content") {
                        delta.insert("refusal".into(), content);
                    }
                }
            }
            frames.push(format!("data: {chunk}\n\n"));
            if think && i == 0 {
                let mut reasoning = chunk.clone();
                reasoning["choices"][0]["delta"] = json!({"reasoning_content": REASONING});
                frames.push(format!("data: {reasoning}\n\n"));
            }
        }
        (
            [(header::CONTENT_TYPE, "text/event-stream")],
            Body::from(frames.concat()),
        )
            .into_response()
    }
}
