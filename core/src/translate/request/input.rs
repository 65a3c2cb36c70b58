//! `input` items → Chat messages (messages and their content parts, tool calls and their
//! outputs, reasoning, compaction summaries), with the size caps on each part; and what the
//! items declare besides messages (`additional_tools`, a `compaction_trigger`).
//!
//! Texts go from the request into the Chat messages as the tokens they came as ([`text`]);
//! only what is rebuilt (a built-in call's arguments, a custom call's input as JSON) is
//! decoded and written again.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::context::Visible;
use super::tools::Declared;
use super::{text, Format};
use crate::chat::request::{Assistant, Content, Message, Part, Text, ToolCall};
use crate::openresponses::{ApiError, ErrorCode};
use crate::translate::calls::{builtin_arguments, CUSTOM_TOOL_INPUT};
use crate::translate::fields::{bad_value, into_items, missing, wrong_type, Obj, Path, ROOT};
use crate::translate::json::document::{Fields, Node, Str};
use crate::translate::seal::Purpose;
use crate::translate::{flat_name, DeveloperRole, Options};

/// The input items, translated.
#[derive(Default)]
pub(crate) struct Input<'a> {
    /// The conversation as Chat messages, in order.
    pub messages: Vec<Message<'a>>,
    /// Summaries opened from `compaction` items: the caller puts them at the head, next to
    /// the instructions, because most chat templates accept system messages only there.
    pub context: Vec<Message<'a>>,
    /// Tools declared by `additional_tools` items, merged into the request's `tools`.
    pub tools: Vec<Declared<'a>>,
    /// The input ends with a `compaction_trigger`: the answer is a sealed summary.
    pub compaction_trigger: bool,
    /// What the `configuration_update` items set, for this turn.
    pub configuration: Configuration<'a>,
}

/// The settings of the conversation's `configuration_update` items: each one from the
/// latest item that sets it (OpenAI: "Each setting stays in effect until a later update
/// replaces that setting", openai-python 3.57's `ResponseConfigurationUpdateItem`), so what
/// is in effect at the end of `input` is what this turn runs with.
#[derive(Default)]
pub(crate) struct Configuration<'a> {
    /// `reasoning.effort`.
    pub effort: Option<Str<'a>>,
    /// `text.format`.
    pub format: Option<Format<'a>>,
}

/// The `message` phases clients send back (`phase` is OpenAI's label of assistant messages).
const PHASES: &[&str] = &["commentary", "final_answer"];

/// The calls seen so far, so that each output answers one (by `call_id`; a `local_shell_call`
/// also by its item `id`, which is what a `local_shell_call_output` names).
#[derive(Default)]
struct Calls<'a> {
    /// Any id an output may name → the call's `call_id`.
    ids: HashMap<Cow<'a, str>, Str<'a>>,
}

impl<'a> Calls<'a> {
    fn add(&mut self, call_id: &Str<'a>, item_id: Option<&Str<'a>>) {
        self.ids.insert(call_id.clone().into_cow(), call_id.clone());
        if let Some(id) = item_id {
            self.ids
                .entry(id.clone().into_cow())
                .or_insert_with(|| call_id.clone());
        }
    }

    /// The `call_id` of the call an output of type `kind` at `path` names; a 400 naming the
    /// item when no earlier item is that call (OpenAI's answer, in OpenAI's words).
    fn answered(
        &self,
        id: &str,
        kind: &str,
        path: Path<'_>,
        field: &str,
    ) -> Result<Str<'a>, ApiError> {
        self.ids.get(id).cloned().ok_or_else(|| {
            let what = kind.replace('_', " ");
            bad_value(
                Path::Key(&path, field),
                format!(
                    "No tool call found for {what} with call_id {id}. '{path}' answers a call that no earlier item of 'input' makes: send the call item before its output."
                ),
            )
        })
    }
}

