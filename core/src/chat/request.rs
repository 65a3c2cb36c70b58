//! The Chat request we send, typed: what the translation builds is what is sent, and the
//! rules that look at messages again (merging leading system messages, adding a tool call to
//! the assistant turn before it) match on variants instead of reading JSON back.
//!
//! Texts borrow from the client's body ([`Text`]): a string the client sent is written out as
//! the JSON token it came as, escapes and all, so a request costs a copy of what carries over
//! rather than a decoding and an encoding of every text. The body is written straight into
//! one buffer ([`Request::encode`]).

use std::borrow::Cow;

use serde::Serialize;
use serde_json::value::RawValue;

/// A Chat Completions request, as sent upstream. The fields the translation sets are typed;
/// `extra` carries the client's fields outside the Responses API (vLLM's `top_k`,
/// `chat_template_kwargs`, ...), forwarded verbatim, but never in place of one set here.
#[derive(Debug, Default)]
pub struct Request<'a> {
    pub model: Text<'a>,
    /// Chat messages (system, user, assistant with tool calls, tool).
    pub messages: Vec<Message<'a>>,
    pub tools: Vec<Tool<'a>>,
    pub tool_choice: Option<ToolChoice<'a>>,
    pub parallel_tool_calls: Option<bool>,
    /// The request's plain parameters, by Chat key, in the order the translation's table of
    /// fields lists them (`max_completion_tokens`, the sampling parameters, ...).
    pub params: Vec<(&'static str, Param<'a>)>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u64>,
    pub response_format: Option<ResponseFormat<'a>>,
    pub verbosity: Option<&'static str>,
    pub reasoning_effort: Option<Text<'a>>,
    pub user: Option<Text<'a>>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub extra: Extra<'a>,
}

