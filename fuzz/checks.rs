//! The properties the fuzz targets check, shared with `tests/fuzz_corpus.rs`, which replays
//! the committed corpus through them in every `cargo test` (the CI smoke run).

use responses_core::translate::{
    stream::StreamTranslator, translate_request, Meta, Options, ResponsePlan,
};

/// Arbitrary bytes as a `POST /v1/responses` body: Ok with a JSON Chat request, or a typed
/// 4xx error; never a panic.
pub fn request(data: &[u8]) {
    for strict in [false, true] {
        let options = Options {
            strict,
            ..Options::default()
        };
        match translate_request(data, &options, Meta { now: 1, id_seed: 7 }) {
            Ok(t) => {
                let v: serde_json::Value =
                    serde_json::from_slice(&t.body).expect("the Chat body is JSON");
                assert!(v["messages"].is_array());
            }
            Err(e) => assert!((400..500).contains(&e.status), "{e}"),
        }
    }
}

fn translate(body: &[u8], cuts: &[usize], options: &Options) -> Vec<u8> {
    let plan = ResponsePlan::new("m", true, Meta { now: 1, id_seed: 7 }, options.clone());
    let mut t = StreamTranslator::new(plan);
    let mut out = Vec::new();
    let mut at = 0;
    for &cut in cuts {
        let cut = cut.clamp(at, body.len());
        out.extend_from_slice(&t.push(&body[at..cut], 2));
        at = cut;
    }
    out.extend_from_slice(&t.push(&body[at..], 2));
    out.extend_from_slice(&t.finish(3));
    assert!(t.is_done());
    out
}

/// An upstream SSE body cut at `cuts`: never a panic, exactly one terminal event then
/// `[DONE]`, and the same bytes however the body is split.
pub fn stream(body: &[u8], cuts: &[usize], small_limits: bool) {
    let options = if small_limits {
        Options {
            max_sse_frame_bytes: 64,
            max_output_bytes: 256,
            ..Options::default()
        }
    } else {
        Options::default()
    };
    let mut cuts: Vec<usize> = cuts.iter().map(|&c| c % (body.len() + 1)).collect();
    cuts.sort_unstable();
    let split = translate(body, &cuts, &options);
    let whole = translate(body, &[], &options);
    assert_eq!(split, whole, "output depends on how the body was split");

    let text = std::str::from_utf8(&whole).expect("events are UTF-8");
    assert!(text.ends_with("data: [DONE]\n\n"));
    let terminals = ["completed", "incomplete", "failed"]
        .iter()
        .map(|t| text.matches(&format!("\nevent: response.{t}\n")).count())
        .sum::<usize>();
    assert_eq!(terminals, 1, "exactly one terminal event");
}

/// Arbitrary bytes as a script of calls into one `exchange::Exchange` (small caps): never
/// a panic, and nothing untranslated ever comes out. Every reply is a translated response
/// (JSON or a whole event stream) or an OpenResponses error envelope; every streamed piece
/// is empty or whole SSE events; after the end, only empty pieces or errors. The script runs
/// once as a `/v1/responses` exchange and once as a `/v1/responses/compact` one.
pub fn exchange(data: &[u8]) {
    use responses_core::exchange::Operation;
    exchange_as(data, Operation::Create);
    exchange_as(data, Operation::Compact);
}

