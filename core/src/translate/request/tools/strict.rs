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
//! The schema is read in one pass: its subschemas (`properties`, `items`, `anyOf`, `$defs`)
//! are parsed, every other keyword's value is kept as the token it came as. It is checked
//! against the subset; if it needs nothing it is sent as it came, else it is written once,
//! normalised, the kept tokens copied byte for byte.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
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
    let Ok(root) = serde_json::from_str::<Schema<'_>>(schema.get()) else {
        return Strict::Loose;
    };
    let mut check = Check {
        defs: Vec::new(),
        changed: false,
        properties: 0,
        enum_values: 0,
        string_chars: 0,
    };
    if check.root(&root).is_err() {
        return Strict::Loose;
    }
    if !check.changed {
        return Strict::AsItCame;
    }
    let view = View {
        schema: &root,
        optional: false,
        root: true,
    };
    match serde_json::value::to_raw_value(&view) {
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

/// A schema object: its keywords in document order.
#[derive(Debug)]
struct Schema<'s>(Vec<(Key<'s>, Keyword<'s>)>);

/// A keyword's value.
#[derive(Debug)]
enum Keyword<'s> {
    /// One subschema (`items`).
    Schema(Schema<'s>),
    /// Subschemas by name (`properties`, `$defs`, `definitions`).
    Map(Vec<(Key<'s>, Schema<'s>)>),
    /// A list of subschemas (`anyOf`).
    List(Vec<Schema<'s>>),
    /// Anything else, as its token.
    Token(&'s RawValue),
}

impl<'s> Schema<'s> {
    fn get(&self, name: &str) -> Option<&Keyword<'s>> {
        self.0
            .iter()
            .find(|(k, _)| k.as_ref() == name)
            .map(|(_, v)| v)
    }

    fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    fn token(&self, name: &str) -> Option<&'s RawValue> {
        match self.get(name) {
            Some(Keyword::Token(raw)) => Some(raw),
            _ => None,
        }
    }

    fn map(&self, name: &str) -> &[(Key<'s>, Schema<'s>)] {
        match self.get(name) {
            Some(Keyword::Map(entries)) => entries,
            _ => &[],
        }
    }
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

/// How an optional property is made nullable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Nullable {
    /// It takes `null` already (or it is required).
    No,
    /// `"type": "T"` becomes `["T", "null"]`, and `null` joins an `enum`.
    TypeAndEnum,
    /// `{"type": "null"}` joins the `anyOf`.
    AnyOfBranch,
    /// `{"anyOf": [<schema>, {"type": "null"}]}` (a `$ref` or a `const`).
    Wrap,
}

/// An object's `required`, against its properties.
#[derive(Debug)]
enum Required<'s> {
    /// Every property is listed.
    Complete,
    /// Some are (or none, `required` absent): these.
    Partial(Vec<Key<'s>>),
}

/// What normalising does to one schema (the same when it is checked and when it is
/// written).
struct Plan<'s> {
    typed: Option<Typed>,
    nullable: Nullable,
    /// For an object: its `required`.
    required: Option<Required<'s>>,
    /// For an object: `additionalProperties: false` is there.
    closed: bool,
}

impl<'s> Schema<'s> {
    fn plan(&self, optional: bool) -> Walked<Plan<'s>> {
        let typed = type_of(self)?;
        let nullable = if !optional || admits_null(self, typed)? {
            Nullable::No
        } else if self.has("anyOf") {
            Nullable::AnyOfBranch
        } else if (typed.is_some() || self.has("enum")) && !self.has("const") {
            Nullable::TypeAndEnum
        } else {
            Nullable::Wrap
        };
        let object = matches!(
            typed,
            Some(Typed {
                ty: Type::Object,
                ..
            })
        );
        let required = if object { Some(required(self)?) } else { None };
        let closed = self
            .token("additionalProperties")
            .is_some_and(|v| v.get() == "false");
        Ok(Plan {
            typed,
            nullable,
            required,
            closed,
        })
    }
}

/// The check of a schema against the subset, with OpenAI's limits.
struct Check<'s> {
    /// The root's `$defs` (or `definitions`) by section and name, for `$ref`s to resolve.
    defs: Vec<(&'static str, Key<'s>)>,
    /// Normalising changes something.
    changed: bool,
    properties: usize,
    enum_values: usize,
    string_chars: usize,
}

