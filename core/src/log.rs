//! The log lines of an exchange's life, written once for every adapter: which line, at which
//! level, with which fields. The processor emits each as one `tracing` event with these fields
//! (text or JSON), the module as one Envoy log line (`message key=value ...`), so both modes
//! log alike.
//!
//! Client strings in them (the model, the request id) are escaped, quoted and cut
//! ([`Logged`]): a newline cannot forge a line, a space or `=` cannot forge a field
//! (`model="m outcome=forged"`), a 16 MiB model name cannot write a 16 MiB line. Prompts and
//! completions are never among the fields.

use std::borrow::Cow;
use std::fmt;

use crate::call::Call;
use crate::exchange::{ErrorReply, Summary, UpstreamRequest};
use crate::life::Finished;
use crate::openresponses::Code;

/// The most bytes of one client string in a log line (then `…` and its length).
pub const MAX_LOGGED_BYTES: usize = 256;

/// A line's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Debug,
    Info,
    Warn,
}

/// A client's string as it goes into a log line of `key=value` fields: at most
/// [`MAX_LOGGED_BYTES`] of it (then `… (N bytes)`), written as a [`Quoted`] value.
#[derive(Debug, Clone, Copy)]
pub struct Logged<'a>(pub &'a str);

impl<'a> Logged<'a> {
    /// The string cut to [`MAX_LOGGED_BYTES`] (and its length said), neither escaped nor
    /// quoted: for structured logs, whose format quotes and escapes each value itself.
    pub fn cut(self) -> Cow<'a, str> {
        let s = self.0;
        let mut cut = s.len().min(MAX_LOGGED_BYTES);
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        if cut == s.len() {
            Cow::Borrowed(s)
        } else {
            Cow::Owned(format!("{}… ({} bytes)", &s[..cut], s.len()))
        }
    }
}

impl fmt::Display for Logged<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        Quoted(&self.cut()).fmt(f)
    }
}

/// A value of a `key=value` log line, written so that it reads as one value (logfmt's rule):
/// control characters, quotes and backslashes escaped as in Rust's `escape_debug` (`\n`,
/// `\u{1b}`), and the whole in double quotes when it holds a space, `=` or a quote, or is
/// empty. So a newline cannot forge a line, nor a space or `=` a field
/// (`model="m outcome=forged"`).
#[derive(Debug, Clone, Copy)]
pub struct Quoted<'a>(pub &'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        let quoted = s.is_empty() || s.contains([' ', '=', '"']);
        if quoted {
            f.write_str("\"")?;
        }
        for c in s.chars() {
            if c.is_control() || c == '"' || c == '\\' {
                write!(f, "{}", c.escape_debug())?;
            } else {
                f.write_fmt(format_args!("{c}"))?;
            }
        }
        if quoted {
            f.write_str("\"")?;
        }
        Ok(())
    }
}

/// One line: its message and the fields it has (absent ones are not written).
#[derive(Debug, Clone)]
pub struct Line<'a> {
    pub level: Level,
    pub message: &'static str,
    pub response_id: Option<&'a str>,
    pub model: Option<Logged<'a>>,
    pub operation: Option<&'static str>,
    pub stream: Option<bool>,
    pub outcome: Option<&'static str>,
    pub status: Option<u16>,
    pub code: Option<&'a str>,
    pub body_bytes: Option<usize>,
}

impl<'a> Line<'a> {
    fn new(level: Level, message: &'static str) -> Line<'a> {
        Line {
            level,
            message,
            response_id: None,
            model: None,
            operation: None,
            stream: None,
            outcome: None,
            status: None,
            code: None,
            body_bytes: None,
        }
    }
}

/// The translated request goes upstream.
pub fn forwarded<'a>(summary: Option<&'a Summary>, request: &'a UpstreamRequest) -> Line<'a> {
    Line {
        response_id: summary.and_then(|s| s.response_id.as_deref()),
        model: Some(Logged(&request.model)),
        stream: Some(request.stream),
        body_bytes: Some(request.body.len()),
        ..Line::new(Level::Info, "translated request")
    }
}

/// The translated request goes upstream as a call of the core's own (a WebSocket
/// connection's response).
pub fn called<'a>(summary: Option<&'a Summary>, call: &'a Call) -> Line<'a> {
    Line {
        response_id: summary.and_then(|s| s.response_id.as_deref()),
        model: Some(Logged(&call.model)),
        stream: Some(true),
        body_bytes: Some(call.body.len()),
        ..Line::new(Level::Info, "translated request")
    }
}

/// The client is answered with an error envelope: its request refused (`request`), or the
/// upstream's answer replaced.
pub fn replied<'a>(error: &'a ErrorReply, request: bool) -> Line<'a> {
    let code = error.error.code.as_ref().map(Code::as_str);
    let (level, message) = if request {
        (Level::Info, "rejected request")
    } else {
        (Level::Warn, "answered with an error envelope")
    };
    Line {
        status: Some(error.status()),
        code,
        ..Line::new(level, message)
    }
}

/// A message on a WebSocket connection refused before it became a response.
pub fn refused_message<'a>(status: u16, code: Option<&'a Code>) -> Line<'a> {
    Line {
        status: Some(status),
        code: code.map(Code::as_str),
        ..Line::new(Level::Info, "rejected message")
    }
}

