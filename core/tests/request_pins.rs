//! Two corpora of requests through the core alone, each output pinned in `core/tests/pins/`:
//!
//! - the request surface: every body of `tests/surface/cases.json` (each case and its body
//!   without the field, as `tests/e2e/surface.rs` sends them through Envoy), with the
//!   processor's default settings and its test key: the Chat request (or the refusal) and the
//!   response to a fixed answer;
//! - the fuzz corpus (`fuzz/corpus/request/`, arbitrary bytes): the Chat request or the
//!   refusal with the default options, in strict mode, and with a sealing key.
//!
//! The pins are hashes of the outputs (canonical JSON: keys sorted), so that thousands of
//! outputs take a few KB each instead of megabytes; a mismatch prints the case's output.
//! `UPDATE_SNAPSHOTS=1 cargo test -p responses-core --test main request_pins` writes the pins
//! the code gives (after a deliberate change, or new cases); the e2e suite still says whether
//! they are right.

use crate::common;

use std::collections::{BTreeMap, HashMap};

use common::json::strict;
use responses_core::openresponses::ApiError;
use responses_core::settings::ExchangeConfig;
use responses_core::translate::response::completion;
use responses_core::translate::seal::{nonce, Keyring, Purpose};
use responses_core::translate::{translate_request, Meta, Options};
use serde::Deserialize;
use serde_json::{json, Value};

/// `tests/e2e/surface.rs`'s sealing key.
const KEY_LINE: &str = "k1:BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";
const META: Meta = Meta {
    now: 1_700_000_000,
    id_seed: 0xfeed,
};

#[derive(Deserialize)]
struct CaseFile {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    request: Value,
    without: Value,
}

fn options() -> Options {
    let config = ExchangeConfig::default();
    let keyring = Keyring::parse(KEY_LINE).expect("the test key");
    config.translate_options(Some(std::sync::Arc::new(keyring)))
}

/// Keys sorted at every level: the same value always gives the same text.
fn canonical(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, Value> =
                m.iter().map(|(k, v)| (k, canonical(v))).collect();
            Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
        }
        Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
        other => other.clone(),
    }
}

/// FNV-1a, 64 bits: a stable pin of a text (not a defence against anything).
fn fnv(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn refusal(e: &ApiError) -> Value {
    json!({"status": e.status, "body": strict(std::str::from_utf8(&e.to_body()).unwrap())})
}

/// What the core gives for a body: its Chat request and the response to a short answer, or
/// its refusal.
fn outputs(body: &str, options: &Options) -> Value {
    let answer = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "demo-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi."},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    });
    match translate_request(body.as_bytes(), options, META) {
        Ok(t) => {
            let chat = strict(std::str::from_utf8(&t.body).unwrap());
            let response = match completion(&t.plan, answer.to_string().as_bytes(), META.now) {
                Ok(bytes) => strict(std::str::from_utf8(&bytes).unwrap()),
                Err(e) => json!({"response_error": refusal(&e)}),
            };
            json!({"chat": chat, "response": response})
        }
        Err(e) => json!({"error": refusal(&e)}),
    }
}

/// Checks each output against its pin in `core/tests/pins/<name>.json` (keyed by a hash of the
/// case's input), or writes the pins with `UPDATE_SNAPSHOTS=1`.
fn check_pins(name: &str, cases: &BTreeMap<String, (String, Value)>) {
    let got: BTreeMap<&String, String> = cases
        .iter()
        .map(|(id, (_, out))| (id, fnv(&canonical(out).to_string())))
        .collect();
    let path = common::repo_root().join(format!("core/tests/pins/{name}.json"));
    let update = common::snapshot::updating();
    if update {
        let text = serde_json::to_string_pretty(&got).unwrap() + "\n";
        std::fs::write(&path, text).expect("write the pins");
        return;
    }
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name} pins: {e}"));
    let pins: BTreeMap<String, String> = serde_json::from_str(&text).expect("pins");
    let mut failures = Vec::new();
    for (id, hash) in &got {
        let (input, out) = &cases[*id];
        match pins.get(*id) {
            Some(pinned) if pinned == hash => {}
            Some(_) => failures.push(format!(
                "{input}\n  now gives {}",
                serde_json::to_string(out).unwrap()
            )),
            None => failures.push(format!("{input} has no pin")),
        }
    }
    let stale = pins.keys().filter(|k| !got.contains_key(k)).count();
    assert!(
        failures.is_empty() && stale == 0,
        "{} of {} {name} cases translate differently from their pins ({stale} pins for no case; \
         UPDATE_SNAPSHOTS=1 cargo test -p responses-core --test main request_pins writes the code's):\n{}",
        failures.len(),
        got.len(),
        failures
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn every_surface_body_gets_its_pinned_translation() {
    let root = common::repo_root();
    let text = std::fs::read_to_string(root.join("tests/surface/cases.json")).expect("cases");
    let file: CaseFile = serde_json::from_str(&text).expect("cases.json");
    let keyring = Keyring::parse(KEY_LINE).expect("the test key");
    let sealed: HashMap<&str, String> = HashMap::from([
        (
            "$SEALED_REASONING",
            keyring.seal_for(Purpose::Reasoning, "I should greet.", nonce(1, 1)),
        ),
        (
            "$SEALED_COMPACTION",
            keyring.seal_for(Purpose::Compaction, "The user said hi.", nonce(1, 2)),
        ),
    ]);
    let options = options();
    let mut cases = BTreeMap::new();
    for case in &file.cases {
        for v in [&case.request, &case.without] {
            let mut v = v.clone();
            common::json::substitute(&mut v, &sealed);
            let body = v.to_string();
            let out = outputs(&body, &options);
            cases.insert(fnv(&body), (body, out));
        }
    }
    check_pins("surface", &cases);
}

/// The fuzz corpus's requests (any bytes): the Chat request or the refusal, with the default
/// options, in strict mode and with a sealing key.
#[test]
fn every_fuzz_corpus_request_gets_its_pinned_translation() {
    let dir = common::repo_root().join("fuzz/corpus/request");
    let keyring = std::sync::Arc::new(Keyring::parse(KEY_LINE).expect("the test key"));
    let settings = [
        ("default", Options::default()),
        (
            "strict",
            Options {
                strict: true,
                ..Options::default()
            },
        ),
        (
            "keys",
            Options {
                keyring: Some(keyring),
                ..Options::default()
            },
        ),
    ];
    let mut cases = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).expect("the corpus") {
        let path = entry.expect("entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let body = std::fs::read(&path).expect("read");
        for (label, options) in &settings {
            let out = match translate_request(&body, options, META) {
                Ok(t) => json!({"chat": strict(std::str::from_utf8(&t.body).unwrap())}),
                Err(e) => json!({"error": refusal(&e)}),
            };
            cases.insert(
                format!("{name} {label}"),
                (format!("{name} ({label})"), out),
            );
        }
    }
    check_pins("fuzz_request_corpus", &cases);
}
