//! Compressed request bodies: a streaming [`Compressor`] of each coding, and hostile shapes,
//! those that cost a decoder the most work for the fewest bytes (empty gzip members, empty
//! deflate blocks of each type, deflate blocks of full codes, empty zstd frames and blocks,
//! zstd skippable frames, brotli metadata blocks, brotli meta-blocks declaring 256 block types
//! and trees of each kind, brotli block switches before every symbol), each at most the size
//! asked (within a meta-block of it). Used by
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

impl EmptyBlock {
    /// A dynamic block that declares every code (286 literal/length codes, 226 of 8 bits and
    /// 60 of 9; 30 distance codes, 2 of 4 bits and 28 of 5), then ends: ~30 bytes whose codes
    /// a decoder builds in full before it reads the end.
    fn write_full_codes(bits: &mut Bits, last: bool) {
        bits.put(u32::from(last), 1);
        bits.put(2, 2);
        bits.put(286 - 257, 5);
        bits.put(30 - 1, 5);
        // Code-length code lengths in the order 16 17 18 0 8 7 9 6 10 5 11 4: 12 of them.
        bits.put(12 - 4, 4);
        for symbol in [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4] {
            bits.put(
                if symbol == 16 {
                    1
                } else if [8, 9, 4, 5].contains(&symbol) {
                    3
                } else {
                    0
                },
                3,
            );
        }
        // Canonical: 16 = 0; 4 = 100, 5 = 101, 8 = 110, 9 = 111.
        let length = |bits: &mut Bits, len: u32| match len {
            4 => bits.code(0b100, 3),
            5 => bits.code(0b101, 3),
            8 => bits.code(0b110, 3),
            9 => bits.code(0b111, 3),
            _ => unreachable!("lengths used"),
        };
        // A run: the length once, then "repeat the previous 3 to 6 times".
        let run = |bits: &mut Bits, len: u32, count: u32| {
            length(bits, len);
            let mut left = count - 1;
            while left >= 3 {
                let n = left.min(6);
                bits.code(0, 1);
                bits.put(n - 3, 2);
                left -= n;
            }
            for _ in 0..left {
                length(bits, len);
            }
        };
        run(bits, 8, 226);
        run(bits, 9, 60);
        run(bits, 4, 2);
        run(bits, 5, 28);
        // End of block (256, the 31st code of 9 bits: 452 + 30).
        bits.code(482, 9);
    }
}

/// A raw deflate stream of blocks of full codes ([`EmptyBlock::write_full_codes`]), at most
/// `size` bytes, decoding to nothing.
fn full_codes_deflate(size: usize) -> Vec<u8> {
    let mut bits = Bits::default();
    while bits.len() + 2 * 32 <= size {
        EmptyBlock::write_full_codes(&mut bits, false);
    }
    EmptyBlock::write_full_codes(&mut bits, true);
    bits.bytes
}

/// gzip of one member of blocks of full codes, at most `size` bytes.
pub fn gzip_full_code_blocks(size: usize) -> Vec<u8> {
    gzip_member(&full_codes_deflate(size.saturating_sub(18)))
}

