//! Compressed request bodies, decoded here rather than by the proxy: every coding clients
//! send (`gzip`, `deflate`, `br`, `zstd`, two of them stacked in any order) is read in every
//! deployment, and a decompression bomb stops at the request cap with nothing more held than
//! the cap.
//!
//! Envoy's decompressor filters, which did this before, pass on a body cut where their bomb
//! protection trips (a `zstd` bomb became a 400 `invalid_json`, memory bounded only by a
//! hundred times one read), have no `deflate`, decode only the first of stacked codings, and
//! cannot be added in Envoy Gateway.
//!
//! The decoders are streaming: each piece of the body goes through them as it comes, and what
//! they produce is counted as it is produced. Three bounds, each a 413 where it trips (the
//! decoders stop there):
//! - the encoded body and the decoded body are each at most `max_request_bytes`;
//! - the work: what the decoders will do is counted before they do it, in units of about the
//!   cheapest work a byte takes at its worst, and adds up to at most [`work_budget`] (about
//!   [`WORK_PER_CAP`] times the cap). Every byte a decoder reads (the encoded body, and each
//!   layer between two decoders) is a unit, a brotli byte two ([`Coding::read_cost`]); a
//!   deflate block (gzip, deflate) is [`BLOCK_COST`] more, whatever it holds, since its codes
//!   are built before its data is read; brotli's decoder is charged a unit for each byte it
//!   writes and for the tables, maps and trees it allocates (what its meta-block headers make
//!   it build), through the allocator it takes ([`Charged`]). Bytes that decode
//!   to nothing (empty gzip members and deflate blocks, zstd skippable frames, brotli metadata)
//!   are read, so counted: a body of any shape costs a bounded time (benches/decode.rs keeps
//!   the worst shapes found and measures them);
//! - at most [`MAX_CODINGS`] codings (a 415 beyond).
//!
//! Memory: the decoded body (at most the cap) and each coding's window (deflate 32 KiB,
//! brotli at most 16 MiB, zstd at most the cap or 8 MiB, whichever is larger: a frame asking
//! for more is refused).

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use brotli_decompressor::writer::DecompressorWriterCustomAlloc;
use brotli_decompressor::{Allocator, HuffmanCode, StandardAlloc};
use zlib_rs::{Inflate, InflateFlush};

use crate::openresponses::{ApiError, ErrorCode};

/// The request header read.
pub const HEADER: &str = "content-encoding";

/// The most codings a body may have stacked. One is what clients send; two is a client's
/// coding compressed again on the way (a proxy); no sender stacks three, and each layer adds
/// a decoder's worth of work to the body's budget.
pub const MAX_CODINGS: usize = 2;

/// The decoders of one body do at most this many units of work per byte of
/// `max_request_bytes`, and an eighth more ([`work_budget`], see the module docs): two layers
/// of incompressible content at the cap fit, with the calls of their blocks, and no more. At
/// ~20 ns a unit at worst (benches/decode.rs), the default cap's 34 Mi units are about 0.7 s.
pub const WORK_PER_CAP: usize = 2;

/// The units of work the decoders of one body may do, for a cap of `limit` bytes: each byte
/// of two layers at the cap, and an eighth of the cap for the calls a stream's blocks and
/// buffers take (~1,500 for 16 MiB of gzip: 240 Ki units); never under [`WORK_FLOOR`].
pub fn work_budget(limit: usize) -> usize {
    limit
        .saturating_mul(WORK_PER_CAP)
        .saturating_add(limit / 8)
        .max(WORK_FLOOR)
}

/// The least work budget, whatever the cap: a small cap (a few hundred bytes) must still let a
/// gzip body's few calls through (each charged [`BLOCK_COST`]); 64 Ki units are about a
/// millisecond and a half of a decoder's time at worst.
pub const WORK_FLOOR: usize = 64 * 1024;

/// The units a deflate block costs besides its bytes, charged before each call of the
/// decoder (which begins at most one block): a dynamic block of full codes (286 literal and
/// length codes, 30 distance codes) is ~30 bytes and takes zlib-rs 4 to 5 µs to build, about
/// 200 units' worth (benches/decode.rs, "blocks of full codes").
pub const BLOCK_COST: usize = 200;

