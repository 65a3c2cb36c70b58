//! `input` items → Chat messages (messages and their content parts, tool calls and their
//! outputs, reasoning, compaction summaries), with the size caps on each part.

use serde_json::{json, Value};

use crate::chat::request::{
    Assistant, Content, File, Function, FunctionKind, ImageUrl, Message, Part, ToolCall, VideoUrl,
};
use crate::openresponses::ApiError;
use crate::translate::fields::{bad_value, index, missing, wrong_type, Obj};
use crate::translate::{flat_name, DeveloperRole, Options};

/// The input items as Chat messages, in order. Summaries opened from `compaction` items go to
/// `context` instead: the caller puts them at the head, next to the instructions, because
/// most chat templates accept system messages only there.
pub(crate) fn input_messages(
    input: Value,
    messages: &mut Vec<Message>,
    context: &mut Vec<Message>,
    options: &Options,
) -> Result<(), ApiError> {
    let items = match input {
        Value::String(s) if s.is_empty() => {
            return Err(bad_value("input", "Invalid 'input': must not be empty."))
        }
        Value::String(s) => {
            check_part_size("input", s.len(), options)?;
            messages.push(Message::User {
                content: Content::Text(s),
            });
            return Ok(());
        }
        Value::Array(a) if a.is_empty() => {
            return Err(bad_value(
                "input",
                "Invalid 'input': must contain at least one item.",
            ))
        }
        Value::Array(a) if a.len() > options.max_input_items => {
            return Err(bad_value(
                "input",
                format!(
                    "Invalid 'input': {} items; this server accepts at most {}.",
                    a.len(),
                    options.max_input_items
                ),
            )
            .with_code("too_many_input_items"))
        }
        Value::Array(a) => a,
        other => return Err(wrong_type("input", "a string or an array of items", &other)),
    };
    // Reasoning text waiting for the assistant message that follows it.
    let mut pending_reasoning: Option<String> = None;
    for (i, item) in items.into_iter().enumerate() {
        let path = index("input", i);
        let mut item = Obj::new(item, &path)?;
        let kind = match item.take("type") {
            None if item.has("role") => "message".to_owned(),
            None if item.has("id") => "item_reference".to_owned(),
            None => return Err(missing(&item.field_path("type"))),
            Some(Value::String(s)) => s,
            Some(other) => return Err(wrong_type(&item.field_path("type"), "a string", &other)),
        };
        item.string("id")?;
        match kind.as_str() {
            // Provider extensions (`slug:type`) mean nothing to a Chat upstream: dropped.
            kind if is_extension(kind) => {}
            "message" => {
                let mut msg = message(item, options)?;
                if let Message::Assistant(turn) = &mut msg {
                    turn.reasoning_content = pending_reasoning.take();
                }
                messages.push(msg);
            }
            "function_call" => {
                let call_id = item.required_string("call_id")?;
                let name = item.required_string("name")?;
                let arguments = item.required_string("arguments")?;
                check_part_size(&item.field_path("arguments"), arguments.len(), options)?;
                // A call of a `namespace` function: the upstream knows it by its flat name.
                let name = match item.string("namespace")? {
                    Some(ns) => flat_name(&ns, &name),
                    None => name,
                };
                item.string("status")?;
                item.deny_unknown()?;
                push_tool_call(messages, &mut pending_reasoning, call_id, name, arguments);
            }
            // A call of a `custom` tool: the upstream made it as a function whose one
            // parameter is the input (see `custom_tool`).
            "custom_tool_call" => {
                let call_id = item.required_string("call_id")?;
                let name = item.required_string("name")?;
                let input = item.required_string("input")?;
                check_part_size(&item.field_path("input"), input.len(), options)?;
                item.string("status")?;
                item.deny_unknown()?;
                let arguments = json!({ crate::translate::CUSTOM_TOOL_INPUT: input }).to_string();
                push_tool_call(messages, &mut pending_reasoning, call_id, name, arguments);
            }
            "function_call_output" | "custom_tool_call_output" => {
                let call_id = item.required_string("call_id")?;
                let output_path = item.field_path("output");
                let output = match item.take("output") {
                    Some(Value::String(s)) => s,
                    Some(Value::Array(parts)) => text_of_parts(parts, &output_path, options)?,
                    Some(other) => return Err(wrong_type(&output_path, "a string or an array", &other)),
                    None => return Err(missing(&output_path)),
                };
                check_part_size(&output_path, output.len(), options)?;
                item.string("status")?;
                item.deny_unknown()?;
                messages.push(Message::Tool {
                    tool_call_id: call_id,
                    content: output,
                });
            }
            "reasoning" => {
                let text = reasoning_text(&mut item, options)?;
                item.deny_unknown()?;
                if let Some(t) = text {
                    match &mut pending_reasoning {
                        Some(p) => {
                            p.push('\n');
                            p.push_str(&t);
                        }
                        None => pending_reasoning = Some(t),
                    }
                }
            }
            "compaction" => {
                let blob_path = item.field_path("encrypted_content");
                let blob = item.required_string("encrypted_content")?;
                item.string("created_by")?;
                item.deny_unknown()?;
                let summary = crate::translate::compact::open(&blob, &blob_path, options)?;
                context.push(system_message(
                    crate::translate::compact::context_text(&summary),
                    options,
                ));
            }
            "item_reference" => {
                return Err(bad_value(
                    &path,
                    format!(
                        "Invalid '{path}': item references need stored items, which this stateless server does not keep. Send the item itself."
                    ),
                )
                .with_code("unsupported_parameter"))
            }
            other => {
                return Err(bad_value(
                    &item.field_path("type"),
                    format!(
                        "Invalid '{path}.type': unsupported input item type '{other}'. Supported: 'message', 'function_call', 'function_call_output', 'custom_tool_call', 'custom_tool_call_output', 'reasoning', 'compaction'."
                    ),
                ))
            }
        }
    }
    Ok(())
}

