//! What the processor's OTLP exports share (traces, `src/traces`, and metrics,
//! `src/metrics/push.rs`): where each goes (`--otlp-endpoint`, or the standard
//! `OTEL_EXPORTER_OTLP_*` variables, the signal's own first), over which protocol, with what
//! TLS ([`tls`]), and the resource that names the process. One endpoint setting turns both on;
//! `OTEL_TRACES_EXPORTER=none` or `OTEL_METRICS_EXPORTER=none` turns one off.

pub mod tls;

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig, WithTonicConfig};
use opentelemetry_sdk::Resource;

/// The OTLP protocol (`OTEL_EXPORTER_OTLP_<SIGNAL>_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

/// What is exported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Traces,
    Metrics,
}

impl Signal {
    fn upper(self) -> &'static str {
        match self {
            Signal::Traces => "TRACES",
            Signal::Metrics => "METRICS",
        }
    }

    fn lower(self) -> &'static str {
        match self {
            Signal::Traces => "traces",
            Signal::Metrics => "metrics",
        }
    }

    /// `OTEL_EXPORTER_OTLP_<SIGNAL>_<what>`.
    pub fn var(self, what: &str) -> String {
        format!("OTEL_EXPORTER_OTLP_{}_{what}", self.upper())
    }
}

/// Where one signal is exported, resolved and checked at startup.
#[derive(Debug)]
pub struct Destination {
    pub signal: Signal,
    pub protocol: Protocol,
    /// `--otlp-endpoint` (a base URL); `None`: the exporter reads the standard variables.
    pub flag: Option<String>,
    /// The endpoint in use, for the startup log.
    pub used: String,
    /// `https://`: the TLS settings of the standard variables.
    pub tls: Option<tls::ExportTls>,
}

impl Destination {
    /// Where `signal` goes, from `--otlp-endpoint` (`flag`) and the variables `env` reads;
    /// `None` when it is off: no endpoint anywhere, `OTEL_SDK_DISABLED=true`, or
    /// `OTEL_<SIGNAL>_EXPORTER=none`.
    pub fn resolve(
        flag: Option<&str>,
        signal: Signal,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Destination>, String> {
        let flag = flag.map(str::to_owned).filter(|e| !e.trim().is_empty());
        let own = signal.var("ENDPOINT");
        let from_env = env(&own).or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"));
        let exporter = format!("OTEL_{}_EXPORTER", signal.upper());
        let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || env(&exporter).is_some_and(|v| v.eq_ignore_ascii_case("none"));
        if disabled || (flag.is_none() && from_env.is_none()) {
            return Ok(None);
        }
        let protocol = match env(&signal.var("PROTOCOL"))
            .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .as_deref()
        {
            None | Some("grpc") => Protocol::Grpc,
            Some("http/protobuf") => Protocol::HttpProtobuf,
            Some(other) => {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL={other}: this server exports {} over grpc or \
                     http/protobuf",
                    signal.lower()
                ))
            }
        };
        // The endpoint in use: the flag's, else the standard variables' (read by the exporter
        // too); its scheme says whether the export is over TLS.
        let (used, source) = match (&flag, env(&own)) {
            (Some(e), _) => (e.clone(), "--otlp-endpoint".to_owned()),
            (None, Some(e)) => (e, own.clone()),
            (None, None) => (
                from_env.unwrap_or_default(),
                "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            ),
        };
        let tls = if used.starts_with("https://") {
            Some(tls::ExportTls::from_env(signal, &env)?)
        } else if used.starts_with("http://") {
            if tls::variables(signal).iter().any(|v| env(v).is_some()) {
                tracing::warn!(
                    endpoint = %used,
                    "OTEL_EXPORTER_OTLP_*CERTIFICATE/_CLIENT_KEY are set but the OTLP endpoint \
                     is http://: they are not used"
                );
            }
            None
        } else {
            return Err(format!(
                "{source} {used}: expected http://host:port or https://host:port"
            ));
        };
        Ok(Some(Destination {
            signal,
            protocol,
            flag,
            used,
            tls,
        }))
    }

    /// The OTLP/HTTP URL of `--otlp-endpoint` (a base URL, like `OTEL_EXPORTER_OTLP_ENDPOINT`):
    /// `/v1/traces` or `/v1/metrics` under it.
    pub fn http_url(&self) -> Option<String> {
        self.flag
            .as_ref()
            .map(|e| format!("{}/v1/{}", e.trim_end_matches('/'), self.signal.lower()))
    }

    /// The longest one export request may take (`OTEL_EXPORTER_OTLP_<SIGNAL>_TIMEOUT`,
    /// `OTEL_EXPORTER_OTLP_TIMEOUT`, in ms; 10 s), as opentelemetry-otlp reads it: for the HTTP
    /// client of an https:// export, which the exporter does not build itself.
    pub fn timeout(&self) -> Duration {
        [
            self.signal.var("TIMEOUT"),
            "OTEL_EXPORTER_OTLP_TIMEOUT".to_owned(),
        ]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
        .map_or(Duration::from_secs(10), Duration::from_millis)
    }

    /// An OTLP/gRPC exporter's builder (spans' or metrics'), pointed here: `--otlp-endpoint`
    /// (else the exporter reads the standard variables itself), with the TLS settings.
    pub fn grpc<B: WithExportConfig + WithTonicConfig>(&self, mut builder: B) -> B {
        if let Some(e) = &self.flag {
            builder = builder.with_endpoint(e);
        }
        if let Some(tls) = &self.tls {
            builder = builder.with_tls_config(tls.tonic());
        }
        builder
    }

    /// An OTLP/HTTP exporter's builder, pointed here: protobuf, posted under `--otlp-endpoint`
    /// ([`Destination::http_url`]), over TLS with the hyper client of [`tls`] for `https://`.
    pub fn http<B: WithExportConfig + WithHttpConfig>(&self, builder: B) -> Result<B, String> {
        let mut builder = builder.with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
        if let Some(url) = self.http_url() {
            builder = builder.with_endpoint(url);
        }
        if let Some(tls) = &self.tls {
            builder = builder.with_http_client(tls.http_client(self.timeout())?);
        }
        Ok(builder)
    }

    /// What verifies the collector, for the startup log.
    pub fn describe_tls(&self) -> String {
        self.tls
            .as_ref()
            .map_or_else(|| "off".to_owned(), tls::ExportTls::describe)
    }
}

/// The standard variables as the process has them (empty ones unset).
pub fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// `service.name` (`responses-extproc` unless `OTEL_SERVICE_NAME` or `OTEL_RESOURCE_ATTRIBUTES`
/// names it), `service.version`, and whatever `OTEL_RESOURCE_ATTRIBUTES` adds.
pub fn resource() -> Resource {
    let named = std::env::var_os("OTEL_SERVICE_NAME").is_some()
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.contains("service.name="));
    let mut builder = Resource::builder()
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")));
    if !named {
        builder = builder.with_service_name(env!("CARGO_PKG_NAME"));
    }
    builder.build()
}

#[cfg(test)]
mod tests;
