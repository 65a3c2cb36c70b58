//! The responses-extproc service: the adapters that drive the sans-IO core
//! (`responses_core`) over gRPC (ext_proc) and the WebSocket transport, its settings,
//! metrics, traces and the `main` binary's building blocks.

#![forbid(unsafe_code)]

pub mod config;
pub mod extproc;
pub mod logs;
pub mod metrics;
pub mod otlp;
pub mod traces;
pub mod upstream;
pub mod websocket;
