//! The Responses default for a function tool without `strict`: its schema normalised into
//! OpenAI's strict-mode subset of JSON Schema where it can be, so that the Chat tool goes
//! `strict: true`; loose otherwise (OpenAI's function-calling guide: Responses "will attempt
//! to normalize your schema into strict mode when possible, and will fall back to
//! non-strict, best-effort function calling if the schema cannot be made compatible").
//!
//! The subset is the one OpenAI's Structured Outputs guide documents ("Supported schemas");
//! docs/request-mapping.md lists what is normalised and what falls back. Normalising adds
//! what strict mode requires and changes no constraint the client wrote: every object gets
//! `additionalProperties: false` and lists all its properties in `required`, and a property
//! that was optional is made nullable (`null` is how strict mode says "not given").
//!
//! The schema is read one object at a time, its values kept as the tokens they came as, and
//! written out once as it is read: no tree is built. A schema that needs nothing is sent as
//! it came.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// What strict mode makes of a function's schema.
#[derive(Debug)]
pub(crate) enum Strict {
    /// In the subset already: sent as it came, `strict: true`.
    AsItCame,
    /// Normalised into the subset: this schema goes, `strict: true`.
    Normalised(Box<RawValue>),
    /// Outside the subset, and no rewrite without changing its meaning: sent loose.
    Loose,
}

/// The Responses default applied to `schema` (a function's `parameters`).
pub(crate) fn normalise(schema: &RawValue) -> Strict {
    let mut walk = Walk {
        out: String::with_capacity(schema.get().len() + 64),
        changed: false,
        defs: Vec::new(),
        properties: 0,
        enum_values: 0,
        string_chars: 0,
    };
    if walk.root(schema).is_err() {
        return Strict::Loose;
    }
    if !walk.changed {
        return Strict::AsItCame;
    }
    // A check of what was written (a scan, no tree): a slip here sends the tool loose,
    // never a body the upstream cannot read.
    match RawValue::from_string(walk.out) {
        Ok(raw) => Strict::Normalised(raw),
        Err(_) => Strict::Loose,
    }
}

/// OpenAI's limits on a strict schema ("Objects have limitations on nesting depth and
/// size", "Limitations on total string size", "Limitations on enum size").
const MAX_OBJECT_DEPTH: usize = 10;
const MAX_PROPERTIES: usize = 5000;
const MAX_ENUM_VALUES: usize = 1000;
const MAX_STRING_CHARS: usize = 120_000;
/// Schemas inside one another (objects, items, `anyOf` branches): bounds the recursion.
const MAX_SCHEMA_DEPTH: usize = 32;

/// The string formats strict mode supports.
const FORMATS: [&str; 9] = [
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];

/// The schema cannot be strict without changing what it means.
#[derive(Debug)]
struct Loose;

type Walked<T = ()> = Result<T, Loose>;

struct Walk<'s> {
    out: String,
    changed: bool,
    /// The names of the root's `$defs` (or `definitions`), for `$ref`s to resolve.
    defs: Vec<(&'static str, Key<'s>)>,
    properties: usize,
    enum_values: usize,
    string_chars: usize,
}

/// A schema's JSON type, as strict mode allows it: one type, or one and `null`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Type {
    String,
    Number,
    Integer,
    Boolean,
    Object,
    Array,
    Null,
}

