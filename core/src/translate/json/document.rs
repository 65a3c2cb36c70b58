//! A request body as a borrowed document, read in one pass of serde_json's parser.
//!
//! Containers the translation reads are parsed into [`Node`]s, objects as their fields in
//! document order (a `Vec`: no hashing, and the order the readers rely on, see
//! `translate::fields`). Everything else is kept as the token it came as, borrowed from the
//! body: strings with their escapes ([`Str::Token`]), numbers, and whole containers
//! ([`Node::Kept`]: tool schemas, forwarded fields). So a text is never unescaped to be
//! escaped again, and a schema never becomes a tree to be written out again: what carries
//! over is copied once, byte for byte.
//!
//! What is accepted is exactly what [`super::parse`] (a `Value` tree) accepts: serde_json
//! checks the syntax and what it decodes, and what its scan of a kept token does not check is
//! checked here (a string's surrogate escapes; in a container, the nesting limit, duplicate
//! keys, numbers that may overflow and surrogate escapes). A body this refuses is refused as
//! [`Refused::Invalid`], and the caller asks [`super::check`] for its error, so messages and
//! positions are serde_json's as before.
//!
//! What a read builds besides the text it borrows (nodes, fields, the keys a kept container's
//! check holds, strings decoded; each container is gathered on a scratch stack, then moved into
//! a vector of exactly its size) is counted against a [`Budget`] as it is allocated, before:
//! [`TREE_BYTES_PER_BYTE`] times the text, plus [`TREE_BYTES_FLOOR`]. A body whose values
//! would take more (millions of tiny values: `[0,0,0,…]` is 32 bytes of nodes for every 2 of
//! text) is refused as [`Refused::TooComplex`] where the count crosses it.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::mem::size_of;
use std::sync::OnceLock;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Number;

use super::shape::{self, Capture, Kind};
use crate::chat::request::unescaped_len;

/// The most containers inside one another that serde_json accepts (its recursion limit).
const MAX_NESTING: usize = 127;

/// Objects with more keys than this are checked for duplicates by sorting, not pairwise.
const PAIRWISE_KEYS: usize = 16;

/// What a read may build besides its text, per byte of the text (see [`Budget`]). Requests
/// as agents send them build less than one byte per byte (their texts are kept as tokens); a
/// body of nothing but one-word messages builds about 5 at its peak.
pub const TREE_BYTES_PER_BYTE: usize = 6;

/// What a read may build whatever its size: small bodies are never refused for their shape.
pub const TREE_BYTES_FLOOR: usize = 64 << 10;

/// Why a text is not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// Not JSON that [`super::check`] accepts; it says why.
    Invalid,
    /// Its values would take more memory than its [`Budget`].
    TooComplex,
}

/// The memory one read may build besides the text it borrows, counted before each allocation
/// (a vector's growth, a key or string decoded) and given back when it is freed or shrunk.
#[derive(Debug)]
pub(crate) struct Budget {
    left: Cell<usize>,
    /// The least `left` has been: the read's peak is the budget less this.
    low: Cell<usize>,
    over: Cell<bool>,
}

/// The error a read stops with when its budget is spent.
const OVER_BUDGET: &str = "over the memory budget";

impl Budget {
    /// The budget of a read of `len` bytes of text.
    pub(crate) fn for_text(len: usize) -> Budget {
        let bytes = len
            .saturating_mul(TREE_BYTES_PER_BYTE)
            .saturating_add(TREE_BYTES_FLOOR);
        Budget {
            left: Cell::new(bytes),
            low: Cell::new(bytes),
            over: Cell::new(false),
        }
    }

    /// Counts `bytes` about to be allocated; past the budget, nothing is and the read stops.
    pub(crate) fn charge(&self, bytes: usize) -> Result<(), &'static str> {
        match self.left.get().checked_sub(bytes) {
            Some(left) => {
                self.left.set(left);
                self.low.set(self.low.get().min(left));
                Ok(())
            }
            None => {
                self.over.set(true);
                Err(OVER_BUDGET)
            }
        }
    }

    /// Gives back `bytes` freed.
    pub(crate) fn refund(&self, bytes: usize) {
        self.left.set(self.left.get().saturating_add(bytes));
    }

    /// Whether a charge was refused.
    pub(crate) fn exceeded(&self) -> bool {
        self.over.get()
    }

    /// The most this read held at once, in bytes.
    #[cfg(test)]
    pub(crate) fn peak(&self, len: usize) -> usize {
        Budget::for_text(len).left.get() - self.low.get()
    }
}

/// Pushes `item`, the vector's growth counted first (it doubles, from four).
pub(crate) fn push<T>(items: &mut Vec<T>, item: T, budget: &Budget) -> Result<(), &'static str> {
    if items.len() == items.capacity() {
        let more = items.capacity().max(4);
        budget.charge(more.saturating_mul(size_of::<T>()))?;
        items.reserve_exact(more);
    }
    items.push(item);
    Ok(())
}

