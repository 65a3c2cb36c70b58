//! Load and soak test: N concurrent clients send a mix of streamed and non-streamed
//! `POST /v1/responses` through a real Envoy (`envoy/envoy.yaml`) → the `responses-extproc`
//! binary (module mode, `tests/common/stack.rs`: `envoy/envoy-module.yaml` with the module, and
//! the RSS watched is Envoy's) → the demo upstream (the `demo-upstream` binary, a separate process, so
//! the processor's memory is its own) for a set time, then print a report: requests done,
//! errors, latency p50/p99 (time to the full answer; for streams also time to the first
//! `response.output_text.delta`), and the processor's RSS over the run.
//!
//! Every answer is checked: HTTP 200, a JSON `response` (completed) or an SSE stream whose
//! every event is JSON, with increasing `sequence_number`s, ending in `response.completed` and
//! `data: [DONE]`; and the text must be the demo upstream's answer to *this* request's input
//! (which is unique), so a mix-up between concurrent exchanges counts as an error.
//!
//! The default run is short (20 clients for 10 s) and asserts zero errors and bounded RSS
//! growth, so it runs with `cargo test`. Long runs (see `docs/testing.md`):
//!
//! ```sh
//! LOAD_CONCURRENCY=200 LOAD_SECONDS=600 cargo test --release --test load -- --nocapture
//! ```
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `LOAD_CONCURRENCY` | 20 | concurrent clients (each sends one request at a time, no pause) |
//! | `LOAD_SECONDS` | 10 | how long new requests are started |
//! | `LOAD_STREAM_PERCENT` | 50 | share of streamed requests |
//! | `LOAD_MAX_RSS_GROWTH_MIB` | 32 | largest allowed processor RSS growth from the end of the warm-up to the end of the run |
//! | `LOAD_RUST_LOG` | `warn` | `RUST_LOG` of the processor (`info` logs 2 lines per request) |
//! | `LOAD_ENVOY_CONFIG` | `envoy/envoy.yaml` | another Envoy bootstrap with the same placeholders (listener `address: 0.0.0.0`, `port_value: 10000`, `9901`, `50051`, `18080`, each once) |
//! | `LOAD_REPORT` | none | also write the report to this file |

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::schema::{assert_valid, assert_valid_sse};
use common::sse::parse_sse;
use common::{log_tail, Envoy, Processor, Spawn};
use serde_json::{json, Value};

/// Longest one request may take before it counts as an error.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How many error descriptions the report quotes.
const ERROR_SAMPLES: usize = 10;
/// How many of the slowest requests the report lists (with when they started).
const SLOWEST: usize = 8;

// ---- settings ----

#[derive(Debug, Clone)]
struct Settings {
    concurrency: usize,
    duration: Duration,
    stream_percent: u64,
    max_rss_growth_kib: u64,
    rust_log: String,
    /// An Envoy bootstrap to use instead of `envoy/envoy.yaml`.
    envoy_config: Option<PathBuf>,
}

fn env_num(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{name}={v}: expected a whole number ({e})")),
        _ => default,
    }
}

impl Settings {
    fn from_env() -> Settings {
        let settings = Settings {
            concurrency: usize::try_from(env_num("LOAD_CONCURRENCY", 20)).unwrap(),
            duration: Duration::from_secs(env_num("LOAD_SECONDS", 10)),
            stream_percent: env_num("LOAD_STREAM_PERCENT", 50),
            max_rss_growth_kib: env_num("LOAD_MAX_RSS_GROWTH_MIB", 32) * 1024,
            rust_log: std::env::var("LOAD_RUST_LOG").unwrap_or_else(|_| "warn".into()),
            envoy_config: std::env::var_os("LOAD_ENVOY_CONFIG")
                .filter(|p| !p.is_empty())
                .map(PathBuf::from),
        };
        assert!(settings.concurrency > 0, "LOAD_CONCURRENCY must be > 0");
        assert!(!settings.duration.is_zero(), "LOAD_SECONDS must be > 0");
        assert!(
            settings.stream_percent <= 100,
            "LOAD_STREAM_PERCENT is a percentage"
        );
        settings
    }

    /// RSS growth is measured from this point of the run: allocator pools and the runtime's
    /// buffers grow to the load first.
    fn warm_up(&self) -> Duration {
        (self.duration / 10).clamp(Duration::from_secs(2), Duration::from_secs(30))
    }
}

