//! The end-to-end suites, one binary: each module is one feature, tested through a real Envoy
//! in the mode `RESPONSES_E2E_MODE` says (`tests/common/stack.rs`); `deploy/test.sh` runs the
//! binary in both modes. `cargo test --test e2e websocket::` runs one feature.
//!
//! | module | feature |
//! |---|---|
//! | [`harness_smoke`] | the harness itself: Envoy, the processor, the upstreams, the schema |
//! | [`bad_requests`] | malformed and refused requests: the envelope, nothing sent upstream |
//! | [`clients`] | the real SDKs and agents (Python, Node) against the stack |
//! | [`circuit_breakers`] | the clusters' circuit breakers overflowing: the envelope each gives |
//! | [`compact`] | `POST /v1/responses/compact` |
//! | [`context_management`] | automatic compaction (`context_management`): the side call, the item leading the output |
//! | [`compression`] | compressed request bodies and answers |
//! | [`drain`] | the processor's graceful drain of HTTP exchanges |
//! | [`faults`] | upstream, processor and Envoy faults: what the client sees when something breaks |
//! | [`grpc_reflection`] | the processor's gRPC server reflection (as `grpcurl` uses it) |
//! | [`llama_compaction`] | opt-in: a long conversation against a real llama-server, compacted |
//! | [`limits`] | every size and time limit, from both sides |
//! | [`metadata`] | the dynamic metadata and access-log fields |
//! | [`metrics`] | both modes' metrics, and the dashboard's queries in a real Prometheus |
//! | [`module_abi`] | what Envoy 1.40's dynamic-module ABI gives a filter serving a WebSocket (module mode) |
//! | [`otlp_metrics`] | the GenAI metrics pushed over OTLP to a real receiver, both modes |
//! | [`paths`] | every spelling of the Responses paths meets their routes (path normalisation) |
//! | [`rate_limit`] | Envoy's rate limit service in front of the translation |
//! | [`security`] | the processor's secured listeners (TLS, mTLS) and what it writes in its logs |
//! | [`surface`] | the request surface: every field of every case, through Envoy |
//! | [`tracing`] | spans (OTLP over gRPC and HTTP, TLS) and Envoy's span tags |
//! | [`upstream_errors`] | the recorded upstream failures, and a real llama-server overflowing |
//! | [`vllm_strict`] | opt-in: function tools strict by default, forced calls against a real vLLM |
//! | [`websocket`] | the WebSocket transport |
//! | [`websocket_bounds`] | the WebSocket transport's bounds: what a socket is charged for, who may open one |

#[path = "../common/mod.rs"]
mod common;

mod bad_requests;
mod circuit_breakers;
mod clients;
mod compact;
mod compression;
mod context_management;
mod drain;
mod faults;
mod grpc_reflection;
mod harness_smoke;
mod limits;
mod llama_compaction;
mod metadata;
mod metrics;
mod module_abi;
mod otlp_metrics;
mod paths;
mod rate_limit;
mod security;
mod surface;
mod tracing;
mod upstream_errors;
mod vllm_strict;
mod websocket;
mod websocket_bounds;
