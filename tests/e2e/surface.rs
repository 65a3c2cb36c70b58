//! The request surface, field path by field path, through the real Envoy (the processor or the
//! module: `tests/common/stack.rs`) + demo upstream: every case of tests/surface/cases.json (generated from the installed
//! openai-python's and openai-node's request types and the OpenResponses schema by
//! tests/surface/generate.py) gets the answer the path table of `docs/request-mapping.md`
//! ("Request fields, path by path") states:
//!
//! * `mapped`: 200, and the upstream request differs from the one without the field;
//! * `echoed`: 200, the upstream request is the one without the field, and the response
//!   carries the value (top-level fields: the same value);
//! * `accepted`: 200, the upstream request is the one without the field;
//! * `rejected CODE`: 400 with that code, naming the field or its item; the upstream is not
//!   called;
//! * `null` (the table's null column): `absent` = the same answer as without the field
//!   (status, code and upstream request), or `400 CODE`.
//!
//! The table is checked both ways against the generated paths, and cases.json against what
//! the generator makes from the installed SDKs. Every response and event is read with the
//! duplicate-key-refusing reader (core/tests/common/json.rs).

use crate::common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::json::parse_strict;
use common::{client, repo_root, RecordingDemo, TempDir};
use futures_util::StreamExt;
use responses_core::translate::is_client_bookkeeping;
use responses_core::translate::seal::{nonce, Keyring, Purpose};
use serde::Deserialize;
use serde_json::Value;

/// The processor's sealing key in these tests (`k1`, 32 bytes of 7).
const KEY_LINE: &str = "k1:BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=";
/// Requests in flight at once (one Envoy worker; keeps both cores busy).
const CONCURRENCY: usize = 8;
const CASE_HEADER: &str = "x-surface-case";

#[derive(Debug, Deserialize)]
struct CaseFile {
    paths: BTreeMap<String, Vec<String>>,
    cases: Vec<Case>,
}

#[derive(Debug, Clone, Deserialize)]
struct Case {
    path: String,
    value: Value,
    param: String,
    request: Value,
    without: Value,
    sources: Vec<String>,
}

fn case_file() -> CaseFile {
    let text = std::fs::read_to_string(repo_root().join("tests/surface/cases.json"))
        .expect("tests/surface/cases.json (run .venv/bin/python tests/surface/generate.py)");
    serde_json::from_str(&text).expect("cases.json")
}

// ---- the documented path table ----

/// The page that holds the path table.
const PAGE: &str = "docs/request-mapping.md";

#[derive(Debug, Clone, PartialEq)]
enum Handling {
    Mapped,
    Echoed,
    Accepted,
    Rejected(String),
}

#[derive(Debug, Clone, PartialEq)]
enum NullAnswer {
    Absent,
    Rejected(String),
    /// The field is required in every source: no null case.
    NotOptional,
}

#[derive(Debug, Clone)]
struct Row {
    pattern: String,
    regex: Regex,
    /// The values this row is for (empty: any value).
    values: Vec<Value>,
    handling: Handling,
    null: NullAnswer,
    line: String,
}

/// A glob over field paths: `*` one name, `**` anything, `{a,b}` alternatives (which may hold
/// globs); kept as the globs its braces expand to.
#[derive(Debug, Clone)]
struct Regex(Vec<Vec<Token>>);

#[derive(Debug, Clone)]
enum Token {
    Lit(String),
    One,
    Any,
}

/// `a{b,c}d{e,f}` → `abde`, `abdf`, `acde`, `acdf`.
fn expand_braces(glob: &str) -> Vec<String> {
    let Some(open) = glob.find('{') else {
        return vec![glob.to_owned()];
    };
    let close = open + glob[open..].find('}').expect("a closing brace");
    let rest = expand_braces(&glob[close + 1..]);
    glob[open + 1..close]
        .split(',')
        .flat_map(|alt| {
            rest.iter()
                .map(move |r| format!("{}{alt}{r}", &glob[..open]))
        })
        .collect()
}

impl Regex {
    fn new(glob: &str) -> Regex {
        Regex(
            expand_braces(glob)
                .iter()
                .map(|g| Regex::tokens(g))
                .collect(),
        )
    }