/// The Envoy bootstrap: `envoy/envoy.yaml`, or `LOAD_ENVOY_CONFIG`, adapted the way the
/// harness adapts `envoy.yaml` (listener on 127.0.0.1 port 0, admin on port 0, the given
/// ports), so the same placeholders must each occur exactly once.
///
/// Module mode (`RESPONSES_E2E_MODE=module`, `tests/common/stack.rs`): `envoy/envoy-module.yaml`
/// with the module's default settings, and no processor (`extproc_port` is `None`).
fn envoy_config(settings: &Settings, upstream_port: u16, extproc_port: Option<u16>) -> String {
    let Some(extproc_port) = extproc_port else {
        let ports = common::envoy::Ports {
            upstream: upstream_port,
            extproc: 0,
            listener: 0,
            ws: 1,
            calls: 0,
            otlp: 1,
        };
        assert!(
            settings.envoy_config.is_none(),
            "LOAD_ENVOY_CONFIG is for ext_proc mode"
        );
        return common::stack::module_bootstrap("{}", ports);
    };
    let Some(path) = &settings.envoy_config else {
        return common::envoy::test_config(upstream_port, extproc_port);
    };
    let config = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("LOAD_ENVOY_CONFIG={}: {e}", path.display()));
    let source = format!("LOAD_ENVOY_CONFIG={}", path.display());
    common::envoy::substitute(&config, &source, upstream_port, extproc_port)
}

/// The shipped bootstrap of this mode.
fn shipped_config() -> &'static str {
    match common::mode() {
        common::Mode::ExtProc => "envoy/envoy.yaml",
        common::Mode::Module => "envoy/envoy-module.yaml",
    }
}

// ---- the processes ----

/// `VmRSS` of a process, in KiB.
fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// CPU time (user + system) a process has used so far. `/proc/<pid>/stat` counts in
/// USER_HZ ticks, 100 per second on Linux.
fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14,
    // stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(Duration::from_millis(ticks * 10))
}

/// The machine's (ListenOverflows, TCPSynRetrans) counters: a full accept queue drops SYNs,
/// which the client retransmits after 1 s, 3 s, 7 s: latency outliers without errors.
fn tcp_counters() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/net/netstat").ok()?;
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let pairs: BTreeMap<&str, u64> = names
            .split_whitespace()
            .zip(values.split_whitespace())
            .filter_map(|(n, v)| Some((n, v.parse().ok()?)))
            .collect();
        return Some((*pairs.get("ListenOverflows")?, *pairs.get("TCPSynRetrans")?));
    }
    None
}

/// `/proc/loadavg`'s 1-minute load average.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}

/// The pid of the Envoy started by the harness: the process whose command line holds its
/// config path (the harness does not expose the child).
fn envoy_pid(envoy: &Envoy) -> Option<u32> {
    let config = envoy.dir().join("envoy.yaml");
    let config = config.to_str()?;
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            cmdline
                .split(|b| *b == 0)
                .any(|arg| arg == config.as_bytes())
                .then_some(pid)
        })
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

// ---- one request ----

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Json,
    Stream,
}

/// What went wrong with one request: a category (counted) and a description (sampled).
struct Failure {
    category: String,
    detail: String,
}

fn fail(category: &str, detail: impl Into<String>) -> Failure {
    Failure {
        category: category.to_string(),
        detail: detail.into(),
    }
}

/// Timings of one successful request.
struct Timing {
    total: Duration,
    /// Streams: time to the first `response.output_text.delta`.
    first_delta: Option<Duration>,
}

fn expected_text(input: &str) -> String {
    format!("Hello! This is the demo upstream. You said: {input}")
}

/// The text of the first output message of a response object.
fn output_text(response: &Value) -> Option<&str> {
    response["output"]
        .as_array()?
        .iter()
        .find(|item| item["type"] == "message")?["content"][0]["text"]
        .as_str()
}

fn send_error(e: &reqwest::Error) -> Failure {
    let category = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect error"
    } else if e.is_body() || e.is_decode() {
        "body read error"
    } else {
        "request error"
    };
    // The source chain says what happened (reset, refused, ...).
    let mut detail = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        detail.push_str(&format!(": {s}"));
        source = s.source();
    }
    fail(category, detail)
}

