//! What a filter's hooks tell Envoy: go on, or hold the stream (and how).

/// What a headers hook tells Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadersStatus {
    Continue,
    /// Hold the head (and everything after it) until a later hook continues.
    Stop,
}

/// What a body hook tells Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyStatus {
    /// Pass on what is left in the piece (the translation, or nothing).
    Continue,
    /// Hold the head; the piece was drained (Envoy's `StopIterationNoBuffer`).
    Stop,
    /// Hold the head, and keep what is left of the piece in Envoy's buffer, to be read later;
    /// over its high watermark Envoy stops reading the client (`StopIterationAndWatermark`).
    /// Only the WebSocket transport keeps bytes so.
    Keep,
}

/// What a trailers hook tells Envoy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrailersStatus {
    Continue,
    Stop,
}

pub(crate) fn headers_status(go: bool) -> HeadersStatus {
    if go {
        HeadersStatus::Continue
    } else {
        HeadersStatus::Stop
    }
}

pub(crate) fn body_status(go: bool) -> BodyStatus {
    if go {
        BodyStatus::Continue
    } else {
        BodyStatus::Stop
    }
}

pub(crate) fn trailers_status(go: bool) -> TrailersStatus {
    if go {
        TrailersStatus::Continue
    } else {
        TrailersStatus::Stop
    }
}