/// The input items as Chat messages, in order.
pub(crate) fn input_messages<'a>(
    input: Node<'a>,
    options: &Options,
) -> Result<Input<'a>, ApiError> {
    let mut out = Input::default();
    let items = match into_items(input)? {
        Err(Node::Str(s)) if s.is_empty() => {
            return Err(bad_value("input", "Invalid 'input': must not be empty."))
        }
        Err(Node::Str(s)) => {
            check_part_size("input", &s, options)?;
            out.messages.push(Message::User {
                content: Content::Text(text(s)),
            });
            return Ok(out);
        }
        Ok(a) if a.is_empty() => {
            return Err(bad_value(
                "input",
                "Invalid 'input': must contain at least one item.",
            ))
        }
        Ok(a) if a.len() > options.max_input_items => {
            return Err(bad_value(
                "input",
                format!(
                    "Invalid 'input': {} items; this server accepts at most {}.",
                    a.len(),
                    options.max_input_items
                ),
            )
            .with_code(ErrorCode::TooManyInputItems))
        }
        Ok(a) => a,
        Err(other) => return Err(wrong_type("input", "a string or an array of items", &other)),
    };
    let last = items.len() - 1;
    // What comes before the latest compaction item stays behind (see `context`).
    let visible = Visible::of(&items);
    let messages = &mut out.messages;
    // Each call is an item, and so is its output.
    let mut calls = Calls {
        ids: HashMap::with_capacity(items.len() / 2),
    };
    // Reasoning text waiting for the assistant message that follows it.
    let mut pending_reasoning: Option<Text<'a>> = None;
    const INPUT: Path<'static> = Path::Key(&ROOT, "input");
    for (i, item) in items.into_iter().enumerate() {
        if !visible.keeps(i, &item) {
            continue;
        }
        let path = Path::Index(&INPUT, i);
        let mut item = Obj::new(item, path)?;
        let kind: Cow<'a, str> = match item.take("type") {
            None if item.has("role") => "message".into(),
            None if item.has("id") => "item_reference".into(),
            None => return Err(missing(item.field_path("type"))),
            Some(Node::Str(s)) => s.into_cow(),
            Some(other) => return Err(wrong_type(item.field_path("type"), "a string", &other)),
        };
        // Every item may carry the id the API gave it, and the status it had.
        let item_id = item.string("id")?;
        match kind.as_ref() {
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
                check_part_size(Path::Key(&path, "arguments"), &arguments, options)?;
                // A call of a `namespace` function: the upstream knows it by its flat name.
                let name = match item.string("namespace")? {
                    Some(ns) => Text::plain(flat_name(&ns.as_str(), &name.as_str())),
                    None => text(name),
                };
                item.string("status")?;
                call_hints(&mut item)?;
                // Added by the SDKs' `parse()` and stream helpers: the arguments, parsed.
                item.take("parsed_arguments");
                item.deny_unknown_in_item(options.strict)?;
                calls.add(&call_id, None);
                push_tool_call(messages, &mut pending_reasoning, text(call_id), name, text(arguments));
            }
            // A call of a `custom` tool: the upstream made it as a function whose one
            // parameter is the input (see `custom_tool`).
            "custom_tool_call" => {
                let call_id = item.required_string("call_id")?;
                let name = item.required_string("name")?;
                let input = item.required_string("input")?;
                check_part_size(Path::Key(&path, "input"), &input, options)?;
                let name = match item.string("namespace")? {
                    Some(ns) => Text::plain(flat_name(&ns.as_str(), &name.as_str())),
                    None => text(name),
                };
                item.string("status")?;
                call_hints(&mut item)?;
                item.deny_unknown_in_item(options.strict)?;
                calls.add(&call_id, None);
                let arguments = json!({ CUSTOM_TOOL_INPUT: input.as_str() }).to_string();
                push_tool_call(messages, &mut pending_reasoning, text(call_id), name, Text::plain(arguments));
            }
            // Calls of the client-executed built-ins: the function the upstream called, with
            // the action as its arguments (see `calls::builtin_function`).
            "shell_call" | "local_shell_call" | "apply_patch_call" => {
                let call_id = item.required_string("call_id")?;
                let (name, action) = builtin_call(&mut item, &kind)?;
                let action_path = Path::Key(&path, action);
                let fields = item
                    .object(action)?
                    .ok_or_else(|| missing(action_path))?;
                let fields = builtin_action(fields, &kind, action_path)?;
                let arguments = builtin_arguments(fields);
                check_part_size(action_path, &arguments.len(), options)?;
                item.deny_unknown_in_item(options.strict)?;
                calls.add(&call_id, item_id.as_ref());
                push_tool_call(messages, &mut pending_reasoning, text(call_id), Text::plain(name), Text::plain(arguments));
            }
            "function_call_output" | "custom_tool_call_output" => {
                let call_id = item.required_string("call_id")?;
                let call_id = calls.answered(&call_id.as_str(), &kind, path, "call_id")?;
                let output_path = Path::Key(&path, "output");
                let output = match item.take("output").map(into_items).transpose()? {
                    Some(Err(Node::Str(s))) => text(s),
                    Some(Ok(parts)) => text_of_parts(parts, output_path, options)?,
                    Some(Err(other)) => return Err(wrong_type(output_path, "a string or an array", &other)),
                    None => return Err(missing(output_path)),
                };
                check_part_size(output_path, &output, options)?;
                item.string("status")?;
                // The tool's name and namespace: the call already says them.
                item.string("name")?;
                item.string("namespace")?;
                caller(&mut item)?;
                item.deny_unknown_in_item(options.strict)?;
                messages.push(Message::Tool {
                    tool_call_id: text(call_id),
                    content: output,
                });
            }
            "shell_call_output" | "local_shell_call_output" | "apply_patch_call_output" => {
                let (call_id, content) =
                    builtin_output(&mut item, &kind, item_id, &calls, path, options)?;
                check_part_size(Path::Key(&path, "output"), &content, options)?;
                item.deny_unknown_in_item(options.strict)?;
                messages.push(Message::Tool {
                    tool_call_id: text(call_id),
                    content,
                });
            }
            "reasoning" => {
                let reasoning = reasoning_text(&mut item, options)?;
                item.deny_unknown_in_item(options.strict)?;
                if let Some(t) = reasoning {
                    match &mut pending_reasoning {
                        Some(p) => {
                            p.push_plain("\n");
                            p.push(t);
                        }
                        None => pending_reasoning = Some(t),
                    }
                }
            }
            "compaction" => {
                let blob = item.required_string("encrypted_content")?;
                item.string("created_by")?;
                item.deny_unknown_in_item(options.strict)?;
                let blob_path = item.field_path("encrypted_content");
                let summary = crate::translate::compaction::open(&blob.as_str(), &blob_path, options)?;
                out.context.push(system_message(
                    Text::plain(crate::translate::compaction::context_text(&summary)),
                    options,
                ));
            }
            // Tools declared mid-conversation (Codex): Chat has one list of tools per
            // request, so they join the request's `tools`.
            "additional_tools" => {
                item.enumeration("role", &["developer"])?
                    .ok_or_else(|| missing(Path::Key(&path, "role")))?;
                let tools_path = Path::Key(&path, "tools");
                let tools = item.array("tools")?.ok_or_else(|| missing(tools_path))?;
                item.deny_unknown_in_item(options.strict)?;
                out.tools.extend(tools.into_iter().enumerate().map(|(j, tool)| Declared {
                    path: Path::Index(&tools_path, j).to_string(),
                    tool,
                }));
            }
            // A change of the conversation's settings from here on (OpenAI's way to change
            // the reasoning effort mid-conversation without touching the request's own
            // settings, which stay the baseline). Nothing of it is a message: not sent.
            "configuration_update" => {
                if let Some(reasoning) = item.object("reasoning")? {
                    let mut r = Obj {
                        fields: reasoning,
                        path: Path::Key(&path, "reasoning"),
                    };
                    // Any effort, as the request's own: the upstream knows its model's.
                    if let Some(effort) = r.string("effort")? {
                        out.configuration.effort = Some(effort);
                    }
                    r.deny_unknown()?;
                }
                if let Some(fields) = item.object("text")? {
                    let text_path = Path::Key(&path, "text");
                    let mut t = Obj {
                        fields,
                        path: text_path,
                    };
                    let format = t
                        .object("format")?
                        .ok_or_else(|| missing(Path::Key(&text_path, "format")))?;
                    out.configuration.format = Some(Format::read(
                        format,
                        Path::Key(&text_path, "format"),
                        Format::UPDATE,
                    )?);
                    t.deny_unknown()?;
                }
                item.deny_unknown_in_item(options.strict)?;
            }
            // Codex's remote compaction (v2): summarise everything before it.
            "compaction_trigger" => {
                if i != last {
                    return Err(bad_value(
                        path,
                        format!("Invalid '{path}': a 'compaction_trigger' must be the last item of 'input'."),
                    ));
                }
                // Codex's bookkeeping about the compaction; nothing for the model.
                item.take("metadata");
                item.deny_unknown_in_item(options.strict)?;
                out.compaction_trigger = true;
            }
            "item_reference" => {
                return Err(bad_value(
                    path,
                    format!(
                        "Invalid '{path}': item references need stored items, which this stateless server does not keep. Send the item itself."
                    ),
                )
                .with_code(ErrorCode::UnsupportedParameter))
            }
            "computer_call" | "computer_call_output" => {
                return Err(bad_value(
                    item.field_path("type"),
                    format!("Invalid '{path}.type': '{kind}' items belong to computer use, which a Chat Completions model server does not offer."),
                )
                .with_code(ErrorCode::UnsupportedParameter))
            }
            other => {
                return Err(bad_value(
                    item.field_path("type"),
                    format!(
                        "Invalid '{path}.type': unsupported input item type '{other}'. Supported: 'message', 'function_call', 'function_call_output', 'custom_tool_call', 'custom_tool_call_output', 'shell_call', 'shell_call_output', 'local_shell_call', 'local_shell_call_output', 'apply_patch_call', 'apply_patch_call_output', 'reasoning', 'compaction', 'additional_tools', 'compaction_trigger', 'configuration_update'. The other items come from tools that run on OpenAI's platform."
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// Who made a call and how the client runs it: OpenAI's bookkeeping (`caller`: the model or
/// a program on OpenAI's platform; `async`), validated and ignored.
fn call_hints(item: &mut Obj<'_, '_>) -> Result<(), ApiError> {
    caller(item)?;
    item.bool("async")?;
    Ok(())
}

fn caller(item: &mut Obj<'_, '_>) -> Result<(), ApiError> {
    let parent = item.path;
    if let Some(c) = item.object("caller")? {
        let mut c = Obj {
            fields: c,
            path: Path::Key(&parent, "caller"),
        };
        c.enumeration("type", &["direct", "program"])?
            .ok_or_else(|| missing(c.field_path("type")))?;
        c.string("caller_id")?;
        c.deny_unknown()?;
    }
    Ok(())
}

/// A built-in call item's own fields but its action; returns the built-in's function name
/// and the key of its action (`action`, or `operation` for `apply_patch_call`).
fn builtin_call(
    item: &mut Obj<'_, '_>,
    kind: &str,
) -> Result<(&'static str, &'static str), ApiError> {
    item.string("status")?;
    let (name, action) = match kind {
        "shell_call" => {
            caller(item)?;
            item.string("created_by")?;
            // Where the client ran it: the client's business (a hosted container's call
            // would not be in a Chat upstream's history).
            item.skip_object("environment")?;
            ("shell", "action")
        }
        "local_shell_call" => ("local_shell", "action"),
        _ => {
            caller(item)?;
            item.string("created_by")?;
            ("apply_patch", "operation")
        }
    };
    Ok((name, action))
}

/// A built-in call's action, checked against the built-in's shape; its fields become the
/// Chat call's arguments.
fn builtin_action(
    action: Fields<'_>,
    kind: &str,
    path: Path<'_>,
) -> Result<Map<String, Value>, ApiError> {
    let mut a = Obj {
        fields: action,
        path,
    };
    let mut out = Map::new();
    let strings = |a: &mut Obj<'_, '_>, key: &str| -> Result<Value, ApiError> {
        let parent = a.path;
        let p = Path::Key(&parent, key);
        let list = a.array(key)?.ok_or_else(|| missing(p))?;
        let mut strings = Vec::with_capacity(list.len());
        for (i, s) in list.into_iter().enumerate() {
            match s {
                Node::Str(s) => strings.push(Value::String(s.into_string())),
                other => return Err(wrong_type(Path::Index(&p, i), "a string", &other)),
            }
        }
        Ok(Value::Array(strings))
    };
    let integer = |a: &mut Obj<'_, '_>, out: &mut Map<String, Value>, key: &str| {
        a.integer(key, 0, u64::MAX).map(|n| {
            if let Some(n) = n {
                out.insert(key.to_owned(), n.into());
            }
        })
    };
    match kind {
        "shell_call" => {
            out.insert("commands".into(), strings(&mut a, "commands")?);
            integer(&mut a, &mut out, "timeout_ms")?;
            integer(&mut a, &mut out, "max_output_length")?;
        }
        "local_shell_call" => {
            a.enumeration("type", &["exec"])?;
            out.insert("command".into(), strings(&mut a, "command")?);
            let parent = a.path;
            let env_path = Path::Key(&parent, "env");
            if let Some(env) = a.object("env")? {
                let mut vars = Map::new();
                for (k, v) in env {
                    match v {
                        Node::Str(s) => {
                            vars.insert(k.into_owned(), Value::String(s.into_string()));
                        }
                        other => {
                            return Err(wrong_type(format!("{env_path}.{k}"), "a string", &other))
                        }
                    }
                }
                out.insert("env".into(), Value::Object(vars));
            }
            integer(&mut a, &mut out, "timeout_ms")?;
            for key in ["user", "working_directory"] {
                if let Some(s) = a.string(key)? {
                    out.insert(key.into(), s.into_string().into());
                }
            }
        }
        _ => {
            let op = a
                .enumeration("type", &["create_file", "update_file", "delete_file"])?
                .ok_or_else(|| missing(a.field_path("type")))?;
            out.insert("type".into(), op.into());
            out.insert(
                "path".into(),
                a.required_string("path")?.into_string().into(),
            );
            if op != "delete_file" {
                out.insert(
                    "diff".into(),
                    a.required_string("diff")?.into_string().into(),
                );
            }
        }
    }
    a.deny_unknown()?;
    Ok(out)
}

/// A built-in call's output → the `call_id` it answers and the tool message's text: the
/// output as the client sent it, in JSON (`shell_call_output`: its chunks of stdout, stderr
/// and outcome; `apply_patch_call_output`: its status and log; `local_shell_call_output`:
/// its JSON text as is).
fn builtin_output<'a>(
    item: &mut Obj<'a, '_>,
    kind: &str,
    item_id: Option<Str<'a>>,
    calls: &Calls<'a>,
    path: Path<'_>,
    options: &Options,
) -> Result<(Str<'a>, Text<'a>), ApiError> {
    let output_path = Path::Key(&path, "output");
    match kind {
        "shell_call_output" => {
            let call_id = item.required_string("call_id")?;
            let call_id = calls.answered(&call_id.as_str(), kind, path, "call_id")?;
            let chunks = item.array("output")?.ok_or_else(|| missing(output_path))?;
            let mut out = Vec::with_capacity(chunks.len());
            for (i, chunk) in chunks.into_iter().enumerate() {
                let cpath = Path::Index(&output_path, i);
                let mut c = Obj::new(chunk, cpath)?;
                let stdout = c.required_string("stdout")?;
                let stderr = c.required_string("stderr")?;
                let outcome_path = Path::Key(&cpath, "outcome");
                let outcome = c.object("outcome")?.ok_or_else(|| missing(outcome_path))?;
                let mut o = Obj {
                    fields: outcome,
                    path: outcome_path,
                };
                let outcome = match o
                    .enumeration("type", &["exit", "timeout"])?
                    .ok_or_else(|| missing(o.field_path("type")))?
                {
                    "exit" => {
                        let code_path = Path::Key(&outcome_path, "exit_code");
                        let code = match o.take("exit_code") {
                            Some(Node::Number(n)) if n.is_i64() => n,
                            Some(other) => return Err(wrong_type(code_path, "an integer", &other)),
                            None => return Err(missing(code_path)),
                        };
                        json!({"type": "exit", "exit_code": code})
                    }
                    _ => json!({"type": "timeout"}),
                };
                o.deny_unknown()?;
                c.string("created_by")?;
                c.deny_unknown_in_item(options.strict)?;
                out.push(json!({"stdout": stdout.as_str(), "stderr": stderr.as_str(), "outcome": outcome}));
            }
            item.integer("max_output_length", 0, u64::MAX)?;
            item.string("status")?;
            caller(item)?;
            item.string("created_by")?;
            Ok((call_id, Text::plain(Value::Array(out).to_string())))
        }
        "local_shell_call_output" => {
            // Its `id` names the call (OpenAI's type has no `call_id`): the call's `call_id`
            // or its item id.
            let named = item.string("call_id")?;
            let id = item_id
                .or(named)
                .ok_or_else(|| missing(Path::Key(&path, "id")))?;
            let call_id = calls.answered(&id.as_str(), kind, path, "id")?;
            let output = item.required_string("output")?;
            item.string("status")?;
            Ok((call_id, text(output)))
        }
        _ => {
            let call_id = item.required_string("call_id")?;
            let call_id = calls.answered(&call_id.as_str(), kind, path, "call_id")?;
            let status = item
                .enumeration("status", &["completed", "failed"])?
                .unwrap_or("completed");
            let output = item.string("output")?.map(Str::into_string);
            caller(item)?;
            item.string("created_by")?;
            Ok((
                call_id,
                Text::plain(json!({"status": status, "output": output}).to_string()),
            ))
        }
    }
}

/// Adds an assistant tool call. Consecutive calls (and the assistant text just before them)
/// were one turn; reasoning waiting for its message goes with the first call.
fn push_tool_call<'a>(
    messages: &mut Vec<Message<'a>>,
    pending_reasoning: &mut Option<Text<'a>>,
    id: Text<'a>,
    name: Text<'a>,
    arguments: Text<'a>,
) {
    let call = ToolCall {
        id,
        name,
        arguments,
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

/// Appends `more` to a text being gathered from parts.
fn append<'a>(gathered: &mut Option<Text<'a>>, more: Text<'a>) {
    match gathered {
        Some(t) => t.push(more),
        None => *gathered = Some(more),
    }
}

/// The plain text of a reasoning item: its `content` if any, else its summary.
fn reasoning_text<'a>(
    item: &mut Obj<'a, '_>,
    options: &Options,
) -> Result<Option<Text<'a>>, ApiError> {
    let at = item.path;
    let summary = item.array("summary")?.unwrap_or_default();
    let content = item.array("content")?.unwrap_or_default();
    let sealed_path = Path::Key(&at, "encrypted_content");
    let sealed = item.string("encrypted_content")?;
    item.string("status")?;
    // Reasoning we sealed in an earlier response: the full text, better than any summary.
    if let Some(blob) = sealed {
        let text = crate::translate::sealing::open(
            Purpose::Reasoning,
            &blob.as_str(),
            &sealed_path.to_string(),
            options,
        )?;
        return Ok((!text.is_empty()).then(|| Text::plain(text)));
    }
    let mut gathered: Option<Text<'a>> = None;
    let (parts, key, want) = if content.is_empty() {
        (summary, "summary", "summary_text")
    } else {
        (content, "content", "reasoning_text")
    };
    let path = Path::Key(&at, key);
    for (i, part) in parts.into_iter().enumerate() {
        let ppath = Path::Index(&path, i);
        let mut p = Obj::new(part, ppath)?;
        let kind = p.required_string("type")?;
        if kind != *want && kind != *"text" {
            return Err(bad_value(
                p.field_path("type"),
                format!("Invalid '{ppath}.type': expected '{want}', got '{kind}'."),
            ));
        }
        let t = p.required_string("text")?;
        p.deny_unknown_in_item(options.strict)?;
        if gathered.as_ref().is_some_and(|g| !g.is_empty()) {
            append(&mut gathered, Text::plain("\n"));
        }
        append(&mut gathered, text(t));
    }
    Ok(gathered.filter(|t| !t.is_empty()))
}

/// Joins the text of `input_text`/`output_text` parts (tool outputs and system messages,
/// whose Chat form is text only).
fn text_of_parts<'a>(
    parts: Vec<Node<'a>>,
    path: Path<'_>,
    options: &Options,
) -> Result<Text<'a>, ApiError> {
    let mut gathered = None;
    for (i, part) in parts.into_iter().enumerate() {
        let ppath = Path::Index(&path, i);
        let mut p = Obj::new(part, ppath)?;
        let kind = p.required_string("type")?.into_cow();
        match kind.as_ref() {
            "input_text" | "output_text" | "text" => {
                let t = p.required_string("text")?;
                check_part_size(Path::Key(&ppath, "text"), &t, options)?;
                text_part_hints(&mut p)?;
                p.deny_unknown_in_item(options.strict)?;
                append(&mut gathered, text(t));
            }
            kind if is_extension(kind) => {}
            other => {
                return Err(bad_value(
                    p.field_path("type"),
                    format!(
                    "Invalid '{ppath}.type': '{other}' is not supported here; only text parts are."
                ),
                ))
            }
        }
    }
    Ok(gathered.unwrap_or_default())
}