/// Adds an assistant tool call. Consecutive calls (and the assistant text just before them)
/// were one turn; reasoning waiting for its message goes with the first call.
fn push_tool_call(
    messages: &mut Vec<Message>,
    pending_reasoning: &mut Option<String>,
    call_id: String,
    name: String,
    arguments: String,
) {
    let call = ToolCall {
        id: call_id,
        kind: FunctionKind::Function,
        function: Function { name, arguments },
    };
    match messages.last_mut() {
        Some(Message::Assistant(turn)) if pending_reasoning.is_none() => turn.tool_calls.push(call),
        _ => messages.push(Message::Assistant(Assistant {
            tool_calls: vec![call],
            reasoning_content: pending_reasoning.take(),
            ..Assistant::default()
        })),
    }
}

/// The plain text of a reasoning item: its `content` if any, else its summary.
fn reasoning_text(item: &mut Obj<'_>, options: &Options) -> Result<Option<String>, ApiError> {
    let summary_path = item.field_path("summary");
    let summary = item.array("summary")?.unwrap_or_default();
    let content_path = item.field_path("content");
    let content = item.array("content")?.unwrap_or_default();
    let sealed_path = item.field_path("encrypted_content");
    let sealed = item.string("encrypted_content")?;
    item.string("status")?;
    // Reasoning we sealed in an earlier response: the full text, better than any summary.
    if let Some(blob) = sealed {
        let keyring = options.keyring.as_ref().ok_or_else(|| {
            bad_value(
                &sealed_path,
                format!("Invalid '{sealed_path}': this server has no reasoning keys to open it."),
            )
            .with_code("invalid_encrypted_content")
        })?;
        return match keyring.open(&blob) {
            Ok(text) => Ok((!text.is_empty()).then_some(text)),
            Err(e) => Err(bad_value(
                &sealed_path,
                format!("Invalid '{sealed_path}': it cannot be opened ({e}). Send reasoning items back unchanged, to the server that produced them."),
            )
            .with_code("invalid_encrypted_content")),
        };
    }
    let mut text = String::new();
    let (parts, path, want) = if content.is_empty() {
        (summary, summary_path, "summary_text")
    } else {
        (content, content_path, "reasoning_text")
    };
    for (i, part) in parts.into_iter().enumerate() {
        let ppath = index(&path, i);
        let mut p = Obj::new(part, &ppath)?;
        let kind = p.required_string("type")?;
        if kind != want && kind != "text" {
            return Err(bad_value(
                &p.field_path("type"),
                format!("Invalid '{ppath}.type': expected '{want}', got '{kind}'."),
            ));
        }
        let t = p.required_string("text")?;
        p.deny_unknown()?;
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&t);
    }
    Ok((!text.is_empty()).then_some(text))
}

