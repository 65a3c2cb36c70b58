//! `tools` and `tool_choice` → Chat's function tools and choice (function, namespace, custom
//! and client-executed built-in tools; hosted tools dropped or rejected).
//!
//! A function's schema goes upstream as the client wrote it, unless `strict` is absent: then
//! the Responses default applies (`strict`: normalised into strict mode where it can be).
//! The response echoes a copy of the schema that went, and the `strict` that applied.

mod strict;

use std::borrow::Cow;

use serde_json::json;
use serde_json::value::RawValue;

use super::{object_json, text};
use crate::chat::request::{Text, Tool, ToolChoice};
use crate::openresponses::{ApiError, Echo, EchoTool, EchoToolChoice, ErrorCode};
use crate::translate::calls::{builtin_function, CUSTOM_TOOL_INPUT};
use crate::translate::fields::{bad_value, missing, wrong_type, Obj, Path};
use crate::translate::json::document::{echoed, owned_json, Node, Str};
use crate::translate::{flat_name, HostedTools, OfferedTool, Options, ToolKind};

/// A tool as the client sent it, and where (`tools[2]`, or `input[5].tools[0]` for a tool an
/// `additional_tools` item declared).
pub(crate) struct Declared<'a> {
    pub path: String,
    pub tool: Node<'a>,
}

