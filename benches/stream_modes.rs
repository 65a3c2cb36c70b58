//! STREAMED vs FULL_DUPLEX_STREAMED, measured through a real Envoy: the same upstream stream
//! (500 `chat.completion.chunk` frames, written without pauses) is translated with the
//! processor in each body mode. Reports time to the first text delta and to the end of the
//! stream, sequentially and with 16 concurrent clients. Run: `cargo bench --bench stream_modes`.
//! The choice it informs is recorded in envoy/envoy.yaml.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{Envoy, Processor, Reply, ScriptedUpstream};

const FRAMES: usize = 500;
const SEQUENTIAL: usize = 40;
const CONCURRENT: usize = 16;
const PER_CLIENT: usize = 8;

fn upstream_body() -> Vec<String> {
    let mut frames: Vec<String> = (0..FRAMES)
        .map(|i| {
            format!(
                "data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"word{i} \"}},\"finish_reason\":null}}]}}\n\n"
            )
        })
        .collect();
    frames.push(
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n".into(),
    );
    frames.push("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":500,\"total_tokens\":503}}\n\n".into());
    frames.push("data: [DONE]\n\n".into());
    frames
}

/// (time to first text delta, time to the end) of one streamed request.
async fn one(client: &reqwest::Client, url: &str) -> (Duration, Duration) {
    let start = Instant::now();
    let mut resp = client
        .post(url)
        .header("content-type", "application/json")
        .body(r#"{"model":"m","input":"go","stream":true}"#)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    let mut first = None;
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.expect("body") {
        body.extend_from_slice(&chunk);
        if first.is_none() && body.windows(26).any(|w| w == b"response.output_text.delta") {
            first = Some(start.elapsed());
        }
    }
    let text = String::from_utf8(body).expect("UTF-8");
    assert!(text.contains("event: response.completed") && text.ends_with("data: [DONE]\n\n"));
    (first.expect("a delta"), start.elapsed())
}

fn percentile(mut xs: Vec<Duration>, p: f64) -> Duration {
    xs.sort();
    xs[((xs.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn main() {
    // `cargo test --all-targets` runs benches with `--bench` absent: keep that run short.
    let quick = !std::env::args().any(|a| a == "--bench");
    let (sequential, per_client) = if quick {
        (3, 1)
    } else {
        (SEQUENTIAL, PER_CLIENT)
    };
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    println!("| upstream pacing | mode | first delta p50 | end p50 | end p99 | {CONCURRENT} clients: streams/s |");
    println!("|---|---|---|---|---|---|");
    // No pause: Envoy coalesces frames, the processor's cost dominates. 2 ms: token-like
    // pacing, one ext_proc round trip per frame, the added latency dominates.
    for (pace, delay) in [
        ("none", Duration::ZERO),
        ("2 ms/frame", Duration::from_millis(2)),
    ] {
        let upstream = ScriptedUpstream::start();
        let frames = upstream_body();
        upstream.set_default(move || Reply::sse(frames.clone()).with_delay(delay));
        for mode in ["streamed", "full-duplex-streamed"] {
            let processor = Processor::start(&["--stream-body-mode", mode]);
            let envoy = Envoy::start(upstream.port(), processor.port());
            let url = envoy.url("/v1/responses");
            let client = common::client();
            let (firsts, ends, rate) = runtime.block_on(async {
                for _ in 0..3 {
                    one(&client, &url).await;
                }
                let mut firsts = Vec::new();
                let mut ends = Vec::new();
                for _ in 0..sequential {
                    let (f, e) = one(&client, &url).await;
                    firsts.push(f);
                    ends.push(e);
                }
                let start = Instant::now();
                let tasks: Vec<_> = (0..CONCURRENT)
                    .map(|_| {
                        let (client, url) = (client.clone(), url.clone());
                        tokio::spawn(async move {
                            for _ in 0..per_client {
                                one(&client, &url).await;
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.expect("client task");
                }
                let rate = (CONCURRENT * per_client) as f64 / start.elapsed().as_secs_f64();
                (firsts, ends, rate)
            });
            println!(
                "| {pace} | {mode} | {} | {} | {} | {rate:.1} |",
                ms(percentile(firsts, 0.5)),
                ms(percentile(ends.clone(), 0.5)),
                ms(percentile(ends, 0.99)),
            );
        }
    }
}