impl<'s> Check<'s> {
    /// The parameters: an object (never a union, never nullable), the only place for `$defs`.
    fn root(&mut self, root: &Schema<'s>) -> Walked {
        for section in ["$defs", "definitions"] {
            for (name, _) in root.map(section) {
                self.count_string(name.len())?;
                self.defs.push((section, name.clone()));
            }
        }
        if !matches!(
            type_of(root)?,
            Some(Typed {
                ty: Type::Object,
                or_null: false
            })
        ) {
            return Err(Loose);
        }
        self.schema(root, 0, false, true)
    }

    fn schema(&mut self, s: &Schema<'s>, objects: usize, optional: bool, root: bool) -> Walked {
        let plan = s.plan(optional)?;
        let typed = plan.typed;
        let (any_of, reference, enumerated, constant) =
            (s.has("anyOf"), s.has("$ref"), s.has("enum"), s.has("const"));
        // Every keyword must be one the subset knows for this kind of schema.
        for (key, value) in &s.0 {
            let token = match value {
                Keyword::Token(raw) => Some(*raw),
                _ => None,
            };
            let known = match (key.as_ref(), typed.map(|t| t.ty)) {
                (k, _) if annotation(k) => token.is_some(),
                ("$schema", _) => root && token.is_some(),
                ("$defs" | "definitions", _) => root,
                ("type", _) => !any_of && !reference,
                ("enum", _) => !any_of && !reference && token.is_some(),
                ("const", _) => !any_of && !reference && !enumerated,
                ("anyOf", _) => typed.is_none() && !reference && !enumerated && !constant,
                ("$ref", _) => typed.is_none() && !enumerated && !constant,
                ("pattern", Some(Type::String)) => token.is_some_and(|t| t.get().starts_with('"')),
                ("format", Some(Type::String)) => match token {
                    Some(t) => FORMATS.contains(&read_str(t)?.as_ref()),
                    None => false,
                },
                (
                    "multipleOf" | "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum",
                    Some(Type::Number | Type::Integer),
                ) => token.is_some_and(is_number),
                ("items", Some(Type::Array)) => matches!(value, Keyword::Schema(_)),
                ("minItems" | "maxItems", Some(Type::Array)) => token.is_some_and(is_number),
                ("properties", Some(Type::Object)) => matches!(value, Keyword::Map(_)),
                ("required", Some(Type::Object)) => token.is_some(),
                // Extra keys the client allows: closing the object would forbid what the
                // schema lets the model send.
                ("additionalProperties", Some(Type::Object)) => plan.closed,
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
        if let Some(values) = s.token("enum") {
            let values = array(values)?;
            self.enum_values += values.len();
            if self.enum_values > MAX_ENUM_VALUES {
                return Err(Loose);
            }
            self.count_string(values.iter().map(|v| v.get().len()).sum())?;
        }
        if let Some(value) = s.get("const") {
            let Keyword::Token(value) = value else {
                return Err(Loose);
            };
            self.count_string(value.get().len())?;
        }
        if let Some(target) = s.get("$ref") {
            let Keyword::Token(target) = target else {
                return Err(Loose);
            };
            self.check_reference(target)?;
        }
        if plan.nullable != Nullable::No {
            self.changed = true;
        }
        for (_, value) in &s.0 {
            match value {
                Keyword::Schema(items) => self.schema(items, objects, false, false)?,
                Keyword::List(branches) => {
                    if branches.is_empty() {
                        return Err(Loose);
                    }
                    for branch in branches {
                        self.schema(branch, objects, false, false)?;
                    }
                }
                Keyword::Map(_) | Keyword::Token(_) => {}
            }
        }
        if root {
            for section in ["$defs", "definitions"] {
                for (_, def) in s.map(section) {
                    self.schema(def, 0, false, false)?;
                }
            }
        }
        let Some(required) = &plan.required else {
            return Ok(());
        };
        // An object.
        let objects = objects + 1;
        if objects > MAX_OBJECT_DEPTH {
            return Err(Loose);
        }
        if !s.has("properties") && !plan.closed {
            // `{"type": "object"}`: any object. Strict mode would allow only `{}`.
            return Err(Loose);
        }
        let properties = s.map("properties");
        self.properties += properties.len();
        if self.properties > MAX_PROPERTIES {
            return Err(Loose);
        }
        if !plan.closed || matches!(required, Required::Partial(_)) && !properties.is_empty() {
            self.changed = true;
        }
        for (name, property) in properties {
            self.count_string(name.len())?;
            self.schema(property, objects, required.optional(name), false)?;
        }
        Ok(())
    }

    fn count_string(&mut self, chars: usize) -> Walked {
        self.string_chars += chars;
        if self.string_chars > MAX_STRING_CHARS {
            return Err(Loose);
        }
        Ok(())
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
                .strip_prefix("#/")
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

impl Required<'_> {
    /// Whether the property `name` was optional.
    fn optional(&self, name: &Key<'_>) -> bool {
        match self {
            Required::Complete => false,
            Required::Partial(listed) => !listed.contains(name),
        }
    }
}

/// An object's `required`, against its properties (a name without a property could never
/// be given: strict mode cannot say it).
fn required<'s>(s: &Schema<'s>) -> Walked<Required<'s>> {
    let names = s.map("properties");
    let listed: Vec<Key<'s>> = match s.get("required") {
        None => Vec::new(),
        Some(Keyword::Token(value)) => array(value)?
            .into_iter()
            .map(read_str)
            .collect::<Walked<_>>()?,
        Some(_) => return Err(Loose),
    };
    if listed.iter().any(|l| !names.iter().any(|(n, _)| n == l)) {
        return Err(Loose);
    }
    if names.iter().all(|(n, _)| listed.contains(n)) {
        Ok(Required::Complete)
    } else {
        Ok(Required::Partial(listed))
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
fn type_of(s: &Schema<'_>) -> Walked<Option<Typed>> {
    let Some(value) = s.get("type") else {
        return Ok(None);
    };
    let Keyword::Token(value) = value else {
        return Err(Loose);
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
fn admits_null(s: &Schema<'_>, typed: Option<Typed>) -> Walked<bool> {
    if typed.is_some_and(|t| t.or_null || t.ty == Type::Null) {
        return Ok(true);
    }
    if let Some(values) = s.token("enum") {
        if array(values)?.iter().any(|v| v.get() == "null") {
            return Ok(true);
        }
    }
    if s.token("const").is_some_and(|v| v.get() == "null") {
        return Ok(true);
    }
    if let Some(Keyword::List(branches)) = s.get("anyOf") {
        for branch in branches {
            if type_of(branch)?.is_some_and(|t| t.or_null || t.ty == Type::Null) {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

fn is_number(value: &RawValue) -> bool {
    value
        .get()
        .starts_with(|c: char| c == '-' || c.is_ascii_digit())
}

fn array(raw: &RawValue) -> Walked<Vec<&RawValue>> {
    serde_json::from_str(raw.get()).map_err(|_| Loose)
}

/// A string, borrowed unless it has escapes.
fn read_str(raw: &RawValue) -> Walked<Key<'_>> {
    serde_json::from_str::<KeySeed<'_>>(raw.get())
        .map(|k| k.0)
        .map_err(|_| Loose)
}

/// A schema as it is written normalised (checked first: what cannot fail there is an
/// error here only in theory).
struct View<'t, 's> {
    schema: &'t Schema<'s>,
    optional: bool,
    root: bool,
}

/// `{"type": "null"}`.
struct NullSchema;

impl Serialize for NullSchema {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(1))?;
        map.serialize_entry("type", "null")?;
        map.end()
    }
}

/// A kept `enum` with `null` added at its end.
struct WithNull<'s>(Vec<&'s RawValue>);

impl Serialize for WithNull<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len() + 1))?;
        for value in &self.0 {
            seq.serialize_element(value)?;
        }
        seq.serialize_element(&())?;
        seq.end()
    }
}

