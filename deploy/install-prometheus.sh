#!/usr/bin/env bash
# Fetches Prometheus (Debian's package, unpacked: nothing is installed system-wide) into
# .venv/prometheus, for the test that runs the Grafana dashboard's queries against both
# modes' exports (tests/e2e/metrics.rs), and prints the path of the `prometheus` binary:
#
#   PROMETHEUS_BIN="$(bash deploy/install-prometheus.sh)"
#
# Idempotent: does nothing when .venv/prometheus holds a binary that runs. Needs apt-get with
# Debian's package lists (it runs `apt-get update` once if they are missing, as root).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$ROOT/.venv/prometheus"
BIN="$DIR/usr/bin/prometheus"

if ! "$BIN" --version >/dev/null 2>&1; then
  rm -rf "$DIR"
  mkdir -p "$DIR/deb"
  echo "install-prometheus: apt-get download prometheus" >&2
  if ! (cd "$DIR/deb" && apt-get download prometheus >&2 2>/dev/null); then
    [ "$(id -u)" = 0 ] || { echo "install-prometheus: apt-get download failed (apt-get update, as root, may help)" >&2; exit 1; }
    apt-get update >&2
    (cd "$DIR/deb" && apt-get download prometheus >&2)
  fi
  dpkg-deb -x "$DIR"/deb/prometheus_*.deb "$DIR"
  rm -rf "$DIR/deb"
  "$BIN" --version >/dev/null 2>&1 || { echo "install-prometheus: $BIN does not run" >&2; exit 1; }
fi
echo "$BIN"