fn exchange_as(data: &[u8], operation: responses_core::exchange::Operation) {
    use responses_core::exchange::{
        AbortStep, BodyStep, ErrorReply, Exchange, HeadStep, Operation, Reply, RequestStep,
        ResponseHead, Settings,
    };
    use responses_core::translate::seal::Keyring;
    use std::sync::Arc;

    let compact = operation == Operation::Compact;
    let check_error = |e: &ErrorReply| {
        assert!((400..600).contains(&e.status()), "{}", e.status());
        let v: serde_json::Value = serde_json::from_slice(&e.body).expect("JSON envelope");
        assert!(v["error"]["message"].is_string() && v["error"]["type"].is_string());
    };
    let check_reply = |r: &Reply| match r {
        Reply::Answer(a) if compact => {
            // A compaction is one JSON object, never a stream.
            assert_eq!((a.status, a.body.content_type()), (200, "application/json"));
            let v: serde_json::Value = serde_json::from_slice(&a.body).expect("JSON");
            assert_eq!(v["object"], "response.compaction");
        }
        Reply::Answer(a) => {
            assert_eq!(a.status, 200);
            if a.body.content_type() == "text/event-stream" {
                let text = std::str::from_utf8(&a.body).expect("UTF-8 events");
                assert!(text.starts_with("event: ") && text.ends_with("data: [DONE]\n\n"));
            } else {
                let v: serde_json::Value = serde_json::from_slice(&a.body).expect("JSON");
                assert_eq!(v["object"], "response");
            }
        }
        Reply::Error(e) => check_error(e),
    };
    fn check_sent(bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let text = std::str::from_utf8(bytes).expect("UTF-8 events");
        assert!(text.ends_with("\n\n"), "whole events only");
        for event in text.split_terminator("\n\n") {
            let data = event
                .strip_prefix("event: ")
                .and_then(|e| e.split_once("\ndata: "))
                .map(|(_, d)| d)
                .unwrap_or_else(|| event.strip_prefix("data: ").expect("an SSE event"));
            assert!(
                data == "[DONE]" || serde_json::from_str::<serde_json::Value>(data).is_ok(),
                "event data is JSON: {data}"
            );
        }
    }

    const BODIES: &[&[u8]] = &[
        br#"{"model":"m","input":"hi"}"#,
        br#"{"model":"m","input":"hi","stream":true}"#,
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"}}]}\n\n",
        b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
        br#"{"choices":[{"index":0,"finish_reason":"stop","message":{"content":"yo"}}]}"#,
        br#"{"error":{"message":"busy"}}"#,
    ];
    const TYPES: &[&str] = &["application/json", "text/event-stream", "text/plain", ""];
    const STATUSES: &[u16] = &[200, 200, 201, 400, 413, 429, 500, 503, 504];

    let settings = Arc::new(Settings {
        max_body_bytes: 300,
        options: Options {
            max_request_bytes: 300,
            max_output_bytes: 200,
            max_sse_frame_bytes: 100,
            keyring: Some(Arc::new(Keyring::single("k", [1; 32]).expect("key"))),
            ..Options::default()
        },
        ..Settings::default()
    });
    let mut ex = Exchange::new(settings, operation);
    let meta = Meta { now: 1, id_seed: 7 };
    let mut bytes = data.iter().copied();
    while let Some(op) = bytes.next() {
        let arg = bytes.next().unwrap_or(0);
        // A body: one of the typical ones, or the next `arg` raw bytes of the script.
        let mut body = |arg: u8| -> Vec<u8> {
            if arg & 0x80 == 0 {
                BODIES[usize::from(arg) % BODIES.len()].to_vec()
            } else {
                bytes.by_ref().take(usize::from(arg & 0x3f)).collect()
            }
        };
        let finished = ex.is_finished();
        match op % 6 {
            0 => {
                let mut step = ex.request_body(&body(arg), arg & 0x40 != 0, meta);
                // A host that offloads runs the work elsewhere; here, at once.
                if let RequestStep::Work(work) = step {
                    step = ex.request_worked(work.run());
                }
                match step {
                    RequestStep::Reply(e) => check_error(&e),
                    RequestStep::Forward(up) | RequestStep::Call(up) => {
                        let _: serde_json::Value = serde_json::from_slice(&up.body).expect("JSON");
                    }
                    RequestStep::Hold => {}
                    RequestStep::Work(_) => panic!("a work's result asked for more work"),
                }
            }
            1 => {
                let head = ResponseHead {
                    status: STATUSES[usize::from(arg) % STATUSES.len()],
                    content_type: TYPES[usize::from(arg >> 4) % TYPES.len()],
                    end_of_stream: arg & 0x08 != 0,
                };
                if let HeadStep::Reply(r) = ex.response_head(head, 2) {
                    check_reply(&r);
                }
            }
            2 | 3 => match ex.response_body(&body(arg), arg & 0x40 != 0, 2) {
                BodyStep::Send(out) => {
                    check_sent(&out);
                    assert!(!finished || out.is_empty(), "bytes after the end");
                }
                BodyStep::Reply(r) => check_reply(&r),
                BodyStep::Hold => assert!(!finished),
            },
            4 => match ex.overflow(2) {
                AbortStep::Reply(e) => check_error(&e),
                AbortStep::Send(out) => check_sent(&out),
                AbortStep::Nothing => assert!(finished),
            },
            _ => match ex.abort(
                responses_core::openresponses::ErrorCode::InternalError,
                "fuzz",
                2,
            ) {
                AbortStep::Reply(e) => check_error(&e),
                AbortStep::Send(out) => check_sent(&out),
                AbortStep::Nothing => assert!(finished),
            },
        }
    }
}

