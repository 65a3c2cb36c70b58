//! The WebSocket frame codec (`core/src/websocket/`): a 400 KB masked text message (a long
//! agent turn's `response.create`) read whole and in 16 KiB pieces (as a host's reads bring
//! it), against a plain copy of the same bytes, the floor for a decoder that must copy the
//! message out of the host's buffers once, and as binary (no UTF-8 check); and the same
//! message written as a server frame.
//!
//! Run: `cargo bench -p responses-core --bench websocket_frames`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use responses_core::websocket::decode::{Decoder, Message};
use responses_core::websocket::encode;

const SIZE: usize = 400 * 1024;

/// A client's masked frame (`opcode` 0x1 text, 0x2 binary) of `SIZE` bytes of JSON-like
/// text, some of it multi-byte.
fn client_frame(opcode: u8) -> Vec<u8> {
    let unit = "{\"type\":\"input_text\",\"text\":\"caf\u{e9} \u{1f600} the quick brown fox\"},";
    let text = unit.repeat(SIZE / unit.len() + 1);
    let mut end = SIZE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let payload = &text.as_bytes()[..end];
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let mut out = vec![0x80 | opcode, 0x80 | 127];
    out.extend_from_slice(&(payload.len() as u64).to_be_bytes());
    out.extend_from_slice(&mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

fn decode(bytes: &[u8], piece: usize) -> Message {
    let mut decoder = Decoder::new(SIZE);
    let mut last = None;
    for chunk in bytes.chunks(piece) {
        let mut input = chunk;
        while let Some(m) = decoder.decode(&mut input).expect("valid") {
            last = Some(m);
        }
    }
    last.expect("one message")
}

fn bench(c: &mut Criterion) {
    let frame = client_frame(0x1);
    let mut g = c.benchmark_group("websocket 400 KB text");
    g.throughput(Throughput::Bytes(frame.len() as u64));
    g.bench_function("copy (the floor)", |b| {
        b.iter(|| black_box(black_box(&frame[..]).to_vec()))
    });
    g.bench_function("decode whole", |b| {
        b.iter(|| black_box(decode(black_box(&frame), usize::MAX)))
    });
    g.bench_function("decode in 16 KiB pieces", |b| {
        b.iter(|| black_box(decode(black_box(&frame), 16 * 1024)))
    });
    // The same bytes as binary: the framing and unmasking without the UTF-8 check.
    let binary = client_frame(0x2);
    g.bench_function("decode whole as binary", |b| {
        b.iter(|| black_box(decode(black_box(&binary), usize::MAX)))
    });
    let Message::Text(text) = decode(&frame, usize::MAX) else {
        unreachable!()
    };
    g.bench_function("encode", |b| {
        b.iter(|| black_box(encode::text(black_box(&text))))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