/// The largest brotli context map (64 contexts × 256 block types): brotli's byte allocations
/// up to this size are its context maps and modes, read entry by entry (a map's inverse
/// move-to-front transform moves up to 255 entries for each), a unit a byte; larger ones are
/// its window, written only as output is (counted there), a unit per 64 bytes.
const BROTLI_MAP_MAX: usize = 64 * 256;

/// Brotli's prefix-code tables and their offsets: allocated for every meta-block (1,080 entries
/// a tree) and built entry by entry, a unit per 4 entries.
const BROTLI_ENTRIES_PER_UNIT: usize = 4;

/// A content coding this server decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    /// `gzip` (and `x-gzip`), one member or several.
    Gzip,
    /// `deflate`: zlib (RFC 1950), or raw deflate (RFC 1951) as some browsers send it.
    Deflate,
    /// `br`: brotli.
    Brotli,
    /// `zstd`: one frame or several (Codex can send its requests so).
    Zstd,
}

impl Coding {
    /// Every coding, for messages.
    pub const ALL: [Coding; 4] = [Coding::Gzip, Coding::Deflate, Coding::Brotli, Coding::Zstd];

    /// Its name in `content-encoding`.
    pub fn as_str(self) -> &'static str {
        match self {
            Coding::Gzip => "gzip",
            Coding::Deflate => "deflate",
            Coding::Brotli => "br",
            Coding::Zstd => "zstd",
        }
    }

    /// The units a byte read by this coding's decoder costs: a brotli byte two (its cheapest
    /// hostile shape, one-byte metadata blocks, costs it 26 to 42 ns a byte, twice what a zstd
    /// byte costs at worst, empty frames); the others one. What a decoder builds is charged
    /// besides (a deflate block, brotli's tables and output).
    pub fn read_cost(self) -> usize {
        match self {
            Coding::Gzip | Coding::Deflate | Coding::Zstd => 1,
            Coding::Brotli => 2,
        }
    }

    fn parse(name: &str) -> Option<Coding> {
        let known = [
            ("gzip", Coding::Gzip),
            ("x-gzip", Coding::Gzip),
            ("deflate", Coding::Deflate),
            ("br", Coding::Brotli),
            ("zstd", Coding::Zstd),
        ];
        known
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, c)| *c)
    }
}

/// The codings of a body, in the order they were applied (`content-encoding: gzip, br`: gzip
/// first); none when it is plain (no header, empty, `identity`). A coding this server does
/// not decode is a 415 naming it, more than [`MAX_CODINGS`] a 415 too.
pub fn codings(content_encoding: Option<&str>) -> Result<Vec<Coding>, ApiError> {
    let Some(value) = content_encoding else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for name in value.split(',').map(str::trim) {
        if name.is_empty() || name.eq_ignore_ascii_case("identity") {
            continue;
        }
        let Some(coding) = Coding::parse(name) else {
            let known: Vec<&str> = Coding::ALL.iter().map(|c| c.as_str()).collect();
            return Err(ApiError::invalid_body(format!(
                "The request body has content-encoding '{name}', which this server does not \
                 decode. Send it uncompressed, or compressed with one of: {}.",
                known.join(", ")
            ))
            .with_status(415)
            .with_code(ErrorCode::UnsupportedContentEncoding));
        };
        out.push(coding);
    }
    if out.len() > MAX_CODINGS {
        return Err(ApiError::invalid_body(format!(
            "The request body has {} content codings stacked ({value}); this server decodes \
             at most {MAX_CODINGS}. Send it compressed once.",
            out.len()
        ))
        .with_status(415)
        .with_code(ErrorCode::UnsupportedContentEncoding));
    }
    Ok(out)
}

/// A body being decoded: the decoders of its codings, the last applied first, each writing
/// into the next, the last into the body (bounded).
pub struct Decoder {
    /// `None` once an error ended it.
    chain: Option<Box<dyn Stage>>,
    codings: Vec<Coding>,
    /// Encoded bytes taken so far (bounded by the cap too).
    taken: usize,
    limit: usize,
    work: Arc<Work>,
}

