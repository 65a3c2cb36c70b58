//! `POST /v1/responses` body → Chat Completions request body.
//!
//! The parsed body is consumed field by field: every known field is removed as it is
//! validated and mapped, so what is left at the end is exactly the set of unknown fields,
//! forwarded verbatim (vLLM's `top_k`, `chat_template_kwargs`, ...) or rejected in strict
//! mode. Strings move from the request into the Chat messages without copies.

use bytes::Bytes;
use serde_json::{json, Map, Value};

use super::fields::{bad_value, index, join, missing, wrong_type, Obj};
use super::json::ParseError;
use super::{flat_name, DeveloperRole, Exchange, HostedTools, Meta, NamespacedTool, Options};
use crate::openresponses::{ApiError, Echo};

/// A translated request: the Chat body to send upstream and the state for the way back.
#[derive(Debug)]
pub struct Translated {
    pub body: Bytes,
    pub exchange: Exchange,
}

const INCLUDE_VALUES: &[&str] = &[
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
];
const LOGPROBS_INCLUDE: &str = "message.output_text.logprobs";
const ENCRYPTED_INCLUDE: &str = "reasoning.encrypted_content";

/// The request body as a JSON object, within the size cap.
pub(super) fn parse_body(body: &[u8], options: &Options) -> Result<Obj<'static>, ApiError> {
    if body.len() > options.max_request_bytes {
        return Err(ApiError::invalid_body(format!(
            "The request body has {} bytes; this server accepts at most {}.",
            body.len(),
            options.max_request_bytes
        ))
        .with_status(413)
        .with_code("request_too_large"));
    }
    let value = super::json::parse(body).map_err(|e| match e {
        ParseError::Syntax(e) => ApiError::invalid_body(format!(
            "The request body is not valid JSON: {e}. Send a JSON object with 'model' and 'input'."
        ))
        .with_code("invalid_json"),
        ParseError::Duplicate(path) => ApiError::invalid(
            path.as_str(),
            format!("Invalid request: '{path}' is given twice. Each field may appear once."),
        )
        .with_code("duplicate_key"),
    })?;
    match value {
        Value::Object(map) => Ok(Obj { map, path: "" }),
        other => Err(ApiError::invalid_body(format!(
            "The request body must be a JSON object, not {}.",
            match other {
                Value::Array(_) => "an array",
                Value::String(_) => "a string",
                Value::Number(_) => "a number",
                Value::Bool(_) => "a boolean",
                _ => "null",
            }
        ))
        .with_code("invalid_json")),
    }
}