async fn send(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
) -> Result<reqwest::Response, Failure> {
    let response = client
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|e| send_error(&e))?;
    let status = response.status().as_u16();
    if status != 200 {
        let text = response.text().await.unwrap_or_default();
        return Err(fail(
            &format!("HTTP {status}"),
            format!("HTTP {status}: {}", truncate(&text, 300)),
        ));
    }
    Ok(response)
}

/// The last `max` bytes of `s` (at a char boundary).
fn tail(s: &str, max: usize) -> &str {
    let mut start = s.len().saturating_sub(max);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    &s[start..]
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((end, _)) => &s[..end],
        None => s,
    }
}

fn content_type(response: &reqwest::Response) -> String {
    response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// A non-streamed request; `first`: also validate the answer against the OpenResponses schema.
async fn json_request(
    client: &reqwest::Client,
    url: &str,
    input: &str,
    first: bool,
) -> Result<Timing, Failure> {
    let started = Instant::now();
    let response = send(client, url, &json!({"model": "load", "input": input})).await?;
    let ct = content_type(&response);
    if !ct.starts_with("application/json") {
        return Err(fail(
            "wrong content-type",
            format!("json: content-type {ct}"),
        ));
    }
    let body = response.bytes().await.map_err(|e| send_error(&e))?;
    let total = started.elapsed();
    let value: Value = serde_json::from_slice(&body).map_err(|e| {
        fail(
            "invalid JSON",
            format!(
                "{e}: {}",
                String::from_utf8_lossy(&body[..body.len().min(300)])
            ),
        )
    })?;
    if value["object"] != "response" || value["status"] != "completed" {
        return Err(fail(
            "not a completed response",
            truncate(&value.to_string(), 300).to_string(),
        ));
    }
    if output_text(&value) != Some(expected_text(input).as_str()) {
        return Err(fail(
            "wrong answer",
            format!(
                "json for {input:?}: {:?}",
                output_text(&value).unwrap_or("<none>")
            ),
        ));
    }
    if first {
        assert_valid("ResponseResource", &value);
    }
    Ok(Timing {
        total,
        first_delta: None,
    })
}

const DELTA: &[u8] = b"response.output_text.delta";

/// A streamed request; `first`: also validate every event against the OpenResponses schema.
async fn stream_request(
    client: &reqwest::Client,
    url: &str,
    input: &str,
    first: bool,
) -> Result<Timing, Failure> {
    let started = Instant::now();
    let mut response = send(
        client,
        url,
        &json!({"model": "load", "input": input, "stream": true}),
    )
    .await?;
    let ct = content_type(&response);
    if !ct.starts_with("text/event-stream") {
        return Err(fail(
            "wrong content-type",
            format!("stream: content-type {ct}"),
        ));
    }
    let mut body: Vec<u8> = Vec::with_capacity(8192);
    let mut first_delta = None;
    loop {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let searched = body.len().saturating_sub(DELTA.len());
                body.extend_from_slice(&chunk);
                if first_delta.is_none()
                    && body[searched..].windows(DELTA.len()).any(|w| w == DELTA)
                {
                    first_delta = Some(started.elapsed());
                }
            }
            Ok(None) => break,
            Err(e) => {
                let mut failure = send_error(&e);
                failure.detail = format!(
                    "{} after {} bytes: ...{}",
                    failure.detail,
                    body.len(),
                    String::from_utf8_lossy(&body[body.len().saturating_sub(200)..]),
                );
                return Err(failure);
            }
        }
    }
    let total = started.elapsed();
    let body = String::from_utf8(body).map_err(|e| fail("invalid body", format!("{e}")))?;
    check_stream(&body, input)?;
    if first {
        assert_valid_sse(&body);
    }
    Ok(Timing {
        total,
        first_delta: Some(first_delta.ok_or_else(|| fail("stream: no delta", "no delta"))?),
    })
}