impl fmt::Debug for Decoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decoder")
            .field("codings", &self.codings)
            .field("taken", &self.taken)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl Decoder {
    /// A decoder of these codings (as [`codings`] lists them), whose decoded body may hold at
    /// most `limit` bytes.
    pub fn new(codings: &[Coding], limit: usize) -> Decoder {
        let mut chain: Box<dyn Stage> = Box::new(Body {
            bytes: Vec::new(),
            limit,
        });
        let work = Arc::new(Work {
            spent: AtomicUsize::new(0),
            budget: work_budget(limit),
            exceeded: AtomicBool::new(false),
        });
        // The coding applied last is undone first; each decoder's reads are metered.
        for coding in codings {
            chain = Box::new(Metered {
                decoder: stage(*coding, chain, limit, &work),
                cost: coding.read_cost(),
                work: Arc::clone(&work),
            });
        }
        Decoder {
            chain: Some(chain),
            codings: codings.to_vec(),
            taken: 0,
            limit,
            work,
        }
    }

    /// A piece of the encoded body.
    pub fn push(&mut self, piece: &[u8]) -> Result<(), ApiError> {
        self.taken += piece.len();
        if self.taken > self.limit {
            self.chain = None;
            return Err(too_large(self.limit, "The request body"));
        }
        let Some(chain) = &mut self.chain else {
            return Err(self.invalid("it was refused already"));
        };
        if let Err(e) = chain.write_all(piece) {
            self.chain = None;
            return Err(self.error(&e));
        }
        Ok(())
    }

    /// The end of the body: the decoded body, once every coding ended where it should.
    pub fn finish(mut self) -> Result<Vec<u8>, ApiError> {
        let Some(chain) = self.chain.take() else {
            return Err(self.invalid("it was refused already"));
        };
        chain.finish().map_err(|e| self.error(&e))
    }

    fn error(&self, e: &io::Error) -> ApiError {
        let bound = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<TooLarge>());
        // Brotli's decoder fails in its own words when its allocator refuses: the budget says.
        match (bound, self.work.exceeded.load(Ordering::Relaxed)) {
            (Some(TooLarge::Decoded), _) => too_large(self.limit, "The request body, decoded,"),
            (Some(TooLarge::Work), _) | (None, true) => {
                let names: Vec<&str> = self.codings.iter().map(|c| c.as_str()).collect();
                ApiError::invalid_body(format!(
                    "The request body takes more decoding than this server gives one body: \
                     its layers ({}) add up to more than {} units of work, about {WORK_PER_CAP} \
                     times --max-request-bytes ({} bytes) (a unit a byte read, more for a \
                     deflate block and for what a brotli header makes its decoder build).",
                    names.join(", "),
                    work_budget(self.limit),
                    self.limit,
                ))
                .with_status(413)
                .with_code(ErrorCode::RequestTooLarge)
            }
            (None, false) => self.invalid(&e.to_string()),
        }
    }

    fn invalid(&self, why: &str) -> ApiError {
        let names: Vec<&str> = self.codings.iter().map(|c| c.as_str()).collect();
        ApiError::invalid_body(format!(
            "The request body cannot be decoded as its content-encoding says ({}): {why}.",
            names.join(", ")
        ))
        .with_code(ErrorCode::InvalidEncodedBody)
    }
}

fn too_large(limit: usize, what: &str) -> ApiError {
    ApiError::invalid_body(format!(
        "{what} is larger than this server accepts (--max-request-bytes, {limit} bytes)."
    ))
    .with_status(413)
    .with_code(ErrorCode::RequestTooLarge)
}

/// One step of the chain: a writer of its input that ends with the decoded body.
trait Stage: Write + Send {
    /// Ends this coding (its end and checksum checked) and the stages after it: the body.
    fn finish(self: Box<Self>) -> io::Result<Vec<u8>>;
}

/// The decoder of `coding`, writing into `next`, charging what it builds to `work`.
fn stage(coding: Coding, next: Box<dyn Stage>, limit: usize, work: &Arc<Work>) -> Box<dyn Stage> {
    match coding {
        Coding::Gzip => Box::new(Inflater::new(Format::Gzip, next, work)),
        Coding::Deflate => Box::new(Inflater::new(Format::Sniffing, next, work)),
        Coding::Brotli => Box::new(Brotli::new(next, work)),
        Coding::Zstd => match Zstd::new(next, limit) {
            Ok(z) => Box::new(z),
            Err(e) => Box::new(Failed(Some(e))),
        },
    }
}

