//! The opening handshake, server side: from the request head, the head that accepts the
//! upgrade, or why not.
//!
//! Two forms. HTTP/1.1 (RFC 6455 §4.2): `GET` with `upgrade: websocket`, `connection:
//! upgrade`, `sec-websocket-version: 13` and a `sec-websocket-key` of 16 bytes in base64,
//! answered `101 Switching Protocols` with `sec-websocket-accept`. HTTP/2 and HTTP/3
//! (RFC 8441 §4–5, RFC 9220): an extended `CONNECT` with `:protocol: websocket` and the
//! version, no key, answered `200`.
//!
//! Envoy's HTTP/2 and HTTP/3 codecs rewrite an extended CONNECT into the HTTP/1.1 form before
//! its filters see it (`:method GET`, `upgrade: websocket`, `connection: upgrade`, no key), and
//! turn a `101` with `upgrade` and `connection` back into the `200` of RFC 8441 on the way out:
//! so the host says which protocol the request came on ([`Version`]), and a keyless HTTP/1.1
//! form is accepted only when it did not come on HTTP/1.1.
//!
//! Nothing is negotiated: no subprotocol (`sec-websocket-protocol` is not echoed, so a client
//! that requires one fails the connection itself) and no extension: `permessage-deflate`
//! (RFC 7692) offered in `sec-websocket-extensions` is declined by not echoing it, so the
//! client must send uncompressed frames and a frame with RSV1 set is a protocol error.
//! `origin` is not checked: the transport is for API clients, authorized per request.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha1::{Digest, Sha1};

use crate::openresponses::{ApiError, ErrorCode};

/// RFC 6455 §1.3: appended to the client's key before hashing.
const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// The only WebSocket version (RFC 6455 §4.2.1, §11.6).
const VERSION: &str = "13";

/// The protocol the request head arrived on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    Http1,
    /// HTTP/2 or HTTP/3: the extended CONNECT of RFC 8441 (RFC 9220 for HTTP/3).
    Http2,
}

/// The head that accepts the upgrade: send it, then frames flow both ways.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accept {
    /// 101, or 200 for an extended CONNECT.
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
}

/// Why the upgrade is refused: each says its status, the headers that go with it and the
/// error envelope's message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 405: neither `GET` nor an extended `CONNECT` (or a `CONNECT` on HTTP/1.1).
    Method(String),
    /// 426: no `upgrade: websocket` (a plain request on the WebSocket path).
    NotAnUpgrade,
    /// 400: `upgrade: websocket` without `upgrade` in `connection`.
    ConnectionNotUpgrade,
    /// 400: an extended CONNECT for another protocol than `websocket`.
    Protocol(String),
    /// 426: no `sec-websocket-version`, or not 13 (RFC 6455 §4.4: the answer names 13).
    Version(Option<String>),
    /// 400: an HTTP/1.1 upgrade without `sec-websocket-key`.
    MissingKey,
    /// 400: a key that is not 16 bytes in base64.
    InvalidKey,
}

impl Refusal {
    pub fn status(&self) -> u16 {
        match self {
            Refusal::Method(_) => 405,
            Refusal::NotAnUpgrade | Refusal::Version(_) => 426,
            Refusal::ConnectionNotUpgrade
            | Refusal::Protocol(_)
            | Refusal::MissingKey
            | Refusal::InvalidKey => 400,
        }
    }

    /// Headers the refusal carries (RFC 9110 §15.5.6, §15.5.22; RFC 6455 §4.4).
    pub fn headers(&self) -> Vec<(&'static str, &'static str)> {
        match self {
            Refusal::Method(_) => vec![("allow", "GET")],
            Refusal::NotAnUpgrade => vec![("upgrade", "websocket"), ("connection", "upgrade")],
            Refusal::Version(_) => vec![("sec-websocket-version", VERSION)],
            _ => Vec::new(),
        }
    }

