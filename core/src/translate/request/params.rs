//! The request's top-level fields as a table, one entry each: its name, how its value is
//! checked, where it goes in the Chat request and how the response echoes it.
//!
//! The table is in the order the fields are checked (a request's first error is the one it
//! gets back). A plain field (a number, an integer, a name, a string) is read, mapped and
//! echoed by its entry alone: adding one is one entry here, plus its tests. Its value goes
//! into the Chat request under a Chat key ([`Sent::As`]: in the table's order, after
//! `parallel_tool_calls`; telemetry reads the GenAI conventions' parameters there, by key,
//! `translate::Params`), or into a typed field the translation also sets by rules of its own
//! ([`Sent::Set`]). The response echoes it under its name after its other keys
//! ([`Echoed::As`], with a default), or in the typed field the response object's schema gives
//! it ([`Echoed::Set`]). The body reader keeps a plain field as its token, which reads as the
//! same number, flag or string (`translate::json::shape` lists only fields with rules of
//! their own). The fields with rules of their own (`input`, `tools`, `text`, ...) are entries
//! marked [`Check::Own`]: the translation reads them where their entry stands
//! ([`Params::read_until`]).

use super::text;
use crate::chat;
use crate::chat::request::Param;
use crate::openresponses::{ApiError, Echo, Scalar};
use crate::translate::fields::{bad_value, Obj};
use crate::translate::json::document::Str;

/// One top-level field of the request.
pub(crate) struct Field {
    pub name: &'static str,
    pub check: Check,
    pub sent: Sent,
    pub echoed: Echoed,
}

/// How a field's value is checked.
pub(crate) enum Check {
    /// A number within `[min, max]`.
    Number { min: f64, max: f64 },
    /// An integer within `[min, max]`.
    Integer { min: u64, max: u64 },
    /// One of these strings.
    OneOf(&'static [&'static str]),
    /// A string of at most this many characters (`None`: any).
    Text(Option<usize>),
    /// By rules of its own, in `translate::request` (with `sent` and `echoed` [`Sent::Own`] and
    /// [`Echoed::Own`]).
    Own,
}

