//! The summarising Chat request of a compaction, shared by `POST /v1/responses/compact`
//! and a `compaction_trigger` in a `/v1/responses` request: the prompt, the window, and the
//! request to summarise it.

use super::input::{merge_leading_system, system_message, Input};
use crate::chat::request::{Content, Message, Text};
use crate::translate::Options;

/// The system instruction of the summarising request (the first system message, merged with
/// the summaries of earlier compactions when the window carries some).
pub const PROMPT: &str = "You compress conversations. The messages that follow are a conversation between a user and an AI assistant, with its tool calls and their results. Write a summary that lets the assistant continue the conversation without the original messages: the user's goals and requests, decisions made, facts and results established (names, identifiers, numbers, code, tool results that matter), what has been done and what remains open. Be concise but complete. Write only the summary, in plain text, with no preamble.";

/// The last user message of the summarising request, so that a model does not answer the
/// conversation's own last question instead.
pub const REQUEST: &str =
    "Summarise the conversation above now, as instructed. Do not answer or continue it.";

/// Before the upstream's view of the instructions the client gave the compacted exchange.
const INSTRUCTIONS_NOTE: &str =
    "The assistant was following these instructions, which it will be given again (do not repeat them in the summary):\n";

/// The Chat messages of a summarising request: the prompt (and the client's instructions,
/// as a note), the window's earlier summaries, the window, and the request to summarise it.
pub(crate) fn summarising_messages<'a>(
    instructions: Option<Text<'a>>,
    window: Input<'a>,
    options: &Options,
) -> Vec<Message<'a>> {
    let mut prompt = Text::plain(PROMPT);
    if let Some(instructions) = instructions {
        prompt.push_plain("\n\n");
        prompt.push_plain(INSTRUCTIONS_NOTE);
        prompt.push(instructions);
    }
    let Input {
        messages: mut conversation,
        mut context,
        ..
    } = window;
    let mut messages = vec![system_message(prompt, options)];
    messages.append(&mut context);
    messages.append(&mut conversation);
    messages.push(Message::User {
        content: Content::Text(Text::plain(REQUEST)),
    });
    merge_leading_system(messages)
}
