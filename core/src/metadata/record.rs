//! A WebSocket turn's record: each response a socket ends is told to Envoy on a request of its
//! own, which carries the turn's summary as dynamic metadata ([`turn`](super::turn)), so that
//! Envoy's access log writes one line per turn and its rate limit filter charges the turn's
//! tokens, as for an HTTP exchange.
//!
//! Why a request of its own: the turn's Chat request (the host's call back into Envoy) ends
//! with the upstream's answer, and Envoy closes its stream, logs it and charges it then,
//! while the connection is still reading the answer's last bytes: no filter on that stream
//! can know the turn's usage before the stream is over. That request keeps the rate limit
//! check (its route's, as any Chat request's); the record carries what is only known at the
//! turn's end.
//!
//! The host files the record's metadata in its [`Ledger`] under a random token, sends
//! `POST {responses_path}/turns/{token}` back through Envoy with the turn's call's headers (so
//! the rate limit descriptors are the call's), and forgets the token once that request ended.
//! On Envoy's route for the path the translating filter (the processor over ext_proc, or the
//! module) takes the metadata by its token ([`answer`]) and sets it; Envoy answers the request
//! itself (a direct 204), nothing goes upstream. A path whose token is not filed (a client's
//! guess, one already taken) gets 404, and nothing is set.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Mutex;

use super::MetadataValue;
use crate::exchange::Settings;
use crate::openresponses::{ApiError, ErrorCode};

/// Where a record goes, under the Responses path: `{responses_path}{PATH_SEGMENT}{token}`.
pub const PATH_SEGMENT: &str = "/turns/";

/// Records a ledger holds at most: each is taken within a round trip to Envoy, so this many
/// only wait when records are lost (their request failed before the filter took them); past
/// it the oldest is dropped.
pub const MAX_PENDING: usize = 4096;

