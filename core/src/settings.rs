//! The operator's settings of the translation (and of its metrics' labels), defined once for
//! every adapter.
//!
//! The ext_proc service reads them as command-line flags and environment variables (clap,
//! with this crate's `clap` feature), the in-process Envoy module as the JSON object of its
//! filter config (serde). One struct, so one set of names (the flag `--max-body-bytes` is the
//! key `max_body_bytes`), one set of defaults ([`ExchangeConfig::default`], which the flags'
//! defaults are checked against) and one validation ([`ExchangeConfig::validate`]). Unknown
//! JSON keys are refused, as unknown flags are.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::client::ReasoningEventsPolicy;
use crate::connection::{self, admission};
use crate::exchange;
use crate::metrics::{self, LabelPolicy};
use crate::model_map::{self, ModelAlias, ModelMap};
use crate::translate::seal::{Keyring, Tenant};
use crate::translate::{limits, DeveloperRole, HostedTools, Options, ReasoningEvents};

pub use crate::exchange::{
    DEFAULT_CHAT_PATH, DEFAULT_FORWARD_HEADERS, DEFAULT_MAX_BODY_BYTES, DEFAULT_MODEL_HEADER,
    DEFAULT_RESPONSES_PATH, DEFAULT_UPSTREAM_MODEL_HEADER,
};

/// The settings every adapter shares: routing, translation, caps, sealing keys and the bound
/// on metric labels. The doc
/// comments are the CLI's `--help`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
#[serde(default, deny_unknown_fields)]
pub struct ExchangeConfig {
    /// Request path that is translated; everything else passes through untouched.
    #[cfg_attr(feature = "clap", arg(long, default_value = DEFAULT_RESPONSES_PATH, env = "RESPONSES_EXTPROC_RESPONSES_PATH"))]
    pub responses_path: String,

    /// Upstream path a translated request is sent to.
    #[cfg_attr(feature = "clap", arg(long, default_value = DEFAULT_CHAT_PATH, env = "RESPONSES_EXTPROC_CHAT_PATH"))]
    pub chat_path: String,

    /// Request header set to the model name the client asked for, so Envoy routes can match
    /// on it.
    #[cfg_attr(feature = "clap", arg(long, default_value = DEFAULT_MODEL_HEADER, env = "RESPONSES_EXTPROC_MODEL_HEADER"))]
    pub model_header: String,

    /// Request header set to the model name the Chat request carries (--model-map's for the
    /// requested one, else the requested one).
    #[cfg_attr(feature = "clap", arg(long, default_value = DEFAULT_UPSTREAM_MODEL_HEADER, env = "RESPONSES_EXTPROC_UPSTREAM_MODEL_HEADER"))]
    pub upstream_model_header: String,

