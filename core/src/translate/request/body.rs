//! What `/v1/responses` and `/v1/responses/compact` check alike on a request body as a whole:
//! its parsing within the size cap, the stateless tier's refusals, and the fields left once
//! every known one is taken.

use serde_json::{Map, Value};

use super::input::is_extension;
use crate::openresponses::{ApiError, ErrorCode};
use crate::translate::fields::{bad_value, Obj};
use crate::translate::json::{self, ParseError};
use crate::translate::Options;

/// The request body as a JSON object, within the size cap.
pub(crate) fn parse_body(body: &[u8], options: &Options) -> Result<Obj<'static>, ApiError> {
    if body.len() > options.max_request_bytes {
        return Err(ApiError::invalid_body(format!(
            "The request body has {} bytes; this server accepts at most {}.",
            body.len(),
            options.max_request_bytes
        ))
        .with_status(413)
        .with_code(ErrorCode::RequestTooLarge));
    }
    let value = json::parse(body).map_err(|e| match e {
        ParseError::Syntax(e) => ApiError::invalid_body(format!(
            "The request body is not valid JSON: {e}. Send a JSON object with 'model' and 'input'."
        ))
        .with_code(ErrorCode::InvalidJson),
        ParseError::Duplicate(path) => ApiError::invalid(
            path.as_str(),
            format!("Invalid request: '{path}' is given twice. Each field may appear once."),
        )
        .with_code(ErrorCode::DuplicateKey),
    })?;
    match value {
        Value::Object(map) => Ok(Obj { map, path: "" }),
        other => Err(ApiError::invalid_body(format!(
            "The request body must be a JSON object, not {}.",
            match other {
                Value::Array(_) => "an array",
                Value::String(_) => "a string",
                Value::Number(_) => "a number",
                Value::Bool(_) => "a boolean",
                _ => "null",
            }
        ))
        .with_code(ErrorCode::InvalidJson)),
    }
}

/// The stateless tier serves only requests that carry their whole context.
pub(crate) fn reject_stateful(req: &mut Obj<'_>) -> Result<(), ApiError> {
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
/// `chat_template_kwargs`), forwarded as they are, or refused in strict mode. Provider
/// extensions (`slug:field`) belong to another provider's API and are never forwarded.
pub(crate) fn leftover_fields(
    req: &mut Obj<'_>,
    options: &Options,
) -> Result<Map<String, Value>, ApiError> {
    // `null` is absent here as everywhere: nothing to forward, nothing to refuse.
    req.map.retain(|k, v| !is_extension(k) && !v.is_null());
    if options.strict {
        if let Some(key) = req.map.keys().next() {
            return Err(ApiError::invalid(key.as_str(), format!(
                "Unknown parameter: '{key}'. This server runs in strict mode and forwards no fields outside the OpenResponses API."
            ))
            .with_code(ErrorCode::UnknownParameter));
        }
    }
    Ok(std::mem::take(&mut req.map))
}
