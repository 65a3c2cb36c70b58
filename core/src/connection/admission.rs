//! Which WebSocket upgrades a host takes, across all its connections: at most
//! `ws_max_connections` open; at most `ws_max_connections_per_address` from one downstream
//! address as Envoy sees it (after its `x-forwarded-for` rules: something a client cannot
//! choose, so one client cannot take every slot); when the operator names a `ws_key_header`
//! (a header Envoy sets after verifying the caller, such as a `jwt_authn` claim), at most
//! `ws_max_connections_per_key` for one value of it; an `Origin` only if listed in
//! `ws_allowed_origins` (none if no list is set: browsers send one, API clients none); none
//! while draining; and the memory all its connections may hold ([`Budget`]).
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

/// The request header the processor's WebSocket listener reads the client's address from:
/// Envoy sets it on the upgrade's route to the downstream address as it sees it
/// (`%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%`, replacing a client's own). Without it the
/// processor keys on its TCP peer (Envoy): every caller then shares one address's quota.
pub const CLIENT_ADDRESS_HEADER: &str = "x-responses-client-address";

/// The rules of admission (from the settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rules {
    pub max_connections: usize,
    /// Most connections from one downstream address.
    pub max_per_address: usize,
    /// Most connections for one value of `key_header`.
    pub max_per_key: usize,
    /// The request header that tells callers apart (lowercase), if the operator names one:
    /// callers without it share one quota.
    pub key_header: Option<String>,
    /// Allowed `Origin` values; empty: none (a handshake with an `Origin` is refused; API
    /// clients send none).
    pub origins: Vec<String>,
    /// Bytes all connections may hold together.
    pub max_total_bytes: usize,
}

/// See the module docs.
#[derive(Debug)]
pub struct Admission {
    rules: Rules,
    open: usize,
    /// Open connections by downstream address (a keyed hash of it).
    by_address: HashMap<u64, usize>,
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
    address: u64,
    key: Option<u64>,
}

