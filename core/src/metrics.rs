//! The metrics every adapter exports, defined once: each family's name, type, unit, help,
//! label names and histogram buckets ([`Metric`], [`Family`]), the semantic conventions'
//! instrument it is over OTLP, if it is one ([`Instrument`]), what an exchange records in
//! them ([`record`], from the driver's [`Event`]s), and the bound on label values that come
//! from clients and upstreams ([`Labels`]).
//!
//! Four families are the OpenTelemetry GenAI semantic conventions' instruments
//! (`gen_ai.client.token.usage`, `gen_ai.server.request.duration`,
//! `gen_ai.server.time_to_first_token`, `gen_ai.server.time_per_output_token`), with their
//! attributes and bucket boundaries; the others are ours, for what the conventions do not
//! cover (exchanges by outcome, caps, compactions, sockets, closes, exact token counts).
//!
//! Names have no prefix here: the processor exports `responses_extproc_<name>` on its
//! `/metrics`; the module defines `<name>` in Envoy's stats under the filter's
//! `metrics_namespace`, which Envoy's Prometheus output prints as
//! `envoy_<namespace>_<name>`. Label names are OpenTelemetry attribute names
//! (`gen_ai.request.model`): Prometheus writes each `.` as `_` ([`prometheus_name`]), Envoy's
//! output as the processor's. Everything else (type, label names, buckets, values) is the
//! same in both exports. Over OTLP each family is its [`Instrument`]: the processor pushes it
//! itself, the module through Envoy's OpenTelemetry stat sink, whose shipped configs rename
//! the four GenAI stats to the conventions' names.
//!
//! Values are whole numbers in the family's unit, because Envoy's histograms take integers:
//! a request's times in milliseconds or microseconds (the conventions' seconds, as
//! microseconds), tokens as they are. Envoy takes histogram buckets from its bootstrap
//! (`stats_config.histogram_bucket_settings`), not from the module: the shipped Envoy configs
//! set [`Family::buckets`] (checked by `tests/docs/telemetry_schema.rs`). Our families' bounds
//! have two significant digits, the resolution of Envoy's log-linear histograms, so that below
//! 100 both modes count every value in the same bucket (above, Envoy files values by their
//! first two digits); the GenAI families take the conventions' boundaries as they are.
//!
//! The adapters only carry the calls: each implements [`Recorder`] over its registry (the
//! processor's Prometheus vectors and OpenTelemetry instruments, the module's Envoy stats) and
//! hands it every event.

use std::collections::HashSet;
use std::sync::Mutex;
use std::time::Duration;

use crate::connection;
use crate::exchange::{Outcome, Summary};
use crate::life::{Event, Timing};
use crate::openresponses::{Code, Usage};
use crate::telemetry;

/// What kind of series a family is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// Its name in Prometheus' `# TYPE` line.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One family of series.
#[derive(Debug, PartialEq)]
pub struct Family {
    /// Without a prefix (see the module docs).
    pub name: &'static str,
    pub kind: Kind,
    /// The unit of its values (UCUM, as OpenTelemetry writes them): `ms`, `us`, `{token}`...
    pub unit: &'static str,
    pub help: &'static str,
    /// As OpenTelemetry attributes (`gen_ai.request.model`); Prometheus writes them with `_`
    /// ([`prometheus_name`]).
    pub labels: &'static [&'static str],
    /// Histograms: the upper bounds of the buckets, in the unit (`+Inf` is implied).
    pub buckets: &'static [f64],
    /// The conventions' instrument it is, over OTLP (the four GenAI families); `None`: ours,
    /// pushed as `<prefix>.<name>` in its own unit.
    pub semconv: Option<Instrument>,
    /// A family kept for one release beside the one that replaces it (docs/changelog.md).
    pub replaced_by: Option<Metric>,
}

/// An OpenTelemetry semantic conventions' instrument: its name, its unit, and how many of the
/// family's units make one of its own (1e6: the family counts microseconds, the conventions
/// seconds).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Instrument {
    pub name: &'static str,
    pub unit: &'static str,
    pub per: f64,
}