impl Type {
    fn named(name: &str) -> Option<Type> {
        Some(match name {
            "string" => Type::String,
            "number" => Type::Number,
            "integer" => Type::Integer,
            "boolean" => Type::Boolean,
            "object" => Type::Object,
            "array" => Type::Array,
            "null" => Type::Null,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Type::String => "string",
            Type::Number => "number",
            Type::Integer => "integer",
            Type::Boolean => "boolean",
            Type::Object => "object",
            Type::Array => "array",
            Type::Null => "null",
        }
    }
}

/// A schema's `type`: the type, and whether `null` is listed beside it.
#[derive(Debug, Clone, Copy)]
struct Typed {
    ty: Type,
    or_null: bool,
}

impl<'s> Walk<'s> {
    /// The parameters: an object, the only place for `$defs`.
    fn root(&mut self, raw: &'s RawValue) -> Walked {
        let fields = object(raw)?;
        for (key, value) in &fields {
            if let name @ ("$defs" | "definitions") = key.as_ref() {
                let name = if name == "$defs" {
                    "$defs"
                } else {
                    "definitions"
                };
                for (def, _) in object(value)? {
                    self.count_string(def.len())?;
                    self.defs.push((name, def));
                }
            }
        }
        let typed = type_of(&fields)?;
        if !matches!(
            typed,
            Some(Typed {
                ty: Type::Object,
                or_null: false
            })
        ) {
            // The root is an object (never a union, never nullable).
            return Err(Loose);
        }
        self.schema(fields, 0, 0, false, true)
    }

    /// Writes one schema, normalised; `optional`: a property the client did not require,
    /// made nullable.
    fn node(&mut self, raw: &'s RawValue, depth: usize, objects: usize, optional: bool) -> Walked {
        let fields = object(raw)?;
        self.schema(fields, depth, objects, optional, false)
    }