    /// Model names sent upstream in place of the requested ones: `requested=upstream` pairs,
    /// comma-separated (`gpt-*=qwen3,o3=llama`); `requested` is an exact name or a prefix
    /// ending in `*`. Exact names win, then the longest prefix; other names pass as sent.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_delimiter = ',', env = "RESPONSES_EXTPROC_MODEL_MAP")
    )]
    #[serde(with = "model_map::json")]
    pub model_map: Vec<ModelAlias>,

    /// Strict mode: reject `store: true` and unknown top-level fields with 400 instead of
    /// serving them statelessly and forwarding them to the upstream.
    #[cfg_attr(feature = "clap", arg(long, env = "RESPONSES_EXTPROC_STRICT"))]
    pub strict: bool,

    /// Event names used for streamed reasoning text: `auto` serves each client the names it
    /// parses; the request header x-responses-reasoning-events (spec|openai) overrides.
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_enum,
            default_value_t = ReasoningEventsPolicy::default(),
            env = "RESPONSES_EXTPROC_REASONING_EVENTS"
        )
    )]
    pub reasoning_events: ReasoningEventsPolicy,

    /// Largest single upstream SSE event held while waiting for its end (bytes).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = limits::MAX_SSE_FRAME_BYTES, env = "RESPONSES_EXTPROC_MAX_SSE_FRAME_BYTES"))]
    pub max_sse_frame_bytes: usize,

    /// Largest text + arguments accumulated for one response (bytes); beyond it the
    /// response fails cleanly.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = limits::MAX_OUTPUT_BYTES, env = "RESPONSES_EXTPROC_MAX_OUTPUT_BYTES"))]
    pub max_output_bytes: usize,

    /// What `developer` messages become upstream: `system` (most chat templates) or
    /// `developer` (for upstreams that know the role).
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_enum,
            default_value_t = DeveloperRole::default(),
            env = "RESPONSES_EXTPROC_DEVELOPER_ROLE"
        )
    )]
    pub developer_role: DeveloperRole,

    /// Hosted tools (`web_search`, `file_search`, ...) cannot run on a Chat upstream: drop
    /// them from the request, or reject the request with 400.
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_enum,
            default_value_t = HostedTools::default(),
            env = "RESPONSES_EXTPROC_HOSTED_TOOLS"
        )
    )]
    pub hosted_tools: HostedTools,

    /// Largest accepted `/v1/responses` body (bytes); larger → 413. Envoy's own buffer limit
    /// (envoy.yaml) applies first.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = limits::MAX_REQUEST_BYTES, env = "RESPONSES_EXTPROC_MAX_REQUEST_BYTES"))]
    pub max_request_bytes: usize,

    /// Most items accepted in `input`; more → 400.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = limits::MAX_INPUT_ITEMS, env = "RESPONSES_EXTPROC_MAX_INPUT_ITEMS"))]
    pub max_input_items: usize,

    /// Largest single content part (text, image/file data, tool output) in bytes; larger → 400.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = limits::MAX_PART_BYTES, env = "RESPONSES_EXTPROC_MAX_PART_BYTES"))]
    pub max_part_bytes: usize,

    /// File of keys sealing reasoning for `include: ["reasoning.encrypted_content"]`: one
    /// `KEY_ID:BASE64_32_BYTES` per line, the first one active (seals), all accepted (open).
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "RESPONSES_EXTPROC_REASONING_KEYS_FILE")
    )]
    pub reasoning_keys_file: Option<PathBuf>,

    /// The same keys as text. For the CLI from the environment only, so they stay out of
    /// process listings; for the module a key of its config.
    #[cfg_attr(feature = "clap", arg(skip = std::env::var("RESPONSES_EXTPROC_REASONING_KEYS").ok()))]
    pub reasoning_keys: Option<String>,

    /// Request header naming the tenant that sealed items (`encrypted_content` of reasoning
    /// and compaction items) are bound to: its value enters each blob's authenticated data, so
    /// a blob sealed for one tenant never opens for another. Envoy must set it from the
    /// caller's identity (a JWT claim, the route) and remove a client's own; a request that
    /// seals or opens an item without it gets 403 `missing_tenant`. Unset: blobs are bound to
    /// no tenant.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "RESPONSES_EXTPROC_SEAL_TENANT_HEADER")
    )]
    pub seal_tenant_header: Option<String>,

    /// With --seal-tenant-header: blobs sealed before it was set (bound to no tenant) still
    /// open, for any tenant, while the conversations begun before move over (new blobs are
    /// always bound). Off: they get 400 `invalid_encrypted_content`.
    #[cfg_attr(
        feature = "clap",
        arg(long, env = "RESPONSES_EXTPROC_SEAL_ACCEPT_UNBOUND")
    )]
    pub seal_accept_unbound: bool,

    /// Largest upstream JSON body buffered for translation (bytes).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_MAX_BODY_BYTES, env = "RESPONSES_EXTPROC_MAX_BODY_BYTES"))]
    pub max_body_bytes: usize,

    /// Automatic compaction (`context_management`): bytes of the translated Chat request per
    /// estimated input token, the estimate compared with the request's `compact_threshold`.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = limits::COMPACTION_BYTES_PER_TOKEN, env = "RESPONSES_EXTPROC_COMPACTION_BYTES_PER_TOKEN"))]
    pub compaction_bytes_per_token: u32,

    /// Automatic compaction: how long its summarising call may take, in seconds, before the
    /// exchange fails with 504 `upstream_timeout` (ext_proc: keep it under Envoy's
    /// `max_message_timeout`).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = exchange::DEFAULT_COMPACTION_TIMEOUT, env = "RESPONSES_EXTPROC_COMPACTION_TIMEOUT"))]
    pub compaction_timeout: u64,

    /// Model names kept as metric labels (comma-separated); others are counted as `other`.
    /// Unset: the first --metrics-max-models names the upstream answered with success.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_delimiter = ',', env = "RESPONSES_EXTPROC_METRICS_MODELS")
    )]
    pub metrics_models: Vec<String>,

    /// Most distinct model names in metric labels when --metrics-models is unset (only names
    /// the upstream answered with success take a place: this bounds the number of series).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = metrics::DEFAULT_MAX_MODELS, env = "RESPONSES_EXTPROC_METRICS_MAX_MODELS"))]
    pub metrics_max_models: usize,

    /// Most WebSocket connections open at once (in the module: across Envoy's workers);
    /// further upgrades get 503 `websocket_connections_exhausted`.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_WS_MAX_CONNECTIONS, env = "RESPONSES_EXTPROC_WS_MAX_CONNECTIONS"))]
    pub ws_max_connections: usize,

    /// Largest context kept per WebSocket connection for `previous_response_id` (the last
    /// response's input and output, as JSON bytes); a larger one is not kept.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = limits::MAX_REQUEST_BYTES, env = "RESPONSES_EXTPROC_WS_MAX_CONTEXT_BYTES"))]
    pub ws_max_context_bytes: usize,

    /// Maximum age of a WebSocket connection, in seconds (the specification's 60 minutes):
    /// then `websocket_connection_limit_reached` and a close, after the response in flight.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_WS_MAX_AGE, env = "RESPONSES_EXTPROC_WS_MAX_AGE"))]
    pub ws_max_age: u64,

    /// A WebSocket connection with nothing in flight and no message for this many seconds
    /// is closed (1000); pings do not count. Keep it below Envoy's idle timeout on the route.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_WS_IDLE_TIMEOUT, env = "RESPONSES_EXTPROC_WS_IDLE_TIMEOUT"))]
    pub ws_idle_timeout: u64,

    /// Bytes of events a WebSocket client may leave unread (waiting while its connection's
    /// buffer is over its high watermark) before its response fails and the connection closes
    /// (1008).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = connection::DEFAULT_MAX_UNREAD_BYTES, env = "RESPONSES_EXTPROC_WS_MAX_UNREAD_BYTES"))]
    pub ws_max_unread_bytes: usize,

    /// Most WebSocket connections from one downstream address, as Envoy sees it (after its
    /// x-forwarded-for rules): one client cannot take every connection, whatever it sends.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_WS_MAX_CONNECTIONS_PER_ADDRESS, env = "RESPONSES_EXTPROC_WS_MAX_CONNECTIONS_PER_ADDRESS"))]
    pub ws_max_connections_per_address: usize,

    /// Most WebSocket connections one caller may hold, callers told apart by --ws-key-header
    /// (only when it is set).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_WS_MAX_CONNECTIONS_PER_KEY, env = "RESPONSES_EXTPROC_WS_MAX_CONNECTIONS_PER_KEY"))]
    pub ws_max_connections_per_key: usize,

    /// A request header Envoy sets after verifying the caller (a jwt_authn claim header, with
    /// a client's own removed first) whose value tells WebSocket callers apart for a quota of
    /// their own; callers without it share one. Never a header the client chooses (an API key
    /// Envoy does not check): one address could open a connection per value. Unset: callers
    /// are told apart by address only.
    #[cfg_attr(feature = "clap", arg(long, env = "RESPONSES_EXTPROC_WS_KEY_HEADER"))]
    pub ws_key_header: Option<String>,

    /// Headers of a client's request that the translator's own Chat calls carry on, beside
    /// its credentials and trace context (comma-separated): the headers Envoy's rate limits
    /// or routes key on. Each WebSocket turn's call and record carry the handshake's, an
    /// automatic compaction's summarising request the exchange's (ext_proc: only those Envoy
    /// forwards to the processor, `forward_rules`).
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_delimiter = ',',
            default_value = DEFAULT_FORWARD_HEADERS,
            env = "RESPONSES_EXTPROC_FORWARD_HEADERS"
        )
    )]
    pub forward_headers: Vec<String>,

    /// Each WebSocket turn's record: when a turn ends, the translator sends its summary to
    /// Envoy's records' route (`POST /v1/responses/turns/<token>`), whose access-log line and
    /// rate limit charge are the turn's. Off where the route table has no such route (a
    /// record would reach the catch-all route, the model server): the shipped Istio and Envoy
    /// Gateway manifests.
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            default_value_t = true,
            action = clap::ArgAction::Set,
            env = "RESPONSES_EXTPROC_WS_TURN_RECORDS"
        )
    )]
    pub ws_turn_records: bool,

    /// `Origin`s allowed to open WebSocket connections (comma-separated); unset: none, a
    /// handshake with an `Origin` (a browser page) is refused. A client without `Origin` (an
    /// API client) is always allowed.
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_delimiter = ',',
            env = "RESPONSES_EXTPROC_WS_ALLOWED_ORIGINS"
        )
    )]
    pub ws_allowed_origins: Vec<String>,

    /// Bytes one WebSocket connection may hold (its kept context and queued messages as
    /// JSON text, what has arrived of the message being read, events not yet written); beyond, it
    /// closes (1008).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_WS_MAX_SOCKET_BYTES, env = "RESPONSES_EXTPROC_WS_MAX_SOCKET_BYTES"))]
    pub ws_max_socket_bytes: usize,

    /// Bytes all WebSocket connections may hold together; a connection whose growth takes
    /// them beyond closes (1013, try again later). Keep it under the memory the process has.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = DEFAULT_WS_MAX_TOTAL_BYTES, env = "RESPONSES_EXTPROC_WS_MAX_TOTAL_BYTES"))]
    pub ws_max_total_bytes: usize,

    /// The module only: the cluster of the filter's own Chat calls (the WebSocket
    /// transport's), which loops back to Envoy's own listener so that each meets the route
    /// table like any Chat request. The processor sends them to `--ws-upstream`.
    #[cfg_attr(feature = "clap", arg(skip = DEFAULT_UPSTREAM_CLUSTER.to_owned()))]
    pub upstream_cluster: String,
}

