//! `tools` and `tool_choice` → Chat's function tools and choice (function, namespace, custom
//! and client-executed built-in tools; hosted tools dropped or rejected).

use serde_json::{json, Map, Value};

use crate::chat::request::{FunctionKind, Tool, ToolFunction};
use crate::openresponses::{ApiError, Echo, ErrorCode};
use crate::translate::calls::{builtin_function, CUSTOM_TOOL_INPUT};
use crate::translate::fields::{bad_value, join, missing, Obj};
use crate::translate::{flat_name, HostedTools, OfferedTool, Options, ToolKind};

/// A tool as the client sent it, and where (`tools[2]`, or `input[5].tools[0]` for a tool an
/// `additional_tools` item declared).
pub(crate) struct Declared {
    pub path: String,
    pub tool: Value,
}

/// Tools → Chat's nested function tools; fills `echo.tools` (plain functions) and `offered`
/// (what the other functions stand for, to restore their calls). Hosted tools are dropped or
/// rejected (`options`).
pub(crate) fn tools(
    list: Vec<Declared>,
    echo: &mut Echo,
    offered: &mut Vec<OfferedTool>,
    options: &Options,
) -> Result<Vec<Tool>, ApiError> {
    let mut out = Tools {
        chat: Vec::with_capacity(list.len()),
        echo,
        offered,
    };
    for Declared { path, tool } in list {
        let mut t = Obj::new(tool, &path)?;
        let kind = t.required_string("type")?;
        match kind.as_str() {
            "function" => {
                let f = function_tool(t, &path)?;
                out.push(f, None, ToolKind::Function, &path)?;
            }
            // Free-text input (Codex's `apply_patch`): a Chat server only calls functions, so
            // the upstream gets a function with one string parameter, and its calls go back
            // as `custom_tool_call` items.
            "custom" => {
                let f = custom_tool(t, &path)?;
                out.push(f, None, ToolKind::Custom, &path)?;
            }
            // A group of functions and custom tools under one name (Codex's MCP tools):
            // flattened for the upstream as `<namespace>__<name>`, restored on their calls.
            "namespace" => {
                let ns = t.required_string("name")?;
                check_tool_name(&ns, &t.field_path("name"))?;
                t.string("description")?;
                let tools_path = t.field_path("tools");
                let inner = t.array("tools")?.ok_or_else(|| missing(&tools_path))?;
                t.deny_unknown()?;
                for (j, f) in inner.into_iter().enumerate() {
                    let fpath = format!("{tools_path}[{j}]");
                    let mut ft = Obj::new(f, &fpath)?;
                    let fkind = ft.required_string("type")?;
                    let (f, kind) = match fkind.as_str() {
                        "function" => (function_tool(ft, &fpath)?, ToolKind::Function),
                        "custom" => (custom_tool(ft, &fpath)?, ToolKind::Custom),
                        _ => {
                            return Err(bad_value(
                                &ft.field_path("type"),
                                format!("Invalid '{fpath}.type': a namespace holds function and custom tools only, not '{fkind}'."),
                            ))
                        }
                    };
                    out.push(f, Some(&ns), kind, &fpath)?;
                }
            }
            // Client-executed built-ins: the client runs them, so a Chat upstream can call
            // them as functions whose parameters are the built-in action's fields; the calls
            // come back as the built-in's call items (`calls`).
            "shell" | "local_shell" | "apply_patch" if builtin_runs_on_the_client(&mut t)? => {
                let Some(kind) = ToolKind::builtin(&kind) else {
                    continue;
                };
                let (description, parameters) = builtin_function(kind);
                let Value::Object(parameters) = parameters else {
                    continue;
                };
                t.deny_unknown()?;
                let f = FunctionTool {
                    name: kind.builtin_name().unwrap_or_default().to_owned(),
                    description: Some(description.to_owned()),
                    parameters: Some(parameters),
                    strict: None,
                };
                out.push(f, None, kind, &path)?;
            }
            // The computer tool acts on screens: its calls need a model trained on OpenAI's
            // computer actions, and its outputs are screenshots, which Chat tool messages
            // cannot carry. Refused whatever `--hosted-tools` says: dropping it would leave a
            // client waiting for calls that never come.
            "computer" | "computer_use_preview" => {
                return Err(bad_value(
                    &t.field_path("type"),
                    format!(
                        "Unsupported tool type '{kind}' in '{path}': computer use needs screenshots as tool results and a model trained on OpenAI's computer actions, which a Chat Completions model server does not offer."
                    ),
                )
                .with_code(ErrorCode::UnsupportedTool))
            }
            _ if options.hosted_tools == HostedTools::Drop => {
                // Hosted tools (web_search, file_search, ...) run on OpenAI's side; a Chat
                // upstream cannot run them. Dropped, as configured.
            }
            _ => {
                return Err(bad_value(
                    &t.field_path("type"),
                    format!(
                        "Unsupported tool type '{kind}' in '{path}': it runs on OpenAI's platform, and a Chat Completions model server can only call the tools the client runs (function, custom, namespace, shell, local_shell, apply_patch)."
                    ),
                )
                .with_code(ErrorCode::UnsupportedTool))
            }
        }
    }
    Ok(out.chat)
}

