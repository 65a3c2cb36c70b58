//! The shape of a Responses request as the parser needs it: which values are read (parsed
//! into nodes in the one pass: containers, and the short strings the rules look at), and
//! which are only carried or checked (kept as the tokens they came as: texts, arguments,
//! tool schemas, the fields the request forwards). A guess that proves wrong costs a second
//! parse of that value, never a different result: a kept container is parsed when it is
//! read (`document::open`).

/// What a container holds, so that its children can be captured the right way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The request body.
    Request,
    /// `input`: its items.
    Input,
    /// An `input` item.
    Item,
    /// Content parts (`content`, `output`, `summary`).
    Parts,
    /// A content part (or a chunk of a shell call's output).
    Part,
    /// `tools`: the tools.
    Tools,
    /// A tool.
    Tool,
    /// `text`: the text parameter.
    TextParam,
    /// `text.format` (its schema is echoed).
    Format,
    /// Anything else read: every field parsed, strings decoded.
    Tree,
}

/// How a value at a position is captured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Capture {
    /// Parsed into nodes now (a container of this kind, if it is one). A string is decoded:
    /// borrowed from the body when it has no escapes, which is what short strings (types,
    /// roles, ids, names) have.
    Parse(Kind),
    /// Kept as its token (a string, a number, or a container parsed as this kind if read):
    /// texts, which have escapes and are carried over, and what is only forwarded, echoed
    /// or checked.
    Keep(Kind),
}

/// How the value of `key` in an object of `kind` is captured.
pub(crate) fn child(kind: Kind, key: &str) -> Capture {
    use Capture::{Keep, Parse};
    match (kind, key) {
        (Kind::Request, "input") => Parse(Kind::Input),
        (Kind::Request | Kind::Item | Kind::Tool, "tools") => Parse(Kind::Tools),
        (Kind::Request, "text") => Parse(Kind::TextParam),
        // The fields with rules of their own read as flags, short strings and objects.
        (
            Kind::Request,
            "model"
            | "stream"
            | "store"
            | "background"
            | "previous_response_id"
            | "reasoning"
            | "tool_choice"
            | "stream_options"
            | "include"
            | "parallel_tool_calls"
            | "prompt_cache_retention",
        ) => Parse(Kind::Tree),
        // The instructions, the metadata, every field the request forwards, and the plain
        // fields of the table (`translate::request::params`): a number, flag or string kept
        // as its token reads as the same value.
        (Kind::Request, _) => Keep(Kind::Tree),
        // Content arrays are read part by part (agents send parts; a string is decoded). A
        // tool's output is usually a string: kept, and parsed if it is an array.
        (Kind::Item, "content" | "summary") => Parse(Kind::Parts),
        (Kind::Item, "output") => Keep(Kind::Parts),
        (Kind::Item, "arguments" | "input" | "encrypted_content" | "metadata")
        | (Kind::Item, "parsed_arguments") => Keep(Kind::Tree),
        (
            Kind::Part,
            "text" | "refusal" | "image_url" | "file_data" | "file_url" | "video_url" | "stdout"
            | "stderr" | "logprobs" | "parsed",
        ) => Keep(Kind::Tree),
        (Kind::Tool, "parameters" | "output_schema" | "description") => Keep(Kind::Tree),
        (Kind::TextParam, "format") => Parse(Kind::Format),
        (Kind::Format, "schema" | "description") => Keep(Kind::Tree),
        _ => Parse(Kind::Tree),
    }
}

/// How the elements of an array of `kind` are captured.
pub(crate) fn element(kind: Kind) -> Capture {
    match kind {
        Kind::Input => Capture::Parse(Kind::Item),
        Kind::Parts => Capture::Parse(Kind::Part),
        Kind::Tools => Capture::Parse(Kind::Tool),
        _ => Capture::Parse(Kind::Tree),
    }
}
