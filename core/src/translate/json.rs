//! JSON parsing that rejects duplicate object keys.
//!
//! `serde_json` keeps the last of two equal keys silently. An intermediary that keeps the
//! first (a WAF, a logging proxy) would then see a different request than the one we
//! translate (`"stream": false, "stream": true`), so duplicates are an error, named by path.
//! The path is only rendered when a duplicate is found: parsing pays nothing for it.
//!
//! Two readers accept exactly the same documents: [`parse`] builds a `Value` tree and says
//! what is wrong with a document it refuses (serde_json's message and position, or the path
//! of a duplicate key); [`document`] reads a request body borrowed, in one pass, keeping
//! what it only carries as the tokens it came as, and leaves the telling of errors to
//! [`parse`].

pub(crate) mod document;
pub(crate) mod shape;

use std::cell::RefCell;
use std::fmt;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

#[derive(Debug)]
pub enum ParseError {
    /// Not JSON (or too deep, or a number out of range).
    Syntax(serde_json::Error),
    /// The path of a key given twice in one object (`input[0].role`).
    Duplicate(String),
}

/// Parses a whole JSON document into a `Value`, rejecting duplicate keys.
pub fn parse(bytes: &[u8]) -> Result<Value, ParseError> {
    let duplicate = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let node = ValueSeed {
        at: &Segment::Root,
        duplicate: &duplicate,
    };
    let parsed = node.deserialize(&mut de).and_then(|v| de.end().map(|()| v));
    match (parsed, duplicate.into_inner()) {
        (_, Some(path)) => Err(ParseError::Duplicate(path)),
        (Ok(v), None) => Ok(v),
        (Err(e), None) => Err(ParseError::Syntax(e)),
    }
}

/// Where a value sits, as a chain of borrowed segments.
enum Segment<'a> {
    Root,
    Key(&'a Segment<'a>, &'a str),
    Index(&'a Segment<'a>, usize),
}

impl fmt::Display for Segment<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Segment::Root => Ok(()),
            Segment::Key(Segment::Root, k) => write!(f, "{k}"),
            Segment::Key(parent, k) => write!(f, "{parent}.{k}"),
            Segment::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

struct ValueSeed<'a> {
    at: &'a Segment<'a>,
    duplicate: &'a RefCell<Option<String>>,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element_seed(ValueSeed {
            at: &Segment::Index(self.at, items.len()),
            duplicate: self.duplicate,
        })? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let at = Segment::Key(self.at, &key);
            if out.contains_key(&key) {
                *self.duplicate.borrow_mut() = Some(at.to_string());
                return Err(de::Error::custom(format_args!("duplicate key '{at}'")));
            }
            let value = map.next_value_seed(ValueSeed {
                at: &at,
                duplicate: self.duplicate,
            })?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dup(s: &str) -> String {
        match parse(s.as_bytes()) {
            Err(ParseError::Duplicate(p)) => p,
            other => panic!("expected a duplicate in {s}, got {other:?}"),
        }
    }

    #[test]
    fn same_values_as_serde_json() {
        for s in [
            r#"{"a":[1,-2,3.5,"x",null,true,{"b":{}}],"c":"\u00e9"}"#,
            "[]",
            "12",
            r#""s""#,
            "1e300",
        ] {
            let ours = parse(s.as_bytes()).unwrap();
            let theirs: Value = serde_json::from_str(s).unwrap();
            assert_eq!(ours, theirs, "{s}");
        }
    }

    #[test]
    fn duplicates_are_named_by_path() {
        assert_eq!(dup(r#"{"model":"a","model":"b"}"#), "model");
        assert_eq!(
            dup(r#"{"input":[{"role":"user","role":"x"}]}"#),
            "input[0].role"
        );
        assert_eq!(dup(r#"{"a":[[{"b":{"c":1,"c":2}}]]}"#), "a[0][0].b.c");
        // Equal keys in different objects are fine.
        assert!(parse(br#"[{"a":1},{"a":2}]"#).is_ok());
    }

    #[test]
    fn syntax_errors_depth_and_range_stay_errors() {
        for s in ["{", "[1,]", "1e400", "{\"a\":1} x", &"[".repeat(10_000)] {
            assert!(
                matches!(parse(s.as_bytes()), Err(ParseError::Syntax(_))),
                "{s:.20}"
            );
        }
    }
}