/// Default of `ws_max_connections`.
pub const DEFAULT_WS_MAX_CONNECTIONS: usize = 1024;
/// Default of `ws_max_age`, in seconds: the specification's 60 minutes.
pub const DEFAULT_WS_MAX_AGE: u64 = 3600;
/// Default of `ws_idle_timeout`, in seconds.
pub const DEFAULT_WS_IDLE_TIMEOUT: u64 = 300;
/// How long the responses in flight may run once the host drains, by default, in seconds:
/// the processor's `--drain-seconds`, the module's bootstrap extension's `drain_seconds`.
pub const DEFAULT_DRAIN_SECONDS: u64 = 30;
/// Default of `ws_max_connections_per_address`.
pub const DEFAULT_WS_MAX_CONNECTIONS_PER_ADDRESS: usize = 64;
/// Default of `ws_max_connections_per_key`.
pub const DEFAULT_WS_MAX_CONNECTIONS_PER_KEY: usize = 64;
/// Default of `ws_max_socket_bytes`: 64 MiB, a maximum-size context and message with room.
pub const DEFAULT_WS_MAX_SOCKET_BYTES: usize = 64 << 20;
/// Default of `ws_max_total_bytes`: 128 MiB, half of what the shipped Kubernetes manifests
/// give the processor.
pub const DEFAULT_WS_MAX_TOTAL_BYTES: usize = 128 << 20;
/// Default of `upstream_cluster`.
pub const DEFAULT_UPSTREAM_CLUSTER: &str = "responses_loopback";

