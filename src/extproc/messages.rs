//! Builders for the ext_proc messages we answer Envoy with.

use envoy_types::pb::envoy::config::core::v3::{
    header_value_option::HeaderAppendAction, HeaderValue, HeaderValueOption,
};
use envoy_types::pb::envoy::extensions::filters::http::ext_proc::v3::{
    processing_mode::{BodySendMode, HeaderSendMode},
    ProcessingMode,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::envoy::service::ext_proc::v3::{
    body_mutation::Mutation, common_response::ResponseStatus, processing_response::Response,
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpHeaders,
    ImmediateResponse, ProcessingResponse, StreamedBodyResponse, TrailersResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};

/// Reads a header (Envoy sends values in `raw_value`; older versions in `value`).
pub fn header<'a>(headers: &'a HttpHeaders, name: &str) -> Option<&'a str> {
    headers
        .headers
        .as_ref()?
        .headers
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .and_then(value)
}

/// Every header of a message that has a UTF-8 value, in order.
pub fn headers(headers: &HttpHeaders) -> impl Iterator<Item = (&str, &str)> {
    headers
        .headers
        .iter()
        .flat_map(|map| &map.headers)
        .filter_map(|h| Some((h.key.as_str(), value(h)?)))
}

/// A header's value: Envoy sends it in `raw_value` (bytes), older versions in `value`.
fn value(h: &HeaderValue) -> Option<&str> {
    if h.raw_value.is_empty() {
        Some(h.value.as_str())
    } else {
        std::str::from_utf8(&h.raw_value).ok()
    }
}

/// Header edits to apply, accumulated then turned into a `HeaderMutation`.
#[derive(Debug, Default)]
pub struct Headers {
    set: Vec<HeaderValueOption>,
    remove: Vec<String>,
}

impl Headers {
    pub fn set(mut self, key: &str, value: impl Into<String>) -> Self {
        self.set.push(HeaderValueOption {
            header: Some(HeaderValue {
                key: key.to_owned(),
                raw_value: value.into().into_bytes(),
                ..Default::default()
            }),
            append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
            ..Default::default()
        });
        self
    }

    pub fn remove(mut self, key: &str) -> Self {
        self.remove.push(key.to_owned());
        self
    }

    fn into_mutation(self) -> Option<HeaderMutation> {
        (!self.set.is_empty() || !self.remove.is_empty()).then_some(HeaderMutation {
            set_headers: self.set,
            remove_headers: self.remove,
        })
    }
}

/// A common response: header edits, an optional replacement body, route-cache flag.
pub fn common(headers: Headers, body: Option<Vec<u8>>, clear_route_cache: bool) -> CommonResponse {
    CommonResponse {
        status: ResponseStatus::Continue as i32,
        header_mutation: headers.into_mutation(),
        body_mutation: body.map(|b| BodyMutation {
            mutation: Some(Mutation::Body(b)),
        }),
        trailers: None,
        clear_route_cache,
    }
}

pub fn request_headers(
    response: CommonResponse,
    mode: Option<ProcessingMode>,
) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(response),
        })),
        mode_override: mode,
        ..Default::default()
    }
}

pub fn response_headers(
    response: CommonResponse,
    mode: Option<ProcessingMode>,
) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseHeaders(HeadersResponse {
            response: Some(response),
        })),
        mode_override: mode,
        ..Default::default()
    }
}

pub fn request_body(response: CommonResponse) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestBody(BodyResponse {
            response: Some(response),
        })),
        ..Default::default()
    }
}

pub fn response_body(response: CommonResponse) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseBody(BodyResponse {
            response: Some(response),
        })),
        ..Default::default()
    }
}

pub fn request_trailers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::RequestTrailers(TrailersResponse::default())),
        ..Default::default()
    }
}

pub fn response_trailers() -> ProcessingResponse {
    ProcessingResponse {
        response: Some(Response::ResponseTrailers(TrailersResponse::default())),
        ..Default::default()
    }
}

/// Replaces the HTTP exchange with a JSON reply of ours (an error envelope).
pub fn immediate(
    status: u16,
    content_type: &str,
    body: Vec<u8>,
    details: &str,
) -> ProcessingResponse {
    immediate_with(status, content_type, [], body, details)
}

/// [`immediate`], with these headers too.
pub fn immediate_with<'h>(
    status: u16,
    content_type: &str,
    extra: impl IntoIterator<Item = (&'h str, &'h str)>,
    body: Vec<u8>,
    details: &str,
) -> ProcessingResponse {
    let mut headers = Headers::default().set("content-type", content_type);
    for (name, value) in extra {
        headers = headers.set(name, value);
    }
    ProcessingResponse {
        response: Some(Response::ImmediateResponse(ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(status),
            }),
            headers: headers.into_mutation(),
            body,
            grpc_status: None,
            details: details.to_owned(),
        })),
        ..Default::default()
    }
}

/// Envoy stops calling us for this exchange: request body, response headers and body pass.
pub fn pass_through_mode() -> ProcessingMode {
    ProcessingMode {
        request_header_mode: HeaderSendMode::Default as i32,
        response_header_mode: HeaderSendMode::Skip as i32,
        request_body_mode: BodySendMode::None as i32,
        response_body_mode: BodySendMode::None as i32,
        request_trailer_mode: HeaderSendMode::Skip as i32,
        response_trailer_mode: HeaderSendMode::Skip as i32,
    }
}

/// The response body mode chosen on the response headers. FULL_DUPLEX_STREAMED needs the
/// response trailers too: they may be what ends the body.
pub fn response_body_mode(mode: BodySendMode) -> ProcessingMode {
    let trailers = if mode == BodySendMode::FullDuplexStreamed {
        HeaderSendMode::Send
    } else {
        HeaderSendMode::Skip
    };
    ProcessingMode {
        request_header_mode: HeaderSendMode::Default as i32,
        response_header_mode: HeaderSendMode::Default as i32,
        request_body_mode: BodySendMode::None as i32,
        response_body_mode: mode as i32,
        request_trailer_mode: HeaderSendMode::Skip as i32,
        response_trailer_mode: trailers as i32,
    }
}

/// A response body piece in FULL_DUPLEX_STREAMED mode (`streamed_response` replaces `body`).
pub fn streamed_body(body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    let mut c = common(Headers::default(), None, false);
    c.body_mutation = Some(BodyMutation {
        mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
            body,
            end_of_stream,
            ..Default::default()
        })),
    });
    response_body(c)
}

pub use responses_core::metadata::MetadataValue;

/// Dynamic metadata under one namespace: Envoy's access logs, rate limits and later filters
/// read it (when the namespace is in the filter's `metadata_options.receiving_namespaces`).
pub fn dynamic_metadata(namespace: &str, fields: Vec<(&'static str, MetadataValue)>) -> Struct {
    let value = |kind| Value { kind: Some(kind) };
    let inner = Struct {
        fields: fields
            .into_iter()
            .map(|(k, v)| {
                let kind = match v {
                    MetadataValue::Str(s) => Kind::StringValue(s),
                    MetadataValue::Num(n) => Kind::NumberValue(n),
                    MetadataValue::Bool(b) => Kind::BoolValue(b),
                };
                (k.to_owned(), value(kind))
            })
            .collect(),
    };
    Struct {
        fields: [(namespace.to_owned(), value(Kind::StructValue(inner)))]
            .into_iter()
            .collect(),
    }
}