/// Every event JSON with increasing sequence numbers, the deltas and the final response carry
/// the expected text, the stream ends with `response.completed` then `[DONE]`.
fn check_stream(body: &str, input: &str) -> Result<(), Failure> {
    let end = || tail(body, 300).to_string();
    if !body.ends_with("data: [DONE]\n\n") {
        return Err(fail("stream: no [DONE]", end()));
    }
    let events = parse_sse(body);
    let Some((done, events)) = events.split_last() else {
        return Err(fail("stream: no events", end()));
    };
    if done.data != "[DONE]" {
        return Err(fail("stream: no [DONE]", end()));
    }
    let mut text = String::new();
    let mut last: Option<Value> = None;
    for (i, event) in events.iter().enumerate() {
        let value: Value = serde_json::from_str(&event.data).map_err(|e| {
            fail(
                "stream: non-JSON event",
                format!("{e}: {}", truncate(&event.data, 300)),
            )
        })?;
        if value["sequence_number"].as_u64() != Some(i as u64) {
            return Err(fail(
                "stream: sequence_number",
                format!("event {i}: {}", truncate(&event.data, 300)),
            ));
        }
        if value["type"] == "response.output_text.delta" {
            text.push_str(value["delta"].as_str().unwrap_or_default());
        }
        last = Some(value);
    }
    let last = last.unwrap_or_default();
    if last["type"] != "response.completed" {
        return Err(fail(
            "stream: no response.completed",
            format!("last event: {}", truncate(&last.to_string(), 300)),
        ));
    }
    let expected = expected_text(input);
    if text != expected || output_text(&last["response"]) != Some(expected.as_str()) {
        return Err(fail(
            "wrong answer",
            format!("stream for {input:?}: deltas {text:?}"),
        ));
    }
    Ok(())
}

// ---- the run ----

#[derive(Default)]
struct Outcome {
    ok: BTreeMap<Kind, u64>,
    total: BTreeMap<Kind, Vec<Duration>>,
    first_delta: Vec<Duration>,
    errors: BTreeMap<String, u64>,
    samples: Vec<String>,
    /// The slowest successful requests: (time to the full answer, description).
    slowest: Vec<(Duration, String)>,
}

impl Outcome {
    fn merge(&mut self, other: Outcome) {
        for (k, n) in other.ok {
            *self.ok.entry(k).or_default() += n;
        }
        for (k, v) in other.total {
            self.total.entry(k).or_default().extend(v);
        }
        self.first_delta.extend(other.first_delta);
        for (k, n) in other.errors {
            *self.errors.entry(k).or_default() += n;
        }
        for s in other.samples {
            if self.samples.len() < ERROR_SAMPLES {
                self.samples.push(s);
            }
        }
        for (total, what) in other.slowest {
            self.note_slow(total, || what);
        }
    }

    /// Keeps the [`SLOWEST`] slowest requests.
    fn note_slow(&mut self, total: Duration, what: impl FnOnce() -> String) {
        if self.slowest.len() == SLOWEST && self.slowest.last().is_some_and(|(t, _)| *t >= total) {
            return;
        }
        self.slowest.push((total, what()));
        self.slowest
            .sort_by_key(|(total, _)| std::cmp::Reverse(*total));
        self.slowest.truncate(SLOWEST);
    }

    fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// Nearest-rank percentile of sorted durations.
fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn summary(durations: &mut [Duration]) -> String {
    durations.sort_unstable();
    format!(
        "p50 {}, p99 {}, max {}",
        ms(percentile(durations, 50.0)),
        ms(percentile(durations, 99.0)),
        ms(durations.last().copied().unwrap_or_default())
    )
}

/// What the clients share.
struct Run {
    client: reqwest::Client,
    url: String,
    /// When the load started, and after which no request starts.
    started: Instant,
    deadline: Instant,
    stream_percent: u64,
    /// Requests started (decides each one's kind).
    sequence: AtomicU64,
    /// Requests done and failed so far (for the progress lines).
    done: AtomicU64,
    failed: AtomicU64,
}

/// One client: one request at a time until the deadline.
async fn client_loop(id: usize, run: Arc<Run>) -> Outcome {
    let Run {
        client,
        url,
        started,
        deadline,
        stream_percent,
        sequence,
        done,
        failed,
    } = &*run;
    let (deadline, stream_percent) = (*deadline, *stream_percent);
    let mut outcome = Outcome::default();
    let mut n = 0u64;
    while Instant::now() < deadline {
        n += 1;
        // Spread streamed requests evenly over the global sequence.
        let seq = sequence.fetch_add(1, Ordering::Relaxed);
        let kind = if (seq + 1) * stream_percent / 100 != seq * stream_percent / 100 {
            Kind::Stream
        } else {
            Kind::Json
        };
        let input = format!("load c{id} r{n}");
        // The first request of client 0 of each kind is also validated against the schema.
        let first = id == 0 && n <= 2;
        let began = Instant::now();
        let result = match kind {
            Kind::Json => json_request(client, url, &input, first).await,
            Kind::Stream => stream_request(client, url, &input, first).await,
        };
        match result {
            Ok(timing) => {
                done.fetch_add(1, Ordering::Relaxed);
                *outcome.ok.entry(kind).or_default() += 1;
                outcome.total.entry(kind).or_default().push(timing.total);
                outcome.first_delta.extend(timing.first_delta);
                outcome.note_slow(timing.total, || {
                    format!(
                        "{kind:?} {input}: {} (started at +{:.1} s{})",
                        ms(timing.total),
                        began.duration_since(*started).as_secs_f64(),
                        timing
                            .first_delta
                            .map(|d| format!(", first delta {}", ms(d)))
                            .unwrap_or_default()
                    )
                });
            }
            Err(failure) => {
                failed.fetch_add(1, Ordering::Relaxed);
                *outcome.errors.entry(failure.category).or_default() += 1;
                if outcome.samples.len() < ERROR_SAMPLES {
                    outcome
                        .samples
                        .push(format!("{kind:?} {input}: {}", failure.detail));
                }
            }
        }
    }
    outcome
}

/// Processor RSS samples over the run (KiB).
#[derive(Default)]
struct Rss {
    start: u64,
    warm: Option<u64>,
    peak: u64,
    end: u64,
    after: u64,
}

/// Selected Envoy counters (non-zero ones), for diagnosing errors.
async fn envoy_stats(client: &reqwest::Client, envoy: &Envoy) -> String {
    let url = envoy.admin_url(
        "/stats?usedonly&filter=(ext_proc\\.|overflow|cx_total|rq_total|rq_5xx|connect_fail\
         |rq_timeout|with_active_rq|cx_active|rq_active|max_requests|remaining)",
    );
    match client.get(url).send().await {
        Ok(r) => r
            .text()
            .await
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.ends_with(": 0") && !l.contains("admin"))
            .map(|l| format!("    {l}"))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("    (admin API: {e})"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load() {
    let settings = Settings::from_env();
    let demo = Processor::spawn(Spawn {
        what: "demo-upstream",
        program: env!("CARGO_BIN_EXE_demo-upstream"),
        env: &[("RUST_LOG", "warn")],
        ..Spawn::default()
    });
    let mut processor = match common::mode() {
        common::Mode::ExtProc => Some(Processor::spawn(Spawn {
            env: &[("RUST_LOG", &settings.rust_log)],
            ..Spawn::default()
        })),
        common::Mode::Module => None,
    };
    let config = envoy_config(
        &settings,
        demo.port(),
        processor.as_ref().map(Processor::port),
    );
    let mut envoy = tokio::task::block_in_place(|| Envoy::start_with_config(&config));
    let envoy_pid = envoy_pid(&envoy);
    // The translator whose memory is watched: the processor, or (module mode) Envoy itself.
    let pid = match &processor {
        Some(p) => p.pid(),
        None => envoy_pid.expect("Envoy's pid"),
    };
    let translator_log = processor
        .as_ref()
        .map_or(envoy.log_path().to_path_buf(), |p| {
            p.log_path().to_path_buf()
        });

    // One client for everyone (its pool holds a connection per concurrent request: HTTP/1.1).
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(settings.concurrency)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .expect("reqwest client");

    let mut rss = Rss {
        start: rss_kib(pid).expect("processor RSS"),
        ..Rss::default()
    };
    let envoy_rss_start = envoy_pid.and_then(rss_kib);
    let cpu_start = (cpu_time(pid), envoy_pid.and_then(cpu_time));
    let load_start = load_average();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    rss.peak = rss.start;
    eprintln!(
        "load: {} clients for {:?} ({}% streamed), processor pid {pid} RUST_LOG={}, \
         processor RSS at start {}, Envoy config {}",
        settings.concurrency,
        settings.duration,
        settings.stream_percent,
        settings.rust_log,
        mib(rss.start),
        settings
            .envoy_config
            .as_ref()
            .map_or(shipped_config().into(), |p| p.display().to_string())
    );

    let started = Instant::now();
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let deadline = started + settings.duration;
    let run = Arc::new(Run {
        client: client.clone(),
        url: envoy.url("/v1/responses"),
        started,
        deadline,
        stream_percent: settings.stream_percent,
        sequence: AtomicU64::new(0),
        done: AtomicU64::new(0),
        failed: AtomicU64::new(0),
    });
    let clients: Vec<_> = (0..settings.concurrency)
        .map(|id| tokio::spawn(client_loop(id, run.clone())))
        .collect();

    // Sample the processor's RSS every second while the load runs; print progress.
    let progress_every = (settings.duration.as_secs() / 10).clamp(5, 60);
    let mut second = 0u64;
    let tcp_start = tcp_counters();
    // Requests finished in each sampling interval: (fewest, at), (most, at).
    let (mut last_done, mut slowest_second, mut fastest_second) = (0u64, None, None);
    // The longest this loop overslept (and when): if it is seconds, the test process itself
    // was not scheduled, so a stall seen in the answers is the machine's, not the processor's.
    let mut oversleep = (Duration::ZERO, 0u64);
    while Instant::now() < deadline {
        let nap = Duration::from_secs(1).min(deadline - Instant::now());
        let before = Instant::now();
        tokio::time::sleep(nap).await;
        let late = before.elapsed().saturating_sub(nap);
        if late > oversleep.0 {
            oversleep = (late, started.elapsed().as_secs());
        }
        second += 1;
        let now = rss_kib(pid).unwrap_or(0);
        rss.peak = rss.peak.max(now);
        rss.end = now;
        let total_done = run.done.load(Ordering::Relaxed) + run.failed.load(Ordering::Relaxed);
        let in_second = (total_done - last_done, started.elapsed().as_secs());
        last_done = total_done;
        // The first interval ramps up and the last may be short: not counted.
        if second > 1 && Instant::now() < deadline {
            if slowest_second.is_none_or(|(n, _)| in_second.0 < n) {
                slowest_second = Some(in_second);
            }
            if fastest_second.is_none_or(|(n, _)| in_second.0 > n) {
                fastest_second = Some(in_second);
            }
        }
        if rss.warm.is_none() && started.elapsed() >= settings.warm_up() {
            rss.warm = Some(now);
        }
        if second % progress_every == 0 {
            eprintln!(
                "load: {:>4}s  {} done, {} errors, processor RSS {}",
                started.elapsed().as_secs(),
                run.done.load(Ordering::Relaxed),
                run.failed.load(Ordering::Relaxed),
                mib(now)
            );
        }
    }
    let envoy_rss_end = envoy_pid.and_then(rss_kib);
    let tcp_end = tcp_counters();
    let load_end = load_average();
    let mut outcome = Outcome::default();
    for c in clients {
        outcome.merge(c.await.expect("client task"));
    }
    let elapsed = started.elapsed();
    // Idle again: what the processor keeps.
    tokio::time::sleep(Duration::from_secs(2)).await;
    rss.after = rss_kib(pid).unwrap_or(0);
    let cpu_end = (cpu_time(pid), envoy_pid.and_then(cpu_time));
    let stats = envoy_stats(&client, &envoy).await;
    let running = match &mut processor {
        Some(p) => p.is_running(),
        None => envoy.is_running(),
    };

    // ---- report ----
    let requests: u64 = outcome.ok.values().sum::<u64>() + outcome.error_count();
    let mut report = String::new();
    let mut line = |s: String| {
        report.push_str(&s);
        report.push('\n');
    };
    line(format!(
        "== load report ({:?} mode: the processor's figures are Envoy's with the module): {} \
         clients, {:.1} s of load ({:.1} s with the last answers), {}% streamed, processor \
         RUST_LOG={}, Envoy config {}",
        common::mode(),
        settings.concurrency,
        settings.duration.as_secs_f64(),
        elapsed.as_secs_f64(),
        settings.stream_percent,
        settings.rust_log,
        settings
            .envoy_config
            .as_ref()
            .map_or(shipped_config().into(), |p| p.display().to_string())
    ));
    line(format!(
        "machine: {cores} cores, 1-min load average {load_start} at the start, {load_end} at the \
         end of the load; load started at unix time {started_unix:.1}; the test's 1 s sampling \
         loop overslept by at most {} (at +{} s)",
        ms(oversleep.0),
        oversleep.1
    ));
    line(format!(
        "requests: {requests} ({:.0}/s), ok {}, errors {}",
        requests as f64 / elapsed.as_secs_f64(),
        requests - outcome.error_count(),
        outcome.error_count()
    ));
    for kind in [Kind::Json, Kind::Stream] {
        let ok = outcome.ok.get(&kind).copied().unwrap_or(0);
        let mut total = outcome.total.remove(&kind).unwrap_or_default();
        line(format!(
            "{:<6} ok {ok:>8}  full answer: {}",
            match kind {
                Kind::Json => "json",
                Kind::Stream => "stream",
            },
            summary(&mut total)
        ));
    }
    line(format!(
        "stream first delta: {}",
        summary(&mut outcome.first_delta)
    ));
    if let (Some((low, low_at)), Some((high, high_at))) = (slowest_second, fastest_second) {
        line(format!(
            "answers per 1 s interval: fewest {low} (at +{low_at} s), most {high} (at +{high_at} s)"
        ));
    }
    for (_, what) in &outcome.slowest {
        line(format!("slow: {what}"));
    }
    let warm = rss.warm.unwrap_or(rss.end);
    line(format!(
        "processor RSS (VmRSS): start {} (idle), after {}s warm-up {}, peak {}, end {}, \
         2 s after the load {}; growth after warm-up {:+.1} MiB",
        mib(rss.start),
        settings.warm_up().as_secs(),
        mib(warm),
        mib(rss.peak),
        mib(rss.end),
        mib(rss.after),
        (rss.end as f64 - warm as f64) / 1024.0
    ));
    if let (Some(a), Some(b)) = (envoy_rss_start, envoy_rss_end) {
        line(format!("envoy RSS: start {}, end {}", mib(a), mib(b)));
    }
    for (who, start, end) in [
        ("processor", cpu_start.0, cpu_end.0),
        ("envoy", cpu_start.1, cpu_end.1),
    ] {
        if let (Some(a), Some(b)) = (start, end) {
            let used = b.saturating_sub(a);
            line(format!(
                "{who} CPU time: {:.1} s ({:.0} % of one core; {:.2} ms per request)",
                used.as_secs_f64(),
                100.0 * used.as_secs_f64() / elapsed.as_secs_f64(),
                1000.0 * used.as_secs_f64() / requests.max(1) as f64
            ));
        }
    }
    if let (Some(a), Some(b)) = (tcp_start, tcp_end) {
        line(format!(
            "TCP during the load (whole machine, /proc/net/netstat): ListenOverflows +{}, \
             TCPSynRetrans +{}",
            b.0.saturating_sub(a.0),
            b.1.saturating_sub(a.1)
        ));
    }
    for (category, n) in &outcome.errors {
        line(format!("error {category}: {n}"));
    }
    for s in &outcome.samples {
        line(format!("  e.g. {s}"));
    }
    line(format!("envoy counters (non-zero):\n{stats}"));
    eprintln!("{report}");
    let report_path = std::env::var_os("LOAD_REPORT");
    if let Some(path) = report_path.filter(|p| !p.is_empty()) {
        std::fs::write(&path, &report).expect("write LOAD_REPORT");
    }

    // ---- verdict ----
    assert!(
        running,
        "the translator exited during the run:\n{}",
        log_tail(&translator_log, 4000)
    );
    assert_eq!(
        outcome.error_count(),
        0,
        "errors under load (see the report above); translator log tail:\n{}\ndemo log tail:\n{}\n\
         envoy log tail:\n{}",
        log_tail(&translator_log, 2000),
        log_tail(demo.log_path(), 1000),
        tail(&envoy.logs(), 2000)
    );
    for kind in [Kind::Json, Kind::Stream] {
        let expected = match kind {
            Kind::Json => settings.stream_percent < 100,
            Kind::Stream => settings.stream_percent > 0,
        };
        if expected {
            assert!(
                outcome.ok.get(&kind).copied().unwrap_or(0) > 0,
                "no {kind:?} request completed"
            );
        }
    }
    let growth = rss.end.saturating_sub(warm);
    assert!(
        growth <= settings.max_rss_growth_kib,
        "the translator's RSS grew by {} after the warm-up (limit {}: LOAD_MAX_RSS_GROWTH_MIB)",
        mib(growth),
        mib(settings.max_rss_growth_kib)
    );
}
