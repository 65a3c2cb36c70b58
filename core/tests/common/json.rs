//! A JSON reader that refuses duplicate keys, for everything the suites receive: a response
//! object or event with a key twice is valid to `serde_json` (the last one wins) but fails
//! strict readers, so the tests read every body and event with this one.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Parses `text` as JSON, failing on a key given twice in one object (the error names it).
pub fn parse_strict(text: &str) -> Result<Value, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let value = Strict.deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(value)
}

/// Every string of `v` that is a key of `sealed` becomes its value (the surface cases'
/// placeholders become sealed blobs made at run time).
pub fn substitute(v: &mut Value, sealed: &std::collections::HashMap<&str, String>) {
    match v {
        Value::String(s) => {
            if let Some(blob) = sealed.get(s.as_str()) {
                *s = blob.clone();
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| substitute(x, sealed)),
        Value::Object(o) => o.values_mut().for_each(|x| substitute(x, sealed)),
        _ => {}
    }
}

/// [`parse_strict`] that panics with the text on failure.
#[track_caller]
pub fn strict(text: &str) -> Value {
    parse_strict(text).unwrap_or_else(|e| panic!("not strict JSON ({e}): {text}"))
}

struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(Strict)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
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

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Strict)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate key `{key}`")));
            }
            let value = map.next_value_seed(Strict)?;
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn duplicates_are_refused_at_any_depth() {
        assert!(super::parse_strict(r#"{"a":1,"b":[{"c":1}]}"#).is_ok());
        let e = super::parse_strict(r#"{"a":{"b":1,"b":2}}"#).unwrap_err();
        assert!(e.contains("duplicate key `b`"), "{e}");
    }
}
