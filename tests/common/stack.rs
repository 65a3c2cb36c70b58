//! The translating Envoy of an end-to-end test, in either mode, chosen by the environment:
//!
//! * `RESPONSES_E2E_MODE` unset or `extproc`: the `responses-extproc` processor beside Envoy
//!   (`envoy/envoy.yaml`), the processor's flags as given;
//! * `RESPONSES_E2E_MODE=module`: the translation inside Envoy as a dynamic module
//!   (`envoy/envoy-module.yaml`), the same settings given as the filter's JSON config (the
//!   flags' names in snake_case: one definition, `responses_core::settings`). The shared object
//!   is `$RESPONSES_MODULE_DIR/libresponses_module.so` (default `target/e2e-module`, where
//!   `deploy/test.sh` puts its fault-injection build).
//!
//! Each suite is written once against [`Stack`]; `deploy/test.sh` runs the end-to-end binaries
//! a second time with `RESPONSES_E2E_MODE=module`. A test that is about the processor itself
//! (its gRPC limits, its TLS, being killed) calls [`only_ext_proc`] and returns early in
//! module mode, saying why.

use std::path::PathBuf;

use super::envoy::{self, Envoy, Ports};
use super::processor::Processor;
use super::{free_port, repo_root};

/// Which adapter translates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    ExtProc,
    Module,
}

/// The mode of this test run (`RESPONSES_E2E_MODE`).
pub fn mode() -> Mode {
    match std::env::var("RESPONSES_E2E_MODE").as_deref() {
        Ok("module") => Mode::Module,
        Ok("extproc") | Ok("") | Err(_) => Mode::ExtProc,
        Ok(other) => panic!("RESPONSES_E2E_MODE={other}: expected `extproc` or `module`"),
    }
}

/// In module mode, prints why the calling test does not apply and returns false (the test
/// returns early); true in ext_proc mode.
pub fn only_ext_proc(why: &str) -> bool {
    if mode() == Mode::Module {
        eprintln!("skipped in module mode: {why}");
        return false;
    }
    true
}

/// In ext_proc mode, prints why the calling test does not apply and returns false (the test
/// returns early); true in module mode. For the module's counterparts of processor tests.
pub fn only_module(why: &str) -> bool {
    if mode() == Mode::ExtProc {
        eprintln!("skipped in ext_proc mode: {why}");
        return false;
    }
    true
}

/// The directory holding `libresponses_module.so` for module mode.
pub fn module_dir() -> PathBuf {
    let dir = std::env::var_os("RESPONSES_MODULE_DIR")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/e2e-module"));
    assert!(
        dir.join("libresponses_module.so").is_file(),
        "module mode needs {}/libresponses_module.so: run `bash deploy/test.sh`, or \
         `cargo build --release -p responses-module --features fault-injection` and set \
         RESPONSES_MODULE_DIR=target/release",
        dir.display()
    );
    dir
}

/// The flags of `responses_core::settings::ExchangeConfig` among `args`, as the module's JSON
/// config (validated by deserialising it as the module does). The other flags (the
/// processor's own: WebSocket, metrics, logs) are left for the processor.
pub fn module_config(args: &[&str]) -> (String, Vec<String>) {
    use responses_core::settings::ExchangeConfig;
    let known = serde_json::to_value(ExchangeConfig::default()).expect("settings as JSON");
    let known = known.as_object().expect("an object");
    let mut json = serde_json::Map::new();
    let mut rest = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let flag = args[i];
        let name = flag.trim_start_matches("--").replace('-', "_");
        let value = args.get(i + 1).filter(|v| !v.starts_with("--"));
        if !flag.starts_with("--") || !known.contains_key(&name) {
            rest.push(flag.to_owned());
            if let Some(v) = value {
                rest.push(v.to_string());
                i += 1;
            }
            i += 1;
            continue;
        }
        let value_taken = value.is_some();
        let value = match (value, &known[&name]) {
            (None, _) => serde_json::Value::Bool(true),
            (Some(v), serde_json::Value::Bool(_)) => {
                serde_json::Value::Bool(v.parse().expect("true or false"))
            }
            (Some(v), serde_json::Value::Number(_)) => {
                serde_json::Value::from(v.parse::<u64>().expect("a number"))
            }
            // A list flag takes commas; its key, a JSON array.
            (Some(v), serde_json::Value::Array(_)) => v.split(',').collect(),
            // A map flag takes comma-separated `key=value` pairs; its key, a JSON object.
            (Some(v), serde_json::Value::Object(_)) => v
                .split(',')
                .map(|pair| {
                    let (k, v) = pair.split_once('=').expect("a `key=value` pair");
                    (k.to_owned(), serde_json::Value::from(v))
                })
                .collect::<serde_json::Map<_, _>>()
                .into(),
            (Some(v), _) => serde_json::Value::from(*v),
        };
        i += if value_taken { 2 } else { 1 };
        json.insert(name, value);
    }
    let config: ExchangeConfig =
        serde_json::from_value(serde_json::Value::Object(json.clone())).expect("module settings");
    config.validate().expect("valid module settings");
    (serde_json::Value::Object(json).to_string(), rest)
}

/// `envoy/envoy-module.yaml` for a test: ports as [`envoy::substitute_ports`] does, and the
/// filter's settings.
pub fn module_bootstrap(settings_json: &str, ports: Ports) -> String {
    let config = std::fs::read_to_string(repo_root().join("envoy/envoy-module.yaml"))
        .expect("read envoy/envoy-module.yaml");
    let config = envoy::substitute_ports(&config, "envoy/envoy-module.yaml", ports);
    let empty = "                value: |\n                  {}\n";
    assert_eq!(
        config.matches(empty).count(),
        1,
        "envoy/envoy-module.yaml: one filter_config value `{{}}`"
    );
    config.replace(
        empty,
        &format!("                value: |\n                  {settings_json}\n"),
    )
}