    fn tokens(glob: &str) -> Vec<Token> {
        let mut out = Vec::new();
        let mut lit = String::new();
        let mut chars = glob.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '*' {
                lit.push(c);
                continue;
            }
            if !lit.is_empty() {
                out.push(Token::Lit(std::mem::take(&mut lit)));
            }
            if chars.peek() == Some(&'*') {
                chars.next();
                out.push(Token::Any);
            } else {
                out.push(Token::One);
            }
        }
        if !lit.is_empty() {
            out.push(Token::Lit(lit));
        }
        out
    }

    fn matches(&self, s: &str) -> bool {
        fn go(tokens: &[Token], s: &str) -> bool {
            let Some((first, rest)) = tokens.split_first() else {
                return s.is_empty();
            };
            match first {
                Token::Lit(l) => s.strip_prefix(l.as_str()).is_some_and(|t| go(rest, t)),
                Token::One => {
                    let end = s.find(['.', '[', ']']).unwrap_or(s.len());
                    (1..=end).any(|i| go(rest, &s[i..]))
                }
                Token::Any => (0..=s.len()).any(|i| s.is_char_boundary(i) && go(rest, &s[i..])),
            }
        }
        self.0.iter().any(|g| go(g, s))
    }
}

fn code_spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .enumerate()
        .filter(|(i, _)| i % 2 == 1)
        .map(|(_, s)| s.to_owned())
        .collect()
}

fn table() -> Vec<Row> {
    let page = std::fs::read_to_string(repo_root().join(PAGE)).expect(PAGE);
    let section = page
        .split("\n## Request fields, path by path\n")
        .nth(1)
        .expect("a '## Request fields, path by path' section in docs/request-mapping.md");
    section
        .lines()
        .skip_while(|l| !l.starts_with("| path |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 5, "a row of 5 cells: {line}");
            let pattern = code_spans(cells[0]).concat();
            let values = code_spans(cells[1])
                .iter()
                .map(|v| {
                    serde_json::from_str(v).unwrap_or_else(|e| panic!("value {v} of {line}: {e}"))
                })
                .collect();
            let handling = match cells[2].split_whitespace().next() {
                Some("mapped") => Handling::Mapped,
                Some("echoed") => Handling::Echoed,
                Some("accepted") => Handling::Accepted,
                Some("rejected") => Handling::Rejected(
                    code_spans(cells[2])
                        .first()
                        .cloned()
                        .unwrap_or_else(|| panic!("rejected needs its `code`: {line}")),
                ),
                _ => panic!("handling of {line}"),
            };
            let null = if cells[3] == "absent" {
                NullAnswer::Absent
            } else if cells[3] == "—" || cells[3].is_empty() {
                NullAnswer::NotOptional
            } else if cells[3].starts_with("400") {
                NullAnswer::Rejected(
                    code_spans(cells[3])
                        .first()
                        .cloned()
                        .unwrap_or_else(|| panic!("400 needs its `code`: {line}")),
                )
            } else {
                panic!("null cell of {line}")
            };
            Row {
                regex: Regex::new(&pattern),
                pattern,
                values,
                handling,
                null,
                line: line.to_owned(),
            }
        })
        .collect()
}

/// The rows for a path (and value, unless null).
/// A row naming the value wins over rows for any value. (A null case goes by the path alone:
/// rows of one pattern that differ by value say the same about null, and count once.)
fn rows_for<'a>(rows: &'a [Row], path: &str, value: &Value) -> Vec<&'a Row> {
    let mut out: Vec<&Row> = rows
        .iter()
        .filter(|r| r.regex.matches(path))
        .filter(|r| value.is_null() || r.values.is_empty() || r.values.contains(value))
        .collect();
    // A row naming the value wins over rows for any value.
    if out.iter().any(|r| r.values.contains(value)) {
        out.retain(|r| r.values.contains(value));
    }
    if value.is_null() {
        out.dedup_by(|a, b| a.pattern == b.pattern && a.null == b.null);
    }
    out
}

// ---- sending ----

/// What one request got.
#[derive(Debug, Clone)]
struct Outcome {
    status: u16,
    code: Option<String>,
    param: Option<String>,
    /// The Chat request the upstream received for it (none: not called).
    upstream: Option<Value>,
    /// The response object (JSON, or the terminal event's), read strictly.
    response: Option<Value>,
    /// A body or event that is not strict JSON (a duplicate key...).
    problem: Option<String>,
}

