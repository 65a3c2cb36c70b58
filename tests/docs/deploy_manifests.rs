//! The deploy files people apply, checked as far as this machine can (no cluster runs here):
//!
//! * every YAML document under deploy/kubernetes, deploy/istio and deploy/envoy-gateway parses
//!   and has the fields its kind requires, and each Envoy ConfigMap is envoy/envoy.yaml with
//!   its documented substitutions (tests/deploy/manifests.py);
//! * every Envoy config inside them (the ConfigMaps' bootstraps, each Istio EnvoyFilter patch
//!   wrapped in a bootstrap, what the EnvoyProxy merges into its bootstrap) passes the real
//!   Envoy's `--mode validate`, the module's patches with the module itself loaded (it checks
//!   its JSON settings as it would in a gateway);
//! * the module's settings in the Envoy Gateway policy and the Istio patch are settings of the
//!   processor (by their JSON names), and the policy names a module an EnvoyProxy allows;
//! * the Kubernetes manifests pass kubernetes-validate --strict (the JSON schemas of
//!   Kubernetes 1.37, from PyPI; installed by deploy/install-clients.sh);
//! * the routing headers are ours: every Envoy that translates (the shipped bootstraps, the
//!   ConfigMaps', the Istio gateway and sidecar, the Envoy Gateway Gateways) removes a client's
//!   `x-responses-model` and `x-responses-upstream-model` before it routes, and a copy of any of
//!   them without either removal fails the check.

use crate::common;

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
    // 3 ConfigMaps (2 ext_proc, 1 module), 5 EnvoyFilter patches (ext_proc: 2 of them the
    // model header's removal), 6 (the module: 1 the removal, 1 the WebSocket transport's
    // loopback cluster, 2 its routes, 1 the bootstrap's OTLP stat sink), 1 EnvoyProxy
    // bootstrap (the module's drain extension, loopback cluster, histogram buckets and OTLP
    // stat sink).
    assert_eq!(files.len(), 15, "{out}");
    for kind in [
        "\"EnvoyFilter\": 3",
        "\"EnvoyExtensionPolicy\": 2",
        "\"EnvoyProxy\": 1",
        "\"PodDisruptionBudget\": 4",
        "\"VirtualService\": 2",
        "\"ClientTrafficPolicy\": 2",
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
    assert_eq!(manifests.len(), 3, "{manifests:?}");
    let out = run(Command::new(venv("kubernetes-validate"))
        .args(["--strict", "--kubernetes-version", "1.37.0"])
        .args(&manifests));
    assert_eq!(out.matches(" passed for resource ").count(), 19, "{out}");
}

/// The files `manifests.py check` reads, copied into `root` (the shipped Envoy configs, the
/// manifests, the settings the module configs are checked against).
fn copy_checked_files(root: &std::path::Path) {
    fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            let target = to.join(path.file_name().unwrap());
            if path.is_dir() {
                copy_dir(&path, &target);
            } else {
                std::fs::copy(&path, &target).unwrap();
            }
        }
    }
    for dir in ["envoy", "deploy"] {
        copy_dir(&repo_root().join(dir), &root.join(dir));
    }
    std::fs::create_dir_all(root.join("core/src")).unwrap();
    std::fs::copy(
        repo_root().join("core/src/settings.rs"),
        root.join("core/src/settings.rs"),
    )
    .unwrap();
}

/// `text` with the `nth` occurrence (from 0) of `pattern` replaced by `with`.
fn replace_nth(text: &str, pattern: &str, with: &str, nth: usize) -> String {
    let (at, _) = text
        .match_indices(pattern)
        .nth(nth)
        .expect("the occurrence");
    format!("{}{with}{}", &text[..at], &text[at + pattern.len()..])
}

/// `manifests.py check` over the checked files with `file` replaced by `broken`: its error
/// output when it fails, `None` when it passes.
fn check_broken(file: &str, broken: &str) -> Option<String> {
    let root = TempDir::new("manifests-root");
    copy_checked_files(root.path());
    std::fs::write(root.path().join(file), broken).unwrap();
    let out_dir = TempDir::new("manifests-out");
    let out = Command::new(venv("python"))
        .arg(repo_root().join("tests/deploy/manifests.py"))
        .arg("check")
        .arg(out_dir.path())
        .arg(root.path())
        .output()
        .unwrap();
    (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned())
}

