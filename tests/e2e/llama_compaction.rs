//! Opt-in (`RESPONSES_E2E_LLAMA_COMPACTION=1`, slow: two model calls per turn on a CPU):
//! against a real llama-server with a 512-token context, a 30-turn conversation that keeps
//! appending its output completes every turn with `context_management`, where the same
//! conversation without it ends in `context_length_exceeded`. Both modes.

use std::time::{Duration, Instant};

use crate::common::llama::LlamaServer;
use crate::common::{client, Stack};
use serde_json::{json, Value};

const TURNS: usize = 30;

/// Runs the conversation; returns the turn that failed (with its error), if one did.
async fn converse(stack: &Stack, compact: bool) -> Result<usize, (usize, Value)> {
    let mut history: Vec<Value> = Vec::new();
    let mut compactions = 0;
    for turn in 0..TURNS {
        history.push(json!({"role": "user", "content": format!(
            "Turn {turn}: tell me one short fact about the number {turn}, in one sentence."
        )}));
        let mut body = json!({"model": "smollm2", "input": history, "max_output_tokens": 24,
                              "temperature": 0, "store": false});
        if compact {
            body["context_management"] = json!([{"type": "compaction", "compact_threshold": 300}]);
        }
        let answer = client()
            .post(stack.envoy.url("/v1/responses"))
            .json(&body)
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .expect("an answer");
        let status = answer.status().as_u16();
        let v: Value = answer.json().await.expect("JSON");
        if status != 200 {
            return Err((turn, v));
        }
        let output = v["output"].as_array().expect("output").clone();
        compactions += usize::from(output.first().is_some_and(|o| o["type"] == "compaction"));
        history.extend(output);
    }
    Ok(compactions)
}

#[tokio::test]
async fn a_long_conversation_completes_with_compaction_and_overflows_without() {
    if std::env::var("RESPONSES_E2E_LLAMA_COMPACTION").as_deref() != Ok("1") {
        eprintln!("opt-in: set RESPONSES_E2E_LLAMA_COMPACTION=1");
        return;
    }
    let llama = LlamaServer::start(512).await;
    let stack = Stack::with_websocket(llama.port(), &[]);
    let started = Instant::now();
    let compacted = converse(&stack, true).await;
    eprintln!("with compaction: {compacted:?} in {:?}", started.elapsed());
    let compactions = compacted.unwrap_or_else(|(turn, e)| panic!("turn {turn} failed: {e}"));
    assert!(compactions >= 2, "{compactions} compactions");
    let started = Instant::now();
    let plain = converse(&stack, false).await;
    eprintln!("without: {plain:?} in {:?}", started.elapsed());
    let Err((_, error)) = plain else {
        panic!("the conversation fit without compaction: make it longer")
    };
    assert_eq!(error["error"]["code"], "context_length_exceeded", "{error}");
}