/// Tools → Chat's nested function tools; fills `echo.tools` (plain functions) and `offered`
/// (what the other functions stand for, to restore their calls). Hosted tools are dropped or
/// rejected (`options`).
pub(crate) fn tools<'a>(
    list: Vec<Declared<'a>>,
    echo: &mut Echo,
    offered: &mut Vec<OfferedTool>,
    options: &Options,
) -> Result<Vec<Tool<'a>>, ApiError> {
    let mut out = Tools {
        chat: Vec::with_capacity(list.len()),
        echo,
        offered,
    };
    for Declared { path, tool } in list {
        let mut t = Obj::new(tool, Path::Text(&path))?;
        let kind = t.required_string("type")?.into_cow();
        match kind.as_ref() {
            "function" => {
                let f = strict_by_default(function_tool(t)?);
                out.push(f, None, ToolKind::Function, Path::Text(&path))?;
            }
            // Free-text input (Codex's `apply_patch`): a Chat server only calls functions, so
            // the upstream gets a function with one string parameter, and its calls go back
            // as `custom_tool_call` items.
            "custom" => {
                let f = custom_tool(t)?;
                out.push(f, None, ToolKind::Custom, Path::Text(&path))?;
            }
            // A group of functions and custom tools under one name (Codex's MCP tools):
            // flattened for the upstream as `<namespace>__<name>`, restored on their calls.
            "namespace" => {
                let ns = t.required_string("name")?.into_cow();
                let at = t.path;
                check_tool_name(&ns, Path::Key(&at, "name"))?;
                t.string("description")?;
                let tools_path = Path::Key(&at, "tools");
                let inner = t.array("tools")?.ok_or_else(|| missing(tools_path))?;
                t.deny_unknown()?;
                for (j, f) in inner.into_iter().enumerate() {
                    let fpath = Path::Index(&tools_path, j);
                    let mut ft = Obj::new(f, fpath)?;
                    let fkind = ft.required_string("type")?.into_cow();
                    let (f, kind) = match fkind.as_ref() {
                        "function" => (strict_by_default(function_tool(ft)?), ToolKind::Function),
                        "custom" => (custom_tool(ft)?, ToolKind::Custom),
                        _ => {
                            return Err(bad_value(
                                ft.field_path("type"),
                                format!("Invalid '{fpath}.type': a namespace holds function and custom tools only, not '{fkind}'."),
                            ))
                        }
                    };
                    out.push(f, Some(&ns), kind, fpath)?;
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
                t.deny_unknown()?;
                let f = FunctionTool {
                    name: kind.builtin_name().unwrap_or_default().into(),
                    description: Some(Description::Written(Text::plain(description))),
                    parameters: Some(Cow::Owned(owned_json(&parameters))),
                    strict: None,
                };
                out.push(f, None, kind, Path::Text(&path))?;
            }
            // The computer tool acts on screens: its calls need a model trained on OpenAI's
            // computer actions, and its outputs are screenshots, which Chat tool messages
            // cannot carry. Refused whatever `--hosted-tools` says: dropping it would leave a
            // client waiting for calls that never come.
            "computer" | "computer_use_preview" => {
                return Err(bad_value(
                    t.field_path("type"),
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
                    t.field_path("type"),
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
fn builtin_runs_on_the_client(t: &mut Obj<'_, '_>) -> Result<bool, ApiError> {
    allowed_callers(t)?;
    let at = t.path;
    let Some(env) = t.object("environment")? else {
        return Ok(true);
    };
    let mut env = Obj {
        fields: env,
        path: Path::Key(&at, "environment"),
    };
    let kind = env.required_string("type")?;
    if kind == *"local" {
        // The client's own machine: the tool runs there. Its skills are the client's.
        env.skip_array("skills")?;
        env.deny_unknown()?;
        return Ok(true);
    }
    // OpenAI's containers.
    Ok(false)
}

/// Hints about how a tool may be called that a Chat upstream has no use for, validated and
/// ignored: `allowed_callers` (programmatic tool calling runs on OpenAI's platform; here the
/// model calls every tool itself).
fn allowed_callers(t: &mut Obj<'_, '_>) -> Result<(), ApiError> {
    let at = t.path;
    let path = Path::Key(&at, "allowed_callers");
    for (i, caller) in t
        .array("allowed_callers")?
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        match caller {
            Node::Str(s) if matches!(s.as_str().as_ref(), "direct" | "programmatic") => {}
            _ => {
                return Err(bad_value(
                    Path::Index(&path, i),
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
fn tool_hints(t: &mut Obj<'_, '_>, output_schema: bool) -> Result<(), ApiError> {
    allowed_callers(t)?;
    t.bool("defer_loading")?;
    t.bool("async")?;
    if output_schema {
        t.skip_object("output_schema")?;
    }
    Ok(())
}

/// A validated function tool.
struct FunctionTool<'a> {
    name: Cow<'a, str>,
    description: Option<Description<'a>>,
    parameters: Option<Cow<'a, RawValue>>,
    strict: Option<bool>,
}

/// A function's description: the client's, or one written here (a custom or built-in
/// tool's).
enum Description<'a> {
    Client(Str<'a>),
    Written(Text<'a>),
}

impl<'a> Description<'a> {
    fn text(&self) -> Text<'a> {
        match self {
            Description::Client(s) => text(s.clone()),
            Description::Written(t) => t.clone(),
        }
    }

    /// As the response echoes it.
    fn echoed(&self) -> Box<RawValue> {
        match self {
            Description::Client(s) => s.to_json(),
            Description::Written(t) => owned_json(&t.to_plain()),
        }
    }
}

fn function_tool<'a>(mut t: Obj<'a, '_>) -> Result<FunctionTool<'a>, ApiError> {
    let name = t.required_string("name")?.into_cow();
    let at = t.path;
    check_tool_name(&name, Path::Key(&at, "name"))?;
    let description = t.string("description")?.map(Description::Client);
    let parameters = match t.take("parameters").map(object_json) {
        None => None,
        Some(Ok(schema)) => Some(schema),
        Some(Err(other)) => {
            return Err(wrong_type(t.field_path("parameters"), "an object", &other));
        }
    };
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

/// The Responses default for a function without `strict`: its schema normalised into strict
/// mode where it can be (`strict`), sent `strict: true`; sent loose (no `strict`, Chat's
/// default) otherwise. A function without parameters has nothing to normalise: loose.
fn strict_by_default(mut f: FunctionTool<'_>) -> FunctionTool<'_> {
    if f.strict.is_some() {
        return f;
    }
    let Some(schema) = &f.parameters else {
        return f;
    };
    match strict::normalise(schema) {
        strict::Strict::AsItCame => f.strict = Some(true),
        strict::Strict::Normalised(schema) => {
            f.parameters = Some(Cow::Owned(schema));
            f.strict = Some(true);
        }
        strict::Strict::Loose => {}
    }
    f
}

/// A `custom` tool as the Chat function that stands for it: one required string parameter,
/// the input; the input's format (a grammar) goes into the descriptions, since a Chat
/// server cannot constrain a function's arguments with one.
fn custom_tool<'a>(mut t: Obj<'a, '_>) -> Result<FunctionTool<'a>, ApiError> {
    let name = t.required_string("name")?.into_cow();
    let at = t.path;
    check_tool_name(&name, Path::Key(&at, "name"))?;
    let description = t.string("description")?;
    let format = match t.object("format")? {
        None => None,
        Some(f) => custom_tool_format(Obj {
            fields: f,
            path: Path::Key(&at, "format"),
        })?,
    };
    tool_hints(&mut t, false)?;
    t.deny_unknown()?;
    let mut input = String::from("The tool's input: free text, not JSON.");
    if let Some(grammar) = &format {
        input.push(' ');
        input.push_str(grammar);
    }
    let parameters = json!({
        "type": "object",
        "properties": { CUSTOM_TOOL_INPUT: {"type": "string", "description": input} },
        "required": [CUSTOM_TOOL_INPUT],
        "additionalProperties": false,
    });
    let description = match (description, format) {
        (Some(d), Some(g)) => {
            let mut d = text(d);
            d.push_plain("\n\n");
            d.push(Text::plain(g));
            Some(d)
        }
        (Some(d), None) => Some(text(d)),
        (None, g) => g.map(Text::plain),
    }
    .map(Description::Written);
    Ok(FunctionTool {
        name,
        description,
        parameters: Some(Cow::Owned(owned_json(&parameters))),
        strict: None,
    })
}

/// A custom tool's `format`: `text` (nothing to say), or a `grammar` (described in words).
fn custom_tool_format(mut f: Obj<'_, '_>) -> Result<Option<String>, ApiError> {
    let path = f.path;
    let kind = f.required_string("type")?.into_cow();
    let described = match kind.as_ref() {
        "text" => None,
        "grammar" => {
            let syntax = f.required_string("syntax")?.into_cow();
            if !matches!(syntax.as_ref(), "lark" | "regex") {
                return Err(bad_value(
                    f.field_path("syntax"),
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
                f.field_path("type"),
                format!("Invalid '{path}.type': '{other}'. Supported: 'text', 'grammar'."),
            ))
        }
    };
    f.deny_unknown()?;
    Ok(described)
}

fn check_tool_name(name: &str, path: Path<'_>) -> Result<(), ApiError> {
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
struct Tools<'a, 'e> {
    chat: Vec<Tool<'a>>,
    echo: &'e mut Echo,
    offered: &'e mut Vec<OfferedTool>,
}

impl<'a> Tools<'a, '_> {
    /// Adds one function to the Chat tools, and to the echo (plain functions only: the
    /// schema's echoed `tools` has no namespace, custom or built-in form) or to `offered`.
    fn push(
        &mut self,
        f: FunctionTool<'a>,
        namespace: Option<&str>,
        kind: ToolKind,
        path: Path<'_>,
    ) -> Result<(), ApiError> {
        let upstream: Cow<'a, str> = match namespace {
            Some(ns) => flat_name(ns, &f.name).into(),
            None => f.name.clone(),
        };
        if self.chat.iter().any(|t| t.name == upstream) {
            return Err(bad_value(
                Path::Key(&path, "name"),
                format!("Duplicate tool name '{upstream}' in 'tools'."),
            ));
        }
        if namespace.is_none() && kind == ToolKind::Function {
            self.echo.tools.push(EchoTool {
                name: f.name.clone().into_owned(),
                description: f.description.as_ref().map(Description::echoed),
                parameters: f.parameters.as_deref().map(echoed),
                // What applied: `false` for a function sent loose, as OpenAI shows a
                // fallback from the default.
                strict: Some(f.strict == Some(true)),
            });
        } else {
            self.offered.push(OfferedTool {
                upstream: upstream.clone().into_owned(),
                name: f.name.into_owned(),
                namespace: namespace.map(str::to_owned),
                kind,
            });
        }
        self.chat.push(Tool {
            name: upstream,
            description: f.description.as_ref().map(Description::text),
            parameters: f.parameters,
            strict: f.strict,
        });
        Ok(())
    }
}

/// `tool_choice` → Chat's form; for `allowed_tools`, also the names the tool list shrinks to;
/// and the choice as the response echoes it. Keys other than those read here are ignored
/// (a choice names a tool; nothing else in it changes what the model may do).
pub(crate) fn tool_choice<'a>(
    choice: Node<'a>,
    tool_names: &[&str],
) -> Result<(ToolChoice<'a>, Option<Vec<String>>, EchoToolChoice), ApiError> {
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
        Node::Str(s) => {
            let s = s.into_cow();
            return match s.as_ref() {
                "auto" => Ok((ToolChoice::Mode("auto"), None, EchoToolChoice::Mode("auto"))),
                "none" => Ok((ToolChoice::Mode("none"), None, EchoToolChoice::Mode("none"))),
                "required" => Ok((
                    ToolChoice::Mode("required"),
                    None,
                    EchoToolChoice::Mode("required"),
                )),
                _ => Err(bad_value(
                    "tool_choice",
                    format!("Invalid value for 'tool_choice': '{s}'. Supported values are: 'auto', 'none', 'required', or an object."),
                )),
            };
        }
        other => Obj::new(other, Path::Text("tool_choice"))?,
    };
    let kind = o.required_string("type")?.into_cow();
    match kind.as_ref() {
        "function" | "custom" => {
            let name = o.required_string("name")?.into_cow();
            named(&name, "tool_choice.name")?;
            let kind = if kind == "function" { "function" } else { "custom" };
            Ok((
                ToolChoice::Function(name.clone()),
                None,
                EchoToolChoice::Named {
                    kind,
                    name: name.into_owned(),
                },
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
                let mut t = Obj::new(t, Path::Text(&path))?;
                let name = t.required_string("name")?.into_string();
                named(&name, &t.field_path("name"))?;
                allowed.push(name);
            }
            // The response echoes the complete form (`mode` is required there).
            let echoed = EchoToolChoice::AllowedTools {
                mode,
                tools: allowed.clone(),
            };
            Ok((ToolChoice::Mode(mode), Some(allowed), echoed))
        }
        // A client-executed built-in, by its type (its function has the type's name).
        builtin @ ("shell" | "local_shell" | "apply_patch") => {
            named(builtin, "tool_choice.type")?;
            let builtin = match builtin {
                "shell" => "shell",
                "local_shell" => "local_shell",
                _ => "apply_patch",
            };
            Ok((
                ToolChoice::Function(builtin.into()),
                None,
                EchoToolChoice::Builtin(builtin),
            ))
        }
        other => Err(bad_value(
            "tool_choice.type",
            format!("Unsupported 'tool_choice.type': '{other}'. Supported: 'function', 'custom', 'shell', 'local_shell', 'apply_patch', 'allowed_tools'."),
        )),
    }
}