/// Joins the text of `input_text`/`output_text` parts (tool outputs and system messages,
/// whose Chat form is text only).
fn text_of_parts(parts: Vec<Value>, path: &str, options: &Options) -> Result<String, ApiError> {
    let mut text = String::new();
    for (i, part) in parts.into_iter().enumerate() {
        let ppath = index(path, i);
        let mut p = Obj::new(part, &ppath)?;
        let kind = p.required_string("type")?;
        match kind.as_str() {
            "input_text" | "output_text" | "text" => {
                let t = p.required_string("text")?;
                check_part_size(&p.field_path("text"), t.len(), options)?;
                p.take("annotations");
                p.take("logprobs");
                p.deny_unknown()?;
                text.push_str(&t);
            }
            kind if is_extension(kind) => {}
            other => {
                return Err(bad_value(
                    &p.field_path("type"),
                    format!(
                    "Invalid '{ppath}.type': '{other}' is not supported here; only text parts are."
                ),
                ))
            }
        }
    }
    Ok(text)
}

/// One message item → one Chat message.
fn message(mut item: Obj<'_>, options: &Options) -> Result<Message, ApiError> {
    let role_path = item.field_path("role");
    let role = item
        .enumeration("role", &["user", "assistant", "system", "developer"])?
        .ok_or_else(|| missing(&role_path))?;
    item.string("status")?;
    let content_path = item.field_path("content");
    let content = item.take("content").ok_or_else(|| missing(&content_path))?;
    item.deny_unknown()?;
    let parts = match content {
        Value::String(s) => {
            check_part_size(&content_path, s.len(), options)?;
            return Ok(match role {
                "system" => Message::System { content: s },
                "developer" => system_message(s, options),
                "assistant" => Message::Assistant(Assistant {
                    content: Some(s),
                    ..Assistant::default()
                }),
                _ => Message::User {
                    content: Content::Text(s),
                },
            });
        }
        Value::Array(parts) => parts,
        other => {
            return Err(wrong_type(
                &content_path,
                "a string or an array of content parts",
                &other,
            ))
        }
    };
    Ok(match role {
        "system" => Message::System {
            content: text_of_parts(parts, &content_path, options)?,
        },
        "developer" => system_message(text_of_parts(parts, &content_path, options)?, options),
        "assistant" => Message::Assistant(assistant_content(parts, &content_path)?),
        _ => Message::User {
            content: Content::Parts(user_content(parts, &content_path, options)?),
        },
    })
}

/// Assistant history: `output_text` parts join into `content`, `refusal` parts into `refusal`.
fn assistant_content(parts: Vec<Value>, path: &str) -> Result<Assistant, ApiError> {
    let mut turn = Assistant::default();
    for (i, part) in parts.into_iter().enumerate() {
        let ppath = index(path, i);
        let mut p = Obj::new(part, &ppath)?;
        let kind = p.required_string("type")?;
        let (slot, key) = match kind.as_str() {
            "output_text" | "input_text" | "text" => (&mut turn.content, "text"),
            "refusal" => (&mut turn.refusal, "refusal"),
            other => {
                return Err(bad_value(
                    &p.field_path("type"),
                    format!("Invalid '{ppath}.type': '{other}' is not an assistant content type. Supported: 'output_text', 'refusal'."),
                ))
            }
        };
        let t = p.required_string(key)?;
        p.take("annotations");
        p.take("logprobs");
        p.deny_unknown()?;
        slot.get_or_insert_with(String::new).push_str(&t);
    }
    Ok(turn)
}

