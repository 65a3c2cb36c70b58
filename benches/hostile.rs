//! Hostile compressed bodies through the real Envoy, in both modes, each with normal requests
//! sent beside it: how long each body takes to be answered, the CPU the serving process (the
//! processor, or Envoy in module mode) spends meanwhile, and what it does to the latency of
//! the others. `benches/decode.rs` measures the decoders alone; this measures what a client
//! sees, Envoy, the adapter and the answer included.
//!
//! The bodies (`tests/common/compressed.rs`): JSON in one coding and in two in every order
//! (the allowed depth), three in every order (one beyond), a body of nothing at the cap of each
//! shape a decoder must read through (empty gzip members and deflate blocks, zstd skippable
//! frames, brotli metadata), a layer of nothing beyond the work budget inside each coding, the
//! issue's `zstd, zstd` skippable-frame bomb, the costliest shapes of `benches/decode.rs`, and
//! a 16 MiB (the cap's) JSON body in each coding. While each is in flight, normal requests
//! (`{"model":"m","input":"hi"}`, answered by a scripted upstream) are sent one after another
//! on another connection; before the first body and after the last, QUIET of them alone give
//! the baseline.
//!
//! Run: `cargo bench --bench hostile` (ext_proc mode; add module mode with
//! `cargo build --release -p responses-module` and `RESPONSES_MODULE_DIR=target/release`).
//! An argument filters the cases by name. Prints a Markdown table; results:
//! docs/performance.md#hostile-input-through-envoy.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::compressed::{self, compress, BrotliHeader, EmptyBlock};
use common::{Mode, Reply, ScriptedUpstream, Stack};
use serde_json::json;

/// The default `max_request_bytes`, which the bodies are sized to.
const CAP: usize = 16 << 20;
/// Normal requests alone, before and after.
const QUIET: usize = 200;
/// Beyond the work budget (twice the cap and an eighth): a layer of nothing the inner decoder
/// would read.
const OVER: usize = 2 * CAP + CAP / 8 + (1 << 20);

/// One row: bodies sent one at a time, each with normal requests beside it.
struct Case {
    name: String,
    bodies: Vec<(String, Vec<u8>)>,
}

fn case(name: impl Into<String>, bodies: Vec<(String, Vec<u8>)>) -> Case {
    Case {
        name: name.into(),
        bodies,
    }
}

fn one(name: &str, content_encoding: &str, body: Vec<u8>) -> Case {
    case(name, vec![(content_encoding.to_owned(), body)])
}

