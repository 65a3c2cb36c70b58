//! The export's TLS, for an `https://` collector: the standard OTLP variables, read and checked
//! at startup (a bad file stops the processor then, rather than failing every export later).
//!
//! * `OTEL_EXPORTER_OTLP_<SIGNAL>_CERTIFICATE` / `OTEL_EXPORTER_OTLP_CERTIFICATE` (the signal:
//!   `TRACES` or `METRICS`): the CA bundle (PEM) that verifies the collector, and only it;
//!   without one, the system's roots (`rustls-native-certs`: the OS store, or `SSL_CERT_FILE` /
//!   `SSL_CERT_DIR`).
//! * `..._CLIENT_CERTIFICATE` and `..._CLIENT_KEY` (the signal's forms first): the client
//!   certificate chain and key the processor presents (mTLS); both or neither.
//!
//! Both protocols use rustls with ring, as the processor's own listener does: over gRPC through
//! tonic's [`ClientTlsConfig`], over HTTP through opentelemetry-http's hyper client with a
//! hyper-rustls connector (reqwest, which serves plaintext export and the WebSocket
//! transport's requests, stays without TLS: its rustls backend would want aws-lc or a
//! process-wide provider).

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use super::Signal;

/// What the variables name, after `OTEL_EXPORTER_OTLP_` (and the signal's `<SIGNAL>_`).
const FILES: [&str; 3] = ["CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"];

/// The variables read for `signal` (they apply to `https://` endpoints only), the signal's own
/// before each shared one.
pub fn variables(signal: Signal) -> Vec<String> {
    FILES
        .iter()
        .flat_map(|f| [signal.var(f), format!("OTEL_EXPORTER_OTLP_{f}")])
        .collect()
}

/// Where the TLS settings come from, for error messages: the variable, and the file it names.
#[derive(Debug, Clone)]
struct Source {
    var: String,
    path: String,
}

/// A PEM file named by a variable, read.
#[derive(Debug, Clone)]
struct Pem {
    source: Source,
    bytes: Vec<u8>,
}

/// The export's TLS settings.
#[derive(Debug, Clone)]
pub struct ExportTls {
    /// The CA bundle; `None`: the system's roots.
    ca: Option<Pem>,
    /// The client certificate chain and its key (mTLS).
    client: Option<(Pem, Pem)>,
}

impl ExportTls {
    /// The settings of the standard variables for `signal` (read by `env`), their files read
    /// and checked.
    pub fn from_env(
        signal: Signal,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<ExportTls, String> {
        let var = |what: &str| -> Result<Option<Pem>, String> {
            let own = signal.var(what);
            let all = format!("OTEL_EXPORTER_OTLP_{what}");
            let Some((var, path)) = env(&own)
                .map(|p| (own, p))
                .or_else(|| env(&all).map(|p| (all, p)))
            else {
                return Ok(None);
            };
            let bytes =
                std::fs::read(&path).map_err(|e| format!("{var}={path}: cannot read it: {e}"))?;
            Ok(Some(Pem {
                source: Source { var, path },
                bytes,
            }))
        };
        let ca = var("CERTIFICATE")?;
        let cert = var("CLIENT_CERTIFICATE")?;
        let key = var("CLIENT_KEY")?;
        let client = match (cert, key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            (Some(one), None) | (None, Some(one)) => {
                return Err(format!(
                    "{}: a client certificate needs its key and the key its certificate \
                     (OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY, \
                     or their _TRACES_ / _METRICS_ forms)",
                    one.source.var
                ))
            }
        };
        let tls = ExportTls { ca, client };
        // Parsed now, so that a wrong file is an error at startup.
        tls.roots()?;
        tls.client_auth()?;
        Ok(tls)
    }

    /// What verifies the collector, for the startup log.
    pub fn describe(&self) -> String {
        let roots = match &self.ca {
            Some(ca) => format!("CA from {}", ca.source.var),
            None => "the system's root certificates".to_owned(),
        };
        match &self.client {
            Some((cert, _)) => format!("{roots}, client certificate from {}", cert.source.var),
            None => roots,
        }
    }

    /// The certificates that verify the collector.
    fn roots(&self) -> Result<rustls::RootCertStore, String> {
        let mut roots = rustls::RootCertStore::empty();
        match &self.ca {
            Some(ca) => {
                for cert in certificates(ca)? {
                    roots
                        .add(cert)
                        .map_err(|e| format!("{}={}: {e}", ca.source.var, ca.source.path))?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                let (added, _) = roots.add_parsable_certificates(found.certs);
                if added == 0 {
                    return Err(format!(
                        "an https:// OTLP endpoint and no CA: the system has no root \
                         certificates ({}); set OTEL_EXPORTER_OTLP_CERTIFICATE to the \
                         collector's CA bundle",
                        found
                            .errors
                            .first()
                            .map(|e| e.to_string())
                            .unwrap_or_else(|| "none found".to_owned())
                    ));
                }
            }
        }
        Ok(roots)
    }

    /// The client certificate chain and key, parsed.
    fn client_auth(
        &self,
    ) -> Result<Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>, String> {
        let Some((cert, key)) = &self.client else {
            return Ok(None);
        };
        let chain = certificates(cert)?;
        let key = PrivateKeyDer::from_pem_slice(&key.bytes).map_err(|e| {
            format!(
                "{}={}: no private key: {e}",
                key.source.var, key.source.path
            )
        })?;
        Ok(Some((chain, key)))
    }

    /// For the gRPC exporter (tonic).
    pub fn tonic(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new();
        config = match &self.ca {
            Some(ca) => config.ca_certificate(Certificate::from_pem(&ca.bytes)),
            None => config.with_native_roots(),
        };
        if let Some((cert, key)) = &self.client {
            config = config.identity(Identity::from_pem(&cert.bytes, &key.bytes));
        }
        config
    }

    /// For the OTLP/HTTP exporter: a hyper client over rustls (ring), each request bounded by
    /// `timeout`.
    pub fn http_client(
        &self,
        timeout: std::time::Duration,
    ) -> Result<impl opentelemetry_http::HttpClient + 'static, String> {
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS for the OTLP export: {e}"))?
        .with_root_certificates(self.roots()?);
        let config = match self.client_auth()? {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("the OTLP export's client certificate: {e}"))?,
            None => builder.with_no_client_auth(),
        };
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .build();
        Ok(opentelemetry_http::hyper::HyperClient::new(
            connector, timeout, None,
        ))
    }
}

/// The certificates of a PEM file (at least one).
fn certificates(pem: &Pem) -> Result<Vec<CertificateDer<'static>>, String> {
    let what = || format!("{}={}", pem.source.var, pem.source.path);
    let certs = CertificateDer::pem_slice_iter(&pem.bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", what()))?;
    if certs.is_empty() {
        return Err(format!("{}: no PEM certificate in it", what()));
    }
    Ok(certs)
}

#[cfg(test)]
mod tests;
