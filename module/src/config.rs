//! The filter's configuration: the JSON object of `DynamicModuleFilter.filter_config` (the
//! same settings, names and defaults as the processor's flags, `responses_core::settings`),
//! the sealing keys, and the Envoy stats the filter records (the core's metrics schema).

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use chacha20poly1305::aead::{rand_core::RngCore, OsRng};
use responses_core::connection::admission::Admission;
use responses_core::exchange;
use responses_core::metrics::{Kind, Labels, Metric};
use responses_core::settings::{ExchangeConfig, KeySource};

use crate::host::MetricId;

/// Defines one stat: its kind, name and label names; `None` if Envoy refused it.
pub type Define<'a> = dyn FnMut(Kind, &str, &[&str]) -> Option<MetricId> + 'a;

/// The stats the filter records: the core's schema (`responses_core::metrics`), each family
/// defined in Envoy as `<metrics_namespace>.<name>` with its labels as Envoy tags
/// (`envoy_<metrics_namespace>_<name>` in Prometheus form), by the ids Envoy gave them.
#[derive(Debug, Clone, Copy)]
pub struct Metrics {
    /// By [`Metric::index`].
    ids: [MetricId; Metric::ALL.len()],
}

impl Metrics {
    /// Defines every stat with `define(kind, name, label names)`; `None` if Envoy refused one.
    pub fn define(define: &mut Define<'_>) -> Option<Metrics> {
        let mut ids = [MetricId(0); Metric::ALL.len()];
        for (id, metric) in ids.iter_mut().zip(Metric::ALL) {
            let f = metric.family();
            *id = define(f.kind, f.name, f.labels)?;
        }
        Some(Metrics { ids })
    }

    pub fn id(&self, metric: Metric) -> MetricId {
        self.ids[metric.index()]
    }
}

/// One filter configuration (shared by every stream it filters).
#[derive(Debug)]
pub struct FilterConfig {
    pub settings: Arc<exchange::Settings>,
    pub metrics: Metrics,
    /// The bound on the stats' label values from clients and upstreams (per config: a new
    /// config starts counting the models it has seen anew).
    pub labels: Labels,
    /// Where the sealing keys came from (logged once).
    pub key_source: KeySource,
    /// The WebSocket transport's settings.
    pub socket: SocketConfig,
}

/// What the filter needs to serve the WebSocket transport besides the exchange's settings.
#[derive(Debug)]
pub struct SocketConfig {
    /// Each connection's limits (`ws_*`).
    pub limits: responses_core::connection::Limits,
    /// Which upgrades are taken (the core's rules: the count, the quota per caller, origins,
    /// the drain) and the memory budget, across every worker this config serves. Per config,
    /// as each of the processor's listeners has its own: a listener Envoy replaces counts
    /// anew while the old one's sockets drain.
    admission: Mutex<Admission>,
    /// `upstream_cluster`: where each response's Chat call goes.
    pub upstream_cluster: String,
}

