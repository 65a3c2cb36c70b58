//! A real Prometheus server (`deploy/install-prometheus.sh` unpacks Debian's into
//! `.venv/prometheus`; `PROMETHEUS_BIN` names another) scraping the test's exports every
//! second, and its HTTP query API.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::{free_port, log_tail, repo_root, wait_until, TempDir};

/// An export to scrape: a job name, and where it answers on 127.0.0.1.
pub struct Target<'a> {
    pub job: &'a str,
    pub port: u16,
    pub path: &'a str,
}

/// One sample of a query's answer: its labels and value.
#[derive(Debug)]
pub struct Sample {
    pub labels: serde_json::Map<String, Value>,
    pub value: f64,
}

/// The running server; stopped on Drop.
pub struct Prometheus {
    child: Child,
    port: u16,
    log: PathBuf,
    _dir: TempDir,
}

fn binary() -> PathBuf {
    let bin = std::env::var_os("PROMETHEUS_BIN")
        .filter(|b| !b.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".venv/prometheus/usr/bin/prometheus"));
    assert!(
        bin.is_file(),
        "no Prometheus at {}: run `bash deploy/install-prometheus.sh` (deploy/test.sh does), \
         or set PROMETHEUS_BIN",
        bin.display()
    );
    bin
}

impl Prometheus {
    /// Starts scraping `targets` every second; returns once its API answers.
    pub fn start(targets: &[Target<'_>]) -> Prometheus {
        Prometheus::start_with_rules(targets, &[])
    }

    /// [`Prometheus::start`] with these rule files, evaluated every second.
    pub fn start_with_rules(targets: &[Target<'_>], rule_files: &[&std::path::Path]) -> Prometheus {
        let dir = TempDir::new("prometheus");
        let mut config =
            String::from("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n");
        if !rule_files.is_empty() {
            config.push_str("rule_files:\n");
            for f in rule_files {
                config.push_str(&format!("  - {}\n", f.display()));
            }
        }
        config.push_str("scrape_configs:\n");
        for t in targets {
            config.push_str(&format!(
                "  - job_name: {}\n    metrics_path: {}\n    static_configs:\n      - targets: [\"127.0.0.1:{}\"]\n",
                t.job, t.path, t.port
            ));
        }
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write the Prometheus config");
        let log = dir.path().join("prometheus.log");
        let port = free_port();
        let child = Command::new(binary())
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("create the Prometheus log"))
            .spawn()
            .expect("start Prometheus");
        let mut prometheus = Prometheus {
            child,
            port,
            log,
            _dir: dir,
        };
        let log = prometheus.log.clone();
        let child = &mut prometheus.child;
        wait_until("Prometheus to be ready", Duration::from_secs(30), || {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("Prometheus exited ({status}):\n{}", log_tail(&log, 4000));
            }
            let (status, _) = super::envoy::http_get(port, "/-/ready")?;
            (status == 200).then_some(())
        });
        prometheus
    }

    async fn api(&self, path: &str, params: &[(&str, &str)]) -> Value {
        let url = reqwest::Url::parse_with_params(
            &format!("http://127.0.0.1:{}{path}", self.port),
            params,
        )
        .expect("a URL");
        let answer: Value = super::client()
            .get(url)
            .send()
            .await
            .expect("Prometheus answers")
            .json()
            .await
            .expect("Prometheus answers JSON");
        assert_eq!(answer["status"], "success", "{path} {params:?}: {answer}");
        answer["data"].clone()
    }

    /// An instant query's samples, now.
    pub async fn query(&self, expr: &str) -> Vec<Sample> {
        let data = self.api("/api/v1/query", &[("query", expr)]).await;
        assert_eq!(data["resultType"], "vector", "{expr}: {data}");
        data["result"]
            .as_array()
            .expect("a result")
            .iter()
            .map(|s| Sample {
                labels: s["metric"].as_object().cloned().unwrap_or_default(),
                // Prometheus writes values as strings ("NaN", "+Inf" among them).
                value: s["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .expect("a value"),
            })
            .collect()
    }

    /// The values of `label` (`__name__`: the metric names), of the series `matching` selects
    /// (all when `None`).
    pub async fn label_values(&self, label: &str, matching: Option<&str>) -> Vec<String> {
        let path = format!("/api/v1/label/{label}/values");
        let params: Vec<(&str, &str)> = matching.map(|m| ("match[]", m)).into_iter().collect();
        let data = self.api(&path, &params).await;
        data.as_array()
            .expect("values")
            .iter()
            .map(|v| v.as_str().expect("a string").to_owned())
            .collect()
    }

    /// Every rule of its rule files, as `/api/v1/rules` describes it (name, query, health,
    /// lastError, lastEvaluation, ...).
    pub async fn rules(&self) -> Vec<Value> {
        let data = self.api("/api/v1/rules", &[]).await;
        data["groups"]
            .as_array()
            .expect("groups")
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// Its log so far.
    pub fn logs(&self) -> String {
        log_tail(&self.log, 8000)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