impl Default for ExchangeConfig {
    fn default() -> Self {
        ExchangeConfig {
            responses_path: DEFAULT_RESPONSES_PATH.into(),
            chat_path: DEFAULT_CHAT_PATH.into(),
            model_header: DEFAULT_MODEL_HEADER.into(),
            upstream_model_header: DEFAULT_UPSTREAM_MODEL_HEADER.into(),
            model_map: Vec::new(),
            strict: false,
            reasoning_events: ReasoningEventsPolicy::default(),
            max_sse_frame_bytes: limits::MAX_SSE_FRAME_BYTES,
            max_output_bytes: limits::MAX_OUTPUT_BYTES,
            developer_role: DeveloperRole::default(),
            hosted_tools: HostedTools::default(),
            max_request_bytes: limits::MAX_REQUEST_BYTES,
            max_input_items: limits::MAX_INPUT_ITEMS,
            max_part_bytes: limits::MAX_PART_BYTES,
            reasoning_keys_file: None,
            reasoning_keys: None,
            seal_tenant_header: None,
            seal_accept_unbound: false,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            compaction_bytes_per_token: limits::COMPACTION_BYTES_PER_TOKEN,
            compaction_timeout: exchange::DEFAULT_COMPACTION_TIMEOUT,
            metrics_models: Vec::new(),
            metrics_max_models: metrics::DEFAULT_MAX_MODELS,
            ws_max_connections: DEFAULT_WS_MAX_CONNECTIONS,
            ws_max_context_bytes: limits::MAX_REQUEST_BYTES,
            ws_max_age: DEFAULT_WS_MAX_AGE,
            ws_idle_timeout: DEFAULT_WS_IDLE_TIMEOUT,
            ws_max_unread_bytes: connection::DEFAULT_MAX_UNREAD_BYTES,
            ws_max_connections_per_address: DEFAULT_WS_MAX_CONNECTIONS_PER_ADDRESS,
            ws_max_connections_per_key: DEFAULT_WS_MAX_CONNECTIONS_PER_KEY,
            ws_key_header: None,
            forward_headers: vec![DEFAULT_FORWARD_HEADERS.to_owned()],
            ws_turn_records: true,
            ws_allowed_origins: Vec::new(),
            ws_max_socket_bytes: DEFAULT_WS_MAX_SOCKET_BYTES,
            ws_max_total_bytes: DEFAULT_WS_MAX_TOTAL_BYTES,
            upstream_cluster: DEFAULT_UPSTREAM_CLUSTER.to_owned(),
        }
    }
}