impl Instrument {
    /// A value of the family, in the instrument's unit. A division, so that whole microseconds
    /// give the nearest double to the decimal seconds (80,000 µs is `0.08`, the boundary).
    pub fn value(&self, value: u64) -> f64 {
        value as f64 / self.per
    }
}

impl Family {
    /// Its buckets as pushed over OTLP, in the instrument's unit: the conventions' boundaries
    /// for the GenAI families, its own for the others.
    pub fn otlp_buckets(&self) -> Vec<f64> {
        let per = self.semconv.map_or(1.0, |i| i.per);
        self.buckets.iter().map(|b| b / per).collect()
    }
}

/// A label (or an OTLP metric) name as Prometheus writes it: every character other than an
/// ASCII letter, digit or `_` becomes `_` (what Envoy's Prometheus output does to its tags).
pub fn prometheus_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The label names.
pub mod label {
    /// `create` or `compact`.
    pub const OPERATION: &str = "operation";
    /// `true` or `false`: the client asked for a stream.
    pub const STREAM: &str = "stream";
    /// `translated`, `failed` or `cut` (Envoy ended the exchange first).
    pub const OUTCOME: &str = "outcome";
    /// A failed exchange's error code (ours, or an upstream's, bounded); empty otherwise.
    pub const ERROR_CODE: &str = "error_code";
    /// The error code of the size cap an exchange ended at.
    pub const CAP: &str = "cap";
    /// The request's `model`, as the client asked for it (before the model map; bounded).
    pub const REQUEST_MODEL: &str = crate::telemetry::key::REQUEST_MODEL;
    /// The model the upstream says answered (bounded with the request's), empty if it did not say.
    pub const RESPONSE_MODEL: &str = crate::telemetry::key::RESPONSE_MODEL;
    /// `input`, `output` (and in `tokens_total`, `cached` or `reasoning`).
    pub const TOKEN_TYPE: &str = "gen_ai.token.type";
    /// `chat`: a Responses request is answered by a chat completion (as on the span).
    pub const OPERATION_NAME: &str = crate::telemetry::key::OPERATION_NAME;
    /// `openai`: the upstream speaks OpenAI's Chat Completions (as on the span).
    pub const PROVIDER_NAME: &str = crate::telemetry::key::PROVIDER_NAME;
    /// A failed exchange's error code (bounded as [`ERROR_CODE`]), `_OTHER` without one, `cut`
    /// when Envoy ended it first; empty (no attribute over OTLP) when it was translated.
    pub const ERROR_TYPE: &str = crate::telemetry::key::ERROR_TYPE;
    /// A WebSocket close code (`1000`, `1001`, ...; `1006`: the transport ended without one).
    pub const CLOSE_CODE: &str = "code";
}

use label::{
    CAP, CLOSE_CODE, ERROR_CODE, ERROR_TYPE, OPERATION, OPERATION_NAME, OUTCOME, PROVIDER_NAME,
    REQUEST_MODEL, RESPONSE_MODEL, STREAM, TOKEN_TYPE,
};

/// A request's times, in milliseconds (5 ms to 10 minutes).
const MILLISECONDS: &[f64] = &[
    5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 25000.0, 50000.0,
    100000.0, 250000.0, 600000.0,
];
/// The time per output token, in microseconds (0.5 ms to 1 s).
const TOKEN_MICROSECONDS: &[f64] = &[
    500.0, 1000.0, 2500.0, 5000.0, 10000.0, 25000.0, 50000.0, 100000.0, 250000.0, 1000000.0,
];
/// The translation's own time, in microseconds (10 µs to 1 s).
const TRANSLATION_MICROSECONDS: &[f64] = &[
    10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 25000.0, 100000.0,
    1000000.0,
];

