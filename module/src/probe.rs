//! The ABI probe (feature `abi-probe`, tests only): a filter that terminates a WebSocket
//! upgrade itself and answers commands sent as text messages, each exercising one part of the
//! host layer's [`Terminal`] surface through the real Envoy (`tests/e2e/module_abi.rs`).
//! Envoy makes it for the filter config named [`FILTER_NAME`]; a production build has none of
//! this. Its framing is the least that carries short commands (one unfragmented frame each);
//! the real codec is the core's.
//!
//! Commands, and what the client gets back (one text message each):
//! - `echo <text>`: `<text>`;
//! - `call <cluster> [reset] [/path]`: a streaming Chat request to the cluster (on
//!   `/v1/chat/completions` unless a path is given): `callout <id> started`
//!   or `callout refused <why>`, then `callout <id> head <status>`, `callout <id> data
//!   <text>` per piece as it arrives, `callout <id> complete` or `callout <id> reset <why>`;
//!   with `reset`, the probe resets it once its head arrived;
//! - `timer <ms>`: `timer armed`, then `timer fired after <ms> same_thread=<bool>`;
//! - `disarm <ms>`: arms and disarms at once: `timer disarmed` and nothing later;
//! - `flood <frames> <kib>`: that many binary messages at once, then `flood sent blocked=<b>`;
//! - `stats`: `watermark above=<n> below=<n> blocked=<b>` (the hooks heard so far);
//! - `watch-drain [keep]`: `drain watched already=<b>`; on Envoy's drain: `drain started`,
//!   then (unless `keep`) a close (1001) and the end of the stream;
//! - `close`: a close (1000) and the end of the stream.
//!
//! Every hook is logged (`abi_probe: ...`, info) for the test to read from Envoy's log.

use std::collections::BTreeSet;
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use base64::Engine;
use sha1::{Digest, Sha1};

use crate::host::{self, Callout, CalloutId, CalloutReset, Level, Side, Terminal};
use crate::status::{BodyStatus, HeadersStatus, TrailersStatus};

/// The `filter_name` that makes Envoy's filter a probe.
pub const FILTER_NAME: &str = "abi_probe";

const CHAT: &[u8] = br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

#[derive(Debug, Default)]
pub struct Probe {
    upgraded: bool,
    /// Client bytes not yet a whole frame.
    inbox: Vec<u8>,
    worker: Option<ThreadId>,
    /// Callouts to reset once their head arrives.
    reset_on_head: BTreeSet<CalloutId>,
    /// The armed timer: when armed, and for when.
    timer: Option<(Instant, Instant)>,
    above: u32,
    below: u32,
    /// On the drain, say so but keep the socket open.
    keep_on_drain: bool,
}

fn log(message: &str) {
    host::log(Level::Info, &format!("abi_probe: {message}"));
}

/// A server frame (unmasked, unfragmented).
fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n < 65_536 => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
    out
}

/// The first whole client frame in `bytes`: its opcode, unmasked payload and length.
fn client_frame(bytes: &[u8]) -> Option<(u8, Vec<u8>, usize)> {
    let (&b0, &b1) = (bytes.first()?, bytes.get(1)?);
    let (mut len, mut at) = (usize::from(b1 & 0x7f), 2);
    if len == 126 {
        len = usize::from(u16::from_be_bytes(bytes.get(2..4)?.try_into().ok()?));
        at = 4;
    } else if len == 127 {
        len = usize::try_from(u64::from_be_bytes(bytes.get(2..10)?.try_into().ok()?)).ok()?;
        at = 10;
    }
    let mask: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
    let payload = bytes.get(at + 4..at + 4 + len)?;
    let payload = payload
        .iter()
        .enumerate()
        .map(|(i, b)| b ^ mask[i % 4])
        .collect();
    Some((b0 & 0x0f, payload, at + 4 + len))
}

impl Probe {
    pub fn new() -> Probe {
        Probe::default()
    }

    fn say(&self, host: &mut impl Terminal, text: &str) {
        host.send_data(&frame(0x1, text.as_bytes()), false);
    }

    fn close(&self, host: &mut impl Terminal, code: u16) {
        host.send_data(&frame(0x8, &code.to_be_bytes()), true);
    }