/// One message item → one Chat message.
fn message<'a>(mut item: Obj<'a, '_>, options: &Options) -> Result<Message<'a>, ApiError> {
    let at = item.path;
    let role = item
        .enumeration("role", &["user", "assistant", "system", "developer"])?
        .ok_or_else(|| missing(Path::Key(&at, "role")))?;
    item.string("status")?;
    // OpenAI's label of assistant messages (talk before tool calls, or the answer), which
    // the SDKs ask clients to send back; a Chat template has no place for it. (It is also
    // on the user message `responses.compact()` keeps, as `null`.)
    item.enumeration("phase", PHASES)?;
    let content_path = Path::Key(&at, "content");
    let content = item.take("content").ok_or_else(|| missing(content_path))?;
    item.deny_unknown_in_item(options.strict)?;
    let parts = match into_items(content)? {
        Err(Node::Str(s)) => {
            check_part_size(content_path, &s, options)?;
            let s = text(s);
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
        Ok(parts) => parts,
        Err(other) => {
            return Err(wrong_type(
                content_path,
                "a string or an array of content parts",
                &other,
            ))
        }
    };
    Ok(match role {
        "system" => Message::System {
            content: text_of_parts(parts, content_path, options)?,
        },
        "developer" => system_message(text_of_parts(parts, content_path, options)?, options),
        "assistant" => Message::Assistant(assistant_content(parts, content_path, options)?),
        _ => Message::User {
            content: Content::Parts(user_content(parts, content_path, options)?),
        },
    })
}

/// Assistant history: `output_text` parts join into `content`, `refusal` parts into `refusal`.
fn assistant_content<'a>(
    parts: Vec<Node<'a>>,
    path: Path<'_>,
    options: &Options,
) -> Result<Assistant<'a>, ApiError> {
    let mut turn = Assistant::default();
    for (i, part) in parts.into_iter().enumerate() {
        let ppath = Path::Index(&path, i);
        let mut p = Obj::new(part, ppath)?;
        let kind = p.required_string("type")?.into_cow();
        let (slot, key) = match kind.as_ref() {
            "output_text" | "input_text" | "text" => (&mut turn.content, "text"),
            "refusal" => (&mut turn.refusal, "refusal"),
            other => {
                return Err(bad_value(
                    p.field_path("type"),
                    format!("Invalid '{ppath}.type': '{other}' is not an assistant content type. Supported: 'output_text', 'refusal'."),
                ))
            }
        };
        let t = p.required_string(key)?;
        text_part_hints(&mut p)?;
        p.deny_unknown_in_item(options.strict)?;
        append(slot, text(t));
    }
    Ok(turn)
}

