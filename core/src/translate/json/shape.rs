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
        // The fields read as numbers, flags and short strings.
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
            | "temperature"
            | "top_p"
            | "presence_penalty"
            | "frequency_penalty"
            | "max_output_tokens"
            | "max_tool_calls"
            | "top_logprobs"
            | "parallel_tool_calls"
            | "truncation"
            | "service_tier"
            | "prompt_cache_key"
            | "prompt_cache_retention"
            | "safety_identifier"
            | "user",
        ) => Parse(Kind::Tree),
        // The instructions, the metadata, and every field the request forwards.
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