/// Validates a Responses request and maps it to Chat Completions.
pub fn translate(body: &[u8], options: &Options, meta: Meta) -> Result<Translated, ApiError> {
    let mut req = parse_body(body, options)?;
    reject_stateful(&mut req)?;
    // Codex sends its installation/session ids here: client bookkeeping, not for the model.
    req.object("client_metadata")?;

    let model = req.required_string("model")?;
    if model.is_empty() {
        return Err(bad_value("model", "Invalid 'model': must not be empty."));
    }
    let stream = req.bool("stream")?.unwrap_or(false);
    let store = req.bool("store")?.unwrap_or(false);
    if store && options.strict {
        return Err(bad_value(
            "store",
            "This server is stateless and does not store responses: set 'store' to false or omit it.",
        )
        .with_code("unsupported_parameter"));
    }
    if let Some(so) = req.object("stream_options")? {
        let mut so = Obj {
            map: so,
            path: "stream_options",
        };
        so.bool("include_obfuscation")?;
    }

    let mut echo = Echo::default();
    let mut chat = Map::new();
    chat.insert("model".into(), Value::String(model.clone()));

    // Messages: instructions first, then the input items in order.
    let mut messages = Vec::new();
    if let Some(instructions) = req.string("instructions")? {
        check_part_size("instructions", instructions.len(), options)?;
        messages.push(json!({"role": system_role(options), "content": instructions.clone()}));
        echo.instructions = Some(instructions);
    }
    let input = req.take("input").ok_or_else(|| missing("input"))?;
    let mut context = Vec::new();
    let mut conversation = Vec::new();
    input_messages(input, &mut conversation, &mut context, options)?;
    messages.append(&mut context);
    messages.append(&mut conversation);
    chat.insert(
        "messages".into(),
        Value::Array(merge_leading_system(messages)),
    );

    // Tools and how the model may use them.
    let mut namespaced = Vec::new();
    let mut custom_tools = Vec::new();
    let tools = match req.array("tools")? {
        Some(list) => tools(list, &mut echo, &mut namespaced, &mut custom_tools, options)?,
        None => Vec::new(),
    };
    let tool_names: Vec<&str> = tools
        .iter()
        .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
        .collect();
    let choice = req.take("tool_choice");
    let choice = match choice {
        Some(c) => Some(tool_choice(&c, &tool_names)?),
        None => None,
    };
    let mut chat_tools = tools;
    if let Some((chat_choice, allowed, echoed)) = choice {
        if let Some(allowed) = allowed {
            chat_tools.retain(|t| {
                t.pointer("/function/name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| allowed.iter().any(|a| a == n))
            });
        }
        if chat_tools.is_empty() {
            // Chat servers (vLLM) reject a `tool_choice` without `tools`; with no tools
            // 'auto' and 'none' both mean "answer in text", but 'required' cannot be met.
            if chat_choice == "required" {
                return Err(bad_value(
                    "tool_choice",
                    "Invalid 'tool_choice': 'required' needs at least one function in 'tools'.",
                ));
            }
        } else {
            chat.insert("tool_choice".into(), chat_choice);
        }
        echo.tool_choice = echoed;
    }
    if !chat_tools.is_empty() {
        chat.insert("tools".into(), Value::Array(chat_tools));
    }
    if let Some(p) = req.bool("parallel_tool_calls")? {
        // Like `tool_choice`, only meaningful (and accepted by strict servers) with tools.
        if chat.contains_key("tools") {
            chat.insert("parallel_tool_calls".into(), Value::Bool(p));
        }
        echo.parallel_tool_calls = p;
    }
    echo.max_tool_calls = req.integer("max_tool_calls", 1, u64::from(u32::MAX))?;

    // Sampling.
    if let Some(n) = req.integer("max_output_tokens", 1, u64::from(u32::MAX))? {
        chat.insert("max_completion_tokens".into(), n.into());
        echo.max_output_tokens = Some(n);
    }
    for (key, min, max, slot) in [
        ("temperature", 0.0, 2.0, &mut echo.temperature),
        ("top_p", 0.0, 1.0, &mut echo.top_p),
        ("presence_penalty", -2.0, 2.0, &mut echo.presence_penalty),
        ("frequency_penalty", -2.0, 2.0, &mut echo.frequency_penalty),
    ] {
        if let Some(x) = req.number(key, min, max)? {
            chat.insert(key.into(), number(x));
            *slot = x;
        }
    }

    // Output shape.
    let include = include(&mut req)?;
    let top_logprobs = req.integer("top_logprobs", 0, 20)?;
    let logprobs =
        include.iter().any(|i| i == LOGPROBS_INCLUDE) || top_logprobs.is_some_and(|n| n > 0);
    if logprobs {
        chat.insert("logprobs".into(), Value::Bool(true));
        if let Some(n) = top_logprobs {
            chat.insert("top_logprobs".into(), n.into());
        }
    }
    echo.top_logprobs = top_logprobs.unwrap_or(0);
    let seal_reasoning = include.iter().any(|i| i == ENCRYPTED_INCLUDE);
    if seal_reasoning && options.keyring.is_none() {
        return Err(bad_value(
            "include",
            "'reasoning.encrypted_content' is not available: this server has no reasoning keys configured.",
        )
        .with_code("unsupported_parameter"));
    }
    if let Some(text) = req.object("text")? {
        text_format(text, &mut chat, &mut echo)?;
    }
    if let Some(reasoning) = req.object("reasoning")? {
        let mut r = Obj {
            map: reasoning,
            path: "reasoning",
        };
        let effort = r.enumeration("effort", &["none", "low", "medium", "high", "xhigh"])?;
        let summary = r.enumeration("summary", &["auto", "concise", "detailed"])?;
        r.string("generate_summary")?;
        r.deny_unknown()?;
        if let Some(e) = effort {
            chat.insert("reasoning_effort".into(), e.into());
        }
        echo.reasoning = Some(json!({"effort": effort, "summary": summary}));
    }

    // Echoed, not sent upstream.
    if let Some(t) = req.enumeration("truncation", &["auto", "disabled"])? {
        echo.truncation = t.into();
    }
    if let Some(t) = req.enumeration("service_tier", &["auto", "default", "flex", "priority"])? {
        echo.service_tier = t.into();
    }
    if let Some(m) = req.take("metadata") {
        echo.metadata = metadata(m)?;
    }
    if let Some(key) = req.string("prompt_cache_key")? {
        if key.chars().count() > 64 {
            return Err(bad_value(
                "prompt_cache_key",
                "Invalid 'prompt_cache_key': at most 64 characters.",
            ));
        }
        echo.prompt_cache_key = Some(key);
    }
    if let Some(id) = req.string("safety_identifier")? {
        if id.chars().count() > 64 {
            return Err(bad_value(
                "safety_identifier",
                "Invalid 'safety_identifier': at most 64 characters.",
            ));
        }
        chat.insert("user".into(), Value::String(id.clone()));
        echo.safety_identifier = Some(id);
    }

    if stream {
        chat.insert("stream".into(), Value::Bool(true));
        // Usage arrives in a trailing chunk only when asked for.
        chat.insert("stream_options".into(), json!({"include_usage": true}));
    }

    // Provider extensions (`slug:field`) belong to another provider's API: never forwarded.
    req.map.retain(|k, _| !is_extension(k));
    // Whatever is left is not part of the Responses API.
    if options.strict {
        if let Some(key) = req.map.keys().next() {
            return Err(ApiError::invalid(key.as_str(), format!(
                "Unknown parameter: '{key}'. This server runs in strict mode and forwards no fields outside the OpenResponses API."
            ))
            .with_code("unknown_parameter"));
        }
    }
    for (k, v) in std::mem::take(&mut req.map) {
        chat.entry(k).or_insert(v);
    }

    echo.store = false;
    let mut exchange = Exchange::new(&model, stream, meta, options.clone());
    exchange.echo = echo;
    exchange.logprobs = logprobs;
    exchange.seal_reasoning = seal_reasoning;
    exchange.namespaced = namespaced;
    exchange.custom_tools = custom_tools;
    let body = serde_json::to_vec(&Value::Object(chat)).map_err(|e| {
        ApiError::server(
            500,
            "internal_error",
            format!("could not encode the upstream request: {e}"),
        )
    })?;
    Ok(Translated {
        body: Bytes::from(body),
        exchange,
    })
}

/// The stateless tier serves only requests that carry their whole context.
pub(super) fn reject_stateful(req: &mut Obj<'_>) -> Result<(), ApiError> {
    if let Some(id) = req.string("previous_response_id")? {
        return Err(ApiError::invalid(
            "previous_response_id",
            format!(
                "Previous response with id '{id}' not found. This server is stateless (store: false): \
                 send the whole conversation in 'input' instead of 'previous_response_id'."
            ),
        )
        .with_code("previous_response_not_found"));
    }
    if req.bool("background")? == Some(true) {
        return Err(bad_value(
            "background",
            "Background responses need stored state, which this stateless server does not keep: omit 'background' or set it to false.",
        )
        .with_code("unsupported_parameter"));
    }
    if req.has("conversation") {
        return Err(bad_value(
            "conversation",
            "Conversations need stored state, which this stateless server does not keep: send the whole conversation in 'input'.",
        )
        .with_code("unsupported_parameter"));
    }
    if req.has("prompt") {
        return Err(bad_value(
            "prompt",
            "Stored prompt templates are not available on this stateless server: send 'instructions' and 'input' instead.",
        )
        .with_code("unsupported_parameter"));
    }
    Ok(())
}

fn number(x: f64) -> Value {
    serde_json::Number::from_f64(x).map_or(Value::Null, Value::Number)
}

fn include(req: &mut Obj<'_>) -> Result<Vec<String>, ApiError> {
    let Some(list) = req.array("include")? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, v) in list.into_iter().enumerate() {
        let path = index("include", i);
        match v {
            Value::String(s) if INCLUDE_VALUES.contains(&s.as_str()) => out.push(s),
            Value::String(s) => {
                return Err(bad_value(
                    &path,
                    format!(
                        "Invalid value for '{path}': '{s}'. Supported values are: {}.",
                        INCLUDE_VALUES.join(", ")
                    ),
                ))
            }
            other => return Err(wrong_type(&path, "a string", &other)),
        }
    }
    Ok(out)
}