/// Where a read gathers the items of the containers open at once, before each is moved into a
/// vector of exactly its count (one allocation a container, no spare room): reused, so they
/// grow once. Their growth is counted in the budget, and kept (they live as long as the read).
#[derive(Default)]
struct Scratch<'a> {
    items: RefCell<Vec<Node<'a>>>,
    fields: RefCell<Fields<'a>>,
}

/// Moves the items gathered since `start` into a vector of their count, counted first.
fn gathered<T>(
    scratch: &RefCell<Vec<T>>,
    start: usize,
    budget: &Budget,
) -> Result<Vec<T>, &'static str> {
    let mut scratch = scratch.borrow_mut();
    budget.charge((scratch.len() - start) * size_of::<T>())?;
    Ok(scratch.drain(start..).collect())
}

/// What a finished read or check held goes back to its budget.
fn release<T>(items: Vec<T>, budget: &Budget) {
    budget.refund(items.capacity() * size_of::<T>());
}

/// An object's fields, in document order.
pub(crate) type Fields<'a> = Vec<(Cow<'a, str>, Node<'a>)>;

/// One JSON value of the body.
#[derive(Debug, Clone)]
pub(crate) enum Node<'a> {
    Null,
    Bool(bool),
    Number(Number),
    Str(Str<'a>),
    Array(Vec<Node<'a>>),
    Object(Fields<'a>),
    /// An array or object kept as it came (checked): parsed as `Kind` only if read.
    Kept(&'a RawValue, Kind),
}

/// A JSON string of the body.
#[derive(Debug, Clone)]
pub(crate) enum Str<'a> {
    /// The token as it came, quotes and escapes included (its surrogate escapes checked).
    Token(&'a RawValue),
    /// A string decoded by serde_json (a short one, or one of a container read whole).
    Decoded(Cow<'a, str>),
}

impl<'a> Str<'a> {
    /// The text, borrowed unless it has escapes.
    pub(crate) fn as_str(&self) -> Cow<'_, str> {
        match self {
            Str::Token(raw) => token_text(raw),
            Str::Decoded(s) => Cow::Borrowed(s),
        }
    }

    /// [`Str::as_str`], for as long as the body.
    pub(crate) fn into_cow(self) -> Cow<'a, str> {
        match self {
            Str::Token(raw) => token_text(raw),
            Str::Decoded(s) => s,
        }
    }

    pub(crate) fn into_string(self) -> String {
        self.into_cow().into_owned()
    }

    /// The length of the text in bytes (escapes decoded): for a token, a scan of it.
    pub(crate) fn len(&self) -> usize {
        match self {
            Str::Token(raw) => unescaped_len(inner(raw)),
            Str::Decoded(s) => s.len(),
        }
    }

    /// At least [`Str::len`], known without a scan: a token's length between its quotes.
    pub(crate) fn len_bound(&self) -> usize {
        match self {
            Str::Token(raw) => inner(raw).len(),
            Str::Decoded(s) => s.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len_bound() == 0
    }

    /// The string as JSON that outlives the body: the token copied as it came.
    pub(crate) fn to_json(&self) -> Box<RawValue> {
        owned_json(self)
    }

    /// The text between the quotes, as JSON has it: escaped, ready to be written into
    /// another JSON string (`None`: a decoded string with characters JSON escapes).
    pub(crate) fn escaped_text(&self) -> Option<&'a str> {
        match self {
            Str::Token(raw) => Some(inner(raw)),
            // Borrowed from the body: it had no escapes there, so it needs none.
            Str::Decoded(Cow::Borrowed(s)) => Some(s),
            Str::Decoded(Cow::Owned(_)) => None,
        }
    }
}

impl PartialEq<str> for Str<'_> {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl fmt::Display for Str<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_str())
    }
}

/// A string token's text between its quotes.
fn inner(raw: &RawValue) -> &str {
    let token = raw.get();
    &token[1..token.len() - 1]
}

/// A string token's text: borrowed without escapes, decoded with (checked when it was
/// read: decoding cannot fail).
fn token_text(raw: &RawValue) -> Cow<'_, str> {
    let text = inner(raw);
    if memchr::memchr(b'\\', text.as_bytes()).is_none() {
        Cow::Borrowed(text)
    } else {
        Cow::Owned(serde_json::from_str(raw.get()).unwrap_or_default())
    }
}

/// A copy of `value` as JSON text, without parsing it again.
pub(crate) fn owned_json<T: Serialize + ?Sized>(value: &T) -> Box<RawValue> {
    // Strings, numbers and tokens into memory: cannot fail.
    serde_json::value::to_raw_value(value).unwrap_or_default()
}

/// A copy of a kept container for the response to echo, on one line: a line break can
/// only stand between JSON's tokens, and there it becomes a space, so that the container
/// fits in an event's `data:` line as the client wrote it otherwise.
pub(crate) fn echoed(raw: &RawValue) -> Box<RawValue> {
    let text = raw.get();
    if memchr::memchr2(b'\n', b'\r', text.as_bytes()).is_none() {
        return owned_json(raw);
    }
    let line = text.replace(['\n', '\r'], " ");
    // Whitespace for whitespace in JSON that was valid: valid.
    RawValue::from_string(line).unwrap_or_else(|_| owned_json(raw))
}

