//! The decoder against RFC 6455, rule by rule (sections in the test names), the edge cases of
//! the Autobahn TestSuite that can be written as bytes (case numbers in comments), and a
//! property: any chunking of a valid frame sequence reads the same messages.

use proptest::prelude::*;

use super::*;
use crate::websocket::encode;

const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

/// A client frame, masked with `mask`, its length in the shortest form.
fn frame(fin: bool, opcode: u8, payload: &[u8], mask: [u8; 4]) -> Vec<u8> {
    raw_frame(fin, 0, opcode, payload, Some(mask), None)
}

/// Any frame: RSV bits, no mask, or the length in a chosen form (0: 7 bits, 2: 16, 8: 64).
fn raw_frame(
    fin: bool,
    rsv: u8,
    opcode: u8,
    payload: &[u8],
    mask: Option<[u8; 4]>,
    length_form: Option<usize>,
) -> Vec<u8> {
    let mut out = vec![(u8::from(fin) << 7) | (rsv << 4) | opcode];
    let masked = if mask.is_some() { 0x80 } else { 0 };
    let n = payload.len();
    let form = length_form.unwrap_or(match n {
        0..=125 => 0,
        126..=0xFFFF => 2,
        _ => 8,
    });
    match form {
        0 => out.push(masked | n as u8),
        2 => {
            out.push(masked | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        _ => {
            out.push(masked | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    match mask {
        Some(m) => {
            out.extend_from_slice(&m);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ m[i % 4]));
        }
        None => out.extend_from_slice(payload),
    }
    out
}

fn text(payload: &str) -> Vec<u8> {
    frame(true, 0x1, payload.as_bytes(), MASK)
}

/// Everything `bytes` decode to, fed in `chunk`-byte pieces: the messages, then the error
/// that stopped the decoder, if any.
fn decode_in(decoder: &mut Decoder, bytes: &[u8], chunk: usize) -> (Vec<Message>, Option<Error>) {
    let mut out = Vec::new();
    for piece in bytes.chunks(chunk.max(1)) {
        let mut input = piece;
        loop {
            match decoder.decode(&mut input) {
                Ok(Some(m)) => out.push(m),
                Ok(None) => break,
                Err(e) => return (out, Some(e)),
            }
        }
        assert!(input.is_empty(), "Ok(None) leaves no input behind");
    }
    (out, None)
}

fn decode(bytes: &[u8]) -> (Vec<Message>, Option<Error>) {
    decode_in(&mut Decoder::new(1 << 20), bytes, usize::MAX)
}

fn error_of(bytes: &[u8]) -> Error {
    decode(bytes).1.expect("an error")
}

fn t(s: &str) -> Message {
    Message::Text(Bytes::copy_from_slice(s.as_bytes()))
}

#[test]
fn rfc6455_5_7_single_frame_masked_text_of_the_example() {
    // §5.7: "A single-frame masked text message" containing "Hello", byte for byte.
    let bytes = [
        0x81, 0x85, 0x37, 0xfa, 0x21, 0x3d, 0x7f, 0x9f, 0x4d, 0x51, 0x58,
    ];
    assert_eq!(decode(&bytes), (vec![t("Hello")], None));
}

#[test]
fn rfc6455_5_4_fragments_are_reassembled() {
    // §5.7's fragmented "Hel" + "lo", masked (a client's).
    let mut bytes = frame(false, 0x1, b"Hel", MASK);
    bytes.extend(frame(true, 0x0, b"lo", [1, 2, 3, 4]));
    assert_eq!(decode(&bytes), (vec![t("Hello")], None));
    // Binary, three fragments, one of them empty.
    let mut bytes = frame(false, 0x2, &[0, 1], MASK);
    bytes.extend(frame(false, 0x0, &[], MASK));
    bytes.extend(frame(true, 0x0, &[2], MASK));
    assert_eq!(
        decode(&bytes),
        (vec![Message::Binary(Bytes::from_static(&[0, 1, 2]))], None)
    );
}

#[test]
fn rfc6455_5_2_lengths_in_7_16_and_64_bits() {
    for n in [0, 125, 126, 127, 0xFFFF, 0x10000, 200_000] {
        let payload: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let (messages, error) = decode(&frame(true, 0x2, &payload, MASK));
        assert_eq!(error, None, "{n}");
        assert_eq!(messages, vec![Message::Binary(Bytes::from(payload))], "{n}");
    }
    // A non-minimal length form is read (RFC 6455 asks senders for the minimal one; refusing
    // it would protect nothing).
    let (messages, _) = decode(&raw_frame(true, 0, 0x1, b"hi", Some(MASK), Some(8)));
    assert_eq!(messages, vec![t("hi")]);
}

#[test]
fn rfc6455_5_1_an_unmasked_client_frame_is_a_protocol_error() {
    let e = error_of(&raw_frame(true, 0, 0x1, b"hi", None, None));
    assert_eq!(e, Error::Unmasked);
    assert_eq!(e.close_code(), CloseCode::PROTOCOL_ERROR);
    // Found from the head's two bytes, before any payload.
    let mut d = Decoder::new(100);
    assert_eq!(d.decode(&mut &[0x81, 0x02][..]), Err(Error::Unmasked));
}

#[test]
fn rfc6455_5_2_reserved_bits_without_extension_are_a_protocol_error() {
    // Autobahn 3.1–3.7: RSV 1 through 7, on text, binary and ping frames.
    for rsv in 1..=7 {
        for opcode in [0x1, 0x2, 0x9] {
            let e = error_of(&raw_frame(true, rsv, opcode, b"x", Some(MASK), None));
            assert_eq!(e, Error::ReservedBits);
            assert_eq!(e.close_code(), CloseCode::PROTOCOL_ERROR);
        }
    }
}

#[test]
fn rfc6455_5_2_reserved_opcodes_are_a_protocol_error() {
    // Autobahn 4.1.1–4.2.5: non-control 3–7, control 0xB–0xF.
    for opcode in (0x3..=0x7).chain(0xB..=0xF) {
        let e = error_of(&frame(true, opcode, b"", MASK));
        assert_eq!(e, Error::ReservedOpcode(opcode));
        assert_eq!(e.close_code(), CloseCode::PROTOCOL_ERROR);
    }
    // Autobahn 4.1.3: after a valid message, which is still delivered.
    let mut bytes = text("ok");
    bytes.extend(frame(true, 0x5, b"", MASK));
    assert_eq!(
        decode(&bytes),
        (vec![t("ok")], Some(Error::ReservedOpcode(5)))
    );
}

#[test]
fn rfc6455_5_5_control_frames_are_short_and_whole() {
    // Autobahn 2.5: a ping of 126 bytes; 5.1/5.2: fragmented ping and pong.
    let e = error_of(&frame(true, 0x9, &[0; 126], MASK));
    assert_eq!(e, Error::ControlTooLong);
    assert_eq!(e.close_code(), CloseCode::PROTOCOL_ERROR);
    assert_eq!(
        error_of(&frame(false, 0x9, b"a", MASK)),
        Error::FragmentedControl
    );
    assert_eq!(
        error_of(&frame(false, 0xA, b"a", MASK)),
        Error::FragmentedControl
    );
    assert_eq!(
        error_of(&frame(false, 0x8, b"", MASK)),
        Error::FragmentedControl
    );
    // Autobahn 2.4: 125 bytes is allowed, even with a tiny message limit.
    let (messages, error) = decode_in(&mut Decoder::new(0), &frame(true, 0x9, &[7; 125], MASK), 3);
    assert_eq!(error, None);
    assert_eq!(messages, vec![Message::Ping(Bytes::from(vec![7; 125]))]);
}

#[test]
fn rfc6455_5_5_2_pings_and_pongs_carry_their_payload() {
    // §5.7: a masked ping "Hello"; Autobahn 2.2, 2.3: text and binary payloads; 2.1: empty.
    let mut bytes = frame(true, 0x9, b"Hello", MASK);
    bytes.extend(frame(true, 0x9, &[0, 255, 254], MASK));
    bytes.extend(frame(true, 0xA, b"", MASK));
    assert_eq!(
        decode(&bytes).0,
        vec![
            Message::Ping(Bytes::from_static(b"Hello")),
            Message::Ping(Bytes::from_static(&[0, 255, 254])),
            Message::Pong(Bytes::new()),
        ]
    );
}

#[test]
fn rfc6455_5_4_control_frames_interleave_with_fragments() {
    // Autobahn 5.6–5.8: a ping between two fragments of a text message.
    let mut bytes = frame(false, 0x1, b"frag", MASK);
    bytes.extend(frame(true, 0x9, b"p", MASK));
    bytes.extend(frame(true, 0xA, b"q", MASK));
    bytes.extend(frame(true, 0x0, b"ment", MASK));
    assert_eq!(
        decode(&bytes).0,
        vec![
            Message::Ping(Bytes::from_static(b"p")),
            Message::Pong(Bytes::from_static(b"q")),
            t("fragment"),
        ]
    );
}

#[test]
fn rfc6455_5_4_continuation_rules() {
    // Autobahn 5.9–5.11: a continuation with nothing to continue.
    let e = error_of(&frame(true, 0x0, b"x", MASK));
    assert_eq!(e, Error::UnexpectedContinuation);
    assert_eq!(e.close_code(), CloseCode::PROTOCOL_ERROR);
    let mut bytes = text("whole");
    bytes.extend(frame(false, 0x0, b"x", MASK));
    assert_eq!(
        decode(&bytes),
        (vec![t("whole")], Some(Error::UnexpectedContinuation))
    );
    // Autobahn 5.18: a new text frame before the last fragment.
    let mut bytes = frame(false, 0x1, b"a", MASK);
    bytes.extend(frame(true, 0x1, b"b", MASK));
    assert_eq!(error_of(&bytes), Error::ExpectedContinuation);
    let mut bytes = frame(false, 0x2, b"a", MASK);
    bytes.extend(frame(false, 0x1, b"b", MASK));
    assert_eq!(error_of(&bytes), Error::ExpectedContinuation);
}

#[test]
fn rfc6455_5_2_a_64_bit_length_with_its_high_bit_set_is_a_protocol_error() {
    let mut bytes = vec![0x82, 0x80 | 127];
    bytes.extend_from_slice(&(1u64 << 63).to_be_bytes());
    bytes.extend_from_slice(&MASK);
    let mut d = Decoder::new(usize::MAX);
    let e = d.decode(&mut &bytes[..]).unwrap_err();
    assert_eq!(e, Error::LengthHighBit);
    assert_eq!(e.close_code(), CloseCode::PROTOCOL_ERROR);
}

#[test]
fn rfc6455_5_5_1_close_frames() {
    // Autobahn 7.3.1: empty body.
    assert_eq!(
        decode(&frame(true, 0x8, b"", MASK)).0,
        vec![Message::Close(None)]
    );
    // 7.3.2: one byte.
    let e = error_of(&frame(true, 0x8, &[0x03], MASK));
    assert_eq!(
        (e.clone(), e.close_code()),
        (Error::CloseTooShort, CloseCode::PROTOCOL_ERROR)
    );
    // 7.3.3–7.3.5: a code, with and without a reason (123 bytes at most: 2 + 123 = 125).
    let mut body = 1000u16.to_be_bytes().to_vec();
    body.extend_from_slice("bye ✓".as_bytes());
    assert_eq!(
        decode(&frame(true, 0x8, &body, MASK)).0,
        vec![Message::Close(Some(Close {
            code: CloseCode(1000),
            reason: "bye ✓".into()
        }))]
    );
    let mut long = 1001u16.to_be_bytes().to_vec();
    long.extend_from_slice(&[b'a'; 123]);
    assert!(decode(&frame(true, 0x8, &long, MASK)).1.is_none());
    // 7.5.1: a reason that is not UTF-8.
    let mut bad = 1000u16.to_be_bytes().to_vec();
    bad.extend_from_slice(&[
        0xce, 0xba, 0xe1, 0xbd, 0xb9, 0xcf, 0x83, 0xce, 0xbc, 0xce, 0xb5, 0xed, 0xa0, 0x80,
    ]);
    let e = error_of(&frame(true, 0x8, &bad, MASK));
    assert_eq!(
        (e.clone(), e.close_code()),
        (Error::InvalidCloseReason, CloseCode::INVALID_PAYLOAD)
    );
}

#[test]
fn rfc6455_7_4_close_codes_peers_may_and_may_not_send() {
    // Autobahn 7.7.x (valid, plus IANA's 1012–1014) and 7.9.x (invalid).
    for code in [
        1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014, 3000, 3999, 4000,
        4999,
    ] {
        let (messages, error) = decode(&frame(true, 0x8, &u16::to_be_bytes(code), MASK));
        assert_eq!(error, None, "{code}");
        assert_eq!(
            messages,
            vec![Message::Close(Some(Close {
                code: CloseCode(code),
                reason: String::new()
            }))]
        );
    }
    for code in [
        0, 999, 1004, 1005, 1006, 1015, 1016, 1100, 2000, 2999, 5000, 65535,
    ] {
        let e = error_of(&frame(true, 0x8, &u16::to_be_bytes(code), MASK));
        assert_eq!(e, Error::InvalidCloseCode(code));
        assert_eq!(e.close_code(), CloseCode::PROTOCOL_ERROR);
    }
}

#[test]
fn rfc6455_5_5_1_nothing_is_read_after_a_close_frame() {
    let mut bytes = frame(true, 0x8, &1000u16.to_be_bytes(), MASK);
    bytes.extend(text("late"));
    // Garbage too: the decoder no longer looks.
    bytes.extend_from_slice(&[0xFF; 8]);
    let mut d = Decoder::new(100);
    let (messages, error) = decode_in(&mut d, &bytes, 5);
    assert_eq!(messages.len(), 1);
    assert_eq!(error, None);
    assert!(d.is_closed());
    assert_eq!(d.held(), 0);
}

#[test]
fn rfc6455_8_1_text_must_be_utf8() {
    // Autobahn 6.3.1, 6.6.x, 6.8–6.21: an invalid byte, a lone continuation byte, an overlong
    // form, a surrogate, a code point past U+10FFFF, a sequence cut by the message's end.
    let invalid: [&[u8]; 8] = [
        &[0xFF],
        &[b'a', 0x80],
        &[0xC0, 0xAF],
        &[0xE0, 0x80, 0xAF],
        &[0xED, 0xA0, 0x80],
        &[0xF4, 0x90, 0x80, 0x80],
        &[0xF8, 0x88, 0x80, 0x80, 0x80],
        &[0xCE, 0xBA, 0xE1],
    ];
    for bytes in invalid {
        let e = error_of(&frame(true, 0x1, bytes, MASK));
        assert_eq!(e, Error::InvalidUtf8, "{bytes:x?}");
        assert_eq!(e.close_code(), CloseCode::INVALID_PAYLOAD);
    }
    // Binary is not checked.
    assert!(decode(&frame(true, 0x2, &[0xFF], MASK)).1.is_none());
}

#[test]
fn rfc6455_8_1_utf8_sequences_cut_by_fragments_and_pieces_are_valid() {
    // Autobahn 6.2.3/6.2.4: "Hello-µ@ßöäüàá-UTF-8!!" fragmented at every byte.
    let s = "Hello-µ@ßöäüàá-UTF-8!!";
    let b = s.as_bytes();
    let mut bytes = Vec::new();
    for (i, byte) in b.iter().enumerate() {
        let opcode = if i == 0 { 0x1 } else { 0x0 };
        bytes.extend(frame(i + 1 == b.len(), opcode, &[*byte], MASK));
    }
    for chunk in [1, 2, 3, 7, usize::MAX] {
        let (messages, error) = decode_in(&mut Decoder::new(100), &bytes, chunk);
        assert_eq!((messages, error), (vec![t(s)], None), "{chunk}");
    }
}

#[test]
fn rfc6455_8_1_invalid_text_fails_fast_before_the_message_ends() {
    // Autobahn 6.4.1: the first fragment is invalid; the rest never comes.
    let first = frame(
        false,
        0x1,
        &[0xCE, 0xBA, 0xE1, 0xBD, 0xB9, 0xF4, 0x90, 0x80, 0x80],
        MASK,
    );
    let mut d = Decoder::new(100);
    assert_eq!(d.decode(&mut &first[..]), Err(Error::InvalidUtf8));
    // 6.4.3: inside one frame: the invalid prefix is enough, its payload's end unread.
    let whole = frame(true, 0x1, &[b'a', b'b', 0xFF, b'c', b'd', b'e'], MASK);
    let mut d = Decoder::new(100);
    let head_and_prefix = &whole[..6 + 3];
    assert_eq!(d.decode(&mut &head_and_prefix[..]), Err(Error::InvalidUtf8));
    // Errors stick.
    assert_eq!(d.decode(&mut &text("fine")[..]), Err(Error::InvalidUtf8));
}

#[test]
fn size_caps_read_up_to_twice_the_limit_and_refuse_beyond_from_the_head() {
    let limit = 10;
    let mut d = Decoder::new(limit);
    assert_eq!(d.limit(), 20);
    // Up to twice the limit: read whole (the connection answers 413 and goes on).
    let (messages, error) = decode_in(&mut d, &text(&"x".repeat(20)), 4);
    assert_eq!((messages, error), (vec![t(&"x".repeat(20))], None));
    // One byte more: refused from the head, before any payload byte arrives.
    let over = frame(true, 0x1, &[b'x'; 21], MASK);
    let mut d = Decoder::new(limit);
    let e = d.decode(&mut &over[..6]).unwrap_err();
    assert_eq!(
        e,
        Error::TooBig {
            size: 21,
            limit: 20
        }
    );
    assert_eq!(e.close_code(), CloseCode::TOO_BIG);
    assert_eq!(d.held(), 0);
    // A fragmented message growing past it: refused at the head of the frame that would.
    let mut bytes = frame(false, 0x1, &[b'x'; 15], MASK);
    let second = frame(true, 0x0, &[b'x'; 6], MASK);
    bytes.extend_from_slice(&second[..6]);
    let mut d = Decoder::new(limit);
    let (messages, error) = decode_in(&mut d, &bytes, 1);
    assert!(messages.is_empty());
    assert_eq!(
        error,
        Some(Error::TooBig {
            size: 21,
            limit: 20
        })
    );
    // A huge announced length, far over.
    let mut huge = vec![0x82, 0x80 | 127];
    huge.extend_from_slice(&(u64::MAX >> 1).to_be_bytes());
    huge.extend_from_slice(&MASK);
    assert!(matches!(error_of(&huge), Error::TooBig { .. }));
}

#[test]
fn memory_held_grows_with_the_bytes_that_came_never_with_what_a_head_announces() {
    // A head announcing a frame at the read limit, then nothing: nothing is held.
    let payload = vec![b'a'; 400_000];
    let bytes = frame(true, 0x1, &payload, MASK);
    let mut d = Decoder::new(200_000);
    assert_eq!(d.decode(&mut &bytes[..14]), Ok(None));
    assert_eq!(d.held(), 0, "announced, not sent");
    // Its bytes, as they come: at most twice what came (or the smallest buffer).
    let mut at = 14;
    for piece in [1, 100, 5_000, 30_000, 100_000] {
        assert_eq!(d.decode(&mut &bytes[at..at + piece]), Ok(None));
        at += piece;
        let came = at - 14;
        assert!(
            d.held() >= came && d.held() <= (2 * came).max(MIN_BUFFER),
            "{} held for {came} bytes",
            d.held()
        );
    }
    // Never past what the frame announced: the whole message ends at its exact size.
    let message = d.decode(&mut &bytes[at..]).unwrap().unwrap();
    assert_eq!(message, Message::Text(Bytes::from(payload)));
    assert_eq!(d.held(), 0);
    let mut d = Decoder::new(200_000);
    assert_eq!(d.decode(&mut &bytes[..bytes.len() - 1]), Ok(None));
    assert_eq!(d.held(), 399_999, "what came in one piece, exactly");
    // A small message takes what it announced, once.
    let mut d = Decoder::new(200_000);
    assert_eq!(d.decode(&mut &text("hello")[..8]), Ok(None));
    assert_eq!(d.held(), 5);
    // Many small fragments: the buffer doubles, capped by what they announce.
    let mut bytes = frame(false, 0x2, &[1; 3], MASK);
    for _ in 0..5 {
        bytes.extend(frame(false, 0x0, &[1; 3], MASK));
    }
    let mut d = Decoder::new(10);
    let (_, error) = decode_in(&mut d, &bytes, 2);
    assert_eq!(error, None);
    assert_eq!(d.held(), 18);
}

#[test]
fn empty_messages() {
    let mut bytes = text("");
    bytes.extend(frame(false, 0x1, b"", MASK));
    bytes.extend(frame(true, 0x0, b"", MASK));
    bytes.extend(frame(true, 0x2, b"", MASK));
    assert_eq!(
        decode(&bytes),
        (vec![t(""), t(""), Message::Binary(Bytes::new())], None)
    );
}

#[test]
fn unmask_matches_the_byte_by_byte_definition_at_every_phase() {
    let data: Vec<u8> = (0..37).collect();
    for at in 0..8 {
        let mut fast = data.clone();
        unmask(&mut fast, MASK, at);
        let slow: Vec<u8> = data
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ MASK[(at + i) % 4])
            .collect();
        assert_eq!(fast, slow, "{at}");
    }
}

/// Reads a server frame (unmasked, whole) back: its opcode and payload.
fn server_frame(bytes: &[u8]) -> (u8, Vec<u8>) {
    assert_eq!(bytes[0] & 0xF0, 0x80, "FIN, no RSV");
    assert_eq!(bytes[1] & 0x80, 0, "a server never masks");
    let (len, at) = match bytes[1] & 0x7F {
        126 => (usize::from(u16::from_be_bytes([bytes[2], bytes[3]])), 4),
        127 => (
            u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
            10,
        ),
        n => (usize::from(n), 2),
    };
    assert_eq!(bytes.len(), at + len);
    (bytes[0] & 0x0F, bytes[at..].to_vec())
}

#[test]
fn rfc6455_5_2_server_frames_are_unmasked_with_minimal_lengths() {
    for n in [0, 125, 126, 0xFFFF, 0x10000] {
        let payload = vec![b'z'; n];
        let f = encode::text(&payload);
        let head = match n {
            0..=125 => 2,
            126..=0xFFFF => 4,
            _ => 10,
        };
        assert_eq!(f.len(), head + n, "{n}");
        assert_eq!(encode::frame_len(&f), Some(f.len()), "{n}");
        assert_eq!(
            encode::frame_len(&f[..head - 1]),
            None,
            "{n}: a head cut short"
        );
        assert_eq!(server_frame(&f), (0x1, payload));
        let mut out = Vec::new();
        encode::write(&mut out, Opcode::Text, &vec![b'z'; n]);
        assert_eq!(out, f.to_vec());
    }
}

#[test]
fn rfc6455_5_5_server_control_frames() {
    assert_eq!(server_frame(&encode::ping(b"hi")), (0x9, b"hi".to_vec()));
    assert_eq!(server_frame(&encode::pong(&[9; 200])), (0xA, vec![9; 125]));
    assert_eq!(server_frame(&encode::close_empty()), (0x8, Vec::new()));
    let (op, body) = server_frame(&encode::close(CloseCode::TOO_BIG, "message too large"));
    assert_eq!(op, 0x8);
    assert_eq!(&body[..2], &1009u16.to_be_bytes());
    assert_eq!(&body[2..], b"message too large");
    // A long reason is cut to 123 bytes, at a character boundary.
    let reason = "é".repeat(100);
    let (_, body) = server_frame(&encode::close(CloseCode::NORMAL, &reason));
    assert_eq!(body.len(), 2 + 122);
    assert!(std::str::from_utf8(&body[2..]).is_ok());
    // Every decoder error's text fits a close reason.
    for e in [
        Error::ReservedOpcode(0xF),
        Error::InvalidCloseCode(65535),
        Error::TooBig {
            size: u64::MAX,
            limit: usize::MAX,
        },
    ] {
        assert!(e.to_string().len() <= 123);
    }
}

/// A valid client frame sequence: data messages (each cut into fragments) with control
/// frames between and inside them, and at the end, maybe a close.
#[derive(Debug, Clone)]
enum Item {
    Message {
        text: bool,
        content: Vec<u8>,
        cuts: Vec<usize>,
    },
    Ping(Vec<u8>),
    Pong(Vec<u8>),
}

fn item() -> impl Strategy<Value = Item> {
    let content = prop_oneof![
        // Multi-byte characters, so that fragments and pieces cut sequences.
        "[a-zé€😀]{0,40}".prop_map(String::into_bytes),
        proptest::collection::vec(any::<u8>(), 0..300),
    ];
    prop_oneof![
        4 => (any::<bool>(), content, proptest::collection::vec(0usize..300, 0..4)).prop_map(
            |(text, content, cuts)| {
                // Text items need text content.
                let content = if text && std::str::from_utf8(&content).is_err() {
                    String::from_utf8_lossy(&content).into_owned().into_bytes()
                } else {
                    content
                };
                Item::Message { text, content, cuts }
            }
        ),
        1 => proptest::collection::vec(any::<u8>(), 0..=125).prop_map(Item::Ping),
        1 => proptest::collection::vec(any::<u8>(), 0..=125).prop_map(Item::Pong),
    ]
}

/// The frames of `items` (pings go between a message's fragments) and the messages they
/// must read as.
fn encode_items(items: &[Item], masks: &[[u8; 4]], close: bool) -> (Vec<u8>, Vec<Message>) {
    let mut bytes = Vec::new();
    let mut expected = Vec::new();
    let mut masks = masks.iter().cycle();
    let mut pending_control: Vec<(u8, Vec<u8>)> = Vec::new();
    for item in items {
        match item {
            Item::Ping(p) => pending_control.push((0x9, p.clone())),
            Item::Pong(p) => pending_control.push((0xA, p.clone())),
            Item::Message {
                text,
                content,
                cuts,
            } => {
                let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (content.len() + 1)).collect();
                cuts.sort_unstable();
                cuts.push(content.len());
                let mut at = 0;
                for (i, &cut) in cuts.iter().enumerate() {
                    let opcode = match (i, text) {
                        (0, true) => 0x1,
                        (0, false) => 0x2,
                        _ => 0x0,
                    };
                    bytes.extend(frame(
                        i + 1 == cuts.len(),
                        opcode,
                        &content[at..cut],
                        *masks.next().unwrap(),
                    ));
                    at = cut;
                    // Control frames waiting go inside the message, after a fragment that
                    // does not end it.
                    if i + 1 == cuts.len() {
                        break;
                    }
                    for (op, p) in pending_control.drain(..) {
                        bytes.extend(frame(true, op, &p, *masks.next().unwrap()));
                        let p = Bytes::from(p);
                        expected.push(if op == 0x9 {
                            Message::Ping(p)
                        } else {
                            Message::Pong(p)
                        });
                    }
                }
                let content = Bytes::from(content.clone());
                expected.push(if *text {
                    Message::Text(content)
                } else {
                    Message::Binary(content)
                });
            }
        }
    }
    for (op, p) in pending_control.drain(..) {
        bytes.extend(frame(true, op, &p, *masks.next().unwrap()));
        let p = Bytes::from(p);
        expected.push(if op == 0x9 {
            Message::Ping(p)
        } else {
            Message::Pong(p)
        });
    }
    if close {
        let mut body = 4000u16.to_be_bytes().to_vec();
        body.extend_from_slice("done".as_bytes());
        bytes.extend(frame(true, 0x8, &body, *masks.next().unwrap()));
        expected.push(Message::Close(Some(Close {
            code: CloseCode(4000),
            reason: "done".into(),
        })));
    }
    (bytes, expected)
}

/// Decodes `bytes` cut at `cuts`.
fn decode_cut(
    bytes: &[u8],
    cuts: &[usize],
    max_message: usize,
) -> (Vec<Message>, Option<Error>, usize) {
    let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    cuts.push(bytes.len());
    let mut d = Decoder::new(max_message);
    let mut out = Vec::new();
    let mut at = 0;
    let mut most_held = 0;
    for cut in cuts {
        let mut input = &bytes[at..cut];
        at = cut;
        loop {
            let step = d.decode(&mut input);
            most_held = most_held.max(d.held());
            match step {
                Ok(Some(m)) => out.push(m),
                Ok(None) => break,
                Err(e) => return (out, Some(e), most_held),
            }
        }
    }
    (out, None, most_held)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Any chunking of a valid frame sequence reads the messages it was made of.
    #[test]
    fn any_chunking_of_valid_frames_reads_the_same_messages(
        items in proptest::collection::vec(item(), 0..8),
        masks in proptest::collection::vec(any::<[u8; 4]>(), 1..4),
        close in any::<bool>(),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
    ) {
        let (bytes, expected) = encode_items(&items, &masks, close);
        let (whole, error, _) = decode_cut(&bytes, &[], 1 << 20);
        prop_assert_eq!(error, None);
        prop_assert_eq!(&whole, &expected);
        let (split, error, _) = decode_cut(&bytes, &cuts, 1 << 20);
        prop_assert_eq!(error, None);
        prop_assert_eq!(split, expected);
    }

    /// Any bytes, any chunking: the same messages and the same error, and never more held
    /// than the limit.
    #[test]
    fn any_bytes_read_the_same_however_cut(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
        cuts in proptest::collection::vec(any::<usize>(), 0..20),
        max_message in 0usize..64,
    ) {
        let whole = decode_cut(&bytes, &[], max_message);
        let split = decode_cut(&bytes, &cuts, max_message);
        prop_assert_eq!(&whole.0, &split.0);
        prop_assert_eq!(&whole.1, &split.1);
        prop_assert!(split.2 <= read_limit(max_message));
    }
}
