//! Snapshot tests of the translation. Each file under `core/tests/snapshots/` is one exchange:
//! its inputs (the settings, the client's request, optionally the upstream's answer) and the
//! outputs the core gives for them (the Chat request or the error envelope; the response, or
//! the stream's events). Outputs are compared as JSON values, key order aside, and the core
//! gets a fixed clock and id seed, so they are deterministic.
//!
//! `UPDATE_SNAPSHOTS=1 cargo test -p responses-core --test main snapshots::` writes the outputs
//! the code gives into every file (and completes new files that hold only inputs); review them
//! with `git diff core/tests/snapshots`. `docs/testing.md` describes the keys of a file.
//!
//! Besides the values, every case is checked for what holds of any exchange: the translation
//! is the same twice, a response is valid against the OpenResponses schema, and an event
//! stream obeys the stream rules (`common::stream_rules`) and is the same when the upstream's
//! body arrives one byte at a time.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use common::stream_rules;
use responses_core::call::AnswerHead;
use responses_core::connection::{Connection, Limits};
use responses_core::openresponses::ApiError;
use responses_core::settings::ExchangeConfig;
use responses_core::translate::request::Translated;
use responses_core::translate::response::completion;
use responses_core::translate::seal::Keyring;
use responses_core::translate::stream::StreamTranslator;
use responses_core::translate::{
    compact, translate_request, Meta, Options, ReasoningEvents, ResponsePlan,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `Meta.now`: the responses' `created_at`.
const NOW: u64 = 1_700_000_000;
/// `Meta.id_seed`: the ids (`resp_…`, `msg_…`) and the sealing nonces.
const SEED: u128 = 0xfeed;
/// The clock when the answer arrives: the responses' `completed_at`.
const ANSWERED_AT: u64 = NOW + 1;

const META: Meta = Meta {
    now: NOW,
    id_seed: SEED,
};

/// The inputs of a case.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Inputs {
    /// What the case is, for the reader.
    #[allow(dead_code)]
    about: Option<String>,
    /// The operator's settings, as the module's JSON config names them (`{}`: the defaults).
    #[serde(default)]
    settings: ExchangeConfig,
    #[serde(default)]
    endpoint: Endpoint,
    /// The request's head as a client sent it (a file: its request line, then one
    /// `name: value` line per header), read as the adapters read the client's headers: for
    /// the reasoning event names it parses.
    headers_file: Option<String>,
    /// `websocket`: the connection's text messages, in order (files, a path each).
    messages_files: Option<Vec<String>>,
    /// The request body, exactly one of: JSON (sent compact), text, bytes, or a file's bytes
    /// (a path from the repository root).
    request: Option<Value>,
    request_text: Option<String>,
    request_bytes: Option<Vec<u8>>,
    request_file: Option<String>,
    /// The upstream's answer to the translated request, at most one of: a Chat completion
    /// (JSON), or an SSE body as text or as a file (a path from the repository root).
    answer: Option<Value>,
    answer_sse: Option<String>,
    answer_sse_file: Option<String>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Endpoint {
    /// `POST /v1/responses`.
    #[default]
    Responses,
    /// `POST /v1/responses/compact`.
    Compact,
    /// One WebSocket connection (`messages_files`): each `response.create` in order, a
    /// continuation naming the response before it (its id in this run, as a client names the
    /// id it received), every message that goes upstream answered with `answer_sse` /
    /// `answer_sse_file`.
    Websocket,
}

/// The outputs of a case (the expected ones in the file, or what the code gives).
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Outputs {
    /// The Chat request sent upstream.
    #[serde(skip_serializing_if = "Option::is_none")]
    chat: Option<Value>,
    /// The request refused: `{"status", "body"}`, the body the client gets.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Value>,
    /// The client's response to `answer`.
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<Value>,
    /// `answer` refused: `{"status", "body"}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    response_error: Option<Value>,
    /// The events the client gets for `answer_sse`, in order (the `data` of each; `[DONE]`
    /// follows them).
    #[serde(skip_serializing_if = "Option::is_none")]
    events: Option<Vec<Value>>,
    /// `websocket`: for each message, the Chat request it became (`chat`), or the types of
    /// the events it got at once (`answered`: nothing went upstream), or its `error` event;
    /// with the types of the events the answer became (`events`).
    #[serde(skip_serializing_if = "Option::is_none")]
    messages: Option<Vec<Value>>,
}

const INPUT_KEYS: [&str; 12] = [
    "about",
    "settings",
    "endpoint",
    "headers_file",
    "messages_files",
    "request",
    "request_text",
    "request_bytes",
    "request_file",
    "answer",
    "answer_sse",
    "answer_sse_file",
];

fn root() -> PathBuf {
    common::repo_root()
}

fn read_file(path: &str) -> Vec<u8> {
    std::fs::read(root().join(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

impl Inputs {
    fn body(&self) -> Vec<u8> {
        match (
            &self.request,
            &self.request_text,
            &self.request_bytes,
            &self.request_file,
        ) {
            (Some(json), None, None, None) => json.to_string().into_bytes(),
            (None, Some(text), None, None) => text.clone().into_bytes(),
            (None, None, Some(bytes), None) => bytes.clone(),
            (None, None, None, Some(path)) => read_file(path),
            _ => panic!("want exactly one of request, request_text, request_bytes, request_file"),
        }
    }

    fn sse(&self) -> Option<Vec<u8>> {
        match (&self.answer_sse, &self.answer_sse_file) {
            (None, None) => None,
            (Some(text), None) => Some(text.clone().into_bytes()),
            (None, Some(path)) => Some(read_file(path)),
            _ => panic!("want at most one of answer_sse, answer_sse_file"),
        }
    }

    /// The translation's options from the settings, as the adapters derive them.
    fn options(&self) -> Options {
        let settings = &self.settings;
        settings.validate().expect("valid settings");
        // No keys configured: none at all (the library's case), not the binary's random one.
        let keyring = self.keyring();
        let mut options = settings.translate_options(keyring);
        // Resolved per exchange from the client's headers (none: what a client without an
        // SDK identity gets).
        options.reasoning_events = self.reasoning_events();
        options
    }

    fn keyring(&self) -> Option<Arc<Keyring>> {
        let settings = &self.settings;
        (settings.reasoning_keys.is_some() || settings.reasoning_keys_file.is_some()).then(|| {
            let (ring, _) = settings
                .keyring(
                    |path| std::fs::read_to_string(root().join(path)),
                    || unreachable!("keys are configured"),
                )
                .expect("valid keys");
            ring
        })
    }

    /// The headers of `headers_file`, names lowercased.
    fn headers(&self) -> Vec<(String, String)> {
        let Some(path) = &self.headers_file else {
            return Vec::new();
        };
        let text = String::from_utf8(read_file(path)).expect("a UTF-8 head");
        text.lines()
            .skip(1)
            .filter_map(|line| line.split_once(": "))
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_owned()))
            .collect()
    }

    fn reasoning_events(&self) -> ReasoningEvents {
        let headers = self.headers();
        responses_core::client::reasoning_events(self.settings.reasoning_events, |name| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        })
    }
}

fn strict(bytes: &[u8]) -> Value {
    common::json::strict(std::str::from_utf8(bytes).expect("UTF-8 output"))
}

/// What the client gets for an error: its status and the envelope.
fn refusal(e: &ApiError) -> Value {
    serde_json::json!({"status": e.status, "body": strict(&e.to_body())})
}

fn translate(inputs: &Inputs, body: &[u8], options: &Options) -> Result<Translated, ApiError> {
    match inputs.endpoint {
        Endpoint::Responses => translate_request(body, options, META),
        Endpoint::Compact => compact::translate(body, options, META),
        Endpoint::Websocket => unreachable!("run by websocket()"),
    }
}

/// The translator's whole output for `body`, pushed in the given pieces, then finished.
fn stream(exchange: ResponsePlan, pieces: impl IntoIterator<Item = impl AsRef<[u8]>>) -> Vec<u8> {
    let mut translator = StreamTranslator::new(exchange);
    let mut out = Vec::new();
    for piece in pieces {
        out.extend_from_slice(&translator.push(piece.as_ref(), ANSWERED_AT));
    }
    out.extend_from_slice(&translator.finish(ANSWERED_AT));
    out
}

/// Whether the OpenResponses schema can judge `response`: not when it carries what only
/// OpenAI's API has (items of custom and built-in tool calls and compactions, a `tool_choice`
/// forcing a built-in tool), nor with a `json_schema` text format (whose `schema` the
/// published schema says must be `null`).
fn schema_applies(response: &Value) -> bool {
    let items = response["output"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let forced = response["tool_choice"]["type"]
        .as_str()
        .unwrap_or("function");
    response["object"] == "response"
        && items_checked(items.iter().map(|i| &i["type"]))
        && ["function", "allowed_tools"].contains(&forced)
        && response["text"]["format"]["type"] != "json_schema"
}

/// Whether every item type is one the stream rules and the schema know.
fn items_checked<'a>(mut types: impl Iterator<Item = &'a Value>) -> bool {
    types.all(|t| stream_rules::CHECKED_ITEMS.contains(&t.as_str().unwrap_or_default()))
}

/// Runs one case: what the code gives for its inputs.
fn run(inputs: &Inputs) -> Outputs {
    if let Endpoint::Websocket = inputs.endpoint {
        return websocket(inputs);
    }
    let options = inputs.options();
    let body = inputs.body();
    let mut outputs = Outputs::default();
    let translated = match translate(inputs, &body, &options) {
        Ok(t) => t,
        Err(e) => {
            assert!(
                inputs.answer.is_none() && inputs.sse().is_none(),
                "an answer to a refused request"
            );
            outputs.error = Some(refusal(&e));
            return outputs;
        }
    };
    let again = translate(inputs, &body, &options).expect("translated twice");
    assert_eq!(
        translated.body, again.body,
        "the same request, another Chat body"
    );
    outputs.chat = Some(strict(&translated.body));

    if let Some(answer) = &inputs.answer {
        assert!(inputs.sse().is_none(), "both answer and answer_sse");
        match completion(&translated.plan, answer.to_string().as_bytes(), ANSWERED_AT) {
            Ok(bytes) => {
                let response = strict(&bytes);
                if schema_applies(&response) {
                    common::schema::assert_valid("ResponseResource", &response);
                }
                outputs.response = Some(response);
            }
            Err(e) => outputs.response_error = Some(refusal(&e)),
        }
    }

    if let Some(sse) = inputs.sse() {
        let model = translated.plan.model().to_owned();
        let whole = stream(translated.plan.clone(), [&sse]);
        let bytewise = stream(translated.plan, sse.chunks(1));
        assert!(
            whole == bytewise,
            "the stream differs when the answer arrives one byte at a time"
        );
        let events = stream_rules::events(&whole);
        if items_checked(
            events
                .iter()
                .filter_map(|e| e.get("item").map(|i| &i["type"])),
        ) {
            let expected = stream_rules::Expected {
                model: &model,
                created_at: NOW,
                completed_at: ANSWERED_AT,
            };
            stream_rules::check(&whole, &expected);
        }
        outputs.events = Some(events);
    }
    outputs
}

/// The types of the events in `frames`.
fn event_types(frames: &[bytes::Bytes]) -> Value {
    frames
        .iter()
        .map(|f| strict(f)["type"].clone())
        .collect::<Vec<_>>()
        .into()
}

/// The clock and ids of a WebSocket run: the requests' time, then the answers', and one
/// seed per response.
#[derive(Clone)]
struct Clock {
    now: std::rc::Rc<std::cell::Cell<u64>>,
    seed: std::rc::Rc<std::cell::Cell<u128>>,
}

impl Clock {
    /// The time and the next response's seed from now on.
    fn set(&self, now: u64, seed: u128) {
        self.now.set(now);
        self.seed.set(seed);
    }
}

impl responses_core::environment::Environment for Clock {
    fn now(&self) -> u64 {
        self.now.get()
    }

    fn id_seed(&self) -> u128 {
        let seed = self.seed.get();
        self.seed.set(seed + 1);
        seed
    }
}

/// A masked client text frame (RFC 6455 §5.3).
fn client_frame(payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x81];
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n <= 0xFFFF => {
            f.push(0x80 | 126);
            f.extend((n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend((n as u64).to_be_bytes());
        }
    }
    let key = [7, 1, 3, 9];
    f.extend(key);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    f
}

/// The payloads of the server's text frames.
fn server_texts(mut bytes: &[u8]) -> Vec<bytes::Bytes> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let (len, at) = match bytes[1] & 0x7f {
            126 => (u16::from_be_bytes([bytes[2], bytes[3]]) as usize, 4),
            127 => (
                u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
                10,
            ),
            n => (n as usize, 2),
        };
        assert_eq!(bytes[0], 0x81, "a text frame");
        out.push(bytes::Bytes::copy_from_slice(&bytes[at..at + len]));
        bytes = &bytes[at + len..];
    }
    out
}

