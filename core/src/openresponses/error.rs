//! The OpenResponses error envelope: `{"error":{"message","type","param","code"}}`.

use bytes::Bytes;
use serde::Serialize;

use super::code::Code;

/// An error answered to the client instead of a response object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status of the reply.
    pub status: u16,
    pub kind: ErrorKind,
    pub message: String,
    /// The request field at fault, as a path (`input[2].content[0].type`).
    pub param: Option<String>,
    pub code: Option<Code>,
    /// A context overflow's token counts, where the upstream gave them as fields.
    pub tokens: Option<ContextTokens>,
}

/// The token counts of a context overflow, as the upstream gave them in fields of its error
/// object (llama.cpp: `n_prompt_tokens`, `n_ctx`), kept under those names in the envelope for
/// clients that read them. Servers that state them in their message keep them there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct ContextTokens {
    /// The tokens of the request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_prompt_tokens: Option<u64>,
    /// The model's context window as served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub n_ctx: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidRequest,
    Authentication,
    Permission,
    NotFound,
    RateLimit,
    Server,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::Permission => "permission_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::RateLimit => "rate_limit_error",
            ErrorKind::Server => "server_error",
        }
    }

    /// The kind a given HTTP status stands for.
    pub fn for_status(status: u16) -> Self {
        match status {
            401 => ErrorKind::Authentication,
            403 => ErrorKind::Permission,
            404 => ErrorKind::NotFound,
            429 => ErrorKind::RateLimit,
            400..=499 => ErrorKind::InvalidRequest,
            _ => ErrorKind::Server,
        }
    }
}

impl ApiError {
    /// A 400 `invalid_request_error` naming the field at fault.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            kind: ErrorKind::InvalidRequest,
            message: message.into(),
            param: Some(param.into()),
            code: None,
            tokens: None,
        }
    }

    /// A 400 about the request as a whole (no single field).
    pub fn invalid_body(message: impl Into<String>) -> Self {
        ApiError {
            status: 400,
            kind: ErrorKind::InvalidRequest,
            message: message.into(),
            param: None,
            code: None,
            tokens: None,
        }
    }

    pub fn with_code(mut self, code: impl Into<Code>) -> Self {
        self.code = Some(code.into());
        self
    }

    pub fn with_status(mut self, status: u16) -> Self {
        self.status = status;
        self.kind = ErrorKind::for_status(status);
        self
    }

    /// A server-side failure (bad upstream answer, internal limit) with the given status.
    pub fn server(status: u16, code: impl Into<Code>, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind: ErrorKind::for_status(status),
            message: message.into(),
            param: None,
            code: Some(code.into()),
            tokens: None,
        }
    }

    /// The JSON body of the reply.
    pub fn to_body(&self) -> Bytes {
        #[derive(Serialize)]
        struct Envelope<'a> {
            error: Payload<'a>,
        }
        #[derive(Serialize)]
        struct Payload<'a> {
            message: &'a str,
            #[serde(rename = "type")]
            kind: &'static str,
            param: Option<&'a str>,
            code: Option<&'a Code>,
            #[serde(flatten, skip_serializing_if = "Option::is_none")]
            tokens: Option<&'a ContextTokens>,
        }
        let envelope = Envelope {
            error: Payload {
                message: &self.message,
                kind: self.kind.as_str(),
                param: self.param.as_deref(),
                code: self.code.as_ref(),
                tokens: self.tokens.as_ref(),
            },
        };
        // Serialising plain strings cannot fail.
        Bytes::from(serde_json::to_vec(&envelope).unwrap_or_default())
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status,
            self.kind.as_str(),
            self.message
        )?;
        if let Some(p) = &self.param {
            write!(f, " (param {p})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openresponses::ErrorCode;

    #[test]
    fn envelope_has_all_four_fields() {
        let e =
            ApiError::invalid("input", "missing").with_code(ErrorCode::MissingRequiredParameter);
        let v: serde_json::Value = serde_json::from_slice(&e.to_body()).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"error": {"message": "missing", "type": "invalid_request_error",
                "param": "input", "code": "missing_required_parameter"}})
        );
    }

    #[test]
    fn status_classes_map_to_kinds() {
        assert_eq!(ErrorKind::for_status(429), ErrorKind::RateLimit);
        assert_eq!(ErrorKind::for_status(422), ErrorKind::InvalidRequest);
        assert_eq!(ErrorKind::for_status(503), ErrorKind::Server);
        let e = ApiError::invalid_body("x").with_status(413);
        assert_eq!((e.status, e.kind), (413, ErrorKind::InvalidRequest));
    }
}