/// `gen_ai.client.token.usage`: the conventions' boundaries, in tokens.
const TOKEN_COUNTS: &[f64] = &[
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];
/// `gen_ai.server.request.duration`: the conventions' boundaries (0.01 s to 81.92 s), in µs.
const GENAI_REQUEST_MICROSECONDS: &[f64] = &[
    10000.0, 20000.0, 40000.0, 80000.0, 160000.0, 320000.0, 640000.0, 1280000.0, 2560000.0,
    5120000.0, 10240000.0, 20480000.0, 40960000.0, 81920000.0,
];
/// `gen_ai.server.time_to_first_token`: the conventions' boundaries (1 ms to 10 s), in µs.
const GENAI_FIRST_TOKEN_MICROSECONDS: &[f64] = &[
    1000.0, 5000.0, 10000.0, 20000.0, 40000.0, 60000.0, 80000.0, 100000.0, 250000.0, 500000.0,
    750000.0, 1000000.0, 2500000.0, 5000000.0, 7500000.0, 10000000.0,
];
/// `gen_ai.server.time_per_output_token`: the conventions' boundaries (10 ms to 2.5 s), in µs.
const GENAI_PER_TOKEN_MICROSECONDS: &[f64] = &[
    10000.0, 25000.0, 50000.0, 75000.0, 100000.0, 150000.0, 200000.0, 300000.0, 400000.0, 500000.0,
    750000.0, 1000000.0, 2500000.0,
];
/// Microseconds in one of the conventions' seconds.
const MICROS_PER_SECOND: f64 = 1e6;

/// The attributes of the conventions' server instruments (the time to first token and per
/// output token are recorded for answers that went well, without `error.type`).
const GENAI_SERVER: &[&str] = &[OPERATION_NAME, PROVIDER_NAME, REQUEST_MODEL, RESPONSE_MODEL];

const TOKEN_USAGE: Family = Family {
    name: "gen_ai_client_token_usage",
    kind: Kind::Histogram,
    unit: "{token}",
    help: "gen_ai.client.token.usage: input and output tokens the upstream reported for each exchange (streams: its trailing usage chunk).",
    labels: &[
        OPERATION_NAME,
        PROVIDER_NAME,
        REQUEST_MODEL,
        RESPONSE_MODEL,
        TOKEN_TYPE,
    ],
    buckets: TOKEN_COUNTS,
    semconv: Some(Instrument {
        name: "gen_ai.client.token.usage",
        unit: "{token}",
        per: 1.0,
    }),
    replaced_by: None,
};
const SERVER_REQUEST_DURATION: Family = Family {
    name: "gen_ai_server_request_duration_microseconds",
    kind: Kind::Histogram,
    unit: "us",
    help: "gen_ai.server.request.duration, in microseconds: time from the request to the end of its answer (streams: to the terminal event), for exchanges whose model was read.",
    labels: &[
        OPERATION_NAME,
        PROVIDER_NAME,
        REQUEST_MODEL,
        RESPONSE_MODEL,
        ERROR_TYPE,
    ],
    buckets: GENAI_REQUEST_MICROSECONDS,
    semconv: Some(Instrument {
        name: "gen_ai.server.request.duration",
        unit: "s",
        per: MICROS_PER_SECOND,
    }),
    replaced_by: None,
};
const SERVER_TIME_TO_FIRST_TOKEN: Family = Family {
    name: "gen_ai_server_time_to_first_token_microseconds",
    kind: Kind::Histogram,
    unit: "us",
    help: "gen_ai.server.time_to_first_token, in microseconds: streams, time from the request to the first output event (text, reasoning, a tool call) sent to the client.",
    labels: GENAI_SERVER,
    buckets: GENAI_FIRST_TOKEN_MICROSECONDS,
    semconv: Some(Instrument {
        name: "gen_ai.server.time_to_first_token",
        unit: "s",
        per: MICROS_PER_SECOND,
    }),
    replaced_by: None,
};
const SERVER_TIME_PER_OUTPUT_TOKEN: Family = Family {
    name: "gen_ai_server_time_per_output_token_microseconds",
    kind: Kind::Histogram,
    unit: "us",
    help: "gen_ai.server.time_per_output_token, in microseconds: completed streams, time after the first output over the output tokens after the first.",
    labels: GENAI_SERVER,
    buckets: GENAI_PER_TOKEN_MICROSECONDS,
    semconv: Some(Instrument {
        name: "gen_ai.server.time_per_output_token",
        unit: "s",
        per: MICROS_PER_SECOND,
    }),
    replaced_by: None,
};