/// A WebSocket connection's messages through the core's connection, in order.
fn websocket(inputs: &Inputs) -> Outputs {
    inputs.settings.validate().expect("valid settings");
    let settings = Arc::new(inputs.settings.exchange_settings(inputs.keyring()));
    let limits = Limits {
        max_message_bytes: settings.options.max_request_bytes,
        ..inputs.settings.socket_limits()
    };
    let head = inputs.headers();
    let header = |name: &str| {
        head.iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    };
    let clock = Clock {
        now: Default::default(),
        seed: Default::default(),
    };
    let at = Instant::now();
    let mut connection = Connection::new(settings, limits, clock.clone(), header, at);
    let answer = inputs.sse();
    let mut previous: Option<String> = None;
    let mut out = Vec::new();
    let sent = |connection: &mut Connection<Clock>| -> Vec<bytes::Bytes> {
        std::iter::from_fn(|| connection.poll_transmit())
            .flat_map(|b| server_texts(&b))
            .collect()
    };
    for (i, path) in inputs.messages_files.iter().flatten().enumerate() {
        let mut text = read_file(path);
        // The client names the response it received: in this run, the one before.
        let named = strict(&text)["previous_response_id"]
            .as_str()
            .map(str::to_owned);
        if let (Some(named), Some(id)) = (named, &previous) {
            let named = format!("\"{named}\"");
            let at = text
                .windows(named.len())
                .position(|w| w == named.as_bytes())
                .expect("the id as written");
            text.splice(at..at + named.len(), format!("\"{id}\"").into_bytes());
        }
        let mut entry = Map::new();
        clock.set(NOW, SEED + i as u128);
        connection.handle_bytes(at, &client_frame(&text));
        // The call started, if any (the last response's record, not snapshotted, may come
        // first).
        let call = std::iter::from_fn(|| connection.poll_call()).find_map(|a| match a {
            responses_core::call::CallAction::Start(call) => Some(call),
            _ => None,
        });
        let frames = match call {
            None => {
                let frames = sent(&mut connection);
                let first = strict(&frames[0]);
                if first["type"] == "error" {
                    entry.insert("error".into(), first);
                    out.push(Value::Object(entry));
                    continue;
                }
                entry.insert("answered".into(), event_types(&frames));
                frames
            }
            Some(call) => {
                entry.insert("chat".into(), strict(&call.body));
                let sse = answer
                    .as_ref()
                    .expect("an answer_sse for the messages that go upstream");
                clock.now.set(ANSWERED_AT);
                let sse_type = [("content-type", "text/event-stream")];
                AnswerHead(&sse_type)
                    .report(200, |head| connection.handle_call_head(at, call.id, head));
                connection.handle_call_data(at, call.id, sse);
                connection.handle_call_end(at, call.id);
                let frames = sent(&mut connection);
                assert!(
                    connection.exchange().is_none(),
                    "message {i}: the answer did not end the response"
                );
                entry.insert("events".into(), event_types(&frames));
                frames
            }
        };
        previous = frames
            .iter()
            .map(|f| strict(f))
            .find(|e| e["type"] == "response.completed")
            .and_then(|e| e["response"]["id"].as_str().map(str::to_owned));
        out.push(Value::Object(entry));
    }
    Outputs {
        messages: Some(out),
        ..Outputs::default()
    }
}

