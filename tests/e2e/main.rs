//! The end-to-end suites, one binary: each module is one feature, tested through a real Envoy
//! in the mode `RESPONSES_E2E_MODE` says (`tests/common/stack.rs`); `deploy/test.sh` runs the
//! binary in both modes. `cargo test --test e2e websocket::` runs one feature.
//!
//! | module | feature |
//! |---|---|
//! | [`harness_smoke`] | the harness itself: Envoy, the processor, the upstreams, the schema |
//! | [`bad_requests`] | malformed and refused requests: the envelope, nothing sent upstream |
//! | [`clients`] | the real SDKs and agents (Python, Node) against the stack |
//! | [`compact`] | `POST /v1/responses/compact` |
//! | [`context_management`] | automatic compaction (`context_management`): the side call, the item leading the output |
//! | [`compression`] | compressed request bodies and answers |
//! | [`faults`] | upstream, processor and Envoy faults: what the client sees when something breaks |
//! | [`grpc_reflection`] | the processor's gRPC server reflection (as `grpcurl` uses it) |
//! | [`llama_compaction`] | opt-in: a long conversation against a real llama-server, compacted |
//! | [`limits`] | every size and time limit, from both sides |
//! | [`metadata`] | the dynamic metadata and access-log fields |
//! | [`metrics`] | both modes' metrics, and the dashboard's queries in a real Prometheus |
//! | [`module_abi`] | what Envoy 1.40's dynamic-module ABI gives a filter serving a WebSocket (module mode) |
//! | [`rate_limit`] | Envoy's rate limit service in front of the translation |
//! | [`security`] | the processor's secured listeners (TLS, mTLS) and what it writes in its logs |
//! | [`surface`] | the request surface: every field of every case, through Envoy |
//! | [`tracing`] | spans (OTLP over gRPC and HTTP, TLS) and Envoy's span tags |
//! | [`upstream_errors`] | the recorded upstream failures, and a real llama-server overflowing |
//! | [`websocket`] | the WebSocket transport |
//! | [`websocket_bounds`] | the WebSocket transport's bounds: what a socket is charged for, who may open one |

#[path = "../common/mod.rs"]
mod common;

mod bad_requests;
mod clients;
mod compact;
mod compression;
mod context_management;
mod faults;
mod grpc_reflection;
mod harness_smoke;
mod limits;
mod llama_compaction;
mod metadata;
mod metrics;
mod module_abi;
mod rate_limit;
mod security;
mod surface;
mod tracing;
mod upstream_errors;
mod websocket;
mod websocket_bounds;
