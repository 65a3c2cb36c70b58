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
//! - the work: the bytes every decoder reads (the encoded body, and each layer between two
//!   decoders) add up to at most [`WORK_PER_CAP`] times the cap, a `br` byte counting
//!   [`Coding::cost`] times. Bytes that decode to nothing (empty gzip members and deflate
//!   blocks, zstd skippable frames, brotli metadata) are read, so counted: a body of any shape
//!   costs a bounded time (benches/decode.rs measures the worst);
//! - at most [`MAX_CODINGS`] codings (a 415 beyond).
//!
//! Memory: the decoded body (at most the cap) and each coding's window (deflate 32 KiB,
//! brotli at most 16 MiB, zstd at most the cap or 8 MiB, whichever is larger: a frame asking
//! for more is refused).

use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::openresponses::{ApiError, ErrorCode};

/// The request header read.
pub const HEADER: &str = "content-encoding";

/// The most codings a body may have stacked. One is what clients send; two is a client's
/// coding compressed again on the way (a proxy); no sender stacks three, and each layer adds
/// a decoder's worth of work to the body's budget.
pub const MAX_CODINGS: usize = 2;

/// The decoders of one body read at most this many times `max_request_bytes` in all (see the
/// module docs): two layers of incompressible content at the cap fit, and no more.
pub const WORK_PER_CAP: usize = 2;

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

    /// What one byte read by this coding's decoder counts against the work budget: its worst
    /// cost per byte, in units of the cheapest's, rounded up (benches/decode.rs measured,
    /// on hostile bodies: gzip and deflate ~25 ns a byte at worst (empty dynamic blocks,
    /// empty members), zstd ~7 (empty frames), brotli ~200 (small meta-blocks each with its
    /// own prefix codes: its decoder allocates and builds tables for every one)).
    pub fn cost(self) -> usize {
        match self {
            Coding::Gzip | Coding::Deflate | Coding::Zstd => 1,
            Coding::Brotli => 8,
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
            read: AtomicUsize::new(0),
            budget: limit.saturating_mul(WORK_PER_CAP),
        });
        // The coding applied last is undone first; each decoder's reads are metered.
        for coding in codings {
            chain = Box::new(Metered {
                decoder: stage(*coding, chain, limit),
                cost: coding.cost(),
                work: Arc::clone(&work),
            });
        }
        Decoder {
            chain: Some(chain),
            codings: codings.to_vec(),
            taken: 0,
            limit,
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
        match e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<TooLarge>())
        {
            Some(TooLarge::Decoded) => too_large(self.limit, "The request body, decoded,"),
            Some(TooLarge::Work) => {
                let names: Vec<&str> = self.codings.iter().map(|c| c.as_str()).collect();
                ApiError::invalid_body(format!(
                    "The request body takes more decoding than this server gives one body: \
                     its layers ({}) add up to more than {WORK_PER_CAP} times \
                     --max-request-bytes ({} bytes), a br byte counting {}.",
                    names.join(", "),
                    self.limit,
                    Coding::Brotli.cost()
                ))
                .with_status(413)
                .with_code(ErrorCode::RequestTooLarge)
            }
            None => self.invalid(&e.to_string()),
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

/// The decoder of `coding`, writing into `next`.
fn stage(coding: Coding, next: Box<dyn Stage>, limit: usize) -> Box<dyn Stage> {
    match coding {
        Coding::Gzip => Box::new(Gzip(flate2::write::MultiGzDecoder::new(next))),
        Coding::Deflate => Box::new(Deflate::Sniffing {
            head: Vec::new(),
            next,
        }),
        Coding::Brotli => Box::new(Brotli(brotli_decompressor::DecompressorWriter::new(
            next,
            BROTLI_BUFFER,
        ))),
        Coding::Zstd => match Zstd::new(next, limit) {
            Ok(z) => Box::new(z),
            Err(e) => Box::new(Failed(Some(e))),
        },
    }
}

/// The output buffer of the brotli decoder (its window is its own, at most 16 MiB).
const BROTLI_BUFFER: usize = 32 * 1024;

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

/// What the decoders of one body have read, against its budget (shared by its stages: an
/// outer decoder's output is read by the inner one within the same write).
#[derive(Debug)]
struct Work {
    read: AtomicUsize,
    budget: usize,
}

/// A decoder whose reads count against the body's [`Work`]: refused before it reads a byte
/// over the budget.
struct Metered {
    decoder: Box<dyn Stage>,
    /// What a byte read costs ([`Coding::cost`]).
    cost: usize,
    work: Arc<Work>,
}

impl Write for Metered {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // Counted before the decoder runs, so that the decoders inside, reading its output
        // within this write, see it; what it leaves unread is given back.
        let cost = buf.len().saturating_mul(self.cost);
        let read = self.work.read.fetch_add(cost, Ordering::Relaxed);
        if read.saturating_add(cost) > self.work.budget {
            return Err(io::Error::other(TooLarge::Work));
        }
        let n = self.decoder.write(buf)?;
        let unread = (buf.len() - n).saturating_mul(self.cost);
        self.work.read.fetch_sub(unread, Ordering::Relaxed);
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

struct Gzip(flate2::write::MultiGzDecoder<Box<dyn Stage>>);

impl Write for Gzip {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Stage for Gzip {
    fn finish(self: Box<Self>) -> io::Result<Vec<u8>> {
        self.0.finish()?.finish()
    }
}

/// `deflate` is zlib by the HTTP spec; some clients send raw deflate. The first two bytes
/// tell: a zlib header names the deflate method and is a multiple of 31.
enum Deflate {
    Sniffing {
        head: Vec<u8>,
        next: Box<dyn Stage>,
    },
    Zlib(flate2::write::ZlibDecoder<Box<dyn Stage>>),
    Raw(flate2::write::DeflateDecoder<Box<dyn Stage>>),
    /// Between states (never seen outside a call).
    Empty,
}

impl Deflate {
    fn is_zlib(head: &[u8]) -> bool {
        let (cmf, flg) = (head[0], head[1]);
        cmf & 0x0f == 8 && (u16::from(cmf) << 8 | u16::from(flg)) % 31 == 0
    }

    /// Picks the format from `head` (two bytes, or fewer at the end of the body).
    fn decide(&mut self) -> io::Result<()> {
        if !matches!(self, Deflate::Sniffing { .. }) {
            return Ok(());
        }
        let Deflate::Sniffing { head, next } = std::mem::replace(self, Deflate::Empty) else {
            unreachable!("matched above")
        };
        *self = if head.len() >= 2 && Deflate::is_zlib(&head) {
            Deflate::Zlib(flate2::write::ZlibDecoder::new(next))
        } else {
            Deflate::Raw(flate2::write::DeflateDecoder::new(next))
        };
        self.write_all(&head)
    }
}

impl Write for Deflate {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Deflate::Sniffing { head, .. } => {
                let n = buf.len().min(2 - head.len());
                head.extend_from_slice(&buf[..n]);
                if head.len() == 2 {
                    self.decide()?;
                }
                Ok(n)
            }
            Deflate::Zlib(d) => d.write(buf),
            Deflate::Raw(d) => d.write(buf),
            Deflate::Empty => Err(io::Error::other("the deflate decoder failed")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Deflate::Zlib(d) => d.flush(),
            Deflate::Raw(d) => d.flush(),
            Deflate::Sniffing { .. } | Deflate::Empty => Ok(()),
        }
    }
}

impl Stage for Deflate {
    fn finish(mut self: Box<Self>) -> io::Result<Vec<u8>> {
        self.decide()?;
        match *self {
            Deflate::Zlib(d) => d.finish()?.finish(),
            Deflate::Raw(d) => d.finish()?.finish(),
            Deflate::Sniffing { .. } | Deflate::Empty => {
                Err(io::Error::other("the deflate decoder failed"))
            }
        }
    }
}

struct Brotli(brotli_decompressor::DecompressorWriter<Box<dyn Stage>>);

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
            Ok(next) => next.finish(),
            Err(_) => Err(io::Error::other("the brotli stream is not complete")),
        }
    }
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