/// One snapshot file, split into its inputs and outputs.
struct Case {
    path: PathBuf,
    /// The file's keys in order, inputs then outputs.
    file: Map<String, Value>,
    inputs: Inputs,
    expected: Outputs,
}

fn load(path: &Path) -> Case {
    let text = std::fs::read_to_string(path).expect("read");
    let Value::Object(file) = common::json::strict(&text) else {
        panic!("not a JSON object");
    };
    let (inputs, outputs): (Map<_, _>, Map<_, _>) = file
        .clone()
        .into_iter()
        .partition(|(k, _)| INPUT_KEYS.contains(&k.as_str()));
    Case {
        path: path.to_owned(),
        file,
        inputs: serde_json::from_value(Value::Object(inputs)).expect("inputs"),
        expected: serde_json::from_value(Value::Object(outputs)).expect("outputs"),
    }
}

/// The paths where `want` and `got` differ (key order aside), as readable lines.
fn diff(at: &str, want: &Value, got: &Value, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, wv) in w {
                match g.get(k) {
                    Some(gv) => diff(&format!("{at}.{k}"), wv, gv, out),
                    None => out.push(format!("{at}.{k}: want {wv}, missing")),
                }
            }
            for (k, gv) in g.iter().filter(|(k, _)| !w.contains_key(*k)) {
                out.push(format!("{at}.{k}: not expected, got {gv}"));
            }
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            for (i, (wv, gv)) in w.iter().zip(g).enumerate() {
                diff(&format!("{at}[{i}]"), wv, gv, out);
            }
        }
        _ if want != got => {
            let short = |v: &Value| {
                let s = v.to_string();
                match s.char_indices().nth(300) {
                    Some((i, _)) => format!("{}…", &s[..i]),
                    None => s,
                }
            };
            out.push(format!("{at}: want {}, got {}", short(want), short(got)));
        }
        _ => {}
    }
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
}

