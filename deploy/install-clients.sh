#!/usr/bin/env bash
# Installs the real client SDKs that tests/e2e/clients.rs drives through Envoy + the processor:
#
#   * Python (tests/clients/python/requirements.txt: openai, openai-agents; every transitive
#     dependency pinned by requirements.lock) into .venv at the repository root (the venv
#     deploy/install-envoy.sh makes; created here if missing);
#   * Node (tests/clients/node/package.json: the openai npm SDK) with `npm ci` from the
#     committed package-lock.json, into tests/clients/node/node_modules.
#
# Idempotent and fast when everything is installed: the Python check reads installed package
# metadata, the Node check compares package-lock.json with the one node_modules was made from.
# Needs python3 (with venv), Node >= 20 and npm, and the PyPI and npm registries.
# Codex (tests/clients/codex/run.sh) is opt-in and not installed here.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY_DIR="$ROOT/tests/clients/python"
NODE_DIR="$ROOT/tests/clients/node"

say() { printf 'install-clients: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# ---- Python ----
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV"
  "${PYTHON:-python3}" -m venv "$VENV" >&2 ||
    die "'${PYTHON:-python3} -m venv' failed (on Debian: apt-get install python3-venv)"
fi

# Exits 0 when every `name==version` of the given files is installed at that version.
python_pins_installed() {
  "$VENV/bin/python" - "$@" <<'PY'
import re, sys
from importlib import metadata

for path in sys.argv[1:]:
    for line in open(path, encoding="utf-8"):
        line = line.split("#", 1)[0].strip()
        m = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+)", line)
        if not m:
            continue
        try:
            if metadata.version(m.group(1)) != m.group(2):
                sys.exit(1)
        except metadata.PackageNotFoundError:
            sys.exit(1)
PY
}

if python_pins_installed "$PY_DIR/requirements.txt" "$PY_DIR/requirements.lock"; then
  say "Python clients up to date ($(tr '\n' ' ' < <(grep -E '^[a-z].*==' "$PY_DIR/requirements.txt")))"
else
  say "pip install -r tests/clients/python/requirements.txt"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "$PY_DIR/requirements.txt" -c "$PY_DIR/requirements.lock" >&2
  python_pins_installed "$PY_DIR/requirements.txt" ||
    die "after pip install, $VENV does not have the versions of $PY_DIR/requirements.txt"
fi

# ---- Node ----
command -v node >/dev/null 2>&1 || die "node is not on PATH (Node >= 20 is needed for tests/clients/node)"
command -v npm >/dev/null 2>&1 || die "npm is not on PATH"
NODE_MAJOR="$(node -p 'process.versions.node.split(".")[0]')"
[ "$NODE_MAJOR" -ge 20 ] || die "Node $(node --version) is too old: tests/clients/node needs Node >= 20"

# npm ci deletes node_modules first, so the stamp goes with it.
STAMP="$NODE_DIR/node_modules/.installed-from-package-lock.json"
if [ -f "$STAMP" ] && cmp -s "$STAMP" "$NODE_DIR/package-lock.json"; then
  say "Node clients up to date (openai $(node -p 'require(process.argv[1]).version' "$NODE_DIR/node_modules/openai/package.json"))"
else
  say "npm ci in tests/clients/node"
  # The openai SDK declares engines node >= 22 but runs on Node 20: warn, do not fail.
  (cd "$NODE_DIR" && npm ci --no-audit --no-fund --loglevel=error --engine-strict=false >&2)
  cp "$NODE_DIR/package-lock.json" "$STAMP"
fi
