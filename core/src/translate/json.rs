//! JSON parsing that rejects duplicate object keys.
//!
//! `serde_json` keeps the last of two equal keys silently. An intermediary that keeps the
//! first (a WAF, a logging proxy) would then see a different request than the one we
//! translate (`"stream": false, "stream": true`), so duplicates are an error, named by path.
//! The path is only rendered when a duplicate is found: parsing pays nothing for it.
//!
//! Three readers accept exactly the same documents: [`document`] reads a client's body
//! borrowed, in one pass, keeping what it only carries as the tokens it came as, within a
//! memory budget of its size, and leaves the telling of errors to [`check`]; [`check`] says
//! what is wrong with a document it refuses (serde_json's message and position, or the path
//! of a duplicate key) without building anything; [`parse`] builds a `Value` tree, for this
//! server's own JSON (its tests read what it wrote), never for a client's.

pub(crate) mod document;
pub(crate) mod shape;

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;
use std::mem::size_of;

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use document::{Budget, KeySeed};

#[derive(Debug)]
pub enum ParseError {
    /// Not JSON (or too deep, or a number out of range).
    Syntax(serde_json::Error),
    /// The path of a key given twice in one object (`input[0].role`).
    Duplicate(String),
}

/// Parses a whole JSON document into a `Value`, rejecting duplicate keys: for this server's
/// own JSON; a client's is read by [`document`] and [`check`].
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

/// Why a document is refused, in [`parse`]'s words, built from one pass that builds nothing:
/// `Ok` if it is not. What it holds, the keys of the objects open at once (to find a key given
/// twice), is counted in a [`Budget`] of the text; past it, the document is walked again
/// holding no key, and a duplicate cannot be named.
pub fn check(bytes: &[u8]) -> Result<(), ParseError> {
    check_within(bytes, &Budget::for_text(bytes.len()))
}

fn check_within(bytes: &[u8], budget: &Budget) -> Result<(), ParseError> {
    match walk(bytes, Some(budget)) {
        Err(ParseError::Syntax(_)) if budget.exceeded() => match walk(bytes, None) {
            Ok(()) => Err(ParseError::Syntax(de::Error::custom(
                "an object has a key given twice, among more keys than this server holds to name it",
            ))),
            other => other,
        },
        other => other,
    }
}

fn walk(bytes: &[u8], budget: Option<&Budget>) -> Result<(), ParseError> {
    let duplicate = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let walked = CheckSeed {
        at: &Segment::Root,
        duplicate: &duplicate,
        budget,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    match (walked, duplicate.into_inner()) {
        (_, Some(path)) => Err(ParseError::Duplicate(path)),
        (Ok(()), None) => Ok(()),
        (Err(e), None) => Err(ParseError::Syntax(e)),
    }
}

/// Walks a value as [`ValueSeed`] reads it (the same calls of serde_json, so the same errors
/// at the same positions), keeping nothing but, with a budget, each open object's keys.
struct CheckSeed<'a> {
    at: &'a Segment<'a>,
    duplicate: &'a RefCell<Option<String>>,
    budget: Option<&'a Budget>,
}

impl<'de> DeserializeSeed<'de> for CheckSeed<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CheckSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0;
        while let Some(()) = seq.next_element_seed(CheckSeed {
            at: &Segment::Index(self.at, i),
            duplicate: self.duplicate,
            budget: self.budget,
        })? {
            i += 1;
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = Keys::default();
        let walked = (|| -> Result<(), A::Error> {
            while let Some(key) = map.next_key_seed(KeySeed(self.budget))? {
                let at = Segment::Key(self.at, &key);
                if seen.set.contains(&key) {
                    *self.duplicate.borrow_mut() = Some(at.to_string());
                    return Err(de::Error::custom(format_args!("duplicate key '{at}'")));
                }
                map.next_value_seed(CheckSeed {
                    at: &at,
                    duplicate: self.duplicate,
                    budget: self.budget,
                })?;
                if let Some(budget) = self.budget {
                    seen.insert(key, budget).map_err(de::Error::custom)?;
                }
            }
            Ok(())
        })();
        if let Some(budget) = self.budget {
            seen.release(budget);
        }
        walked
    }
}