fn metadata(value: Value) -> Result<Value, ApiError> {
    let map = match value {
        Value::Object(m) => m,
        other => return Err(wrong_type("metadata", "an object", &other)),
    };
    if map.len() > 16 {
        return Err(bad_value(
            "metadata",
            "Invalid 'metadata': at most 16 key-value pairs are allowed.",
        ));
    }
    for (k, v) in &map {
        let path = join("metadata", k);
        if k.chars().count() > 64 {
            return Err(bad_value(
                &path,
                "Invalid 'metadata': keys are at most 64 characters.",
            ));
        }
        match v {
            Value::String(s) if s.chars().count() <= 512 => {}
            Value::String(_) => {
                return Err(bad_value(
                    &path,
                    "Invalid 'metadata': values are at most 512 characters.",
                ))
            }
            other => return Err(wrong_type(&path, "a string", other)),
        }
    }
    Ok(Value::Object(map))
}

/// `text.format` → `response_format`; the Responses form is echoed as given.
fn text_format(
    text: Map<String, Value>,
    chat: &mut Map<String, Value>,
    echo: &mut Echo,
) -> Result<(), ApiError> {
    let mut text = Obj {
        map: text,
        path: "text",
    };
    let verbosity = text.enumeration("verbosity", &["low", "medium", "high"])?;
    let mut echoed = Map::new();
    if let Some(format) = text.object("format")? {
        let mut f = Obj {
            map: format,
            path: "text.format",
        };
        let kind = f
            .enumeration("type", &["text", "json_object", "json_schema"])?
            .ok_or_else(|| missing("text.format.type"))?;
        match kind {
            "text" => {
                echoed.insert("format".into(), json!({"type": "text"}));
            }
            "json_object" => {
                chat.insert("response_format".into(), json!({"type": "json_object"}));
                echoed.insert("format".into(), json!({"type": "json_object"}));
            }
            _ => {
                let name = f.required_string("name")?;
                let schema = f
                    .object("schema")?
                    .ok_or_else(|| missing("text.format.schema"))?;
                let description = f.string("description")?;
                let strict = f.bool("strict")?;
                let mut js = Map::new();
                js.insert("name".into(), name.clone().into());
                if let Some(d) = &description {
                    js.insert("description".into(), d.clone().into());
                }
                js.insert("schema".into(), Value::Object(schema.clone()));
                if let Some(s) = strict {
                    js.insert("strict".into(), s.into());
                }
                chat.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": Value::Object(js)}),
                );
                echoed.insert(
                    "format".into(),
                    json!({"type": "json_schema", "name": name, "description": description,
                           "schema": Value::Object(schema), "strict": strict.unwrap_or(false)}),
                );
            }
        }
        f.deny_unknown()?;
    } else {
        echoed.insert("format".into(), json!({"type": "text"}));
    }
    if let Some(v) = verbosity {
        echoed.insert("verbosity".into(), v.into());
        chat.insert("verbosity".into(), v.into());
    }
    text.deny_unknown()?;
    echo.text = Value::Object(echoed);
    Ok(())
}

