//! What `/v1/responses` and `/v1/responses/compact` check alike on a request body as a whole:
//! its parsing within the size cap, the stateless tier's refusals, and the fields left once
//! every known one is taken.

use std::borrow::Cow;

use serde_json::value::RawValue;

use super::input::is_extension;
use crate::chat::request::Extra;
use crate::openresponses::{ApiError, ErrorCode};
use crate::translate::fields::{bad_value, too_complex, Obj, ROOT};
use crate::translate::json::document::{self, owned_json, Node, Refused};
use crate::translate::json::shape::Kind;
use crate::translate::json::{self, ParseError};
use crate::translate::Options;

/// The request body as a borrowed object of fields, within the size cap.
pub(crate) fn parse_request<'a>(
    body: &'a [u8],
    options: &Options,
) -> Result<Obj<'a, 'static>, ApiError> {
    check_size(body, options)?;
    read(body)
}

/// [`parse_request`] without the size cap: for a body this server put together itself (a
/// WebSocket message whose cap was checked, with the kept context spliced in).
pub(crate) fn read(body: &[u8]) -> Result<Obj<'_, 'static>, ApiError> {
    let parsed = match std::str::from_utf8(body) {
        Ok(text) => document::parse(text, Kind::Request),
        Err(_) => Err(Refused::Invalid),
    };
    match parsed {
        Ok(Node::Object(fields)) => Ok(Obj { fields, path: ROOT }),
        Ok(other) => Err(not_an_object(other.type_name())),
        Err(Refused::TooComplex) => Err(too_complex(body.len())),
        // Refused: a walk that builds nothing says why, in serde_json's words.
        Err(Refused::Invalid) => Err(match json::check(body) {
            Err(e) => parse_error(e),
            Ok(()) => {
                debug_assert!(false, "the two JSON readers disagree on {body:?}");
                ApiError::invalid_body(
                "The request body is not valid JSON. Send a JSON object with 'model' and 'input'.",
                )
                .with_code(ErrorCode::InvalidJson)
            }
        }),
    }
}

fn check_size(body: &[u8], options: &Options) -> Result<(), ApiError> {
    if body.len() > options.max_request_bytes {
        return Err(ApiError::invalid_body(format!(
            "The request body has {} bytes; this server accepts at most {}.",
            body.len(),
            options.max_request_bytes
        ))
        .with_status(413)
        .with_code(ErrorCode::RequestTooLarge));
    }
    Ok(())
}

fn parse_error(e: ParseError) -> ApiError {
    match e {
        ParseError::Syntax(e) => ApiError::invalid_body(format!(
            "The request body is not valid JSON: {e}. Send a JSON object with 'model' and 'input'."
        ))
        .with_code(ErrorCode::InvalidJson),
        ParseError::Duplicate(path) => ApiError::invalid(
            path.as_str(),
            format!("Invalid request: '{path}' is given twice. Each field may appear once."),
        )
        .with_code(ErrorCode::DuplicateKey),
    }
}

fn not_an_object(type_name: &str) -> ApiError {
    ApiError::invalid_body(format!(
        "The request body must be a JSON object, not {type_name}."
    ))
    .with_code(ErrorCode::InvalidJson)
}

/// The stateless tier serves only requests that carry their whole context.
pub(crate) fn reject_stateful(req: &mut Obj<'_, '_>) -> Result<(), ApiError> {
    if let Some(id) = req.string("previous_response_id")? {
        return Err(ApiError::invalid(
            "previous_response_id",
            format!(
                "Previous response with id '{id}' not found. This server is stateless (store: false): \
                 send the whole conversation in 'input' instead of 'previous_response_id'."
            ),
        )
        .with_code(ErrorCode::PreviousResponseNotFound));
    }
    if req.bool("background")? == Some(true) {
        return Err(bad_value(
            "background",
            "Background responses need stored state, which this stateless server does not keep: omit 'background' or set it to false.",
        )
        .with_code(ErrorCode::UnsupportedParameter));
    }
    if req.has("conversation") {
        return Err(bad_value(
            "conversation",
            "Conversations need stored state, which this stateless server does not keep: send the whole conversation in 'input'.",
        )
        .with_code(ErrorCode::UnsupportedParameter));
    }
    if req.has("prompt") {
        return Err(bad_value(
            "prompt",
            "Stored prompt templates are not available on this stateless server: send 'instructions' and 'input' instead.",
        )
        .with_code(ErrorCode::UnsupportedParameter));
    }
    Ok(())
}

/// The fields left once every Responses field is taken: the upstream's own (vLLM's
/// `chat_template_kwargs`), forwarded as they came, or refused in strict mode. Provider
/// extensions (`slug:field`) belong to another provider's API and are never forwarded.
pub(crate) fn leftover_fields<'a>(
    req: &mut Obj<'a, '_>,
    options: &Options,
) -> Result<Extra<'a>, ApiError> {
    // `null` is absent here as everywhere: nothing to forward, nothing to refuse.
    req.fields.retain(|(k, v)| !is_extension(k) && !v.is_null());
    if options.strict {
        if let Some((key, _)) = req.fields.first() {
            return Err(ApiError::invalid(key.as_ref(), format!(
                "Unknown parameter: '{key}'. This server runs in strict mode and forwards no fields outside the OpenResponses API."
            ))
            .with_code(ErrorCode::UnknownParameter));
        }
    }
    Ok(std::mem::take(&mut req.fields)
        .into_iter()
        .map(|(k, v)| (k, as_json(v)))
        .collect())
}

/// A value as JSON to write out: borrowed where it is a token of the body.
fn as_json(node: Node<'_>) -> Cow<'_, RawValue> {
    match node {
        Node::Kept(raw, _) => Cow::Borrowed(raw),
        Node::Str(document::Str::Token(raw)) => Cow::Borrowed(raw),
        other => Cow::Owned(owned_json(&other)),
    }
}
