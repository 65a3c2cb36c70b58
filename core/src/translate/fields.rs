//! Typed reads of JSON fields that fail with a 400 naming the field's path.

use serde_json::{Map, Value};

use crate::openresponses::{ApiError, ErrorCode};

/// Joins a parent path and a key: `""+"model"` → `model`, `"text"+"format"` → `text.format`.
pub fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

pub fn index(parent: &str, i: usize) -> String {
    format!("{parent}[{i}]")
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub fn wrong_type(path: &str, expected: &str, got: &Value) -> ApiError {
    ApiError::invalid(
        path,
        format!(
            "Invalid type for '{path}': expected {expected}, but got {}.",
            type_name(got)
        ),
    )
    .with_code(ErrorCode::InvalidType)
}

pub fn missing(path: &str) -> ApiError {
    ApiError::invalid(path, format!("Missing required parameter: '{path}'."))
        .with_code(ErrorCode::MissingRequiredParameter)
}

pub fn bad_value(path: &str, message: impl Into<String>) -> ApiError {
    ApiError::invalid(path, message).with_code(ErrorCode::InvalidValue)
}

/// A JSON object being read field by field; `path` locates it in the request.
pub struct Obj<'p> {
    pub map: Map<String, Value>,
    pub path: &'p str,
}

impl<'p> Obj<'p> {
    pub fn new(value: Value, path: &'p str) -> Result<Self, ApiError> {
        match value {
            Value::Object(map) => Ok(Obj { map, path }),
            other => Err(wrong_type(
                if path.is_empty() { "body" } else { path },
                "an object",
                &other,
            )),
        }
    }

    pub fn field_path(&self, key: &str) -> String {
        join(self.path, key)
    }

    /// Removes a field; JSON `null` counts as absent, as the schema's nullable fields allow.
    pub fn take(&mut self, key: &str) -> Option<Value> {
        match self.map.remove(key) {
            None | Some(Value::Null) => None,
            Some(v) => Some(v),
        }
    }

    pub fn has(&self, key: &str) -> bool {
        self.map.get(key).is_some_and(|v| !v.is_null())
    }

    pub fn string(&mut self, key: &str) -> Result<Option<String>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type(&self.field_path(key), "a string", &other)),
        }
    }

    pub fn required_string(&mut self, key: &str) -> Result<String, ApiError> {
        self.string(key)?
            .ok_or_else(|| missing(&self.field_path(key)))
    }

    pub fn bool(&mut self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(other) => Err(wrong_type(&self.field_path(key), "a boolean", &other)),
        }
    }

    /// A number within `[min, max]`.
    pub fn number(&mut self, key: &str, min: f64, max: f64) -> Result<Option<f64>, ApiError> {
        let path = self.field_path(key);
        match self.take(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let x = n.as_f64().filter(|x| x.is_finite()).ok_or_else(|| {
                    bad_value(&path, format!("Invalid '{path}': not a finite number."))
                })?;
                if x < min || x > max {
                    return Err(bad_value(
                        &path,
                        format!("Invalid '{path}': {x} is out of range; expected a value between {min} and {max}."),
                    ));
                }
                Ok(Some(x))
            }
            Some(other) => Err(wrong_type(&path, "a number", &other)),
        }
    }

    /// An integer within `[min, max]`.
    pub fn integer(&mut self, key: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
        let path = self.field_path(key);
        match self.take(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                let x = n.as_u64().ok_or_else(|| {
                    bad_value(
                        &path,
                        format!("Invalid '{path}': expected an integer between {min} and {max}."),
                    )
                })?;
                if x < min || x > max {
                    return Err(bad_value(
                        &path,
                        format!("Invalid '{path}': {x} is out of range; expected an integer between {min} and {max}."),
                    ));
                }
                Ok(Some(x))
            }
            Some(other) => Err(wrong_type(&path, "an integer", &other)),
        }
    }

    pub fn array(&mut self, key: &str) -> Result<Option<Vec<Value>>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(other) => Err(wrong_type(&self.field_path(key), "an array", &other)),
        }
    }

    pub fn object(&mut self, key: &str) -> Result<Option<Map<String, Value>>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(other) => Err(wrong_type(&self.field_path(key), "an object", &other)),
        }
    }

    /// A string that must be one of `allowed`.
    pub fn enumeration(
        &mut self,
        key: &str,
        allowed: &[&'static str],
    ) -> Result<Option<&'static str>, ApiError> {
        let path = self.field_path(key);
        match self.string(key)? {
            None => Ok(None),
            Some(s) => allowed
                .iter()
                .find(|a| **a == s)
                .copied()
                .map(Some)
                .ok_or_else(|| {
                    bad_value(
                        &path,
                        format!(
                            "Invalid value for '{path}': '{s}'. Supported values are: {}.",
                            allowed
                                .iter()
                                .map(|a| format!("'{a}'"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )
                }),
        }
    }

    /// Fails on the first field left unread: for objects whose every field we know.
    ///
    /// The one rule for unknown keys inside the request (items, parts, tools, nested
    /// objects): a key whose value is `null` is absent, whatever its name. Clients dump their
    /// own models back (`model_dump()` writes `null` for every field the client never set,
    /// including fields newer than this server), and an absent field cannot change what the
    /// request means. A field that carries the content (`call_id`, an image's URL) is read
    /// with a `required_*` reader, for which `null` is missing: 400
    /// `missing_required_parameter`.
    pub fn deny_unknown(&self) -> Result<(), ApiError> {
        match self.map.iter().find(|(_, v)| !v.is_null()).map(|(k, _)| k) {
            None => Ok(()),
            Some(k) => {
                let path = self.field_path(k);
                Err(
                    ApiError::invalid(&path, format!("Unknown parameter: '{path}'."))
                        .with_code(ErrorCode::UnknownParameter),
                )
            }
        }
    }
}