/// The output buffer of the brotli and deflate decoders (brotli's window is its own, at most
/// 16 MiB; deflate's, 32 KiB).
const OUTPUT_BUFFER: usize = 32 * 1024;

/// The decoded body, refusing to grow beyond the cap.
struct Body {
    bytes: Vec<u8>,
    limit: usize,
}

/// The error a bound stops the decoders with.
#[derive(Debug)]
enum TooLarge {
    /// The decoded body is over the cap ([`Body`]).
    Decoded,
    /// The decoders' reads are over the work budget ([`Metered`]).
    Work,
}

impl fmt::Display for TooLarge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TooLarge::Decoded => "the decoded body is over the cap",
            TooLarge::Work => "the decoders' reads are over the work budget",
        })
    }
}

impl std::error::Error for TooLarge {}

impl Write for Body {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.bytes.len() + buf.len() > self.limit {
            return Err(io::Error::other(TooLarge::Decoded));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Stage for Body {
    fn finish(self: Box<Self>) -> io::Result<Vec<u8>> {
        Ok(self.bytes)
    }
}

/// The work the decoders of one body are charged, against its budget (shared by its stages:
/// an outer decoder's output is read by the inner one within the same write).
#[derive(Debug)]
struct Work {
    spent: AtomicUsize,
    budget: usize,
    /// A charge was refused: whatever error follows is the budget's.
    exceeded: AtomicBool,
}

impl Work {
    /// Counts `units` about to be spent; past the budget they are not, and every later charge
    /// is refused too.
    fn charge(&self, units: usize) -> io::Result<()> {
        let spent = self.spent.fetch_add(units, Ordering::Relaxed);
        if spent.saturating_add(units) > self.budget {
            self.exceeded.store(true, Ordering::Relaxed);
            return Err(io::Error::other(TooLarge::Work));
        }
        Ok(())
    }

    /// Gives back units charged and not spent.
    fn refund(&self, units: usize) {
        self.spent.fetch_sub(units, Ordering::Relaxed);
    }
}

/// A decoder whose reads count against the body's [`Work`]: refused before it reads a byte
/// over the budget.
struct Metered {
    decoder: Box<dyn Stage>,
    /// What a byte read costs ([`Coding::read_cost`]).
    cost: usize,
    work: Arc<Work>,
}

impl Write for Metered {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Counted before the decoder runs, so that the decoders inside, reading its output
        // within this write, see it; what it leaves unread is given back.
        self.work.charge(buf.len().saturating_mul(self.cost))?;
        let n = self.decoder.write(buf)?;
        self.work.refund((buf.len() - n) * self.cost);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.decoder.flush()
    }
}

impl Stage for Metered {
    fn finish(self: Box<Self>) -> io::Result<Vec<u8>> {
        self.decoder.finish()
    }
}

/// The framing around a deflate stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    /// gzip, one member or several.
    Gzip,
    /// `deflate`, until its first two bytes tell zlib (as the HTTP spec has it) from raw
    /// deflate (as some clients send it): a zlib header names the deflate method and is a
    /// multiple of 31.
    Sniffing,
    Zlib,
    Raw,
}

/// gzip, zlib or raw deflate, decoded by zlib-rs one block at a time
/// ([`InflateFlush::Block`]): each call begins at most one block, whose codes it may build
/// before its data (the costly part of a hostile body: a block of full codes is ~30 bytes and
/// 4 to 5 µs), so each is charged [`BLOCK_COST`] before it is made.
struct Inflater {
    format: Format,
    /// `None` before the first call and between gzip members.
    inflate: Option<Inflate>,
    /// The first bytes of a `deflate` body while they are sniffed.
    head: Vec<u8>,
    /// The stream ended (gzip: a member did): what follows is another member, or an error.
    ended: bool,
    out: Vec<u8>,
    next: Box<dyn Stage>,
    work: Arc<Work>,
}

impl Inflater {
    fn new(format: Format, next: Box<dyn Stage>, work: &Arc<Work>) -> Inflater {
        Inflater {
            format,
            inflate: None,
            head: Vec::new(),
            ended: false,
            out: vec![0; OUTPUT_BUFFER],
            next,
            work: Arc::clone(work),
        }
    }