impl Node<'_> {
    /// What the value is, for error messages ("expected an object, but got a string").
    pub(crate) fn type_name(&self) -> &'static str {
        match self {
            Node::Null => "null",
            Node::Bool(_) => "a boolean",
            Node::Number(_) => "a number",
            Node::Str(_) => "a string",
            Node::Array(_) => "an array",
            Node::Object(_) => "an object",
            Node::Kept(raw, _) if raw.get().starts_with('[') => "an array",
            Node::Kept(..) => "an object",
        }
    }

    pub(crate) fn is_null(&self) -> bool {
        matches!(self, Node::Null)
    }

    pub(crate) fn is_object(&self) -> bool {
        match self {
            Node::Object(_) => true,
            Node::Kept(raw, _) => raw.get().starts_with('{'),
            _ => false,
        }
    }

    pub(crate) fn is_array(&self) -> bool {
        match self {
            Node::Array(_) => true,
            Node::Kept(raw, _) => raw.get().starts_with('['),
            _ => false,
        }
    }
}

/// Written as it came where it came as a token; as JSON of the value otherwise.
impl Serialize for Node<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Null => s.serialize_unit(),
            Node::Bool(b) => s.serialize_bool(*b),
            Node::Number(n) => n.serialize(s),
            Node::Str(t) => t.serialize(s),
            Node::Array(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Node::Object(fields) => {
                let mut map = s.serialize_map(Some(fields.len()))?;
                for (k, v) in fields {
                    map.serialize_entry(k, v)?;
                }
                map.end()
            }
            Node::Kept(raw, _) => raw.serialize(s),
        }
    }
}

/// An object's fields written out as JSON: tokens as they came, the rest as their values.
pub(crate) fn object_json(fields: &Fields<'_>) -> Vec<u8> {
    struct Object<'f, 'a>(&'f Fields<'a>);
    impl Serialize for Object<'_, '_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
        }
    }
    // Strings, numbers and tokens into memory: cannot fail.
    serde_json::to_vec(&Object(fields)).unwrap_or_default()
}

impl Serialize for Str<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Str::Token(raw) => raw.serialize(s),
            Str::Decoded(text) => s.serialize_str(text),
        }
    }
}

/// Parses a whole body: a node of `kind` (or whatever value it is), within its [`Budget`].
pub(crate) fn parse(text: &str, kind: Kind) -> Result<Node<'_>, Refused> {
    let budget = Budget::for_text(text.len());
    read(text, kind, false, &budget)
}

/// Parses a kept container (checked when it was kept) into nodes of its kind, within a
/// [`Budget`] of its own text.
pub(crate) fn open<'a>(raw: &'a RawValue, kind: Kind) -> Result<Node<'a>, Refused> {
    let budget = Budget::for_text(raw.get().len());
    read(raw.get(), kind, true, &budget)
}

fn read<'a>(
    text: &'a str,
    kind: Kind,
    checked: bool,
    budget: &Budget,
) -> Result<Node<'a>, Refused> {
    let refused = |_| {
        if budget.exceeded() {
            Refused::TooComplex
        } else {
            Refused::Invalid
        }
    };
    let scratch = Scratch::default();
    let mut de = serde_json::Deserializer::from_str(text);
    let node = Seed {
        capture: Capture::Parse(kind),
        level: 0,
        checked,
        budget,
        scratch: &scratch,
    }
    .deserialize(&mut de)
    .map_err(refused)?;
    de.end().map_err(refused)?;
    Ok(node)
}

/// How to read the value at one position. `level`: the containers around it. `checked`:
/// inside a kept container, which was checked whole when it was kept.
struct Seed<'b, 'a> {
    capture: Capture,
    level: usize,
    checked: bool,
    budget: &'b Budget,
    scratch: &'b Scratch<'a>,
}

impl Clone for Seed<'_, '_> {
    fn clone(&self) -> Self {
        *self
    }
}

impl Copy for Seed<'_, '_> {}

impl<'de> DeserializeSeed<'de> for Seed<'_, 'de> {
    type Value = Node<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Node<'de>, D::Error> {
        match self.capture {
            Capture::Parse(kind) => d.deserialize_any(Parse {
                kind,
                level: self.level,
                checked: self.checked,
                budget: self.budget,
                scratch: self.scratch,
            }),
            Capture::Keep(kind) => {
                let raw = <&'de RawValue>::deserialize(d)?;
                keep(raw, kind, self.level, self.checked, self.budget).map_err(de::Error::custom)
            }
        }
    }
}

/// A kept value as a node: a token, or a container checked as [`super::parse`] would.
fn keep<'a>(
    raw: &'a RawValue,
    kind: Kind,
    level: usize,
    checked: bool,
    budget: &Budget,
) -> Result<Node<'a>, &'static str> {
    let text = raw.get();
    match text.as_bytes().first() {
        Some(b'"') => {
            if !checked && !surrogates_paired(inner(raw)) {
                return Err("a lone surrogate escape");
            }
            Ok(Node::Str(Str::Token(raw)))
        }
        Some(b'{' | b'[') => {
            if !checked {
                check_container(text, level, budget)?;
            }
            Ok(Node::Kept(raw, kind))
        }
        Some(b't') => Ok(Node::Bool(true)),
        Some(b'f') => Ok(Node::Bool(false)),
        Some(b'n') => Ok(Node::Null),
        // A number: serde_json reads it as it reads any (its range checked).
        _ => serde_json::from_str::<Number>(text)
            .map(Node::Number)
            .map_err(|_| "a number out of range"),
    }
}

