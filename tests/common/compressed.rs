//! Compressed request bodies: a streaming [`Compressor`] of each coding, and hostile shapes,
//! those that cost a decoder the most work for the fewest bytes (empty gzip members, empty
//! deflate blocks of each type, empty zstd frames and blocks, zstd skippable frames, brotli
//! metadata blocks), each at most the size asked (within a few bytes of it). Used by
//! tests/e2e/compression.rs and benches/decode.rs, and included by
//! core/src/request_encoding/tests.rs (the decoder they attack).
#![allow(dead_code)]

use std::io::Write;

/// A streaming compressor of one coding.
pub enum Compressor {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Zlib(flate2::write::ZlibEncoder<Vec<u8>>),
    Raw(flate2::write::DeflateEncoder<Vec<u8>>),
    Brotli(Box<brotli::CompressorWriter<Vec<u8>>>),
    Zstd(zstd::Encoder<'static, Vec<u8>>),
}

impl Compressor {
    /// `coding` as named in `content-encoding`; `raw-deflate` is `deflate` without zlib's
    /// wrapping (as some browsers send it).
    pub fn new(coding: &str) -> Compressor {
        let level = flate2::Compression::best();
        match coding {
            "gzip" => Compressor::Gzip(flate2::write::GzEncoder::new(Vec::new(), level)),
            "deflate" => Compressor::Zlib(flate2::write::ZlibEncoder::new(Vec::new(), level)),
            "raw-deflate" => Compressor::Raw(flate2::write::DeflateEncoder::new(Vec::new(), level)),
            "br" => Compressor::Brotli(Box::new(brotli::CompressorWriter::new(
                Vec::new(),
                1 << 16,
                5,
                22,
            ))),
            "zstd" => Compressor::Zstd(zstd::Encoder::new(Vec::new(), 19).expect("a zstd encoder")),
            other => panic!("no compressor for {other}"),
        }
    }

    pub fn write(&mut self, data: &[u8]) {
        match self {
            Compressor::Gzip(e) => e.write_all(data),
            Compressor::Zlib(e) => e.write_all(data),
            Compressor::Raw(e) => e.write_all(data),
            Compressor::Brotli(e) => e.write_all(data),
            Compressor::Zstd(e) => e.write_all(data),
        }
        .expect("compressed");
    }

    pub fn finish(self) -> Vec<u8> {
        match self {
            Compressor::Gzip(e) => e.finish().expect("gzip"),
            Compressor::Zlib(e) => e.finish().expect("zlib"),
            Compressor::Raw(e) => e.finish().expect("deflate"),
            Compressor::Brotli(e) => e.into_inner(),
            Compressor::Zstd(e) => e.finish().expect("zstd"),
        }
    }
}

/// `data` compressed with `coding` (as [`Compressor::new`] names it).
pub fn compress(coding: &str, data: &[u8]) -> Vec<u8> {
    let mut c = Compressor::new(coding);
    c.write(data);
    c.finish()
}

/// The codings, as `content-encoding` names them.
pub const CODINGS: [&str; 4] = ["gzip", "deflate", "br", "zstd"];

/// A valid stream of `coding` of about `size` bytes (at most, within a block) that decodes to
/// nothing, quickly (the costliest shapes are below): empty stored deflate blocks (in a gzip
/// member or zlib), brotli metadata blocks, zstd skippable frames of 64 KiB.
pub fn empty_stream(coding: &str, size: usize) -> Vec<u8> {
    match coding {
        "gzip" => gzip_empty_blocks(EmptyBlock::Stored, size),
        "deflate" => deflate_empty_blocks(EmptyBlock::Stored, size),
        "br" => brotli_metadata_blocks(size),
        "zstd" => zstd_skippable_frames(64 << 10, size),
        other => panic!("no stream of {other}"),
    }
}

/// Bits written least significant first, as deflate and brotli pack them.
#[derive(Default)]
struct Bits {
    bytes: Vec<u8>,
    /// Bits used in the last byte (0: a new byte is started by the next bit).
    used: u32,
}

impl Bits {
    /// The `n` low bits of `value`, the lowest first.
    fn put(&mut self, value: u32, n: u32) {
        for i in 0..n {
            if self.used == 0 {
                self.bytes.push(0);
            }
            let last = self.bytes.last_mut().expect("pushed above");
            *last |= (((value >> i) & 1) as u8) << self.used;
            self.used = (self.used + 1) % 8;
        }
    }

    /// A Huffman code of `len` bits (written most significant bit first).
    fn code(&mut self, code: u32, len: u32) {
        for i in (0..len).rev() {
            self.put((code >> i) & 1, 1);
        }
    }

    fn align(&mut self) {
        self.used = 0;
    }

    fn len(&self) -> usize {
        self.bytes.len()
    }
}

/// A deflate block that decodes to nothing, of each type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmptyBlock {
    /// Stored, length 0: 5 bytes (after alignment).
    Stored,
    /// Fixed Huffman codes, the end-of-block code alone: 10 bits.
    Fixed,
    /// Dynamic Huffman codes (three code tables to build), end of block: 94 bits.
    Dynamic,
}

