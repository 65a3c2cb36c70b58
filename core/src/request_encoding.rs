//! Whether a request body can be read: compressed bodies are decoded before they reach the
//! core (by Envoy's decompressor filters in the shipped configurations: gzip, br, zstd),
//! which take the coding off `content-encoding`. A coding still there was not decoded (one
//! Envoy has no decompressor for, such as `deflate`, or a configuration without them), so
//! the body is refused with a 415 naming it rather than read as JSON and refused as garbage.

use crate::openresponses::{ApiError, ErrorCode};

/// The request header read.
pub const HEADER: &str = "content-encoding";

/// The codings the shipped Envoy configurations decode before the core (for the message).
pub const DECODED_BY_ENVOY: [&str; 3] = ["gzip", "br", "zstd"];

/// `Ok` when a body with this `content-encoding` (absent, empty or `identity`: none) is plain.
pub fn check(content_encoding: Option<&str>) -> Result<(), ApiError> {
    let codings = content_encoding.unwrap_or("").trim();
    let plain = codings
        .split(',')
        .map(str::trim)
        .all(|c| c.is_empty() || c.eq_ignore_ascii_case("identity"));
    if plain {
        return Ok(());
    }
    Err(ApiError::invalid_body(format!(
        "The request body has content-encoding '{codings}', which was not decoded before \
         translation. Send it uncompressed, or compressed with one of: {} (decoded by the \
         proxy).",
        DECODED_BY_ENVOY.join(", ")
    ))
    .with_status(415)
    .with_code(ErrorCode::UnsupportedContentEncoding))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_bodies_pass() {
        for value in [
            None,
            Some(""),
            Some(" identity "),
            Some("IDENTITY, identity"),
        ] {
            assert_eq!(check(value), Ok(()), "{value:?}");
        }
    }

    #[test]
    fn a_coding_left_on_the_body_is_a_415_naming_it() {
        for value in ["deflate", "gzip", "br, identity", "x-custom"] {
            let e = check(Some(value)).unwrap_err();
            assert_eq!(e.status, 415);
            assert_eq!(e.kind.as_str(), "invalid_request_error");
            assert_eq!(e.code, Some(ErrorCode::UnsupportedContentEncoding.into()));
            assert!(e.message.contains(&format!("'{value}'")), "{}", e.message);
        }
    }
}
