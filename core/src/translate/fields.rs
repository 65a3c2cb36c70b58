//! Typed reads of JSON fields that fail with a 400 naming the field's path.
//!
//! A path is rendered only when an error names it ([`Path`]): a request that is valid
//! costs no formatting.

use std::borrow::Cow;
use std::fmt;

use super::json::document::{self, Fields, Node, Str, TREE_BYTES_FLOOR, TREE_BYTES_PER_BYTE};
use crate::openresponses::{ApiError, ErrorCode};

/// Where a value sits in the request (`input[3].content[0].text`), as a chain of borrowed
/// steps.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Path<'p> {
    /// A path written out already (`""`: the body itself).
    Text(&'p str),
    /// A field of an object.
    Key(&'p Path<'p>, &'p str),
    /// An item of an array.
    Index(&'p Path<'p>, usize),
}

/// The body itself.
pub(crate) const ROOT: Path<'static> = Path::Text("");

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Text(t) => f.write_str(t),
            // `""+"model"` → `model`, `"text"+"format"` → `text.format`.
            Path::Key(Path::Text(""), key) => f.write_str(key),
            Path::Key(parent, key) => write!(f, "{parent}.{key}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

impl Path<'_> {
    fn is_root(&self) -> bool {
        matches!(self, Path::Text(""))
    }
}

/// Joins a parent path and a key: `""+"model"` → `model`, `"text"+"format"` → `text.format`.
pub fn join(parent: &str, key: &str) -> String {
    Path::Key(&Path::Text(parent), key).to_string()
}

pub fn index(parent: &str, i: usize) -> String {
    Path::Index(&Path::Text(parent), i).to_string()
}

pub(crate) fn wrong_type(path: impl fmt::Display, expected: &str, got: &Node<'_>) -> ApiError {
    ApiError::invalid(
        path.to_string(),
        format!(
            "Invalid type for '{path}': expected {expected}, but got {}.",
            got.type_name()
        ),
    )
    .with_code(ErrorCode::InvalidType)
}

pub(crate) fn missing(path: impl fmt::Display) -> ApiError {
    ApiError::invalid(
        path.to_string(),
        format!("Missing required parameter: '{path}'."),
    )
    .with_code(ErrorCode::MissingRequiredParameter)
}

pub(crate) fn bad_value(path: impl fmt::Display, message: impl Into<String>) -> ApiError {
    ApiError::invalid(path.to_string(), message).with_code(ErrorCode::InvalidValue)
}

/// A text of `len` bytes whose JSON values would take more memory to read than its size
/// allows (the body's, or a container of it read later).
pub(crate) fn too_complex(len: usize) -> ApiError {
    ApiError::invalid_body(format!(
        "The request body holds too many JSON values for its size: reading them would take \
         more than {TREE_BYTES_PER_BYTE} bytes of memory per byte of its {len} (and {} KiB), \
         which this server does not give. Send fewer, larger values.",
        TREE_BYTES_FLOOR >> 10
    ))
    .with_status(413)
    .with_code(ErrorCode::RequestTooLarge)
}

/// A kept container read as nodes, within a memory budget of its size. It was checked when
/// the body was read, so this cannot fail otherwise; if it did, the request fails rather than
/// pass unread.
fn opened<'a>(node: Node<'a>) -> Result<Node<'a>, ApiError> {
    match node {
        Node::Kept(raw, kind) => document::open(raw, kind).map_err(|refused| match refused {
            document::Refused::TooComplex => too_complex(raw.get().len()),
            document::Refused::Invalid => ApiError::server(
                500,
                ErrorCode::InternalError,
                "The request could not be read again.",
            ),
        }),
        other => Ok(other),
    }
}

/// An array's items (a kept array parsed now); `Err` gives the value back when it is not one.
pub(crate) fn into_items(node: Node<'_>) -> Result<Result<Vec<Node<'_>>, Node<'_>>, ApiError> {
    Ok(match opened(node)? {
        Node::Array(items) => Ok(items),
        other => Err(other),
    })
}

/// A JSON object being read field by field; `path` locates it in the request.
///
/// Its fields stay in document order, and a field read is removed the way serde_json's
/// ordered map removes it (the last field takes its place), so that "the first field left"
/// (an unknown one, refused) is the one it always was.
pub(crate) struct Obj<'a, 'p> {
    pub fields: Fields<'a>,
    pub path: Path<'p>,
}