    fn schema(
        &mut self,
        fields: Vec<(Key<'s>, &'s RawValue)>,
        depth: usize,
        objects: usize,
        optional: bool,
        root: bool,
    ) -> Walked {
        if depth > MAX_SCHEMA_DEPTH {
            return Err(Loose);
        }
        let typed = type_of(&fields)?;
        let has = |name: &str| fields.iter().any(|(k, _)| k.as_ref() == name);
        let (any_of, reference, enumerated, constant) =
            (has("anyOf"), has("$ref"), has("enum"), has("const"));
        // Every keyword must be one the subset knows for this kind of schema.
        for (key, value) in &fields {
            let known = match (key.as_ref(), typed.map(|t| t.ty)) {
                (k, _) if annotation(k) => true,
                ("$schema", _) => root,
                ("$defs" | "definitions", _) => root,
                ("type", _) => !any_of && !reference,
                ("enum", _) => !any_of && !reference,
                ("const", _) => !any_of && !reference && !enumerated,
                ("anyOf", _) => typed.is_none() && !reference && !enumerated && !constant,
                ("$ref", _) => typed.is_none() && !enumerated && !constant,
                ("pattern", Some(Type::String)) => value.get().starts_with('"'),
                ("format", Some(Type::String)) => FORMATS.contains(&read_str(value)?.as_ref()),
                (
                    "multipleOf" | "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum",
                    Some(Type::Number | Type::Integer),
                ) => is_number(value),
                ("items", Some(Type::Array)) => true,
                ("minItems" | "maxItems", Some(Type::Array)) => is_number(value),
                ("properties" | "required" | "additionalProperties", Some(Type::Object)) => true,
                _ => false,
            };
            if !known {
                return Err(Loose);
            }
        }
        if typed.is_none() && !any_of && !reference && !enumerated && !constant {
            // Any value at all (`{}`): strict mode has no such schema.
            return Err(Loose);
        }
        if enumerated {
            self.count_enum(fields.iter().find(|(k, _)| k.as_ref() == "enum"))?;
        }
        if constant {
            let (_, value) = fields
                .iter()
                .find(|(k, _)| k.as_ref() == "const")
                .ok_or(Loose)?;
            self.count_string(value.get().len())?;
        }
        let objects = match typed {
            Some(Typed {
                ty: Type::Object, ..
            }) => objects + 1,
            _ => objects,
        };
        if objects > MAX_OBJECT_DEPTH {
            return Err(Loose);
        }

        // How an optional property is made nullable, if it does not take `null` already.
        let nullable = if optional && !admits_null(&fields, typed)? {
            self.changed = true;
            if any_of {
                Nullable::AnyOfBranch
            } else if (typed.is_some() || enumerated) && !constant {
                Nullable::TypeAndEnum
            } else {
                // A `$ref` or a `const`.
                Nullable::Wrap
            }
        } else {
            Nullable::No
        };
        if nullable == Nullable::Wrap {
            self.out.push_str(r#"{"anyOf":["#);
        }

        let object = matches!(
            typed,
            Some(Typed {
                ty: Type::Object,
                ..
            })
        );
        let properties = if object {
            self.properties(&fields)?
        } else {
            Vec::new()
        };
        let names: Vec<Key<'s>> = properties.iter().map(|(k, _)| k.clone()).collect();
        let required = if object {
            required(&fields, &names)?
        } else {
            None
        };
        let mut wrote_required = false;
        let mut closed = false;

        self.out.push('{');
        for (i, (key, value)) in fields.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            write_key(&mut self.out, key);
            self.out.push(':');
            match key.as_ref() {
                "type" if nullable == Nullable::TypeAndEnum => {
                    let ty = typed.ok_or(Loose)?.ty;
                    self.out.push_str(&format!(r#"["{}","null"]"#, ty.name()));
                }
                "enum" if nullable == Nullable::TypeAndEnum => {
                    push_null_into_array(&mut self.out, value);
                }
                "anyOf" => {
                    let branches = array(value)?;
                    if branches.is_empty() {
                        return Err(Loose);
                    }
                    self.out.push('[');
                    for (j, branch) in branches.into_iter().enumerate() {
                        if j > 0 {
                            self.out.push(',');
                        }
                        self.node(branch, depth + 1, objects, false)?;
                    }
                    if nullable == Nullable::AnyOfBranch {
                        self.out.push_str(r#",{"type":"null"}"#);
                    }
                    self.out.push(']');
                }
                "$ref" => {
                    self.check_reference(value)?;
                    self.out.push_str(value.get());
                }
                "items" => self.node(value, depth + 1, objects, false)?,
                "properties" if object => {
                    self.out.push('{');
                    for (j, (name, schema)) in properties.iter().enumerate() {
                        if j > 0 {
                            self.out.push(',');
                        }
                        write_key(&mut self.out, name);
                        self.out.push(':');
                        let optional = match &required {
                            Some(Required::Complete) => false,
                            Some(Required::Partial(listed)) => !listed.contains(name),
                            None => true,
                        };
                        self.node(schema, depth + 1, objects, optional)?;
                    }
                    self.out.push('}');
                }
                "required" if object => {
                    wrote_required = true;
                    if matches!(required, Some(Required::Complete)) {
                        self.out.push_str(value.get());
                    } else {
                        self.changed = true;
                        write_names(&mut self.out, &names);
                    }
                }
                "additionalProperties" => {
                    if value.get() != "false" {
                        // Extra keys the client allows: closing the object would forbid
                        // what the schema lets the model send.
                        return Err(Loose);
                    }
                    closed = true;
                    self.out.push_str("false");
                }
                "$defs" | "definitions" if root => {
                    self.out.push('{');
                    for (j, (name, schema)) in object_fields(value)?.into_iter().enumerate() {
                        if j > 0 {
                            self.out.push(',');
                        }
                        write_key(&mut self.out, &name);
                        self.out.push(':');
                        self.node(schema, depth + 1, 0, false)?;
                    }
                    self.out.push('}');
                }
                _ => self.out.push_str(value.get()),
            }
        }
        if object {
            if !has("properties") && !has("additionalProperties") {
                // `{"type": "object"}`: any object. Strict mode would allow only `{}`.
                return Err(Loose);
            }
            let mut first = fields.is_empty();
            let mut sep = |out: &mut String| {
                if !first {
                    out.push(',');
                }
                first = false;
            };
            if !wrote_required && !names.is_empty() {
                self.changed = true;
                sep(&mut self.out);
                self.out.push_str(r#""required":"#);
                write_names(&mut self.out, &names);
            }
            if !closed {
                self.changed = true;
                sep(&mut self.out);
                self.out.push_str(r#""additionalProperties":false"#);
            }
        }
        self.out.push('}');
        if nullable == Nullable::Wrap {
            self.out.push_str(r#",{"type":"null"}]}"#);
        }
        Ok(())
    }

    /// An object's properties, counted against the limits.
    fn properties(
        &mut self,
        fields: &[(Key<'s>, &'s RawValue)],
    ) -> Walked<Vec<(Key<'s>, &'s RawValue)>> {
        let Some((_, properties)) = fields.iter().find(|(k, _)| k.as_ref() == "properties") else {
            return Ok(Vec::new());
        };
        let properties = object_fields(properties)?;
        self.properties += properties.len();
        if self.properties > MAX_PROPERTIES {
            return Err(Loose);
        }
        for (name, _) in &properties {
            self.count_string(name.len())?;
        }
        Ok(properties)
    }

    fn count_string(&mut self, chars: usize) -> Walked {
        self.string_chars += chars;
        if self.string_chars > MAX_STRING_CHARS {
            return Err(Loose);
        }
        Ok(())
    }

    fn count_enum(&mut self, field: Option<&(Key<'s>, &'s RawValue)>) -> Walked {
        let (_, value) = field.ok_or(Loose)?;
        let values = array(value)?;
        self.enum_values += values.len();
        if self.enum_values > MAX_ENUM_VALUES {
            return Err(Loose);
        }
        let chars = values.iter().map(|v| v.get().len()).sum();
        self.count_string(chars)
    }

    /// A `$ref` to the root (`#`) or to one of its definitions.
    fn check_reference(&self, value: &RawValue) -> Walked {
        let target = read_str(value)?;
        let target = target.as_ref();
        if target == "#" {
            return Ok(());
        }
        let found = self.defs.iter().any(|(section, name)| {
            target
                .strip_prefix('#')
                .and_then(|t| t.strip_prefix('/'))
                .and_then(|t| t.strip_prefix(section))
                .and_then(|t| t.strip_prefix('/'))
                .is_some_and(|t| t == name.as_ref())
        });
        if found {
            Ok(())
        } else {
            Err(Loose)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nullable {
    No,
    /// `"type": "T"` becomes `["T", "null"]` (and `null` joins an `enum`).
    TypeAndEnum,
    /// `{"type": "null"}` joins the `anyOf`.
    AnyOfBranch,
    /// `{"anyOf": [<schema>, {"type": "null"}]}`.
    Wrap,
}

/// An object's `required`, against its properties.
enum Required<'s> {
    /// Every property is listed.
    Complete,
    /// Some are: these.
    Partial(Vec<Key<'s>>),
}

fn required<'s>(
    fields: &[(Key<'s>, &'s RawValue)],
    names: &[Key<'s>],
) -> Walked<Option<Required<'s>>> {
    let Some((_, value)) = fields.iter().find(|(k, _)| k.as_ref() == "required") else {
        return Ok(None);
    };
    let listed: Vec<Key<'s>> = array(value)?
        .into_iter()
        .map(read_str)
        .collect::<Walked<_>>()?;
    // A required name with no property could never be given: strict mode cannot say it.
    if listed.iter().any(|l| !names.contains(l)) {
        return Err(Loose);
    }
    if names.iter().all(|n| listed.contains(n)) {
        Ok(Some(Required::Complete))
    } else {
        Ok(Some(Required::Partial(listed)))
    }
}

/// Titles, descriptions, defaults, examples: what describes a value without constraining
/// it (copied as it came).
fn annotation(key: &str) -> bool {
    matches!(
        key,
        "title"
            | "description"
            | "default"
            | "examples"
            | "$comment"
            | "deprecated"
            | "readOnly"
            | "writeOnly"
    )
}

/// The schema's `type`, if it has one: one type name, or one and `"null"`.
fn type_of(fields: &[(Key<'_>, &RawValue)]) -> Walked<Option<Typed>> {
    let Some((_, value)) = fields.iter().find(|(k, _)| k.as_ref() == "type") else {
        return Ok(None);
    };
    let text = value.get();
    if text.starts_with('"') {
        let name = read_str(value)?;
        let ty = Type::named(name.as_ref()).ok_or(Loose)?;
        return Ok(Some(Typed { ty, or_null: false }));
    }
    let names: Vec<KeySeed<'_>> = serde_json::from_str(text).map_err(|_| Loose)?;
    let mut types = names.iter().map(|n| Type::named(n.0.as_ref()).ok_or(Loose));
    match (types.next(), types.next(), types.next()) {
        (Some(ty), None, None) => Ok(Some(Typed {
            ty: ty?,
            or_null: false,
        })),
        (Some(a), Some(b), None) => match (a?, b?) {
            (Type::Null, Type::Null) => Err(Loose),
            (Type::Null, ty) | (ty, Type::Null) => Ok(Some(Typed { ty, or_null: true })),
            // Two types other than null: no union of that kind in strict mode.
            _ => Err(Loose),
        },
        _ => Err(Loose),
    }
}

/// Whether the schema takes `null` already.
fn admits_null(fields: &[(Key<'_>, &RawValue)], typed: Option<Typed>) -> Walked<bool> {
    if let Some(t) = typed {
        if t.or_null || t.ty == Type::Null {
            return Ok(true);
        }
    }
    for (key, value) in fields {
        match key.as_ref() {
            "enum" => {
                if array(value)?.iter().any(|v| v.get() == "null") {
                    return Ok(true);
                }
            }
            "const" if value.get() == "null" => return Ok(true),
            "anyOf" => {
                for branch in array(value)? {
                    let branch = object(branch)?;
                    if let Some(t) = type_of(&branch)? {
                        if t.or_null || t.ty == Type::Null {
                            return Ok(true);
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(false)
}

fn is_number(value: &RawValue) -> bool {
    serde_json::from_str::<serde::de::IgnoredAny>(value.get()).is_ok()
        && value
            .get()
            .starts_with(|c: char| c == '-' || c.is_ascii_digit())
}

/// `[... , null]`: an array token with `null` added at its end.
fn push_null_into_array(out: &mut String, array: &RawValue) {
    let text = array.get();
    let inner = text[1..text.len() - 1].trim();
    if inner.is_empty() {
        out.push_str("[null]");
    } else {
        out.push_str(&text[..text.len() - 1]);
        out.push_str(",null]");
    }
}

fn write_names(out: &mut String, names: &[Key<'_>]) {
    out.push('[');
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_key(out, name);
    }
    out.push(']');
}

/// A key as a JSON string: borrowed, it had no escapes, so it needs none.
fn write_key(out: &mut String, key: &Key<'_>) {
    match &key.0 {
        Cow::Borrowed(text) => {
            out.push('"');
            out.push_str(text);
            out.push('"');
        }
        Cow::Owned(text) => out.push_str(&serde_json::to_string(text).unwrap_or_default()),
    }
}

/// An object key: borrowed from the schema unless it had escapes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Key<'s>(Cow<'s, str>);

impl AsRef<str> for Key<'_> {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Key<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// A key read borrowed where it can be (serde's `Cow<str>` always copies).
struct KeySeed<'s>(Key<'s>);

impl<'de> serde::Deserialize<'de> for KeySeed<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = KeySeed<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(KeySeed(Key(Cow::Borrowed(s))))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
                Ok(KeySeed(Key(Cow::Owned(s.to_owned()))))
            }
        }
        d.deserialize_str(V)
    }
}

/// An object's fields in document order, their values kept as tokens.
struct Fields<'s>(Vec<(Key<'s>, &'s RawValue)>);

impl<'de> serde::Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut fields = Vec::new();
                while let Some(KeySeed(key)) = map.next_key()? {
                    let value: &'de RawValue = map.next_value()?;
                    fields.push((key, value));
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(V)
    }
}

/// A string, borrowed unless it has escapes.
fn read_str(raw: &RawValue) -> Walked<Key<'_>> {
    serde_json::from_str::<KeySeed<'_>>(raw.get())
        .map(|k| k.0)
        .map_err(|_| Loose)
}

/// A schema: an object (a boolean schema has no strict form).
fn object(raw: &RawValue) -> Walked<Vec<(Key<'_>, &RawValue)>> {
    if !raw.get().starts_with('{') {
        return Err(Loose);
    }
    object_fields(raw)
}

/// A map of names to schemas (`properties`, `$defs`).
fn object_fields(raw: &RawValue) -> Walked<Vec<(Key<'_>, &RawValue)>> {
    serde_json::from_str::<Fields<'_>>(raw.get())
        .map(|f| f.0)
        .map_err(|_| Loose)
}

fn array(raw: &RawValue) -> Walked<Vec<&RawValue>> {
    serde_json::from_str(raw.get()).map_err(|_| Loose)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn run(schema: Value) -> Strict {
        let raw = serde_json::value::to_raw_value(&schema).unwrap();
        normalise(&raw)
    }

    fn normalised(schema: Value) -> Value {
        match run(schema) {
            Strict::Normalised(raw) => serde_json::from_str(raw.get()).unwrap(),
            other => panic!("expected a normalised schema, got {other:?}"),
        }
    }

    fn is_as_it_came(schema: Value) -> bool {
        matches!(run(schema), Strict::AsItCame)
    }

    fn is_loose(schema: Value) -> bool {
        matches!(run(schema), Strict::Loose)
    }

    #[test]
    fn a_strict_schema_goes_as_it_came() {
        assert!(is_as_it_came(json!({
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "A city"},
                "unit": {"type": ["string", "null"], "enum": ["C", "F", null]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "tags": {"type": "array", "items": {"type": "string", "format": "email"}, "maxItems": 3}
            },
            "required": ["city", "unit", "days", "tags"],
            "additionalProperties": false
        })));
        // No properties, closed: a function without arguments.
        assert!(is_as_it_came(
            json!({"type": "object", "additionalProperties": false})
        ));
    }

    #[test]
    fn optional_properties_become_required_and_nullable_and_objects_are_closed() {
        let out = normalised(json!({
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["C", "F"]},
                "when": {"anyOf": [{"type": "string", "format": "date"}, {"type": "integer"}]},
                "mode": {"const": "fast"},
                "already": {"type": ["number", "null"]}
            },
            "required": ["city"]
        }));
        assert_eq!(
            out,
            json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "unit": {"type": ["string", "null"], "enum": ["C", "F", null]},
                    "when": {"anyOf": [
                        {"type": "string", "format": "date"},
                        {"type": "integer"},
                        {"type": "null"}
                    ]},
                    "mode": {"anyOf": [{"const": "fast"}, {"type": "null"}]},
                    "already": {"type": ["number", "null"]}
                },
                "required": ["city", "unit", "when", "mode", "already"],
                "additionalProperties": false
            })
        );
    }

    #[test]
    fn nested_objects_items_and_definitions_are_normalised_too() {
        let out = normalised(json!({
            "type": "object",
            "properties": {
                "points": {"type": "array", "items": {"$ref": "#/$defs/point"}},
                "owner": {"type": "object", "properties": {"name": {"type": "string"}}}
            },
            "required": ["points", "owner"],
            "$defs": {
                "point": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x"]}
            }
        }));
        assert_eq!(
            out,
            json!({
                "type": "object",
                "properties": {
                    "points": {"type": "array", "items": {"$ref": "#/$defs/point"}},
                    "owner": {
                        "type": "object",
                        "properties": {"name": {"type": ["string", "null"]}},
                        "required": ["name"],
                        "additionalProperties": false
                    }
                },
                "required": ["points", "owner"],
                "$defs": {
                    "point": {
                        "type": "object",
                        "properties": {"x": {"type": "number"}, "y": {"type": ["number", "null"]}},
                        "required": ["x", "y"],
                        "additionalProperties": false
                    }
                },
                "additionalProperties": false
            })
        );
    }

    #[test]
    fn an_optional_reference_is_wrapped_with_null() {
        let out = normalised(json!({
            "type": "object",
            "properties": {"next": {"$ref": "#"}},
            "additionalProperties": false
        }));
        assert_eq!(
            out["properties"]["next"],
            json!({"anyOf": [{"$ref": "#"}, {"type": "null"}]})
        );
        assert_eq!(out["required"], json!(["next"]));
    }

    #[test]
    fn keys_with_escapes_and_whitespace_survive() {
        let raw = RawValue::from_string(
            "{ \"type\" : \"object\",\n \"properties\" : { \"caf\\u00e9\" : { \"type\" : \"string\" } } }"
                .to_owned(),
        )
        .unwrap();
        let Strict::Normalised(out) = normalise(&raw) else {
            panic!("expected a normalised schema");
        };
        let out: Value = serde_json::from_str(out.get()).unwrap();
        assert_eq!(out["required"], json!(["café"]));
        assert_eq!(out["properties"]["café"]["type"], json!(["string", "null"]));
    }

    #[test]
    fn what_strict_mode_cannot_say_falls_back_to_loose() {
        let with = |property: Value| json!({"type": "object", "properties": {"p": property}, "required": ["p"]});
        // Keywords outside the subset, or on the wrong type.
        for property in [
            json!({"type": "string", "minLength": 1}),
            json!({"type": "string", "format": "uri"}),
            json!({"oneOf": [{"type": "string"}, {"type": "integer"}]}),
            json!({"allOf": [{"type": "string"}]}),
            json!({"type": "string", "not": {"const": ""}}),
            json!({"type": "array", "items": [{"type": "string"}]}),
            json!({"type": "array", "items": {"type": "string"}, "uniqueItems": true}),
            json!({"type": "integer", "pattern": "^1"}),
            json!({"type": ["string", "integer"]}),
            json!({"type": "file"}),
            // Any value, any object, an open map.
            json!({}),
            json!({"description": "anything"}),
            json!({"type": "object"}),
            json!({"type": "object", "additionalProperties": {"type": "string"}}),
            json!({"type": "object", "properties": {}, "additionalProperties": true}),
            json!({"$ref": "#/$defs/missing"}),
            json!(true),
        ] {
            assert!(is_loose(with(property.clone())), "{property}");
        }
        // The root: an object, never a union or nullable.
        assert!(is_loose(
            json!({"anyOf": [{"type": "object", "properties": {}}]})
        ));
        assert!(is_loose(
            json!({"type": ["object", "null"], "properties": {}})
        ));
        assert!(is_loose(json!({"type": "string"})));
        // A required name without a property.
        assert!(is_loose(
            json!({"type": "object", "properties": {}, "required": ["x"]})
        ));
        // `$defs` below the root.
        assert!(is_loose(with(json!({
            "type": "object", "properties": {}, "$defs": {"a": {"type": "string"}}
        }))));
    }

    #[test]
    fn limits_of_size_and_depth_fall_back_to_loose() {
        let mut deep = json!({"type": "object", "properties": {}});
        for _ in 0..MAX_OBJECT_DEPTH {
            deep = json!({"type": "object", "properties": {"a": deep}});
        }
        assert!(is_loose(deep.clone()));
        let fits = deep["properties"]["a"].clone();
        assert!(!is_loose(fits));

        let many: serde_json::Map<String, Value> = (0..=MAX_PROPERTIES)
            .map(|i| (format!("p{i}"), json!({"type": "string"})))
            .collect();
        assert!(is_loose(json!({"type": "object", "properties": many})));

        let values: Vec<Value> = (0..=MAX_ENUM_VALUES).map(|i| json!(i)).collect();
        assert!(is_loose(with_enum(values)));
        let values: Vec<Value> = (0..MAX_ENUM_VALUES).map(|i| json!(i)).collect();
        assert!(!is_loose(with_enum(values)));
    }

    fn with_enum(values: Vec<Value>) -> Value {
        json!({"type": "object", "properties": {"e": {"type": "integer", "enum": values}}})
    }

    #[test]
    fn normalising_twice_changes_nothing_more() {
        let once = normalised(json!({
            "type": "object",
            "properties": {"a": {"type": "string"}, "b": {"$ref": "#/definitions/b"}},
            "definitions": {"b": {"type": "object", "properties": {"c": {"type": "boolean"}}}}
        }));
        assert!(is_as_it_came(once));
    }
}