/// Arbitrary bytes as a script of Envoy hooks into the in-process module's filter (the module
/// crate's fake Envoy, small caps): request pieces (compressed or not), answer heads of any
/// status and content type, body pieces, trailers, panics and the end of a compressed
/// request's reading (off the worker), in any order, for `/v1/responses` and
/// `/v1/responses/compact`. Never a panic, and after every step nothing untranslated has
/// reached the upstream or the client (`responses_module::fake::FakeEnvoy::assert_fail_closed`).
pub fn module(data: &[u8]) {
    let script = responses_module::fake::script(data);
    for path in ["/v1/responses", "/v1/responses/compact?x=1"] {
        responses_module::fake::run_script(path, &script);
    }
}

/// Arbitrary bytes as a client's WebSocket byte stream into one frame decoder
/// (`core/src/websocket/decode.rs`), small limits. The first byte picks the message limit,
/// the second how the rest is read: as raw bytes, or as a script of frame heads (any FIN, RSV,
/// opcode, length form, mask bit) with payloads from the data, so that the fuzzer reaches deep
/// into fragmentation, UTF-8 and close frames. Read whole, byte by byte and in pieces of
/// sizes drawn from the data: never a panic, the same messages and the same error every way,
/// never more held than the read limit, and every message within the rules (text UTF-8,
/// control payloads of 125 bytes at most, close codes a peer may send).
pub fn websocket_frames(data: &[u8]) {
    use responses_core::websocket::decode::{read_limit, Decoder, Message};

    let [limit_byte, mode, seed, rest @ ..] = data else {
        return;
    };
    let max_message = if limit_byte & 0x80 != 0 {
        1 << 16
    } else {
        usize::from(*limit_byte)
    };
    let stream = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        websocket_script(rest)
    };

    let read = |pieces: &mut dyn Iterator<Item = usize>| {
        let mut decoder = Decoder::new(max_message);
        let mut messages = Vec::new();
        let mut at = 0;
        while at < stream.len() {
            let n = pieces
                .next()
                .unwrap_or(usize::MAX)
                .clamp(1, stream.len() - at);
            let mut input = &stream[at..at + n];
            at += n;
            loop {
                let step = decoder.decode(&mut input);
                assert!(
                    decoder.held() <= read_limit(max_message),
                    "held past the limit"
                );
                match step {
                    Ok(Some(m)) => messages.push(m),
                    Ok(None) => break,
                    Err(e) => {
                        assert!(matches!(e.close_code().0, 1002 | 1007 | 1009), "{e:?}");
                        assert!(e.to_string().len() <= 123);
                        // The error sticks.
                        assert_eq!(
                            decoder.decode(&mut &b"\x81\x80\0\0\0\0"[..]),
                            Err(e.clone())
                        );
                        return (messages, Some(e));
                    }
                }
            }
            assert!(input.is_empty());
        }
        (messages, None)
    };

    let whole = read(&mut std::iter::empty());
    let bytewise = read(&mut std::iter::repeat(1));
    let mut state = u32::from(*seed) | 0x100;
    let mut sizes = std::iter::from_fn(|| {
        // xorshift: piece sizes 1..=64 from the seed
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        Some(1 + (state % 64) as usize)
    });
    let pieces = read(&mut sizes);
    assert_eq!(whole, bytewise, "messages depend on how the bytes were cut");
    assert_eq!(whole, pieces, "messages depend on how the bytes were cut");

    let (messages, _) = whole;
    for (i, m) in messages.iter().enumerate() {
        match m {
            Message::Text(t) => {
                assert!(std::str::from_utf8(t).is_ok());
                assert!(t.len() <= read_limit(max_message));
            }
            Message::Binary(b) => assert!(b.len() <= read_limit(max_message)),
            Message::Ping(p) | Message::Pong(p) => assert!(p.len() <= 125),
            Message::Close(c) => {
                assert_eq!(i + 1, messages.len(), "nothing after a close");
                if let Some(c) = c {
                    assert!(c.code.is_sendable() && c.reason.len() <= 123);
                }
            }
        }
    }
}

