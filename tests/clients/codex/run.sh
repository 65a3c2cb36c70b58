#!/usr/bin/env bash
# Opt-in: the real Codex CLI (npm @openai/codex, ~400 MB installed) through Envoy and
# responses-extproc. Two scenarios:
#
#   bash deploy/demo.sh                        # terminal 1: Envoy :10000 + processor + demo
#   bash tests/clients/codex/run.sh            # terminal 2: "say hi", one turn
#
#   bash tests/clients/codex/run.sh apply_patch
#     # starts its own stack (deploy/demo.sh with UPSTREAM_URL) in front of a scripted Chat
#     # upstream (patch_upstream.py) that answers Codex's custom `apply_patch` tool with a
#     # patch adding hello.txt; Codex (model name gpt-5.5, so that it declares
#     # apply_patch as a custom tool, in a workspace-write sandbox) must really create the file
#     # in a scratch git repository and finish the turn. Ports 10000, 9901, 50051 and 18090
#     # must be free.
#
#   bash tests/clients/codex/run.sh context_window
#     # starts its own stack (deploy/demo.sh, MODE as set) in front of a Chat upstream whose
#     # context is too small for Codex's first request: a real llama-server with 512 tokens
#     # of context when LLAMA_SERVER (its binary) and LLAMA_MODEL (a GGUF) are set, else a
#     # scripted upstream answering what llama-server answers then (the recorded
#     # tests/fixtures/upstream_errors/llamacpp-context-overflow.json). Codex must end the
#     # turn with its context-window error (it reads the code context_length_exceeded).
#     # Ports 10000, 9901, 50051 and 18091 must be free.
#
#   bash tests/clients/codex/run.sh openai_base_url
#     # Codex as a new user puts it behind a gateway: `openai_base_url` pointing at the running
#     # stack (deploy/demo.sh, either MODE, any UPSTREAM_URL) and an API key (`codex login
#     # --with-api-key`), no model provider of its own. Codex then believes it talks to OpenAI:
#     # its default model (unless CODEX_MODEL is set), its tools in an additional_tools item,
#     # internal_chat_message_metadata_passthrough on every item. The turn must call a tool and
#     # continue after its output (Codex's own record of the session says so: a call, its
#     # output with the same call_id, then an assistant message). Transport
#     # (CODEX_TRANSPORT): `websocket`, Codex's default (checked in the processor's log); or
#     # `http`: a relay in front of the stack (no_websocket_relay.py) answers the WebSocket
#     # upgrade 426, on which Codex falls back to POST /v1/responses for the session (its
#     # built-in provider cannot be told `supports_websockets = false`).
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
#   CODEX_MODEL     the model name sent (default demo; openai_base_url: Codex's own default)
#   CODEX_TRANSPORT openai_base_url: websocket (default) or http
#   CODEX_PROMPT    the prompt (default "say hi")
#   CODEX_VERSION   the @openai/codex version to install (default the pinned one below)
#   CODEX_PREFIX    where to install it (default ${TMPDIR:-/tmp}/responses-extproc-codex-<version>)
#   CODEX_BIN       use this codex binary instead of installing one
#   CODEX_TIMEOUT   seconds before giving up on the run (default 120)
#   KEEP_CODEX_HOME=1  keep the temporary CODEX_HOME (config, sessions, logs) for inspection
#   CODEX_WEBSOCKETS=1 declare the provider `supports_websockets`: Codex then talks to
#                      /v1/responses over the WebSocket transport (the stack must serve it:
#                      deploy/demo.sh does, in both modes); the run checks the processor's log
#                      for it, or with MODE=module (the demo's mode) the module's socket
#                      counts in Envoy's admin stats (ADMIN_URL, default http://127.0.0.1:9901)
set -euo pipefail

SCENARIO="${1:-hi}"
case "$SCENARIO" in hi | apply_patch | context_window | openai_base_url) ;; *) echo "usage: $0 [hi|apply_patch|context_window|openai_base_url]" >&2; exit 2 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
CODEX_VERSION="${CODEX_VERSION:-0.171.0}"
BASE_URL="${BASE_URL:-http://127.0.0.1:10000/v1}"
if [ "$SCENARIO" = openai_base_url ]; then
  CODEX_MODEL="${CODEX_MODEL:-}"
  CODEX_TRANSPORT="${CODEX_TRANSPORT:-websocket}"
  case "$CODEX_TRANSPORT" in websocket | http) ;; *) echo "CODEX_TRANSPORT must be websocket or http" >&2; exit 2 ;; esac