    pub fn request_headers(&mut self, host: &mut impl Terminal, end: bool) -> HeadersStatus {
        self.worker = Some(std::thread::current().id());
        let method = host
            .header(Side::Request, ":method")
            .unwrap_or("")
            .to_owned();
        let protocol = host.header(Side::Request, ":protocol").map(str::to_owned);
        let upgrade = host.header(Side::Request, "upgrade").map(str::to_owned);
        let key = host.header(Side::Request, "sec-websocket-key").is_some();
        log(&format!(
            "request_headers method={method} protocol={protocol:?} upgrade={upgrade:?} key={key} end={end}"
        ));
        let websocket = upgrade.is_some_and(|u| u.eq_ignore_ascii_case("websocket"))
            || protocol.is_some_and(|p| p.eq_ignore_ascii_case("websocket"));
        if !websocket {
            return HeadersStatus::Continue;
        }
        let mut head = vec![
            (":status", "101"),
            ("upgrade", "websocket"),
            ("connection", "upgrade"),
        ];
        let accept = host.header(Side::Request, "sec-websocket-key").map(|key| {
            let digest = Sha1::new()
                .chain_update(key.trim().as_bytes())
                .chain_update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11")
                .finalize();
            base64::engine::general_purpose::STANDARD.encode(digest)
        });
        if let Some(accept) = &accept {
            head.push(("sec-websocket-accept", accept));
        }
        host.send_headers(&head, false);
        self.upgraded = true;
        log("sent 101");
        HeadersStatus::Stop
    }

    pub fn request_body(&mut self, host: &mut impl Terminal, end: bool) -> BodyStatus {
        for piece in host.body(Side::Request) {
            self.inbox.extend_from_slice(piece);
        }
        host.drain_body(Side::Request);
        log(&format!(
            "request_body bytes_waiting={} end={end}",
            self.inbox.len()
        ));
        while let Some((opcode, payload, used)) = client_frame(&self.inbox) {
            self.inbox.drain(..used);
            match opcode {
                0x1 => self.command(host, &String::from_utf8_lossy(&payload)),
                0x8 => {
                    log("client close");
                    self.close(host, 1000);
                }
                0x9 => host.send_data(&frame(0xA, &payload), false),
                _ => {}
            }
        }
        BodyStatus::Stop
    }

    fn command(&mut self, host: &mut impl Terminal, command: &str) {
        log(&format!("command {command}"));
        let mut words = command.split_whitespace();
        let verb = words.next().unwrap_or("");
        let mut number = || {
            words
                .next()
                .and_then(|w| w.parse::<u64>().ok())
                .unwrap_or(0)
        };
        match verb {
            "echo" => self.say(host, command.strip_prefix("echo ").unwrap_or("")),
            "call" => {
                let rest: Vec<&str> = command.split_whitespace().skip(1).collect();
                let cluster = rest.first().copied().unwrap_or("upstream");
                let reset = rest.contains(&"reset");
                let path = rest
                    .iter()
                    .find(|w| w.starts_with('/'))
                    .copied()
                    .unwrap_or("/v1/chat/completions");
                let callout = Callout {
                    cluster,
                    headers: &[
                        (":method", "POST"),
                        (":path", path),
                        ("host", "upstream"),
                        ("content-type", "application/json"),
                    ],
                    body: CHAT,
                    end: true,
                    timeout: Some(Duration::from_secs(30)),
                };
                match host.start_callout(&callout) {
                    Ok(id) => {
                        if reset {
                            self.reset_on_head.insert(id);
                        }
                        log(&format!("callout {} started", id.0));
                        self.say(host, &format!("callout {} started", id.0));
                    }
                    Err(why) => {
                        log(&format!("callout refused {why:?}"));
                        self.say(host, &format!("callout refused {why:?}"));
                    }
                }
            }
            "timer" => {
                let now = Instant::now();
                let at = now + Duration::from_millis(number());
                host.arm_timer(at);
                self.timer = Some((now, at));
                self.say(host, "timer armed");
            }
            "disarm" => {
                host.arm_timer(Instant::now() + Duration::from_millis(number()));
                host.disarm_timer();
                self.say(host, "timer disarmed");
            }
            "flood" => {
                let (frames, kib) = (number(), number());
                let payload = vec![b'x'; usize::try_from(kib * 1024).unwrap_or(0)];
                let message = frame(0x2, &payload);
                for _ in 0..frames {
                    host.send_data(&message, false);
                }
                let blocked = host.write_blocked();
                log(&format!("flood sent blocked={blocked}"));
                self.say(host, &format!("flood sent blocked={blocked}"));
            }
            "stats" => {
                let text = format!(
                    "watermark above={} below={} blocked={}",
                    self.above,
                    self.below,
                    host.write_blocked()
                );
                self.say(host, &text);
            }
            "watch-drain" => {
                self.keep_on_drain = command.ends_with(" keep");
                let already = host.watch_drain();
                self.say(host, &format!("drain watched already={already}"));
            }
            "close" => self.close(host, 1000),
            _ => self.say(host, &format!("unknown {verb}")),
        }
    }