impl SocketConfig {
    /// The admission's lock: its state stays consistent even if a holder panicked (the
    /// lock is never held across a call into Envoy).
    pub fn admission(&self) -> MutexGuard<'_, Admission> {
        self.admission
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A random sealing key for this process, the same for every filter config (an Envoy
/// config update must not change it, or blobs sealed before could not be opened).
fn ephemeral_key() -> [u8; 32] {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    *KEY.get_or_init(|| {
        let mut key = [0u8; 32];
        OsRng.fill_bytes(&mut key);
        key
    })
}

/// Whether a config reads its key file (`reasoning_keys_file`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFile {
    Read,
    /// `envoy --mode validate`: the settings are checked, the file is not read (the machine
    /// validating a gateway's config need not hold its secrets); a random key stands in.
    Skip,
}

impl FilterConfig {
    /// Reads the filter config (empty: every default), checks it as the processor checks its
    /// flags, loads the keys and defines the stats.
    pub fn new(
        json: &[u8],
        key_file: KeyFile,
        define: &mut Define<'_>,
    ) -> Result<FilterConfig, String> {
        let config: ExchangeConfig = if json.iter().all(u8::is_ascii_whitespace) {
            ExchangeConfig::default()
        } else {
            serde_json::from_slice(json).map_err(|e| format!("filter_config: {e}"))?
        };
        config.validate()?;
        let mut keys = config.clone();
        if key_file == KeyFile::Skip {
            keys.reasoning_keys_file = None;
        }
        let (keyring, key_source) =
            keys.keyring(|path| std::fs::read_to_string(path), ephemeral_key)?;
        let metrics = Metrics::define(define).ok_or("Envoy refused to define the stats")?;
        let settings = config.exchange_settings(Some(keyring));
        Ok(FilterConfig {
            settings: Arc::new(settings),
            metrics,
            labels: Labels::new(config.label_policy()),
            key_source,
            socket: SocketConfig {
                limits: config.socket_limits(),
                admission: Mutex::new(Admission::new(config.admission_rules())),
                upstream_cluster: config.upstream_cluster.clone(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids() -> impl FnMut(Kind, &str, &[&str]) -> Option<MetricId> {
        let mut next = 0;
        move |_, _, _| {
            next += 1;
            Some(MetricId(next))
        }
    }

    #[test]
    fn the_config_is_the_processors_settings_in_json() {
        let c = FilterConfig::new(b"", KeyFile::Read, &mut ids()).unwrap();
        let defaults = ExchangeConfig::default().exchange_settings(None);
        assert_eq!(c.settings.responses_path, defaults.responses_path);
        assert_eq!(c.settings.max_body_bytes, defaults.max_body_bytes);
        assert_eq!(c.key_source, KeySource::Ephemeral);
        // Two configs share the process's random key: a blob sealed under one opens under the
        // other (an Envoy config update keeps the key).
        let again = FilterConfig::new(b"{}", KeyFile::Read, &mut ids()).unwrap();
        let seal = |c: &FilterConfig| {
            c.settings
                .options
                .keyring
                .as_ref()
                .unwrap()
                .seal("x", responses_core::translate::seal::nonce(1, 2))
        };
        assert_eq!(seal(&c), seal(&again));

        let c = FilterConfig::new(
            br#"{"max_body_bytes": 2048, "strict": true, "model_header": "X-Model",
                 "reasoning_keys": "k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}"#,
            KeyFile::Read,
            &mut ids(),
        )
        .unwrap();
        assert_eq!(c.settings.max_body_bytes, 2048);
        assert!(c.settings.options.strict);
        assert_eq!(c.settings.model_header, "x-model");
        assert_eq!(c.key_source, KeySource::Text);
    }

    #[test]
    fn every_family_of_the_schema_is_a_stat() {
        let mut defined = Vec::new();
        let c = FilterConfig::new(b"{}", KeyFile::Read, &mut |kind, name, labels| {
            defined.push((kind, name.to_owned(), labels.to_vec().join(",")));
            Some(MetricId(100 + defined.len()))
        })
        .unwrap();
        assert_eq!(defined.len(), Metric::ALL.len());
        for (i, metric) in Metric::ALL.iter().enumerate() {
            let f = metric.family();
            assert_eq!(defined[i], (f.kind, f.name.to_owned(), f.labels.join(",")));
            assert_eq!(c.metrics.id(*metric), MetricId(101 + i));
        }
    }

    #[test]
    fn bad_configs_are_refused_with_a_reason() {
        for (json, why) in [
            (&br#"{"max_body_bytes": "big"}"#[..], "invalid type"),
            (br#"{"max_bodybytes": 1}"#, "unknown field"),
            (br#"{"chat_path": "v1/chat"}"#, "chat_path"),
            (br#"{"reasoning_keys": "nope"}"#, "reasoning_keys"),
            (b"[1]", "filter_config"),
        ] {
            let err = FilterConfig::new(json, KeyFile::Read, &mut ids()).unwrap_err();
            assert!(err.contains(why), "{err}");
        }
        let err = FilterConfig::new(b"{}", KeyFile::Read, &mut |_, _, _| None).unwrap_err();
        assert!(err.contains("stats"), "{err}");
        // A key file that is not there: refused, except when Envoy only validates its config.
        let missing = br#"{"reasoning_keys_file": "/nonexistent/keys"}"#;
        let err = FilterConfig::new(missing, KeyFile::Read, &mut ids()).unwrap_err();
        assert!(err.contains("/nonexistent/keys"), "{err}");
        assert!(FilterConfig::new(missing, KeyFile::Skip, &mut ids()).is_ok());
    }
}