else
  CODEX_MODEL="${CODEX_MODEL:-demo}"
fi
CODEX_PROMPT="${CODEX_PROMPT:-say hi}"
CODEX_TIMEOUT="${CODEX_TIMEOUT:-120}"
PREFIX="${CODEX_PREFIX:-${TMPDIR:-/tmp}/responses-extproc-codex-$CODEX_VERSION}"

say() { printf 'codex-e2e: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# ---- the stack: started here for apply_patch, already up otherwise ----
STACK_PIDS=()
stop_stack() {
  for pid in "${STACK_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
if [ "$SCENARIO" = apply_patch ]; then
  # A slug Codex 0.169 has metadata for, with apply_patch_tool_type "freeform" (a custom
  # tool); for unknown slugs it sends no apply_patch at all.
  CODEX_MODEL="${CODEX_MODEL_OVERRIDE:-gpt-5.5}"
  CODEX_PROMPT="Create hello.txt with the apply_patch tool."
  RECORD="$(mktemp "${TMPDIR:-/tmp}/codex-patch-upstream.XXXXXX")"
  python3 "$ROOT/tests/clients/codex/patch_upstream.py" 18090 "$RECORD" &
  STACK_PIDS+=($!)
  UPSTREAM_URL=http://127.0.0.1:18090 bash "$ROOT/deploy/demo.sh" >"$RECORD.demo.log" 2>&1 &
  STACK_PIDS+=($!)
  trap stop_stack EXIT
  for _ in $(seq 600); do
    curl -s -o /dev/null --max-time 2 "$BASE_URL/responses" -H 'content-type: application/json' \
      -d '{"model":"m","input":"ping"}' && break
    sleep 1
  done
fi
if [ "$SCENARIO" = context_window ]; then
  RECORD="$(mktemp "${TMPDIR:-/tmp}/codex-context-upstream.XXXXXX")"
  if [ -n "${LLAMA_SERVER:-}" ] && [ -n "${LLAMA_MODEL:-}" ]; then
    "$LLAMA_SERVER" -m "$LLAMA_MODEL" -c 512 -t 1 --host 127.0.0.1 --port 18091 >"$RECORD.llama.log" 2>&1 &
    STACK_PIDS+=($!)
    UPSTREAM_KIND="llama-server (512-token context)"
  else
    python3 - 18091 "$ROOT/tests/fixtures/upstream_errors/llamacpp-context-overflow.json" <<'PY' &
import http.server, json, sys
fixture = json.load(open(sys.argv[2]))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"status":"ok"}')
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = fixture["body"].encode()
        self.send_response(fixture["status"])
        for k, v in fixture["headers"].items():
            self.send_header(k, v)
        self.send_header("content-length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
    STACK_PIDS+=($!)
    UPSTREAM_KIND="a scripted upstream answering llama-server's recorded overflow"
  fi
  trap stop_stack EXIT
  for _ in $(seq 120); do curl -s -o /dev/null --max-time 2 http://127.0.0.1:18091/health && break; sleep 1; done
  UPSTREAM_URL=http://127.0.0.1:18091 bash "$ROOT/deploy/demo.sh" >"$RECORD.demo.log" 2>&1 &
  STACK_PIDS+=($!)
  for _ in $(seq 600); do
    code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$BASE_URL/responses" \
      -H 'content-type: application/json' -d '{"model":"m","input":"ping"}' || true)"
    case "$code" in 200 | 400) break ;; esac
    sleep 1
  done
  say "upstream: $UPSTREAM_KIND"
else
  # One token: a real model on a CPU may take long over more.
  probe="$(curl -s --max-time 120 -o /dev/null -w '%{http_code}' "$BASE_URL/responses" \
    -H 'content-type: application/json' \
    -d "{\"model\":\"${CODEX_MODEL:-probe}\",\"input\":\"ping\",\"max_output_tokens\":1}" || true)"
  [ "$probe" = 200 ] ||
    die "POST $BASE_URL/responses answered '${probe:-nothing}', not 200: start the stack first (bash deploy/demo.sh)"
fi

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
  stop_stack
  if [ -n "${KEEP_CODEX_HOME:-}" ]; then
    say "kept $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
export CODEX_HOME="$WORK/home"
mkdir -p "$CODEX_HOME" "$WORK/project"
SANDBOX=read-only
if [ "$SCENARIO" = apply_patch ]; then
  SANDBOX=workspace-write
  git -C "$WORK/project" init -q
fi
LOG="$ROOT/target/demo/processor.log"
ws_lines() { grep -cE 'translated request transport="?websocket"?' "$LOG" 2>/dev/null || true; }
WS_BEFORE="$(ws_lines)"
# Module mode: the sockets the module has served (open or closed), from Envoy's admin stats.
ADMIN="${ADMIN_URL:-http://127.0.0.1:9901}"
module_sockets() {
  curl -s "$ADMIN/stats" | awk -F': ' '/^responses_module\.websocket_(closes_total\.code\.[0-9]+|connections): / {s += $2} END {print s + 0}'
}
[ "${MODE:-extproc}" != module ] || MODULE_SOCKETS_BEFORE="$(module_sockets)"
if [ "$SCENARIO" = openai_base_url ]; then
  URL="$BASE_URL"
  if [ "$CODEX_TRANSPORT" = http ]; then
    hostport="${BASE_URL#http://}"
    hostport="${hostport%%/*}"
    RELAY_PORT="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    REFUSED="$WORK/refused-upgrades"
    : >"$REFUSED"
    python3 "$ROOT/tests/clients/codex/no_websocket_relay.py" "$RELAY_PORT" "${hostport%:*}" "${hostport##*:}" "$REFUSED" &
    STACK_PIDS+=($!)
    URL="http://127.0.0.1:$RELAY_PORT/${BASE_URL#http://*/}"
    for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$RELAY_PORT") 2>/dev/null && break; sleep 0.1; done
  fi
  {
    [ -z "$CODEX_MODEL" ] || echo "model = \"$CODEX_MODEL\""
    echo "openai_base_url = \"$URL\""
    echo 'approval_policy = "never"'
    echo "sandbox_mode = \"$SANDBOX\""
  } >"$CODEX_HOME/config.toml"
  printf '%s' "${OPENAI_API_KEY:-sk-test-not-a-secret}" | "$CODEX" login --with-api-key >"$WORK/login.log" 2>&1 ||
    { cat "$WORK/login.log" >&2; die "codex login --with-api-key failed"; }
  say "openai_base_url = $URL (transport: $CODEX_TRANSPORT), model: ${CODEX_MODEL:-its default}"
else
cat >"$CODEX_HOME/config.toml" <<TOML
model = "$CODEX_MODEL"
model_provider = "extproc"
approval_policy = "never"
sandbox_mode = "$SANDBOX"

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
if [ -n "${CODEX_WEBSOCKETS:-}" ]; then
  echo 'supports_websockets = true' >>"$CODEX_HOME/config.toml"
fi
export RESPONSES_EXTPROC_API_KEY=x
fi

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

if [ "$SCENARIO" = context_window ]; then
  # The turn fails with Codex's own context-window error (not a generic one): it read the
  # code context_length_exceeded of the gateway's 400.
  [ "$status" -ne 0 ] || { show; die "codex exec succeeded: the context did not overflow"; }
  failure="$(grep -h '"type":"turn.failed"\|^{"type":"error"' "$WORK/events.jsonl" || true)"
  printf '%s\n' "$failure" | grep -qi 'context window' ||
    { show; die "no context-window error from Codex"; }
  say "Codex reported: $(printf '%s' "$failure" | head -n 1)"
  say "OK: Codex reported its context-window error through Envoy + responses-extproc"
  exit 0
fi
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
# With CODEX_WEBSOCKETS=1: the responses went over the socket (deploy/demo.sh's processor log).
check_websocket() {
  [ -n "${CODEX_WEBSOCKETS:-}" ] || return 0
  local log="$ROOT/target/demo/processor.log" n
  if [ "${MODE:-extproc}" = module ]; then
    # No processor: the module's own socket counts, in Envoy's stats, went up.
    n=$(($(module_sockets) - MODULE_SOCKETS_BEFORE))
    [ "$n" -gt 0 ] || { show; die "the module served no WebSocket connection ($ADMIN/stats)"; }
    say "WebSocket transport (module mode): $n connection(s) served by the module"
    return 0
  fi
  # (A log value is quoted only when it must be: transport=websocket.)
  n="$(grep -cE 'translated request transport="?websocket"?' "$log" 2>/dev/null || true)"
  [ "${n:-0}" -gt 0 ] || { show; die "no response went over the WebSocket transport ($log)"; }
  say "WebSocket transport: $n responses, $(grep -c 'generate: false' "$log" || true) preloads"
}
say "last message: $(cat "$WORK/last-message.txt" 2>/dev/null)"
if [ "$SCENARIO" = openai_base_url ]; then
  # Codex's own record of the session: a tool call, its output, then the answer after it.
  python3 - "$CODEX_HOME" <<'PY' || { show; die "the turn did not call a tool and continue after its output"; }
import glob, json, sys
items = []
for path in glob.glob(f"{sys.argv[1]}/sessions/**/*.jsonl", recursive=True):
    items += [r["payload"] for r in map(json.loads, open(path)) if r.get("type") == "response_item"]
calls = [(i, x) for i, x in enumerate(items) if x.get("type", "").endswith("call") and x.get("call_id")]
assert calls, f"no tool call among {[x.get('type') for x in items]}"
for i, call in calls:
    outputs = [j for j, x in enumerate(items) if x.get("type", "").endswith("call_output") and x.get("call_id") == call["call_id"]]
    answers = [j for j, x in enumerate(items) if x.get("type") == "message" and x.get("role") == "assistant" and outputs and j > outputs[0]]
    if outputs and answers:
        name = ".".join(filter(None, [call.get("namespace"), call.get("name")]))
        print(f"codex-e2e: Codex called {call['type']} {name or '?'} ({call['call_id']}), sent its output back and went on", file=sys.stderr)
        break
else:
    raise SystemExit(f"no call followed by its output and an answer: {[x.get('type') for x in items]}")
PY
  if [ "$CODEX_TRANSPORT" = http ]; then
    [ -s "$REFUSED" ] || { show; die "Codex never tried the WebSocket: nothing proves the fallback"; }
    [ "$(ws_lines)" = "$WS_BEFORE" ] || { show; die "a response went over the WebSocket transport"; }
    say "HTTP transport: $(wc -l <"$REFUSED") WebSocket upgrade(s) refused with 426, every response over POST"
  elif [ "${MODE:-extproc}" = module ]; then
    # No processor: the module's own socket counts, in Envoy's stats, went up.
    n=$(($(module_sockets) - MODULE_SOCKETS_BEFORE))
    [ "$n" -gt 0 ] || { show; die "the module served no WebSocket connection ($ADMIN/stats)"; }
    say "WebSocket transport (module mode): $n connection(s) served by the module"
  else
    n=$(( $(ws_lines) - ${WS_BEFORE:-0} ))
    [ "$n" -ge 2 ] || { show; die "$n responses went over the WebSocket transport ($LOG), not the turn and its continuation"; }
    say "WebSocket transport: $n responses on the socket"
  fi
  say "OK: Codex with openai_base_url completed a tool loop through Envoy + responses-extproc"
  exit 0
fi
if [ "$SCENARIO" = apply_patch ]; then
  expected="Hello from the apply_patch profile."
  [ "$(cat "$WORK/project/hello.txt" 2>/dev/null)" = "$expected" ] ||
    { show; die "hello.txt was not created with the patch's content"; }
  grep -q '"type":"file_change"' "$WORK/events.jsonl" || { show; die "no file_change item"; }
  # What the upstream saw: apply_patch as a one-string-parameter function, then the result.
  python3 - "$RECORD" <<'PY' || { show; die "the upstream requests are not as expected"; }
import json, sys
reqs = [json.loads(l) for l in open(sys.argv[1])]
turn = [r for r in reqs if any(t.get("function", {}).get("name") == "apply_patch" for t in r.get("tools", []))]
assert len(turn) >= 2, f"{len(turn)} requests offered apply_patch"
params = next(t["function"]["parameters"] for t in turn[0]["tools"] if t["function"]["name"] == "apply_patch")
assert params["required"] == ["input"], params
# The custom tool's grammar, written into the description by the processor (a function-typed
# apply_patch would have none).
desc = next(t["function"]["description"] for t in turn[0]["tools"] if t["function"]["name"] == "apply_patch")
assert "The input must match this lark grammar" in desc, desc[:300]
assert any(m.get("role") == "tool" and m.get("tool_call_id") == "call_patch_1" for m in turn[-1]["messages"]), turn[-1]["messages"]
print(f"codex-e2e: upstream: {len(turn)} requests offered apply_patch; the last carried the tool result", file=sys.stderr)
PY
  check_websocket
  say "OK: Codex applied the patch (hello.txt created) through Envoy + responses-extproc"
  exit 0
fi
check_websocket
say "OK: Codex completed a turn through Envoy + responses-extproc"