/// User content parts → Chat content parts.
fn user_content<'a>(
    parts: Vec<Node<'a>>,
    path: Path<'_>,
    options: &Options,
) -> Result<Vec<Part<'a>>, ApiError> {
    let mut out = Vec::with_capacity(parts.len());
    for (i, part) in parts.into_iter().enumerate() {
        let ppath = Path::Index(&path, i);
        let mut p = Obj::new(part, ppath)?;
        let kind = p.required_string("type")?.into_cow();
        let chat_part = match kind.as_ref() {
            "input_text" | "text" => {
                let t = p.required_string("text")?;
                check_part_size(Path::Key(&ppath, "text"), &t, options)?;
                text_part_hints(&mut p)?;
                Part::Text { text: text(t) }
            }
            "input_image" => {
                // `original` (the image as sent, no downscaling) is the most detail a Chat
                // upstream can be asked for: `high`.
                let detail = p
                    .enumeration("detail", &["auto", "low", "high", "original"])?
                    .map(|d| if d == "original" { "high" } else { d });
                cache_breakpoint(&mut p)?;
                if p.has("file_id") {
                    return Err(stored_file(&p.field_path("file_id")));
                }
                let url = p.required_string("image_url")?;
                check_part_size(Path::Key(&ppath, "image_url"), &url, options)?;
                Part::ImageUrl {
                    url: text(url),
                    detail,
                }
            }
            "input_file" => {
                // How closely to read the file: Chat's file part has no such setting.
                p.enumeration("detail", &["auto", "low", "high"])?;
                cache_breakpoint(&mut p)?;
                if p.has("file_id") {
                    return Err(stored_file(&p.field_path("file_id")));
                }
                let filename = p.string("filename")?;
                let file_data = p.string("file_data")?;
                let file_url = p.string("file_url")?;
                match (&file_data, &file_url) {
                    (Some(data), None) => {
                        check_part_size(Path::Key(&ppath, "file_data"), data, options)?;
                    }
                    (None, Some(_)) => {}
                    (Some(_), Some(_)) => {
                        return Err(bad_value(ppath, format!("Invalid '{ppath}': give either 'file_data' or 'file_url', not both.")))
                    }
                    (None, None) => return Err(missing(p.field_path("file_data"))),
                }
                Part::File {
                    file_data: file_data.map(text),
                    file_url: file_url.map(text),
                    filename: filename.map(text),
                }
            }
            "input_video" => {
                let url = p.required_string("video_url")?;
                check_part_size(Path::Key(&ppath, "video_url"), &url, options)?;
                Part::VideoUrl { url: text(url) }
            }
            // Provider extensions (`slug:type`) mean nothing to a Chat upstream: dropped.
            kind if is_extension(kind) => continue,
            other => {
                return Err(bad_value(
                    p.field_path("type"),
                    format!("Invalid '{ppath}.type': unsupported content type '{other}'. Supported: 'input_text', 'input_image', 'input_file', 'input_video'."),
                ))
            }
        };
        p.deny_unknown_in_item(options.strict)?;
        out.push(chat_part);
    }
    Ok(out)
}