impl<'a, 'p> Obj<'a, 'p> {
    pub fn new(value: Node<'a>, path: Path<'p>) -> Result<Self, ApiError> {
        match opened(value)? {
            Node::Object(fields) => Ok(Obj { fields, path }),
            other if path.is_root() => Err(wrong_type("body", "an object", &other)),
            other => Err(wrong_type(path, "an object", &other)),
        }
    }

    /// The path of one of its fields, written out (for an error).
    pub fn field_path(&self, key: &str) -> String {
        Path::Key(&self.path, key).to_string()
    }

    /// Removes a field; JSON `null` counts as absent, as the schema's nullable fields allow.
    pub fn take(&mut self, key: &str) -> Option<Node<'a>> {
        match self.remove(key)? {
            Node::Null => None,
            v => Some(v),
        }
    }

    /// Removes a field, `null` included.
    pub fn remove(&mut self, key: &str) -> Option<Node<'a>> {
        let at = self.fields.iter().position(|(k, _)| k == key)?;
        Some(self.fields.swap_remove(at).1)
    }

    pub fn has(&self, key: &str) -> bool {
        self.fields.iter().any(|(k, v)| k == key && !v.is_null())
    }

    pub fn string(&mut self, key: &str) -> Result<Option<Str<'a>>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(Node::Str(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type(self.field_path(key), "a string", &other)),
        }
    }

    pub fn required_string(&mut self, key: &str) -> Result<Str<'a>, ApiError> {
        self.string(key)?
            .ok_or_else(|| missing(self.field_path(key)))
    }

    pub fn bool(&mut self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.take(key) {
            None => Ok(None),
            Some(Node::Bool(b)) => Ok(Some(b)),
            Some(other) => Err(wrong_type(self.field_path(key), "a boolean", &other)),
        }
    }

    /// A number within `[min, max]`.
    pub fn number(&mut self, key: &str, min: f64, max: f64) -> Result<Option<f64>, ApiError> {
        let parent = self.path;
        let path = Path::Key(&parent, key);
        match self.take(key) {
            None => Ok(None),
            Some(Node::Number(n)) => {
                let x = n.as_f64().filter(|x| x.is_finite()).ok_or_else(|| {
                    bad_value(path, format!("Invalid '{path}': not a finite number."))
                })?;
                if x < min || x > max {
                    return Err(bad_value(
                        path,
                        format!("Invalid '{path}': {x} is out of range; expected a value between {min} and {max}."),
                    ));
                }
                Ok(Some(x))
            }
            Some(other) => Err(wrong_type(path, "a number", &other)),
        }
    }

    /// An integer within `[min, max]`.
    pub fn integer(&mut self, key: &str, min: u64, max: u64) -> Result<Option<u64>, ApiError> {
        let parent = self.path;
        let path = Path::Key(&parent, key);
        match self.take(key) {
            None => Ok(None),
            Some(Node::Number(n)) => {
                let x = n.as_u64().ok_or_else(|| {
                    bad_value(
                        path,
                        format!("Invalid '{path}': expected an integer between {min} and {max}."),
                    )
                })?;
                if x < min || x > max {
                    return Err(bad_value(
                        path,
                        format!("Invalid '{path}': {x} is out of range; expected an integer between {min} and {max}."),
                    ));
                }
                Ok(Some(x))
            }
            Some(other) => Err(wrong_type(path, "an integer", &other)),
        }
    }

    pub fn array(&mut self, key: &str) -> Result<Option<Vec<Node<'a>>>, ApiError> {
        let Some(node) = self.take(key) else {
            return Ok(None);
        };
        match into_items(node)? {
            Ok(items) => Ok(Some(items)),
            Err(other) => Err(wrong_type(self.field_path(key), "an array", &other)),
        }
    }

    pub fn object(&mut self, key: &str) -> Result<Option<Fields<'a>>, ApiError> {
        let Some(node) = self.take(key) else {
            return Ok(None);
        };
        match opened(node)? {
            Node::Object(fields) => Ok(Some(fields)),
            other => Err(wrong_type(self.field_path(key), "an object", &other)),
        }
    }

    /// Removes a field that must be an array if given, without reading it.
    pub fn skip_array(&mut self, key: &str) -> Result<(), ApiError> {
        match self.take(key) {
            Some(node) if !node.is_array() => {
                Err(wrong_type(self.field_path(key), "an array", &node))
            }
            _ => Ok(()),
        }
    }

    /// Removes a field that must be an object if given, without reading it.
    pub fn skip_object(&mut self, key: &str) -> Result<(), ApiError> {
        match self.take(key) {
            Some(node) if !node.is_object() => {
                Err(wrong_type(self.field_path(key), "an object", &node))
            }
            _ => Ok(()),
        }
    }

    /// A string that must be one of `allowed`.
    pub fn enumeration(
        &mut self,
        key: &str,
        allowed: &[&'static str],
    ) -> Result<Option<&'static str>, ApiError> {
        let Some(s) = self.string(key)? else {
            return Ok(None);
        };
        let s: Cow<'_, str> = s.as_str();
        allowed
            .iter()
            .find(|a| **a == s)
            .copied()
            .map(Some)
            .ok_or_else(|| {
                let path = self.field_path(key);
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
            })
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
        self.refuse_first_unknown(Bookkeeping::NotHere)
    }

    /// [`Obj::deny_unknown`] for an input item or a content part, where a client's own
    /// bookkeeping ([`is_client_bookkeeping`]) is accepted and left unread: nothing of an
    /// item but what is read goes upstream. `strict` refuses it like any other field.
    pub fn deny_unknown_in_item(&self, strict: bool) -> Result<(), ApiError> {
        self.refuse_first_unknown(if strict {
            Bookkeeping::Refused
        } else {
            Bookkeeping::Accepted
        })
    }

    fn refuse_first_unknown(&self, bookkeeping: Bookkeeping) -> Result<(), ApiError> {
        let accepted = |k: &str| bookkeeping == Bookkeeping::Accepted && is_client_bookkeeping(k);
        let Some((key, _)) = self
            .fields
            .iter()
            .find(|(k, v)| !v.is_null() && !accepted(k))
        else {
            return Ok(());
        };
        let path = self.field_path(key);
        let why = if bookkeeping == Bookkeeping::Refused && is_client_bookkeeping(key) {
            " This server runs in strict mode: a client's own bookkeeping is refused like any field outside the OpenResponses API."
        } else {
            ""
        };
        Err(
            ApiError::invalid(&path, format!("Unknown parameter: '{path}'.{why}"))
                .with_code(ErrorCode::UnknownParameter),
        )
    }
}