/// A plain parameter's value, as sent.
#[derive(Debug, Clone, PartialEq)]
pub enum Param<'a> {
    Bool(bool),
    Number(f64),
    Integer(u64),
    Name(&'static str),
    Text(Text<'a>),
}

/// The client's other fields, by name, as they came.
pub type Extra<'a> = Vec<(Cow<'a, str>, Cow<'a, RawValue>)>;

#[derive(Debug, Clone, Copy, Serialize)]
pub struct StreamOptions {
    /// Usage arrives in a trailing chunk only when asked for.
    pub include_usage: bool,
}

/// A JSON string made of pieces: most often one, the client's own token.
#[derive(Debug, Clone, PartialEq)]
pub enum Text<'a> {
    One(Piece<'a>),
    Many(Vec<Piece<'a>>),
}

/// A piece of a [`Text`].
#[derive(Debug, Clone, PartialEq)]
pub enum Piece<'a> {
    /// Text as a JSON string holds it, escapes included (written as is).
    Json(&'a str),
    /// Plain text (escaped when written).
    Plain(Cow<'a, str>),
}

impl Default for Text<'_> {
    fn default() -> Self {
        Text::One(Piece::Plain(Cow::Borrowed("")))
    }
}

impl<'a> Text<'a> {
    pub fn plain(text: impl Into<Cow<'a, str>>) -> Self {
        Text::One(Piece::Plain(text.into()))
    }

    /// The length of the text in bytes (escapes decoded): a scan of its JSON pieces.
    pub fn len(&self) -> usize {
        self.pieces().iter().map(Piece::len).sum()
    }

    /// At least [`Text::len`], known without a scan.
    pub fn len_bound(&self) -> usize {
        self.pieces().iter().map(Piece::len_bound).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len_bound() == 0
    }

    fn pieces(&self) -> &[Piece<'a>] {
        match self {
            Text::One(p) => std::slice::from_ref(p),
            Text::Many(ps) => ps,
        }
    }

    /// Appends `more` to this text.
    pub fn push(&mut self, more: Text<'a>) {
        let mut pieces = match std::mem::take(self) {
            Text::One(p) => vec![p],
            Text::Many(ps) => ps,
        };
        match more {
            Text::One(p) => pieces.push(p),
            Text::Many(ps) => pieces.extend(ps),
        }
        *self = Text::Many(pieces);
    }

    pub fn push_plain(&mut self, text: &'static str) {
        self.push(Text::plain(text));
    }

    /// The text, decoded (for the few rules that read it: a compaction's summary).
    pub fn to_plain(&self) -> String {
        let mut s = String::with_capacity(self.len());
        for piece in self.pieces() {
            match piece {
                Piece::Json(text) => {
                    let quoted = format!("\"{text}\"");
                    s.push_str(&serde_json::from_str::<String>(&quoted).unwrap_or_default());
                }
                Piece::Plain(t) => s.push_str(t),
            }
        }
        s
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.push(b'"');
        for piece in self.pieces() {
            match piece {
                Piece::Json(text) => out.extend_from_slice(text.as_bytes()),
                Piece::Plain(t) => escape(t, out),
            }
        }
        out.push(b'"');
    }
}

impl Piece<'_> {
    fn len(&self) -> usize {
        match self {
            Piece::Json(text) => unescaped_len(text),
            Piece::Plain(t) => t.len(),
        }
    }

    fn len_bound(&self) -> usize {
        match self {
            Piece::Json(text) => text.len(),
            Piece::Plain(t) => t.len(),
        }
    }
}

/// The length of the text a JSON string's contents stand for (`text` as between the quotes,
/// escapes checked): each escape is shorter decoded than written.
pub(crate) fn unescaped_len(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut len = bytes.len();
    let mut at = 0;
    while let Some(i) = memchr::memchr(b'\\', &bytes[at..]) {
        let i = at + i;
        if bytes.get(i + 1) != Some(&b'u') {
            len -= 1;
            at = i + 2;
            continue;
        }
        let unit = bytes
            .get(i + 2..i + 6)
            .and_then(|d| std::str::from_utf8(d).ok())
            .and_then(|d| u16::from_str_radix(d, 16).ok())
            .unwrap_or(0);
        if (0xD800..=0xDBFF).contains(&unit) {
            // A pair: twelve bytes written, one four-byte character.
            len -= 8;
            at = i + 12;
        } else {
            len -= 6 - match unit {
                0..=0x7F => 1,
                0x80..=0x7FF => 2,
                _ => 3,
            };
            at = i + 6;
        }
    }
    len
}

/// One Chat message. `role` comes first; the fields follow in the order Chat servers show them.
#[derive(Debug, Clone, PartialEq)]
pub enum Message<'a> {
    System {
        content: Text<'a>,
    },
    /// What `developer` input and `instructions` become with `--developer-role developer`.
    Developer {
        content: Text<'a>,
    },
    User {
        content: Content<'a>,
    },
    Assistant(Assistant<'a>),
    Tool {
        tool_call_id: Text<'a>,
        content: Text<'a>,
    },
}

/// An assistant turn of the history: text, a refusal, tool calls, and the reasoning that
/// preceded it (`reasoning_content`, the name vLLM and llama.cpp read back).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Assistant<'a> {
    /// `null` when the turn is only tool calls.
    pub content: Option<Text<'a>>,
    pub refusal: Option<Text<'a>>,
    pub tool_calls: Vec<ToolCall<'a>>,
    pub reasoning_content: Option<Text<'a>>,
}

/// A user message's content: a string, or parts (text, images, files, video).
#[derive(Debug, Clone, PartialEq)]
pub enum Content<'a> {
    Text(Text<'a>),
    Parts(Vec<Part<'a>>),
}

#[derive(Debug, Clone, PartialEq)]
pub enum Part<'a> {
    Text {
        text: Text<'a>,
    },
    ImageUrl {
        url: Text<'a>,
        detail: Option<&'static str>,
    },
    /// Inline file data or a URL (exactly one), and its name.
    File {
        file_data: Option<Text<'a>>,
        file_url: Option<Text<'a>>,
        filename: Option<Text<'a>>,
    },
    VideoUrl {
        url: Text<'a>,
    },
}

/// A tool call of an assistant turn (always a function call on the Chat side).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall<'a> {
    pub id: Text<'a>,
    pub name: Text<'a>,
    /// JSON text, as the model wrote it.
    pub arguments: Text<'a>,
}