/// Where the sealing keys come from (logged at startup).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// `reasoning_keys_file`.
    File,
    /// `reasoning_keys` (the CLI: `RESPONSES_EXTPROC_REASONING_KEYS`).
    Text,
    /// Neither: a random key of this process only.
    Ephemeral,
}

impl ExchangeConfig {
    /// Rejects settings no exchange could work with, in both adapters alike: paths that are
    /// not absolute, a model header that is not a lowercase header name, caps of zero.
    pub fn validate(&self) -> Result<(), String> {
        for (name, path) in [
            ("responses_path", &self.responses_path),
            ("chat_path", &self.chat_path),
        ] {
            if !path.starts_with('/') || path.contains(['?', '#', ' ']) {
                return Err(format!("{name}: `{path}` is not an absolute path"));
            }
        }
        let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
        for (name, header) in [
            ("model_header", Some(&self.model_header)),
            ("upstream_model_header", Some(&self.upstream_model_header)),
            ("ws_key_header", self.ws_key_header.as_ref()),
        ] {
            let Some(header) = header else { continue };
            if header.is_empty() || !header.chars().all(token) {
                return Err(format!("{name}: `{header}` is not a header name"));
            }
        }
        if self
            .model_header
            .eq_ignore_ascii_case(&self.upstream_model_header)
        {
            return Err(format!(
                "upstream_model_header: `{}` is the model header already",
                self.upstream_model_header
            ));
        }
        for header in &self.forward_headers {
            if header.is_empty() || !header.chars().all(token) {
                return Err(format!("forward_headers: `{header}` is not a header name"));
            }
            // The call sets these itself.
            if [&self.model_header, &self.upstream_model_header]
                .iter()
                .any(|h| h.eq_ignore_ascii_case(header))
                || crate::call::SET_BY_THE_CALL.contains(&header.to_ascii_lowercase().as_str())
            {
                return Err(format!(
                    "forward_headers: `{header}` is a header the call sets"
                ));
            }
        }
        if let Some(header) = &self.seal_tenant_header {
            if header.is_empty() || !header.chars().all(token) {
                return Err(format!(
                    "seal_tenant_header: `{header}` is not a header name"
                ));
            }
            // The filter sets these itself: a tenant taken from them would be the model's.
            if [&self.model_header, &self.upstream_model_header]
                .iter()
                .any(|h| h.eq_ignore_ascii_case(header))
            {
                return Err(format!(
                    "seal_tenant_header: `{header}` is a header the filter sets"
                ));
            }
        } else if self.seal_accept_unbound {
            return Err(
                "seal_accept_unbound: a migration to seal_tenant_header, which is not set"
                    .to_owned(),
            );
        }
        ModelMap::check(&self.model_map)?;
        for (name, value) in [
            ("max_sse_frame_bytes", self.max_sse_frame_bytes),
            ("max_output_bytes", self.max_output_bytes),
            ("max_request_bytes", self.max_request_bytes),
            ("max_input_items", self.max_input_items),
            ("max_part_bytes", self.max_part_bytes),
            ("max_body_bytes", self.max_body_bytes),
            ("metrics_max_models", self.metrics_max_models),
            ("ws_max_connections", self.ws_max_connections),
            ("ws_max_context_bytes", self.ws_max_context_bytes),
            // 0 s would end every socket at once.
            ("ws_max_age", self.ws_max_age as usize),
            ("ws_idle_timeout", self.ws_idle_timeout as usize),
            ("ws_max_unread_bytes", self.ws_max_unread_bytes),
            (
                "ws_max_connections_per_address",
                self.ws_max_connections_per_address,
            ),
            (
                "ws_max_connections_per_key",
                self.ws_max_connections_per_key,
            ),
            ("ws_max_socket_bytes", self.ws_max_socket_bytes),
            ("ws_max_total_bytes", self.ws_max_total_bytes),
            (
                "compaction_bytes_per_token",
                self.compaction_bytes_per_token as usize,
            ),
            ("compaction_timeout", self.compaction_timeout as usize),
        ] {
            if value == 0 {
                return Err(format!("{name}: must be at least 1"));
            }
        }
        Ok(())
    }