/// Subschemas by name, each written normalised (`optional` for properties the object did
/// not require).
struct MapView<'t, 's> {
    entries: &'t [(Key<'s>, Schema<'s>)],
    required: Option<&'t Required<'s>>,
}

impl Serialize for MapView<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.entries.len()))?;
        for (name, schema) in self.entries {
            let optional = self.required.is_some_and(|r| r.optional(name));
            map.serialize_entry(
                name,
                &View {
                    schema,
                    optional,
                    root: false,
                },
            )?;
        }
        map.end()
    }
}

/// `anyOf`'s branches, each written normalised, and `{"type": "null"}` after them.
struct ListView<'t, 's> {
    branches: &'t [Schema<'s>],
    with_null: bool,
}

impl Serialize for ListView<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.branches.len() + 1))?;
        for schema in self.branches {
            seq.serialize_element(&View {
                schema,
                optional: false,
                root: false,
            })?;
        }
        if self.with_null {
            seq.serialize_element(&NullSchema)?;
        }
        seq.end()
    }
}

/// The property names of an object, for its `required`.
struct Names<'t, 's>(&'t [(Key<'s>, Schema<'s>)]);

impl Serialize for Names<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.0.len()))?;
        for (name, _) in self.0 {
            seq.serialize_element(name)?;
        }
        seq.end()
    }
}