/// User content parts → Chat content parts.
fn user_content(parts: Vec<Value>, path: &str, options: &Options) -> Result<Vec<Part>, ApiError> {
    let mut out = Vec::with_capacity(parts.len());
    for (i, part) in parts.into_iter().enumerate() {
        let ppath = index(path, i);
        let mut p = Obj::new(part, &ppath)?;
        let kind = p.required_string("type")?;
        let chat_part = match kind.as_str() {
            "input_text" | "text" => {
                let text = p.required_string("text")?;
                check_part_size(&p.field_path("text"), text.len(), options)?;
                Part::Text { text }
            }
            "input_image" => {
                let detail = p.enumeration("detail", &["auto", "low", "high"])?;
                if p.has("file_id") {
                    return Err(stored_file(&p.field_path("file_id")));
                }
                let url = p.required_string("image_url")?;
                check_part_size(&p.field_path("image_url"), url.len(), options)?;
                Part::ImageUrl {
                    image_url: ImageUrl {
                        url,
                        detail: detail.map(str::to_owned),
                    },
                }
            }
            "input_file" => {
                if p.has("file_id") {
                    return Err(stored_file(&p.field_path("file_id")));
                }
                let filename = p.string("filename")?;
                let file_data = p.string("file_data")?;
                let file_url = p.string("file_url")?;
                match (&file_data, &file_url) {
                    (Some(data), None) => {
                        check_part_size(&p.field_path("file_data"), data.len(), options)?;
                    }
                    (None, Some(_)) => {}
                    (Some(_), Some(_)) => {
                        return Err(bad_value(&ppath, format!("Invalid '{ppath}': give either 'file_data' or 'file_url', not both.")))
                    }
                    (None, None) => return Err(missing(&p.field_path("file_data"))),
                }
                Part::File {
                    file: File {
                        file_data,
                        file_url,
                        filename,
                    },
                }
            }
            "input_video" => {
                let url = p.required_string("video_url")?;
                check_part_size(&p.field_path("video_url"), url.len(), options)?;
                Part::VideoUrl {
                    video_url: VideoUrl { url },
                }
            }
            // Provider extensions (`slug:type`) mean nothing to a Chat upstream: dropped.
            kind if is_extension(kind) => continue,
            other => {
                return Err(bad_value(
                    &p.field_path("type"),
                    format!("Invalid '{ppath}.type': unsupported content type '{other}'. Supported: 'input_text', 'input_image', 'input_file', 'input_video'."),
                ))
            }
        };
        p.deny_unknown()?;
        out.push(chat_part);
    }
    Ok(out)
}

fn stored_file(path: &str) -> ApiError {
    bad_value(
        path,
        format!("Invalid '{path}': stored files are not available on this stateless server. Send the content inline (data URL or 'file_data')."),
    )
    .with_code("unsupported_parameter")
}

/// The message `instructions` and `developer` input become upstream. Most open-weight chat
/// templates know only `system`; some upstreams understand `developer` (configurable).
pub(crate) fn system_message(content: String, options: &Options) -> Message {
    match options.developer_role {
        DeveloperRole::System => Message::System { content },
        DeveloperRole::Developer => Message::Developer { content },
    }
}

/// Provider extensions are named `slug:type` (items, parts) or `slug:field` (fields).
pub(crate) fn is_extension(name: &str) -> bool {
    name.split_once(':')
        .is_some_and(|(slug, rest)| !slug.is_empty() && !rest.is_empty())
}

/// One content part (text, image or file data, tool output) within the configured size.
pub(crate) fn check_part_size(path: &str, len: usize, options: &Options) -> Result<(), ApiError> {
    if len > options.max_part_bytes {
        return Err(bad_value(
            path,
            format!(
                "Invalid '{path}': {len} bytes; this server accepts at most {} bytes per content part.",
                options.max_part_bytes
            ),
        )
        .with_code("content_too_large"));
    }
    Ok(())
}

/// Joins the system messages at the head of the conversation (instructions, then developer
/// and system items, as Codex sends them) into one: most chat templates accept a single
/// leading system message and fail on a second.
pub(crate) fn merge_leading_system(messages: Vec<Message>) -> Vec<Message> {
    let head = messages
        .iter()
        .take_while(|m| m.system_text().is_some())
        .count();
    let same_role = messages[..head]
        .windows(2)
        .all(|w| std::mem::discriminant(&w[0]) == std::mem::discriminant(&w[1]));
    if head < 2 || !same_role {
        return messages;
    }
    let mut rest = messages.into_iter();
    // `head >= 2`: there is a first message.
    let Some(mut first) = rest.next() else {
        return Vec::new();
    };
    if let Message::System { content } | Message::Developer { content } = &mut first {
        for m in rest.by_ref().take(head - 1) {
            content.push_str("\n\n");
            content.push_str(m.system_text().unwrap_or_default());
        }
    }
    std::iter::once(first).chain(rest).collect()
}
