//! The core's log lines (`responses_core::log`) as `tracing` events: one call site per level,
//! every field of a line (absent ones are left out), so that the text and the JSON formats
//! carry the same fields for every transport.
//!
//! Client strings go in as string values, cut ([`Logged::cut`]): each format quotes and
//! escapes a string value itself (the text format as `key="value"`, JSON as a JSON string),
//! so a space, `=` or a newline in a model name or a request id cannot forge a field or a line.

use std::fmt;

use responses_core::log::{Level, Line, Logged, Quoted};
use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormatFields;

/// Emits `line`; `request_id`: the client's `x-request-id` (cut like every client string).
pub fn emit(line: &Line<'_>, transport: &'static str, request_id: &str) {
    let request_id = Logged(request_id).cut();
    let model = line.model.map(Logged::cut);
    macro_rules! event {
        ($level:expr) => {
            tracing::event!(
                $level,
                transport,
                request_id = &*request_id,
                response_id = line.response_id,
                model = model.as_deref(),
                operation = line.operation,
                stream = line.stream,
                outcome = line.outcome,
                status = line.status,
                code = line.code,
                body_bytes = line.body_bytes,
                "{}",
                line.message
            )
        };
    }
    match line.level {
        Level::Debug => event!(tracing::Level::DEBUG),
        Level::Info => event!(tracing::Level::INFO),
        Level::Warn => event!(tracing::Level::WARN),
    }
}

/// The text format's fields as logfmt: `key=value`, each value written by the core's rule
/// ([`Quoted`]: escaped, and in double quotes when it holds a space, `=` or a quote), whatever
/// its type: a client string, a number, an error's message. tracing-subscriber's own text
/// format quotes string values but writes a displayed one as it is, so that an error or any
/// value written with `%` could forge a field. The message (ours) leads the line unquoted.
#[derive(Debug, Default, Clone, Copy)]
pub struct Logfmt;

impl<'writer> FormatFields<'writer> for Logfmt {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut visitor = LogfmtVisitor {
            writer,
            result: Ok(()),
            first: true,
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct LogfmtVisitor<'writer> {
    writer: Writer<'writer>,
    result: fmt::Result,
    first: bool,
}

impl LogfmtVisitor<'_> {
    fn write(&mut self, field: &Field, value: &str) {
        if self.result.is_err() || field.name().starts_with("log.") {
            return;
        }
        let separator = if std::mem::take(&mut self.first) {
            ""
        } else {
            " "
        };
        self.result = if field.name() == "message" {
            write!(self.writer, "{separator}{value}")
        } else {
            write!(self.writer, "{separator}{}={}", field.name(), Quoted(value))
        };
    }
}

impl Visit for LogfmtVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.write(field, value);
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.write(field, &format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use responses_core::exchange::UpstreamRequest;
    use responses_core::log;

    use super::*;

    /// What `f` logs through the processor's text or JSON format.
    fn logged(json: bool, f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let writer = sink.clone();
        let builder = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .without_time()
            .with_target(false);
        if json {
            tracing::subscriber::with_default(builder.json().finish(), f);
        } else {
            tracing::subscriber::with_default(builder.fmt_fields(Logfmt).finish(), f);
        }
        let out = sink.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_client_string_forges_no_field_in_either_format() {
        let request = UpstreamRequest {
            body: bytes::Bytes::from_static(b"{}"),
            model: "m outcome=forged status=299".into(),
            chat_model: "m".into(),
            stream: false,
        };
        let line = log::forwarded(None, &request);
        let text = logged(false, || emit(&line, "http", "id 1\nx=2"));
        assert_eq!(
            text,
            " INFO translated request transport=http request_id=\"id 1\\nx=2\" \
             model=\"m outcome=forged status=299\" stream=false body_bytes=2\n"
        );
        let json = logged(true, || emit(&line, "http", "id 1\nx=2"));
        let json: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
        assert_eq!(json["fields"]["model"], "m outcome=forged status=299");
        assert_eq!(json["fields"]["request_id"], "id 1\nx=2");
        assert_eq!(json["fields"].get("outcome"), None);
    }

    #[test]
    fn every_text_value_with_a_space_is_quoted_whatever_its_type() {
        let error = std::io::Error::other("refused status=1");
        let text = logged(false, || {
            tracing::warn!(error = %error, n = 3, ok = true, empty = "", "it failed");
        });
        assert_eq!(
            text,
            " WARN it failed error=\"refused status=1\" n=3 ok=true empty=\"\"\n"
        );
    }
}