/// What clients put on text parts besides the text, validated and ignored: `annotations`
/// and `logprobs` (an `output_text` part sent back as it came, or the user message
/// `responses.compact()` keeps), `parsed` (added by the SDKs' `parse()` and stream helpers:
/// the text, parsed), and a prompt-cache breakpoint.
fn text_part_hints(p: &mut Obj<'_, '_>) -> Result<(), ApiError> {
    p.skip_array("annotations")?;
    p.skip_array("logprobs")?;
    p.take("parsed");
    cache_breakpoint(p)
}

/// `prompt_cache_breakpoint`: where OpenAI's prompt cache may cut. A Chat upstream caches
/// prefixes its own way (vLLM's prefix caching needs no marks): validated and ignored.
fn cache_breakpoint(p: &mut Obj<'_, '_>) -> Result<(), ApiError> {
    p.skip_object("prompt_cache_breakpoint")
}

fn stored_file(path: &str) -> ApiError {
    bad_value(
        path,
        format!("Invalid '{path}': stored files are not available on this stateless server. Send the content inline (data URL or 'file_data')."),
    )
    .with_code(ErrorCode::UnsupportedParameter)
}

/// The message `instructions` and `developer` input become upstream. Most open-weight chat
/// templates know only `system`; some upstreams understand `developer` (configurable).
pub(crate) fn system_message<'a>(content: Text<'a>, options: &Options) -> Message<'a> {
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

