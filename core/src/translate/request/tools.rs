//! `tools` and `tool_choice` → Chat's function tools and choice (function, namespace and
//! custom tools; hosted tools dropped or rejected).

use serde_json::{json, Map, Value};

use crate::chat::request::{FunctionKind, Tool, ToolFunction};
use crate::openresponses::{ApiError, Echo};
use crate::translate::fields::{bad_value, index, join, missing, Obj};
use crate::translate::{flat_name, HostedTools, NamespacedTool, Options};

/// Tools → Chat's nested function tools; fills `echo.tools` and, for `namespace` and `custom`
/// tools, the names to restore on the way back. Hosted tools are dropped or rejected
/// (`options`).
pub(crate) fn tools(
    list: Vec<Value>,
    echo: &mut Echo,
    namespaced: &mut Vec<NamespacedTool>,
    custom_tools: &mut Vec<String>,
    options: &Options,
) -> Result<Vec<Tool>, ApiError> {
    let mut chat_tools = Vec::with_capacity(list.len());
    for (i, tool) in list.into_iter().enumerate() {
        let path = index("tools", i);
        let mut t = Obj::new(tool, &path)?;
        let kind = t.required_string("type")?;
        match kind.as_str() {
            "function" => {
                let f = function_tool(t, &path)?;
                push_function(f, Origin::Function, &path, &mut chat_tools, echo, namespaced)?;
            }
            // Free-text input (Codex's `apply_patch`): a Chat server only calls functions, so
            // the upstream gets a function with one string parameter, and its calls go back
            // as `custom_tool_call` items.
            "custom" => {
                let f = custom_tool(t, &path)?;
                custom_tools.push(f.name.clone());
                push_function(f, Origin::Custom, &path, &mut chat_tools, echo, namespaced)?;
            }
            // A group of functions under one name (Codex's MCP tools): flattened for the
            // upstream as `<namespace>__<name>`, restored on the function calls it makes.
            "namespace" => {
                let ns = t.required_string("name")?;
                check_tool_name(&ns, &t.field_path("name"))?;
                t.string("description")?;
                let tools_path = t.field_path("tools");
                let inner = t.array("tools")?.ok_or_else(|| missing(&tools_path))?;
                t.deny_unknown()?;
                for (j, f) in inner.into_iter().enumerate() {
                    let fpath = index(&tools_path, j);
                    let mut ft = Obj::new(f, &fpath)?;
                    let fkind = ft.required_string("type")?;
                    if fkind != "function" {
                        return Err(bad_value(
                            &ft.field_path("type"),
                            format!("Invalid '{fpath}.type': a namespace holds function tools only, not '{fkind}'."),
                        ));
                    }
                    let f = function_tool(ft, &fpath)?;
                    let origin = Origin::Namespace(&ns);
                    push_function(f, origin, &fpath, &mut chat_tools, echo, namespaced)?;
                }
            }
            _ if options.hosted_tools == HostedTools::Drop => {
                // Hosted tools (web_search, file_search, ...) run on OpenAI's side; a Chat
                // upstream cannot run them. Dropped, as configured.
            }
            _ => {
                return Err(bad_value(
                    &t.field_path("type"),
                    format!(
                        "Unsupported tool type '{kind}' in '{path}': a Chat Completions upstream can only call function and custom tools."
                    ),
                )
                .with_code("unsupported_tool"))
            }
        }
    }
    Ok(chat_tools)
}

/// A validated function tool.
struct FunctionTool {
    name: String,
    description: Option<String>,
    parameters: Option<Map<String, Value>>,
    strict: Option<bool>,
}

fn function_tool(mut t: Obj<'_>, path: &str) -> Result<FunctionTool, ApiError> {
    let name = t.required_string("name")?;
    check_tool_name(&name, &join(path, "name"))?;
    let description = t.string("description")?;
    let parameters = t.object("parameters")?;
    let strict = t.bool("strict")?;
    t.deny_unknown()?;
    Ok(FunctionTool {
        name,
        description,
        parameters,
        strict,
    })
}

/// A `custom` tool as the Chat function that stands for it: one required string parameter,
/// the input; the input's format (a grammar) goes into the descriptions, since a Chat
/// server cannot constrain a function's arguments with one.
fn custom_tool(mut t: Obj<'_>, path: &str) -> Result<FunctionTool, ApiError> {
    let name = t.required_string("name")?;
    check_tool_name(&name, &join(path, "name"))?;
    let description = t.string("description")?;
    let format_path = t.field_path("format");
    let format = match t.object("format")? {
        None => None,
        Some(f) => custom_tool_format(f, &format_path)?,
    };
    t.deny_unknown()?;
    let mut input = String::from("The tool's input: free text, not JSON.");
    if let Some(grammar) = &format {
        input.push(' ');
        input.push_str(grammar);
    }
    let mut parameters = Map::new();
    parameters.insert("type".into(), "object".into());
    parameters.insert(
        "properties".into(),
        json!({ crate::translate::CUSTOM_TOOL_INPUT: {"type": "string", "description": input} }),
    );
    parameters.insert(
        "required".into(),
        json!([crate::translate::CUSTOM_TOOL_INPUT]),
    );
    parameters.insert("additionalProperties".into(), false.into());
    let description = match (description, format) {
        (Some(d), Some(g)) => Some(format!("{d}\n\n{g}")),
        (d, g) => d.or(g),
    };
    Ok(FunctionTool {
        name,
        description,
        parameters: Some(parameters),
        strict: None,
    })
}