/// The cases, made when they are run (some take a second to make).
fn cases() -> Vec<(String, Box<dyn Fn() -> Case>)> {
    let mut out: Vec<(String, Box<dyn Fn() -> Case>)> = Vec::new();
    let mut add = |name: &str, make: Box<dyn Fn() -> Case>| out.push((name.to_owned(), make));
    let plain = || {
        json!({"model": "m", "input": "a small request"})
            .to_string()
            .into_bytes()
    };
    add(
        "one coding, each",
        Box::new(move || {
            let bodies = compressed::CODINGS
                .map(|c| (c.to_owned(), compress(c, &plain())))
                .to_vec();
            case("one coding, each", bodies)
        }),
    );
    add(
        "two codings, every order",
        Box::new(move || {
            let mut bodies = Vec::new();
            for first in compressed::CODINGS {
                for second in compressed::CODINGS {
                    let body = compress(second, &compress(first, &plain()));
                    bodies.push((format!("{first}, {second}"), body));
                }
            }
            case("two codings, every order", bodies)
        }),
    );
    add(
        "three codings, every order",
        Box::new(move || {
            let mut bodies = Vec::new();
            for first in compressed::CODINGS {
                for second in compressed::CODINGS {
                    for third in compressed::CODINGS {
                        let body = compress(third, &compress(second, &compress(first, &plain())));
                        bodies.push((format!("{first}, {second}, {third}"), body));
                    }
                }
            }
            case("three codings, every order", bodies)
        }),
    );
    type Listed = (&'static str, &'static str, fn() -> Vec<u8>);
    let single: [Listed; 15] = [
        ("empty members at the cap", "gzip", || {
            compressed::gzip_empty_members(CAP)
        }),
        ("empty dynamic blocks at the cap", "gzip", || {
            compressed::gzip_empty_blocks(EmptyBlock::Dynamic, CAP)
        }),
        ("empty fixed blocks at the cap", "deflate", || {
            compressed::deflate_empty_blocks(EmptyBlock::Fixed, CAP)
        }),
        ("empty dynamic blocks at the cap", "deflate", || {
            compressed::deflate_empty_blocks(EmptyBlock::Dynamic, CAP)
        }),
        ("empty frames at the cap", "zstd", || {
            compressed::zstd_empty_frames(CAP)
        }),
        ("empty skippable frames at the cap", "zstd", || {
            compressed::zstd_skippable_frames(0, CAP)
        }),
        ("metadata blocks at the cap", "br", || {
            compressed::brotli_metadata_blocks(CAP)
        }),
        ("meta-blocks of 16 bytes", "br", || {
            compressed::flushed("br", 16, CAP / 4 + (1 << 20))
        }),
        ("blocks of full codes at the cap", "gzip", || {
            compressed::gzip_full_code_blocks(CAP)
        }),
        (
            "256 block types a meta-block, 4 MiB in gzip (the issue's)",
            "br, gzip",
            || {
                compress(
                    "gzip",
                    &compressed::brotli_headers(BrotliHeader::BlockTypes, 4 << 20),
                )
            },
        ),
        (
            "256 trees of full codes a meta-block at the cap",
            "br",
            || compressed::brotli_headers(BrotliHeader::FullCodes, CAP),
        ),
        ("a block switch before every symbol", "br", || {
            compressed::brotli_switches(CAP / 5)
        }),
        (
            "256 block types a meta-block in zstd, beyond the budget",
            "br, zstd",
            || {
                compressed::zstd_of(|w| {
                    let layer = compressed::brotli_headers(BrotliHeader::BlockTypes, OVER);
                    w.write_all(&layer).expect("zstd")
                })
            },
        ),
        (
            "skippable frame of 4 GiB in zstd (the issue's)",
            "zstd, zstd",
            || compressed::zstd_of_skippable(64 << 20),
        ),
        (
            "meta-blocks of 16 bytes in zstd, beyond the budget",
            "br, zstd",
            || {
                compressed::zstd_of(|w| {
                    let layer = compressed::flushed("br", 16, OVER / 8 + (1 << 20));
                    w.write_all(&layer).expect("zstd")
                })
            },
        ),
    ];
    for (name, coding, make) in single {
        add(name, Box::new(move || one(name, coding, make())));
    }
    for (name, coding, make) in [
        (
            "empty dynamic blocks in zstd, beyond the budget",
            "gzip, zstd",
            (|| compressed::gzip_empty_blocks(EmptyBlock::Dynamic, OVER)) as fn() -> Vec<u8>,
        ),
        (
            "empty members in zstd, beyond the budget",
            "gzip, zstd",
            || compressed::gzip_empty_members(OVER),
        ),
        (
            "blocks of full codes in zstd, beyond the budget",
            "gzip, zstd",
            || compressed::gzip_full_code_blocks(OVER),
        ),
    ] {
        add(
            name,
            Box::new(move || {
                let body = compressed::zstd_of(|w| w.write_all(&make()).expect("zstd"));
                one(name, coding, body)
            }),
        );
    }
    for inner in compressed::CODINGS {
        let name = format!("empty {inner} layer beyond the budget, in each coding");
        let named = name.clone();
        add(
            &name,
            Box::new(move || {
                let layer = compressed::empty_stream(inner, OVER);
                let bodies = compressed::CODINGS
                    .map(|outer| (format!("{inner}, {outer}"), compress(outer, &layer)))
                    .to_vec();
                case(named.clone(), bodies)
            }),
        );
    }
    for coding in compressed::CODINGS {
        // 4 KiB under the cap: the translated request is a little larger than the client's.
        let name = format!("JSON of base64 at the cap, {coding}");
        let named = name.clone();
        add(
            &name,
            Box::new(move || {
                let body = compress(coding, &compressed::request_of_base64(CAP - 4096));
                one(&named, coding, body)
            }),
        );
        let name = format!("JSON text at the cap, {coding}");
        let named = name.clone();
        add(
            &name,
            Box::new(move || {
                let body = compress(coding, &compressed::request_of_words(CAP - 4096));
                one(&named, coding, body)
            }),
        );
    }
    out
}

/// How a request was answered.
struct Answer {
    /// 0: no answer (the error in `code`).
    status: u16,
    /// The error envelope's code, if any.
    code: String,
    /// From the first byte sent to the last byte of the answer.
    took: Duration,
}

/// Posts `body` to `/v1/responses`.
async fn post(
    client: &reqwest::Client,
    url: &str,
    content_encoding: Option<&str>,
    body: Vec<u8>,
) -> Answer {
    let start = Instant::now();
    let mut request = client
        .post(url)
        .header("content-type", "application/json")
        .timeout(Duration::from_secs(120))
        .body(body);
    if let Some(coding) = content_encoding {
        request = request.header("content-encoding", coding);
    }
    let (status, code) = match request.send().await {
        Ok(response) => {
            let status = response.status().as_u16();
            let body = response.bytes().await.unwrap_or_default();
            let code = serde_json::from_slice::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
                .unwrap_or_default();
            (status, code)
        }
        Err(e) => (0, format!("{e}")),
    };
    Answer {
        status,
        code,
        took: start.elapsed(),
    }
}

