//! The client's frames read into messages (RFC 6455 §5, §7.4, §8.1), in whatever pieces the
//! bytes arrive.
//!
//! Incremental and bounded: the decoder holds at most one frame head (14 bytes), one control
//! frame's payload (125 bytes) and the data message being assembled, which never exceeds the
//! read limit ([`read_limit`]: twice the message limit, as the processor reads today). A
//! message up to that size is read whole, so the connection can answer 413
//! `request_too_large` and carry on; a frame whose head would take the message past it is
//! refused from the head, its payload unread, with close code 1009.
//!
//! One pass over a message's bytes: each piece of payload is copied once into the message
//! (its only copy), unmasked and, for text, checked as UTF-8 while that block is still in the
//! cache; it leaves as [`Bytes`] without a copy. The message's buffer grows as its bytes
//! arrive (doubling, never past what its frames announce), never from a frame head alone: a
//! head announcing a large frame, then nothing, costs nothing ([`Decoder::held`] is at most
//! twice the bytes read, or [`MIN_BUFFER`]).
//!
//! Every refusal is an [`Error`] naming its close code; the decoder then stays failed. After a
//! close frame it reads nothing more (RFC 6455 §5.5.1: nothing may follow it).
//!
//! ```
//! use responses_core::websocket::decode::{Decoder, Message};
//!
//! let mut decoder = Decoder::new(1024);
//! // RFC 6455 §5.7's masked "Hello", arriving in two pieces.
//! let bytes = [0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58];
//! let mut input = &bytes[..4];
//! assert_eq!(decoder.decode(&mut input), Ok(None));
//! let mut input = &bytes[4..];
//! assert_eq!(decoder.decode(&mut input), Ok(Some(Message::Text("Hello".into()))));
//! assert!(input.is_empty());
//! ```

use std::fmt;

use bytes::Bytes;

use super::{CloseCode, Opcode};

/// The largest message (or single frame) the decoder reads whole: twice the connection's
/// message limit. A message between the two is read and refused by the connection (413, the
/// socket goes on); only a larger one is refused from its frame head, unread, which ends the
/// socket (1009).
pub fn read_limit(max_message_bytes: usize) -> usize {
    max_message_bytes.saturating_mul(2)
}

/// The longest frame head: 2 bytes, an 8-byte length, a 4-byte mask.
const MAX_HEAD: usize = 14;
/// The largest control frame payload (RFC 6455 §5.5).
pub const MAX_CONTROL_PAYLOAD: usize = 125;
/// Payload is unmasked and checked in blocks of this size, each still in the cache from its
/// copy when it is unmasked and validated.
const BLOCK: usize = 16 * 1024;
/// The smallest buffer a data message is given once its first payload bytes arrive (or its
/// announced size, if smaller): small messages take one allocation.
pub const MIN_BUFFER: usize = 4 * 1024;

/// What the client sent, whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// A text message, reassembled from its fragments: valid UTF-8.
    Text(Bytes),
    Binary(Bytes),
    /// A ping's payload (at most 125 bytes), to be echoed in a pong (RFC 6455 §5.5.2).
    Ping(Bytes),
    Pong(Bytes),
    /// The client's close frame; `None` when it carried no status code. Nothing is read
    /// after it.
    Close(Option<Close>),
}

/// A close frame's body (RFC 6455 §5.5.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Close {
    pub code: CloseCode,
    /// At most 123 bytes.
    pub reason: String,
}

/// Why the client's bytes cannot be read: each names the close code to answer with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// §5.1, §5.3: a client frame without a mask.
    Unmasked,
    /// §5.2: RSV1, RSV2 or RSV3 set; no extension is negotiated (permessage-deflate is
    /// declined at the handshake).
    ReservedBits,
    /// §5.2: opcodes 0x3–0x7 and 0xB–0xF.
    ReservedOpcode(u8),
    /// §5.5: a control frame without FIN.
    FragmentedControl,
    /// §5.5: a control frame payload over 125 bytes.
    ControlTooLong,
    /// §5.2: a 64-bit payload length with its most significant bit set.
    LengthHighBit,
    /// §5.4: a continuation frame with no fragmented message started.
    UnexpectedContinuation,
    /// §5.4: a text or binary frame while a fragmented message is still open.
    ExpectedContinuation,
    /// §5.5.1: a close body of one byte (a status code takes two).
    CloseTooShort,
    /// §7.4: a status code peers may not send (0–999, 1004–1006, 1015–2999, 5000 and up).
    InvalidCloseCode(u16),
    /// §8.1: a text message that is not UTF-8, found at the first byte that cannot start
    /// or continue a valid sequence.
    InvalidUtf8,
    /// §5.5.1: a close reason that is not UTF-8.
    InvalidCloseReason,
    /// The message would grow past the read limit (`size` is what its frames announce so
    /// far); refused from the frame head, its payload unread.
    TooBig { size: u64, limit: usize },
}