    /// The translation core's view of the settings; `keyring` from [`ExchangeConfig::keyring`].
    pub fn translate_options(&self, keyring: Option<Arc<Keyring>>) -> Options {
        Options {
            strict: self.strict,
            // Resolved per exchange from the policy and the client's headers.
            reasoning_events: ReasoningEvents::default(),
            developer_role: self.developer_role,
            hosted_tools: self.hosted_tools,
            max_request_bytes: self.max_request_bytes,
            max_input_items: self.max_input_items,
            max_part_bytes: self.max_part_bytes,
            keyring,
            // Resolved per exchange from the tenant header (`seal_tenant_header`).
            tenant: Tenant::Unbound,
            accept_unbound_seals: self.seal_accept_unbound,
            model_map: Arc::new(ModelMap::new(&self.model_map)),
            max_sse_frame_bytes: self.max_sse_frame_bytes,
            max_output_bytes: self.max_output_bytes,
            compaction_bytes_per_token: self.compaction_bytes_per_token,
            automatic_compaction: true,
        }
    }

    /// The exchange rules' settings (shared by every adapter); `keyring` from
    /// [`ExchangeConfig::keyring`].
    pub fn exchange_settings(&self, keyring: Option<Arc<Keyring>>) -> exchange::Settings {
        exchange::Settings {
            responses_path: self.responses_path.clone(),
            chat_path: self.chat_path.clone(),
            model_header: self.model_header.to_ascii_lowercase(),
            upstream_model_header: self.upstream_model_header.to_ascii_lowercase(),
            seal_tenant_header: self
                .seal_tenant_header
                .as_ref()
                .map(|h| h.to_ascii_lowercase()),
            forward_headers: self
                .forward_headers
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
            turn_records: self.ws_turn_records,
            max_body_bytes: self.max_body_bytes,
            compaction_timeout: Duration::from_secs(self.compaction_timeout),
            reasoning_events: self.reasoning_events,
            options: self.translate_options(keyring),
        }
    }

    /// The limits of one WebSocket connection.
    pub fn socket_limits(&self) -> connection::Limits {
        connection::Limits {
            max_message_bytes: self.max_request_bytes,
            max_context_bytes: self.ws_max_context_bytes,
            idle_timeout: Duration::from_secs(self.ws_idle_timeout),
            max_age: Duration::from_secs(self.ws_max_age),
            max_unread_bytes: self.ws_max_unread_bytes,
            max_socket_bytes: self.ws_max_socket_bytes,
        }
    }

    /// Which WebSocket upgrades a host takes (all its connections together).
    pub fn admission_rules(&self) -> admission::Rules {
        admission::Rules {
            max_connections: self.ws_max_connections,
            max_per_address: self.ws_max_connections_per_address,
            max_per_key: self.ws_max_connections_per_key,
            key_header: self.ws_key_header.as_ref().map(|h| h.to_ascii_lowercase()),
            origins: self.ws_allowed_origins.clone(),
            max_total_bytes: self.ws_max_total_bytes,
        }
    }

    /// Which model names become metric labels.
    pub fn label_policy(&self) -> LabelPolicy {
        LabelPolicy {
            allowed_models: (!self.metrics_models.is_empty()).then(|| self.metrics_models.clone()),
            max_models: self.metrics_max_models,
        }
    }