/// Tools → Chat's nested function tools; fills `echo.tools` and, for `namespace` and `custom`
/// tools, the names to restore on the way back. Hosted tools are dropped or rejected
/// (`options`).
fn tools(
    list: Vec<Value>,
    echo: &mut Echo,
    namespaced: &mut Vec<NamespacedTool>,
    custom_tools: &mut Vec<String>,
    options: &Options,
) -> Result<Vec<Value>, ApiError> {
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
        json!({ super::CUSTOM_TOOL_INPUT: {"type": "string", "description": input} }),
    );
    parameters.insert("required".into(), json!([super::CUSTOM_TOOL_INPUT]));
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
    chat_tools: &mut Vec<Value>,
    echo: &mut Echo,
    namespaced: &mut Vec<NamespacedTool>,
) -> Result<(), ApiError> {
    let upstream_name = match origin {
        Origin::Namespace(ns) => flat_name(ns, &f.name),
        Origin::Function | Origin::Custom => f.name.clone(),
    };
    let taken = chat_tools
        .iter()
        .any(|t| t.pointer("/function/name").and_then(Value::as_str) == Some(&upstream_name));
    if taken {
        return Err(bad_value(
            &join(path, "name"),
            format!("Duplicate tool name '{upstream_name}' in 'tools'."),
        ));
    }
    let mut function = Map::new();
    function.insert("name".into(), upstream_name.clone().into());
    if let Some(d) = &f.description {
        function.insert("description".into(), d.clone().into());
    }
    if let Some(p) = &f.parameters {
        function.insert("parameters".into(), Value::Object(p.clone()));
    }
    if let Some(s) = f.strict {
        function.insert("strict".into(), s.into());
    }
    chat_tools.push(json!({"type": "function", "function": Value::Object(function)}));
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
/// and the choice as the response echoes it.
fn tool_choice(
    choice: &Value,
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
    match choice {
        Value::String(s) if matches!(s.as_str(), "auto" | "none" | "required") => {
            Ok((choice.clone(), None, choice.clone()))
        }
        Value::String(s) => Err(bad_value(
            "tool_choice",
            format!("Invalid value for 'tool_choice': '{s}'. Supported values are: 'auto', 'none', 'required', or an object."),
        )),
        Value::Object(o) => match o.get("type").and_then(Value::as_str) {
            Some(kind @ ("function" | "custom")) => {
                let name = match o.get("name") {
                    Some(Value::String(n)) => n,
                    Some(other) => return Err(wrong_type("tool_choice.name", "a string", other)),
                    None => return Err(missing("tool_choice.name")),
                };
                named(name, "tool_choice.name")?;
                Ok((
                    json!({"type": "function", "function": {"name": name}}),
                    None,
                    json!({"type": kind, "name": name}),
                ))
            }
            Some("allowed_tools") => {
                let mode = match o.get("mode").and_then(Value::as_str) {
                    Some(m @ ("auto" | "required" | "none")) => m,
                    None if o.get("mode").is_none() => "auto",
                    _ => {
                        return Err(bad_value(
                            "tool_choice.mode",
                            "Invalid 'tool_choice.mode': expected 'auto', 'required' or 'none'.",
                        ))
                    }
                };
                let list = match o.get("tools") {
                    Some(Value::Array(a)) => a,
                    Some(other) => return Err(wrong_type("tool_choice.tools", "an array", other)),
                    None => return Err(missing("tool_choice.tools")),
                };
                if list.is_empty() {
                    return Err(bad_value(
                        "tool_choice.tools",
                        "Invalid 'tool_choice.tools': list at least one function.",
                    ));
                }
                let mut allowed = Vec::with_capacity(list.len());
                for (i, t) in list.iter().enumerate() {
                    let path = format!("tool_choice.tools[{i}].name");
                    let name = t
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| missing(&path))?;
                    named(name, &path)?;
                    allowed.push(name.to_owned());
                }
                // The response echoes the complete form (`mode` is required there).
                let echoed = json!({
                    "type": "allowed_tools",
                    "mode": mode,
                    "tools": allowed.iter().map(|n| json!({"type": "function", "name": n})).collect::<Vec<_>>(),
                });
                Ok((Value::String(mode.into()), Some(allowed), echoed))
            }
            Some(other) => Err(bad_value(
                "tool_choice.type",
                format!("Unsupported 'tool_choice.type': '{other}'. Supported: 'function', 'custom', 'allowed_tools'."),
            )),
            None => Err(missing("tool_choice.type")),
        },
        other => Err(wrong_type("tool_choice", "a string or an object", other)),
    }
}

