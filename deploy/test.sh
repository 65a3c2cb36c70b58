#!/usr/bin/env bash
# The test command: installs Envoy into .venv (for the end-to-end tests), the client SDKs
# the client end-to-end tests drive (deploy/install-clients.sh), a real llama.cpp server
# (deploy/install-llama-server.sh, built once per machine) and Prometheus
# (deploy/install-prometheus.sh); builds every test once; runs every test; then the end-to-end
# suites a second time with the translation inside Envoy (the dynamic module,
# RESPONSES_E2E_MODE=module, tests/common/stack.rs), from the same build.
#
#   bash deploy/test.sh                          # everything, the end-to-end suites in both modes
#   bash deploy/test.sh --test e2e websocket::   # some tests (arguments for both `cargo test` runs)
#   SKIP_MODULE_E2E=1 bash deploy/test.sh        # the end-to-end suites in ext_proc mode only
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# Each step's wall and CPU time, printed at the end.
source "$ROOT/.ci/timed.sh"
trap timed_summary EXIT

timed_begin
ENVOY_BIN="$(bash "$ROOT/deploy/install-envoy.sh")"
export ENVOY_BIN
echo "test: using $("$ENVOY_BIN" --version 2>&1 | grep -o 'version: [^ ]*' || echo "$ENVOY_BIN")"

# tests/e2e/clients.rs drives the real openai / openai-agents SDKs (PyPI, npm).
if [ -f "$ROOT/deploy/install-clients.sh" ]; then
  bash "$ROOT/deploy/install-clients.sh" >&2
fi

# tests/e2e/metrics.rs runs the Grafana dashboard's queries in a real Prometheus.
PROMETHEUS_BIN="$(bash "$ROOT/deploy/install-prometheus.sh")"
export PROMETHEUS_BIN
timed_end "install Envoy, the clients, Prometheus"

# tests/e2e/upstream_errors.rs overflows a real llama.cpp server: built once per machine
# (~4 minutes on 2 cores the first time, then cached), meanwhile the Rust build below goes on.
mkdir -p target
LLAMA_ENV="$(mktemp)"
trap 'rm -f "$LLAMA_ENV"; timed_summary' EXIT
bash "$ROOT/deploy/install-llama-server.sh" >"$LLAMA_ENV" &
LLAMA_PID=$!

# One build for both runs (whatever the arguments: the module mode needs the module). `cargo
# test` of the workspace also builds the module's shared object (the root package's tests
# depend on the module crate) with the core's `fault-injection` feature the panic test needs
# (the root package's dev-dependency turns it on; a production build never has it): a debug
# build, like the processor the ext_proc mode runs. It is kept apart in target/e2e-module
# (where the harness looks) so that no other build replaces it; the first run needs it too
# (tests/docs/deploy_manifests.rs loads it into Envoy).
echo "test: cargo test --workspace --all-targets --no-run"
timed "build the tests" cargo test --workspace --all-targets --no-run
mkdir -p target/e2e-module
cp target/debug/deps/libresponses_module.so target/e2e-module/
bash "$ROOT/.ci/module-symbols" target/e2e-module/libresponses_module.so

timed_begin
if ! wait "$LLAMA_PID"; then
  echo "test: deploy/install-llama-server.sh failed" >&2
  exit 1
fi
timed_end "the rest of deploy/install-llama-server.sh (all of its CPU time)"
eval "$(cat "$LLAMA_ENV")"

if [ $# -eq 0 ]; then
  set -- --workspace --all-targets
fi
echo "test: cargo test $*"
timed "cargo test $*" cargo test "$@"

if [ -n "${SKIP_MODULE_E2E:-}" ]; then
  exit 0
fi
if [ "$*" = "--workspace --all-targets" ]; then
  # The same package selection as the first run: the same features, nothing rebuilt.
  set -- --workspace --test e2e --test load
fi
echo "test: module mode: RESPONSES_E2E_MODE=module cargo test $*"
timed "module mode: cargo test $*" env RESPONSES_E2E_MODE=module cargo test "$@"
