#!/usr/bin/env bash
# Opt-in: the real Codex CLI (npm @openai/codex, ~400 MB installed) against a running stack.
#
#   bash deploy/demo.sh                  # terminal 1: Envoy :10000 + processor + demo upstream
#   bash tests/clients/codex/run.sh      # terminal 2
#
# Installs the pinned Codex into a prefix outside the repository if it is not there yet
# (reused by later runs), writes a config.toml into a temporary CODEX_HOME with a model
# provider pointing at the stack (wire_api = "responses"), runs
# `codex exec --skip-git-repo-check --json "say hi"` in an empty temporary directory, and
# checks that a turn completed with an agent message. Exits non-zero otherwise, printing
# Codex's output.
#
# Environment:
#   BASE_URL        the Responses endpoint's base (default http://127.0.0.1:10000/v1)
#   CODEX_MODEL     the model name sent (default demo)
#   CODEX_PROMPT    the prompt (default "say hi")
#   CODEX_VERSION   the @openai/codex version to install (default the pinned one below)
#   CODEX_PREFIX    where to install it (default ${TMPDIR:-/tmp}/responses-extproc-codex-<version>)
#   CODEX_BIN       use this codex binary instead of installing one
#   CODEX_TIMEOUT   seconds before giving up on the run (default 120)
#   KEEP_CODEX_HOME=1  keep the temporary CODEX_HOME (config, sessions, logs) for inspection
set -euo pipefail

CODEX_VERSION="${CODEX_VERSION:-0.169.0}"
BASE_URL="${BASE_URL:-http://127.0.0.1:10000/v1}"
CODEX_MODEL="${CODEX_MODEL:-demo}"
CODEX_PROMPT="${CODEX_PROMPT:-say hi}"
CODEX_TIMEOUT="${CODEX_TIMEOUT:-120}"
PREFIX="${CODEX_PREFIX:-${TMPDIR:-/tmp}/responses-extproc-codex-$CODEX_VERSION}"

say() { printf 'codex-e2e: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# ---- the stack must be up ----
probe="$(curl -s --max-time 10 -o /dev/null -w '%{http_code}' "$BASE_URL/responses" \
  -H 'content-type: application/json' -d "{\"model\":\"$CODEX_MODEL\",\"input\":\"ping\"}" || true)"
[ "$probe" = 200 ] ||
  die "POST $BASE_URL/responses answered '${probe:-nothing}', not 200: start the stack first (bash deploy/demo.sh)"

# ---- Codex ----
if [ -n "${CODEX_BIN:-}" ]; then
  CODEX="$CODEX_BIN"
else
  CODEX="$PREFIX/node_modules/.bin/codex"
  if ! "$CODEX" --version 2>/dev/null | grep -q " $CODEX_VERSION\$"; then
    command -v npm >/dev/null 2>&1 || die "npm is not on PATH"
    say "installing @openai/codex@$CODEX_VERSION into $PREFIX (a few hundred MB)"
    mkdir -p "$PREFIX"
    npm install --prefix "$PREFIX" --no-audit --no-fund --no-save --loglevel=error \
      "@openai/codex@$CODEX_VERSION" >&2
  fi
fi
say "using $("$CODEX" --version)"

# ---- a private CODEX_HOME and working directory ----
WORK="$(mktemp -d "${TMPDIR:-/tmp}/codex-e2e.XXXXXX")"
cleanup() {
  if [ -n "${KEEP_CODEX_HOME:-}" ]; then
    say "kept $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
export CODEX_HOME="$WORK/home"
mkdir -p "$CODEX_HOME" "$WORK/project"
cat >"$CODEX_HOME/config.toml" <<TOML
model = "$CODEX_MODEL"
model_provider = "extproc"
approval_policy = "never"
sandbox_mode = "read-only"

[model_providers.extproc]
name = "responses-extproc"
base_url = "$BASE_URL"
wire_api = "responses"
env_key = "RESPONSES_EXTPROC_API_KEY"
# Fail fast: the demo answers at once.
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 60000
TOML
export RESPONSES_EXTPROC_API_KEY=x

# ---- the run ----
say "codex exec --skip-git-repo-check --json \"$CODEX_PROMPT\" (provider $BASE_URL)"
set +e
(cd "$WORK/project" && timeout "$CODEX_TIMEOUT" "$CODEX" exec --skip-git-repo-check --json \
  --color never -o "$WORK/last-message.txt" "$CODEX_PROMPT" </dev/null >"$WORK/events.jsonl" 2>"$WORK/stderr.log")
status=$?
set -e

show() {
  say "---- stdout (JSONL events) ----"
  cat "$WORK/events.jsonl" >&2 || true
  say "---- stderr (tail) ----"
  tail -n 40 "$WORK/stderr.log" >&2 || true
}

[ "$status" -eq 0 ] || { show; die "codex exec exited with status $status"; }
# One JSON object per line: the turn must complete and carry an agent message.
if ! grep -q '"type":"turn.completed"' "$WORK/events.jsonl"; then
  show
  die "no turn.completed event"
fi
# Top-level error events fail the run; `error` *items* are warnings (e.g. "Model metadata for
# `demo` not found", which Codex prints for any model it has no metadata for).
if grep -q '^{"type":"turn.failed"\|^{"type":"error"' "$WORK/events.jsonl"; then
  show
  die "an error or turn.failed event"
fi
if ! grep -q '"type":"agent_message"' "$WORK/events.jsonl"; then
  show
  die "no agent_message item"
fi
items="$(grep -o '"type":"item.completed","item":{"id":"[^"]*","type":"[^"]*"' "$WORK/events.jsonl" |
  sed 's/.*"type":"//; s/"$//' | tr '\n' ' ')"
say "completed items: $items"
say "last message: $(cat "$WORK/last-message.txt" 2>/dev/null)"
say "OK: Codex completed a turn through Envoy + responses-extproc"
