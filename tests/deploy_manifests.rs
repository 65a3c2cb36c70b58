//! The deploy files people apply, checked as far as this machine can (no cluster runs here):
//!
//! * every YAML document under deploy/kubernetes, deploy/istio and deploy/envoy-gateway parses
//!   and has the fields its kind requires, and each Envoy ConfigMap is envoy/envoy.yaml with
//!   its documented substitutions (tests/deploy/manifests.py);
//! * every Envoy config inside them (the ConfigMaps' bootstraps, each Istio EnvoyFilter patch
//!   wrapped in a bootstrap) passes the real Envoy's `--mode validate`, the module's patches
//!   with the module itself loaded (it checks its JSON settings as it would in a gateway);
//! * the module's settings in the Envoy Gateway policy and the Istio patch are settings of the
//!   processor (by their JSON names), and the policy names a module an EnvoyProxy allows;
//! * the Kubernetes manifests pass kubernetes-validate --strict (the JSON schemas of
//!   Kubernetes 1.37, from PyPI; installed by deploy/install-clients.sh).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{envoy::envoy_binary, repo_root, TempDir};

fn venv(program: &str) -> PathBuf {
    let path = repo_root().join(".venv/bin").join(program);
    assert!(
        path.is_file(),
        "{} does not exist: run `bash deploy/install-clients.sh`",
        path.display()
    );
    path
}

fn run(command: &mut Command) -> String {
    let out = command.output().expect("run the checker");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{command:?} failed:\n{text}");
    text
}

#[test]
fn every_envoy_config_in_the_manifests_is_valid_and_in_step() {
    let dir = TempDir::new("manifests");
    let out = run(Command::new(venv("python"))
        .arg(repo_root().join("tests/deploy/manifests.py"))
        .arg("check")
        .arg(dir.path()));
    let files: Vec<&str> = out.lines().filter(|l| l.starts_with('/')).collect();
    // 2 ConfigMaps, 3 EnvoyFilter patches (ext_proc), 2 (the module).
    assert_eq!(files.len(), 7, "{out}");
    for kind in [
        "\"EnvoyFilter\": 3",
        "\"EnvoyExtensionPolicy\": 2",
        "\"EnvoyProxy\": 1",
        "\"PodDisruptionBudget\": 3",
    ] {
        assert!(out.contains(kind), "{kind}: {out}");
    }
    for file in files {
        let text = run(Command::new(envoy_binary())
            // The module's patches load libresponses_module.so (tests/common/stack.rs).
            .env(
                "ENVOY_DYNAMIC_MODULES_SEARCH_PATH",
                common::stack::module_dir(),
            )
            .args(["--mode", "validate", "--log-level", "error", "-c"])
            .arg(file));
        assert!(text.contains("OK"), "{file}: {text}");
    }
}

#[test]
fn kubernetes_manifests_match_the_kubernetes_schemas() {
    let manifests: Vec<PathBuf> = std::fs::read_dir(repo_root().join("deploy/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    assert_eq!(manifests.len(), 2, "{manifests:?}");
    let out = run(Command::new(venv("kubernetes-validate"))
        .args(["--strict", "--kubernetes-version", "1.37.0"])
        .args(&manifests));
    assert_eq!(out.matches(" passed for resource ").count(), 13, "{out}");
}