/// The keys of one open object, counted in a budget.
#[derive(Default)]
struct Keys<'k> {
    set: HashSet<Cow<'k, str>>,
    /// Bytes of decoded keys (those with escapes), counted when they were read.
    owned: usize,
}

impl<'k> Keys<'k> {
    /// The memory of a set of `capacity` keys: a power of two of slots at most 7/8 full, each
    /// a key and a control byte.
    fn bytes(capacity: usize) -> usize {
        if capacity == 0 {
            return 0;
        }
        (capacity * 8 / 7 + 1).next_power_of_two() * (size_of::<Cow<'k, str>>() + 1)
    }

    fn insert(&mut self, key: Cow<'k, str>, budget: &Budget) -> Result<(), &'static str> {
        if self.set.len() == self.set.capacity() {
            let want = (self.set.capacity() * 2).max(4);
            budget.charge(Keys::bytes(want) - Keys::bytes(self.set.capacity()))?;
            self.set.reserve(want - self.set.len());
        }
        if let Cow::Owned(k) = &key {
            self.owned += k.len();
        }
        self.set.insert(key);
        Ok(())
    }

    fn release(self, budget: &Budget) {
        budget.refund(Keys::bytes(self.set.capacity()) + self.owned);
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

    /// What `check` says of `s`, and what `parse` says, as text.
    fn verdicts(s: &[u8]) -> (String, String) {
        let said = |r: Result<(), ParseError>| match r {
            Ok(()) => "ok".to_owned(),
            Err(ParseError::Syntax(e)) => format!("syntax: {e}"),
            Err(ParseError::Duplicate(p)) => format!("duplicate: {p}"),
        };
        (said(check(s)), said(parse(s).map(drop)))
    }

    #[test]
    fn check_says_what_parse_says_without_a_tree() {
        for s in [
            &b"{"[..],
            b"",
            b"[1,]",
            b"1e400",
            b"{\"a\":1} x",
            b"{\"a\":[1,2,{\"b\":\"\\ud800\"}]}",
            b"{\"a\":1,\"a\":2}",
            b"{\"a\":{\"b\":1,\"\\u0062\":2}}",
            b"{\"a\":1,\"a\":2 x",
            b"{\"a\":[{\"k\":1},{\"k\":1,\"k\":null}]}",
            b"{\"a\":\"\xff\"}",
            b"{\"input\":[{\"role\":\"user\",\"role\":\"x\"}]}",
            "[".repeat(200).as_bytes(),
            b"{\"ok\":true}",
        ] {
            let (checked, parsed) = verdicts(s);
            assert_eq!(checked, parsed, "{}", String::from_utf8_lossy(s));
        }
    }

    #[test]
    fn check_holds_keys_within_its_budget_and_then_checks_the_syntax() {
        // An object of more keys than its budget holds (the floor's, 64 KiB, here): still the
        // syntax error, where it is.
        let small = || Budget::for_text(0);
        let keys: Vec<String> = (0..10_000).map(|i| format!(r#""{i}":0"#)).collect();
        let text = format!("{{{}}} x", keys.join(","));
        let budget = small();
        let checked = check_within(text.as_bytes(), &budget);
        assert!(budget.exceeded());
        let Err(ParseError::Syntax(e)) = checked else {
            panic!("{checked:?}");
        };
        let Err(ParseError::Syntax(parsed)) = parse(text.as_bytes()) else {
            panic!("a syntax error");
        };
        assert_eq!(e.to_string(), parsed.to_string());
        assert!(e.to_string().starts_with("trailing characters"), "{e}");
        // A duplicate among them: told, without its path.
        let twice = format!("{{{},\"7\":1}}", keys.join(","));
        let checked = check_within(twice.as_bytes(), &small());
        assert!(
            matches!(&checked, Err(ParseError::Syntax(e)) if e.to_string().contains("given twice")),
            "{checked:?}"
        );
        // With a budget that holds its keys, the duplicate is named.
        let fewer: Vec<String> = (0..1000).map(|i| format!(r#""{i}":0"#)).collect();
        let twice = format!("{{{},\"7\":1}}", fewer.join(","));
        assert!(matches!(check(twice.as_bytes()), Err(ParseError::Duplicate(p)) if p == "7"));
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