/// A translating Envoy in front of an upstream. Drop order: Envoy, then the processor.
pub struct Stack {
    pub envoy: Envoy,
    /// ext_proc mode: the processor. Module mode: none.
    pub processor: Option<Processor>,
}

impl Stack {
    /// The processor flags `args` (ext_proc mode), or the same settings in the module's config.
    pub fn start(upstream_port: u16, args: &[&str]) -> Stack {
        Stack::start_with(upstream_port, args, |config| config)
    }

    /// [`Stack::start`] with the bootstrap edited by `edit` first (each mode's file; the
    /// edits must apply to both, as the shared parts do).
    pub fn start_with(
        upstream_port: u16,
        args: &[&str],
        edit: impl FnOnce(String) -> String,
    ) -> Stack {
        Stack::start_in(mode(), upstream_port, args, edit)
    }

    /// [`Stack::start_with`] in `mode`, whatever this run's (a test comparing the modes
    /// starts one of each).
    pub fn start_in(
        mode: Mode,
        upstream_port: u16,
        args: &[&str],
        edit: impl FnOnce(String) -> String,
    ) -> Stack {
        match mode {
            Mode::ExtProc => {
                let processor = Processor::start(args);
                let config = envoy::test_config(upstream_port, processor.port());
                let envoy = Envoy::start_with_config(&edit(config));
                Stack {
                    envoy,
                    processor: Some(processor),
                }
            }
            Mode::Module => {
                let (settings, rest) = module_config(args);
                assert!(
                    rest.is_empty(),
                    "processor flags without a module counterpart: {rest:?} (this test is \
                     about the processor: use only_ext_proc)"
                );
                let config = module_bootstrap(
                    &settings,
                    Ports {
                        upstream: upstream_port,
                        extproc: 0,
                        listener: 0,
                        ws: 1,
                        calls: 0,
                        otlp: 1,
                    },
                );
                Stack {
                    envoy: Envoy::start_with_config(&edit(config)),
                    processor: None,
                }
            }
        }
    }

    /// A stack that serves the WebSocket transport too: in ext_proc mode the processor with
    /// its WebSocket listener, the transport's Chat requests going back through this Envoy;
    /// in module mode the module alone (it answers the upgrade and sends each Chat request
    /// into Envoy's internal listener), no processor. `args` are the processor's flags, or
    /// the same settings in the module's config.
    pub fn with_websocket(upstream_port: u16, args: &[&str]) -> Stack {
        Stack::with_websocket_in(mode(), upstream_port, args, |config| config)
    }

    /// [`Stack::with_websocket`] with the bootstrap edited by `edit` first (as
    /// [`Stack::start_with`]).
    pub fn with_websocket_edited(
        upstream_port: u16,
        args: &[&str],
        edit: impl FnOnce(String) -> String,
    ) -> Stack {
        Stack::with_websocket_in(mode(), upstream_port, args, edit)
    }

    /// [`Stack::with_websocket`] in `mode`, the bootstrap edited by `edit` first.
    pub fn with_websocket_in(
        mode: Mode,
        upstream_port: u16,
        args: &[&str],
        edit: impl FnOnce(String) -> String,
    ) -> Stack {
        if mode == Mode::Module {
            return Stack::start_in(Mode::Module, upstream_port, args, edit);
        }
        let listener = free_port();
        let ws = free_port();
        let calls = free_port();
        let ws_listen = format!("127.0.0.1:{ws}");
        let ws_upstream = format!("http://127.0.0.1:{calls}");
        let mut all = vec!["--ws-listen", &ws_listen, "--ws-upstream", &ws_upstream];
        all.extend_from_slice(args);
        let processor = Processor::start(&all);
        let ports = Ports {
            upstream: upstream_port,
            extproc: processor.port(),
            listener,
            ws,
            calls,
            otlp: 1,
        };
        let config = std::fs::read_to_string(repo_root().join("envoy/envoy.yaml"))
            .expect("read envoy/envoy.yaml");
        Stack {
            envoy: Envoy::start_with_config(&edit(envoy::substitute_ports(
                &config,
                "envoy/envoy.yaml",
                ports,
            ))),
            processor: Some(processor),
        }
    }

    /// The process that serves the WebSocket transport (the one a SIGTERM drains): the
    /// processor (ext_proc), Envoy (module).
    pub fn socket_server_pid(&self) -> u32 {
        match &self.processor {
            Some(p) => p.pid(),
            None => self.envoy.pid(),
        }
    }

    /// The processor, which this test needs (WebSocket stacks, ext_proc mode).
    pub fn processor(&self) -> &Processor {
        self.processor.as_ref().expect("a processor in this stack")
    }

    /// The translator's log: the processor's (ext_proc), Envoy's (module: the filter logs
    /// under Envoy's `dynamic_modules` logger).
    pub fn translator_logs(&self) -> String {
        match (mode(), &self.processor) {
            (Mode::ExtProc, Some(p)) => p.logs(),
            _ => self.envoy.logs(),
        }
    }

    /// Whether the translator still runs: the processor (ext_proc), Envoy itself (module:
    /// a panic that escaped would have aborted it).
    pub fn translator_running(&mut self) -> bool {
        match (mode(), &mut self.processor) {
            (Mode::ExtProc, Some(p)) => p.is_running(),
            _ => self.envoy.is_running(),
        }
    }

    /// `ws://127.0.0.1:<envoy>/v1/responses`.
    pub fn ws_url(&self) -> String {
        format!("ws://127.0.0.1:{}/v1/responses", self.envoy.port())
    }
}
