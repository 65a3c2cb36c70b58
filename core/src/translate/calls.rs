//! The model's tool calls as the client declared the tools. A Chat upstream only calls
//! functions, so every tool the client offers reaches it as a function ([`ToolKind`] says
//! what that function stands for); each call comes back as the client's own item:
//! `function_call` (its namespace restored), `custom_tool_call`, or the call item of a
//! client-executed built-in tool (`shell_call`, `local_shell_call`, `apply_patch_call`).
//!
//! The built-ins' functions take the built-in action's own fields as parameters (the
//! shapes of OpenAI's `ShellCall` / `LocalShellCall` actions and `ApplyPatchCall` operation),
//! so the call item is the model's arguments, read as that action. Arguments that do not fit
//! come back as a `function_call` with the model's raw arguments: the client sees what the
//! model wrote rather than a call we made up.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::ResponsePlan;
use crate::openresponses::{
    ApplyPatchCallItem, ApplyPatchOperation, ApplyPatchStatus, CustomToolCallItem,
    FunctionCallItem, ItemStatus, LocalShellAction, LocalShellCallItem, OutputItem, ShellAction,
    ShellCallItem,
};

/// What a Chat function offered upstream stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolKind {
    /// A `function` tool (maybe inside a `namespace`).
    Function,
    /// A `custom` tool: one string parameter, [`CUSTOM_TOOL_INPUT`].
    Custom,
    /// The client-executed built-in `shell` tool.
    Shell,
    /// The client-executed built-in `local_shell` tool.
    LocalShell,
    /// The client-executed built-in `apply_patch` tool.
    ApplyPatch,
}

impl ToolKind {
    /// The built-in tool of a tool `type`, if it is one of those we offer as a function.
    pub(crate) fn builtin(tool_type: &str) -> Option<ToolKind> {
        match tool_type {
            "shell" => Some(ToolKind::Shell),
            "local_shell" => Some(ToolKind::LocalShell),
            "apply_patch" => Some(ToolKind::ApplyPatch),
            _ => None,
        }
    }

    /// The name of a built-in's function upstream (its tool `type`).
    pub(crate) fn builtin_name(self) -> Option<&'static str> {
        match self {
            ToolKind::Shell => Some("shell"),
            ToolKind::LocalShell => Some("local_shell"),
            ToolKind::ApplyPatch => Some("apply_patch"),
            ToolKind::Function | ToolKind::Custom => None,
        }
    }

    /// A built-in's call is announced whole, once its arguments are complete (its item has
    /// no meaningful partial form), in a stream as in JSON.
    pub(crate) fn is_builtin(self) -> bool {
        self.builtin_name().is_some()
    }
}

/// The one parameter of the Chat function that stands for a `custom` tool: its input text.
pub(crate) const CUSTOM_TOOL_INPUT: &str = "input";

/// A tool offered upstream whose calls need more than their name to come back: in a
/// namespace, custom, or built-in. Plain functions are not listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OfferedTool {
    /// The Chat function's name (`ns__name` for a tool in a namespace).
    pub upstream: String,
    /// The name the client knows.
    pub name: String,
    pub namespace: Option<String>,
    pub kind: ToolKind,
}

/// The upstream name of tool `name` in `namespace`.
pub(crate) fn flat_name(namespace: &str, name: &str) -> String {
    format!("{namespace}__{name}")
}

/// The description and parameters of the Chat function that stands for a built-in tool.
pub(crate) fn builtin_function(kind: ToolKind) -> (&'static str, Value) {
    match kind {
        ToolKind::Shell => (
            "Runs shell commands on the user's machine, in order, and returns their stdout, stderr and exit code.",
            json!({"type": "object", "properties": {
                "commands": {"type": "array", "items": {"type": "string"},
                             "description": "The shell commands to run, in order."},
                "timeout_ms": {"type": "integer",
                               "description": "The longest the commands may run, in milliseconds."},
                "max_output_length": {"type": "integer",
                                      "description": "The most characters of stdout and stderr to return."}},
                "required": ["commands"], "additionalProperties": false}),
        ),
        ToolKind::LocalShell => (
            "Runs a command on the user's machine and returns its output.",
            json!({"type": "object", "properties": {
                "command": {"type": "array", "items": {"type": "string"},
                            "description": "The program and its arguments."},
                "env": {"type": "object", "additionalProperties": {"type": "string"},
                        "description": "Environment variables to set for the command."},
                "timeout_ms": {"type": "integer",
                               "description": "The longest the command may run, in milliseconds."},
                "user": {"type": "string", "description": "The user to run the command as."},
                "working_directory": {"type": "string",
                                      "description": "The directory to run the command in."}},
                "required": ["command"], "additionalProperties": false}),
        ),
        // Only `ApplyPatch` is left; the other kinds are not built-ins.
        _ => (
            "Creates, updates or deletes one file of the user's workspace.",
            json!({"type": "object", "properties": {
                "type": {"type": "string", "enum": ["create_file", "update_file", "delete_file"],
                         "description": "What to do with the file."},
                "path": {"type": "string",
                         "description": "The file's path, relative to the workspace root."},
                "diff": {"type": "string",
                         "description": "The diff to apply: the whole content for create_file, the changes for update_file; none for delete_file."}},
                "required": ["type", "path"], "additionalProperties": false}),
        ),
    }
}

