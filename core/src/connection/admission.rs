//! Which WebSocket upgrades a host takes, across all its connections: at most
//! `ws_max_connections` open, at most `ws_max_connections_per_key` for one caller (the value of
//! `ws_key_header`, `authorization` by default: one API key cannot take every slot), an
//! optional allow-list of `Origin`s, none while draining; and the memory all its connections
//! may hold ([`Budget`]).
//!
//! Plain data: a host keeps one behind its own lock (the processor's per WebSocket listener,
//! the module's per filter config, shared by Envoy's workers) and calls [`Admission::admit`] at each upgrade, [`Admission::release`]
//! when the connection ends.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::openresponses::{ApiError, ErrorCode};

/// The rules of admission (from the settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    pub max_connections: usize,
    pub max_per_key: usize,
    /// The request header that tells callers apart (lowercase).
    pub key_header: String,
    /// Allowed `Origin` values; empty: any (API clients send none).
    pub origins: Vec<String>,
    /// Bytes all connections may hold together.
    pub max_total_bytes: usize,
}

/// See the module docs.
#[derive(Debug)]
pub struct Admission {
    rules: Rules,
    open: usize,
    /// Open connections by caller: a keyed hash of the key header's value, so the table
    /// holds no credential.
    by_key: HashMap<u64, usize>,
    hasher: RandomState,
    draining: bool,
    budget: Arc<Budget>,
}

/// A connection's place: hand it back to [`Admission::release`] when the connection ends.
#[derive(Debug)]
#[must_use]
pub struct Ticket {
    key: u64,
}

impl Admission {
    pub fn new(rules: Rules) -> Admission {
        Admission {
            budget: Arc::new(Budget::new(rules.max_total_bytes)),
            rules,
            open: 0,
            by_key: HashMap::new(),
            hasher: RandomState::new(),
            draining: false,
        }
    }

    /// The memory budget every connection of this host shares.
    pub fn budget(&self) -> Arc<Budget> {
        self.budget.clone()
    }

    /// Open connections.
    pub fn open(&self) -> usize {
        self.open
    }

    /// No upgrade is taken from now on.
    pub fn drain(&mut self) {
        self.draining = true;
    }

    pub fn is_draining(&self) -> bool {
        self.draining
    }

    /// Takes an upgrade whose request headers `header` looks up (lowercase names), or says
    /// why not, as the error envelope the handshake is answered with.
    pub fn admit<'h>(
        &mut self,
        header: impl Fn(&str) -> Option<&'h str>,
    ) -> Result<Ticket, ApiError> {
        if self.draining {
            return Err(ApiError::server(
                503,
                ErrorCode::ServerShuttingDown,
                "This server is shutting down: connect again.",
            ));
        }
        if let Some(origin) = header("origin") {
            if !self.rules.origins.is_empty() && !self.rules.origins.iter().any(|o| o == origin) {
                return Err(ApiError::invalid_body(
                    "This origin may not open WebSocket connections here (ws_allowed_origins).",
                )
                .with_status(403)
                .with_code(ErrorCode::OriginNotAllowed));
            }
        }
        if self.open >= self.rules.max_connections {
            return Err(ApiError::server(
                503,
                ErrorCode::WebsocketConnectionsExhausted,
                format!(
                    "This server holds its maximum of {} WebSocket connections (ws_max_connections): retry later or use HTTP.",
                    self.rules.max_connections
                ),
            ));
        }
        let key = self
            .hasher
            .hash_one(header(&self.rules.key_header).unwrap_or_default());
        let mine = self.by_key.entry(key).or_default();
        if *mine >= self.rules.max_per_key {
            return Err(ApiError::server(
                429,
                ErrorCode::WebsocketConnectionsExhausted,
                format!(
                    "This caller holds its maximum of {} WebSocket connections (ws_max_connections_per_key): close one, or retry later.",
                    self.rules.max_per_key
                ),
            ));
        }
        *mine += 1;
        self.open += 1;
        Ok(Ticket { key })
    }

    /// A connection ended: its place is free again.
    pub fn release(&mut self, ticket: Ticket) {
        self.open = self.open.saturating_sub(1);
        if let Some(n) = self.by_key.get_mut(&ticket.key) {
            *n -= 1;
            if *n == 0 {
                self.by_key.remove(&ticket.key);
            }
        }
    }
}