impl Admission {
    pub fn new(rules: Rules) -> Admission {
        Admission {
            budget: Arc::new(Budget::new(rules.max_total_bytes)),
            rules,
            open: 0,
            by_address: HashMap::new(),
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

    /// Takes an upgrade from the downstream `address` (as Envoy sees it; a port after it is
    /// ignored, see [`address_of`]) whose request headers `header` looks up (lowercase names),
    /// or says why not, as the error envelope the handshake is answered with.
    pub fn admit<'h>(
        &mut self,
        address: &str,
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
            if !self.rules.origins.iter().any(|o| o == origin) {
                let message = if self.rules.origins.is_empty() {
                    "Browser pages may not open WebSocket connections here: no origin is allowed (ws_allowed_origins). API clients send no Origin header."
                } else {
                    "This origin may not open WebSocket connections here (ws_allowed_origins)."
                };
                return Err(ApiError::invalid_body(message)
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
        let address = self.hasher.hash_one(address_of(address));
        if self.by_address.get(&address).copied().unwrap_or(0) >= self.rules.max_per_address {
            return Err(ApiError::server(
                429,
                ErrorCode::WebsocketConnectionsExhausted,
                format!(
                    "This address holds its maximum of {} WebSocket connections (ws_max_connections_per_address): close one, or retry later.",
                    self.rules.max_per_address
                ),
            ));
        }
        let key = match &self.rules.key_header {
            Some(name) => {
                let key = self.hasher.hash_one(header(name).unwrap_or_default());
                if self.by_key.get(&key).copied().unwrap_or(0) >= self.rules.max_per_key {
                    return Err(ApiError::server(
                        429,
                        ErrorCode::WebsocketConnectionsExhausted,
                        format!(
                            "This caller holds its maximum of {} WebSocket connections (ws_max_connections_per_key): close one, or retry later.",
                            self.rules.max_per_key
                        ),
                    ));
                }
                *self.by_key.entry(key).or_default() += 1;
                Some(key)
            }
            None => None,
        };
        *self.by_address.entry(address).or_default() += 1;
        self.open += 1;
        Ok(Ticket { address, key })
    }

    /// A connection ended: its place is free again.
    pub fn release(&mut self, ticket: Ticket) {
        self.open = self.open.saturating_sub(1);
        let give_back = |table: &mut HashMap<u64, usize>, entry: u64| {
            if let Some(n) = table.get_mut(&entry) {
                *n -= 1;
                if *n == 0 {
                    table.remove(&entry);
                }
            }
        };
        give_back(&mut self.by_address, ticket.address);
        if let Some(key) = ticket.key {
            give_back(&mut self.by_key, key);
        }
    }
}

/// A downstream address without its port: `1.2.3.4:5678` and `1.2.3.4` are one address, as
/// are `[::1]:5678` and `::1`.
pub fn address_of(address: &str) -> &str {
    if let Some(v6) = address.strip_prefix('[') {
        return v6.split_once(']').map_or(v6, |(ip, _)| ip);
    }
    match address.split_once(':') {
        // One colon: an IPv4 address (or a name) and its port.
        Some((ip, port)) if !port.contains(':') => ip,
        _ => address,
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
            max_per_address: 2,
            max_per_key: 2,
            key_header: None,
            origins: Vec::new(),
            max_total_bytes: 1000,
        }
    }

    fn headers<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> + 'a {
        move |name| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    #[test]
    fn one_address_cannot_take_every_slot_whatever_it_sends() {
        let mut a = Admission::new(rules());
        // As many credentials as it likes: the address is what counts, not what it sends.
        let key = |i: usize| format!("Bearer sk-{i}");
        let keys: Vec<String> = (0..3).map(key).collect();
        let t1 = a
            .admit("10.0.0.1:1000", headers(&[("authorization", &keys[0])]))
            .unwrap();
        let _t2 = a
            .admit("10.0.0.1:1001", headers(&[("authorization", &keys[1])]))
            .unwrap();
        let over = a
            .admit("10.0.0.1:1002", headers(&[("authorization", &keys[2])]))
            .unwrap_err();
        assert_eq!(
            (over.status, over.code.clone()),
            (429, Some(ErrorCode::WebsocketConnectionsExhausted.into()))
        );
        assert!(over.message.contains("ws_max_connections_per_address"));
        // Another address still gets in, up to the global count.
        let _t3 = a.admit("10.0.0.2:1000", headers(&[])).unwrap();
        let _t4 = a.admit("[::1]:1000", headers(&[])).unwrap();
        let full = a.admit("10.0.0.3", headers(&[])).unwrap_err();
        assert_eq!(full.status, 503);
        // A place given back is taken again.
        a.release(t1);
        assert!(a.admit("10.0.0.1", headers(&[])).is_ok());
        assert_eq!(a.open(), 4);
    }

    #[test]
    fn a_key_header_the_operator_names_is_a_quota_of_its_own() {
        let mut a = Admission::new(Rules {
            key_header: Some("x-caller".into()),
            max_per_address: 10,
            ..rules()
        });
        let alice = [("x-caller", "alice")];
        let t1 = a.admit("10.0.0.1", headers(&alice)).unwrap();
        let _t2 = a.admit("10.0.0.2", headers(&alice)).unwrap();
        let over = a.admit("10.0.0.3", headers(&alice)).unwrap_err();
        assert_eq!(over.status, 429);
        assert!(over.message.contains("ws_max_connections_per_key"));
        // Another caller from the same address gets in.
        let _t3 = a
            .admit("10.0.0.1", headers(&[("x-caller", "bob")]))
            .unwrap();
        a.release(t1);
        assert!(a.admit("10.0.0.3", headers(&alice)).is_ok());
        // Callers without it share one quota.
        let mut a = Admission::new(Rules {
            key_header: Some("x-caller".into()),
            max_per_address: 10,
            ..rules()
        });
        let _ = a.admit("10.0.0.1", headers(&[])).unwrap();
        let _ = a.admit("10.0.0.2", headers(&[])).unwrap();
        assert_eq!(a.admit("10.0.0.3", headers(&[])).unwrap_err().status, 429);
    }

    #[test]
    fn addresses_are_keyed_without_their_port() {
        assert_eq!(address_of("1.2.3.4:5678"), "1.2.3.4");
        assert_eq!(address_of("1.2.3.4"), "1.2.3.4");
        assert_eq!(address_of("[2001:db8::1]:443"), "2001:db8::1");
        assert_eq!(address_of("2001:db8::1"), "2001:db8::1");
        assert_eq!(address_of(""), "");
    }

    #[test]
    fn origins_and_the_drain() {
        // No list: a handshake with an Origin (a browser page) is refused; API clients send
        // none and are not.
        let mut a = Admission::new(rules());
        let refused = a
            .admit("10.0.0.1", headers(&[("origin", "https://app.example")]))
            .unwrap_err();
        assert_eq!(
            (refused.status, refused.code.clone()),
            (403, Some(ErrorCode::OriginNotAllowed.into()))
        );
        assert!(a.admit("10.0.0.1", headers(&[])).is_ok());
        // A list: its origins, and API clients.
        let mut a = Admission::new(Rules {
            origins: vec!["https://app.example".into()],
            ..rules()
        });
        assert!(a
            .admit("10.0.0.1", headers(&[("origin", "https://app.example")]))
            .is_ok());
        let refused = a
            .admit("10.0.0.2", headers(&[("origin", "https://evil.example")]))
            .unwrap_err();
        assert_eq!(
            (refused.status, refused.code.clone()),
            (403, Some(ErrorCode::OriginNotAllowed.into()))
        );
        assert!(a.admit("10.0.0.2", headers(&[])).is_ok());
        a.drain();
        assert_eq!(a.admit("10.0.0.3", headers(&[])).unwrap_err().status, 503);
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