/// Whether every surrogate escape of a string token's text has its pair: what serde_json
/// requires of a string it decodes, and the one thing its scan of a kept token does not
/// check. Most texts have no `\\u` at all, which one search tells.
fn surrogates_paired(text: &str) -> bool {
    static UNICODE_ESCAPE: OnceLock<memchr::memmem::Finder<'static>> = OnceLock::new();
    let bytes = text.as_bytes();
    let finder = UNICODE_ESCAPE.get_or_init(|| memchr::memmem::Finder::new(b"\\u"));
    if finder.find(bytes).is_none() {
        return true;
    }
    let mut at = 0;
    while let Some(i) = memchr::memchr(b'\\', &bytes[at..]) {
        let i = at + i;
        // serde_json's scan checked the escape: a known letter, or `u` and four hex digits.
        if bytes.get(i + 1) != Some(&b'u') {
            at = i + 2;
            continue;
        }
        let Some(unit) = hex4(bytes, i + 2) else {
            return false;
        };
        match unit {
            0xDC00..=0xDFFF => return false,
            0xD800..=0xDBFF => {
                let paired = bytes.get(i + 6) == Some(&b'\\')
                    && bytes.get(i + 7) == Some(&b'u')
                    && hex4(bytes, i + 8).is_some_and(|low| (0xDC00..=0xDFFF).contains(&low));
                if !paired {
                    return false;
                }
                at = i + 12;
            }
            _ => at = i + 6,
        }
    }
    true
}

fn hex4(bytes: &[u8], at: usize) -> Option<u16> {
    let digits = std::str::from_utf8(bytes.get(at..at + 4)?).ok()?;
    u16::from_str_radix(digits, 16).ok()
}

/// Checks a kept container for what serde_json's scan of it (which checked its syntax) does
/// not, and its parse into a tree would: the nesting limit (counting the `level` containers
/// around it), duplicate keys (decoded), numbers out of range and lone surrogate escapes.
/// Well-formed JSON is all it has to walk: strings end at the first unescaped quote, and a
/// string right after `{` or an object's `,` is a key. The keys of its open objects are what
/// it holds, within `budget`.
fn check_container(text: &str, level: usize, budget: &Budget) -> Result<(), &'static str> {
    // The open containers: an object's frame is where its keys start in `keys`.
    let mut frames: Vec<Option<usize>> = Vec::new();
    let mut keys: Vec<Cow<'_, str>> = Vec::new();
    let checked = walk_container(text, level, &mut frames, &mut keys, budget);
    for key in &keys {
        if let Cow::Owned(k) = key {
            budget.refund(k.capacity());
        }
    }
    release(frames, budget);
    release(keys, budget);
    checked
}

fn walk_container<'t>(
    text: &'t str,
    level: usize,
    frames: &mut Vec<Option<usize>>,
    keys: &mut Vec<Cow<'t, str>>,
    budget: &Budget,
) -> Result<(), &'static str> {
    let bytes = text.as_bytes();
    let mut expect_key = false;
    let mut at = 0;
    while let Some(&byte) = bytes.get(at) {
        match byte {
            b'{' | b'[' => {
                if level + frames.len() + 1 > MAX_NESTING {
                    return Err("nested too deep");
                }
                let object = byte == b'{';
                push(frames, object.then_some(keys.len()), budget)?;
                expect_key = object;
                at += 1;
            }
            b'}' | b']' => {
                if let Some(Some(start)) = frames.pop() {
                    if has_duplicates(&keys[start..], budget)? {
                        return Err("a duplicate key");
                    }
                    for key in keys.drain(start..) {
                        if let Cow::Owned(k) = key {
                            budget.refund(k.capacity());
                        }
                    }
                }
                expect_key = false;
                at += 1;
            }
            b',' => {
                expect_key = matches!(frames.last(), Some(Some(_)));
                at += 1;
            }
            b'"' => {
                let (end, escaped) = string_end(bytes, at + 1).ok_or("an unterminated string")?;
                let inner = &text[at + 1..end];
                if escaped && !surrogates_paired(inner) {
                    return Err("a lone surrogate escape");
                }
                if expect_key {
                    let key = if escaped {
                        // Decoded, it is no longer than its token.
                        budget.charge(end - at)?;
                        let decoded: String =
                            serde_json::from_str(&text[at..=end]).map_err(|_| "a bad key")?;
                        budget.refund((end - at).saturating_sub(decoded.capacity()));
                        Cow::Owned(decoded)
                    } else {
                        Cow::Borrowed(inner)
                    };
                    push(keys, key, budget)?;
                    expect_key = false;
                }
                at = end + 1;
            }
            b'-' | b'0'..=b'9' => {
                let len = bytes[at..]
                    .iter()
                    .position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
                    .unwrap_or(bytes.len() - at);
                let number = &text[at..at + len];
                // Only an exponent or hundreds of digits overflow: serde_json reads those.
                let may_overflow = len > 20 || number.contains(['e', 'E']);
                if may_overflow && serde_json::from_str::<Number>(number).is_err() {
                    return Err("a number out of range");
                }
                at += len;
            }
            // `:`, whitespace, `true`, `false`, `null`.
            _ => at += 1,
        }
    }
    Ok(())
}