/// The bytes all of a host's connections hold together, against a limit. Each connection
/// adds and removes what it holds as it changes ([`crate::connection::Connection`]).
#[derive(Debug)]
pub struct Budget {
    limit: usize,
    used: AtomicUsize,
}

impl Budget {
    pub fn new(limit: usize) -> Budget {
        Budget {
            limit,
            used: AtomicUsize::new(0),
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Moves what one connection holds from `from` to `to` bytes; whether the total is within
    /// the limit afterwards.
    pub(crate) fn update(&self, from: usize, to: usize) -> bool {
        let used = if to >= from {
            self.used.fetch_add(to - from, Ordering::Relaxed) + (to - from)
        } else {
            self.used.fetch_sub(from - to, Ordering::Relaxed) - (from - to)
        };
        used <= self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Rules {
        Rules {
            max_connections: 4,
            max_per_key: 2,
            key_header: "authorization".into(),
            origins: Vec::new(),
            max_total_bytes: 1000,
        }
    }

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> + 'a {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    #[test]
    fn one_key_cannot_take_every_slot() {
        let mut a = Admission::new(rules());
        let alice = [("authorization", "Bearer alice")];
        let bob = [("authorization", "Bearer bob")];
        let t1 = a.admit(headers(&alice)).unwrap();
        let _t2 = a.admit(headers(&alice)).unwrap();
        let over = a.admit(headers(&alice)).unwrap_err();
        assert_eq!(
            (over.status, over.code.clone()),
            (429, Some(ErrorCode::WebsocketConnectionsExhausted.into()))
        );
        // Another key still gets in, up to the global count.
        let _t3 = a.admit(headers(&bob)).unwrap();
        let _t4 = a.admit(headers(&bob)).unwrap();
        let full = a
            .admit(headers(&[("authorization", "Bearer carol")]))
            .unwrap_err();
        assert_eq!(full.status, 503);
        // A place given back is taken again.
        a.release(t1);
        assert!(a.admit(headers(&alice)).is_ok());
        assert_eq!(a.open(), 4);
        // Callers without the header share one quota.
        let mut a = Admission::new(rules());
        let _ = a.admit(headers(&[])).unwrap();
        let _ = a.admit(headers(&[])).unwrap();
        assert_eq!(a.admit(headers(&[])).unwrap_err().status, 429);
    }

    #[test]
    fn origins_and_the_drain() {
        let mut a = Admission::new(Rules {
            origins: vec!["https://app.example".into()],
            ..rules()
        });
        assert!(a
            .admit(headers(&[("origin", "https://app.example")]))
            .is_ok());
        let refused = a
            .admit(headers(&[("origin", "https://evil.example")]))
            .unwrap_err();
        assert_eq!(
            (refused.status, refused.code.clone()),
            (403, Some(ErrorCode::OriginNotAllowed.into()))
        );
        // API clients send no Origin: not refused.
        assert!(a.admit(headers(&[])).is_ok());
        a.drain();
        assert_eq!(a.admit(headers(&[])).unwrap_err().status, 503);
    }

    #[test]
    fn the_budget_counts_what_each_connection_holds() {
        let b = Budget::new(100);
        assert!(b.update(0, 60));
        assert!(!b.update(0, 50), "110 of 100");
        assert!(b.update(50, 0));
        assert_eq!(b.used(), 60);
        assert!(b.update(60, 0));
        assert_eq!(b.used(), 0);
    }
}
