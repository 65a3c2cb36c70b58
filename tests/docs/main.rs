//! The documentation and the shipped files against the code, one binary (no Envoy needed but
//! for the manifests' bootstraps): `cargo test --test docs`.
//!
//! | module | what it keeps in step |
//! |---|---|
//! | [`links`] | every relative link and anchor of `README.md` and `docs/` |
//! | [`claims`] | numbers and names the docs state and the code defines |
//! | [`configuration`] | `docs/configuration.md`'s settings table and the CLI and JSON keys |
//! | [`error_codes`] | the docs' error-code table and `ErrorCode` |
//! | [`readme_fields`] | `docs/request-mapping.md`'s request fields and the translation |
//! | [`readme_clients`] | `docs/clients.md`'s clients table and the pinned SDKs and tests |
//! | [`telemetry_schema`] | the module's histogram buckets in every shipped Envoy config |
//! | [`deploy_manifests`] | the Kubernetes, Istio and Envoy Gateway manifests |

#[path = "../common/mod.rs"]
mod common;

mod claims;
mod configuration;
mod deploy_manifests;
mod error_codes;
mod links;
mod readme_clients;
mod readme_fields;
mod telemetry_schema;