/// A length checked against the part cap: at most [`Length::bound`], which is known without
/// reading the text (a token's length as written: its text is never longer), and exactly
/// [`Length::exact`], measured only when the bound is over the cap.
pub(crate) trait Length {
    fn bound(&self) -> usize;
    fn exact(&self) -> usize;
}

impl Length for usize {
    fn bound(&self) -> usize {
        *self
    }

    fn exact(&self) -> usize {
        *self
    }
}

impl Length for Str<'_> {
    fn bound(&self) -> usize {
        self.len_bound()
    }

    fn exact(&self) -> usize {
        self.len()
    }
}

impl Length for Text<'_> {
    fn bound(&self) -> usize {
        self.len_bound()
    }

    fn exact(&self) -> usize {
        self.len()
    }
}

/// One content part (text, image or file data, tool output) within the configured size.
pub(crate) fn check_part_size(
    path: impl std::fmt::Display,
    value: &impl Length,
    options: &Options,
) -> Result<(), ApiError> {
    if value.bound() <= options.max_part_bytes {
        return Ok(());
    }
    let len = value.exact();
    if len > options.max_part_bytes {
        return Err(bad_value(
            &path,
            format!(
                "Invalid '{path}': {len} bytes; this server accepts at most {} bytes per content part.",
                options.max_part_bytes
            ),
        )
        .with_code(ErrorCode::ContentTooLarge));
    }
    Ok(())
}

/// Joins the system messages at the head of the conversation (instructions, then developer
/// and system items, as Codex sends them) into one: most chat templates accept a single
/// leading system message and fail on a second.
pub(crate) fn merge_leading_system(messages: Vec<Message<'_>>) -> Vec<Message<'_>> {
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
            if let Message::System { content: more } | Message::Developer { content: more } = m {
                content.push_plain("\n\n");
                content.push(more);
            }
        }
    }
    std::iter::once(first).chain(rest).collect()
}