/// The exchange ended, or the host ended it first.
pub fn finished<'a>(f: &'a Finished) -> Line<'a> {
    if f.cut {
        return Line::new(
            Level::Info,
            "exchange ended by Envoy before its answer was complete (client disconnected, upstream reset or timeout)",
        );
    }
    let s = &f.summary;
    Line {
        response_id: s.response_id.as_deref(),
        model: s.model.as_deref().map(Logged),
        operation: Some(s.operation.as_str()),
        stream: Some(s.stream),
        outcome: Some(s.outcome.as_str()),
        status: s.status,
        code: s.error_code.as_ref().map(Code::as_str),
        ..Line::new(Level::Info, "answer translated")
    }
}

/// `message key=value ...`, for hosts whose logs are plain text (Envoy's).
impl fmt::Display for Line<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message)?;
        if let Some(v) = self.response_id {
            write!(f, " response_id={}", Logged(v))?;
        }
        if let Some(v) = self.model {
            write!(f, " model={v}")?;
        }
        if let Some(v) = self.operation {
            write!(f, " operation={v}")?;
        }
        if let Some(v) = self.stream {
            write!(f, " stream={v}")?;
        }
        if let Some(v) = self.outcome {
            write!(f, " outcome={v}")?;
        }
        if let Some(v) = self.status {
            write!(f, " status={v}")?;
        }
        if let Some(v) = self.code {
            write!(f, " code={v}")?;
        }
        if let Some(v) = self.body_bytes {
            write!(f, " body_bytes={v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_strings_cannot_forge_or_flood_a_line() {
        assert_eq!(Logged("m").to_string(), "m");
        assert_eq!(Logged("gpt-4o:v1.2/x_y").to_string(), "gpt-4o:v1.2/x_y");
        assert_eq!(
            Logged("m\nx-evil:1\r\u{0}\\").to_string(),
            "m\\nx-evil:1\\r\\0\\\\"
        );
        let huge = "é".repeat(1 << 20);
        let logged = Logged(&huge).to_string();
        assert!(logged.len() < MAX_LOGGED_BYTES + 32, "{}", logged.len());
        assert!(logged.ends_with(&format!("… ({} bytes)\"", huge.len())));
        assert!(!logged.contains('\n'));
        assert_eq!(
            Logged(&huge).cut(),
            format!(
                "{}… ({} bytes)",
                "é".repeat(MAX_LOGGED_BYTES / 2),
                huge.len()
            )
        );
        assert!(matches!(Logged("m x").cut(), Cow::Borrowed("m x")));
    }

    #[test]
    fn a_space_an_equals_sign_or_a_quote_cannot_forge_a_field() {
        assert_eq!(
            Logged("m outcome=forged status=299").to_string(),
            "\"m outcome=forged status=299\""
        );
        assert_eq!(Logged("a=b").to_string(), "\"a=b\"");
        assert_eq!(Logged("say \"hi\"").to_string(), "\"say \\\"hi\\\"\"");
        assert_eq!(Logged("\"").to_string(), "\"\\\"\"");
        assert_eq!(Logged("").to_string(), "\"\"");
        // Every field of a line, read back as logfmt does: the model is one value.
        let request = UpstreamRequest {
            body: bytes::Bytes::from_static(b"{}"),
            model: "m outcome=forged status=299 x=\"y".into(),
            chat_model: "m".into(),
            stream: false,
        };
        let line = forwarded(None, &request).to_string();
        assert_eq!(
            line,
            "translated request model=\"m outcome=forged status=299 x=\\\"y\" stream=false \
             body_bytes=2"
        );
        assert_eq!(
            logfmt_keys(&line),
            ["model", "stream", "body_bytes"],
            "{line}"
        );
    }

    /// The keys of a `message key=value ...` line, read as logfmt readers do: a value in
    /// double quotes runs to the next unescaped quote.
    fn logfmt_keys(line: &str) -> Vec<String> {
        let mut keys = Vec::new();
        let mut rest = line;
        while let Some(eq) = rest.find('=') {
            let key = rest[..eq].rsplit(' ').next().unwrap_or_default();
            keys.push(key.to_owned());
            let value = &rest[eq + 1..];
            rest = if let Some(quoted) = value.strip_prefix('"') {
                let mut escaped = false;
                let end = quoted
                    .char_indices()
                    .find(|&(_, c)| {
                        let end = c == '"' && !escaped;
                        escaped = c == '\\' && !escaped;
                        end
                    })
                    .map(|(i, _)| i + 1)
                    .expect("a closing quote");
                &quoted[end..]
            } else {
                value.find(' ').map_or("", |space| &value[space..])
            };
        }
        keys
    }

    #[test]
    fn a_line_is_its_message_and_the_fields_it_has() {
        let request = UpstreamRequest {
            body: bytes::Bytes::from_static(b"{}"),
            model: "gpt\nfake=1".into(),
            chat_model: "gpt\nfake=1".into(),
            stream: true,
        };
        assert_eq!(
            forwarded(None, &request).to_string(),
            "translated request model=\"gpt\\nfake=1\" stream=true body_bytes=2"
        );
    }
}