/// Builds the Chat messages from `input`, appending to `messages`.
/// The input items as Chat messages, in order. Summaries opened from `compaction` items go to
/// `context` instead: the caller puts them at the head, next to the instructions, because
/// most chat templates accept system messages only there.
pub(super) fn input_messages(
    input: Value,
    messages: &mut Vec<Value>,
    context: &mut Vec<Value>,
    options: &Options,
) -> Result<(), ApiError> {
    let items = match input {
        Value::String(s) if s.is_empty() => {
            return Err(bad_value("input", "Invalid 'input': must not be empty."))
        }
        Value::String(s) => {
            check_part_size("input", s.len(), options)?;
            messages.push(json!({"role": "user", "content": s}));
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
                if msg["role"] == "assistant" {
                    if let Some(r) = pending_reasoning.take() {
                        msg["reasoning_content"] = Value::String(r);
                    }
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
                let arguments = json!({ super::CUSTOM_TOOL_INPUT: input }).to_string();
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
                messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": output}));
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
                let summary = super::compact::open(&blob, &blob_path, options)?;
                context.push(json!({"role": system_role(options), "content": super::compact::context_text(&summary)}));
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
    messages: &mut Vec<Value>,
    pending_reasoning: &mut Option<String>,
    call_id: String,
    name: String,
    arguments: String,
) {
    let call = json!({"id": call_id, "type": "function",
                      "function": {"name": name, "arguments": arguments}});
    match messages.last_mut() {
        Some(last) if last["role"] == "assistant" && pending_reasoning.is_none() => {
            match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                Some(calls) => calls.push(call),
                None => last["tool_calls"] = Value::Array(vec![call]),
            }
        }
        _ => {
            let mut msg = json!({"role": "assistant", "content": null, "tool_calls": [call]});
            if let Some(r) = pending_reasoning.take() {
                msg["reasoning_content"] = Value::String(r);
            }
            messages.push(msg);
        }
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
fn message(mut item: Obj<'_>, options: &Options) -> Result<Value, ApiError> {
    let role_path = item.field_path("role");
    let role = item
        .enumeration("role", &["user", "assistant", "system", "developer"])?
        .ok_or_else(|| missing(&role_path))?;
    item.string("status")?;
    let content_path = item.field_path("content");
    let content = item.take("content").ok_or_else(|| missing(&content_path))?;
    item.deny_unknown()?;
    let chat_role = if role == "developer" {
        system_role(options)
    } else {
        role
    };
    let content = match content {
        Value::String(s) => {
            check_part_size(&content_path, s.len(), options)?;
            Value::String(s)
        }
        Value::Array(parts) => match role {
            "system" | "developer" => Value::String(text_of_parts(parts, &content_path, options)?),
            "assistant" => assistant_content(parts, &content_path)?,
            _ => user_content(parts, &content_path, options)?,
        },
        other => {
            return Err(wrong_type(
                &content_path,
                "a string or an array of content parts",
                &other,
            ))
        }
    };
    if role == "assistant" {
        if let Value::Object(mut m) = content {
            // assistant_content returns {content, refusal}
            let mut msg = json!({"role": "assistant"});
            msg["content"] = m.remove("content").unwrap_or(Value::Null);
            if let Some(r) = m.remove("refusal") {
                msg["refusal"] = r;
            }
            return Ok(msg);
        }
    }
    Ok(json!({"role": chat_role, "content": content}))
}

/// Assistant history: `output_text` parts join into `content`, `refusal` parts into `refusal`.
fn assistant_content(parts: Vec<Value>, path: &str) -> Result<Value, ApiError> {
    let mut text: Option<String> = None;
    let mut refusal: Option<String> = None;
    for (i, part) in parts.into_iter().enumerate() {
        let ppath = index(path, i);
        let mut p = Obj::new(part, &ppath)?;
        let kind = p.required_string("type")?;
        let (slot, key) = match kind.as_str() {
            "output_text" | "input_text" | "text" => (&mut text, "text"),
            "refusal" => (&mut refusal, "refusal"),
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
    let mut out = Map::new();
    out.insert("content".into(), text.map_or(Value::Null, Value::String));
    if let Some(r) = refusal {
        out.insert("refusal".into(), Value::String(r));
    }
    Ok(Value::Object(out))
}

/// User content parts → Chat content parts.
fn user_content(parts: Vec<Value>, path: &str, options: &Options) -> Result<Value, ApiError> {
    let mut out = Vec::with_capacity(parts.len());
    for (i, part) in parts.into_iter().enumerate() {
        let ppath = index(path, i);
        let mut p = Obj::new(part, &ppath)?;
        let kind = p.required_string("type")?;
        let chat_part = match kind.as_str() {
            "input_text" | "text" => {
                let text = p.required_string("text")?;
                check_part_size(&p.field_path("text"), text.len(), options)?;
                json!({"type": "text", "text": text})
            }
            "input_image" => {
                let detail = p.enumeration("detail", &["auto", "low", "high"])?;
                if p.has("file_id") {
                    return Err(stored_file(&p.field_path("file_id")));
                }
                let url = p.required_string("image_url")?;
                check_part_size(&p.field_path("image_url"), url.len(), options)?;
                let mut image = json!({"url": url});
                if let Some(d) = detail {
                    image["detail"] = d.into();
                }
                json!({"type": "image_url", "image_url": image})
            }
            "input_file" => {
                if p.has("file_id") {
                    return Err(stored_file(&p.field_path("file_id")));
                }
                let filename = p.string("filename")?;
                let file_data = p.string("file_data")?;
                let file_url = p.string("file_url")?;
                let mut file = Map::new();
                match (file_data, file_url) {
                    (Some(data), None) => {
                        check_part_size(&p.field_path("file_data"), data.len(), options)?;
                        file.insert("file_data".into(), data.into());
                    }
                    (None, Some(url)) => {
                        file.insert("file_url".into(), url.into());
                    }
                    (Some(_), Some(_)) => {
                        return Err(bad_value(&ppath, format!("Invalid '{ppath}': give either 'file_data' or 'file_url', not both.")))
                    }
                    (None, None) => return Err(missing(&p.field_path("file_data"))),
                }
                if let Some(f) = filename {
                    file.insert("filename".into(), f.into());
                }
                json!({"type": "file", "file": Value::Object(file)})
            }
            "input_video" => {
                let url = p.required_string("video_url")?;
                check_part_size(&p.field_path("video_url"), url.len(), options)?;
                json!({"type": "video_url", "video_url": {"url": url}})
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
    Ok(Value::Array(out))
}

fn stored_file(path: &str) -> ApiError {
    bad_value(
        path,
        format!("Invalid '{path}': stored files are not available on this stateless server. Send the content inline (data URL or 'file_data')."),
    )
    .with_code("unsupported_parameter")
}

/// The role `instructions` and `developer` messages take upstream. Most open-weight chat
/// templates know only `system`; some upstreams understand `developer` (configurable).
pub(super) fn system_role(options: &Options) -> &'static str {
    match options.developer_role {
        DeveloperRole::System => "system",
        DeveloperRole::Developer => "developer",
    }
}

/// Provider extensions are named `slug:type` (items, parts) or `slug:field` (fields).
pub(super) fn is_extension(name: &str) -> bool {
    name.split_once(':')
        .is_some_and(|(slug, rest)| !slug.is_empty() && !rest.is_empty())
}

/// One content part (text, image or file data, tool output) within the configured size.
pub(super) fn check_part_size(path: &str, len: usize, options: &Options) -> Result<(), ApiError> {
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
pub(super) fn merge_leading_system(messages: Vec<Value>) -> Vec<Value> {
    let head = messages
        .iter()
        .take_while(|m| {
            matches!(m["role"].as_str(), Some("system" | "developer")) && m["content"].is_string()
        })
        .count();
    let same_role = messages[..head]
        .windows(2)
        .all(|w| w[0]["role"] == w[1]["role"]);
    if head < 2 || !same_role {
        return messages;
    }
    let mut rest = messages.into_iter();
    let mut first = rest.next().unwrap_or(Value::Null);
    let mut text = first["content"].as_str().unwrap_or_default().to_owned();
    for m in rest.by_ref().take(head - 1) {
        text.push_str("\n\n");
        text.push_str(m["content"].as_str().unwrap_or_default());
    }
    first["content"] = Value::String(text);
    std::iter::once(first).chain(rest).collect()
}