const EXCHANGES: Family = Family {
    name: "exchanges_total",
    kind: Kind::Counter,
    unit: "{exchange}",
    help: "Exchanges the translator owned, by how they ended: translated, failed (with the error code) or cut (Envoy ended them first).",
    labels: &[OPERATION, STREAM, OUTCOME, ERROR_CODE],
    buckets: &[],
    semconv: None,
    replaced_by: None,
};
const CAPS_HIT: Family = Family {
    name: "caps_hit_total",
    kind: Kind::Counter,
    unit: "{exchange}",
    help: "Exchanges that ended at a size cap, by the cap's error code.",
    labels: &[CAP],
    buckets: &[],
    semconv: None,
    replaced_by: None,
};
const TOKENS: Family = Family {
    name: "tokens_total",
    kind: Kind::Counter,
    unit: "{token}",
    help: "Tokens the upstream reported, by model and type (input, output, cached, reasoning), exact sums; a type appears once some exchange reported tokens of it.",
    labels: &[REQUEST_MODEL, RESPONSE_MODEL, TOKEN_TYPE],
    buckets: &[],
    semconv: None,
    replaced_by: None,
};
const REQUEST_DURATION: Family = Family {
    name: "request_duration_milliseconds",
    kind: Kind::Histogram,
    unit: "ms",
    help: "Deprecated, replaced by gen_ai_server_request_duration_microseconds (removed in the next release): time from the request to the end of its answer (streams: to the terminal event), for exchanges whose model was read.",
    labels: &[REQUEST_MODEL, RESPONSE_MODEL, STREAM, OUTCOME],
    buckets: MILLISECONDS,
    semconv: None,
    replaced_by: Some(Metric::ServerRequestDuration),
};
const TIME_TO_FIRST_TOKEN: Family = Family {
    name: "time_to_first_token_milliseconds",
    kind: Kind::Histogram,
    unit: "ms",
    help: "Deprecated, replaced by gen_ai_server_time_to_first_token_microseconds (removed in the next release): streams: time from the request to the first output event (text, reasoning, a tool call) sent to the client.",
    labels: &[REQUEST_MODEL, RESPONSE_MODEL],
    buckets: MILLISECONDS,
    semconv: None,
    replaced_by: Some(Metric::ServerTimeToFirstToken),
};
const TIME_PER_OUTPUT_TOKEN: Family = Family {
    name: "time_per_output_token_microseconds",
    kind: Kind::Histogram,
    unit: "us",
    help: "Deprecated, replaced by gen_ai_server_time_per_output_token_microseconds (removed in the next release): completed streams: time after the first output over the output tokens after the first.",
    labels: &[REQUEST_MODEL, RESPONSE_MODEL],
    buckets: TOKEN_MICROSECONDS,
    semconv: None,
    replaced_by: Some(Metric::ServerTimePerOutputToken),
};
const TRANSLATION: Family = Family {
    name: "translation_microseconds",
    kind: Kind::Histogram,
    unit: "us",
    help: "Time spent translating an exchange (validation, mapping, events), excluding waits.",
    labels: &[STREAM],
    buckets: TRANSLATION_MICROSECONDS,
    semconv: None,
    replaced_by: None,
};
const STREAMS_IN_FLIGHT: Family = Family {
    name: "streams_in_flight",
    kind: Kind::Gauge,
    unit: "{stream}",
    help: "Streamed answers being translated now.",
    labels: &[],
    buckets: &[],
    semconv: None,
    replaced_by: None,
};

const COMPACTIONS: Family = Family {
    name: "compactions_total",
    kind: Kind::Counter,
    unit: "{compaction}",
    help: "Automatic compactions (context_management) by outcome: compacted, failed (the exchange ended with the summarising call's error) or cut (Envoy ended the exchange during the call).",
    labels: &[OUTCOME],
    buckets: &[],
    semconv: None,
    replaced_by: None,
};

const WEBSOCKET_CONNECTIONS: Family = Family {
    name: "websocket_connections",
    kind: Kind::Gauge,
    unit: "{connection}",
    help: "WebSocket connections open now.",
    labels: &[],
    buckets: &[],
    semconv: None,
    replaced_by: None,
};
const WEBSOCKET_CLOSES: Family = Family {
    name: "websocket_closes_total",
    kind: Kind::Counter,
    unit: "{connection}",
    help:
        "WebSocket connections that ended, by close code (1006: the transport ended without one).",
    labels: &[CLOSE_CODE],
    buckets: &[],
    semconv: None,
    replaced_by: None,
};