/// The index of the quote that ends the string whose text starts at `from`, and whether
/// the string has escapes.
fn string_end(bytes: &[u8], mut from: usize) -> Option<(usize, bool)> {
    let mut escaped = false;
    loop {
        let i = from + memchr::memchr2(b'"', b'\\', bytes.get(from..)?)?;
        if bytes[i] == b'"' {
            return Some((i, escaped));
        }
        // An escape: its letter (or `u` and four hex digits, none of them a quote) follows.
        escaped = true;
        from = i + 2;
    }
}

/// Whether two of `keys` are equal (many are sorted in a copy, counted in `budget`).
fn has_duplicates<K: AsRef<str>>(keys: &[K], budget: &Budget) -> Result<bool, &'static str> {
    if keys.len() <= PAIRWISE_KEYS {
        return Ok(keys
            .iter()
            .enumerate()
            .any(|(i, k)| keys[..i].iter().any(|p| p.as_ref() == k.as_ref())));
    }
    let bytes = keys.len() * size_of::<&str>();
    budget.charge(bytes)?;
    let mut sorted: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
    sorted.sort_unstable();
    let twice = sorted.windows(2).any(|w| w[0] == w[1]);
    drop(sorted);
    budget.refund(bytes);
    Ok(twice)
}

/// An object key: borrowed from the text unless it has escapes (then decoded, counted in
/// `budget` when there is one).
pub(crate) struct KeySeed<'b>(pub Option<&'b Budget>);

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Cow<'de, str>, E> {
        if let Some(budget) = self.0 {
            budget.charge(v.len()).map_err(E::custom)?;
        }
        Ok(Cow::Owned(v.to_owned()))
    }
}

/// Parses a value at a position captured as [`Capture::Parse`].
struct Parse<'b, 'a> {
    kind: Kind,
    level: usize,
    checked: bool,
    budget: &'b Budget,
    scratch: &'b Scratch<'a>,
}

impl<'b, 'a> Parse<'b, 'a> {
    fn inside(&self, capture: Capture) -> Seed<'b, 'a> {
        Seed {
            capture,
            level: self.level + 1,
            checked: self.checked,
            budget: self.budget,
            scratch: self.scratch,
        }
    }
}