/// Where a plain field goes in the Chat request.
pub(crate) enum Sent {
    /// Nowhere: it is only checked (and echoed).
    No,
    /// As this Chat key, its value as it came (in [`chat::Request::params`], in the table's
    /// order).
    As(&'static str),
    /// Into a field of the typed Chat request: one the translation also sets by rules of its
    /// own, or whose place in the body is its own.
    Set(for<'a> fn(&mut chat::Request<'a>, &Value<'a>)),
    /// By the translation's own rules, from its value ([`Params::get`]).
    Own,
}

/// How the response echoes a plain field.
pub(crate) enum Echoed {
    /// Not at all.
    No,
    /// Under its name: its value, or this default when the request has none (the way of a
    /// new field: no entry needs it today, the tests rehearse it).
    #[cfg_attr(not(test), allow(dead_code))]
    As(Scalar),
    /// Into a typed field of [`Echo`] (the response object's keys before those of `As`, in
    /// their own order).
    Set(fn(&mut Echo, &Value<'_>)),
    /// By the translation's own rules.
    Own,
}

/// A plain field's value, as read and checked.
#[derive(Debug, Clone)]
pub(crate) enum Value<'a> {
    Number(f64),
    Integer(u64),
    Name(&'static str),
    Text(Str<'a>),
}

impl<'a> Value<'a> {
    fn chat(&self) -> Param<'a> {
        match self {
            Value::Number(x) => Param::Number(*x),
            Value::Integer(n) => Param::Integer(*n),
            Value::Name(s) => Param::Name(s),
            Value::Text(s) => Param::Text(text(s.clone())),
        }
    }

    fn echoed(&self) -> Scalar {
        match self {
            Value::Number(x) => Scalar::Number(*x),
            Value::Integer(n) => Scalar::Integer(*n),
            Value::Name(s) => Scalar::Name(s),
            Value::Text(s) => Scalar::Text(s.as_str().into_owned()),
        }
    }

    fn number(&self) -> f64 {
        match self {
            Value::Number(x) => *x,
            Value::Integer(n) => *n as f64,
            _ => 0.0,
        }
    }

    pub fn integer(&self) -> Option<u64> {
        match self {
            Value::Integer(n) => Some(*n),
            _ => None,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Value::Name(s) => s,
            _ => "",
        }
    }

    fn owned_text(&self) -> String {
        match self {
            Value::Text(s) => s.as_str().into_owned(),
            _ => String::new(),
        }
    }

    fn text(&self) -> Option<chat::request::Text<'a>> {
        match self {
            Value::Text(s) => Some(text(s.clone())),
            _ => None,
        }
    }
}

/// A field with rules of its own.
const fn own(name: &'static str) -> Field {
    Field {
        name,
        check: Check::Own,
        sent: Sent::Own,
        echoed: Echoed::Own,
    }
}

/// A sampling parameter: a number within `[min, max]`, sent as the Chat key of its name
/// (telemetry reads it there) and echoed into the response's field of its name.
macro_rules! sampling {
    ($name:ident, $min:expr, $max:expr) => {
        Field {
            name: stringify!($name),
            check: Check::Number {
                min: $min,
                max: $max,
            },
            sent: Sent::As(stringify!($name)),
            echoed: Echoed::Set(|e, v| e.$name = v.number()),
        }
    };
}

/// The request's top-level fields, in the order they are checked.
pub(crate) const FIELDS: &[Field] = &[
    own("previous_response_id"),
    own("background"),
    own("conversation"),
    own("prompt"),
    own("client_metadata"),
    own("prompt_cache_retention"),
    own("prompt_cache_options"),
    own("access_programs"),
    own("background_options"),
    own("context_management"),
    own("image"),
    own("moderation"),
    own("model"),
    own("stream"),
    own("store"),
    own("stream_options"),
    own("instructions"),
    own("input"),
    own("tools"),
    own("tool_choice"),
    own("parallel_tool_calls"),
    Field {
        name: "max_tool_calls",
        check: Check::Integer {
            min: 1,
            max: u32::MAX as u64,
        },
        sent: Sent::No,
        echoed: Echoed::Set(|e, v| e.max_tool_calls = v.integer()),
    },
    Field {
        name: "max_output_tokens",
        check: Check::Integer {
            min: 1,
            max: u32::MAX as u64,
        },
        sent: Sent::As("max_completion_tokens"),
        echoed: Echoed::Set(|e, v| e.max_output_tokens = v.integer()),
    },
    sampling!(temperature, 0.0, 2.0),
    sampling!(top_p, 0.0, 1.0),
    sampling!(presence_penalty, -2.0, 2.0),
    sampling!(frequency_penalty, -2.0, 2.0),
    own("include"),
    Field {
        name: "top_logprobs",
        check: Check::Integer { min: 0, max: 20 },
        // Sent only with logprobs (the translation's rule).
        sent: Sent::Own,
        echoed: Echoed::Set(|e, v| e.top_logprobs = v.integer().unwrap_or(0)),
    },
    own("text"),
    own("reasoning"),
    Field {
        name: "truncation",
        check: Check::OneOf(&["auto", "disabled"]),
        sent: Sent::No,
        echoed: Echoed::Set(|e, v| e.truncation = v.name()),
    },
    // Echoed as asked, known or not (`scale`, `fast`, `ultrafast`, ...): it is OpenAI's
    // billing tier, and a Chat upstream serves every request the same way.
    Field {
        name: "service_tier",
        check: Check::Text(None),
        sent: Sent::No,
        echoed: Echoed::Set(|e, v| e.service_tier = v.owned_text()),
    },
    own("metadata"),
    Field {
        name: "prompt_cache_key",
        check: Check::Text(Some(64)),
        sent: Sent::No,
        echoed: Echoed::Set(|e, v| e.prompt_cache_key = Some(v.owned_text())),
    },
    Field {
        name: "safety_identifier",
        check: Check::Text(Some(64)),
        sent: Sent::Set(|c, v| c.user = v.text()),
        echoed: Echoed::Set(|e, v| e.safety_identifier = Some(v.owned_text())),
    },
    // The SDKs' older name of `safety_identifier`; the newer one wins.
    Field {
        name: "user",
        check: Check::Text(None),
        sent: Sent::Set(|c, v| {
            if c.user.is_none() {
                c.user = v.text();
            }
        }),
        echoed: Echoed::No,
    },
];

/// The plain fields of a request, read in the table's order as the translation reaches them.
#[derive(Debug)]
pub(crate) struct Params<'a> {
    table: &'static [Field],
    /// The table's next entry to read.
    next: usize,
    /// The values read, by entry.
    values: Vec<(&'static Field, Value<'a>)>,
}

impl std::fmt::Debug for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}

impl Default for Params<'_> {
    fn default() -> Self {
        Params::new(FIELDS)
    }
}

impl<'a> Params<'a> {
    fn new(table: &'static [Field]) -> Self {
        Params {
            table,
            next: 0,
            values: Vec::new(),
        }
    }

    /// Reads the plain fields from where the last read stopped up to the entry of `own`, the
    /// field with rules of its own that the translation reads next.
    pub fn read_until(&mut self, req: &mut Obj<'a, '_>, own: &str) -> Result<(), ApiError> {
        let end = self.table[self.next..]
            .iter()
            .position(|f| f.name == own)
            .map(|at| self.next + at);
        debug_assert!(end.is_some(), "'{own}' is not an entry after the last read");
        self.read(req, end.unwrap_or(self.next))
    }

    /// Reads the plain fields left.
    pub fn read_rest(&mut self, req: &mut Obj<'a, '_>) -> Result<(), ApiError> {
        self.read(req, self.table.len())
    }