    /// The request header at fault.
    pub fn header(&self) -> &'static str {
        match self {
            Refusal::Method(_) => ":method",
            Refusal::NotAnUpgrade => "upgrade",
            Refusal::ConnectionNotUpgrade => "connection",
            Refusal::Protocol(_) => ":protocol",
            Refusal::Version(_) => "sec-websocket-version",
            Refusal::MissingKey | Refusal::InvalidKey => "sec-websocket-key",
        }
    }

    pub fn message(&self) -> String {
        match self {
            Refusal::Method(m) => format!(
                "The WebSocket transport is opened with GET (or an HTTP/2 extended CONNECT), not {m}."
            ),
            Refusal::NotAnUpgrade => {
                "This path serves the WebSocket transport: send `upgrade: websocket`.".into()
            }
            Refusal::ConnectionNotUpgrade => {
                "A WebSocket upgrade needs `upgrade` in the `connection` header.".into()
            }
            Refusal::Protocol(p) => {
                format!("Extended CONNECT is served for the `websocket` protocol only, not {p}.")
            }
            Refusal::Version(Some(v)) => {
                format!("WebSocket version {v} is not supported: send `sec-websocket-version: 13`.")
            }
            Refusal::Version(None) => {
                "A WebSocket upgrade needs `sec-websocket-version: 13`.".into()
            }
            Refusal::MissingKey => "A WebSocket upgrade needs a `sec-websocket-key`.".into(),
            Refusal::InvalidKey => {
                "The `sec-websocket-key` is not 16 bytes in base64 (RFC 6455 §4.1).".into()
            }
        }
    }

    /// The error envelope for the refusal's body.
    pub fn error(&self) -> ApiError {
        let code = match self {
            Refusal::Version(None) | Refusal::MissingKey | Refusal::NotAnUpgrade => {
                ErrorCode::MissingRequiredParameter
            }
            _ => ErrorCode::InvalidValue,
        };
        ApiError::invalid(self.header(), self.message())
            .with_status(self.status())
            .with_code(code)
    }
}

/// Decides on an upgrade request: `header` looks a header up by its lower-case name, the
/// pseudo-headers (`:method`, `:protocol`) included.
pub fn negotiate<'h>(
    version: Version,
    header: impl Fn(&str) -> Option<&'h str>,
) -> Result<Accept, Refusal> {
    let method = header(":method").unwrap_or_default();
    if method.eq_ignore_ascii_case("CONNECT") && version == Version::Http2 {
        // RFC 8441 §4: the protocol in `:protocol`, no upgrade headers, no key.
        let protocol = header(":protocol").unwrap_or_default();
        if !protocol.trim().eq_ignore_ascii_case("websocket") {
            return Err(Refusal::Protocol(protocol.to_owned()));
        }
        check_version(&header)?;
        return Ok(Accept {
            status: 200,
            headers: Vec::new(),
        });
    }
    if !method.eq_ignore_ascii_case("GET") {
        return Err(Refusal::Method(method.to_owned()));
    }
    if !has_token(header("upgrade"), "websocket") {
        return Err(Refusal::NotAnUpgrade);
    }
    if !has_token(header("connection"), "upgrade") {
        return Err(Refusal::ConnectionNotUpgrade);
    }
    check_version(&header)?;
    let mut headers = vec![
        ("upgrade", "websocket".to_owned()),
        ("connection", "upgrade".to_owned()),
    ];
    match (version, header("sec-websocket-key")) {
        (_, Some(key)) => {
            let key = key.trim();
            if !key_is_valid(key) {
                return Err(Refusal::InvalidKey);
            }
            headers.push(("sec-websocket-accept", accept_key(key)));
        }
        // An extended CONNECT rewritten by the host (see the module's documentation): the
        // host turns this 101 into RFC 8441's 200.
        (Version::Http2, None) => {}
        (Version::Http1, None) => return Err(Refusal::MissingKey),
    }
    Ok(Accept {
        status: 101,
        headers,
    })
}

