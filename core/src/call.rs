//! A call of the core's own to the Chat upstream, sans-IO: what the host sends and what it
//! reports back.
//!
//! An HTTP exchange needs no call of its own: Envoy's router sends the translated request.
//! A WebSocket connection does (each `response.create` is one streamed Chat request), and so
//! does anything the core must ask the model itself. The core says what to send ([`Call`]:
//! path, headers, body) and when to give up on it ([`CallAction::Cancel`]); the host makes it
//! with its own means (the processor's HTTP client back through Envoy, the module's streaming
//! callout to a cluster that loops back into Envoy) and reports its head, its body in pieces,
//! its end or its failure, by the call's [`CallId`].

use std::borrow::Cow;

use bytes::Bytes;

use crate::exchange::{Settings, UpstreamRequest, EVENT_STREAM, JSON};
use crate::metadata::record::Record;
pub use crate::upstream_failure::{AnswerHead, CallFailure, ReportedHead};

/// One call, among the calls of its connection: events of a call the core gave up on are told
/// apart from those of the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallId(pub u64);

/// A call to make: `POST` to `path` with these headers and body, the answer read as it comes.
#[derive(Debug, Clone)]
pub struct Call {
    pub id: CallId,
    /// The Chat path (`chat_path`).
    pub path: String,
    /// Lowercase names. The host adds what its transport needs (`:authority`, `:scheme`,
    /// `content-length`).
    pub headers: Vec<(Cow<'static, str>, String)>,
    pub body: Bytes,
    /// The model asked for, for the host's logs.
    pub model: String,
}

/// What the host does for the core's calls.
#[derive(Debug, Clone)]
pub enum CallAction {
    Start(Call),
    /// Stop the call (reset it): its answer is no longer read. Nothing more is told of it.
    Cancel(CallId),
    /// A response ended: file its record in the host's ledger and send it to Envoy
    /// ([`crate::metadata::record`]); nothing is told back.
    Record(Record),
}

/// Headers of a connection's opening request that go on to each of its calls: credentials,
/// tracing, the client's name; then the operator's `forward_headers` (the identity Envoy's
/// rate limits key on, `x-client-id` by default). Everything else of the handshake (cookies,
/// `sec-websocket-*`) stays behind.
pub const FORWARDED_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "openai-organization",
    "openai-project",
    "x-request-id",
    "traceparent",
    "tracestate",
    "user-agent",
];

/// The names of `lists`, each once, in the order they first come: a list of header names
/// made of others at compile time, so that each name has one source (`N`, the number of
/// distinct names, is checked: a wrong one fails the build).
pub const fn names_once<const N: usize>(lists: &[&[&'static str]]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut n = 0;
    let mut l = 0;
    while l < lists.len() {
        let mut i = 0;
        while i < lists[l].len() {
            let name = lists[l][i];
            let mut seen = false;
            let mut j = 0;
            while j < n {
                seen |= same(out[j], name);
                j += 1;
            }
            if !seen {
                assert!(n < N, "more distinct names than N");
                out[n] = name;
                n += 1;
            }
            i += 1;
        }
        l += 1;
    }
    assert!(n == N, "fewer distinct names than N");
    out
}

/// `a == b`, in a const fn.
const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Headers a call sets itself (or its host does for its transport): no `forward_headers`
/// names one.
pub const SET_BY_THE_CALL: &[&str] = &[
    "content-type",
    "accept",
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "host",
    "connection",
    "upgrade",
    "te",
    "keep-alive",
];

/// The headers of [`FORWARDED_HEADERS`], then of `extra` (the settings' `forward_headers`),
/// that the opening request has (`header` looks one up by its lowercase name), each once.
pub fn forwarded<'h>(
    header: impl Fn(&str) -> Option<&'h str>,
    extra: &[String],
) -> Vec<(Cow<'static, str>, String)> {
    let mut out: Vec<(Cow<'static, str>, String)> = FORWARDED_HEADERS
        .iter()
        .filter_map(|&name| Some((Cow::Borrowed(name), header(name)?.to_owned())))
        .collect();
    for name in extra {
        if out.iter().any(|(n, _)| n == name) {
            continue;
        }
        if let Some(value) = header(name) {
            out.push((Cow::Owned(name.clone()), value.to_owned()));
        }
    }
    out
}

/// The call that sends a translated request upstream: its body, the type it is and the one it
/// wants back, the model headers (so that Envoy's routes match on them, as for a routed
/// exchange), then the `forwarded` headers.
pub fn chat(
    id: CallId,
    settings: &Settings,
    up: UpstreamRequest,
    forwarded: &[(Cow<'static, str>, String)],
) -> Call {
    let mut headers = Vec::with_capacity(4 + forwarded.len());
    headers.push((Cow::Borrowed("content-type"), JSON.to_owned()));
    let accept = if up.stream { EVENT_STREAM } else { JSON };
    headers.push((Cow::Borrowed("accept"), accept.to_owned()));
    for (name, value) in up.model_headers(settings) {
        headers.push((Cow::Owned(name.to_owned()), value.to_owned()));
    }
    headers.extend(forwarded.iter().cloned());
    Call {
        id,
        path: settings.chat_path.clone(),
        headers,
        body: up.body,
        model: up.model,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_call_carries_the_model_header_and_the_forwarded_credentials() {
        let handshake = |name: &str| match name {
            "authorization" => Some("Bearer k"),
            "cookie" => Some("secret"),
            "traceparent" => Some("00-1-2-01"),
            "x-client-id" => Some("alice"),
            _ => None,
        };
        let forwarded = forwarded(handshake, &Settings::default().forward_headers);
        let up = UpstreamRequest {
            body: Bytes::from_static(b"{}"),
            model: "m".into(),
            chat_model: "served".into(),
            stream: true,
        };
        let call = chat(CallId(7), &Settings::default(), up, &forwarded);
        assert_eq!(call.id, CallId(7));
        assert_eq!(call.path, "/v1/chat/completions");
        let names: Vec<(&str, &str)> = call
            .headers
            .iter()
            .map(|(n, v)| (n.as_ref(), v.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("content-type", "application/json"),
                ("accept", "text/event-stream"),
                ("x-responses-model", "m"),
                ("x-responses-upstream-model", "served"),
                ("authorization", "Bearer k"),
                ("traceparent", "00-1-2-01"),
                ("x-client-id", "alice"),
            ]
        );
    }

    #[test]
    fn the_operators_forward_headers_follow_the_credentials_each_once() {
        let handshake = |name: &str| match name {
            "authorization" => Some("Bearer k"),
            "x-tenant" => Some("t1"),
            "x-client-id" => Some("alice"),
            _ => None,
        };
        let extra = [
            "x-tenant".to_owned(),
            "authorization".to_owned(),
            "x-absent".to_owned(),
        ];
        let names: Vec<(String, String)> = forwarded(handshake, &extra)
            .into_iter()
            .map(|(n, v)| (n.into_owned(), v))
            .collect();
        assert_eq!(
            names,
            [
                ("authorization".to_owned(), "Bearer k".to_owned()),
                ("x-tenant".to_owned(), "t1".to_owned()),
            ]
        );
        // Without the setting, the client's identity stays behind.
        assert!(forwarded(handshake, &[])
            .iter()
            .all(|(n, _)| n != "x-client-id"));
    }

    #[test]
    fn names_once_keeps_each_name_once_in_first_order() {
        const NAMES: [&str; 4] = names_once(&[&["a", "bb"], &["bb", "c"], &["a", "d"]]);
        assert_eq!(NAMES, ["a", "bb", "c", "d"]);
    }
}
