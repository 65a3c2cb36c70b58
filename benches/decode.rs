//! The worst time a request body of each shape holds the translator's thread while it is
//! decoded (core/src/request_encoding.rs): plain JSON at the cap in each coding, and the
//! hostile shapes of tests/common/compressed.rs (bodies of nothing that a decoder must read
//! through, small blocks each with its own codes, deflate blocks of full codes, brotli
//! meta-blocks declaring 256 block types and trees of each kind, a block switch before every
//! brotli symbol, a layer of nothing inside another), each as large as the bounds let it be:
//! the worst shapes found are kept here. Every body goes through the core's `Decoder` as the
//! module gives it (64 KiB pieces) and as ext_proc does (whole), at the default
//! `max_request_bytes` (16 MiB); each is decoded RUNS times and the worst is kept.
//!
//! Run: `cargo bench --bench decode` (about two minutes). Prints a Markdown table: the
//! outcome, the encoded size, the worst on-CPU time of the decoding thread (from
//! /proc/thread-self/schedstat: what other processes take of the machine is not counted)
//! and the worst wall time. Results: docs/performance.md#decoding-compressed-requests.

#[path = "../tests/common/compressed.rs"]
mod compressed;

use std::time::{Duration, Instant};

use compressed::{BrotliHeader, EmptyBlock};
use responses_core::request_encoding::{codings, Decoder};

const CAP: usize = 16 << 20;
const RUNS: usize = 3;
/// The pieces the module hands the core (Envoy's reads).
const PIECE: usize = 64 << 10;

/// Time this thread has spent on a CPU.
fn on_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let ns: u64 = stat
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("on-CPU time");
    Duration::from_nanos(ns)
}

/// Decodes `body` once, in pieces of `piece` bytes: the outcome.
fn decode(content_encoding: &str, body: &[u8], piece: usize) -> String {
    let list = match codings(Some(content_encoding)) {
        Ok(list) => list,
        Err(e) => return format!("{} `{}`", e.status, e.code.expect("a code").as_str()),
    };
    let mut decoder = Decoder::new(&list, CAP);
    let pushed = body.chunks(piece).try_for_each(|p| decoder.push(p));
    match pushed.and_then(|()| decoder.finish()) {
        Ok(decoded) => format!("ok, {} MiB", decoded.len() >> 20),
        Err(e) => format!("{} `{}`", e.status, e.code.expect("a code").as_str()),
    }
}

/// A body shape, made when it is measured.
struct Shape {
    name: String,
    content_encoding: &'static str,
    body: Box<dyn Fn() -> Vec<u8>>,
}

fn shape(
    name: impl Into<String>,
    content_encoding: &'static str,
    body: impl Fn() -> Vec<u8> + 'static,
) -> Shape {
    Shape {
        name: name.into(),
        content_encoding,
        body: Box::new(body),
    }
}

/// A shape named in a table: its name, its `content-encoding`, how to make it.
type Listed = (&'static str, &'static str, fn() -> Vec<u8>);