/// The frames a script describes: per frame a flags byte (FIN, RSV, opcode), a length byte
/// (its top two bits the length form: 7, 16 or 64 bits; 0x3F the rest), a byte whose low bit
/// leaves the mask out, a mask, then that many payload bytes (fewer at the end of the data).
fn websocket_script(mut script: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let [flags, len, unmasked, m0, m1, m2, m3, rest @ ..] = script {
        let n = usize::from(len & 0x3F) * 3;
        let payload = &rest[..n.min(rest.len())];
        script = &rest[payload.len()..];
        // The announced length: the payload's, in the form the script picked.
        let masked = if unmasked & 1 == 1 { 0 } else { 0x80 };
        out.push(*flags);
        match len >> 6 {
            0 if payload.len() <= 125 => out.push(masked | payload.len() as u8),
            0 | 1 => {
                out.push(masked | 126);
                out.extend_from_slice(&(payload.len() as u16).to_be_bytes());
            }
            2 => {
                out.push(masked | 127);
                out.extend_from_slice(&(payload.len() as u64).to_be_bytes());
            }
            // A length the payload does not have: a huge one, top bit set or not.
            _ => {
                out.push(masked | 127);
                out.extend_from_slice(&((u64::from(*m0) << 56) | 0xFFFF).to_be_bytes());
            }
        }
        let mask = [*m0, *m1, *m2, *m3];
        if masked != 0 {
            out.extend_from_slice(&mask);
            out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        } else {
            out.extend_from_slice(payload);
        }
    }
    out
}