impl Error {
    /// The close code to end the connection with (RFC 6455 §7.4.1).
    pub fn close_code(&self) -> CloseCode {
        match self {
            Error::InvalidUtf8 | Error::InvalidCloseReason => CloseCode::INVALID_PAYLOAD,
            Error::TooBig { .. } => CloseCode::TOO_BIG,
            _ => CloseCode::PROTOCOL_ERROR,
        }
    }
}

impl fmt::Display for Error {
    /// Short enough for a close frame's reason (at most 123 bytes).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Unmasked => f.write_str("client frame not masked"),
            Error::ReservedBits => f.write_str("reserved bits set with no extension"),
            Error::ReservedOpcode(op) => write!(f, "reserved opcode {op:#x}"),
            Error::FragmentedControl => f.write_str("fragmented control frame"),
            Error::ControlTooLong => f.write_str("control frame over 125 bytes"),
            Error::LengthHighBit => f.write_str("payload length with its high bit set"),
            Error::UnexpectedContinuation => f.write_str("continuation with no message started"),
            Error::ExpectedContinuation => f.write_str("new message before the last one ended"),
            Error::CloseTooShort => f.write_str("close frame of one byte"),
            Error::InvalidCloseCode(code) => write!(f, "invalid close code {code}"),
            Error::InvalidUtf8 => f.write_str("text message not UTF-8"),
            Error::InvalidCloseReason => f.write_str("close reason not UTF-8"),
            Error::TooBig { limit, .. } => write!(f, "message over {limit} bytes"),
        }
    }
}

impl std::error::Error for Error {}

/// Reads one connection's client frames (see the module's documentation).
#[derive(Debug)]
pub struct Decoder {
    limit: usize,
    state: State,
    /// The frame head being read.
    head: [u8; MAX_HEAD],
    head_len: usize,
    /// The data message whose first frame has been read and whose last has not.
    message: Option<Partial>,
    /// The control frame payload being read.
    control: [u8; MAX_CONTROL_PAYLOAD],
    control_len: usize,
}

#[derive(Debug, Clone)]
enum State {
    Head,
    Payload(Frame),
    /// The client's close frame was read.
    Closed,
    Failed(Error),
}

/// The frame whose payload is being read.
#[derive(Debug, Clone, Copy)]
struct Frame {
    opcode: Opcode,
    fin: bool,
    mask: [u8; 4],
    /// Payload bytes read so far (the mask's phase).
    read: usize,
    remaining: usize,
}

#[derive(Debug)]
struct Partial {
    text: bool,
    bytes: Vec<u8>,
    /// What its frames announce so far (the frame being read included): the buffer never
    /// grows past it.
    announced: usize,
    /// Text only: `bytes[..valid]` is valid UTF-8; what follows is at most the first 3
    /// bytes of a sequence cut by a frame or a piece of input.
    valid: usize,
}

impl Decoder {
    /// A decoder for a connection whose messages are limited to `max_message_bytes` (read
    /// up to [`read_limit`] of it).
    pub fn new(max_message_bytes: usize) -> Decoder {
        Decoder {
            limit: read_limit(max_message_bytes),
            state: State::Head,
            head: [0; MAX_HEAD],
            head_len: 0,
            message: None,
            control: [0; MAX_CONTROL_PAYLOAD],
            control_len: 0,
        }
    }

    /// The largest message this decoder reads whole.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Reads from the front of `input` up to the end of the next whole message, and returns
    /// it; `Ok(None)` once `input` is used up with no message complete (the partial frame is
    /// kept for the next call). Call again with the rest of `input` until it is empty.
    /// After an error, every call returns it again; after a close frame, input is skipped.
    pub fn decode(&mut self, input: &mut &[u8]) -> Result<Option<Message>, Error> {
        loop {
            match self.state {
                State::Failed(ref e) => return Err(e.clone()),
                State::Closed => {
                    *input = &input[input.len()..];
                    return Ok(None);
                }
                State::Head => {
                    match self.read_head(input) {
                        Ok(true) => {}
                        Ok(false) => return Ok(None),
                        Err(e) => return Err(self.fail(e)),
                    };
                }
                State::Payload(mut frame) => {
                    let n = frame.remaining.min(input.len());
                    if n == 0 && frame.remaining > 0 {
                        return Ok(None);
                    }
                    let (chunk, rest) = input.split_at(n);
                    *input = rest;
                    if let Err(e) = self.read_payload(&frame, chunk) {
                        return Err(self.fail(e));
                    }
                    frame.read += n;
                    frame.remaining -= n;
                    if frame.remaining > 0 {
                        self.state = State::Payload(frame);
                        continue;
                    }
                    self.state = State::Head;
                    match self.end_frame(&frame) {
                        Ok(Some(message)) => return Ok(Some(message)),
                        Ok(None) => {}
                        Err(e) => return Err(self.fail(e)),
                    }
                }
            }
        }
    }

