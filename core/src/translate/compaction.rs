//! `compaction` items: a summary sealed into one (with the operator's keys, under
//! [`Purpose::Compaction`] so that neither a reasoning blob nor a compaction opens as the
//! other), opened again from a later request's `input`, and given to the upstream as context.
//!
//! The request side (opening) and the answer side (sealing) both use it, and it uses
//! neither; `sealing` seals and opens for it.

use super::seal::{self, Purpose};
use super::sealing;
use super::{Options, ResponsePlan};
use crate::openresponses::{ApiError, CompactionItem, ErrorCode};

/// How an opened summary is given to the upstream in a later request: a system message at
/// the head of the conversation (after the instructions), this prefix, then the summary.
pub const CONTEXT_PREFIX: &str =
    "Summary of the earlier part of this conversation (compacted; the original messages are not repeated):\n";

/// The system message text of an opened summary.
pub(crate) fn context_text(summary: &str) -> String {
    let mut text = String::with_capacity(CONTEXT_PREFIX.len() + summary.len());
    text.push_str(CONTEXT_PREFIX);
    text.push_str(summary);
    text
}

/// Opens a `compaction` item's `encrypted_content`.
pub(crate) fn open(blob: &str, path: &str, options: &Options) -> Result<String, ApiError> {
    sealing::open(Purpose::Compaction, blob, path, options)
}

/// The summary `summary`, sealed into the `compaction` item that is output item `n` of
/// `plan` (`None` without keys or tenant: the request was refused then).
pub(crate) fn sealed(plan: &ResponsePlan, n: usize, summary: &str) -> Option<CompactionItem> {
    let nonce = seal::nonce(plan.id_seed, n as u64);
    Some(CompactionItem {
        id: plan.item_id("cmp", n),
        encrypted_content: sealing::seal(&plan.options, Purpose::Compaction, summary, nonce)?,
    })
}

/// The `compaction` item that is output item `n` of `plan` as a stream opens it, before its
/// summary: no content yet.
pub(crate) fn opened(plan: &ResponsePlan, n: usize) -> CompactionItem {
    CompactionItem {
        id: plan.item_id("cmp", n),
        encrypted_content: String::new(),
    }
}

/// The upstream answered a summarising request without a summary.
pub(crate) fn no_summary() -> ApiError {
    ApiError::server(
        502,
        ErrorCode::UpstreamInvalidResponse,
        "The upstream's answer to the summarising request has no text.",
    )
}