impl Serialize for View<'_, '_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let schema = self.schema;
        let plan = schema
            .plan(self.optional)
            .map_err(|_| S::Error::custom("not in the strict subset"))?;
        if plan.nullable == Nullable::Wrap {
            let inner = View {
                schema,
                optional: false,
                root: self.root,
            };
            let mut map = s.serialize_map(Some(1))?;
            map.serialize_entry("anyOf", &(&inner, &NullSchema))?;
            return map.end();
        }
        let nullable = plan.nullable == Nullable::TypeAndEnum;
        let object = plan.required.as_ref();
        let mut map = s.serialize_map(None)?;
        for (key, value) in &schema.0 {
            match (key.as_ref(), value) {
                ("type", Keyword::Token(_)) if nullable => {
                    let ty = plan.typed.map_or("null", |t| t.ty.name());
                    map.serialize_entry(key, &[ty, "null"])?;
                }
                ("enum", Keyword::Token(values)) if nullable => {
                    let values = array(values).map_err(|_| S::Error::custom("enum"))?;
                    map.serialize_entry(key, &WithNull(values))?;
                }
                ("required", Keyword::Token(raw)) if object.is_some() => match object {
                    Some(Required::Partial(_)) => {
                        map.serialize_entry(key, &Names(schema.map("properties")))?;
                    }
                    _ => map.serialize_entry(key, raw)?,
                },
                ("$defs" | "definitions", Keyword::Map(entries)) if self.root => {
                    map.serialize_entry(
                        key,
                        &MapView {
                            entries,
                            required: None,
                        },
                    )?;
                }
                (_, Keyword::Map(entries)) => {
                    map.serialize_entry(
                        key,
                        &MapView {
                            entries,
                            required: object,
                        },
                    )?;
                }
                (_, Keyword::Schema(items)) => {
                    map.serialize_entry(
                        key,
                        &View {
                            schema: items,
                            optional: false,
                            root: false,
                        },
                    )?;
                }
                (_, Keyword::List(branches)) => {
                    map.serialize_entry(
                        key,
                        &ListView {
                            branches,
                            with_null: plan.nullable == Nullable::AnyOfBranch,
                        },
                    )?;
                }
                (_, Keyword::Token(raw)) => map.serialize_entry(key, raw)?,
            }
        }
        if object.is_some() {
            let properties = schema.map("properties");
            if !schema.has("required") && !properties.is_empty() {
                map.serialize_entry("required", &Names(properties))?;
            }
            if !plan.closed {
                map.serialize_entry("additionalProperties", &false)?;
            }
        }
        map.end()
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

impl Serialize for Key<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

/// A string read borrowed where it can be (serde's `Cow<str>` always copies).
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

/// A schema: an object (a boolean schema has no strict form), read in one pass.
impl<'de> serde::Deserialize<'de> for Schema<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Schema<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a schema object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut fields = Vec::new();
                while let Some(KeySeed(key)) = map.next_key()? {
                    let value = match key.as_ref() {
                        "properties" | "$defs" | "definitions" => {
                            Keyword::Map(map.next_value::<Entries<'de>>()?.0)
                        }
                        "items" => Keyword::Schema(map.next_value()?),
                        "anyOf" => Keyword::List(map.next_value()?),
                        _ => Keyword::Token(map.next_value()?),
                    };
                    fields.push((key, value));
                }
                Ok(Schema(fields))
            }
        }
        d.deserialize_map(V)
    }
}

/// Subschemas by name, in document order.
struct Entries<'s>(Vec<(Key<'s>, Schema<'s>)>);