impl<'de> Visitor<'de> for Parse<'_, 'de> {
    type Value = Node<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Node<'de>, E> {
        Ok(Node::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Node<'de>, E> {
        Ok(Node::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Node<'de>, E> {
        Ok(Node::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Node<'de>, E> {
        Ok(Number::from_f64(v).map_or(Node::Null, Node::Number))
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Node<'de>, E> {
        Ok(Node::Str(Str::Decoded(Cow::Borrowed(v))))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Node<'de>, E> {
        self.budget.charge(v.len()).map_err(E::custom)?;
        Ok(Node::Str(Str::Decoded(Cow::Owned(v.to_owned()))))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Node<'de>, E> {
        self.budget.charge(v.capacity()).map_err(E::custom)?;
        Ok(Node::Str(Str::Decoded(Cow::Owned(v))))
    }

    fn visit_unit<E>(self) -> Result<Node<'de>, E> {
        Ok(Node::Null)
    }

    fn visit_none<E>(self) -> Result<Node<'de>, E> {
        Ok(Node::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node<'de>, A::Error> {
        if self.level + 1 > MAX_NESTING {
            return Err(de::Error::custom("nested too deep"));
        }
        let inside = self.inside(shape::element(self.kind));
        let start = self.scratch.items.borrow().len();
        while let Some(item) = seq.next_element_seed(inside)? {
            push(&mut self.scratch.items.borrow_mut(), item, self.budget)
                .map_err(de::Error::custom)?;
        }
        let items = gathered(&self.scratch.items, start, self.budget).map_err(de::Error::custom)?;
        Ok(Node::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node<'de>, A::Error> {
        if self.level + 1 > MAX_NESTING {
            return Err(de::Error::custom("nested too deep"));
        }
        let start = self.scratch.fields.borrow().len();
        while let Some(key) = map.next_key_seed(KeySeed(Some(self.budget)))? {
            let value = map.next_value_seed(self.inside(shape::child(self.kind, &key)))?;
            push(
                &mut self.scratch.fields.borrow_mut(),
                (key, value),
                self.budget,
            )
            .map_err(de::Error::custom)?;
        }
        let fields =
            gathered(&self.scratch.fields, start, self.budget).map_err(de::Error::custom)?;
        if !self.checked && has_duplicates_in(&fields, self.budget).map_err(de::Error::custom)? {
            return Err(de::Error::custom("a duplicate key"));
        }
        Ok(Node::Object(fields))
    }
}

fn has_duplicates_in(fields: &Fields<'_>, budget: &Budget) -> Result<bool, &'static str> {
    if fields.len() <= PAIRWISE_KEYS {
        return Ok(fields
            .iter()
            .enumerate()
            .any(|(i, (k, _))| fields[..i].iter().any(|(p, _)| p == k)));
    }
    let bytes = fields.len() * size_of::<&str>();
    budget.charge(bytes)?;
    let keys: Vec<&str> = fields.iter().map(|(k, _)| k.as_ref()).collect();
    let twice = has_duplicates(&keys, budget);
    drop(keys);
    budget.refund(bytes);
    twice
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    /// What the tree parser makes of `text`, and what the document makes of it (as a value).
    fn both(text: &str) -> (Option<Value>, Option<Value>) {
        let tree = super::super::parse(text.as_bytes()).ok();
        let doc = parse(text, Kind::Request)
            .ok()
            .map(|node| serde_json::to_value(&node).expect("a document is JSON"));
        (tree, doc)
    }

    /// The document accepts exactly what the tree parser accepts, with the same value.
    #[track_caller]
    fn agrees(text: &str) {
        let (tree, doc) = both(text);
        assert_eq!(tree, doc, "{text:.300}");
    }

    /// `n` arrays around `inner`.
    fn nested(n: usize, inner: &str) -> String {
        format!("{}{inner}{}", "[".repeat(n), "]".repeat(n))
    }

    /// A document with `value` at each position the shapes treat differently: parsed
    /// (`input`, an item's `content`), kept (an unknown field, `metadata`, a tool's
    /// `parameters`, a part's `text`, `text.format.schema`) and kept then read (`output`).
    fn placed(value: &str) -> Vec<String> {
        vec![
            format!(r#"{{"model":"m","x":{value}}}"#),
            format!(r#"{{"model":"m","metadata":{value}}}"#),
            format!(r#"{{"model":"m","temperature":{value}}}"#),
            format!(r#"{{"input":{value}}}"#),
            format!(r#"{{"input":[{{"type":"message","content":{value}}}]}}"#),
            format!(r#"{{"input":[{{"content":[{{"type":"input_text","text":{value}}}]}}]}}"#),
            format!(r#"{{"input":[{{"type":"function_call_output","output":{value}}}]}}"#),
            format!(r#"{{"input":[{{"type":"function_call_output","output":[{value}]}}]}}"#),
            format!(r#"{{"tools":[{{"type":"function","parameters":{value}}}]}}"#),
            format!(r#"{{"tools":[{{"type":"function","parameters":{{"p":[{value}]}}}}]}}"#),
            format!(r#"{{"text":{{"format":{{"type":"json_schema","schema":{value}}}}}}}"#),
            format!(r#"{{"reasoning":{{"effort":{value}}}}}"#),
        ]
    }

    #[test]
    fn the_nesting_limit_is_serde_jsons_wherever_the_value_is() {
        for depth in 118..=130 {
            for text in placed(&nested(depth, "1")) {
                agrees(&text);
            }
            agrees(&nested(depth, "{}"));
            agrees(&format!(r#"{{"a":{}}}"#, nested(depth, r#"{"b":1}"#)));
        }
    }

    #[test]
    fn duplicate_keys_are_refused_wherever_they_are() {
        for value in [
            r#"{"a":1,"a":2}"#,
            r#"{"a":1,"\u0061":2}"#,
            r#"[{"k":1},{"k":1,"k":null}]"#,
            r#"{"a":{"b":1,"c":2},"d":{"b":1,"b":1}}"#,
        ] {
            for text in placed(value) {
                agrees(&text);
            }
        }
        // Many keys: the sorted check.
        let keys: Vec<String> = (0..40).map(|i| format!(r#""k{i}":{i}"#)).collect();
        let unique = format!("{{{}}}", keys.join(","));
        let twice = format!(r#"{{{},"k7":0}}"#, keys.join(","));
        for value in [&unique, &twice] {
            for text in placed(value) {
                agrees(&text);
            }
        }
        agrees(r#"{"model":"a","model":"b"}"#);
        agrees(r#"{"model":"a","mod\u0065l":"b"}"#);
    }

    #[test]
    fn strings_are_checked_as_serde_json_decodes_them() {
        for value in [
            r#""plain""#,
            r#""with \"escapes\" \n \t \\ \/ \b \f \r""#,
            r#""\u00e9\u20ac\ud83d\ude00""#,
            r#""\ud800""#,
            r#""\udc00""#,
            r#""\ud800\u0041""#,
            r#""\ud800\n""#,
            r#""\ud800x""#,
            r#""\\ud800""#,
            r#""\\\ud800""#,
            r#""a\\u""#,
            r#""\uD83D\uDE00""#,
            r#""\u12""#,
            r#""\x""#,
            "\"tab\there\"",
            "\"nul\u{0}\"",
        ] {
            for text in placed(value) {
                agrees(&text);
            }
        }
    }

    #[test]
    fn numbers_are_read_as_serde_json_reads_them() {
        for value in [
            "0",
            "-0",
            "1.5",
            "-2e-3",
            "1e308",
            "1e309",
            "-1e400",
            "1e-400",
            "123456789012345678901234567890",
            "18446744073709551616",
            "-9223372036854775809",
            "01",
            "1.",
            "-",
            "2E+2",
        ] {
            for text in placed(value) {
                agrees(&text);
            }
        }
    }

    #[test]
    fn syntax_errors_and_other_documents_agree() {
        for text in [
            "",
            " ",
            "{",
            "{}",
            "[]",
            "null",
            "\"s\"",
            "12",
            r#"{"a":1} x"#,
            r#"{"a":1,}"#,
            r#"{"a" 1}"#,
            r#"{"input":[1,]}"#,
            r#"{"x":[1 2]}"#,
            r#"{"x":{"a":1 "b":2}}"#,
            r#"{"x":tru}"#,
            " {\"model\" : \"m\" , \"x\" : [ 1 , { \"a\" : null } ] } ",
        ] {
            agrees(text);
        }
    }

    #[test]
    fn a_kept_container_reads_as_the_same_nodes() {
        let text = r#"{"input":[{"type":"function_call_output","output":[{"type":"input_text","text":"a\nb"}]}]}"#;
        let Ok(Node::Object(fields)) = parse(text, Kind::Request) else {
            panic!("an object");
        };
        let Node::Array(items) = &fields[0].1 else {
            panic!("input is parsed");
        };
        let Node::Object(item) = &items[0] else {
            panic!("an item");
        };
        let Node::Kept(raw, kind) = item[1].1 else {
            panic!("output is kept: {:?}", item[1].1);
        };
        let opened = open(raw, kind).expect("checked when kept");
        assert_eq!(
            serde_json::to_value(&opened).unwrap(),
            serde_json::json!([{"type": "input_text", "text": "a\nb"}])
        );
        let Node::Array(parts) = opened else {
            panic!("an array");
        };
        let Node::Object(part) = &parts[0] else {
            panic!("a part");
        };
        // The part's text is a token: as it came, and its text decoded on demand.
        let Node::Str(text) = &part[1].1 else {
            panic!("a string");
        };
        assert!(matches!(text, Str::Token(_)));
        assert_eq!(text.escaped_text(), Some(r"a\nb"));
        assert_eq!(text.as_str(), "a\nb");
        assert_eq!((text.len(), text.len_bound()), (3, 4));
    }

    /// What a read of `text` held at most, and whether it was refused for its budget.
    fn read_peak(text: &str) -> (usize, Result<(), Refused>) {
        let budget = Budget::for_text(text.len());
        let read = read(text, Kind::Request, false, &budget).map(drop);
        (budget.peak(text.len()), read)
    }

    /// `n` copies of `item`, comma-separated.
    fn many(item: &str, n: usize) -> String {
        vec![item; n].join(",")
    }

    #[test]
    fn a_tree_of_tiny_values_is_refused_at_its_budget() {
        // The issue's shape where the body's nodes are read (`input`), and its cousins: tiny
        // values at every position that is parsed. Each is over the budget by far.
        for text in [
            format!(r#"{{"input":[{}]}}"#, many("0", 1_000_000)),
            format!(r#"{{"input":[{}]}}"#, many("{}", 1_000_000)),
            format!(r#"{{"input":[{{"content":[{}]}}]}}"#, many("[]", 1_000_000)),
            format!(r#"{{"tools":[{}]}}"#, many("null", 500_000)),
            format!(r#"{{"reasoning":{{"a":[{}]}}}}"#, many("1", 1_000_000)),
        ] {
            let (peak, read) = read_peak(&text);
            assert_eq!(read, Err(Refused::TooComplex), "{:.40}", text);
            let budget = text.len() * TREE_BYTES_PER_BYTE + TREE_BYTES_FLOOR;
            assert!(peak <= budget, "{peak} > {budget}: {:.40}", text);
        }
    }

    #[test]
    fn what_a_read_holds_stays_within_its_budget_just_under_and_over() {
        // Tiny values one short of the budget read; the same with more refused. `[{},{},…]`
        // in `input`: 32 bytes of node for every 3 of text, its vector doubling as it grows.
        let fits = |n: usize| {
            let text = format!(r#"{{"input":[{}]}}"#, many("{}", n));
            read_peak(&text)
        };
        let mut n = 1000;
        while fits(n).1.is_ok() {
            n *= 2;
        }
        // Between the last that fit and the first that did not: one more item crosses it.
        let (mut lo, mut hi) = (n / 2, n);
        while hi - lo > 1 {
            let mid = (lo + hi) / 2;
            if fits(mid).1.is_ok() {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let (peak, read) = fits(lo);
        assert!(read.is_ok());
        let len = format!(r#"{{"input":[{}]}}"#, many("{}", lo)).len();
        assert!(peak <= len * TREE_BYTES_PER_BYTE + TREE_BYTES_FLOOR);
        assert_eq!(fits(hi).1, Err(Refused::TooComplex));
        assert_eq!(fits(hi * 4).1, Err(Refused::TooComplex));
    }

    #[test]
    fn requests_as_clients_send_them_build_little() {
        // Many one-word messages (the densest that clients send), parts, calls and outputs,
        // a kept container with many keys: all read, within their budget.
        let item = r#"{"type":"message","role":"user","content":"hi"}"#;
        let parts =
            r#"{"type":"message","role":"user","content":[{"type":"input_text","text":"hi"}]}"#;
        let call = r#"{"type":"function_call","call_id":"call_1","name":"shell","arguments":"{\"cmd\":[\"ls\"]}"}"#;
        let output =
            r#"{"type":"function_call_output","call_id":"call_1","output":"a.txt\nb.txt"}"#;
        let keys: Vec<String> = (0..100_000).map(|i| format!(r#""k{i}":{i}"#)).collect();
        for text in [
            format!(r#"{{"model":"m","input":[{}]}}"#, many(item, 100_000)),
            format!(r#"{{"model":"m","input":[{}]}}"#, many(parts, 100_000)),
            format!(
                r#"{{"model":"m","input":[{},{}]}}"#,
                many(call, 50_000),
                many(output, 50_000)
            ),
            format!(
                r#"{{"model":"m","input":"x","metadata":{{{}}}}}"#,
                keys.join(",")
            ),
        ] {
            let (peak, read) = read_peak(&text);
            assert_eq!(read, Ok(()), "{:.60}", text);
            assert!(
                peak < text.len() * TREE_BYTES_PER_BYTE,
                "{peak} for {} bytes: {:.60}",
                text.len(),
                text
            );
        }
    }

    #[test]
    fn a_refused_body_holds_nothing_of_its_values() {
        // The issue's body: 8.3 million zeros kept (not read) and a byte after the end.
        let text = format!(r#"{{"a":[{}]}}x"#, many("0", 1_000_000));
        let (peak, read) = read_peak(&text);
        assert_eq!(read, Err(Refused::Invalid));
        assert!(peak < 1024, "{peak}");
    }

    #[test]
    fn an_echoed_container_is_on_one_line() {
        let text = "{\r\n  \"type\": \"object\",\n  \"a b\": [1,\n 2]\n}";
        let raw: &RawValue = serde_json::from_str(text).unwrap();
        let copy = echoed(raw);
        assert!(!copy.get().contains(['\n', '\r']), "{}", copy.get());
        let value: Value = serde_json::from_str(copy.get()).unwrap();
        assert_eq!(value, serde_json::json!({"type": "object", "a b": [1, 2]}));
        // Without line breaks: the client's bytes.
        let compact: &RawValue = serde_json::from_str(r#"{ "a" : 1 }"#).unwrap();
        assert_eq!(echoed(compact).get(), r#"{ "a" : 1 }"#);
    }

    /// JSON text of any shape, with the keys the shapes know, keys that decode alike, and
    /// the numbers and strings serde_json refuses or reads its own way.
    fn json_text() -> impl Strategy<Value = String> {
        let number = prop::sample::select(vec![
            "0",
            "-0",
            "7",
            "1.5",
            "1e400",
            "-1e309",
            "1e-400",
            "18446744073709551616",
        ]);
        let string = prop::sample::select(vec![
            r#""a""#,
            r#""x\ny""#,
            r#""\ud800""#,
            r#""\ud83d\ude00""#,
            r#""\udc00""#,
            r#""\\ud800""#,
            r#""\u0041""#,
        ]);
        let leaf = prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            number.prop_map(str::to_owned),
            string.prop_map(str::to_owned),
        ];
        let key = prop::sample::select(vec![
            "input",
            "tools",
            "content",
            "text",
            "parameters",
            "output",
            "type",
            "format",
            "schema",
            "metadata",
            "arguments",
            "a",
            r"\u0061",
            "summary",
            "instructions",
        ]);
        leaf.prop_recursive(6, 48, 5, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5)
                    .prop_map(|items| format!("[{}]", items.join(","))),
                prop::collection::vec((key.clone(), inner), 0..5).prop_map(|fields| {
                    let fields: Vec<String> = fields
                        .iter()
                        .map(|(k, v)| format!(r#""{k}":{v}"#))
                        .collect();
                    format!("{{{}}}", fields.join(","))
                }),
            ]
        })
    }

    proptest! {
        #[test]
        fn any_document_is_accepted_as_the_tree_parser_accepts_it(
            text in json_text(),
            depth in prop_oneof![Just(0usize), 120usize..130],
        ) {
            let (tree, doc) = both(&text);
            prop_assert_eq!(tree, doc, "{}", text);
            let wrapped = format!(r#"{{"input":{}}}"#, nested(depth, &text));
            let (tree, doc) = both(&wrapped);
            prop_assert_eq!(tree, doc, "{}", wrapped);
            let kept = format!(r#"{{"x":{}}}"#, nested(depth, &text));
            let (tree, doc) = both(&kept);
            prop_assert_eq!(tree, doc, "{}", kept);
            // The same with whitespace between the tokens (no generated string holds `,`
            // or `:`).
            let spaced = kept.replace(',', " ,\n\t").replace(':', " : ").replace('[', "[ ");
            let (tree, doc) = both(&spaced);
            prop_assert_eq!(tree, doc, "{}", spaced);
        }
    }
}