impl<'a> Message<'a> {
    /// The text of a system or developer message.
    pub fn system_text(&self) -> Option<&Text<'a>> {
        match self {
            Message::System { content } | Message::Developer { content } => Some(content),
            _ => None,
        }
    }
}

/// A tool offered to the model: always a function on the Chat side (custom and namespaced
/// tools are mapped to functions).
#[derive(Debug, Clone)]
pub struct Tool<'a> {
    pub name: Cow<'a, str>,
    pub description: Option<Text<'a>>,
    /// JSON Schema, passed through as the client wrote it.
    pub parameters: Option<Cow<'a, RawValue>>,
    pub strict: Option<bool>,
}

/// `tool_choice`: a mode, or one function.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice<'a> {
    /// `auto`, `none` or `required`.
    Mode(&'static str),
    Function(Cow<'a, str>),
}

/// `response_format`.
#[derive(Debug, Clone)]
pub enum ResponseFormat<'a> {
    JsonObject,
    JsonSchema {
        name: Text<'a>,
        description: Option<Text<'a>>,
        schema: Cow<'a, RawValue>,
        strict: Option<bool>,
    },
}

impl<'a> Request<'a> {
    /// A plain parameter's value, by Chat key.
    pub fn param(&self, key: &str) -> Option<&Param<'a>> {
        self.params.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The JSON body, written into one buffer of about `size_hint` bytes. An `extra` field
    /// named like one set here is dropped: ours win (the client's `messages`, say, would
    /// otherwise appear twice).
    pub fn encode(&self, size_hint: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(size_hint);
        let mut o = Object::open(&mut out);
        self.model.write(o.key("model"));
        let messages = o.key("messages");
        messages.push(b'[');
        for (i, m) in self.messages.iter().enumerate() {
            if i > 0 {
                messages.push(b',');
            }
            m.write(messages);
        }
        messages.push(b']');
        if !self.tools.is_empty() {
            let tools = o.key("tools");
            tools.push(b'[');
            for (i, t) in self.tools.iter().enumerate() {
                if i > 0 {
                    tools.push(b',');
                }
                t.write(tools);
            }
            tools.push(b']');
        }
        if let Some(c) = &self.tool_choice {
            c.write(o.key("tool_choice"));
        }
        o.option("parallel_tool_calls", &self.parallel_tool_calls);
        for (key, value) in &self.params {
            match value {
                Param::Bool(b) => o.option(key, &Some(b)),
                Param::Number(x) => o.option(key, &Some(x)),
                Param::Integer(n) => o.option(key, &Some(n)),
                Param::Name(name) => o.name(key, name),
                Param::Text(text) => text.write(o.key(key)),
            }
        }
        o.option("logprobs", &self.logprobs);
        o.option("top_logprobs", &self.top_logprobs);
        if let Some(f) = &self.response_format {
            f.write(o.key("response_format"));
        }
        if let Some(v) = self.verbosity {
            o.name("verbosity", v);
        }
        if let Some(e) = &self.reasoning_effort {
            e.write(o.key("reasoning_effort"));
        }
        if let Some(u) = &self.user {
            u.write(o.key("user"));
        }
        o.option("stream", &self.stream);
        o.option("stream_options", &self.stream_options);
        let set = [
            ("model", true),
            ("messages", true),
            ("tools", !self.tools.is_empty()),
            ("tool_choice", self.tool_choice.is_some()),
            ("parallel_tool_calls", self.parallel_tool_calls.is_some()),
            ("logprobs", self.logprobs.is_some()),
            ("top_logprobs", self.top_logprobs.is_some()),
            ("response_format", self.response_format.is_some()),
            ("verbosity", self.verbosity.is_some()),
            ("reasoning_effort", self.reasoning_effort.is_some()),
            ("user", self.user.is_some()),
            ("stream", self.stream.is_some()),
            ("stream_options", self.stream_options.is_some()),
        ];
        for (key, value) in &self.extra {
            if set.iter().any(|(name, is_set)| *is_set && name == key)
                || self.params.iter().any(|(name, _)| name == key)
            {
                continue;
            }
            o.any_key(key).extend_from_slice(value.get().as_bytes());
        }
        o.close();
        out
    }
}