/// Arbitrary bytes as a script of everything a host feeds one WebSocket connection
/// (`core/src/connection.rs`): the client's frames (text messages from a pool of real and
/// broken `response.create`s, pings, closes, raw bytes), its calls' heads, bodies (SSE from a
/// pool), ends and failures, time passing, the host's writability, the drain and the
/// transport's end. Never a panic, and after each input: the bytes sent are whole server
/// frames (unmasked; text frames one JSON object each); nothing is sent after the close; the
/// connection holds no more than its limit unless it closed; a call is started once and never
/// after the close; one `Opened` first, one `Closed` at most, each response finished once.
pub fn connection(data: &[u8]) {
    use responses_core::call::{CallAction, CallFailure};
    use responses_core::connection::{Connection, Event, Limits};
    use responses_core::exchange::Settings;
    use responses_core::life;
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    struct Fixed;
    impl responses_core::environment::Environment for Fixed {
        fn now(&self) -> u64 {
            1_700_000_000
        }
        fn id_seed(&self) -> u128 {
            7
        }
    }
    const MESSAGES: &[&[u8]] = &[
        br#"{"type":"response.create","model":"m","input":"hi"}"#,
        br#"{"type":"response.create","model":"m","input":"hi","generate":false}"#,
        br#"{"type":"response.create","model":"m","previous_response_id":"resp_x","input":"x"}"#,
        br#"{"type":"response.create","model":"m","input":[{"type":"function_call_output","call_id":"c","output":"o"}]}"#,
        br#"{"type":"response.cancel"}"#,
        b"{not json",
        br#"{"type":"response.create","model":"m","input":"hi","stream_id":"a"}"#,
        br#"{"type":"response.create","model":"m","input":"hi","stream_id":"b"}"#,
        br#"{"type":"response.create","model":"m","input":"x","stream_id":7}"#,
        br#"{"type":"response.steer","previous_response_id":"resp_x","input":"x"}"#,
        br#"{"type":"response.steer","input":[{"role":"assistant","content":"x"}]}"#,
    ];
    const SSE: &[&[u8]] = &[
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hi\"}}]}\n\n",
        b"data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
        b"data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}}]}\n\n",
        b"data: {\"error\":{\"message\":\"boom\"}}\n\n",
        b"data: not json\n\n",
        b"{\"error\":{\"message\":\"nope\"}}",
    ];
    fn masked(opcode: u8, payload: &[u8], fin: bool) -> Vec<u8> {
        let mut f = vec![if fin { 0x80 } else { 0 } | opcode];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n => {
                f.push(0x80 | 126);
                f.extend((n as u16).to_be_bytes());
            }
        }
        let key = [3, 1, 4, 1];
        f.extend(key);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
        f
    }
    /// Whole unmasked server frames; the text ones' payloads.
    fn frames(mut bytes: &[u8]) -> (Vec<Vec<u8>>, bool) {
        let mut texts = Vec::new();
        let mut close = false;
        while !bytes.is_empty() {
            assert!(bytes.len() >= 2, "a cut frame head");
            assert_eq!(bytes[1] & 0x80, 0, "server frames are not masked");
            let (len, at) = match bytes[1] & 0x7f {
                126 => (u16::from_be_bytes([bytes[2], bytes[3]]) as usize, 4),
                127 => (
                    u64::from_be_bytes(bytes[2..10].try_into().unwrap()) as usize,
                    10,
                ),
                n => (n as usize, 2),
            };
            assert!(bytes.len() >= at + len, "a cut frame");
            assert!(!close, "a frame after the close frame");
            match bytes[0] {
                0x81 => texts.push(bytes[at..at + len].to_vec()),
                0x88 => close = true,
                0x8A => {}
                other => panic!("frame byte {other:#x}"),
            }
            bytes = &bytes[at + len..];
        }
        (texts, close)
    }

    let limits = Limits {
        max_message_bytes: 4096,
        max_context_bytes: 8192,
        idle_timeout: Duration::from_millis(500),
        max_age: Duration::from_secs(5),
        max_unread_bytes: 2048,
        max_socket_bytes: 64 * 1024,
    };
    let mut now = Instant::now();
    let mut conn = Connection::new(Arc::new(Settings::default()), limits, Fixed, |_| None, now);
    let mut started = HashSet::new();
    let mut open_calls = Vec::new();
    let mut closed_sent = false;
    let mut writable = true;
    let mut closes_told = 0;
    let mut opened_told = false;
    let mut finished = 0;
    let mut claimed = 0;
    // The last response id the client saw: steers name it.
    let mut last_id: Option<String> = None;
    let mut ops = data.chunks(2);
    while let Some(&[op, arg]) = ops.next() {
        let latest = open_calls.last().copied();
        match op % 12 {
            0 | 1 => {
                let pick = usize::from(arg) % (MESSAGES.len() + 1);
                let m = match (MESSAGES.get(pick), &last_id) {
                    (Some(m), _) => m.to_vec(),
                    // A steer of the last response seen, in flight or not.
                    (None, id) => format!(
                        r#"{{"type":"response.steer","previous_response_id":"{}","input":"more"}}"#,
                        id.as_deref().unwrap_or("resp_none")
                    )
                    .into_bytes(),
                };
                conn.handle_bytes(now, &masked(0x1, &m, true));
            }
            2 => {
                // A message in two fragments, a ping between them.
                let m = MESSAGES[usize::from(arg) % MESSAGES.len()];
                let (a, b) = m.split_at(m.len() / 2);
                let mut bytes = masked(0x1, a, false);
                bytes.extend(masked(0x9, b"p", true));
                bytes.extend(masked(0x0, b, true));
                conn.handle_bytes(now, &bytes);
            }
            3 => conn.handle_bytes(now, &masked(0x9, &[arg], true)),
            4 => match latest {
                Some(id) => {
                    let (status, kind) = match arg % 4 {
                        0 | 1 => (200, "text/event-stream"),
                        2 => (200, "application/json"),
                        _ => (400 + u16::from(arg % 200), "application/json"),
                    };
                    let pairs = [("content-type", kind), ("retry-after", "1")];
                    responses_core::call::AnswerHead(&pairs)
                        .report(status, |head| conn.handle_call_head(now, id, head));
                }
                None => continue,
            },
            5 | 6 => match latest {
                Some(id) => conn.handle_call_data(now, id, SSE[usize::from(arg) % SSE.len()]),
                None => continue,
            },
            7 => match latest {
                Some(id) => {
                    if arg % 2 == 0 {
                        conn.handle_call_end(now, id);
                    } else {
                        conn.handle_call_failed(now, id, CallFailure::Failed("reset"));
                    }
                    open_calls.retain(|c| *c != id);
                }
                None => continue,
            },
            8 => {
                now += Duration::from_millis(u64::from(arg) * 10);
                if conn.poll_timeout().is_some_and(|at| at <= now) {
                    conn.handle_timeout(now);
                }
            }
            9 => {
                writable = arg % 2 == 0;
                conn.handle_writable(now, writable);
            }
            10 => conn.handle_drain(now, Duration::from_millis(u64::from(arg) * 5)),
            _ => match arg % 3 {
                0 => conn.handle_closed(now),
                1 => conn.handle_bytes(now, &masked(0x8, &1000u16.to_be_bytes(), true)),
                _ => conn.handle_bytes(now, &[arg, arg, arg]),
            },
        }
        // What went out: whole frames, and only while the host can write, or the connection's
        // last bytes (its close frame among them).
        let mut sent = false;
        let mut close_now = false;
        while let Some(bytes) = conn.poll_transmit() {
            assert!(!closed_sent, "bytes after the close frame");
            let (texts, close) = frames(&bytes);
            for t in texts {
                let v: serde_json::Value = serde_json::from_slice(&t).expect("one JSON object");
                assert!(v.is_object());
                if let Some(id) = v["response"]["id"].as_str() {
                    last_id = Some(id.to_owned());
                }
                // A lane's events echo it, and only a lane's.
                if let Some(lane) = v.get("stream_id") {
                    assert!(lane == "a" || lane == "b", "{v}");
                }
            }
            sent = true;
            close_now |= close;
        }
        assert!(
            !sent || writable || close_now || conn.is_closed(),
            "bytes handed over while the host could not write"
        );
        closed_sent |= close_now;
        while let Some(action) = conn.poll_call() {
            match action {
                CallAction::Start(call) => {
                    assert!(
                        !conn.is_closed() || closed_sent,
                        "a call started after the close"
                    );
                    assert!(started.insert(call.id), "a call started twice");
                    open_calls.push(call.id);
                }
                CallAction::Cancel(id) => open_calls.retain(|c| *c != id),
                // A response's record: nothing comes back for it.
                CallAction::Record(record) => {
                    assert!(record.path.contains("/turns/"), "{}", record.path);
                }
            }
        }
        while let Some(event) = conn.poll_event(now) {
            match event {
                Event::Opened => {
                    assert!(!opened_told && closes_told == 0);
                    opened_told = true;
                }
                Event::Closed { .. } => closes_told += 1,
                Event::Response {
                    event: life::Event::Claimed { .. },
                    ..
                } => claimed += 1,
                Event::Response {
                    event: life::Event::Finished(_),
                    ..
                } => finished += 1,
                _ => {}
            }
        }
        assert!(opened_told);
        assert!(closes_told <= 1, "closed twice");
        assert!(finished <= claimed, "a response finished twice");
        if !conn.is_closed() && closes_told == 0 {
            assert!(
                conn.held() <= limits.max_socket_bytes,
                "held past the limit"
            );
        }
    }
}