impl<'de> serde::Deserialize<'de> for Entries<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of schemas")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(KeySeed(key)) = map.next_key()? {
                    entries.push((key, map.next_value()?));
                }
                Ok(Entries(entries))
            }
        }
        d.deserialize_map(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
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
    fn properties_named_like_keywords_and_an_enum_without_type() {
        let out = normalised(json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {
                "properties": {"type": "string"},
                "type": {"enum": ["a", "b"]},
                "anyOf": {"type": "array", "items": {"type": "integer"}, "minItems": 1}
            },
            "required": ["properties"]
        }));
        assert_eq!(
            out,
            json!({
                "$schema": "http://json-schema.org/draft-07/schema#",
                "type": "object",
                "properties": {
                    "properties": {"type": "string"},
                    "type": {"enum": ["a", "b", null]},
                    "anyOf": {"type": ["array", "null"], "items": {"type": "integer"}, "minItems": 1}
                },
                "required": ["properties", "type", "anyOf"],
                "additionalProperties": false
            })
        );
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

    /// Schemas in and around the subset: objects, arrays, unions, references, and a few
    /// keywords outside it.
    fn schema_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(json!({"type": "string"})),
            Just(json!({"type": "integer", "minimum": 1})),
            Just(json!({"type": ["number", "null"]})),
            Just(json!({"enum": ["a", "b"]})),
            Just(json!({"type": "string", "enum": ["x", "y"], "description": "d"})),
            Just(json!({"const": "c"})),
            Just(json!({"type": "boolean", "default": false})),
            Just(json!({"$ref": "#"})),
            Just(json!({"type": "string", "minLength": 1})),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                (
                    proptest::collection::vec(inner.clone(), 0..4),
                    proptest::collection::vec(any::<bool>(), 4),
                    any::<bool>(),
                )
                    .prop_map(|(props, req, closed)| {
                        let mut properties = serde_json::Map::new();
                        let mut required = Vec::new();
                        for (i, p) in props.into_iter().enumerate() {
                            properties.insert(format!("p{i}"), p);
                            if req[i] {
                                required.push(json!(format!("p{i}")));
                            }
                        }
                        let mut o = json!({"type": "object", "properties": properties});
                        if !required.is_empty() {
                            o["required"] = Value::Array(required);
                        }
                        if closed {
                            o["additionalProperties"] = json!(false);
                        }
                        o
                    }),
                inner
                    .clone()
                    .prop_map(|items| json!({"type": "array", "items": items, "maxItems": 3})),
                proptest::collection::vec(inner, 1..3).prop_map(|b| json!({"anyOf": b})),
            ]
        })
    }

    /// Every object has `additionalProperties: false` and lists all its properties in
    /// `required`, in their order.
    fn all_closed_and_required(v: &Value) -> bool {
        let Some(o) = v.as_object() else {
            return true;
        };
        if let Some(Value::Object(properties)) = o.get("properties") {
            let names: Vec<Value> = properties.keys().map(|k| json!(k)).collect();
            let listed = o.get("required").cloned().unwrap_or(json!([]));
            if o.get("additionalProperties") != Some(&json!(false)) || listed != json!(names) {
                return false;
            }
            if !properties.values().all(all_closed_and_required) {
                return false;
            }
        }
        let below = ["items"].iter().filter_map(|k| o.get(*k));
        let branches = o
            .get("anyOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten();
        below.chain(branches).all(all_closed_and_required)
    }

    proptest! {
        #[test]
        fn a_normalised_schema_is_closed_required_and_normalises_to_itself(
            properties in proptest::collection::vec(schema_value(), 0..4),
        ) {
            let mut root = serde_json::Map::new();
            for (i, p) in properties.into_iter().enumerate() {
                root.insert(format!("p{i}"), p);
            }
            let schema = json!({"type": "object", "properties": root});
            match run(schema.clone()) {
                Strict::Normalised(raw) => {
                    let out: Value = serde_json::from_str(raw.get()).unwrap();
                    prop_assert!(all_closed_and_required(&out), "{}", out);
                    prop_assert!(is_as_it_came(out.clone()), "{}", out);
                }
                Strict::AsItCame => prop_assert!(all_closed_and_required(&schema), "{}", schema),
                Strict::Loose => {}
            }
        }
    }
}
