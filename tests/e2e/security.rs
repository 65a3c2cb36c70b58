//! The processor's secured listeners end to end, through a real Envoy running the example
//! bootstraps of `envoy/examples/`, and what the processor writes in its logs.
//!
//! * TLS (`--tls-cert/--tls-key`, `extproc-tls.yaml`): a translated request works; Envoy refuses
//!   a processor whose certificate is signed by another CA or names another host.
//! * mTLS (`--tls-client-ca`, `extproc-mtls.yaml`): a translated request works; the processor
//!   refuses an Envoy presenting no client certificate, or one signed by another CA, and the
//!   request fails with Envoy's 5xx without reaching the upstream.
//! * Unix domain socket (`--listen unix:...`, `extproc-uds.yaml`): a translated request works.
//! * Logs: they carry the request's `x-request-id` and never the prompt (a unique marker sent in
//!   the input), at `info` and at `debug`; only `--log-content` with `RUST_LOG=debug` shows it.
//! * Module mode (`tests/common/stack.rs`) has no processor listener: there, only the module's
//!   lines in Envoy's log are checked (request id, never the prompt, even at debug).
//!
//! Certificates are made at test time with the `openssl` CLI (a throwaway CA, a server
//! certificate for `localhost`/127.0.0.1, client certificates) in a temp dir
//! (`common::pki`). The processor is
//! the real binary, spawned here (the harness' `Processor` always listens on TCP), with its
//! stdout and stderr captured to a file.

use crate::common;

use std::path::Path;
use std::time::Duration;

use common::pki::Pki;
use common::schema::{assert_valid, assert_valid_sse};
use common::{
    client, repo_root, DemoUpstream, Envoy, Listen, Processor, ScriptedUpstream, Spawn, TempDir,
};
use serde_json::{json, Value};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Why most tests here do not apply in module mode (`tests/common/stack.rs`).
const PROCESSOR_ONLY: &str = "the processor's own listeners (TLS, mTLS, Unix socket) and its \
     logs; module mode has module_logs_carry_the_request_id_but_never_the_prompt";
/// Where the example bootstraps expect the PEM files Envoy reads.
const EXAMPLE_TLS_DIR: &str = "/etc/envoy/responses-extproc-tls/";
/// The processor's socket path in `extproc-uds.yaml`.
const EXAMPLE_SOCKET: &str = "/run/responses-extproc/extproc.sock";

// ---- the processor binary ----

/// The processor binary on `listen`, without an inherited `RUST_LOG` (these tests read its
/// logs, so the level must be the one they set).
fn extproc(listen: Listen, args: &[&str], env: &[(&str, &str)]) -> Processor {
    Processor::spawn(Spawn {
        listen,
        args,
        env,
        clean_rust_log: true,
        ..Spawn::default()
    })
}

// ---- the example Envoy bootstraps ----