/// What an object does with fields named like a client's bookkeeping.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Bookkeeping {
    /// Not an item or a part: such a name is unknown like any other.
    NotHere,
    /// An item or a part: accepted, left unread.
    Accepted,
    /// An item or a part in strict mode: refused, saying why.
    Refused,
}

/// The names of the fields that carry a client's own bookkeeping on the items and content
/// parts it sends (and sends back), by how they start (and [`BOOKKEEPING_SUFFIXES`]: how
/// they end): accepted there and never sent upstream
/// ([`Obj::deny_unknown_in_item`]), so that the next internal field of a client does not
/// break it. The list is explicit and documented (docs/request-mapping.md); it comes from
/// what clients send: Codex's `internal_chat_message_metadata_passthrough` on every item
/// (its turn id, creation time and content kinds, when it believes it talks to OpenAI) and
/// its top-level `client_metadata`. No field that openai-python 3.57, openai-node 7.57 or the
/// OpenResponses schema types on an item or a part has such a name (tests/e2e/surface.rs
/// checks it against the generated paths), so none of the API's own fields is ever taken
/// for bookkeeping.
pub(crate) const BOOKKEEPING_PREFIXES: &[&str] = &["internal_"];
/// See [`BOOKKEEPING_PREFIXES`].
pub(crate) const BOOKKEEPING_SUFFIXES: &[&str] = &["_metadata", "_passthrough"];

/// Whether a field of an item or a part is a client's own bookkeeping: its name starts with
/// one of [`BOOKKEEPING_PREFIXES`] or ends with one of [`BOOKKEEPING_SUFFIXES`], with more
/// than the affix itself.
pub fn is_client_bookkeeping(name: &str) -> bool {
    let longer = |affix: &str| name.len() > affix.len();
    BOOKKEEPING_PREFIXES
        .iter()
        .any(|p| longer(p) && name.starts_with(p))
        || BOOKKEEPING_SUFFIXES
            .iter()
            .any(|s| longer(s) && name.ends_with(s))
}