/// The free-text input of a custom tool call, from the Chat call's arguments
/// (`{"input": "..."}`). A model that wrote something else gets it verbatim: the tool sees
/// what the model meant rather than an error.
pub(crate) fn custom_tool_input(arguments: &str) -> String {
    #[derive(Deserialize)]
    struct Args {
        input: String,
    }
    match serde_json::from_str::<Args>(arguments) {
        Ok(a) => a.input,
        Err(_) => arguments.to_owned(),
    }
}

/// A list of strings, or one string (a model that wrote `"ls"` for `["ls"]`).
fn strings<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

fn shell_action(arguments: &str) -> Option<ShellAction> {
    #[derive(Deserialize)]
    struct Args {
        #[serde(alias = "command", deserialize_with = "strings")]
        commands: Vec<String>,
        #[serde(default)]
        timeout_ms: Option<u64>,
        #[serde(default)]
        max_output_length: Option<u64>,
    }
    let a: Args = serde_json::from_str(arguments).ok()?;
    Some(ShellAction {
        commands: a.commands,
        timeout_ms: a.timeout_ms,
        max_output_length: a.max_output_length,
    })
}

fn local_shell_action(arguments: &str) -> Option<LocalShellAction> {
    #[derive(Deserialize)]
    struct Args {
        #[serde(alias = "commands", deserialize_with = "strings")]
        command: Vec<String>,
        #[serde(default)]
        env: Option<BTreeMap<String, String>>,
        #[serde(default)]
        timeout_ms: Option<u64>,
        #[serde(default)]
        user: Option<String>,
        #[serde(default)]
        working_directory: Option<String>,
    }
    let a: Args = serde_json::from_str(arguments).ok()?;
    Some(LocalShellAction {
        command: a.command,
        env: a.env.unwrap_or_default(),
        timeout_ms: a.timeout_ms,
        user: a.user,
        working_directory: a.working_directory,
    })
}

fn apply_patch_operation(arguments: &str) -> Option<ApplyPatchOperation> {
    // The flat form the function declares, or the built-in's own `{"operation": {...}}`.
    #[derive(Deserialize)]
    struct Nested {
        operation: ApplyPatchOperation,
    }
    serde_json::from_str::<ApplyPatchOperation>(arguments)
        .ok()
        .or_else(|| {
            serde_json::from_str::<Nested>(arguments)
                .ok()
                .map(|n| n.operation)
        })
}

/// The Chat arguments of a built-in call item from the client's history: the action's
/// fields, as the function declares them.
pub(crate) fn builtin_arguments(action: Map<String, Value>) -> String {
    Value::Object(action).to_string()
}

impl ResponsePlan {
    /// What an upstream function name stands for, if more than a plain function.
    pub(crate) fn offered(&self, upstream: &str) -> Option<&OfferedTool> {
        self.tools.iter().find(|t| t.upstream == upstream)
    }

    /// The kind of tool an upstream function name stands for.
    pub(crate) fn tool_kind(&self, upstream: &str) -> ToolKind {
        self.offered(upstream)
            .map_or(ToolKind::Function, |t| t.kind)
    }

    fn call_id(&self, n: usize, call_id: Option<String>) -> String {
        call_id
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| self.item_id("call", n))
    }

    /// The client's item for the `n`th output item, a call the upstream made. `arguments` is
    /// complete (a stream calls this when the call ends; for a function or custom call that
    /// is still open, pass empty arguments and `InProgress`).
    pub(crate) fn call_item(
        &self,
        n: usize,
        call_id: Option<String>,
        upstream: String,
        arguments: String,
        status: ItemStatus,
    ) -> OutputItem {
        let call_id = self.call_id(n, call_id);
        let offered = self.offered(&upstream);
        let kind = offered.map_or(ToolKind::Function, |t| t.kind);
        let namespace = offered.and_then(|t| t.namespace.clone());
        let name = offered.map_or(upstream, |t| t.name.clone());
        let builtin = match kind {
            ToolKind::Function => None,
            ToolKind::Custom => {
                return OutputItem::CustomToolCall(CustomToolCallItem {
                    id: self.item_id("ctc", n),
                    call_id,
                    name,
                    namespace,
                    input: custom_tool_input(&arguments),
                })
            }
            ToolKind::Shell => shell_action(&arguments).map(|action| {
                OutputItem::ShellCall(ShellCallItem {
                    id: self.item_id("sh", n),
                    call_id: call_id.clone(),
                    action,
                    status,
                })
            }),
            ToolKind::LocalShell => local_shell_action(&arguments).map(|action| {
                OutputItem::LocalShellCall(LocalShellCallItem {
                    id: self.item_id("lsh", n),
                    call_id: call_id.clone(),
                    action,
                    status,
                })
            }),
            ToolKind::ApplyPatch => apply_patch_operation(&arguments).map(|operation| {
                OutputItem::ApplyPatchCall(ApplyPatchCallItem {
                    id: self.item_id("apc", n),
                    call_id: call_id.clone(),
                    operation,
                    // No `incomplete` in OpenAI's type: a call cut short is still in progress.
                    status: match status {
                        ItemStatus::Completed => ApplyPatchStatus::Completed,
                        _ => ApplyPatchStatus::InProgress,
                    },
                })
            }),
        };
        // A function, or a built-in call whose arguments do not fit its action.
        builtin.unwrap_or_else(|| {
            OutputItem::FunctionCall(FunctionCallItem {
                id: self.item_id("fc", n),
                call_id,
                name,
                namespace,
                arguments,
                status,
            })
        })
    }
}