/// Runs every snapshot under `core/tests/snapshots/<dir>`; with `UPDATE_SNAPSHOTS=1`, writes the
/// outputs the code gives instead of comparing.
fn check_dir(dir: &str) {
    let update = common::snapshot::updating();
    let mut paths = Vec::new();
    files(&root().join("core/tests/snapshots").join(dir), &mut paths);
    assert!(
        !paths.is_empty(),
        "no snapshots in core/tests/snapshots/{dir}"
    );
    let mut failures = Vec::new();
    let mut updated = 0;
    for path in &paths {
        let name = path
            .strip_prefix(root())
            .unwrap_or(path)
            .display()
            .to_string();
        let result = std::panic::catch_unwind(|| {
            let case = load(path);
            let got = run(&case.inputs);
            (case, got)
        });
        let (case, got) = match result {
            Ok(done) => done,
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                failures.push(format!("{name}: {why}"));
                continue;
            }
        };
        if case.expected == got {
            continue;
        }
        if update {
            write(&case, &got);
            updated += 1;
            continue;
        }
        let mut lines = Vec::new();
        diff(
            "",
            &serde_json::to_value(&case.expected).unwrap(),
            &serde_json::to_value(&got).unwrap(),
            &mut lines,
        );
        lines.truncate(20);
        failures.push(format!("{name}:\n  {}", lines.join("\n  ")));
    }
    if updated > 0 {
        eprintln!("updated {updated} snapshot(s) in core/tests/snapshots/{dir}");
    }
    assert!(
        failures.is_empty(),
        "{} of {} snapshots in core/tests/snapshots/{dir} differ from what the code gives \
         (UPDATE_SNAPSHOTS=1 cargo test -p responses-core --test main snapshots:: writes the code's; review the diff):\n{}",
        failures.len(),
        paths.len(),
        failures.join("\n")
    );
}