    /// Whether the client's close frame has been read.
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Bytes of payload held for the message being assembled (its buffer's capacity): at most
    /// twice what arrived of it (or [`MIN_BUFFER`]), never more than [`Decoder::limit`].
    pub fn held(&self) -> usize {
        self.message.as_ref().map_or(0, |m| m.bytes.capacity())
    }

    fn fail(&mut self, e: Error) -> Error {
        self.message = None;
        self.state = State::Failed(e.clone());
        e
    }

    /// Reads head bytes; true once the whole head is read (the state is then `Payload`).
    fn read_head(&mut self, input: &mut &[u8]) -> Result<bool, Error> {
        loop {
            let need = if self.head_len < 2 {
                2
            } else {
                2 + extended_length_bytes(self.head[1]) + 4
            };
            if self.head_len == need {
                self.start_frame()?;
                return Ok(true);
            }
            if input.is_empty() {
                return Ok(false);
            }
            let take = (need - self.head_len).min(input.len());
            self.head[self.head_len..self.head_len + take].copy_from_slice(&input[..take]);
            self.head_len += take;
            *input = &input[take..];
            if self.head_len == 2 {
                // Fail fast: all but the extended length is known from two bytes.
                self.check_start()?;
            }
        }
    }

    /// The rules the first two bytes of a head decide.
    fn check_start(&self) -> Result<(), Error> {
        let (b0, b1) = (self.head[0], self.head[1]);
        if b0 & 0x70 != 0 {
            return Err(Error::ReservedBits);
        }
        let opcode = Opcode::from_u8(b0 & 0x0F).ok_or(Error::ReservedOpcode(b0 & 0x0F))?;
        let fin = b0 & 0x80 != 0;
        if b1 & 0x80 == 0 {
            return Err(Error::Unmasked);
        }
        if opcode.is_control() {
            if !fin {
                return Err(Error::FragmentedControl);
            }
            if usize::from(b1 & 0x7F) > MAX_CONTROL_PAYLOAD {
                return Err(Error::ControlTooLong);
            }
        } else {
            match (opcode, self.message.is_some()) {
                (Opcode::Continuation, false) => return Err(Error::UnexpectedContinuation),
                (Opcode::Text | Opcode::Binary, true) => return Err(Error::ExpectedContinuation),
                _ => {}
            }
        }
        Ok(())
    }

    /// The whole head is read: its length against the limit, then the payload state.
    fn start_frame(&mut self) -> Result<(), Error> {
        let h = &self.head;
        let opcode = Opcode::from_u8(h[0] & 0x0F).ok_or(Error::ReservedOpcode(h[0] & 0x0F))?;
        let fin = h[0] & 0x80 != 0;
        let (len, at) = match h[1] & 0x7F {
            126 => (u64::from(u16::from_be_bytes([h[2], h[3]])), 4),
            127 => {
                let len = u64::from_be_bytes([h[2], h[3], h[4], h[5], h[6], h[7], h[8], h[9]]);
                if len >> 63 != 0 {
                    return Err(Error::LengthHighBit);
                }
                (len, 10)
            }
            n => (u64::from(n), 2),
        };
        let mask = [h[at], h[at + 1], h[at + 2], h[at + 3]];
        self.head_len = 0;
        if opcode.is_control() {
            self.control_len = 0;
        } else {
            let so_far = self.message.as_ref().map_or(0, |m| m.bytes.len());
            let size = (so_far as u64).saturating_add(len);
            if size > self.limit as u64 {
                return Err(Error::TooBig {
                    size,
                    limit: self.limit,
                });
            }
            // Within the limit, so within usize. Nothing is allocated for the frame yet: its
            // bytes are, as they arrive (`read_payload`).
            let size = size as usize;
            match &mut self.message {
                Some(m) => m.announced = size,
                None => {
                    self.message = Some(Partial {
                        text: opcode == Opcode::Text,
                        bytes: Vec::new(),
                        announced: size,
                        valid: 0,
                    });
                }
            }
        }
        self.state = State::Payload(Frame {
            opcode,
            fin,
            mask,
            read: 0,
            remaining: len as usize,
        });
        Ok(())
    }

    /// A piece of the current frame's payload: copied once, unmasked, and text checked.
    fn read_payload(&mut self, frame: &Frame, chunk: &[u8]) -> Result<(), Error> {
        if frame.opcode.is_control() {
            let start = self.control_len;
            let end = start + chunk.len();
            let dst = &mut self.control[start..end];
            dst.copy_from_slice(chunk);
            unmask(dst, frame.mask, frame.read);
            self.control_len = end;
            return Ok(());
        }
        let Some(m) = self.message.as_mut() else {
            // start_frame opened the message for every data frame.
            return Err(Error::UnexpectedContinuation);
        };
        let need = m.bytes.len() + chunk.len();
        if need > m.bytes.capacity() {
            // Grow with what came, doubling (for a message arriving in many pieces), never past
            // what the frames announce: an unfragmented message ends at its exact size.
            let target = need
                .max(m.bytes.capacity() * 2)
                .max(MIN_BUFFER)
                .min(m.announced);
            m.bytes.reserve_exact(target - m.bytes.len());
        }
        let mut read = frame.read;
        for block in chunk.chunks(BLOCK) {
            let start = m.bytes.len();
            m.bytes.extend_from_slice(block);
            unmask(&mut m.bytes[start..], frame.mask, read);
            read += block.len();
            if m.text {
                check_utf8(m)?;
            }
        }
        Ok(())
    }

    /// The current frame is read whole: a message, if it ends one.
    fn end_frame(&mut self, frame: &Frame) -> Result<Option<Message>, Error> {
        let payload = &self.control[..self.control_len];
        match frame.opcode {
            Opcode::Ping => Ok(Some(Message::Ping(Bytes::copy_from_slice(payload)))),
            Opcode::Pong => Ok(Some(Message::Pong(Bytes::copy_from_slice(payload)))),
            Opcode::Close => {
                let close = close_body(payload)?;
                self.message = None;
                self.state = State::Closed;
                Ok(Some(Message::Close(close)))
            }
            Opcode::Text | Opcode::Binary | Opcode::Continuation => {
                if !frame.fin {
                    return Ok(None);
                }
                let Some(m) = self.message.take() else {
                    return Err(Error::UnexpectedContinuation);
                };
                if m.text {
                    if m.valid != m.bytes.len() {
                        // The message ends inside a UTF-8 sequence.
                        return Err(Error::InvalidUtf8);
                    }
                    return Ok(Some(Message::Text(Bytes::from(m.bytes))));
                }
                Ok(Some(Message::Binary(Bytes::from(m.bytes))))
            }
        }
    }
}

/// How many bytes of extended length follow the second head byte.
fn extended_length_bytes(b1: u8) -> usize {
    match b1 & 0x7F {
        126 => 2,
        127 => 8,
        _ => 0,
    }
}

/// Unmasks `data`, the payload bytes from offset `at` of its frame (RFC 6455 §5.3), eight
/// bytes at a time.
pub(crate) fn unmask(data: &mut [u8], mask: [u8; 4], at: usize) {
    let mut key = [0u8; 4];
    for (i, k) in key.iter_mut().enumerate() {
        *k = mask[(at + i) & 3];
    }
    let wide = u64::from_ne_bytes([
        key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3],
    ]);
    let mut words = data.chunks_exact_mut(8);
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        word.copy_from_slice(&(u64::from_ne_bytes(w) ^ wide).to_ne_bytes());
    }
    // The remainder starts at a multiple of 8 from `at`: the same phase.
    for (b, k) in words.into_remainder().iter_mut().zip(key.iter().cycle()) {
        *b ^= k;
    }
}

/// Checks the text's new bytes: an error as soon as a byte cannot be part of valid UTF-8; a
/// sequence cut at the end waits for the next bytes.
fn check_utf8(m: &mut Partial) -> Result<(), Error> {
    match simdutf8::compat::from_utf8(&m.bytes[m.valid..]) {
        Ok(_) => m.valid = m.bytes.len(),
        Err(e) if e.error_len().is_none() => m.valid += e.valid_up_to(),
        Err(_) => return Err(Error::InvalidUtf8),
    }
    Ok(())
}

/// A close frame's body: nothing, or a status code and a UTF-8 reason.
fn close_body(payload: &[u8]) -> Result<Option<Close>, Error> {
    match payload {
        [] => Ok(None),
        [_] => Err(Error::CloseTooShort),
        [hi, lo, reason @ ..] => {
            let code = CloseCode(u16::from_be_bytes([*hi, *lo]));
            if !code.is_sendable() {
                return Err(Error::InvalidCloseCode(code.0));
            }
            let reason = std::str::from_utf8(reason).map_err(|_| Error::InvalidCloseReason)?;
            Ok(Some(Close {
                code,
                reason: reason.to_owned(),
            }))
        }
    }
}

#[cfg(test)]
mod tests;