    fn is_zlib(head: &[u8]) -> bool {
        let (cmf, flg) = (head[0], head[1]);
        cmf & 0x0f == 8 && (u16::from(cmf) << 8 | u16::from(flg)) % 31 == 0
    }

    /// Picks zlib or raw deflate from the sniffed bytes (two, or fewer at the body's end),
    /// then decodes them.
    fn decide(&mut self) -> io::Result<()> {
        if self.format != Format::Sniffing {
            return Ok(());
        }
        let head = std::mem::take(&mut self.head);
        self.format = if head.len() >= 2 && Inflater::is_zlib(&head) {
            Format::Zlib
        } else {
            Format::Raw
        };
        self.inflate_all(&head)
    }

    fn inflate_all(&mut self, mut input: &[u8]) -> io::Result<()> {
        while !input.is_empty() {
            if self.ended {
                if self.format != Format::Gzip {
                    return Err(io::Error::other(
                        "there is more after the end of the stream",
                    ));
                }
                // The next gzip member.
                self.inflate = None;
                self.ended = false;
            }
            let used = self.step(input)?;
            input = &input[used..];
        }
        Ok(())
    }

    /// One call of the decoder, charged first; what it made is passed on. The input it used.
    fn step(&mut self, input: &[u8]) -> io::Result<usize> {
        self.work.charge(BLOCK_COST)?;
        let format = self.format;
        let inflate = self.inflate.get_or_insert_with(|| match format {
            Format::Gzip => Inflate::new(true, 16 + 15),
            Format::Zlib => Inflate::new(true, 15),
            Format::Raw | Format::Sniffing => Inflate::new(false, 15),
        });
        let (read, written) = (inflate.total_in(), inflate.total_out());
        let status = inflate
            .decompress(input, &mut self.out, InflateFlush::Block)
            .map_err(|e| io::Error::other(inflate.error_message().unwrap_or(e.as_str())))?;
        let used = usize::try_from(inflate.total_in() - read).unwrap_or(usize::MAX);
        let made = usize::try_from(inflate.total_out() - written).unwrap_or(usize::MAX);
        if status == zlib_rs::Status::StreamEnd {
            self.ended = true;
        }
        self.next.write_all(&self.out[..made])?;
        if used == 0 && made == 0 && !self.ended {
            return Err(io::Error::other("the stream is not complete"));
        }
        Ok(used)
    }
}

impl Write for Inflater {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut input = buf;
        if self.format == Format::Sniffing {
            let n = input.len().min(2 - self.head.len());
            self.head.extend_from_slice(&input[..n]);
            input = &input[n..];
            if self.head.len() < 2 {
                return Ok(buf.len());
            }
            self.decide()?;
        }
        self.inflate_all(input)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Stage for Inflater {
    fn finish(mut self: Box<Self>) -> io::Result<Vec<u8>> {
        self.decide()?;
        // What the decoder still holds (its output buffer was full), up to the stream's end:
        // a call that makes nothing more is a stream cut short.
        while !self.ended {
            self.step(&[])?;
        }
        self.next.finish()
    }
}

/// brotli's decoder, its allocations charged ([`Charged`]) and its output counted (a unit a
/// byte: its commands and block switches cost per byte written, ~24 ns at worst, a block
/// switch before every symbol).
struct Brotli(DecompressorWriterCustomAlloc<Output, BrotliBuffer, Charged, Charged, Charged>);

type BrotliBuffer = <StandardAlloc as Allocator<u8>>::AllocatedMemory;

impl Brotli {
    fn new(next: Box<dyn Stage>, work: &Arc<Work>) -> Brotli {
        let buffer = <StandardAlloc as Allocator<u8>>::alloc_cell(
            &mut StandardAlloc::default(),
            OUTPUT_BUFFER,
        );
        let charged = || Charged(Arc::clone(work));
        Brotli(DecompressorWriterCustomAlloc::new(
            Output {
                next,
                work: Arc::clone(work),
            },
            buffer,
            charged(),
            charged(),
            charged(),
        ))
    }
}

impl Write for Brotli {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Stage for Brotli {
    fn finish(mut self: Box<Self>) -> io::Result<Vec<u8>> {
        // `close` fails on a stream that ended early (or not at a stream's end).
        self.0.close()?;
        match self.0.into_inner() {
            Ok(output) => output.next.finish(),
            Err(_) => Err(io::Error::other("the brotli stream is not complete")),
        }
    }
}

/// brotli's output on its way to the next stage, a unit a byte.
struct Output {
    next: Box<dyn Stage>,
    work: Arc<Work>,
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.work.charge(buf.len())?;
        let n = self.next.write(buf)?;
        self.work.refund(buf.len() - n);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.next.flush()
    }
}

/// The allocator brotli's decoder takes (it is written to take one): each allocation is
/// charged to the body's work before it is made, for what the decoder does with it (see
/// [`BROTLI_MAP_MAX`], [`BROTLI_ENTRIES_PER_UNIT`]); a meta-block header declaring 256 block
/// types and trees of each kind with full context maps makes it build ~700 KiB of tables
/// from ~800 bytes. Past the budget it allocates nothing, which the decoder takes as a
/// failure (the error then says the budget's words, [`Decoder::error`]).
struct Charged(Arc<Work>);

impl Allocator<u8> for Charged {
    type AllocatedMemory = <StandardAlloc as Allocator<u8>>::AllocatedMemory;