/// Writes `outputs` into the case's file after its inputs, pretty-printed.
fn write(case: &Case, outputs: &Outputs) {
    let mut file: Map<String, Value> = case
        .file
        .iter()
        .filter(|(k, _)| INPUT_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let Value::Object(outputs) = serde_json::to_value(outputs).unwrap() else {
        unreachable!()
    };
    file.extend(outputs);
    let text = serde_json::to_string_pretty(&Value::Object(file)).unwrap() + "\n";
    std::fs::write(&case.path, text).expect("write the snapshot");
}

/// The request translation, case by case: valid requests, refused ones, and what the
/// response echoes of them.
#[test]
fn request_snapshots() {
    check_dir("request");
}

/// The stream translation: upstream SSE bodies, recorded and handwritten, and their events.
#[test]
fn stream_snapshots() {
    check_dir("stream");
}

/// The malformed bodies of `tests/fixtures/bad_requests/` with the settings of
/// `tests/e2e/bad_requests.rs`: the whole envelope each gets.
#[test]
fn bad_request_snapshots() {
    check_dir("bad_requests");
}

/// Requests real clients sent, as captured.
#[test]
fn recorded_snapshots() {
    check_dir("recorded");
}

/// The comparison is by value: a change of key order alone is no change.
#[test]
fn key_order_is_not_compared() {
    let a =
        common::json::strict(r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#);
    let b =
        common::json::strict(r#"{"messages": [{"content": "hi", "role": "user"}], "model": "m"}"#);
    assert_eq!(a, b);
    let c =
        common::json::strict(r#"{"messages": [{"content": "hi", "role": "user"}], "model": "n"}"#);
    assert_ne!(a, c);
    let mut lines = Vec::new();
    diff("", &a, &c, &mut lines);
    assert_eq!(lines, [r#".model: want "m", got "n""#]);
}