/// Reads a built-in tool's fields; false when it runs on OpenAI's platform (a `shell` in a
/// hosted container), where it is a hosted tool like any other.
fn builtin_runs_on_the_client(t: &mut Obj<'_>) -> Result<bool, ApiError> {
    allowed_callers(t)?;
    let env_path = t.field_path("environment");
    let Some(env) = t.object("environment")? else {
        return Ok(true);
    };
    let mut env = Obj {
        map: env,
        path: &env_path,
    };
    let kind = env.required_string("type")?;
    match kind.as_str() {
        // The client's own machine: the tool runs there. Its skills are the client's.
        "local" => {
            env.array("skills")?;
            env.deny_unknown()?;
            Ok(true)
        }
        // OpenAI's containers.
        _ => Ok(false),
    }
}

/// Hints about how a tool may be called that a Chat upstream has no use for, validated and
/// ignored: `allowed_callers` (programmatic tool calling runs on OpenAI's platform; here the
/// model calls every tool itself).
fn allowed_callers(t: &mut Obj<'_>) -> Result<(), ApiError> {
    let path = t.field_path("allowed_callers");
    for (i, caller) in t
        .array("allowed_callers")?
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        match caller.as_str() {
            Some("direct" | "programmatic") => {}
            _ => {
                return Err(bad_value(
                    &format!("{path}[{i}]"),
                    format!("Invalid '{path}[{i}]': expected 'direct' or 'programmatic'."),
                ))
            }
        }
    }
    Ok(())
}

/// The hints of function and custom tools, validated and ignored: `allowed_callers` (above),
/// `defer_loading` (tool search runs on OpenAI's platform: every tool is sent at once),
/// `async` (whether the client runs the call in the background is the client's business)
/// and, for functions, `output_schema` (what the tool returns; the model sees the output).
fn tool_hints(t: &mut Obj<'_>, output_schema: bool) -> Result<(), ApiError> {
    allowed_callers(t)?;
    t.bool("defer_loading")?;
    t.bool("async")?;
    if output_schema {
        t.object("output_schema")?;
    }
    Ok(())
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
    tool_hints(&mut t, true)?;
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
    tool_hints(&mut t, false)?;
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
        json!({ CUSTOM_TOOL_INPUT: {"type": "string", "description": input} }),
    );
    parameters.insert("required".into(), json!([CUSTOM_TOOL_INPUT]));
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

/// The Chat tools being built, and what the response path needs to know about them.
struct Tools<'a> {
    chat: Vec<Tool>,
    echo: &'a mut Echo,
    offered: &'a mut Vec<OfferedTool>,
}

impl Tools<'_> {
    /// Adds one function to the Chat tools, and to the echo (plain functions only: the
    /// schema's echoed `tools` has no namespace, custom or built-in form) or to `offered`.
    fn push(
        &mut self,
        f: FunctionTool,
        namespace: Option<&str>,
        kind: ToolKind,
        path: &str,
    ) -> Result<(), ApiError> {
        let upstream = match namespace {
            Some(ns) => flat_name(ns, &f.name),
            None => f.name.clone(),
        };
        if self.chat.iter().any(|t| t.function.name == upstream) {
            return Err(bad_value(
                &join(path, "name"),
                format!("Duplicate tool name '{upstream}' in 'tools'."),
            ));
        }
        self.chat.push(Tool {
            kind: FunctionKind::Function,
            function: ToolFunction {
                name: upstream.clone(),
                description: f.description.clone(),
                parameters: f.parameters.clone(),
                strict: f.strict,
            },
        });
        if namespace.is_none() && kind == ToolKind::Function {
            self.echo.tools.push(json!({
                "type": "function",
                "name": f.name,
                "description": f.description,
                "parameters": f.parameters.map(Value::Object),
                "strict": f.strict,
            }));
        } else {
            self.offered.push(OfferedTool {
                upstream,
                name: f.name,
                namespace: namespace.map(str::to_owned),
                kind,
            });
        }
        Ok(())
    }
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
        // A client-executed built-in, by its type (its function has the type's name).
        builtin @ ("shell" | "local_shell" | "apply_patch") => {
            named(builtin, "tool_choice.type")?;
            Ok((
                json!({"type": "function", "function": {"name": builtin}}),
                None,
                json!({"type": builtin}),
            ))
        }
        other => Err(bad_value(
            "tool_choice.type",
            format!("Unsupported 'tool_choice.type': '{other}'. Supported: 'function', 'custom', 'shell', 'local_shell', 'apply_patch', 'allowed_tools'."),
        )),
    }
}