/// The dynamic metadata of one record.
pub type Fields = Vec<(&'static str, MetadataValue)>;

/// A turn's record, for the host to file ([`Ledger::file`]) and send: `POST` to `path` with
/// these headers and no body.
#[derive(Debug, Clone)]
pub struct Record {
    /// The token it is filed under (random: a client cannot guess it).
    pub token: u128,
    /// `{responses_path}/turns/{token}`.
    pub path: String,
    /// The turn's call's: its model headers and the handshake's forwarded ones. The host adds
    /// what its transport needs (`:authority`, `content-length`).
    pub headers: Vec<(Cow<'static, str>, String)>,
    /// What the filter sets on the record's stream.
    pub fields: Fields,
}

impl Record {
    pub fn new(
        settings: &Settings,
        token: u128,
        headers: Vec<(Cow<'static, str>, String)>,
        fields: Fields,
    ) -> Record {
        Record {
            token,
            path: format!("{}{PATH_SEGMENT}{token:032x}", settings.responses_path),
            headers,
            fields,
        }
    }
}

/// The records a host filed and its filter has not taken yet, by token (shared by the host's
/// sockets and its filter: a lock held only to insert or remove one).
#[derive(Debug, Default)]
pub struct Ledger {
    pending: Mutex<Pending>,
}

#[derive(Debug, Default)]
struct Pending {
    /// Each record with the order it was filed in.
    records: HashMap<u128, (u64, Fields)>,
    filed: u64,
}

impl Ledger {
    /// Files a record's fields under its token, before its request is sent. A full ledger
    /// drops its oldest record first.
    pub fn file(&self, token: u128, fields: Fields) {
        let mut pending = self.lock();
        if pending.records.len() >= MAX_PENDING {
            let oldest = pending
                .records
                .iter()
                .min_by_key(|(_, (order, _))| *order)
                .map(|(token, _)| *token);
            if let Some(oldest) = oldest {
                pending.records.remove(&oldest);
            }
        }
        pending.filed += 1;
        let order = pending.filed;
        pending.records.insert(token, (order, fields));
    }

    /// The fields filed under `token`, once: the filter's, when the record's request arrives.
    pub fn take(&self, token: u128) -> Option<Fields> {
        self.lock().records.remove(&token).map(|(_, fields)| fields)
    }

    /// The record's request ended (taken or not): whatever is left of it goes.
    pub fn forget(&self, token: u128) {
        self.lock().records.remove(&token);
    }

    /// Records waiting to be taken.
    pub fn len(&self) -> usize {
        self.lock().records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        // A holder that panicked left the map whole (one insert or remove at a time).
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What a request is to the filter on the record route.
#[derive(Debug, PartialEq)]
pub enum Answer {
    /// Not a record: the request is the exchange's (the driver's) to judge.
    NotRecord,
    /// A record: set these fields as the stream's dynamic metadata, then let Envoy answer it.
    Record(Fields),
    /// A record's path with no record filed under it: answer 404, set nothing.
    Unknown(ApiError),
}

/// What a request (its method and path) is: a record filed in `ledger` (taken from it), a
/// record's path with none filed, or anything else.
pub fn answer(settings: &Settings, ledger: &Ledger, method: &str, path: &str) -> Answer {
    let path = path.split_once('?').map_or(path, |(p, _)| p);
    let Some(token) = path
        .strip_prefix(settings.responses_path.as_str())
        .and_then(|rest| rest.strip_prefix(PATH_SEGMENT))
    else {
        return Answer::NotRecord;
    };
    if method != "POST" {
        return Answer::NotRecord;
    }
    let filed = parse_token(token).and_then(|token| ledger.take(token));
    match filed {
        Some(fields) => Answer::Record(fields),
        None => Answer::Unknown(
            ApiError::invalid_body("There is no such turn record.")
                .with_status(404)
                .with_code(ErrorCode::NotFound),
        ),
    }
}

/// A token as written in a record's path: 32 lowercase hex digits.
fn parse_token(text: &str) -> Option<u128> {
    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    if text.len() != 32 || !text.bytes().all(hex) {
        return None;
    }
    u128::from_str_radix(text, 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(n: f64) -> Fields {
        vec![("total_tokens", MetadataValue::Num(n))]
    }

    #[test]
    fn a_filed_record_is_answered_once_by_its_token() {
        let settings = Settings::default();
        let ledger = Ledger::default();
        let record = Record::new(&settings, 0xabc, Vec::new(), fields(18.0));
        assert_eq!(
            record.path,
            "/v1/responses/turns/00000000000000000000000000000abc"
        );
        ledger.file(record.token, record.fields.clone());
        assert_eq!(
            answer(&settings, &ledger, "POST", &record.path),
            Answer::Record(fields(18.0))
        );
        // Taken: the same path again, or a guess, is nothing.
        for path in [
            record.path.as_str(),
            "/v1/responses/turns/00000000000000000000000000000abd",
            "/v1/responses/turns/ABC",
            "/v1/responses/turns/",
        ] {
            let Answer::Unknown(err) = answer(&settings, &ledger, "POST", path) else {
                panic!("{path}: not a record");
            };
            assert_eq!(err.status, 404);
            assert_eq!(err.code, Some(ErrorCode::NotFound.into()));
        }
        // Other requests are the exchange's.
        for (method, path) in [
            ("POST", "/v1/responses"),
            ("POST", "/v1/responses/compact"),
            ("POST", "/v1/chat/completions"),
            ("GET", record.path.as_str()),
        ] {
            assert_eq!(
                answer(&settings, &ledger, method, path),
                Answer::NotRecord,
                "{method} {path}"
            );
        }
    }

    #[test]
    fn a_forgotten_record_is_gone_and_a_full_ledger_drops_its_oldest() {
        let settings = Settings::default();
        let ledger = Ledger::default();
        ledger.file(1, fields(1.0));
        ledger.forget(1);
        assert!(ledger.is_empty());
        for token in 0..MAX_PENDING as u128 + 1 {
            ledger.file(token, fields(token as f64));
        }
        assert_eq!(ledger.len(), MAX_PENDING);
        assert_eq!(ledger.take(0), None, "the oldest went");
        assert_eq!(ledger.take(1), Some(fields(1.0)));
        let path = format!("/v1/responses/turns/{:032x}", MAX_PENDING);
        assert!(matches!(
            answer(&settings, &ledger, "POST", &path),
            Answer::Record(_)
        ));
    }
}