/// Every family of the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    Exchanges,
    CapsHit,
    Tokens,
    RequestDuration,
    TimeToFirstToken,
    TimePerOutputToken,
    Translation,
    StreamsInFlight,
    Compactions,
    WebsocketConnections,
    WebsocketCloses,
    TokenUsage,
    ServerRequestDuration,
    ServerTimeToFirstToken,
    ServerTimePerOutputToken,
}

impl Metric {
    /// Every metric, in declaration order: `Metric::ALL[m.index()] == m`.
    pub const ALL: [Metric; 15] = [
        Metric::Exchanges,
        Metric::CapsHit,
        Metric::Tokens,
        Metric::RequestDuration,
        Metric::TimeToFirstToken,
        Metric::TimePerOutputToken,
        Metric::Translation,
        Metric::StreamsInFlight,
        Metric::Compactions,
        Metric::WebsocketConnections,
        Metric::WebsocketCloses,
        Metric::TokenUsage,
        Metric::ServerRequestDuration,
        Metric::ServerTimeToFirstToken,
        Metric::ServerTimePerOutputToken,
    ];

    pub fn family(self) -> &'static Family {
        match self {
            Metric::Exchanges => &EXCHANGES,
            Metric::CapsHit => &CAPS_HIT,
            Metric::Tokens => &TOKENS,
            Metric::RequestDuration => &REQUEST_DURATION,
            Metric::TimeToFirstToken => &TIME_TO_FIRST_TOKEN,
            Metric::TimePerOutputToken => &TIME_PER_OUTPUT_TOKEN,
            Metric::Translation => &TRANSLATION,
            Metric::StreamsInFlight => &STREAMS_IN_FLIGHT,
            Metric::Compactions => &COMPACTIONS,
            Metric::WebsocketConnections => &WEBSOCKET_CONNECTIONS,
            Metric::WebsocketCloses => &WEBSOCKET_CLOSES,
            Metric::TokenUsage => &TOKEN_USAGE,
            Metric::ServerRequestDuration => &SERVER_REQUEST_DURATION,
            Metric::ServerTimeToFirstToken => &SERVER_TIME_TO_FIRST_TOKEN,
            Metric::ServerTimePerOutputToken => &SERVER_TIME_PER_OUTPUT_TOKEN,
        }
    }

    /// Its place in [`Metric::ALL`], for adapters that keep a handle per metric in an array.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Where an adapter records: its registry, as the calls the schema makes.
pub trait Recorder {
    /// Adds `value` to a counter, or observes it in a histogram (in the family's unit), for
    /// these label values (in the family's order).
    fn record(&mut self, metric: Metric, labels: &[&str], value: u64);
    /// Moves a gauge (no labels) by `delta`.
    fn gauge_add(&mut self, metric: Metric, delta: i64);
}

/// Records what the driver told of an exchange: a stream opened or closed (the gauge of
/// streams in flight), its end (every other family, once). Call it with every event.
pub fn record(rec: &mut impl Recorder, labels: &Labels, event: &Event) {
    match event {
        Event::StreamOpened => rec.gauge_add(Metric::StreamsInFlight, 1),
        Event::StreamClosed => rec.gauge_add(Metric::StreamsInFlight, -1),
        Event::Finished(f) => finished(rec, labels, &f.summary, &f.timing),
        Event::Claimed { .. } | Event::FirstOutput { .. } | Event::Call(_) => {}
    }
}

/// Records what a WebSocket connection told: its opening and its close (the gauge of
/// connections, closes by code), and each response's life as [`record`] does.
pub fn record_socket(rec: &mut impl Recorder, labels: &Labels, event: &connection::Event) {
    match event {
        connection::Event::Opened => rec.gauge_add(Metric::WebsocketConnections, 1),
        connection::Event::Closed { code, .. } => {
            rec.gauge_add(Metric::WebsocketConnections, -1);
            rec.record(Metric::WebsocketCloses, &[close_code(code.0)], 1);
        }
        connection::Event::Response { event, .. } => record(rec, labels, event),
        connection::Event::Refused { .. }
        | connection::Event::Message { .. }
        | connection::Event::Answer { .. } => {}
    }
}

