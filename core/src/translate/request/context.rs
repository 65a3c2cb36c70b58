//! Which `input` items reach the upstream around `compaction` items: OpenAI's
//! `context_management` (automatic compaction) and the rule for what comes before the latest
//! compaction.
//!
//! A `compaction` item stands for the conversation it summarised: the items before the latest
//! one are not sent again ([`Visible`]), except the standing ones (`system` and `developer`
//! messages, `additional_tools` items: instructions and tools, which a summary does not carry)
//! and the latest user message before it with what follows it (what the compacted turn ran on
//! verbatim; in a `/v1/responses/compact` answer, the kept user message). A client that keeps
//! appending its history therefore sends more and more, but the upstream gets the same window.
//!
//! An automatic compaction summarises the visible window, and the turn runs on the new
//! `compaction` item followed by what [`compacted`] keeps: the standing items before the latest
//! user message, then that message and everything after it (an agent loop's calls and their
//! outputs), verbatim.

use std::borrow::Cow;

use super::super::fields::{bad_value, index, missing, Obj, Path, ROOT};
use super::super::json::document::{Node, Str};
use crate::openresponses::ApiError;

/// The entry type of `context_management` this server runs.
const COMPACTION: &str = "compaction";

/// `context_management` (OpenAI's `[{"type": "compaction", "compact_threshold": N}]`): the
/// threshold, in estimated input tokens, above which the turn is compacted first. `None`: no
/// automatic compaction (no entry, or an entry without a threshold: the model's context
/// window, which OpenAI's default is a share of, is not known here).
pub(crate) fn compact_threshold(entries: Vec<Node<'_>>) -> Result<Option<u64>, ApiError> {
    const FIELD: Path<'static> = Path::Key(&ROOT, "context_management");
    let mut threshold = None;
    let mut seen = false;
    for (i, entry) in entries.into_iter().enumerate() {
        let path = Path::Index(&FIELD, i);
        let mut entry = Obj::new(entry, path)?;
        let kind = entry
            .string("type")?
            .ok_or_else(|| missing(entry.field_path("type")))?;
        if kind != *COMPACTION {
            let path = entry.field_path("type");
            return Err(bad_value(
                &path,
                format!(
                    "Invalid value for '{path}': '{kind}'. Supported values are: 'compaction'."
                ),
            ));
        }
        if seen {
            let at = index("context_management", i);
            return Err(bad_value(
                &at,
                format!("Invalid '{at}': 'context_management' may hold one 'compaction' entry."),
            ));
        }
        seen = true;
        threshold = entry.integer("compact_threshold", 1, u64::MAX)?;
        entry.deny_unknown()?;
    }
    Ok(threshold)
}

/// What an input item is to these rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Compaction,
    /// A `user` message.
    User,
    /// A `system` or `developer` message, or an `additional_tools` item.
    Standing,
    Other,
}

fn kind(item: &Node<'_>) -> Kind {
    let Node::Object(fields) = item else {
        return Kind::Other;
    };
    let field = |key: &str| match fields.iter().find(|(k, _)| k == key) {
        Some((_, Node::Str(s))) => Some(s),
        _ => None,
    };
    let is = |s: &Str<'_>, want: &str| s.as_str() == want;
    match field("type") {
        Some(t) if is(t, COMPACTION) => return Kind::Compaction,
        Some(t) if is(t, "additional_tools") => return Kind::Standing,
        Some(t) if !is(t, "message") => return Kind::Other,
        _ => {}
    }
    match field("role") {
        Some(r) if is(r, "user") => Kind::User,
        Some(r) if is(r, "system") || is(r, "developer") => Kind::Standing,
        _ => Kind::Other,
    }
}

/// Which items of `input` are translated: all of them, or, with a `compaction` item, those
/// the rule of the module docs keeps.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Visible {
    All,
    From {
        /// The latest user message before the latest compaction (the compaction's index
        /// when there is none).
        from: usize,
        /// The latest compaction item.
        latest: usize,
    },
}

impl Visible {
    /// The rule for `items` (one scan for a compaction item, from the end).
    pub(crate) fn of(items: &[Node<'_>]) -> Visible {
        let Some(latest) = items.iter().rposition(|i| kind(i) == Kind::Compaction) else {
            return Visible::All;
        };
        let from = items[..latest]
            .iter()
            .rposition(|i| kind(i) == Kind::User)
            .unwrap_or(latest);
        Visible::From { from, latest }
    }

    /// Whether item `i` is translated.
    pub(crate) fn keeps(self, i: usize, item: &Node<'_>) -> bool {
        match self {
            Visible::All => true,
            Visible::From { from, latest } => match kind(item) {
                Kind::Compaction => i == latest,
                Kind::Standing => true,
                _ => i >= from,
            },
        }
    }
}

/// Where the visible window of `items` splits for a compaction: the latest user message;
/// `None` when there is nothing to compact (no user message, or nothing but standing items
/// and compactions before it: a new summary would stand for no fewer items).
fn split(items: &[Node<'_>], visible: Visible) -> Option<usize> {
    let kept = |i: usize| visible.keeps(i, &items[i]);
    let user = (0..items.len())
        .rev()
        .find(|&i| kept(i) && kind(&items[i]) == Kind::User)?;
    (0..user)
        .any(|i| kept(i) && matches!(kind(&items[i]), Kind::User | Kind::Other))
        .then_some(user)
}

/// Whether `input` holds something an automatic compaction would summarise away.
pub(crate) fn compactable(input: &Node<'_>) -> bool {
    match input {
        Node::Array(items) => split(items, Visible::of(items)).is_some(),
        _ => false,
    }
}

/// The `input` of the turn after an automatic compaction: the new `compaction` item (its sealed
/// summary `blob`), then the standing items before the latest user message, then that message
/// and every item after it but compactions, verbatim. `input` is what [`compactable`] said yes
/// to.
pub(crate) fn compacted<'a>(input: Node<'a>, blob: String) -> Node<'a> {
    let Node::Array(items) = input else {
        return input;
    };
    let visible = Visible::of(&items);
    let Some(user) = split(&items, visible) else {
        return Node::Array(items);
    };
    let mut turn = Vec::with_capacity(items.len() - user + 1);
    turn.push(Node::Object(vec![
        (Cow::Borrowed("type"), text(COMPACTION)),
        (
            Cow::Borrowed("encrypted_content"),
            Node::Str(Str::Decoded(Cow::Owned(blob))),
        ),
    ]));
    turn.extend(items.into_iter().enumerate().filter_map(|(i, item)| {
        let keep = visible.keeps(i, &item)
            && match kind(&item) {
                Kind::Compaction => false,
                Kind::Standing => true,
                Kind::User | Kind::Other => i >= user,
            };
        keep.then_some(item)
    }));
    Node::Array(turn)
}

fn text(s: &'static str) -> Node<'static> {
    Node::Str(Str::Decoded(Cow::Borrowed(s)))
}