fn normal() -> Vec<u8> {
    json!({"model": "m", "input": "hi"})
        .to_string()
        .into_bytes()
}

/// A normal request: its time, and whether it was answered 200 (a stall shows as a 504).
async fn normal_request(client: &reqwest::Client, url: &str) -> (Duration, bool) {
    let answer = post(client, url, None, normal()).await;
    if answer.status != 200 {
        eprintln!("a normal request: {} {}", answer.status, answer.code);
    }
    (answer.took, answer.status == 200)
}

async fn quiet(client: &reqwest::Client, url: &str, n: usize) -> Normals {
    let mut out = Normals::default();
    for _ in 0..n {
        out.add(normal_request(client, url).await);
    }
    out
}

/// The normal requests' times, and how many were not answered 200.
#[derive(Default)]
struct Normals {
    times: Vec<Duration>,
    failed: usize,
}

impl Normals {
    fn add(&mut self, (took, ok): (Duration, bool)) {
        self.times.push(took);
        self.failed += usize::from(!ok);
    }

    /// `n, p50 / p99 / max`.
    fn cells(&self) -> String {
        let failed = if self.failed > 0 {
            format!(" ({} not 200)", self.failed)
        } else {
            String::new()
        };
        format!(
            "{}{failed}, {} / {} / {}",
            self.times.len(),
            ms(percentile(&self.times, 0.5)),
            ms(percentile(&self.times, 0.99)),
            ms(percentile(&self.times, 1.0))
        )
    }
}

/// What one case did in one mode.
struct Outcome {
    /// Each distinct `status code` seen, with how many bodies ended so.
    answers: Vec<(String, usize)>,
    worst: Duration,
    worst_coding: String,
    /// The most CPU the serving process (the processor, or Envoy in module mode) spent while
    /// one body was in flight: the body's decoding, and the normal requests beside it.
    worst_cpu: Duration,
    beside: Normals,
}

/// CPU time a process has spent so far (user and system, `/proc/<pid>/stat`).
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("proc stat");
    // Fields after the command (which may hold spaces) from its closing parenthesis: utime and
    // stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')').expect("a command") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    static HZ: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| {
        let out = std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .expect("getconf");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .expect("clock ticks a second")
    });
    Duration::from_millis(ticks * 1000 / *HZ)
}

/// Sends each body of `case`, with normal requests one after another beside it until it is
/// answered (at least one).
async fn run(case: &Case, url: &str, pid: u32) -> Outcome {
    let (hostile_client, normal_client) = (common::client(), common::client());
    let mut outcome = Outcome {
        answers: Vec::new(),
        worst: Duration::ZERO,
        worst_coding: String::new(),
        worst_cpu: Duration::ZERO,
        beside: Normals::default(),
    };
    for (coding, body) in &case.bodies {
        let cpu_before = cpu(pid);
        let done = std::sync::atomic::AtomicBool::new(false);
        let hostile = async {
            let answer = post(&hostile_client, url, Some(coding), body.clone()).await;
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            answer
        };
        let beside = async {
            let mut normals = Normals::default();
            while normals.times.is_empty() || !done.load(std::sync::atomic::Ordering::Relaxed) {
                normals.add(normal_request(&normal_client, url).await);
            }
            normals
        };
        let (answer, times) = tokio::join!(hostile, beside);
        outcome.worst_cpu = outcome.worst_cpu.max(cpu(pid).saturating_sub(cpu_before));
        let took = answer.took;
        let answer = if answer.code.is_empty() {
            answer.status.to_string()
        } else {
            format!("{} `{}`", answer.status, answer.code)
        };
        match outcome.answers.iter_mut().find(|(a, _)| *a == answer) {
            Some((_, n)) => *n += 1,
            None => outcome.answers.push((answer, 1)),
        }
        if took > outcome.worst {
            outcome.worst = took;
            outcome.worst_coding = coding.clone();
        }
        outcome.beside.times.extend(times.times);
        outcome.beside.failed += times.failed;
    }
    outcome
}