    fn read(&mut self, req: &mut Obj<'a, '_>, end: usize) -> Result<(), ApiError> {
        for f in &self.table[self.next..end] {
            let name = f.name;
            let value = match f.check {
                Check::Own => None,
                Check::Number { min, max } => req.number(name, min, max)?.map(Value::Number),
                Check::Integer { min, max } => req.integer(name, min, max)?.map(Value::Integer),
                Check::OneOf(names) => req.enumeration(name, names)?.map(Value::Name),
                Check::Text(max_chars) => match req.string(name)? {
                    Some(s) if max_chars.is_some_and(|max| s.as_str().chars().count() > max) => {
                        return Err(bad_value(
                            name,
                            format!(
                                "Invalid '{name}': at most {} characters.",
                                max_chars.unwrap_or_default()
                            ),
                        ))
                    }
                    s => s.map(Value::Text),
                },
            };
            if let Some(value) = value {
                self.values.push((f, value));
            }
        }
        self.next = self.next.max(end);
        Ok(())
    }

    /// The value of a plain field, if the request has it (and it was read).
    pub fn get(&self, name: &str) -> Option<&Value<'a>> {
        self.values
            .iter()
            .find(|(f, _)| f.name == name)
            .map(|(_, v)| v)
    }

    /// Each value where its entry puts it, in the Chat request and in the echo; the echo's
    /// own keys ([`Echoed::As`]) get their default when the request has none.
    pub fn apply(&self, chat: &mut chat::Request<'a>, echo: &mut Echo) {
        for f in self.table {
            let value = self.values.iter().find(|(g, _)| std::ptr::eq(*g, f));
            if let Some((_, v)) = value {
                match f.sent {
                    Sent::As(key) => chat.params.push((key, v.chat())),
                    Sent::Set(set) => set(chat, v),
                    Sent::No | Sent::Own => {}
                }
                if let Echoed::Set(set) = f.echoed {
                    set(echo, v);
                }
            }
            if let Echoed::As(default) = &f.echoed {
                let echoed = value.map_or_else(|| default.clone(), |(_, v)| v.echoed());
                echo.params.push((f.name, echoed));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::request::body;

    /// A rehearsal of a new plain field: a hypothetical `min_p`, sent as Chat's `min_p` and
    /// echoed with a default, is this one entry.
    const REHEARSAL: &[Field] = &[
        own("model"),
        Field {
            name: "min_p",
            check: Check::Number { min: 0.0, max: 1.0 },
            sent: Sent::As("min_p"),
            echoed: Echoed::As(Scalar::Number(0.0)),
        },
    ];

    fn rehearse(body: &[u8]) -> Result<(Vec<u8>, Echo), ApiError> {
        let mut req = body::read(body)?;
        let mut params = Params::new(REHEARSAL);
        params.read_until(&mut req, "model")?;
        req.required_string("model")?;
        params.read_rest(&mut req)?;
        let (mut chat, mut echo) = (chat::Request::default(), Echo::default());
        params.apply(&mut chat, &mut echo);
        Ok((chat.encode(64), echo))
    }

    #[test]
    fn a_new_plain_field_is_checked_sent_and_echoed_by_its_entry() {
        let (sent, echo) = rehearse(br#"{"model":"m","min_p":0.25}"#).unwrap();
        let sent = String::from_utf8(sent).unwrap();
        assert!(sent.contains(r#""min_p":0.25"#), "{sent}");
        assert_eq!(echo.params, [("min_p", Scalar::Number(0.25))]);

        let (sent, echo) = rehearse(br#"{"model":"m"}"#).unwrap();
        assert!(!String::from_utf8(sent).unwrap().contains("min_p"));
        assert_eq!(echo.params, [("min_p", Scalar::Number(0.0))], "its default");

        let refused = rehearse(br#"{"model":"m","min_p":2}"#).unwrap_err();
        assert_eq!(refused.param.as_deref(), Some("min_p"));
        // Not listed in `json::shape` (kept as it came), an object is still no number.
        let refused = rehearse(br#"{"model":"m","min_p":{"a":1}}"#).unwrap_err();
        assert_eq!(refused.param.as_deref(), Some("min_p"));
        assert!(
            refused.message.contains("but got an object"),
            "{}",
            refused.message
        );
    }

    #[test]
    fn each_field_has_one_entry_and_own_rules_only_go_with_own_checks() {
        for (i, f) in FIELDS.iter().enumerate() {
            assert!(
                FIELDS[..i].iter().all(|g| g.name != f.name),
                "{} has two entries",
                f.name
            );
            if matches!(f.check, Check::Own) {
                assert!(
                    matches!(f.sent, Sent::Own) && matches!(f.echoed, Echoed::Own),
                    "{}: a field read by rules of its own is mapped by them",
                    f.name
                );
            }
        }
    }
}