fn check_version<'h>(header: &impl Fn(&str) -> Option<&'h str>) -> Result<(), Refusal> {
    match header("sec-websocket-version") {
        Some(v) if v.trim() == VERSION => Ok(()),
        other => Err(Refusal::Version(other.map(str::to_owned))),
    }
}

/// Whether a comma-separated header holds `token` (case-insensitive, RFC 9110 §5.6.1).
fn has_token(value: Option<&str>, token: &str) -> bool {
    value.is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// RFC 6455 §4.1: the key is 16 random bytes in base64 (24 characters with padding).
fn key_is_valid(key: &str) -> bool {
    key.len() == 24 && STANDARD.decode(key).is_ok_and(|k| k.len() == 16)
}

/// `sec-websocket-accept` (RFC 6455 §4.2.2 step 5.4): base64(SHA-1(key + GUID)).
pub fn accept_key(key: &str) -> String {
    let mut sha = Sha1::new();
    sha.update(key.as_bytes());
    sha.update(GUID.as_bytes());
    STANDARD.encode(sha.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> + 'a {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    const KEY: &str = "dGhlIHNhbXBsZSBub25jZQ==";

    /// A request head as name and value pairs.
    type Pairs = Vec<(&'static str, &'static str)>;

    fn upgrade() -> Pairs {
        vec![
            (":method", "GET"),
            (":path", "/v1/responses"),
            ("upgrade", "websocket"),
            ("connection", "Upgrade"),
            ("sec-websocket-version", "13"),
            ("sec-websocket-key", KEY),
        ]
    }

    fn with(mut pairs: Pairs, name: &'static str, value: Option<&'static str>) -> Pairs {
        pairs.retain(|(n, _)| *n != name);
        if let Some(v) = value {
            pairs.push((name, v));
        }
        pairs
    }

    #[test]
    fn rfc6455_4_2_2_accept_key_of_the_rfc_example() {
        // RFC 6455 §1.3's worked example.
        assert_eq!(accept_key(KEY), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }

    #[test]
    fn rfc6455_4_2_2_a_valid_upgrade_gets_101_with_the_accept_key() {
        let pairs = upgrade();
        let accept = negotiate(Version::Http1, head(&pairs)).unwrap();
        assert_eq!(accept.status, 101);
        assert_eq!(
            accept.headers,
            vec![
                ("upgrade", "websocket".to_owned()),
                ("connection", "upgrade".to_owned()),
                (
                    "sec-websocket-accept",
                    "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn rfc6455_4_2_1_tokens_are_case_insensitive_and_listed() {
        let pairs = with(
            with(upgrade(), "connection", Some("keep-alive, Upgrade")),
            "upgrade",
            Some("WebSocket"),
        );
        assert_eq!(negotiate(Version::Http1, head(&pairs)).unwrap().status, 101);
    }

    #[test]
    fn rfc6455_4_2_1_each_missing_or_wrong_header_is_refused_with_its_status() {
        let cases: Vec<(Pairs, Refusal, u16)> = vec![
            (
                with(upgrade(), ":method", Some("POST")),
                Refusal::Method("POST".into()),
                405,
            ),
            (with(upgrade(), "upgrade", None), Refusal::NotAnUpgrade, 426),
            (
                with(upgrade(), "upgrade", Some("h2c")),
                Refusal::NotAnUpgrade,
                426,
            ),
            (
                with(upgrade(), "connection", Some("keep-alive")),
                Refusal::ConnectionNotUpgrade,
                400,
            ),
            (
                with(upgrade(), "sec-websocket-version", None),
                Refusal::Version(None),
                426,
            ),
            (
                with(upgrade(), "sec-websocket-version", Some("8")),
                Refusal::Version(Some("8".into())),
                426,
            ),
            (
                with(upgrade(), "sec-websocket-key", None),
                Refusal::MissingKey,
                400,
            ),
            // 15 bytes, 17 bytes, not base64, unpadded.
            (
                with(upgrade(), "sec-websocket-key", Some("AAAAAAAAAAAAAAAAAAAA")),
                Refusal::InvalidKey,
                400,
            ),
            (
                with(
                    upgrade(),
                    "sec-websocket-key",
                    Some("AAAAAAAAAAAAAAAAAAAAAAA="),
                ),
                Refusal::InvalidKey,
                400,
            ),
            (
                with(
                    upgrade(),
                    "sec-websocket-key",
                    Some("!!!!!!!!!!!!!!!!!!!!!!=="),
                ),
                Refusal::InvalidKey,
                400,
            ),
            (
                with(
                    upgrade(),
                    "sec-websocket-key",
                    Some("dGhlIHNhbXBsZSBub25jZQ"),
                ),
                Refusal::InvalidKey,
                400,
            ),
        ];
        for (pairs, refusal, status) in cases {
            let got = negotiate(Version::Http1, head(&pairs)).unwrap_err();
            assert_eq!(got, refusal, "{pairs:?}");
            assert_eq!(got.status(), status);
            let error = got.error();
            assert_eq!(error.status, status);
            assert_eq!(error.param.as_deref(), Some(got.header()));
        }
    }

    #[test]
    fn rfc6455_4_4_a_wrong_version_names_13() {
        let pairs = with(upgrade(), "sec-websocket-version", Some("12"));
        let refusal = negotiate(Version::Http1, head(&pairs)).unwrap_err();
        assert_eq!(refusal.headers(), vec![("sec-websocket-version", "13")]);
    }

    #[test]
    fn rfc8441_4_extended_connect_gets_200_without_a_key() {
        let pairs = [
            (":method", "CONNECT"),
            (":protocol", "websocket"),
            (":path", "/v1/responses"),
            ("sec-websocket-version", "13"),
        ];
        let accept = negotiate(Version::Http2, head(&pairs)).unwrap();
        assert_eq!(
            accept,
            Accept {
                status: 200,
                headers: Vec::new()
            }
        );
        // Another protocol, or no version.
        let other = [
            (":method", "CONNECT"),
            (":protocol", "connect-udp"),
            ("sec-websocket-version", "13"),
        ];
        assert_eq!(
            negotiate(Version::Http2, head(&other)).unwrap_err(),
            Refusal::Protocol("connect-udp".into())
        );
        let unversioned = [(":method", "CONNECT"), (":protocol", "websocket")];
        assert_eq!(
            negotiate(Version::Http2, head(&unversioned)).unwrap_err(),
            Refusal::Version(None)
        );
        // CONNECT is not an upgrade on HTTP/1.1.
        assert_eq!(
            negotiate(Version::Http1, head(&pairs)).unwrap_err(),
            Refusal::Method("CONNECT".into())
        );
    }

    #[test]
    fn rfc8441_an_extended_connect_rewritten_to_the_http1_form_gets_101_without_accept() {
        // What Envoy's HTTP/2 codec hands its filters: the upgrade headers and no key.
        let pairs = with(upgrade(), "sec-websocket-key", None);
        let accept = negotiate(Version::Http2, head(&pairs)).unwrap();
        assert_eq!(accept.status, 101);
        assert!(accept
            .headers
            .iter()
            .all(|(n, _)| *n != "sec-websocket-accept"));
        // The same head on HTTP/1.1 lacks its key.
        assert_eq!(
            negotiate(Version::Http1, head(&pairs)).unwrap_err(),
            Refusal::MissingKey
        );
    }

    #[test]
    fn rfc7692_extensions_and_subprotocols_offered_are_not_echoed() {
        let mut pairs = upgrade();
        pairs.push((
            "sec-websocket-extensions",
            "permessage-deflate; client_max_window_bits",
        ));
        pairs.push(("sec-websocket-protocol", "chat, superchat"));
        let accept = negotiate(Version::Http1, head(&pairs)).unwrap();
        assert!(accept
            .headers
            .iter()
            .all(|(n, _)| *n != "sec-websocket-extensions" && *n != "sec-websocket-protocol"));
    }
}
