#!/usr/bin/env bash
# The test command: installs Envoy into .venv (for the end-to-end tests) and the client SDKs
# the client end-to-end tests drive (deploy/install-clients.sh), then runs every test.
# Extra arguments go to `cargo test` (e.g. `bash deploy/test.sh --test harness_smoke`).
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

cargo test --workspace --all-targets "$@"
