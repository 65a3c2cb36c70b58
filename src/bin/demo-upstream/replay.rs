//! `--replay FILE`: every `POST` is answered with a recorded SSE body, each frame written on
//! its own, [`Replay::delay`] apart. A trickled stream of any length for the benchmarks
//! (`benches/side_by_side.py`), where the demo's own answers are a few dozen words at most.

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

/// A recorded stream, cut into the frames that are written one by one.
#[derive(Debug, Clone)]
pub struct Replay {
    frames: Arc<[Bytes]>,
    /// The pause before each frame but the first.
    delay: Duration,
}

impl Replay {
    pub fn load(path: &Path, delay: Duration) -> std::io::Result<Self> {
        Ok(Self::new(&std::fs::read(path)?, delay))
    }

    pub fn new(body: &[u8], delay: Duration) -> Self {
        Replay {
            frames: responses_core::sse::split_frames(body)
                .into_iter()
                .map(Bytes::copy_from_slice)
                .collect(),
            delay,
        }
    }

    pub fn router(self) -> Router {
        Router::new()
            .route("/health", get(|| async { "ok" }))
            .fallback(post(move || {
                let replay = self.clone();
                async move { replay.answer() }
            }))
    }

    fn answer(&self) -> Response {
        let (frames, delay) = (self.frames.clone(), self.delay);
        let body = futures_util::stream::unfold(0, move |i| {
            let frames = frames.clone();
            async move {
                let frame = frames.get(i)?.clone();
                if i > 0 {
                    tokio::time::sleep(delay).await;
                }
                Some((Ok::<_, Infallible>(frame), i + 1))
            }
        });
        (
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            Body::from_stream(body),
        )
            .into_response()
    }
}