    pub fn request_trailers(&mut self, _host: &mut impl Terminal) -> TrailersStatus {
        log("request_trailers");
        TrailersStatus::Stop
    }

    pub fn response_headers(&mut self, host: &mut impl Terminal, end: bool) -> HeadersStatus {
        let status = host.header(Side::Response, ":status").unwrap_or("");
        log(&format!("response_headers status={status} end={end}"));
        HeadersStatus::Continue
    }

    pub fn response_body(&mut self, _host: &mut impl Terminal, end: bool) -> BodyStatus {
        log(&format!("response_body end={end}"));
        BodyStatus::Continue
    }

    pub fn response_trailers(&mut self, _host: &mut impl Terminal) -> TrailersStatus {
        log("response_trailers");
        TrailersStatus::Continue
    }

    pub fn stream_complete(&mut self, _host: &mut impl Terminal) {
        log(&format!(
            "stream_complete timer_armed={}",
            self.timer.is_some()
        ));
    }

    pub fn on_panic(&mut self, host: &mut impl Terminal) -> bool {
        host.reset();
        false
    }

    pub fn callout_headers(
        &mut self,
        host: &mut impl Terminal,
        id: CalloutId,
        headers: &[(&str, &str)],
        end: bool,
    ) {
        let status = headers
            .iter()
            .find(|(k, _)| *k == ":status")
            .map_or("", |(_, v)| *v);
        log(&format!("callout {} head {status} end={end}", id.0));
        self.say(host, &format!("callout {} head {status}", id.0));
        if self.reset_on_head.remove(&id) {
            host.reset_callout(id);
            log(&format!("callout {} reset sent", id.0));
        }
    }

    pub fn callout_data(
        &mut self,
        host: &mut impl Terminal,
        id: CalloutId,
        data: &[&[u8]],
        end: bool,
    ) {
        let text = String::from_utf8_lossy(&data.concat()).into_owned();
        log(&format!(
            "callout {} data {} bytes end={end}",
            id.0,
            text.len()
        ));
        self.say(host, &format!("callout {} data {text}", id.0));
    }

    pub fn callout_trailers(
        &mut self,
        host: &mut impl Terminal,
        id: CalloutId,
        _trailers: &[(&str, &str)],
    ) {
        self.say(host, &format!("callout {} trailers", id.0));
    }

    pub fn callout_complete(&mut self, host: &mut impl Terminal, id: CalloutId) {
        log(&format!("callout {} complete", id.0));
        self.say(host, &format!("callout {} complete", id.0));
    }

    pub fn callout_reset(&mut self, host: &mut impl Terminal, id: CalloutId, why: CalloutReset) {
        log(&format!("callout {} reset {why:?}", id.0));
        self.say(host, &format!("callout {} reset {why:?}", id.0));
    }

    pub fn timer_fired(&mut self, host: &mut impl Terminal) {
        let Some((armed, at)) = self.timer.take() else {
            return;
        };
        let now = Instant::now();
        let same = self.worker == Some(std::thread::current().id());
        log(&format!(
            "timer fired {}us after its deadline same_thread={same}",
            now.saturating_duration_since(at).as_micros()
        ));
        let text = format!(
            "timer fired after {} same_thread={same} early={}",
            now.duration_since(armed).as_millis(),
            now < at
        );
        self.say(host, &text);
    }

    /// The probe starts no work.
    pub fn work_done(&mut self, _host: &mut impl Terminal, _worked: crate::host::WorkResult) {}

    pub fn drain_started(&mut self, host: &mut impl Terminal) {
        log("drain started");
        self.say(host, "drain started");
        if !self.keep_on_drain {
            self.close(host, 1001);
        }
    }

    pub fn write_blocked(&mut self, _host: &mut impl Terminal) {
        self.above += 1;
        log(&format!("write blocked (above={})", self.above));
    }

    pub fn write_unblocked(&mut self, _host: &mut impl Terminal) {
        self.below += 1;
        log(&format!("write unblocked (below={})", self.below));
    }
}

impl Drop for Probe {
    fn drop(&mut self) {
        log(&format!("destroyed timer_armed={}", self.timer.is_some()));
    }
}