impl Message<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        match self {
            Message::System { content } | Message::Developer { content } => {
                let role = if matches!(self, Message::System { .. }) {
                    "system"
                } else {
                    "developer"
                };
                o.name("role", role);
                content.write(o.key("content"));
            }
            Message::User { content } => {
                o.name("role", "user");
                let out = o.key("content");
                match content {
                    Content::Text(t) => t.write(out),
                    Content::Parts(parts) => {
                        out.push(b'[');
                        for (i, p) in parts.iter().enumerate() {
                            if i > 0 {
                                out.push(b',');
                            }
                            p.write(out);
                        }
                        out.push(b']');
                    }
                }
            }
            Message::Assistant(turn) => {
                o.name("role", "assistant");
                match &turn.content {
                    Some(t) => t.write(o.key("content")),
                    None => o.key("content").extend_from_slice(b"null"),
                }
                if let Some(r) = &turn.refusal {
                    r.write(o.key("refusal"));
                }
                if !turn.tool_calls.is_empty() {
                    let out = o.key("tool_calls");
                    out.push(b'[');
                    for (i, call) in turn.tool_calls.iter().enumerate() {
                        if i > 0 {
                            out.push(b',');
                        }
                        let mut c = Object::open(out);
                        call.id.write(c.key("id"));
                        c.name("type", "function");
                        let mut f = Object::open(c.key("function"));
                        call.name.write(f.key("name"));
                        call.arguments.write(f.key("arguments"));
                        f.close();
                        c.close();
                    }
                    out.push(b']');
                }
                if let Some(r) = &turn.reasoning_content {
                    r.write(o.key("reasoning_content"));
                }
            }
            Message::Tool {
                tool_call_id,
                content,
            } => {
                o.name("role", "tool");
                tool_call_id.write(o.key("tool_call_id"));
                content.write(o.key("content"));
            }
        }
        o.close();
    }
}

impl Part<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        match self {
            Part::Text { text } => {
                o.name("type", "text");
                text.write(o.key("text"));
            }
            Part::ImageUrl { url, detail } => {
                o.name("type", "image_url");
                let mut i = Object::open(o.key("image_url"));
                url.write(i.key("url"));
                if let Some(d) = detail {
                    i.name("detail", d);
                }
                i.close();
            }
            Part::File {
                file_data,
                file_url,
                filename,
            } => {
                o.name("type", "file");
                let mut f = Object::open(o.key("file"));
                for (key, value) in [
                    ("file_data", file_data),
                    ("file_url", file_url),
                    ("filename", filename),
                ] {
                    if let Some(v) = value {
                        v.write(f.key(key));
                    }
                }
                f.close();
            }
            Part::VideoUrl { url } => {
                o.name("type", "video_url");
                let mut v = Object::open(o.key("video_url"));
                url.write(v.key("url"));
                v.close();
            }
        }
        o.close();
    }
}

impl Tool<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        o.name("type", "function");
        let mut f = Object::open(o.key("function"));
        f.option("name", &Some(&self.name));
        if let Some(d) = &self.description {
            d.write(f.key("description"));
        }
        if let Some(p) = &self.parameters {
            f.key("parameters").extend_from_slice(p.get().as_bytes());
        }
        f.option("strict", &self.strict);
        f.close();
        o.close();
    }
}

impl ToolChoice<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        match self {
            ToolChoice::Mode(mode) => {
                out.push(b'"');
                out.extend_from_slice(mode.as_bytes());
                out.push(b'"');
            }
            ToolChoice::Function(name) => {
                let mut o = Object::open(out);
                o.name("type", "function");
                let mut f = Object::open(o.key("function"));
                f.option("name", &Some(name));
                f.close();
                o.close();
            }
        }
    }
}

impl ResponseFormat<'_> {
    fn write(&self, out: &mut Vec<u8>) {
        let mut o = Object::open(out);
        match self {
            ResponseFormat::JsonObject => o.name("type", "json_object"),
            ResponseFormat::JsonSchema {
                name,
                description,
                schema,
                strict,
            } => {
                o.name("type", "json_schema");
                let mut s = Object::open(o.key("json_schema"));
                name.write(s.key("name"));
                if let Some(d) = description {
                    d.write(s.key("description"));
                }
                s.key("schema").extend_from_slice(schema.get().as_bytes());
                s.option("strict", strict);
                s.close();
            }
        }
        o.close();
    }
}