impl EmptyBlock {
    fn write(self, bits: &mut Bits, last: bool) {
        bits.put(u32::from(last), 1);
        match self {
            EmptyBlock::Stored => {
                bits.put(0, 2);
                bits.align();
                bits.bytes.extend_from_slice(&[0, 0, 0xff, 0xff]);
            }
            EmptyBlock::Fixed => {
                bits.put(1, 2);
                // End of block (256): seven zero bits.
                bits.code(0, 7);
            }
            EmptyBlock::Dynamic => {
                bits.put(2, 2);
                // 257 literal/length codes, 1 distance code, 18 code-length codes.
                bits.put(0, 5);
                bits.put(0, 5);
                bits.put(14, 4);
                // Code-length code lengths, in the order 16 17 18 0 8 7 9 6 10 5 11 4 12 3
                // 13 2 14 1: 18 (a run of zeros) one bit, 0 and 1 two bits each.
                for len in [0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2] {
                    bits.put(len, 3);
                }
                // Canonical codes: 18 = 0, 0 = 10, 1 = 11. Literal 0 has length 1, 1..=255
                // none (runs of 138 and 117 zeros), end of block length 1, the one distance
                // code length 1.
                bits.code(0b11, 2);
                bits.code(0, 1);
                bits.put(138 - 11, 7);
                bits.code(0, 1);
                bits.put(117 - 11, 7);
                bits.code(0b11, 2);
                bits.code(0b11, 2);
                // End of block: literal 0 is code 0, 256 code 1.
                bits.code(1, 1);
            }
        }
    }
}

impl EmptyBlock {
    /// The most bytes one adds to a stream (alignment included).
    const MAX_BYTES: usize = 13;
}

/// A raw deflate stream of empty blocks, at most `size` bytes (at least 2), decoding to
/// nothing.
fn empty_deflate(block: EmptyBlock, size: usize) -> Vec<u8> {
    let mut bits = Bits::default();
    // Room for one more block and the last one (a fixed block: 10 bits).
    while bits.len() + EmptyBlock::MAX_BYTES + 2 <= size {
        block.write(&mut bits, false);
    }
    EmptyBlock::Fixed.write(&mut bits, true);
    bits.bytes
}

/// zlib (`content-encoding: deflate`) of empty blocks, at most `size` bytes.
pub fn deflate_empty_blocks(block: EmptyBlock, size: usize) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    out.extend(empty_deflate(block, size.saturating_sub(6)));
    // Adler-32 of nothing.
    out.extend_from_slice(&[0, 0, 0, 1]);
    out
}

/// One gzip member, header and trailer around `deflate` (which decodes to nothing).
fn gzip_member(deflate: &[u8]) -> Vec<u8> {
    let mut out = vec![0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff];
    out.extend_from_slice(deflate);
    // CRC-32 and length of nothing.
    out.extend_from_slice(&[0; 8]);
    out
}

/// gzip of one member of empty blocks, at most `size` bytes.
pub fn gzip_empty_blocks(block: EmptyBlock, size: usize) -> Vec<u8> {
    gzip_member(&empty_deflate(block, size.saturating_sub(18)))
}

/// gzip of empty members (20 bytes each), at most `size` bytes (at least one member).
pub fn gzip_empty_members(size: usize) -> Vec<u8> {
    let member = gzip_member(&[0x03, 0x00]);
    member.repeat((size / member.len()).max(1))
}

const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// zstd of empty frames (9 bytes each: no window, no checksum, one empty last block), at
/// most `size` bytes (at least one frame).
pub fn zstd_empty_frames(size: usize) -> Vec<u8> {
    // Frame header: single segment, content size 0 in one byte; a last raw block of 0 bytes.
    let frame = [&ZSTD_MAGIC[..], &[0x20, 0x00], &[0x01, 0x00, 0x00]].concat();
    frame.repeat((size / frame.len()).max(1))
}

/// zstd of one frame of empty raw blocks (3 bytes each), at most `size` bytes.
pub fn zstd_empty_blocks(size: usize) -> Vec<u8> {
    // Frame header: a 1 MiB window, no content size.
    let mut out = [&ZSTD_MAGIC[..], &[0x00, 0x50]].concat();
    while out.len() + 6 <= size {
        out.extend_from_slice(&[0x00, 0x00, 0x00]);
    }
    out.extend_from_slice(&[0x01, 0x00, 0x00]);
    out
}

/// The 8-byte head of a zstd skippable frame whose content is `len` bytes.
fn skippable_head(len: u32) -> Vec<u8> {
    [&[0x50, 0x2a, 0x4d, 0x18][..], &len.to_le_bytes()].concat()
}

/// zstd of skippable frames of `content` bytes each, at most `size` bytes (at least one).
pub fn zstd_skippable_frames(content: usize, size: usize) -> Vec<u8> {
    let frame = [
        skippable_head(u32::try_from(content).expect("a frame's size")),
        vec![0; content],
    ]
    .concat();
    frame.repeat((size / frame.len()).max(1))
}

