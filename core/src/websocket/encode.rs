//! The server's frames (RFC 6455 §5.2): unmasked (§5.1: a server never masks), each message
//! one frame with FIN set. A payload is copied once, into the frame.

use bytes::{BufMut, Bytes};

use super::decode::MAX_CONTROL_PAYLOAD;
use super::{CloseCode, Opcode};

/// The longest server frame head: 2 bytes and an 8-byte length.
pub const MAX_HEAD: usize = 10;

/// A frame head, for a caller that sends it and the payload as separate pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    bytes: [u8; MAX_HEAD],
    len: u8,
}

impl Head {
    /// The head of a whole (FIN), unmasked frame of `payload_len` bytes.
    pub fn new(opcode: Opcode, payload_len: usize) -> Head {
        let mut bytes = [0u8; MAX_HEAD];
        bytes[0] = 0x80 | opcode.as_u8();
        let len = match payload_len {
            0..=125 => {
                bytes[1] = payload_len as u8;
                2
            }
            126..=0xFFFF => {
                bytes[1] = 126;
                bytes[2..4].copy_from_slice(&(payload_len as u16).to_be_bytes());
                4
            }
            _ => {
                bytes[1] = 127;
                bytes[2..10].copy_from_slice(&(payload_len as u64).to_be_bytes());
                10
            }
        };
        Head { bytes, len }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// The length, head and payload, of the server frame `bytes` start with (as [`Head`] writes
/// it); `None` if they hold less than its head.
pub fn frame_len(bytes: &[u8]) -> Option<usize> {
    let (head, payload) = match *bytes.get(1)? & 0x7F {
        126 => (
            4,
            u64::from(u16::from_be_bytes(bytes.get(2..4)?.try_into().ok()?)),
        ),
        127 => (10, u64::from_be_bytes(bytes.get(2..10)?.try_into().ok()?)),
        n => (2, u64::from(n)),
    };
    usize::try_from(payload).ok()?.checked_add(head)
}

/// Appends one whole frame to `out`.
pub fn write(out: &mut impl BufMut, opcode: Opcode, payload: &[u8]) {
    out.put_slice(Head::new(opcode, payload.len()).as_bytes());
    out.put_slice(payload);
}

/// One whole frame, in one allocation of its exact size.
pub fn frame(opcode: Opcode, payload: &[u8]) -> Bytes {
    let head = Head::new(opcode, payload.len());
    let mut out = Vec::with_capacity(head.as_bytes().len() + payload.len());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(payload);
    Bytes::from(out)
}

/// A text message (the caller's bytes are UTF-8: the events we write are JSON).
pub fn text(payload: &[u8]) -> Bytes {
    frame(Opcode::Text, payload)
}

/// A ping; a payload over 125 bytes is cut to 125 (RFC 6455 §5.5).
pub fn ping(payload: &[u8]) -> Bytes {
    frame(
        Opcode::Ping,
        &payload[..payload.len().min(MAX_CONTROL_PAYLOAD)],
    )
}

/// The answer to a ping: its payload back (RFC 6455 §5.5.3), at most 125 bytes as the
/// decoder guarantees.
pub fn pong(payload: &[u8]) -> Bytes {
    frame(
        Opcode::Pong,
        &payload[..payload.len().min(MAX_CONTROL_PAYLOAD)],
    )
}

/// A close frame with a status code and a reason, the reason cut to 123 bytes at a character
/// boundary (RFC 6455 §5.5.1: the body is at most 125 bytes).
pub fn close(code: CloseCode, reason: &str) -> Bytes {
    let mut end = reason.len().min(MAX_CONTROL_PAYLOAD - 2);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut body = [0u8; MAX_CONTROL_PAYLOAD];
    body[..2].copy_from_slice(&code.0.to_be_bytes());
    body[2..2 + end].copy_from_slice(&reason.as_bytes()[..end]);
    frame(Opcode::Close, &body[..2 + end])
}

/// A close frame with no body: the answer to a client's close that carried no status code
/// (RFC 6455 §5.5.1 echoes the code when there is one).
pub fn close_empty() -> Bytes {
    frame(Opcode::Close, &[])
}