fn percentile(xs: &[Duration], p: f64) -> Duration {
    let mut xs = xs.to_vec();
    xs.sort();
    xs[((xs.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// The modes to run: ext_proc, and module mode when its shared object is there.
fn modes() -> Vec<Mode> {
    let dir = std::env::var_os("RESPONSES_MODULE_DIR")
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| common::repo_root().join("target/e2e-module"));
    if dir.join("libresponses_module.so").is_file() {
        vec![Mode::ExtProc, Mode::Module]
    } else {
        eprintln!(
            "module mode skipped: no {}/libresponses_module.so (build it: \
             cargo build --release -p responses-module, RESPONSES_MODULE_DIR=target/release)",
            dir.display()
        );
        vec![Mode::ExtProc]
    }
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` does not: keep that run to
    // the cheapest case. Any other argument filters the cases by name.
    let quick = !std::env::args().any(|a| a == "--bench");
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let quiet_n = if quick { 5 } else { QUIET };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let upstream = ScriptedUpstream::start();
    upstream.set_default(|| {
        Reply::json(
            200,
            &json!({"id": "c1", "object": "chat.completion", "created": 1, "model": "m",
                "choices": [{"index": 0, "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "ok"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}),
        )
    });
    // The shipped bootstraps as they are (envoy/envoy.yaml, envoy/envoy-module.yaml): Envoy
    // with one worker, the processor with its defaults.
    let stacks: Vec<(Mode, Stack)> = modes()
        .into_iter()
        .map(|mode| (mode, Stack::start_in(mode, upstream.port(), &[], |c| c)))
        .collect();
    let urls: Vec<(String, u32)> = stacks
        .iter()
        .map(|(_, s)| (s.envoy.url("/v1/responses"), s.socket_server_pid()))
        .collect();
    let client = common::client();
    // One row per case, the modes side by side.
    println!(
        "| case | bodies | encoded | answers | ext_proc: worst time to the answer, CPU | beside: n, p50 / p99 / max | module: worst time to the answer, CPU | beside: n, p50 / p99 / max |"
    );
    println!("|---|---:|---:|---|---:|---|---:|---|");
    let row = |name: &str, cells: [String; 3], per_mode: &[(String, &Normals)]| {
        let [bodies, encoded, answers] = cells;
        let mut columns = Vec::new();
        for mode in [Mode::ExtProc, Mode::Module] {
            match stacks.iter().position(|(m, _)| *m == mode) {
                Some(i) => {
                    let (worst, normals) = &per_mode[i];
                    columns.push(worst.clone());
                    columns.push(normals.cells());
                }
                None => columns.extend(["—".to_owned(), "—".to_owned()]),
            }
        }
        println!(
            "| {name} | {bodies} | {encoded} | {answers} | {} |",
            columns.join(" | ")
        );
    };
    let baseline = |when: &str| {
        let quiet: Vec<Normals> = urls
            .iter()
            .map(|(url, _)| {
                runtime.block_on(async {
                    quiet(&client, url, 10).await;
                    quiet(&client, url, quiet_n).await
                })
            })
            .collect();
        let per_mode: Vec<(String, &Normals)> = quiet.iter().map(|n| (String::new(), n)).collect();
        row(&format!("quiet ({when})"), Default::default(), &per_mode);
    };
    baseline("before");
    let mut worst = Duration::ZERO;
    let mut worst_cpu = Duration::ZERO;
    for (name, make) in cases() {
        if filter.as_ref().is_some_and(|f| !name.contains(f.as_str()))
            || (quick && name != "one coding, each")
        {
            continue;
        }
        let case = make();
        let largest = case.bodies.iter().map(|(_, b)| b.len()).max().unwrap_or(0);
        let outcomes: Vec<Outcome> = urls
            .iter()
            .map(|(url, pid)| runtime.block_on(run(&case, url, *pid)))
            .collect();
        let several = case.bodies.len() > 1;
        let mut answers: Vec<String> = Vec::new();
        for outcome in &outcomes {
            worst = worst.max(outcome.worst);
            worst_cpu = worst_cpu.max(outcome.worst_cpu);
            let these: Vec<String> = outcome
                .answers
                .iter()
                .map(|(a, n)| {
                    if several {
                        format!("{n} × {a}")
                    } else {
                        a.clone()
                    }
                })
                .collect();
            let these = these.join(", ");
            if !answers.contains(&these) {
                answers.push(these);
            }
        }
        let per_mode: Vec<(String, &Normals)> = outcomes
            .iter()
            .map(|o| {
                let of = if several {
                    format!(" (`{}`)", o.worst_coding)
                } else {
                    String::new()
                };
                (
                    format!("{}{of}, CPU {}", ms(o.worst), ms(o.worst_cpu)),
                    &o.beside,
                )
            })
            .collect();
        let name = if several {
            case.name.clone()
        } else {
            format!("{} (`{}`)", case.name, case.bodies[0].0)
        };
        let cells = [
            case.bodies.len().to_string(),
            format!("{:.1} MiB", largest as f64 / f64::from(1 << 20)),
            // The modes' answers differ: both, ext_proc's first.
            answers.join(" / "),
        ];
        row(&name, cells, &per_mode);
    }
    baseline("after");
    println!(
        "\nworst time to an answer: {}; most CPU the serving process spent while one body was in flight: {}",
        ms(worst),
        ms(worst_cpu)
    );
}