/// A manifest that lets a client's `x-responses-model` or `x-responses-upstream-model` reach
/// routing fails the check: each file that removes them, with one removal turned into one of
/// another header (a ConfigMap is checked for it before it is compared with
/// `envoy/envoy.yaml`).
#[test]
fn a_manifest_that_keeps_a_clients_model_header_fails_the_check() {
    // Each file, how it writes one header's removal (`{}`: the header), and how many times.
    let removals = [
        ("envoy/envoy.yaml", "- remove: {}\n", 1),
        ("envoy/envoy-module.yaml", "- remove: {}\n", 1),
        ("envoy/examples/extproc-tls.yaml", "- remove: {}\n", 1),
        ("deploy/kubernetes/sidecar.yaml", "- remove: {}\n", 1),
        ("deploy/kubernetes/module.yaml", "- remove: {}\n", 1),
        ("deploy/istio/envoyfilter.yaml", "- remove: {}\n", 2),
        ("deploy/istio/envoyfilter-module.yaml", "- remove: {}\n", 1),
        ("deploy/envoy-gateway/extension-policy.yaml", "\"{}\"", 1),
        ("deploy/envoy-gateway/module-policy.yaml", "\"{}\"", 1),
    ];
    for header in ["x-responses-model", "x-responses-upstream-model"] {
        for (file, form, count) in removals {
            let removal = form.replace("{}", header);
            let other = form.replace("{}", "x-other-header");
            let shipped = std::fs::read_to_string(repo_root().join(file)).unwrap();
            assert_eq!(
                shipped.matches(&removal).count(),
                count,
                "{file}: {removal}"
            );
            // Each occurrence alone (the Istio file has the gateway's and the sidecar's).
            for nth in 0..count {
                let text = check_broken(file, &replace_nth(&shipped, &removal, &other, nth));
                assert!(
                    text.as_deref().is_some_and(|text| text.contains(header)),
                    "{file} (occurrence {nth}) without the removal of {header} passed the \
                     check: {text:?}"
                );
            }
        }
    }
}

/// A manifest that lets some spelling of `/v1/responses` step around the Responses routes
/// fails the check: each file that normalises paths, with one of its settings turned off (a
/// ConfigMap is checked for it before it is compared with `envoy/envoy.yaml`).
#[test]
fn a_manifest_that_does_not_normalise_paths_fails_the_check() {
    let hcm = [
        ("merge_slashes: true\n", "merge_slashes: false\n"),
        ("normalize_path: true\n", "normalize_path: false\n"),
        (
            "path_with_escaped_slashes_action: UNESCAPE_AND_REDIRECT\n",
            "path_with_escaped_slashes_action: KEEP_UNCHANGED\n",
        ),
    ];
    let gateway = [
        (
            "escapedSlashesAction: UnescapeAndRedirect\n",
            "escapedSlashesAction: KeepUnchanged\n",
        ),
        (
            "disableMergeSlashes: false\n",
            "disableMergeSlashes: true\n",
        ),
    ];
    // Each file, the settings it writes (as they are, and turned off), and how many times.
    type Settings<'a> = &'a [(&'a str, &'a str)];
    let files: [(&str, Settings, usize); 9] = [
        ("envoy/envoy.yaml", &hcm, 1),
        ("envoy/envoy-module.yaml", &hcm, 1),
        ("envoy/examples/extproc-mtls.yaml", &hcm, 1),
        ("deploy/kubernetes/service.yaml", &hcm, 1),
        ("deploy/kubernetes/module.yaml", &hcm, 1),
        ("deploy/istio/envoyfilter.yaml", &hcm, 2),
        ("deploy/istio/envoyfilter-module.yaml", &hcm, 1),
        ("deploy/envoy-gateway/extension-policy.yaml", &gateway, 1),
        ("deploy/envoy-gateway/module-policy.yaml", &gateway, 1),
    ];
    for (file, settings, count) in files {
        let shipped = std::fs::read_to_string(repo_root().join(file)).unwrap();
        for (setting, off) in settings {
            assert_eq!(shipped.matches(setting).count(), count, "{file}: {setting}");
            for nth in 0..count {
                let text = check_broken(file, &replace_nth(&shipped, setting, off, nth));
                assert!(
                    text.as_deref()
                        .is_some_and(|text| text.contains("normalise")),
                    "{file} (occurrence {nth}) with {off:?} passed the check: {text:?}"
                );
            }
        }
    }
}

/// The listener of the processor's own calls (`responses_calls`) keeps the model headers, so a
/// client must not reach it: bound beyond loopback it fails the check, unless a NetworkPolicy
/// admits the processor's pods alone (service.yaml's, which the check finds; without it, or
/// with it open to every pod, the check fails).
#[test]
fn the_calls_listener_is_reached_by_the_processor_alone() {
    let check = |edit: &dyn Fn(&std::path::Path)| {
        let root = TempDir::new("manifests-root");
        copy_checked_files(root.path());
        edit(root.path());
        let out_dir = TempDir::new("manifests-out");
        let out = Command::new(venv("python"))
            .arg(repo_root().join("tests/deploy/manifests.py"))
            .arg("check")
            .arg(out_dir.path())
            .arg(root.path())
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let replace = |root: &std::path::Path, file: &str, from: &str, to: &str| {
        let path = root.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.matches(from).count(), 1, "{file}: {from}");
        std::fs::write(&path, text.replace(from, to)).unwrap();
    };
    let (ok, err) = check(&|_| {});
    assert!(ok, "{err}");
    // envoy/envoy.yaml with the listener on every address.
    let (ok, err) = check(&|root| {
        replace(
            root,
            "envoy/envoy.yaml",
            "        address: 127.0.0.1\n        port_value: 10001",
            "        address: 0.0.0.0\n        port_value: 10001",
        )
    });
    assert!(!ok && err.contains("responses_calls"), "{err}");
    // service.yaml's NetworkPolicy open to every pod.
    let (ok, err) = check(&|root| {
        replace(
            root,
            "deploy/kubernetes/service.yaml",
            "  - from:\n    - podSelector:\n        matchLabels: {app: responses-extproc}\n    ports:\n    - {port: 10001, protocol: TCP}\n",
            "  - ports:\n    - {port: 10001, protocol: TCP}\n",
        )
    });
    assert!(!ok && err.contains("responses_calls"), "{err}");
}