/// The translating Envoy (either mode), the recording demo and the sealing key.
struct Stack {
    stack: common::Stack,
    demo: RecordingDemo,
    _keys: TempDir,
}

fn stack() -> Stack {
    let keys = TempDir::new("surface-keys");
    let key_file = keys.path().join("keys");
    std::fs::write(&key_file, format!("{KEY_LINE}\n")).unwrap();
    let demo = RecordingDemo::start();
    let stack = common::Stack::start(
        demo.port(),
        &["--reasoning-keys-file", key_file.to_str().unwrap()],
    );
    Stack {
        stack,
        demo,
        _keys: keys,
    }
}

/// Sends each body (header `x-surface-case: i`) and gathers the outcomes.
async fn send_all(stack: &Stack, bodies: &[String]) -> Vec<Outcome> {
    let http = Arc::new(client());
    let url = stack.stack.envoy.url("/v1/responses");
    let answers: Vec<(usize, u16, String)> = futures_util::stream::iter(bodies.iter().enumerate())
        .map(|(i, body)| {
            let http = http.clone();
            let url = url.clone();
            let body = body.clone();
            async move {
                let response = http
                    .post(&url)
                    .header("content-type", "application/json")
                    .header(CASE_HEADER, i.to_string())
                    .body(body)
                    .timeout(Duration::from_secs(60))
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("request {i}: {e}"));
                let status = response.status().as_u16();
                let text = response.text().await.unwrap_or_default();
                (i, status, text)
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let mut upstream: HashMap<usize, Value> = HashMap::new();
    for r in stack.demo.requests() {
        if let Some(i) = r.header(CASE_HEADER).and_then(|h| h.parse().ok()) {
            upstream.insert(i, r.json());
        }
    }
    let mut out = vec![None; bodies.len()];
    for (i, status, text) in answers {
        let mut o = Outcome {
            status,
            code: None,
            param: None,
            upstream: upstream.remove(&i),
            response: None,
            problem: None,
        };
        if text.starts_with("event:") || text.starts_with("data:") {
            for e in common::sse::parse_sse(&text) {
                if e.data == "[DONE]" {
                    continue;
                }
                match parse_strict(&e.data) {
                    Ok(v) => {
                        if let Some(r) = v.get("response") {
                            o.response = Some(r.clone());
                        }
                        if let Some(err) = v.get("error").or_else(|| v.pointer("/response/error")) {
                            o.code = err["code"].as_str().map(str::to_owned);
                        }
                    }
                    Err(e) => o.problem = Some(format!("event: {e}")),
                }
            }
        } else {
            match parse_strict(&text) {
                Ok(v) => {
                    o.code = v
                        .pointer("/error/code")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                    o.param = v
                        .pointer("/error/param")
                        .and_then(Value::as_str)
                        .map(str::to_owned);
                    if status == 200 {
                        o.response = Some(v);
                    }
                }
                Err(e) => o.problem = Some(format!("body: {e}: {}", &text[..text.len().min(300)])),
            }
        }
        out[i] = Some(o);
    }
    out.into_iter()
        .map(|o| o.expect("every request answered"))
        .collect()
}

/// The field's value in the response, for paths of plain objects (`reasoning.summary`).
fn echoed_value<'a>(response: &'a Value, path: &str) -> Option<&'a Value> {
    if path.contains('[') {
        return None;
    }
    path.split('.').try_fold(response, |v, k| v.get(k))
}

/// Whether a 400's `param` names the field or the item (or top-level field) it is in.
fn names_field(param: Option<&str>, field: &str) -> bool {
    let Some(param) = param else {
        return false;
    };
    let under =
        |a: &str, b: &str| a == b || a.strip_prefix(b).is_some_and(|t| t.starts_with(['.', '[']));
    let item = match (field.find(']'), field.find('.')) {
        (Some(i), Some(d)) if i < d => &field[..=i],
        (Some(i), None) => &field[..=i],
        (_, Some(d)) => &field[..d],
        _ => field,
    };
    under(param, field) || under(field, param) || under(param, item)
}

