//! The upstream failure mapping (`responses_core::upstream_failure`) over every recorded
//! shape in `tests/fixtures/upstream_errors/`: each fixture is one server's answer (status,
//! headers, body, and the source it was taken from) and what the client must get for it.
//! Answers before a stream go through an exchange (the envelope and the headers it keeps);
//! error objects inside a Chat stream through the stream translator, whose `error` event and
//! `response.failed` must carry the mapping.
//! tests/e2e/upstream_errors.rs sends the same fixtures through the real Envoy.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use responses_core::exchange::{
    BodyStep, Exchange, Operation, Reply, RequestStep, ResponseHead, Settings,
};
use responses_core::translate::stream::StreamTranslator;
use responses_core::translate::{Meta, Options, ResponsePlan};
use responses_core::upstream_failure::{kept_headers, KeptHeader};
use serde_json::Value;

use common::recorded::{fixtures, Fixture};
use common::sse::parse_sse;

fn as_map(headers: Vec<KeptHeader>) -> BTreeMap<String, String> {
    headers.into_iter().map(|h| (h.name, h.value)).collect()
}

fn kept(f: &Fixture) -> BTreeMap<String, String> {
    as_map(kept_headers(
        f.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())),
    ))
}

const META: Meta = Meta {
    now: 1_700_000_000,
    id_seed: 7,
};

fn expected_headers(f: &Fixture) -> BTreeMap<String, String> {
    f.expect["headers"]
        .as_object()
        .map(|h| {
            h.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn every_server_and_shape_the_issue_names_is_recorded() {
    let all = fixtures();
    let names: Vec<&str> = all.iter().map(|f| f.name.as_str()).collect();
    for server in [
        "openai", "vllm", "sglang", "llamacpp", "tgi", "ollama", "lmstudio", "litellm",
    ] {
        assert!(
            names.contains(&format!("{server}-context-overflow").as_str()),
            "no context overflow of {server}: {names:?}"
        );
    }
    for f in &all {
        assert!(
            f.expect["code"].as_str().is_some_and(|c| !c.is_empty()),
            "{}",
            f.name
        );
    }
    assert!(all.iter().filter(|f| f.is_stream()).count() >= 4);
}

#[test]
fn answers_before_a_stream_map_to_their_envelope() {
    let settings = Arc::new(Settings::default());
    for (f, stream) in fixtures()
        .iter()
        .filter(|f| !f.is_stream())
        .flat_map(|f| [(f, false), (f, true)])
    {
        let e = &f.expect;
        let name = &f.name;
        let mut ex = Exchange::new(settings.clone(), Operation::Create);
        let request = serde_json::json!({"model": "m", "input": "hi", "stream": stream});
        let RequestStep::Forward(_) = ex.request_body(request.to_string().as_bytes(), true, META)
        else {
            panic!("{name}: not forwarded");
        };
        ex.upstream_headers(f.headers.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        let content_type = f.content_type();
        ex.response_head(
            ResponseHead {
                status: f.status,
                content_type: &content_type,
                end_of_stream: false,
            },
            1,
        );
        let BodyStep::Reply(Reply::Error(reply)) = ex.response_body(f.body.as_bytes(), true, 1)
        else {
            panic!("{name}: no envelope");
        };
        let body: Value = serde_json::from_slice(&reply.body).unwrap();
        let error = &body["error"];
        assert_eq!(u64::from(reply.status()), e["status"], "{name}: status");
        assert_eq!(error["type"], e["type"], "{name}: type");
        assert_eq!(error["code"], e["code"], "{name}: code");
        assert_eq!(error["param"], e["param"], "{name}: param");
        assert_eq!(error["message"], e["message"], "{name}: message");
        for count in ["n_prompt_tokens", "n_ctx"] {
            assert_eq!(error[count], e[count], "{name}: {count}");
        }
        assert_eq!(
            as_map(reply.headers),
            expected_headers(f),
            "{name}: headers kept"
        );
    }
}

#[test]
fn errors_inside_a_stream_end_it_with_the_same_codes() {
    for f in fixtures().iter().filter(|f| f.is_stream()) {
        let name = &f.name;
        let mut t = StreamTranslator::new(ResponsePlan::new("m", true, META, Options::default()));
        let mut out = t.push(f.body.as_bytes(), 1).to_vec();
        out.extend_from_slice(&t.finish(1));
        let events: Vec<Value> = parse_sse(&String::from_utf8(out).unwrap())
            .iter()
            .filter(|e| e.data != "[DONE]")
            .map(|e| serde_json::from_str(&e.data).unwrap())
            .collect();
        let error = events
            .iter()
            .find(|e| e["type"] == "error")
            .unwrap_or_else(|| panic!("{name}: no error event"));
        assert_eq!(
            error["error"]["code"], f.expect["code"],
            "{name}: error event"
        );
        assert_eq!(
            error["error"]["message"], f.expect["message"],
            "{name}: error event"
        );
        let last = events.last().unwrap();
        assert_eq!(last["type"], "response.failed", "{name}");
        assert_eq!(
            last["response"]["error"]["code"], f.expect["code"],
            "{name}: response.failed"
        );
        assert_eq!(
            last["response"]["error"]["message"], f.expect["message"],
            "{name}: response.failed"
        );
        assert!(kept(f).is_empty(), "{name}: a stream keeps no headers");
    }
}

/// The table of docs/limits-and-failures.md ("Every recorded upstream shape") has one row per
/// fixture, and says what the fixture expects: the client's status, type, code and the
/// headers kept.
#[test]
fn the_docs_table_says_what_each_fixture_expects() {
    let doc = std::fs::read_to_string(common::repo_root().join("docs/limits-and-failures.md"))
        .expect("read docs/limits-and-failures.md");
    let rows: BTreeMap<String, Vec<String>> = doc
        .lines()
        .filter(|l| l.starts_with("| ") && l.ends_with(".json` |"))
        .map(|l| {
            let cells: Vec<String> = l
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect();
            let file = cells.last().unwrap().trim_matches('`').to_owned();
            (file, cells)
        })
        .collect();
    let all = fixtures();
    let dash = |s: String| if s.is_empty() { "—".to_owned() } else { s };
    for f in &all {
        let row = rows
            .get(&format!("{}.json", f.name))
            .unwrap_or_else(|| panic!("no row for {} in the docs' table", f.name));
        let code = format!("`{}`", f.expect["code"].as_str().unwrap());
        let (gets, kind) = if f.is_stream() {
            (
                "200 stream → `error` + `response.failed`".to_owned(),
                "—".to_owned(),
            )
        } else {
            (
                f.expect["status"].to_string(),
                f.expect["type"].as_str().unwrap().to_owned(),
            )
        };
        let headers = dash(
            expected_headers(f)
                .into_keys()
                .collect::<Vec<_>>()
                .join(", "),
        );
        let mut kept: Vec<&str> = row[6].split(", ").collect();
        kept.sort_unstable();
        assert_eq!(
            (&row[3], &row[4], &row[5], kept.join(", ")),
            (&gets, &kind, &code, headers),
            "the docs' row for {}",
            f.name
        );
    }
    assert_eq!(rows.len(), all.len(), "rows for fixtures that do not exist");
}
