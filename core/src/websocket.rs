//! RFC 6455 (WebSocket) on the wire, sans-IO: the opening handshake ([`handshake`]), the
//! client's frames read into messages ([`decode`]) and the server's frames written
//! ([`encode`]). Bytes and heads in, decisions and bytes out; the connection's rules (what a
//! message means, queues, timers) are [`connection`](crate::connection)'s.
//!
//! Why a codec of our own (docs/websocket.md, "Why a codec of our own"):
//! tungstenite, tokio-websockets, fastwebsockets, websocket-codec and ratchet read from an I/O
//! stream or a tokio codec, which `.ci/core-is-pure` keeps out of the core; soketto's
//! `base::Codec` parses frame heads from bytes but brings futures, rand, httparse and log for
//! about sixty lines, unmasks byte by byte and lets a 64-bit length with its top bit through;
//! websocket-sans-io (one release, 2023) and ws-frame (one release, 2019) cut frames and check
//! nothing, by design; ws-framer holds whole frames in a caller's fixed buffer, and
//! embedded-websocket copies each frame's payload into one, leaving messages to the caller. None reassembles fragments, checks text as it arrives, checks close frames or
//! applies the processor's "read up to twice the limit" rule, which are most of the work; so
//! the head is parsed here too, and RFC 6455's reading side is in one place, fuzzed
//! (`fuzz/fuzz_targets/websocket_frames.rs`).

pub mod decode;
pub mod encode;
pub mod handshake;

/// A frame's opcode (RFC 6455 §5.2, §11.8). The reserved ones (3–7, 0xB–0xF) are refused
/// by the decoder and have no variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opcode {
    Continuation,
    Text,
    Binary,
    Close,
    Ping,
    Pong,
}

impl Opcode {
    pub fn from_u8(bits: u8) -> Option<Opcode> {
        Some(match bits {
            0x0 => Opcode::Continuation,
            0x1 => Opcode::Text,
            0x2 => Opcode::Binary,
            0x8 => Opcode::Close,
            0x9 => Opcode::Ping,
            0xA => Opcode::Pong,
            _ => return None,
        })
    }

    pub fn as_u8(self) -> u8 {
        match self {
            Opcode::Continuation => 0x0,
            Opcode::Text => 0x1,
            Opcode::Binary => 0x2,
            Opcode::Close => 0x8,
            Opcode::Ping => 0x9,
            Opcode::Pong => 0xA,
        }
    }

    /// Control frames (RFC 6455 §5.5): at most 125 bytes, never fragmented.
    pub fn is_control(self) -> bool {
        matches!(self, Opcode::Close | Opcode::Ping | Opcode::Pong)
    }
}

/// Why a connection closes: the reason its close frame gives (and the host's log line), beside
/// its [`CloseCode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// The client's bytes broke the framing rules (1002), or a text was not UTF-8 (1007).
    ProtocolError,
    /// The host failed under the connection (1011).
    InternalError,
    /// The transport ended under the connection (1006: told, never sent).
    TransportClosed,
    /// The client's close frame (its code echoed, with no reason of ours).
    ClosedByClient,
    /// A host that cannot stop reading fed far past the queue's bound (1008).
    TooManyMessages,
    /// The connection held more than its own limit (1008).
    ConnectionMemory,
    /// The host's connections together held more than their budget (1013).
    ServerMemory,
    /// A frame over twice the message limit, refused unread (1009).
    MessageTooLarge,
    /// The connection reached its maximum age (1000).
    MaxAge,
    /// The host drains (1001).
    ShuttingDown,
    /// Nothing in flight and no message for the idle timeout (1000).
    IdleTimeout,
    /// The client did not read its frames as fast as they came (1008).
    ClientTooSlow,
}

impl CloseReason {
    /// Its words, as the close frame and the logs give them.
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::ProtocolError => "protocol error",
            CloseReason::InternalError => "internal error",
            CloseReason::TransportClosed => "transport closed",
            CloseReason::ClosedByClient => "closed by the client",
            CloseReason::TooManyMessages => "too many messages in flight",
            CloseReason::ConnectionMemory => "connection memory limit",
            CloseReason::ServerMemory => "server memory limit",
            CloseReason::MessageTooLarge => "message too large",
            CloseReason::MaxAge => "maximum connection age",
            CloseReason::ShuttingDown => "server shutting down",
            CloseReason::IdleTimeout => "idle timeout",
            CloseReason::ClientTooSlow => "client too slow",
        }
    }
}

/// A close frame's status code (RFC 6455 §7.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CloseCode(pub u16);

impl CloseCode {
    /// The purpose of the connection is fulfilled (idle timeout, maximum age).
    pub const NORMAL: CloseCode = CloseCode(1000);
    /// The server is going away (drain).
    pub const GOING_AWAY: CloseCode = CloseCode(1001);
    /// The peer broke the framing rules.
    pub const PROTOCOL_ERROR: CloseCode = CloseCode(1002);
    /// A text message (or a close reason) that is not UTF-8.
    pub const INVALID_PAYLOAD: CloseCode = CloseCode(1007);
    pub const POLICY_VIOLATION: CloseCode = CloseCode(1008);
    /// A message too big to read.
    pub const TOO_BIG: CloseCode = CloseCode(1009);
    pub const INTERNAL_ERROR: CloseCode = CloseCode(1011);
    /// The server is overloaded for now (IANA's registry): its memory budget is spent.
    pub const TRY_AGAIN_LATER: CloseCode = CloseCode(1013);

    /// May a peer send this code in a close frame (RFC 6455 §7.4.1, §7.4.2, and IANA's
    /// registry, which added 1012–1014)? 1004–1006 and 1015 are reserved, and 1005/1006/1015
    /// in particular must never be sent; 1016–2999 are for future RFCs; 3000–4999 belong to
    /// libraries and applications.
    pub fn is_sendable(self) -> bool {
        matches!(self.0, 1000..=1003 | 1007..=1014 | 3000..=4999)
    }
}
