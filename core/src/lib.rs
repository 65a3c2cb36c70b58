//! The sans-IO core of responses-extproc.
//!
//! Bytes and heads in, decisions and bytes out: the wire types of both APIs, the translation
//! between them, the rules of one HTTP exchange ([`exchange`]), its life inside a proxy
//! ([`driver`]) and the rules of one WebSocket connection ([`connection`]). Nothing here knows
//! gRPC, Envoy, sockets or an async runtime; the crate's dependencies keep it so (no tokio,
//! tonic, axum, reqwest). Each adapter (the ext_proc service, the WebSocket transport, the
//! in-process Envoy module) is a thin shell around it.

#![forbid(unsafe_code)]

pub mod call;
pub mod chat;
pub mod client;
pub mod connection;
pub mod driver;
pub mod environment;
pub mod exchange;
pub mod fault;
pub mod life;
pub mod log;
pub mod metadata;
pub mod metrics;
pub mod model_map;
pub mod openresponses;
pub mod request_encoding;
pub mod settings;
pub mod sse;
pub mod telemetry;
pub mod translate;
pub mod upstream_failure;
pub mod websocket;
