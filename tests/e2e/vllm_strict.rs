//! Opt-in (`RESPONSES_E2E_VLLM_PORT=<port>`: a vLLM serving on 127.0.0.1 with
//! `--enable-auto-tool-choice --tool-call-parser hermes`, as `../shared/upstreams/vllm-cpu.md`
//! starts one; `RESPONSES_E2E_VLLM_MODEL` names its model, `smollm2` by default): a function
//! tool without `strict` is strict by default, as the Responses API defines it. Forced calls
//! to a `get_weather` tool whose schema needs normalising (not closed, an optional property)
//! come back with arguments that parse and follow the schema, every time; vLLM constrains
//! only the name of a loose forced call, so a small model's arguments without this are
//! whatever it writes. Both modes.

use std::time::Duration;

use crate::common::{client, Stack};
use serde_json::{json, Value};

const RUNS: usize = 20;

fn tool(strict: Option<bool>) -> Value {
    let mut tool = json!({
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city"},
                "unit": {"type": "string", "enum": ["C", "F"]}
            },
            "required": ["city"]
        }
    });
    if let Some(strict) = strict {
        tool["strict"] = json!(strict);
    }
    tool
}

/// Why `arguments` do not follow the tool's schema, if they do not.
fn off_schema(arguments: &str) -> Option<String> {
    let Ok(Value::Object(args)) = serde_json::from_str::<Value>(arguments) else {
        return Some(format!("not a JSON object: {arguments}"));
    };
    if !args.get("city").is_some_and(Value::is_string) {
        return Some(format!("no string city: {arguments}"));
    }
    if let Some(unit) = args.get("unit") {
        // Strict mode's way of leaving out an optional argument is `null`.
        if !(unit.is_null() || unit == "C" || unit == "F") {
            return Some(format!("unit outside its enum: {arguments}"));
        }
    }
    if args.keys().any(|k| k != "city" && k != "unit") {
        return Some(format!("an argument the schema has not: {arguments}"));
    }
    None
}

/// One forced call: the function call's arguments, or what came instead.
async fn forced_call(stack: &Stack, model: &str, strict: Option<bool>) -> Result<Value, String> {
    let body = json!({
        "model": model,
        "input": "What is the weather in Paris?",
        "tools": [tool(strict)],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 64,
        "store": false,
    });
    let answer = client()
        .post(stack.envoy.url("/v1/responses"))
        .json(&body)
        .timeout(Duration::from_secs(300))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let status = answer.status();
    let v: Value = answer.json().await.map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("{status}: {v}"));
    }
    let call = v["output"]
        .as_array()
        .and_then(|o| o.iter().find(|i| i["type"] == "function_call"))
        .ok_or_else(|| format!("no function call: {}", v["output"]))?;
    if let Some(reason) = off_schema(call["arguments"].as_str().unwrap_or_default()) {
        return Err(reason);
    }
    Ok(v["tools"][0].clone())
}

#[tokio::test]
async fn forced_calls_without_strict_follow_the_schema_against_a_real_vllm() {
    let Ok(port) = std::env::var("RESPONSES_E2E_VLLM_PORT") else {
        eprintln!("opt-in: set RESPONSES_E2E_VLLM_PORT to a vLLM's port on 127.0.0.1");
        return;
    };
    let port: u16 = port.parse().expect("a port");
    let model = std::env::var("RESPONSES_E2E_VLLM_MODEL").unwrap_or_else(|_| "smollm2".into());
    let stack = Stack::start(port, &[]);

    let mut failures = Vec::new();
    for run in 0..RUNS {
        match forced_call(&stack, &model, None).await {
            Ok(echoed) => {
                // The echo says what applied: strict, with the schema that went.
                assert_eq!(echoed["strict"], true, "{echoed}");
                assert_eq!(echoed["parameters"]["additionalProperties"], false);
                assert_eq!(echoed["parameters"]["required"], json!(["city", "unit"]));
            }
            Err(e) => failures.push(format!("run {run}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {RUNS} forced calls without strict missed the schema:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // What the same calls were before (and are with `strict: false`): told for the record,
    // not asserted, since a loose call's arguments are whatever the model writes.
    let mut loose_misses = 0;
    for _ in 0..5 {
        loose_misses += usize::from(forced_call(&stack, &model, Some(false)).await.is_err());
    }
    eprintln!("strict: false: {loose_misses} of 5 forced calls missed the schema");
}