/// br of empty metadata blocks (one byte each), `size` bytes (at least 2).
pub fn brotli_metadata_blocks(size: usize) -> Vec<u8> {
    let mut bits = Bits::default();
    // WBITS 16.
    bits.put(0, 1);
    while bits.len() + 1 < size {
        // Not last; MNIBBLES 0 (a metadata block); reserved 0; no skip bytes.
        bits.put(0, 1);
        bits.put(3, 2);
        bits.put(0, 1);
        bits.put(0, 2);
        bits.align();
    }
    // ISLAST, ISLASTEMPTY.
    bits.put(1, 1);
    bits.put(1, 1);
    bits.bytes
}

/// zstd (level 3, without a content size) of what `write` writes, streamed.
pub fn zstd_of(write: impl FnOnce(&mut dyn Write)) -> Vec<u8> {
    let mut e = zstd::Encoder::new(Vec::new(), 3).expect("a zstd encoder");
    write(&mut e);
    e.finish().expect("zstd")
}

/// The issue's bomb, `content-encoding: zstd, zstd`: a skippable frame declaring 4 GiB of
/// content (zeros), then a last empty frame, compressed with zstd (the outer layer makes the
/// zeros from tiny blocks). `inner` bytes of the skippable frame are written (the rest is cut:
/// no decoder reads that far).
pub fn zstd_of_skippable(inner: usize) -> Vec<u8> {
    zstd_of(|w| {
        w.write_all(&skippable_head(u32::MAX)).expect("write");
        let zeros = vec![0; 1 << 20];
        for _ in 0..inner.div_ceil(zeros.len()) {
            w.write_all(&zeros).expect("write");
        }
    })
}

/// Bytes that do not compress (a fixed pseudo-random sequence).
pub fn noise(size: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Text compressed with `coding`, flushed every `every` bytes (a block, a meta-block or a
/// deflate block each, with its own codes): at most `size` bytes (within one flush).
pub fn flushed(coding: &str, every: usize, size: usize) -> Vec<u8> {
    let text: Vec<u8> = b"{\"type\": \"message\", \"role\": \"user\"} "
        .iter()
        .cycle()
        .take(1 << 16)
        .copied()
        .collect();
    let mut c = match coding {
        // Level 19 takes long over millions of flushes.
        "zstd" => Compressor::Zstd(zstd::Encoder::new(Vec::new(), 3).expect("a zstd encoder")),
        _ => Compressor::new(coding),
    };
    let mut at = 0;
    loop {
        let piece = &text[at % (text.len() - every)..][..every];
        at += every;
        match &mut c {
            Compressor::Gzip(e) => e.write_all(piece).and_then(|()| e.flush()),
            Compressor::Zlib(e) => e.write_all(piece).and_then(|()| e.flush()),
            Compressor::Raw(e) => e.write_all(piece).and_then(|()| e.flush()),
            Compressor::Brotli(e) => e.write_all(piece).and_then(|()| e.flush()),
            Compressor::Zstd(e) => e.write_all(piece).and_then(|()| e.flush()),
        }
        .expect("flushed");
        let len = match &c {
            Compressor::Gzip(e) => e.get_ref().len(),
            Compressor::Zlib(e) => e.get_ref().len(),
            Compressor::Raw(e) => e.get_ref().len(),
            Compressor::Brotli(e) => e.get_ref().len(),
            Compressor::Zstd(e) => e.get_ref().len(),
        };
        // Room for one more flush (a few dozen bytes) and the end.
        if len + 64 > size {
            return c.finish();
        }
    }
}

/// A JSON request of exactly `size` bytes whose `input` is `text` bytes (cut to fit).
fn request_of(size: usize, text: impl Iterator<Item = u8>) -> Vec<u8> {
    let head = br#"{"model": "m", "input": ""#;
    let tail = br#""}"#;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(head);
    out.extend(text.take(size - head.len() - tail.len()));
    out.extend_from_slice(tail);
    out
}

/// A JSON request of exactly `size` bytes of text: words drawn from [`noise`].
pub fn request_of_words(size: usize) -> Vec<u8> {
    const WORDS: [&str; 16] = [
        "the ",
        "model ",
        "reads ",
        "a ",
        "file ",
        "and ",
        "calls ",
        "its ",
        "tool ",
        "with ",
        "arguments ",
        "that ",
        "name ",
        "one ",
        "path ",
        "again ",
    ];
    let words = noise(size / 2)
        .into_iter()
        .flat_map(|b| WORDS[usize::from(b % 16)].bytes());
    request_of(size, words)
}

/// A JSON request of exactly `size` bytes of base64 letters drawn from [`noise`] (about 6
/// bits a byte, as an encoded image is).
pub fn request_of_base64(size: usize) -> Vec<u8> {
    const BASE64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    request_of(
        size,
        noise(size).into_iter().map(|b| BASE64[usize::from(b % 64)]),
    )
}