    /// The keys that seal reasoning (`encrypted_content`): from `reasoning_keys_file`, else
    /// `reasoning_keys`, else a random key. The caller does the I/O: `read_file` reads the
    /// file, `random_key` makes a key. A random key works for one process only: replicas
    /// behind one Envoy need a shared key file.
    pub fn keyring(
        &self,
        read_file: impl FnOnce(&Path) -> std::io::Result<String>,
        random_key: impl FnOnce() -> [u8; 32],
    ) -> Result<(Arc<Keyring>, KeySource), String> {
        if let Some(path) = &self.reasoning_keys_file {
            let named =
                |e: &dyn std::fmt::Display| format!("reasoning_keys_file {}: {e}", path.display());
            let text = read_file(path).map_err(|e| named(&e))?;
            let ring = Keyring::parse(&text).map_err(|e| named(&e))?;
            return Ok((Arc::new(ring), KeySource::File));
        }
        if let Some(text) = self
            .reasoning_keys
            .as_deref()
            .filter(|t| !t.trim().is_empty())
        {
            let ring = Keyring::parse(text).map_err(|e| format!("reasoning_keys: {e}"))?;
            return Ok((Arc::new(ring), KeySource::Text));
        }
        let ring = Keyring::single("ephemeral", random_key()).map_err(|e| e.to_string())?;
        Ok((Arc::new(ring), KeySource::Ephemeral))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_operators_defaults_are_the_exchange_rules_defaults() {
        // The rules' own defaults (tests, the fuzz targets) and the operator's are one set.
        let from_config = ExchangeConfig::default().exchange_settings(None);
        assert_eq!(
            format!("{from_config:?}"),
            format!("{:?}", exchange::Settings::default())
        );
    }

    #[test]
    fn an_empty_object_is_the_defaults_and_unknown_keys_are_refused() {
        let empty: ExchangeConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(empty, ExchangeConfig::default());
        assert!(empty.validate().is_ok());
        let err = serde_json::from_str::<ExchangeConfig>(r#"{"max_body_byte": 1}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `max_body_byte`"), "{err}");
        // Enum values are the CLI's.
        let c: ExchangeConfig = serde_json::from_str(
            r#"{"reasoning_events":"openai","developer_role":"developer","hosted_tools":"reject"}"#,
        )
        .unwrap();
        let s = c.exchange_settings(None);
        assert_eq!(s.reasoning_events, ReasoningEventsPolicy::OpenAi);
        assert_eq!(s.options.developer_role, DeveloperRole::Developer);
        assert_eq!(s.options.hosted_tools, HostedTools::Reject);
        assert!(serde_json::from_str::<ExchangeConfig>(r#"{"hosted_tools":"keep"}"#).is_err());
    }

    #[test]
    fn metric_labels_are_bounded_by_an_allow_list_or_a_count() {
        assert_eq!(
            ExchangeConfig::default().label_policy(),
            LabelPolicy::default()
        );
        let c: ExchangeConfig =
            serde_json::from_str(r#"{"metrics_models":["a","b"],"metrics_max_models":3}"#).unwrap();
        let policy = c.label_policy();
        assert_eq!(policy.allowed_models, Some(vec!["a".into(), "b".into()]));
        assert_eq!(policy.max_models, 3);
    }

    #[test]
    fn validation_refuses_what_no_exchange_could_use() {
        for bad in [
            r#"{"responses_path":"v1/responses"}"#,
            r#"{"chat_path":"/v1/chat?x=1"}"#,
            r#"{"model_header":"x model"}"#,
            r#"{"model_header":""}"#,
            r#"{"upstream_model_header":"x:y"}"#,
            r#"{"upstream_model_header":"X-Responses-Model"}"#,
            r#"{"model_map":{"g*pt":"qwen"}}"#,
            r#"{"model_map":{"gpt-*":"qwen","gpt-*":"llama"}}"#,
            r#"{"max_body_bytes":0}"#,
            r#"{"max_request_bytes":0}"#,
            r#"{"seal_tenant_header":"x tenant"}"#,
            r#"{"seal_tenant_header":""}"#,
            r#"{"seal_tenant_header":"X-Responses-Model"}"#,
            r#"{"seal_accept_unbound":true}"#,
            r#"{"forward_headers":["x client"]}"#,
            r#"{"forward_headers":[""]}"#,
            r#"{"forward_headers":["X-Responses-Model"]}"#,
            r#"{"forward_headers":["Content-Length"]}"#,
        ] {
            let c: ExchangeConfig = serde_json::from_str(bad).unwrap();
            assert!(c.validate().is_err(), "{bad}");
        }
        let c: ExchangeConfig = serde_json::from_str(r#"{"model_header":"X-Model"}"#).unwrap();
        assert!(c.validate().is_ok());
        assert_eq!(c.exchange_settings(None).model_header, "x-model");
        let c: ExchangeConfig =
            serde_json::from_str(r#"{"forward_headers":["X-Tenant","x-user"]}"#).unwrap();
        assert!(c.validate().is_ok());
        assert_eq!(
            c.exchange_settings(None).forward_headers,
            ["x-tenant", "x-user"]
        );
        let c: ExchangeConfig = serde_json::from_str(
            r#"{"seal_tenant_header":"X-Tenant-Id","seal_accept_unbound":true}"#,
        )
        .unwrap();
        assert!(c.validate().is_ok());
        let s = c.exchange_settings(None);
        assert_eq!(s.seal_tenant_header.as_deref(), Some("x-tenant-id"));
        assert!(s.options.accept_unbound_seals);
        assert_eq!(s.options.tenant, Tenant::Unbound, "resolved per exchange");
    }

    #[test]
    fn websocket_callers_are_told_apart_by_address_unless_a_key_header_is_named() {
        let rules = ExchangeConfig::default().admission_rules();
        assert_eq!(rules.key_header, None, "no header the client chooses");
        assert_eq!(
            rules.max_per_address,
            DEFAULT_WS_MAX_CONNECTIONS_PER_ADDRESS
        );
        assert!(rules.origins.is_empty());
        let c: ExchangeConfig = serde_json::from_str(
            r#"{"ws_key_header":"X-Caller","ws_max_connections_per_address":3}"#,
        )
        .unwrap();
        assert!(c.validate().is_ok());
        let rules = c.admission_rules();
        assert_eq!(rules.key_header.as_deref(), Some("x-caller"));
        assert_eq!(rules.max_per_address, 3);
        for bad in [
            r#"{"ws_key_header":""}"#,
            r#"{"ws_key_header":"x caller"}"#,
            r#"{"ws_max_connections_per_address":0}"#,
        ] {
            let c: ExchangeConfig = serde_json::from_str(bad).unwrap();
            assert!(c.validate().is_err(), "{bad}");
        }
    }

    #[test]
    fn the_model_map_is_one_object_and_reaches_the_translation() {
        let c: ExchangeConfig = serde_json::from_str(
            r#"{"model_map":{"gpt-*":"qwen3","gpt-5.4":"qwen3-coder"},"upstream_model_header":"X-Up"}"#,
        )
        .unwrap();
        assert!(c.validate().is_ok());
        let s = c.exchange_settings(None);
        assert_eq!(s.upstream_model_header, "x-up");
        let map = &s.options.model_map;
        assert_eq!(map.resolve("gpt-5.4"), Some("qwen3-coder"));
        assert_eq!(map.resolve("gpt-4o"), Some("qwen3"));
        assert_eq!(map.resolve("llama"), None);
        // Written back as it was read (the module's JSON).
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(
            json["model_map"],
            serde_json::json!({"gpt-*": "qwen3", "gpt-5.4": "qwen3-coder"})
        );
        assert!(serde_json::from_str::<ExchangeConfig>(r#"{"model_map":["a=b"]}"#).is_err());
    }

    #[test]
    fn keys_come_from_the_file_then_the_text_then_chance() {
        let key = "k1:AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        let both = ExchangeConfig {
            reasoning_keys_file: Some("/keys".into()),
            reasoning_keys: Some("k2:AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=".into()),
            ..ExchangeConfig::default()
        };
        let (ring, source) = both
            .keyring(|p| Ok(format!("{key}\n# {}", p.display())), || [9; 32])
            .unwrap();
        assert_eq!((ring.active_id(), source), ("k1", KeySource::File));
        let text = ExchangeConfig {
            reasoning_keys_file: None,
            ..both.clone()
        };
        let (ring, source) = text.keyring(|_| unreachable!(), || [9; 32]).unwrap();
        assert_eq!((ring.active_id(), source), ("k2", KeySource::Text));
        let (ring, source) = ExchangeConfig::default()
            .keyring(|_| unreachable!(), || [9; 32])
            .unwrap();
        assert_eq!(
            (ring.active_id(), source),
            ("ephemeral", KeySource::Ephemeral)
        );
        let err = both
            .keyring(|_| Err(std::io::Error::other("no such file")), || [9; 32])
            .unwrap_err();
        assert_eq!(err, "reasoning_keys_file /keys: no such file");
    }
}