fn shapes() -> Vec<Shape> {
    let mut out = Vec::new();
    for coding in compressed::CODINGS {
        out.push(shape("JSON text at the cap", coding, move || {
            compressed::compress(coding, &compressed::request_of_words(CAP))
        }));
        out.push(shape("JSON of base64 at the cap", coding, move || {
            compressed::compress(coding, &compressed::request_of_base64(CAP))
        }));
    }
    let single: [Listed; 22] = [
        ("empty members", "gzip", || {
            compressed::gzip_empty_members(CAP)
        }),
        ("empty fixed blocks", "gzip", || {
            compressed::gzip_empty_blocks(EmptyBlock::Fixed, CAP)
        }),
        ("empty dynamic blocks", "gzip", || {
            compressed::gzip_empty_blocks(EmptyBlock::Dynamic, CAP)
        }),
        ("flushed every byte", "gzip", || {
            compressed::flushed("gzip", 1, CAP)
        }),
        ("blocks of full codes", "gzip", || {
            compressed::gzip_full_code_blocks(CAP)
        }),
        ("empty stored blocks", "deflate", || {
            compressed::deflate_empty_blocks(EmptyBlock::Stored, CAP)
        }),
        ("empty fixed blocks", "deflate", || {
            compressed::deflate_empty_blocks(EmptyBlock::Fixed, CAP)
        }),
        ("empty dynamic blocks", "deflate", || {
            compressed::deflate_empty_blocks(EmptyBlock::Dynamic, CAP)
        }),
        ("blocks of full codes", "deflate", || {
            compressed::deflate_full_code_blocks(CAP)
        }),
        ("empty frames", "zstd", || {
            compressed::zstd_empty_frames(CAP)
        }),
        ("empty blocks", "zstd", || {
            compressed::zstd_empty_blocks(CAP)
        }),
        ("empty skippable frames", "zstd", || {
            compressed::zstd_skippable_frames(0, CAP)
        }),
        ("flushed every byte", "zstd", || {
            compressed::flushed("zstd", 1, CAP)
        }),
        ("metadata blocks", "br", || {
            compressed::brotli_metadata_blocks(CAP)
        }),
        ("flushed every 16 bytes", "br", || {
            compressed::flushed("br", 16, CAP)
        }),
        (
            "256 block types a meta-block, 4 MiB (the issue's)",
            "br",
            || compressed::brotli_headers(BrotliHeader::BlockTypes, 4 << 20),
        ),
        ("256 block types a meta-block", "br", || {
            compressed::brotli_headers(BrotliHeader::BlockTypes, CAP)
        }),
        ("256 trees of full codes a meta-block", "br", || {
            compressed::brotli_headers(BrotliHeader::FullCodes, CAP)
        }),
        ("a block switch before every symbol", "br", || {
            compressed::brotli_switches(CAP / 5)
        }),
        (
            "the issue's, in gzip (20 KB on the wire)",
            "br, gzip",
            || {
                compressed::compress(
                    "gzip",
                    &compressed::brotli_headers(BrotliHeader::BlockTypes, 4 << 20),
                )
            },
        ),
        (
            "skippable frame of 4 GiB in zstd (the issue's)",
            "zstd, zstd",
            || compressed::zstd_of_skippable(64 << 20),
        ),
        ("three codings", "gzip, gzip, gzip", || {
            compressed::compress("gzip", &compressed::gzip_empty_members(1 << 20))
        }),
    ];
    out.extend(single.map(|(name, content_encoding, body)| shape(name, content_encoding, body)));
    // A layer of the inner coding's costliest shape, made by zstd from little: larger than
    // the work budget lets the inner decoder read.
    const OVER: usize = 2 * CAP + CAP / 8 + (1 << 20);
    let stacked: [Listed; 8] = [
        ("metadata blocks", "br, zstd", || {
            compressed::brotli_metadata_blocks(OVER)
        }),
        ("256 block types a meta-block", "br, zstd", || {
            compressed::brotli_headers(BrotliHeader::BlockTypes, OVER)
        }),
        ("blocks of full codes", "gzip, zstd", || {
            compressed::gzip_full_code_blocks(OVER)
        }),
        ("a block switch before every symbol", "br, zstd", || {
            compressed::brotli_switches(CAP / 5)
        }),
        ("empty dynamic blocks", "gzip, zstd", || {
            compressed::gzip_empty_blocks(EmptyBlock::Dynamic, OVER)
        }),
        ("empty members", "gzip, zstd", || {
            compressed::gzip_empty_members(OVER)
        }),
        ("empty frames", "zstd, zstd", || {
            compressed::zstd_empty_frames(OVER)
        }),
        ("flushed every 16 bytes", "br, zstd", || {
            compressed::flushed("br", 16, OVER / 8 + (1 << 20))
        }),
    ];
    for (name, content_encoding, layer) in stacked {
        out.push(shape(
            format!("{name} in zstd"),
            content_encoding,
            move || compressed::zstd_of(|w| w.write_all(&layer()).expect("zstd")),
        ));
    }
    out
}

fn main() {
    // `cargo bench` passes `--bench`; any other argument filters the shapes by name.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    // Run by `cargo test --all-targets` (no `--bench`): the two cheap refusals only, once, so
    // that the tests check the bench still runs without paying for the 16 MiB shapes in a
    // debug build.
    let quick = !std::env::args().any(|a| a == "--bench");
    let cheap = |name: &str| name.contains("the issue's") || name.contains("three codings");
    println!("| content-encoding | shape | encoded | outcome | worst on CPU | worst wall |");
    println!("|---|---|---:|---|---:|---:|");
    let mut worst = Duration::ZERO;
    for s in shapes() {
        if filter
            .as_ref()
            .is_some_and(|f| !s.name.contains(f.as_str()))
        {
            continue;
        }
        if quick && filter.is_none() && !cheap(&s.name) {
            continue;
        }
        let body = (s.body)();
        let (mut cpu, mut wall, mut outcome) = (Duration::ZERO, Duration::ZERO, String::new());
        for run in 0..RUNS * 2 {
            let piece = if run % 2 == 0 {
                PIECE
            } else {
                body.len().max(1)
            };
            let (c0, w0) = (on_cpu(), Instant::now());
            outcome = decode(s.content_encoding, &body, piece);
            wall = wall.max(w0.elapsed());
            cpu = cpu.max(on_cpu() - c0);
        }
        worst = worst.max(cpu);
        println!(
            "| `{}` | {} | {:.1} MiB | {} | {} ms | {} ms |",
            s.content_encoding,
            s.name,
            body.len() as f64 / f64::from(1 << 20),
            outcome,
            cpu.as_millis(),
            wall.as_millis()
        );
    }
    println!("\nworst on CPU: {} ms", worst.as_millis());
}
