//! Stamps the binary with the commit it was built from (for `--version` and the startup log),
//! and builds the descriptor set that gRPC server reflection publishes: `proto/`, compiled
//! with `protox` (a protobuf compiler in Rust, no `protoc` needed) against the Envoy API
//! definitions that the envoy-types crate bundles. The ext_proc message types themselves come
//! prebuilt from envoy-types; only the descriptors are made here.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    stamp_commit();
    reflection_descriptors();
}

fn stamp_commit() {
    let rev = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=RESPONSES_EXTPROC_GIT={rev}");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/refs");
}

fn reflection_descriptors() {
    println!("cargo:rerun-if-changed=proto");
    let protos = envoy_types_protos();
    // envoy-types' proto/ holds one folder per upstream repository (Envoy's data-plane-api,
    // xds, protoc-gen-validate, googleapis, ...): each is an include root.
    let mut includes: Vec<PathBuf> = vec![PathBuf::from("proto")];
    for entry in std::fs::read_dir(&protos).expect("envoy-types' proto folder") {
        let path = entry.expect("a proto folder entry").path();
        if path.is_dir() {
            includes.push(path);
        }
    }
    let set = protox::compile(["proto/responses_extproc.proto"], &includes)
        .unwrap_or_else(|e| panic!("compiling proto/ for reflection: {e:?}"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(
        out.join("reflection_descriptor.bin"),
        prost::Message::encode_to_vec(&set),
    )
    .expect("write the descriptor set");
}

/// The `proto` folder of the envoy-types package this build uses. First where cargo unpacks
/// registry crates (`$CARGO_HOME/registry/src/<index>/envoy-types-<locked version>`), which
/// needs nothing else; then from `cargo metadata --offline` (vendored or patched sources).
/// The registry comes first because `cargo metadata` resolves the dev-dependencies too, and
/// on a fresh machine a plain `cargo build` has not downloaded those: it fails offline.
fn envoy_types_protos() -> PathBuf {
    let manifest_dir =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    println!("cargo:rerun-if-changed=Cargo.lock");
    if let Some(found) =
        locked_version(&manifest_dir.join("Cargo.lock")).and_then(|v| in_registry(&v))
    {
        return found;
    }
    from_cargo_metadata(&manifest_dir)
}

/// envoy-types' version in Cargo.lock.
fn locked_version(lock: &Path) -> Option<String> {
    let text = std::fs::read_to_string(lock).ok()?;
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "name = \"envoy-types\"" {
            let version = lines.next()?.trim().strip_prefix("version = \"")?;
            return Some(version.trim_end_matches('"').to_owned());
        }
    }
    None
}

/// `<CARGO_HOME>/registry/src/*/envoy-types-<version>/proto`, if cargo unpacked it there.
fn in_registry(version: &str) -> Option<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    std::fs::read_dir(home.join("registry").join("src"))
        .ok()?
        .flatten()
        .map(|index| {
            index
                .path()
                .join(format!("envoy-types-{version}"))
                .join("proto")
        })
        .find(|proto| proto.is_dir())
}

/// From `cargo metadata`, filtered to the target platform: offline, cargo has only downloaded
/// the packages this platform builds (on a fresh machine, Windows-only crates are absent).
fn from_cargo_metadata(manifest_dir: &Path) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = std::env::var("TARGET").expect("TARGET");
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--offline"])
        .args(["--filter-platform", &target])
        .current_dir(manifest_dir)
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("cargo metadata's JSON");
    let manifest = metadata["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "envoy-types")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("envoy-types among the packages");
    Path::new(manifest).with_file_name("proto")
}
