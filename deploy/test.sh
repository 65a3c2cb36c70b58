#!/usr/bin/env bash
# The test command: installs Envoy into .venv (for the end-to-end tests), the client SDKs
# the client end-to-end tests drive (deploy/install-clients.sh), a real llama.cpp server
# (deploy/install-llama-server.sh) and Prometheus (deploy/install-prometheus.sh), then runs
# every test; then the
# end-to-end suites a second time with the translation inside Envoy (the dynamic module,
# RESPONSES_E2E_MODE=module, tests/common/stack.rs).
# Extra arguments go to both `cargo test` runs (e.g. `bash deploy/test.sh --test harness_smoke`);
# SKIP_MODULE_E2E=1 skips the second run.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

ENVOY_BIN="$(bash "$ROOT/deploy/install-envoy.sh")"
export ENVOY_BIN
echo "test: using $("$ENVOY_BIN" --version 2>&1 | grep -o 'version: [^ ]*' || echo "$ENVOY_BIN")"

# tests/e2e_clients.rs drives the real openai / openai-agents SDKs (PyPI, npm).
if [ -f "$ROOT/deploy/install-clients.sh" ]; then
  bash "$ROOT/deploy/install-clients.sh" >&2
fi

# tests/e2e_upstream_errors.rs overflows a real llama.cpp server (built once into .venv/llama,
# ~4 minutes on 2 cores the first time).
eval "$(bash "$ROOT/deploy/install-llama-server.sh")"

# tests/e2e_metrics.rs runs the Grafana dashboard's queries in a real Prometheus.
PROMETHEUS_BIN="$(bash "$ROOT/deploy/install-prometheus.sh")"
export PROMETHEUS_BIN

# The module, built once in release with the test features (a production build has neither):
# `fault-injection`, which the panic test needs (the core panics on a marker), and
# `abi-probe`, the filter tests/e2e_module_abi.rs drives (made only for its filter_name), kept
# apart in target/e2e-module (where the harness looks) so that no other build replaces it. The
# first run needs it too: tests/deploy_manifests.rs validates the module's Istio patches with it
# loaded.
echo "test: cargo build --release -p responses-module --features fault-injection,abi-probe"
cargo build --release -p responses-module --features fault-injection,abi-probe
mkdir -p target/e2e-module
cp target/release/libresponses_module.so target/e2e-module/
bash "$ROOT/.ci/module-symbols" target/e2e-module/libresponses_module.so

cargo test --workspace --all-targets "$@"

if [ -n "${SKIP_MODULE_E2E:-}" ]; then
  exit 0
fi
if [ $# -eq 0 ]; then
  set -- --test harness_smoke --test load
  for suite in tests/e2e_*.rs; do
    set -- "$@" --test "$(basename "$suite" .rs)"
  done
fi
echo "test: module mode: RESPONSES_E2E_MODE=module cargo test $*"
RESPONSES_E2E_MODE=module cargo test "$@"