/// An object being written: `{`, then `"key":value` pairs with commas between them.
struct Object<'o> {
    out: &'o mut Vec<u8>,
    first: bool,
}

impl<'o> Object<'o> {
    fn open(out: &'o mut Vec<u8>) -> Self {
        out.push(b'{');
        Object { out, first: true }
    }

    /// Starts the pair of `key` (a name that needs no escaping); the value follows.
    fn key(&mut self, key: &'static str) -> &mut Vec<u8> {
        self.comma();
        self.out.push(b'"');
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
        self.out
    }

    /// Starts the pair of any key.
    fn any_key(&mut self, key: &str) -> &mut Vec<u8> {
        self.comma();
        self.out.push(b'"');
        escape(key, self.out);
        self.out.extend_from_slice(b"\":");
        self.out
    }

    /// The pair of `key` and a name that needs no escaping.
    fn name(&mut self, key: &'static str, value: &'static str) {
        let out = self.key(key);
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    }

    /// The pair of `key`, if there is a value.
    fn option<T: Serialize>(&mut self, key: &'static str, value: &Option<T>) {
        if let Some(v) = value {
            json(self.key(key), v);
        }
    }

    fn comma(&mut self) {
        if !std::mem::take(&mut self.first) {
            self.out.push(b',');
        }
    }

    fn close(self) {
        self.out.push(b'}');
    }
}

/// A small value (a number, a flag, a name) as serde_json writes it.
fn json<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) {
    // Into memory, values that are never maps with non-string keys: cannot fail.
    let _ = serde_json::to_writer(out, value);
}

/// Writes `text` as the contents of a JSON string, escaped as serde_json escapes it.
fn escape(text: &str, out: &mut Vec<u8>) {
    let bytes = text.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x08 => b"\\b",
            0x0c => b"\\f",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        start = i + 1;
        if short.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(short);
        }
    }
    out.extend_from_slice(&bytes[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn raw(text: &str) -> Cow<'static, RawValue> {
        Cow::Owned(RawValue::from_string(text.to_owned()).unwrap())
    }

    #[test]
    fn extra_fields_ride_along_but_never_replace_ours() {
        let request = Request {
            model: Text::plain("m"),
            messages: vec![Message::User {
                content: Content::Text(Text::plain("hi")),
            }],
            stream: Some(true),
            stream_options: Some(StreamOptions {
                include_usage: true,
            }),
            extra: vec![
                ("top_k".into(), raw("20")),
                ("messages".into(), raw("\"not ours\"")),
                ("stream_options".into(), raw(r#"{"include_usage": false}"#)),
                ("user".into(), raw("\"client-user\"")),
            ],
            ..Request::default()
        };
        let body: Value = serde_json::from_slice(&request.encode(0)).unwrap();
        assert_eq!(
            body,
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                   "stream": true, "stream_options": {"include_usage": true},
                   // Not set by us: the client's fields pass.
                   "top_k": 20, "user": "client-user"})
        );
    }

    #[test]
    fn plain_text_is_escaped_as_serde_json_escapes_it() {
        let all: String = (0u8..=0x7f)
            .map(char::from)
            .chain(['é', '€', '😀'])
            .collect();
        let mut out = Vec::new();
        Text::plain(all.as_str()).write(&mut out);
        assert_eq!(out, serde_json::to_vec(&all).unwrap());
    }

    #[test]
    fn pieces_join_into_one_string() {
        let mut text = Text::One(Piece::Json(r#"a \"quoted\"\n"#));
        text.push_plain("\n\n");
        text.push(Text::plain("tab\there"));
        assert_eq!(text.len(), 11 + 2 + 8);
        let mut out = Vec::new();
        text.write(&mut out);
        let decoded: String = serde_json::from_slice(&out).unwrap();
        assert_eq!(decoded, "a \"quoted\"\n\n\ntab\there");
        assert_eq!(text.to_plain(), decoded);
    }
}
