//! The "Request fields" table of `docs/request-mapping.md` is checked here, so it cannot
//! drift: it must list exactly the fields of the official `CreateResponseBody`, and each
//! row's example must do what the row says when it goes through the real translator.

use std::collections::BTreeSet;
use std::sync::Arc;

use responses_core::translate::response::completion;
use responses_core::translate::seal::Keyring;
use responses_core::translate::{translate_request, Meta, Options};
use serde_json::{json, Value};

struct Row {
    field: String,
    handling: String,
    upstream: Option<String>,
    example: Value,
}

fn rows() -> Vec<Row> {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/request-mapping.md"
    ))
    .expect("docs/request-mapping.md");
    let section = page
        .split("\n## Request fields\n")
        .nth(1)
        .expect("a '## Request fields' section in docs/request-mapping.md");
    let code = |cell: &str| cell.trim().trim_matches('`').to_owned();
    section
        .lines()
        .skip_while(|l| !l.starts_with("| field |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
            assert_eq!(cells.len(), 4, "row with 4 cells: {line}");
            let upstream = code(cells[2]);
            Row {
                field: code(cells[0]),
                handling: cells[1].trim().to_owned(),
                upstream: (!upstream.is_empty()).then_some(upstream),
                example: serde_json::from_str(&code(cells[3]))
                    .unwrap_or_else(|e| panic!("example of {line} is JSON: {e}")),
            }
        })
        .collect()
}

fn schema_fields() -> BTreeSet<String> {
    let doc: Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/openresponses/openapi.json"
        ))
        .expect("the OpenAPI fixture"),
    )
    .expect("JSON");
    doc["components"]["schemas"]["CreateResponseBody"]["properties"]
        .as_object()
        .expect("CreateResponseBody properties")
        .keys()
        .cloned()
        .collect()
}

fn options() -> Options {
    Options {
        keyring: Some(Arc::new(Keyring::single("k", [1; 32]).unwrap())),
        ..Options::default()
    }
}

/// A request with `field` set to `example`; a tool is always offered so tool fields apply.
fn probe(field: &str, example: &Value) -> Value {
    let mut req =
        json!({"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}]});
    req[field] = example.clone();
    req
}

#[test]
fn the_table_lists_exactly_the_schema_fields() {
    let listed: BTreeSet<String> = rows().into_iter().map(|r| r.field).collect();
    assert_eq!(listed, schema_fields());
}

#[test]
fn every_row_does_what_it_says() {
    let base = {
        let t = translate_request(
            probe("stream", &json!(false)).to_string().as_bytes(),
            &options(),
            Meta { now: 1, id_seed: 1 },
        )
        .unwrap();
        serde_json::from_slice::<Value>(&t.body).unwrap()
    };
    for row in rows() {
        let req = probe(&row.field, &row.example);
        let result = translate_request(
            req.to_string().as_bytes(),
            &options(),
            Meta { now: 1, id_seed: 1 },
        );
        let what = format!(
            "docs row `{}` ({}) with example {}",
            row.field, row.handling, row.example
        );
        if row.handling == "rejected" {
            let e = result
                .err()
                .unwrap_or_else(|| panic!("{what}: expected a 400"));
            assert_eq!(e.status, 400, "{what}");
            assert_eq!(e.param.as_deref(), Some(row.field.as_str()), "{what}");
            continue;
        }
        let t = result.unwrap_or_else(|e| panic!("{what}: {e}"));
        let chat: Value = serde_json::from_slice(&t.body).unwrap();
        match row.handling.as_str() {
            "mapped" => {
                let key = row
                    .upstream
                    .as_deref()
                    .unwrap_or_else(|| panic!("{what}: names its upstream field"));
                assert!(chat.get(key).is_some(), "{what}: upstream request {chat}");
                if row.field != "model" && row.field != "input" {
                    assert_ne!(
                        chat.get(key),
                        base.get(key),
                        "{what}: the field changes `{key}` upstream"
                    );
                }
                if row.field != key {
                    assert!(
                        chat.get(&row.field).is_none(),
                        "{what}: not forwarded as is: {chat}"
                    );
                }
            }
            "echoed" | "accepted" => {
                assert!(
                    chat.get(&row.field).is_none(),
                    "{what}: not sent upstream: {chat}"
                );
                let answer = json!({"choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "ok"}}]});
                let resource: Value = serde_json::from_slice(
                    &completion(&t.plan, answer.to_string().as_bytes(), 2).unwrap(),
                )
                .unwrap();
                if row.handling == "echoed" {
                    assert_eq!(
                        resource[&row.field], row.example,
                        "{what}: echoed in the response"
                    );
                } else {
                    assert!(resource.get(&row.field).is_none(), "{what}");
                }
            }
            other => panic!("{what}: unknown handling '{other}'"),
        }
    }
}