/// A close code as a label: the codes the connection sends or echoes (a client's own
/// 3000–4999 counted together), so the label's values are bounded.
fn close_code(code: u16) -> &'static str {
    match code {
        1000 => "1000",
        1001 => "1001",
        1002 => "1002",
        1006 => "1006",
        1007 => "1007",
        1008 => "1008",
        1009 => "1009",
        1011 => "1011",
        1013 => "1013",
        3000..=4999 => "application",
        _ => "other",
    }
}

/// One ended (or cut) exchange.
fn finished(rec: &mut impl Recorder, labels: &Labels, s: &Summary, t: &Timing) {
    let stream = if s.stream { "true" } else { "false" };
    let outcome = s.outcome.recorded();
    let code = s.error_code.as_ref().map_or("", |c| labels.code(c));
    rec.record(
        Metric::Exchanges,
        &[s.operation.as_str(), stream, outcome, code],
        1,
    );
    if let Some(cap) = s.error_code.as_ref().and_then(Code::ours) {
        if cap.is_cap() {
            rec.record(Metric::CapsHit, &[cap.as_str()], 1);
        }
    }
    rec.record(Metric::Translation, &[stream], micros(t.translation));
    if let Some(c) = &s.compaction {
        rec.record(Metric::Compactions, &[c.outcome.recorded()], 1);
    }
    // A request refused before its model was read has no model to speak of.
    let Some(models) = labels.models(s) else {
        return;
    };
    let [request, response] = models;
    let genai = [telemetry::OPERATION, telemetry::PROVIDER, request, response];
    // The conventions' error.type, its upstream codes bounded as error_code's.
    let error_type = match (s.outcome, &s.error_code) {
        (Outcome::Failed, Some(_)) => code,
        _ => telemetry::error_type(s).unwrap_or(""),
    };
    rec.record(
        Metric::ServerRequestDuration,
        &[genai[0], genai[1], request, response, error_type],
        micros(t.total),
    );
    rec.record(
        Metric::RequestDuration,
        &[request, response, stream, outcome],
        millis(t.total),
    );
    if let Some(usage) = &s.usage {
        for (kind, n) in [
            ("input", usage.input_tokens),
            ("output", usage.output_tokens),
        ] {
            rec.record(
                Metric::TokenUsage,
                &[genai[0], genai[1], request, response, kind],
                n,
            );
        }
        for (kind, n) in token_counts(usage) {
            // Adding nothing would only cost Envoy a stat lookup.
            if n > 0 {
                rec.record(Metric::Tokens, &[request, response, kind], n);
            }
        }
    }
    let (true, Some(first)) = (s.stream, t.first_output) else {
        return;
    };
    rec.record(Metric::ServerTimeToFirstToken, &genai, micros(first));
    rec.record(Metric::TimeToFirstToken, &models, millis(first));
    let output_tokens = s.usage.map_or(0, |u| u.output_tokens);
    if output_tokens > 1 && s.outcome == Outcome::Translated {
        let per_token = micros(t.total.saturating_sub(first)) / (output_tokens - 1);
        rec.record(Metric::ServerTimePerOutputToken, &genai, per_token);
        rec.record(Metric::TimePerOutputToken, &models, per_token);
    }
}