/// A custom tool's `format`: `text` (nothing to say), or a `grammar` (described in words).
fn custom_tool_format(f: Map<String, Value>, path: &str) -> Result<Option<String>, ApiError> {
    let mut f = Obj::new(Value::Object(f), path)?;
    let kind = f.required_string("type")?;
    let described = match kind.as_str() {
        "text" => None,
        "grammar" => {
            let syntax = f.required_string("syntax")?;
            if !matches!(syntax.as_str(), "lark" | "regex") {
                return Err(bad_value(
                    &f.field_path("syntax"),
                    format!("Invalid '{path}.syntax': '{syntax}'. Supported: 'lark', 'regex'."),
                ));
            }
            let definition = f.required_string("definition")?;
            Some(format!(
                "The input must match this {syntax} grammar:\n{definition}"
            ))
        }
        other => {
            return Err(bad_value(
                &f.field_path("type"),
                format!("Invalid '{path}.type': '{other}'. Supported: 'text', 'grammar'."),
            ))
        }
    };
    f.deny_unknown()?;
    Ok(described)
}

fn check_tool_name(name: &str, path: &str) -> Result<(), ApiError> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(bad_value(
            path,
            format!("Invalid '{path}': '{name}'. Use 1 to 64 characters from a-z, A-Z, 0-9, '_' and '-'."),
        ));
    }
    Ok(())
}

/// Where a Chat function comes from.
#[derive(Clone, Copy)]
enum Origin<'a> {
    /// A `function` tool.
    Function,
    /// A function of this `namespace` tool, flattened.
    Namespace(&'a str),
    /// A `custom` tool.
    Custom,
}

/// Adds one function to the Chat tools and to the echo (plain functions only: the schema's
/// echoed `tools` has no namespace or custom form).
fn push_function(
    f: FunctionTool,
    origin: Origin<'_>,
    path: &str,
    chat_tools: &mut Vec<Tool>,
    echo: &mut Echo,
    namespaced: &mut Vec<NamespacedTool>,
) -> Result<(), ApiError> {
    let upstream_name = match origin {
        Origin::Namespace(ns) => flat_name(ns, &f.name),
        Origin::Function | Origin::Custom => f.name.clone(),
    };
    let taken = chat_tools.iter().any(|t| t.function.name == upstream_name);
    if taken {
        return Err(bad_value(
            &join(path, "name"),
            format!("Duplicate tool name '{upstream_name}' in 'tools'."),
        ));
    }
    chat_tools.push(Tool {
        kind: FunctionKind::Function,
        function: ToolFunction {
            name: upstream_name.clone(),
            description: f.description.clone(),
            parameters: f.parameters.clone(),
            strict: f.strict,
        },
    });
    match origin {
        Origin::Namespace(ns) => namespaced.push(NamespacedTool {
            flat: upstream_name,
            namespace: ns.to_owned(),
            name: f.name,
        }),
        Origin::Custom => {}
        Origin::Function => echo.tools.push(json!({
            "type": "function",
            "name": f.name,
            "description": f.description,
            "parameters": f.parameters.map(Value::Object),
            "strict": f.strict,
        })),
    }
    Ok(())
}

/// `tool_choice` → Chat's form; for `allowed_tools`, also the names the tool list shrinks to;
/// and the choice as the response echoes it. Keys other than those read here are ignored
/// (a choice names a tool; nothing else in it changes what the model may do).
pub(crate) fn tool_choice(
    choice: Value,
    tool_names: &[&str],
) -> Result<(Value, Option<Vec<String>>, Value), ApiError> {
    let named = |name: &str, path: &str| -> Result<(), ApiError> {
        if tool_names.contains(&name) {
            Ok(())
        } else {
            Err(bad_value(
                path,
                format!("Invalid '{path}': no function named '{name}' is defined in 'tools'."),
            ))
        }
    };
    let mut o = match choice {
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => {
            let choice = Value::String(s);
            return Ok((choice.clone(), None, choice));
        }
        Value::String(s) => return Err(bad_value(
            "tool_choice",
            format!("Invalid value for 'tool_choice': '{s}'. Supported values are: 'auto', 'none', 'required', or an object."),
        )),
        other => Obj::new(other, "tool_choice")?,
    };
    let kind = o.required_string("type")?;
    match kind.as_str() {
        "function" | "custom" => {
            let name = o.required_string("name")?;
            named(&name, "tool_choice.name")?;
            Ok((
                json!({"type": "function", "function": {"name": name}}),
                None,
                json!({"type": kind, "name": name}),
            ))
        }
        "allowed_tools" => {
            let mode = o
                .enumeration("mode", &["auto", "required", "none"])?
                .unwrap_or("auto");
            let list = o
                .array("tools")?
                .ok_or_else(|| missing("tool_choice.tools"))?;
            if list.is_empty() {
                return Err(bad_value(
                    "tool_choice.tools",
                    "Invalid 'tool_choice.tools': list at least one function.",
                ));
            }
            let mut allowed = Vec::with_capacity(list.len());
            for (i, t) in list.into_iter().enumerate() {
                let path = format!("tool_choice.tools[{i}]");
                let mut t = Obj::new(t, &path)?;
                let name = t.required_string("name")?;
                named(&name, &t.field_path("name"))?;
                allowed.push(name);
            }
            // The response echoes the complete form (`mode` is required there).
            let echoed = json!({
                "type": "allowed_tools",
                "mode": mode,
                "tools": allowed.iter().map(|n| json!({"type": "function", "name": n})).collect::<Vec<_>>(),
            });
            Ok((Value::String(mode.into()), Some(allowed), echoed))
        }
        other => Err(bad_value(
            "tool_choice.type",
            format!("Unsupported 'tool_choice.type': '{other}'. Supported: 'function', 'custom', 'allowed_tools'."),
        )),
    }
}
