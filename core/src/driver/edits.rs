//! What an adapter inside an HTTP proxy changes on the heads around an exchange, as plain
//! data: the header edits of each step. The driver hands them to both Envoy adapters (the
//! ext_proc service and the in-process module) with its actions; each applies them in its own
//! form (protobuf mutations, ABI calls), so the rules are written once.

use std::borrow::Cow;

use crate::exchange::{self, Answer, Settings, UpstreamRequest};
use crate::request_encoding;

/// One edit of a header map. Owned, so that the driver's actions do not borrow it; the names
/// and values are static but for the configured ones (the model headers, the Chat path) and the
/// lengths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderEdit {
    /// Replace every value of the header with this one.
    Set(Cow<'static, str>, Cow<'static, str>),
    Remove(&'static str),
}

/// Header edits, in order: a fixed set, or one made for the step.
pub type Edits = Cow<'static, [HeaderEdit]>;

/// A header set to a static value.
const fn set(name: &'static str, value: &'static str) -> HeaderEdit {
    Set(Cow::Borrowed(name), Cow::Borrowed(value))
}

use HeaderEdit::{Remove, Set};

/// The request head of an exchange that is ours: the upstream must answer in plain bytes we
/// can parse.
pub const REQUEST_HEAD_EDITS: &[HeaderEdit] = &[Remove("accept-encoding")];

/// The request head once the body is translated: the Chat path (the route is computed again:
/// adapters clear Envoy's route cache), the new body's type and length (plain: a compressed
/// body was decoded by the exchange), the model headers for routes
/// ([`UpstreamRequest::model_headers`]).
pub fn forward_edits(settings: &Settings, up: &UpstreamRequest) -> [HeaderEdit; 6] {
    let [(model_header, model), (upstream_header, chat_model)] = up.model_headers(settings);
    [
        Set(
            Cow::Borrowed(":path"),
            Cow::Owned(settings.chat_path.clone()),
        ),
        set("content-type", exchange::JSON),
        Set(
            Cow::Borrowed("content-length"),
            Cow::Owned(up.body.len().to_string()),
        ),
        Remove(request_encoding::HEADER),
        Set(Cow::Owned(model_header.into()), Cow::Owned(model.into())),
        Set(
            Cow::Owned(upstream_header.into()),
            Cow::Owned(chat_model.into()),
        ),
    ]
}

/// A header naming the model that answered, which OpenAI sends and Codex compares with the
/// model it asked for (a difference is shown to the user as a reroute to a fallback model).
/// A translated answer names the model asked for (see [`crate::model_map`]): an upstream's
/// own is removed.
const SERVED_MODEL_HEADER: &str = "openai-model";

/// The answer's head when a stream is translated as it comes (`HeadStep::Stream`), or when a
/// stream without a body is replaced whole (an event stream [`Answer`]): a translated answer
/// is a 200 whatever 2xx the upstream chose.
pub const STREAM_HEAD_EDITS: &[HeaderEdit] = &[
    set(":status", "200"),
    set("content-type", exchange::EVENT_STREAM),
    set("cache-control", "no-cache"),
    Remove("content-length"),
    Remove(SERVED_MODEL_HEADER),
];

/// The answer's head while its body is gathered (`HeadStep::Gather`): the length changes.
pub const GATHER_HEAD_EDITS: &[HeaderEdit] =
    &[Remove("content-length"), Remove(SERVED_MODEL_HEADER)];

/// The answer's head when a translated answer replaces the upstream's whole: a stream's
/// ([`STREAM_HEAD_EDITS`]), or the answer's status (200, whatever 2xx the upstream chose),
/// type and length.
pub fn answer_edits(a: &Answer) -> Edits {
    if a.body.content_type() == exchange::EVENT_STREAM {
        return Cow::Borrowed(STREAM_HEAD_EDITS);
    }
    Cow::Owned(vec![
        Set(Cow::Borrowed(":status"), Cow::Owned(a.status.to_string())),
        set("content-type", a.body.content_type()),
        Set(
            Cow::Borrowed("content-length"),
            Cow::Owned(a.body.bytes().len().to_string()),
        ),
    ])
}