fn read_example(name: &str) -> String {
    let path = repo_root().join("envoy/examples").join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Replaces `from` (which must occur exactly once) with `to`.
fn replace_once(config: String, example: &str, from: &str, to: &str) -> String {
    let count = config.matches(from).count();
    assert_eq!(
        count, 1,
        "envoy/examples/{example} must contain `{from}` exactly once (found {count})"
    );
    config.replace(from, to)
}

/// `envoy/examples/<name>` made runnable here, the way the harness adapts `envoy.yaml`: the
/// listener on 127.0.0.1 port 0, the admin API on port 0, the given upstream port, the
/// processor's port (`Some`) or no TCP processor at all (`None`, the UDS example), and each
/// `(file name, path)` in `files` substituted for `/etc/envoy/responses-extproc-tls/<file>`
/// (the socket path when the name is `extproc.sock`).
fn example_config(
    name: &str,
    upstream_port: u16,
    extproc_port: Option<u16>,
    files: &[(&str, &Path)],
) -> String {
    // Comment lines may name the placeholders too: only the configuration counts.
    let mut config = significant_lines(&read_example(name)).join("\n");
    for (from, to) in [
        ("address: 0.0.0.0", "address: 127.0.0.1".to_string()),
        ("port_value: 10000", "port_value: 0".to_string()),
        ("port_value: 9901", "port_value: 0".to_string()),
        ("port_value: 18080", format!("port_value: {upstream_port}")),
    ] {
        config = replace_once(config, name, from, &to);
    }
    match extproc_port {
        Some(port) => {
            config = replace_once(
                config,
                name,
                "port_value: 50051",
                &format!("port_value: {port}"),
            )
        }
        None => assert!(
            !config.contains("port_value: 50051"),
            "envoy/examples/{name}: the processor is on a socket, not on TCP"
        ),
    }
    for (file, path) in files {
        let path = path.to_str().expect("UTF-8 temp path");
        let from = if *file == "extproc.sock" {
            EXAMPLE_SOCKET.to_string()
        } else {
            format!("{EXAMPLE_TLS_DIR}{file}")
        };
        config = replace_once(config, name, &from, path);
    }
    assert!(
        !config.contains(EXAMPLE_TLS_DIR) && !config.contains(EXAMPLE_SOCKET),
        "envoy/examples/{name}: a placeholder path was not substituted"
    );
    config
}

// ---- requests ----

/// The demo upstream's answer to a one-message `input`.
fn demo_answer(input: &str) -> String {
    format!("Hello! This is the demo upstream. You said: {input}")
}

/// A unique string that must never reach the logs (unless `--log-content` says so).
fn unique_marker(test: &str) -> String {
    format!("PROMPT-MARKER-{test}-{}", uuid_like())
}

fn uuid_like() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{:x}{:x}", std::process::id(), nanos)
}

/// Sends a non-streamed request with `x-request-id: request_id`; (status, body).
async fn post(envoy: &Envoy, request_id: &str, body: &Value) -> (u16, String) {
    let response = client()
        .post(envoy.url("/v1/responses"))
        .header("x-request-id", request_id)
        .json(body)
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await
        .expect("send request");
    let status = response.status().as_u16();
    (status, response.text().await.expect("read body"))
}