    fn alloc_cell(&mut self, len: usize) -> Self::AllocatedMemory {
        let units = if len <= BROTLI_MAP_MAX { len } else { len / 64 };
        if self.0.charge(units).is_err() {
            return Self::AllocatedMemory::default();
        }
        <StandardAlloc as Allocator<u8>>::alloc_cell(&mut StandardAlloc::default(), len)
    }

    fn free_cell(&mut self, _: Self::AllocatedMemory) {}
}

impl Allocator<u32> for Charged {
    type AllocatedMemory = <StandardAlloc as Allocator<u32>>::AllocatedMemory;

    fn alloc_cell(&mut self, len: usize) -> Self::AllocatedMemory {
        if self
            .0
            .charge(len.div_ceil(BROTLI_ENTRIES_PER_UNIT))
            .is_err()
        {
            return Self::AllocatedMemory::default();
        }
        <StandardAlloc as Allocator<u32>>::alloc_cell(&mut StandardAlloc::default(), len)
    }

    fn free_cell(&mut self, _: Self::AllocatedMemory) {}
}

impl Allocator<HuffmanCode> for Charged {
    type AllocatedMemory = <StandardAlloc as Allocator<HuffmanCode>>::AllocatedMemory;

    fn alloc_cell(&mut self, len: usize) -> Self::AllocatedMemory {
        if self
            .0
            .charge(len.div_ceil(BROTLI_ENTRIES_PER_UNIT))
            .is_err()
        {
            return Self::AllocatedMemory::default();
        }
        <StandardAlloc as Allocator<HuffmanCode>>::alloc_cell(&mut StandardAlloc::default(), len)
    }

    fn free_cell(&mut self, _: Self::AllocatedMemory) {}
}

struct Zstd(zstd::stream::write::Decoder<'static, Box<dyn Stage>>);

impl Zstd {
    /// The smallest window a zstd decoder is allowed here (8 MiB: what `zstd -19` writes).
    const MIN_WINDOW_LOG: u32 = 23;

    fn new(next: Box<dyn Stage>, limit: usize) -> io::Result<Zstd> {
        let mut d = zstd::stream::write::Decoder::new(next)?;
        // A frame may ask for a window of up to 2 GiB, allocated at its start: no more than
        // the cap is ever needed (or 8 MiB, for a small cap and a high compression level).
        let cap_log = usize::BITS - limit.saturating_sub(1).leading_zeros();
        d.window_log_max(cap_log.clamp(Zstd::MIN_WINDOW_LOG, 31))?;
        Ok(Zstd(d))
    }
}

impl Write for Zstd {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Stage for Zstd {
    fn finish(self: Box<Self>) -> io::Result<Vec<u8>> {
        self.0.finish()?.finish()
    }
}

/// A decoder that could not be made (its error, told at the first use).
struct Failed(Option<io::Error>);

impl Write for Failed {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(self.error())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Failed {
    fn error(&mut self) -> io::Error {
        self.0
            .take()
            .unwrap_or_else(|| io::Error::other("the decoder could not be made"))
    }
}

impl Stage for Failed {
    fn finish(mut self: Box<Self>) -> io::Result<Vec<u8>> {
        Err(self.error())
    }
}

#[cfg(test)]
mod tests;