/// zlib (`content-encoding: deflate`) of blocks of full codes, at most `size` bytes.
pub fn deflate_full_code_blocks(size: usize) -> Vec<u8> {
    let mut out = vec![0x78, 0x01];
    out.extend(full_codes_deflate(size.saturating_sub(6)));
    out.extend_from_slice(&[0, 0, 0, 1]);
    out
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

/// Raw deflate (`content-encoding: deflate` as some clients send it) of `n` empty stored
/// blocks, the last one final.
pub fn raw_empty_stored_blocks(n: usize) -> Vec<u8> {
    let mut bits = Bits::default();
    for i in 0..n {
        EmptyBlock::Stored.write(&mut bits, i + 1 == n);
    }
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

/// The bit length of `x`.
fn bit_length(x: u32) -> u32 {
    u32::BITS - x.leading_zeros()
}

/// A brotli NBLTYPES or NTREES value, 1 to 256.
fn brotli_count(bits: &mut Bits, n: u32) {
    let v = n - 1;
    if v == 0 {
        bits.put(0, 1);
        return;
    }
    bits.put(1, 1);
    let k = bit_length(v) - 1;
    bits.put(k, 3);
    bits.put(v - (1 << k), k);
}

/// A brotli simple prefix code of one symbol (read with no bits).
fn brotli_one_symbol(bits: &mut Bits, alphabet: u32, symbol: u32) {
    bits.put(1, 2);
    bits.put(0, 2);
    bits.put(symbol, bit_length(alphabet - 1));
}

/// The repeat codes (16) that repeat the previous length `n` times: brotli's repeats of
/// repeats multiply, 3 to 6 times, then 4 × (that − 2) + 3 to 6, and so on.
fn brotli_repeats(n: u32) -> Vec<u32> {
    if n <= 6 {
        return vec![n - 3];
    }
    let extra = (n - 3) % 4;
    let mut out = brotli_repeats((n - 3 - extra) / 4 + 2);
    out.push(extra);
    out
}

/// A brotli complex prefix code of the alphabet's first symbols, in runs of (length, count)
/// (one or two lengths, a complete code), its lengths sent with repeat codes.
fn brotli_full_code(bits: &mut Bits, runs: &[(u32, u32)]) {
    // The code-length code: 16 one bit, the lengths two bits each (or one bit, alone).
    let mut lengths = [0u32; 18];
    lengths[16] = 1;
    for &(len, _) in runs {
        lengths[len as usize] = if runs.len() == 1 { 1 } else { 2 };
    }
    bits.put(0, 2);
    let mut space = 32;
    for symbol in [1, 2, 3, 4, 0, 5, 17, 6, 16, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
        // The fixed code of a code-length code length, first bit first.
        match lengths[symbol] {
            0 => bits.put(0, 2),
            1 => bits.put(7, 4),
            2 => bits.put(3, 3),
            _ => unreachable!("lengths used"),
        }
        if lengths[symbol] != 0 {
            space -= 32 >> lengths[symbol];
            if space == 0 {
                break;
            }
        }
    }
    // Canonical codes, shorter first, then by symbol: alone, the length is 0 and 16 is 1;
    // with two lengths, 16 is 0 and the lengths 10 and 11.
    let repeat = u32::from(runs.len() == 1);
    let code = |bits: &mut Bits, len: u32| {
        if runs.len() == 1 {
            bits.code(0, 1);
        } else if len == runs[0].0 {
            bits.code(0b10, 2);
        } else {
            bits.code(0b11, 2);
        }
    };
    for &(len, count) in runs {
        code(bits, len);
        for extra in brotli_repeats(count - 1) {
            bits.code(repeat, 1);
            bits.put(extra, 2);
        }
    }
}

/// What a brotli meta-block declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BrotliHeader {
    /// 256 literal and 256 distance block types, 256 trees of each with one symbol each, and
    /// full context maps of the last tree, inverse move-to-front transformed (the issue's:
    /// 16,384 + 1,024 entries moved 255 places each, from ~800 bytes).
    BlockTypes,
    /// 256 block types of each kind and 256 trees of each kind, each tree a complete code of
    /// its whole alphabet (tables of 256, 704 and 64 entries built for each).
    FullCodes,
}

/// br of meta-blocks of one byte each, declaring `header`, at most `size` bytes.
pub fn brotli_headers(header: BrotliHeader, size: usize) -> Vec<u8> {
    let full = header == BrotliHeader::FullCodes;
    let meta_block = |bits: &mut Bits| {
        // Not last, MLEN 1 (four nibbles of MLEN − 1), compressed.
        bits.put(0, 1);
        bits.put(0, 2);
        bits.put(0, 16);
        bits.put(0, 1);
        // Literal, insert-and-copy, distance block types: 256 of each but insert-and-copy's
        // for the issue's shape. A type code and a count code of one symbol each; the first
        // block's count is 1.
        let types = [256, if full { 256 } else { 1 }, 256];
        for n in types {
            brotli_count(bits, n);
            if n > 1 {
                brotli_one_symbol(bits, n + 2, 0);
                brotli_one_symbol(bits, 26, 0);
                bits.put(0, 2);
            }
        }
        // NPOSTFIX 0, NDIRECT 0; a context mode for each literal block type.
        bits.put(0, 6);
        for _ in 0..types[0] {
            bits.put(0, 2);
        }
        // 256 literal trees, 256 distance trees, each context map all the last tree (one
        // symbol, no RLE), inverse move-to-front on.
        for _ in 0..2 {
            brotli_count(bits, 256);
            bits.put(0, 1);
            brotli_one_symbol(bits, 256, 255);
            bits.put(1, 1);
        }
        for _ in 0..256 {
            if full {
                brotli_full_code(bits, &[(8, 256)]);
            } else {
                brotli_one_symbol(bits, 256, u32::from(b'a'));
            }
        }
        for _ in 0..types[1] {
            if full {
                brotli_full_code(bits, &[(9, 320), (10, 384)]);
            } else {
                brotli_one_symbol(bits, 704, 8);
            }
        }
        for _ in 0..256 {
            if full {
                brotli_full_code(bits, &[(6, 64)]);
            } else {
                brotli_one_symbol(bits, 64, 0);
            }
        }
        // One command: insert one literal ('a'), copy two, which the meta-block's end cuts.
        if full {
            bits.code(8, 9);
            bits.code(u32::from(b'a'), 8);
        }
    };
    let mut one = Bits::default();
    meta_block(&mut one);
    let mut bits = Bits::default();
    // WBITS 16.
    bits.put(0, 1);
    while bits.len() + one.len() + 2 <= size {
        meta_block(&mut bits);
    }
    // ISLAST, ISLASTEMPTY.
    bits.put(1, 1);
    bits.put(1, 1);
    bits.bytes
}

/// br of one meta-block whose every symbol comes after a block switch (two bits each): an
/// insert of four literals and a copy of two, over and over, about `size` bytes decoding to
/// about 5 times as many (a decoder's costliest work per byte written).
pub fn brotli_switches(size: usize) -> Vec<u8> {
    // Ten bits a command: a command switch, four literal switches.
    let commands = u32::try_from(size.saturating_sub(64) * 8 / 10).expect("a size");
    let mut bits = Bits::default();
    bits.put(0, 1);
    // ISLAST, not empty, MLEN − 1 in as few nibbles as it takes (four to six: the last may
    // not be zero).
    let mlen = 6 * commands + 4;
    let nibbles = (bit_length(mlen - 1).div_ceil(4)).max(4);
    assert!(nibbles <= 6, "a meta-block of {mlen} bytes");
    bits.put(1, 1);
    bits.put(0, 1);
    bits.put(nibbles - 4, 2);
    bits.put(mlen - 1, 4 * nibbles);
    for _ in 0..3 {
        // Two block types; the type code says "the next type"; counts of 1.
        brotli_count(&mut bits, 2);
        brotli_one_symbol(&mut bits, 4, 1);
        brotli_one_symbol(&mut bits, 26, 0);
        bits.put(0, 2);
    }
    bits.put(0, 6);
    bits.put(0, 4);
    brotli_count(&mut bits, 1);
    brotli_count(&mut bits, 1);
    brotli_one_symbol(&mut bits, 256, u32::from(b'a'));
    // Insert four literals, copy two from the last distance (4).
    for _ in 0..2 {
        brotli_one_symbol(&mut bits, 704, 32);
    }
    brotli_one_symbol(&mut bits, 64, 0);
    for i in 0..=commands {
        if i > 0 {
            bits.put(0, 2);
        }
        for j in 0..4 {
            if i > 0 || j > 0 {
                bits.put(0, 2);
            }
        }
    }
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