/// The token counts of an exchange's usage, by their [`label::TOKEN_TYPE`].
pub fn token_counts(u: &Usage) -> [(&'static str, u64); 4] {
    [
        ("input", u.input_tokens),
        ("output", u.output_tokens),
        ("cached", u.input_tokens_details.cached_tokens),
        ("reasoning", u.output_tokens_details.reasoning_tokens),
    ]
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// The label value of everything past a bound.
pub const OTHER: &str = "other";
/// Default of `metrics_max_models`.
pub const DEFAULT_MAX_MODELS: usize = 64;
/// Most distinct error codes of upstreams' own (not ours, which are a closed list) kept as
/// label values.
pub const MAX_UPSTREAM_CODES: usize = 32;

/// Which model names become label values (`metrics_models`, `metrics_max_models`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelPolicy {
    /// These only, if set; else the first `max_models` the upstream answered with success
    /// (see [`Labels::models`]).
    pub allowed_models: Option<Vec<String>>,
    pub max_models: usize,
}

impl Default for LabelPolicy {
    fn default() -> Self {
        LabelPolicy {
            allowed_models: None,
            max_models: DEFAULT_MAX_MODELS,
        }
    }
}

/// A label whose values come from outside: an allow-list, or the first `max` distinct
/// values admitted; the rest are [`OTHER`]. Shared by an adapter's threads.
#[derive(Debug)]
pub struct Bounded {
    allowed: Option<HashSet<String>>,
    seen: Mutex<HashSet<String>>,
    max: usize,
}

impl Bounded {
    pub fn new(allowed: Option<Vec<String>>, max: usize) -> Self {
        Bounded {
            allowed: allowed.map(|a| a.into_iter().collect()),
            seen: Mutex::new(HashSet::new()),
            max,
        }
    }

    /// The label value to use for `value`. Without an allow-list, a value not seen yet takes
    /// a place only if `admit` (and one is left); once it has one, it keeps it.
    pub fn label<'a>(&self, value: &'a str, admit: bool) -> &'a str {
        if let Some(allowed) = &self.allowed {
            return if allowed.contains(value) {
                value
            } else {
                OTHER
            };
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if seen.contains(value) {
            value
        } else if admit && seen.len() < self.max {
            seen.insert(value.to_owned());
            value
        } else {
            OTHER
        }
    }
}

/// The bounds of an adapter's label values from outside: model names (clients', and the
/// upstream's) and upstreams' own error codes, so that no client or upstream can grow the
/// series without bound.
#[derive(Debug)]
pub struct Labels {
    models: Bounded,
    upstream_codes: Bounded,
}

impl Labels {
    pub fn new(policy: LabelPolicy) -> Self {
        Labels {
            models: Bounded::new(policy.allowed_models, policy.max_models),
            upstream_codes: Bounded::new(None, MAX_UPSTREAM_CODES),
        }
    }

    /// The label values of an exchange's models, [`label::REQUEST_MODEL`] and
    /// [`label::RESPONSE_MODEL`]; none for a request refused before its model was read.
    ///
    /// Without `metrics_models`, a name takes one of the `metrics_max_models` places only once
    /// the upstream answered it with success (it named the model that answered, or the
    /// answer was translated): a requested name with that exchange, the upstream's own name
    /// whenever it gives one. A client's names are untrusted, and one that never reaches a
    /// real model (refused, or answered 404 `model_not_found` by vLLM) takes no place, so no
    /// number of them can push a real model out to `other`. An upstream that answers any name
    /// (llama-server serves its one model whatever the request says) confirms any name: list
    /// the models (`metrics_models`) in front of one.
    pub fn models<'a>(&self, s: &'a Summary) -> Option<[&'a str; 2]> {
        let requested = s.model.as_deref()?;
        let answered = s.upstream_model.as_deref().unwrap_or("");
        let confirmed = !answered.is_empty() || s.outcome == Outcome::Translated;
        Some([self.model(requested, confirmed), self.model(answered, true)])
    }

    /// A model name's label value (the request's and the upstream's share one bound): see
    /// [`Labels::models`]. Empty, for an upstream that named none, is ours: it takes no place.
    fn model<'a>(&self, model: &'a str, admit: bool) -> &'a str {
        if model.is_empty() {
            return "";
        }
        self.models.label(model, admit)
    }

    /// An error code's label value: ours as they are, an upstream's bounded (the first
    /// [`MAX_UPSTREAM_CODES`] seen).
    pub fn code<'a>(&self, code: &'a Code) -> &'a str {
        match code {
            Code::Ours(c) => c.as_str(),
            Code::Upstream(s) => self.upstream_codes.label(s, true),
        }
    }
}

impl Default for Labels {
    fn default() -> Self {
        Labels::new(LabelPolicy::default())
    }
}

#[cfg(test)]
mod tests;
