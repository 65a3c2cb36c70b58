//! Validation against the official OpenResponses OpenAPI document
//! (`tests/fixtures/openresponses/openapi.json`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::{json, Value};

use super::repo_root;
use super::sse::{parse_sse, SseEvent};

/// The OpenAPI document (loaded once).
pub fn openapi() -> &'static Value {
    static DOC: OnceLock<Value> = OnceLock::new();
    DOC.get_or_init(|| {
        let path = repo_root().join("tests/fixtures/openresponses/openapi.json");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        serde_json::from_str(&text).expect("openapi.json is JSON")
    })
}

/// `components.schemas` of the document.
pub fn schemas() -> &'static serde_json::Map<String, Value> {
    openapi()["components"]["schemas"]
        .as_object()
        .expect("components.schemas")
}

/// A validator for `#/components/schemas/<name>` (compiled once per name).
pub fn validator(name: &str) -> Arc<jsonschema::Validator> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<jsonschema::Validator>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(v) = cache.lock().unwrap().get(name) {
        return v.clone();
    }
    assert!(
        schemas().contains_key(name),
        "no schema named {name} in the OpenResponses document"
    );
    // A root document whose `$ref`s (`#/components/schemas/...`) resolve against itself.
    let root = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": format!("#/components/schemas/{name}"),
        "components": openapi()["components"],
    });
    let compiled = Arc::new(
        jsonschema::options()
            .with_draft(jsonschema::Draft::Draft202012)
            .build(&root)
            .unwrap_or_else(|e| panic!("compile schema {name}: {e}")),
    );
    cache
        .lock()
        .unwrap()
        .insert(name.to_string(), compiled.clone());
    compiled
}

/// Every validation error of `value` against schema `name` (`path: message`), empty if valid.
pub fn errors(name: &str, value: &Value) -> Vec<String> {
    let validator = validator(name);
    let errors: Vec<String> = validator
        .iter_errors(value)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    errors
}

/// Panics, listing every error, unless `value` is valid against schema `name`.
#[track_caller]
pub fn assert_valid(name: &str, value: &Value) {
    let errors = errors(name, value);
    assert!(
        errors.is_empty(),
        "not a valid {name} ({} error(s)):\n  {}\nvalue: {}",
        errors.len(),
        errors.join("\n  "),
        serde_json::to_string_pretty(value).unwrap_or_default()
    );
}

/// Streaming event type (`response.created`, ...) → schema name
/// (`ResponseCreatedStreamingEvent`, ...), read from each `*StreamingEvent` schema's
/// `properties.type.enum[0]`.
pub fn event_schema_names() -> &'static BTreeMap<String, String> {
    static MAP: OnceLock<BTreeMap<String, String>> = OnceLock::new();
    MAP.get_or_init(|| {
        schemas()
            .iter()
            .filter(|(name, _)| name.ends_with("StreamingEvent"))
            .map(|(name, schema)| {
                let ty = schema["properties"]["type"]["enum"][0]
                    .as_str()
                    .unwrap_or_else(|| panic!("{name} has no properties.type.enum[0]"));
                (ty.to_string(), name.clone())
            })
            .collect()
    })
}

/// Validates one streaming event against the schema its `type` names.
#[track_caller]
pub fn assert_valid_event(event: &Value) {
    let ty = event["type"]
        .as_str()
        .unwrap_or_else(|| panic!("streaming event without a string `type`: {event}"));
    // OpenAI's names for the two reasoning-text events (served to OpenAI's SDKs and Codex,
    // core/src/client.rs): the same payload as the specification's events, checked as those.
    let spec_ty = match ty {
        "response.reasoning_text.delta" => "response.reasoning.delta",
        "response.reasoning_text.done" => "response.reasoning.done",
        other => other,
    };
    let name = event_schema_names()
        .get(spec_ty)
        .unwrap_or_else(|| panic!("unknown streaming event type {ty:?}: {event}"));
    if spec_ty == ty {
        assert_valid(name, event);
    } else {
        let mut renamed = event.clone();
        renamed["type"] = Value::from(spec_ty);
        assert_valid(name, &renamed);
    }
}

/// Checks a whole Responses SSE body and returns its events as `(event name, data)`:
/// * framing: LF line endings only, every event ended by a blank line, one `data:` line of
///   one-line JSON per event (the official compliance suite's reader needs all of that);
/// * each event is JSON without a key given twice in one object;
/// * each event's `event:` name equals its `type` (when the `event:` line is present);
/// * each event is valid against its `*StreamingEvent` schema;
/// * `sequence_number`s strictly increase.
///
/// A final `data: [DONE]` is allowed and not returned.
#[track_caller]
pub fn assert_valid_sse(body: &str) -> Vec<(String, Value)> {
    assert!(!body.contains('\r'), "SSE body has CR characters:\n{body}");
    assert!(
        body.is_empty() || body.ends_with("\n\n"),
        "SSE body does not end with a blank line:\n{body}"
    );
    let mut out = Vec::new();
    let mut last_sequence: Option<u64> = None;
    let events = parse_sse(body);
    for (
        i,
        SseEvent {
            event,
            data,
            data_lines,
        },
    ) in events.iter().enumerate()
    {
        assert_eq!(
            *data_lines, 1,
            "event {i} has {data_lines} data lines (want one line of JSON):\n{body}"
        );
        if data == "[DONE]" {
            assert_eq!(i + 1, events.len(), "[DONE] is not the last event:\n{body}");
            continue;
        }
        let value: Value = super::json::parse_strict(data)
            .unwrap_or_else(|e| panic!("event {i} data is not strict JSON ({e}): {data}"));
        let ty = value["type"].as_str().unwrap_or_default().to_string();
        if let Some(event) = event {
            assert_eq!(*event, ty, "event name differs from data.type: {data}");
        }
        assert_valid_event(&value);
        if let Some(seq) = value["sequence_number"].as_u64() {
            if let Some(last) = last_sequence {
                assert!(seq > last, "sequence_number {seq} after {last}:\n{body}");
            }
            last_sequence = Some(seq);
        }
        out.push((ty, value));
    }
    out
}