/// Checks one case against its row; `None` when it holds.
fn check(case: &Case, got: &Outcome, without: &Outcome, rows: &[Row]) -> Option<String> {
    if let Some(p) = &got.problem {
        return Some(format!("not strict JSON: {p}"));
    }
    let rows = rows_for(rows, &case.path, &case.value);
    let row = match rows.as_slice() {
        [row] => *row,
        [] => return Some("no documented row".into()),
        many => {
            return Some(format!(
                "{} documented rows: {}",
                many.len(),
                many.iter()
                    .map(|r| r.pattern.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        }
    };
    let said = |want: &str| {
        format!(
            "the docs say {want}; got {} {} param {} (upstream {})",
            got.status,
            got.code.as_deref().unwrap_or("-"),
            got.param.as_deref().unwrap_or("-"),
            if got.upstream.is_none() {
                "not called"
            } else if got.upstream == without.upstream {
                "as without the field"
            } else {
                "changed"
            }
        )
    };
    if case.value.is_null() {
        return match &row.null {
            NullAnswer::NotOptional => {
                Some(format!("docs row `{}` says no null case", row.pattern))
            }
            NullAnswer::Absent => (got.status != without.status
                || got.code != without.code
                || got.upstream != without.upstream)
                .then(|| {
                    said(&format!(
                        "null = absent ({} {} without it)",
                        without.status,
                        without.code.as_deref().unwrap_or("-")
                    ))
                }),
            NullAnswer::Rejected(code) => {
                (got.status != 400 || got.code.as_deref() != Some(code) || got.upstream.is_some())
                    .then(|| said(&format!("null → 400 {code}")))
            }
        };
    }
    match &row.handling {
        Handling::Rejected(code) => (got.status != 400
            || got.code.as_deref() != Some(code)
            || got.upstream.is_some()
            || !names_field(got.param.as_deref(), &case.param))
        .then(|| said(&format!("400 {code} naming {}", case.param))),
        Handling::Mapped => {
            (got.status != 200 || got.upstream.is_none() || got.upstream == without.upstream)
                .then(|| said("mapped"))
        }
        Handling::Accepted => (got.status != 200 || got.upstream != without.upstream)
            .then(|| said("accepted (upstream as without the field)")),
        Handling::Echoed => {
            if got.status != 200 || got.upstream != without.upstream {
                return Some(said("echoed (upstream as without the field)"));
            }
            let echoed = got
                .response
                .as_ref()
                .and_then(|r| echoed_value(r, &case.path));
            (!case.path.contains(['.', '[']) && echoed != Some(&case.value))
                .then(|| format!("the docs say echoed; the response has {echoed:?}"))
        }
    }
}

fn python() -> PathBuf {
    let python = repo_root().join(".venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: run bash deploy/install-clients.sh",
        python.display()
    );
    python
}

/// cases.json is what the generator makes from the installed SDKs and the schema.
#[test]
fn the_case_list_is_what_the_installed_sdks_generate() {
    let out = Command::new(python())
        .arg(repo_root().join("tests/surface/generate.py"))
        .arg("--check")
        .output()
        .expect("run tests/surface/generate.py --check");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every generated path has exactly one row for each of its values, and every row matches a
/// path.
#[test]
fn the_documented_path_table_covers_exactly_the_generated_paths() {
    let file = case_file();
    let rows = table();
    let mut problems = Vec::new();
    let mut used = BTreeSet::new();
    for case in &file.cases {
        let matched = rows_for(&rows, &case.path, &case.value);
        for r in &matched {
            used.insert(r.line.clone());
        }
        if matched.len() != 1 {
            problems.push(format!(
                "{} = {}: {} rows{}",
                case.path,
                case.value,
                matched.len(),
                matched
                    .iter()
                    .map(|r| format!(" `{}`", r.pattern))
                    .collect::<String>()
            ));
        }
    }
    for r in &rows {
        if !used.contains(&r.line) {
            problems.push(format!("docs row matches no generated case: {}", r.line));
        }
    }
    // Rows saying a path has no null case, while a source makes one.
    for case in file.cases.iter().filter(|c| c.value.is_null()) {
        for r in rows_for(&rows, &case.path, &case.value) {
            if r.null == NullAnswer::NotOptional {
                problems.push(format!(
                    "{}: null is generated but the row says —",
                    case.path
                ));
            }
        }
    }
    problems.sort();
    problems.dedup();
    assert!(
        problems.is_empty(),
        "{} problem(s) between the path table of {PAGE} and tests/surface/cases.json ({} paths):\n{}",
        problems.len(),
        file.paths.len(),
        problems.join("\n")
    );
}

/// No field the SDKs or the schema type anywhere in an input item is named like a client's
/// own bookkeeping (`responses_core::translate::is_client_bookkeeping`, docs/request-mapping.md):
/// the names accepted and left out never hide one of the API's own fields. Codex's bookkeeping
/// (source `codex`) is named so.
#[test]
fn no_typed_field_of_an_item_is_named_like_a_clients_bookkeeping() {
    let file = case_file();
    let last_key = |path: &str| {
        path.rsplit('.')
            .next()
            .unwrap_or_default()
            .trim_end_matches("[]")
            .to_owned()
    };
    let (codex, typed): (Vec<_>, Vec<_>) = file
        .paths
        .iter()
        .filter(|(path, _)| path.starts_with("input[]"))
        .partition(|(_, sources)| sources.iter().all(|s| s == "codex"));
    let clashes: Vec<&String> = typed
        .iter()
        .filter(|(path, _)| is_client_bookkeeping(&last_key(path)))
        .map(|(path, _)| *path)
        .collect();
    assert!(
        clashes.is_empty(),
        "typed fields named like a client's bookkeeping: {clashes:?}"
    );
    assert!(
        !codex.is_empty(),
        "no Codex bookkeeping paths in cases.json"
    );
    for (path, _) in codex {
        assert!(is_client_bookkeeping(&last_key(path)), "{path}");
    }
}

/// Every case through the translating Envoy (either mode) + the demo: the answer the docs'
/// row states.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_case_gets_the_answer_of_its_documented_row() {
    let file = case_file();
    let rows = table();
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
    // Each distinct body once: cases and the bodies without their field.
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut bodies: Vec<String> = Vec::new();
    let mut id = |v: &Value| -> usize {
        let mut v = v.clone();
        common::json::substitute(&mut v, &sealed);
        let text = v.to_string();
        let next = bodies.len();
        *index.entry(text.clone()).or_insert_with(|| {
            bodies.push(text);
            next
        })
    };
    let pairs: Vec<(usize, usize)> = file
        .cases
        .iter()
        .map(|c| (id(&c.request), id(&c.without)))
        .collect();
    let stack = stack();
    let started = Instant::now();
    let outcomes = send_all(&stack, &bodies).await;
    let elapsed = started.elapsed();

    let mut failures: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (case, (got, without)) in file.cases.iter().zip(&pairs) {
        if let Some(problem) = check(case, &outcomes[*got], &outcomes[*without], &rows) {
            failures.entry(case.path.clone()).or_default().push(format!(
                "  {} = {} [{}]: {problem}",
                case.param,
                case.value,
                case.sources.join(",")
            ));
        }
    }
    let failed: usize = failures.values().map(Vec::len).sum();
    println!(
        "surface: {} cases ({} paths), {} requests in {elapsed:.1?}; {failed} cases on {} paths differ from the docs",
        file.cases.len(),
        file.paths.len(),
        bodies.len(),
        failures.len()
    );
    if let Ok(dir) = std::env::var("SURFACE_REPORT") {
        let report: Vec<Value> = file
            .cases
            .iter()
            .zip(&pairs)
            .map(|(c, (g, w))| {
                let (g, w) = (&outcomes[*g], &outcomes[*w]);
                serde_json::json!({"path": c.path, "value": c.value, "param": c.param,
                    "status": g.status, "code": g.code, "error_param": g.param,
                    "upstream": if g.upstream.is_none() { "none" } else if g.upstream == w.upstream { "same" } else { "changed" },
                    "without_status": w.status, "without_code": w.code, "problem": g.problem})
            })
            .collect();
        std::fs::write(dir, serde_json::to_string(&report).unwrap()).unwrap();
    }
    assert!(
        failures.is_empty(),
        "{failed} of {} cases ({} of {} paths) do not get the documented answer:\n{}",
        file.cases.len(),
        failures.len(),
        file.paths.len(),
        failures
            .iter()
            .map(|(p, f)| format!("{p}\n{}", f.join("\n")))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