/// A non-streamed and a streamed request with `input`, both translated by the demo upstream's
/// answer; the request ids are `<id_prefix>-json` and `<id_prefix>-stream`.
async fn assert_translated(envoy: &Envoy, id_prefix: &str, input: &str) {
    let (status, body) = post(
        envoy,
        &format!("{id_prefix}-json"),
        &json!({"model": "m", "input": input, "instructions": input}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let response: Value = common::json::strict(&body);
    assert_valid("ResponseResource", &response);
    assert_eq!(response["status"], "completed", "{body}");
    assert_eq!(
        response["output"][0]["content"][0]["text"],
        demo_answer(input)
    );

    let (status, body) = post(
        envoy,
        &format!("{id_prefix}-stream"),
        &json!({"model": "m", "input": input, "stream": true}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let events = assert_valid_sse(&body);
    let (last, completed) = events.last().expect("events");
    assert_eq!(last, "response.completed", "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    let streamed: String = events
        .iter()
        .filter(|(name, _)| name == "response.output_text.delta")
        .filter_map(|(_, e)| e["delta"].as_str())
        .collect();
    assert_eq!(streamed, demo_answer(input));
    assert_eq!(
        completed["response"]["output"][0]["content"][0]["text"],
        demo_answer(input)
    );
}

/// What envoy/examples/README.md says a client gets when the handshake with the processor
/// fails: the status and the error code, its sentence's first two code spans.
fn documented_refusal() -> (u16, String) {
    let readme = std::fs::read_to_string(repo_root().join("envoy/examples/README.md")).unwrap();
    let sentence = readme
        .split("When the handshake fails,")
        .nth(1)
        .expect("envoy/examples/README.md says what a failed handshake gives");
    let spans: Vec<&str> = sentence.split('`').skip(1).step_by(2).collect();
    // `failure_mode_allow: false`, then the status, then the code.
    assert_eq!(spans[0], "failure_mode_allow: false", "{sentence}");
    (spans[1].parse().expect("a status"), spans[2].to_owned())
}

/// The request must fail in Envoy with the documented status and envelope (no translated
/// answer) and never reach `upstream`, because the TLS handshake with the processor failed
/// with `tls_error` (BoringSSL's words).
async fn assert_refused(envoy: &Envoy, upstream: &ScriptedUpstream, what: &str, tls_error: &str) {
    let (status, body) = post(
        envoy,
        "refused",
        &json!({"model": "m", "input": "must not be answered"}),
    )
    .await;
    let (documented_status, documented_code) = documented_refusal();
    let code = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
    assert_eq!(
        (status, code.as_deref()),
        (documented_status, Some(documented_code.as_str())),
        "{what}: {body}\nEnvoy log:\n{}",
        envoy.logs()
    );
    assert!(
        !body.contains("\"object\":\"response\"") && !body.contains("Hello!"),
        "{what}: got a translated answer: {body}"
    );
    assert!(
        upstream.requests().is_empty(),
        "{what}: the request reached the upstream"
    );
    // Refused by the TLS handshake, for the expected reason (Envoy logs it at warning).
    let logs = envoy.logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("TLS_error") && l.contains(tls_error)),
        "{what}: Envoy's log names no TLS error {tls_error}:\n{logs}"
    );
}

// ---- the examples stay derived from envoy.yaml ----

/// Non-comment, non-blank lines.
fn significant_lines(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// (the config without its `extproc` cluster, the `extproc` cluster), both as significant
/// lines. The cluster runs from `  - name: extproc` to the next `  - name: ` line.
fn split_extproc_cluster(text: &str) -> (Vec<String>, Vec<String>) {
    let lines = significant_lines(text);
    let start = lines
        .iter()
        .position(|l| l == "  - name: extproc")
        .expect("an extproc cluster");
    let end = lines[start + 1..]
        .iter()
        .position(|l| l.starts_with("  - name: "))
        .map_or(lines.len(), |i| start + 1 + i);
    let mut rest = lines[..start].to_vec();
    rest.extend_from_slice(&lines[end..]);
    (rest, lines[start..end].to_vec())
}

#[test]
fn examples_differ_from_envoy_yaml_only_in_the_extproc_cluster() {
    let base = std::fs::read_to_string(repo_root().join("envoy/envoy.yaml")).unwrap();
    let (base_rest, base_cluster) = split_extproc_cluster(&base);
    // The cluster's settings up to its address (name, type, timeout, HTTP/2) stay the same.
    let base_head: Vec<String> = base_cluster
        .iter()
        .take_while(|l| l.trim() != "load_assignment:")
        .cloned()
        .collect();
    for name in ["extproc-tls.yaml", "extproc-mtls.yaml", "extproc-uds.yaml"] {
        let (rest, cluster) = split_extproc_cluster(&read_example(name));
        assert!(
            rest == base_rest,
            "envoy/examples/{name} differs from envoy/envoy.yaml outside the extproc cluster: \
             copy the change over"
        );
        assert!(
            cluster.starts_with(&base_head),
            "envoy/examples/{name}: the extproc cluster must start like envoy.yaml's:\n{}",
            base_head.join("\n")
        );
    }
}

// ---- TLS ----

#[tokio::test]
async fn tls_translates_and_logs_the_request_id_but_no_prompt() {
    if !common::only_ext_proc(PROCESSOR_ONLY) {
        return;
    }
    let pki = Pki::new();
    let demo = DemoUpstream::start();
    let processor = extproc(
        Listen::Tcp,
        &[
            "--tls-cert",
            &pki.arg("server.pem"),
            "--tls-key",
            &pki.arg("server.key"),
        ],
        &[("RUST_LOG", "info")],
    );
    let envoy = Envoy::start_with_config(&example_config(
        "extproc-tls.yaml",
        demo.port(),
        Some(processor.port()),
        &[("ca.pem", &pki.path("ca.pem"))],
    ));
    let marker = unique_marker("tls");
    assert_translated(&envoy, "sec-tls-7f3a", &marker).await;
    // A rejected request quoting the marker in several fields.
    let (status, body) = post(
        &envoy,
        "sec-tls-7f3a-rejected",
        &json!({"model": marker, "input": marker, "previous_response_id": marker}),
    )
    .await;
    assert_eq!(status, 400, "{body}");

    let logs = processor.logs();
    assert!(logs.contains("tls=true"), "{logs}");
    for id in [
        "sec-tls-7f3a-json",
        "sec-tls-7f3a-stream",
        "sec-tls-7f3a-rejected",
    ] {
        assert!(
            logs.contains(&format!("request_id={id}")),
            "the log lacks request id {id}:\n{logs}"
        );
    }
    assert!(
        !logs.contains(&marker),
        "the prompt reached the log at info level:\n{logs}"
    );
}

#[tokio::test]
async fn envoy_refuses_a_processor_certificate_of_another_ca_or_for_another_name() {
    if !common::only_ext_proc(PROCESSOR_ONLY) {
        return;
    }
    let pki = Pki::new();
    let upstream = ScriptedUpstream::start();

    // The processor's certificate is fine, but Envoy trusts another CA; then signed by the
    // trusted CA, but for another host name (match_typed_subject_alt_names).
    for (cert, key, ca, what, why) in [
        (
            "server.pem",
            "server.key",
            "other-ca.pem",
            "processor certificate of another CA",
            "unable_to_get_local_issuer_certificate",
        ),
        (
            "wrong-name.pem",
            "wrong-name.key",
            "ca.pem",
            "processor certificate for another name",
            "SAN_matcher",
        ),
    ] {
        let processor = extproc(
            Listen::Tcp,
            &["--tls-cert", &pki.arg(cert), "--tls-key", &pki.arg(key)],
            &[],
        );
        let envoy = Envoy::start_with_config(&example_config(
            "extproc-tls.yaml",
            upstream.port(),
            Some(processor.port()),
            &[("ca.pem", &pki.path(ca))],
        ));
        assert_refused(&envoy, &upstream, what, why).await;
    }
}

// ---- mTLS ----

fn mtls_processor(pki: &Pki) -> Processor {
    extproc(
        Listen::Tcp,
        &[
            "--tls-cert",
            &pki.arg("server.pem"),
            "--tls-key",
            &pki.arg("server.key"),
            "--tls-client-ca",
            &pki.arg("ca.pem"),
        ],
        &[("RUST_LOG", "info")],
    )
}

#[tokio::test]
async fn mtls_translates() {
    if !common::only_ext_proc(PROCESSOR_ONLY) {
        return;
    }
    let pki = Pki::new();
    let demo = DemoUpstream::start();
    let processor = mtls_processor(&pki);
    let envoy = Envoy::start_with_config(&example_config(
        "extproc-mtls.yaml",
        demo.port(),
        Some(processor.port()),
        &[
            ("ca.pem", &pki.path("ca.pem")),
            ("envoy-client.pem", &pki.path("envoy-client.pem")),
            ("envoy-client.key", &pki.path("envoy-client.key")),
        ],
    ));
    assert_translated(&envoy, "sec-mtls", "over mutual TLS").await;
    let logs = processor.logs();
    assert!(logs.contains("mtls=true"), "{logs}");
    assert!(logs.contains("request_id=sec-mtls-stream"), "{logs}");
}

#[tokio::test]
async fn mtls_refuses_envoy_without_a_client_certificate_or_with_a_foreign_one() {
    if !common::only_ext_proc(PROCESSOR_ONLY) {
        return;
    }
    let pki = Pki::new();
    let upstream = ScriptedUpstream::start();
    let processor = mtls_processor(&pki);

    // The TLS example: Envoy presents no client certificate.
    let envoy = Envoy::start_with_config(&example_config(
        "extproc-tls.yaml",
        upstream.port(),
        Some(processor.port()),
        &[("ca.pem", &pki.path("ca.pem"))],
    ));
    assert_refused(
        &envoy,
        &upstream,
        "Envoy without a client certificate",
        "CERTIFICATE_REQUIRED",
    )
    .await;
    drop(envoy);

    // A client certificate signed by a CA the processor does not trust.
    let envoy = Envoy::start_with_config(&example_config(
        "extproc-mtls.yaml",
        upstream.port(),
        Some(processor.port()),
        &[
            ("ca.pem", &pki.path("ca.pem")),
            ("envoy-client.pem", &pki.path("rogue-client.pem")),
            ("envoy-client.key", &pki.path("rogue-client.key")),
        ],
    ));
    assert_refused(
        &envoy,
        &upstream,
        "Envoy with a client certificate of another CA",
        "UNKNOWN_CA",
    )
    .await;

    let logs = processor.logs();
    assert!(
        !logs.contains("translated request"),
        "the processor translated a request from an unauthenticated Envoy:\n{logs}"
    );
}

// ---- Unix domain socket ----

#[tokio::test]
async fn uds_translates_and_debug_logs_hold_no_prompt_without_log_content() {
    if !common::only_ext_proc(PROCESSOR_ONLY) {
        return;
    }
    let sockets = TempDir::new("uds");
    let socket = sockets.path().join("extproc.sock");
    let demo = DemoUpstream::start();
    let processor = extproc(Listen::Unix(socket.clone()), &[], &[("RUST_LOG", "debug")]);
    let envoy = Envoy::start_with_config(&example_config(
        "extproc-uds.yaml",
        demo.port(),
        None,
        &[("extproc.sock", &socket)],
    ));
    let marker = unique_marker("uds");
    assert_translated(&envoy, "sec-uds", &marker).await;

    let logs = processor.logs();
    assert!(
        logs.contains(&format!("listen=unix:{}", socket.display())),
        "{logs}"
    );
    assert!(logs.contains("request_id=sec-uds-json"), "{logs}");
    assert!(logs.contains("request_id=sec-uds-stream"), "{logs}");
    assert!(
        !logs.contains(&marker),
        "the prompt reached the log at debug level without --log-content:\n{logs}"
    );
}

#[tokio::test]
async fn log_content_at_debug_shows_the_prompt() {
    if !common::only_ext_proc(PROCESSOR_ONLY) {
        return;
    }
    let sockets = TempDir::new("uds-content");
    let socket = sockets.path().join("extproc.sock");
    let demo = DemoUpstream::start();
    let processor = extproc(
        Listen::Unix(socket.clone()),
        &["--log-content"],
        &[("RUST_LOG", "debug")],
    );
    let envoy = Envoy::start_with_config(&example_config(
        "extproc-uds.yaml",
        demo.port(),
        None,
        &[("extproc.sock", &socket)],
    ));
    let marker = unique_marker("content");
    assert_translated(&envoy, "sec-content", &marker).await;

    let logs = processor.logs();
    assert!(logs.contains("--log-content is on"), "{logs}");
    assert!(
        logs.contains(&marker),
        "--log-content with RUST_LOG=debug should log the prompt:\n{logs}"
    );
    // Still labelled with the request id.
    assert!(
        logs.lines()
            .any(|l| l.contains(&marker) && l.contains("request_id=sec-content-json")),
        "{logs}"
    );

    // --log-content alone does not lower the level: at info the prompt stays out.
    let processor = extproc(
        Listen::Unix(sockets.path().join("info.sock")),
        &["--log-content"],
        &[("RUST_LOG", "info")],
    );
    let envoy = Envoy::start_with_config(&example_config(
        "extproc-uds.yaml",
        demo.port(),
        None,
        &[("extproc.sock", &sockets.path().join("info.sock"))],
    ));
    let marker = unique_marker("content-info");
    assert_translated(&envoy, "sec-content-info", &marker).await;
    let logs = processor.logs();
    assert!(logs.contains("request_id=sec-content-info-json"), "{logs}");
    assert!(!logs.contains(&marker), "{logs}");
}

// ---- the module's logs ----

/// Module mode: the filter's lines in Envoy's log (its `dynamic_modules` logger, at debug
/// here) carry the request id of each exchange and never the prompt; there is no content
/// logging in the module.
#[tokio::test]
async fn module_logs_carry_the_request_id_but_never_the_prompt() {
    if common::mode() != common::Mode::Module {
        eprintln!("ext_proc mode: the processor's logs are checked by the tests above");
        return;
    }
    let demo = DemoUpstream::start();
    let stack = common::Stack::start(demo.port(), &[]);
    let envoy = &stack.envoy;
    common::envoy::http_post(envoy.admin_port(), "/logging?dynamic_modules=debug")
        .expect("raise the module's log level");
    let marker = unique_marker("module");
    assert_translated(envoy, "sec-module", &marker).await;
    let (status, body) = post(
        envoy,
        "sec-module-rejected",
        &json!({"model": marker, "input": marker, "previous_response_id": marker}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let logs = common::wait_until("the module's lines", Duration::from_secs(10), || {
        let logs = envoy.logs();
        logs.contains("request_id=sec-module-rejected")
            .then_some(logs)
    });
    for id in ["sec-module-json", "sec-module-stream"] {
        assert!(
            logs.contains(&format!("request_id={id}")),
            "the log lacks request id {id}:\n{logs}"
        );
    }
    assert!(
        !logs.contains(&marker),
        "the prompt reached Envoy's log:\n{logs}"
    );
}

// ---- forged log fields ----

/// The `key=value` fields of a log line from its `message` on, read as logfmt readers do: a
/// value in double quotes runs to the next unescaped quote (`\"` and `\\` inside it read as
/// `"` and `\`).
fn logfmt_fields(line: &str, message: &str) -> Vec<(String, String)> {
    let start = line.find(message).expect("the message") + message.len();
    let mut rest = &line[start..];
    let mut fields = Vec::new();
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().to_owned();
        let mut value = String::new();
        let after = &rest[eq + 1..];
        rest = if let Some(quoted) = after.strip_prefix('"') {
            let mut chars = quoted.char_indices();
            let mut end = quoted.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next().map(|(_, c)| c)),
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    c => value.push(c),
                }
            }
            &quoted[end..]
        } else {
            let end = after.find(' ').unwrap_or(after.len());
            value.push_str(&after[..end]);
            &after[end..]
        };
        fields.push((key, value));
    }
    fields
}

/// A model name and a request id holding spaces, `=` and quotes are each one field in the
/// translator's log lines (the processor's text log, Envoy's log in module mode): they forge
/// no `outcome` or `status`.
#[tokio::test]
async fn a_model_or_request_id_forges_no_field_in_the_log() {
    let demo = DemoUpstream::start();
    let stack = common::Stack::start(demo.port(), &[]);
    let model = "m outcome=forged status=299 \"x=1";
    let request_id = "sec-forge status=298";
    let (status, body) = post(
        &stack.envoy,
        request_id,
        &json!({"model": model, "input": "hi"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let logs = common::wait_until("the answer's log line", Duration::from_secs(10), || {
        let logs = stack.translator_logs();
        logs.contains("answer translated").then_some(logs)
    });
    for message in ["translated request", "answer translated"] {
        let line = logs
            .lines()
            .find(|l| l.contains(message) && l.contains("sec-forge"))
            .unwrap_or_else(|| panic!("no {message:?} line for the request:\n{logs}"));
        let fields = logfmt_fields(line, message);
        let get = |key: &str| -> Vec<&str> {
            fields
                .iter()
                .filter(|(k, _)| k == key)
                .map(|(_, v)| v.as_str())
                .collect()
        };
        assert_eq!(get("model"), [model], "{line}");
        assert_eq!(get("request_id"), [request_id], "{line}");
        for (key, value) in &fields {
            assert!(
                key != "x" && !["forged", "299", "298"].contains(&value.as_str()),
                "{key}={value} forged in {line}"
            );
        }
        if message == "answer translated" {
            assert_eq!(get("outcome"), ["translated"], "{line}");
            assert_eq!(get("status"), ["200"], "{line}");
        }
    }
}
