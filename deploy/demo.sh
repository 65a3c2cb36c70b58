#!/usr/bin/env bash
# See responses-extproc work in one command: Envoy on :10000 in front of a Chat Completions
# server, with responses-extproc translating POST /v1/responses.
#
#   bash deploy/demo.sh                                   # with the built-in demo upstream
#   UPSTREAM_URL=http://127.0.0.1:8000 bash deploy/demo.sh   # with your vLLM / llama-server
#   DEMO_ONESHOT=1 bash deploy/demo.sh                    # print the two answers, then exit
#   MODE=module bash deploy/demo.sh                       # the translation inside Envoy
#   OTLP_ENDPOINT=127.0.0.1:4317 bash deploy/demo.sh      # traces and metrics to your collector
#
# It installs Envoy into .venv (deploy/install-envoy.sh), builds the release binary, starts
# the demo upstream (unless UPSTREAM_URL is set), the processor and Envoy, sends one plain and
# one streaming request, and then keeps everything running until Ctrl-C.
# MODE=module: Envoy runs envoy/envoy-module.yaml and translates in-process with the dynamic
# module (target/release/libresponses_module.so, found through ENVOY_DYNAMIC_MODULES_SEARCH_PATH),
# the WebSocket transport included: no processor runs, nothing but Envoy (and the upstream).
# Logs: target/demo/{upstream,processor,envoy}.log; Envoy's access log: target/demo/access.log.
# Ports: 10000 (Envoy), 9901 (Envoy admin), 18080 (demo upstream), and in ext_proc mode
# 10001 (Envoy's listener for the processor's own calls), 50051 (processor), 50052 (its
# WebSocket listener), 9464 (its metrics); they must be free.
# UPSTREAM_URL must be http://host[:port] (https is not supported here: the upstream cluster
# in envoy/envoy.yaml has no TLS transport socket).
# OTLP_ENDPOINT=host:port (an OTLP/gRPC receiver: an OpenTelemetry Collector, Jaeger, ...)
# turns traces on: Envoy's tracer (envoy/examples/tracing.yaml spliced in) and, in ext_proc
# mode, the processor (--otlp-endpoint) both export there, every request traced. The metrics
# go there too: the processor's push (--otlp-endpoint), or in module mode Envoy's stat sink
# (envoy/envoy-module.yaml's otel_metrics cluster, pointed there).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
LOG_DIR="$ROOT/target/demo"
# DEMO_BIN_DIR: binaries built already (responses-extproc, demo-upstream), used as they are
# instead of a release build; DEMO_MODULE_DIR: the module's directory (default the same).
# .ci/run runs the demos on the test build's binaries so.
BIN_DIR="${DEMO_BIN_DIR:-$ROOT/target/release}"
MODULE_DIR="${DEMO_MODULE_DIR:-$BIN_DIR}"
BIN="$BIN_DIR/responses-extproc"
BASE="http://127.0.0.1:10000"
MODE="${MODE:-extproc}"

say() { printf '%s\n' "$*" >&2; }
die() { say "demo: $*"; exit 1; }

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

PIDS=()
NAMES=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME COMMAND...: runs COMMAND in the background, logging to target/demo/NAME.log.
start() {
  local name="$1"
  shift
  "$@" >"$LOG_DIR/$name.log" 2>&1 &
  PIDS+=("$!")
  NAMES+=("$name")
}

# Fails (with the log) if a child has exited.
check_children() {
  local i
  for i in "${!PIDS[@]}"; do
    if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
      say "demo: ${NAMES[$i]} exited; the end of target/demo/${NAMES[$i]}.log:"
      tail -n 30 "$LOG_DIR/${NAMES[$i]}.log" >&2 || true
      exit 1
    fi
  done
}

# wait_for WHAT COMMAND...: retries COMMAND for up to 30 s.
wait_for() {
  local what="$1" i
  shift
  for i in $(seq 1 150); do
    if "$@"; then
      return 0
    fi
    check_children
    sleep 0.2
  done
  die "timed out waiting for $what"
}

# UPSTREAM_URL=http://host[:port] replaces the demo upstream.
UPSTREAM_HOST=""
UPSTREAM_PORT=""
if [ -n "${UPSTREAM_URL:-}" ]; then
  case "$UPSTREAM_URL" in
    http://*) ;;
    https://*) die "UPSTREAM_URL: https is not supported (envoy/envoy.yaml's upstream cluster has no TLS); use http://host:port" ;;
    *) die "UPSTREAM_URL must look like http://host:port, not '$UPSTREAM_URL'" ;;
  esac
  hostport="${UPSTREAM_URL#http://}"
  hostport="${hostport%%/*}"
  UPSTREAM_HOST="${hostport%:*}"
  UPSTREAM_PORT="${hostport##*:}"
  [ "$UPSTREAM_HOST" != "$hostport" ] || UPSTREAM_PORT=80
  if ! [[ "$UPSTREAM_PORT" =~ ^[0-9]+$ && "$UPSTREAM_HOST" =~ ^[A-Za-z0-9.-]+$ ]]; then
    die "cannot read host and port from UPSTREAM_URL='$UPSTREAM_URL'"
  fi
fi

case "$MODE" in
  extproc | module) ;;
  *) die "MODE must be extproc (the default) or module, not '$MODE'" ;;
esac

# OTLP_ENDPOINT=[http://]host:port: traces to that collector.
OTLP_HOST=""
OTLP_PORT=""
if [ -n "${OTLP_ENDPOINT:-}" ]; then
  hostport="${OTLP_ENDPOINT#http://}"
  hostport="${hostport%%/*}"
  OTLP_HOST="${hostport%:*}"
  OTLP_PORT="${hostport##*:}"
  if ! [[ "$OTLP_HOST" != "$hostport" && "$OTLP_PORT" =~ ^[0-9]+$ && "$OTLP_HOST" =~ ^[A-Za-z0-9.-]+$ ]]; then
    die "OTLP_ENDPOINT must look like host:port (an OTLP/gRPC receiver), not '$OTLP_ENDPOINT'"
  fi
fi

PORTS=(10000 9901)
[ "$MODE" = module ] || PORTS+=(10001 50051 50052 9464)
[ -n "$UPSTREAM_HOST" ] || PORTS+=(18080)
for port in "${PORTS[@]}"; do
  if listening "$port"; then
    die "port $port is already in use (another demo running?)"
  fi
done

mkdir -p "$LOG_DIR"
# This run's logs only (a processor.log says a processor ran).
rm -f "$LOG_DIR"/*.log
ENVOY_BIN="$(bash "$ROOT/deploy/install-envoy.sh")"

CONFIG="$LOG_DIR/envoy.yaml"
PROCESSOR_ARGS=(--listen 127.0.0.1:50051 --metrics-listen 127.0.0.1:9464 --ws-listen 127.0.0.1:50052)
if [ "$MODE" = module ]; then
  # The module alone (the demo upstream is a binary of the root crate).
  if [ -z "${DEMO_BIN_DIR:-}" ]; then
    say "demo: cargo build --release -p responses-module"
    cargo build --release -p responses-module >&2
    [ -n "$UPSTREAM_HOST" ] || cargo build --release --bin demo-upstream >&2
  fi
  [ -f "$MODULE_DIR/libresponses_module.so" ] || die "no libresponses_module.so in $MODULE_DIR"
  cp "$ROOT/envoy/envoy-module.yaml" "$CONFIG"
  export ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$MODULE_DIR"
else
  if [ -z "${DEMO_BIN_DIR:-}" ]; then
    say "demo: cargo build --release"
    cargo build --release >&2
  fi
  [ -x "$BIN" ] || die "no responses-extproc in $BIN_DIR"
  cp "$ROOT/envoy/envoy.yaml" "$CONFIG"
fi
# An access log of every request, with what the translator reports for translated ones (its
# dynamic metadata, docs/operations.md): one JSON line each; a WebSocket turn's is its
# record's, with its socket's id (the listener of the translator's own requests too).
ACCESS_LOG="$LOG_DIR/access.log"
: >"$ACCESS_LOG"
python3 - "$CONFIG" "$ACCESS_LOG" <<'PY'
import sys
path, log = sys.argv[1], sys.argv[2]
config = open(path).read()
anchor = "          stat_prefix: responses\n"
assert config.count(anchor) == 1, "envoy.yaml: stat_prefix line not found once"
md = lambda k: f'"%DYNAMIC_METADATA(responses_extproc:{k})%"'
fields = {"time": '"%START_TIME%"', "method": '"%REQ(:METHOD)%"',
          "upstream_path": '"%REQ(:PATH)%"', "status": '"%RESPONSE_CODE%"',
          "duration_ms": '"%DURATION%"'}
for k in ["response_id", "model", "outcome", "error_code", "input_tokens", "output_tokens",
          "total_tokens", "cached_tokens", "reasoning_tokens", "socket_id"]:
    fields[k] = md(k)
def block(anchor):
    return anchor + f"""          access_log:
          - name: envoy.access_loggers.file
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog
              path: {log}
              log_format:
                json_format:
""" + "".join(f"                  {k}: {v}\n" for k, v in fields.items())
config = config.replace(anchor, block(anchor))
# The listener the translator's own requests (a turn's Chat request and record, a
# compaction's summarising call) enter Envoy through: responses_calls (ext_proc mode), the
# internal listener responses_loopback (module mode).
for own in ["          stat_prefix: responses_calls\n", "          stat_prefix: responses_loopback\n"]:
    if config.count(own) == 1:
        config = config.replace(own, block(own))
open(path, "w").write(config)
PY
if [ -n "$OTLP_HOST" ]; then
  # envoy/examples/tracing.yaml's two pieces, pointed at the collector.
  python3 - "$CONFIG" "$ROOT/envoy/examples/tracing.yaml" "$OTLP_HOST" "$OTLP_PORT" <<'PY'
import sys
path, example, host, port = sys.argv[1:5]
example = open(example).read()
def piece(key, indent):
    lines = example.split(key + ": |\n", 1)[1].split("\n")
    out = []
    for line in lines:
        if line and not line.startswith("  "):
            break
        out.append(" " * indent + line[2:] if line else "")
    return "\n".join(out).rstrip() + "\n"
config = open(path).read()
anchor = "          stat_prefix: responses\n"
assert config.count(anchor) == 1, "envoy.yaml: stat_prefix line not found once"
config = config.replace(anchor, anchor + piece("hcm_tracing", 10))
# The listener the translator's own requests enter traces them too (responses_calls in
# ext_proc mode, the internal listener responses_loopback in module mode).
for own in ["          stat_prefix: responses_calls\n", "          stat_prefix: responses_loopback\n"]:
    if config.count(own) == 1:
        config = config.replace(own, own + piece("hcm_tracing", 10))
cluster = piece("cluster", 2)
assert cluster.count("address: 127.0.0.1") == 1 and cluster.count("port_value: 4317") == 1
cluster = cluster.replace("address: 127.0.0.1", f"address: {host}").replace(
    "port_value: 4317", f"port_value: {port}")
before = "  # The Chat Completions server"
assert config.count(before) == 1, "envoy.yaml: the upstream cluster's comment not found once"
# Module mode: the stat sink's collector (cluster otel_metrics) is the same (rewritten before
# the tracer's cluster, which may hold the same lines, goes in).
sink = "                address: 127.0.0.1\n                port_value: 4317\n"
if "cluster_name: otel_metrics" in config:
    assert config.count(sink) == 1, "envoy-module.yaml: the otel_metrics address not found once"
    config = config.replace(sink, f"                address: {host}\n                port_value: {port}\n")
open(path, "w").write(config.replace(before, cluster + before))
PY
  if [ "$MODE" = module ]; then
    say "demo: traces to $OTLP_HOST:$OTLP_PORT (Envoy, the module's spans among them)"
  else
    say "demo: traces to $OTLP_HOST:$OTLP_PORT (Envoy and the processor)"
  fi
fi
if [ -n "$UPSTREAM_HOST" ]; then
  # The upstream cluster is the last one in envoy.yaml: rewrite its address and port only.
  sed -i -e "/^  - name: upstream\$/,\$ s/address: 127\\.0\\.0\\.1\$/address: $UPSTREAM_HOST/" \
    -e "s/port_value: 18080\$/port_value: $UPSTREAM_PORT/" "$CONFIG"
  if ! grep -q "address: $UPSTREAM_HOST\$" "$CONFIG" ||
    ! grep -q "port_value: $UPSTREAM_PORT\$" "$CONFIG"; then
    die "could not point $CONFIG at $UPSTREAM_URL"
  fi
  say "demo: upstream $UPSTREAM_URL"
fi

if [ -z "$UPSTREAM_HOST" ]; then
  start upstream "$BIN_DIR/demo-upstream" --listen 127.0.0.1:18080
  wait_for "the demo upstream on :18080" listening 18080
fi
if [ "$MODE" = extproc ]; then
  [ -z "$OTLP_HOST" ] || PROCESSOR_ARGS+=(--otlp-endpoint "http://$OTLP_HOST:$OTLP_PORT")
  start processor "$BIN" "${PROCESSOR_ARGS[@]}"
  wait_for "the processor on :50051" listening 50051
fi
start envoy "$ENVOY_BIN" -c "$CONFIG" --use-dynamic-base-id --log-level warn
wait_for "Envoy on :10000" curl -s -o /dev/null --max-time 2 "$BASE/v1/responses"

say ""
if [ "$MODE" = module ]; then
  say "demo: ready (module mode: the translation runs inside Envoy, no other process). A request:"
else
  say "demo: ready. A request:"
fi
say "\$ curl -s localhost:10000/v1/responses -H 'content-type: application/json' -d '{\"model\":\"m\",\"input\":\"hi\"}'"
curl -s --max-time 60 "$BASE/v1/responses" -H 'content-type: application/json' \
  -d '{"model":"m","input":"hi"}'
echo
say ""
say "demo: the same, streamed:"
say "\$ curl -sN localhost:10000/v1/responses -H 'content-type: application/json' -d '{\"model\":\"m\",\"input\":\"hi\",\"stream\":true}'"
curl -sN --max-time 60 "$BASE/v1/responses" -H 'content-type: application/json' \
  -d '{"model":"m","input":"hi","stream":true}'
echo

say ""
say "demo: the same over the WebSocket transport (ws://localhost:10000/v1/responses), one"
say "response.create; the events' types, then the last one:"
# A minimal client of the standard library's (RFC 6455: one masked text frame out, frames in).
python3 - <<'PY'
import base64, json, os, socket, struct, sys

s = socket.create_connection(("127.0.0.1", 10000), timeout=60)
key = base64.b64encode(os.urandom(16)).decode()
s.sendall((f"GET /v1/responses HTTP/1.1\r\nHost: localhost:10000\r\nUpgrade: websocket\r\n"
           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
buf = b""
while b"\r\n\r\n" not in buf:
    chunk = s.recv(4096)
    if not chunk:
        sys.exit("demo: the upgrade got no answer")
    buf += chunk
head, buf = buf.split(b"\r\n\r\n", 1)
if not head.startswith(b"HTTP/1.1 101"):
    sys.exit("demo: the upgrade was refused: " + head.decode(errors="replace"))

def send(opcode, payload):
    mask = os.urandom(4)
    n = len(payload)
    size = bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
    s.sendall(bytes([0x80 | opcode]) + size + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

def need(n):
    global buf
    while len(buf) < n:
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("demo: the socket closed early")
        buf += chunk
    out, buf = buf[:n], buf[n:]
    return out

send(1, json.dumps({"type": "response.create", "model": "m", "input": "hi"}).encode())
types, message = [], b""
while True:
    b0, b1 = need(2)
    n = b1 & 0x7F
    n = struct.unpack(">H", need(2))[0] if n == 126 else struct.unpack(">Q", need(8))[0] if n == 127 else n
    payload = need(n)
    if b0 & 0x0F == 8:
        sys.exit("demo: the socket closed before the response ended")
    if b0 & 0x0F in (0, 1):
        message += payload
        if not b0 & 0x80:
            continue
        event, message = json.loads(message), b""
        types.append(event["type"])
        if event["type"] in ("response.completed", "response.failed", "response.incomplete", "error"):
            break
print(" ".join(types), file=sys.stderr)
print(json.dumps(event, separators=(",", ":")))
send(8, struct.pack(">H", 1000))
# The server closes the connection after its close frame (RFC 6455 §7.1.1): wait for it.
try:
    while s.recv(65536):
        pass
except OSError:
    pass
PY
echo

# Envoy writes access log lines in batches (about once a second): the two HTTP exchanges'
# and the socket's turn's (its record's line, with its socket's id).
for _ in $(seq 1 40); do
  [ "$(grep -c '"response_id":"resp_' "$ACCESS_LOG")" -ge 3 ] && break
  sleep 0.25
done
say ""
say "demo: Envoy's access log ($ACCESS_LOG), with the translator's usage metadata:"
grep '"response_id":"resp_' "$ACCESS_LOG" | grep -v '"socket_id":"[^"]' >&2 || cat "$ACCESS_LOG" >&2
say ""
say "demo: the WebSocket turn's line (its record's: the turn's usage and its socket's id):"
grep '"socket_id":"[^"]' "$ACCESS_LOG" >&2 || die "no access log line for the WebSocket turn"

say ""
if [ "$MODE" = module ]; then
  say "demo: the module's stats, in Envoy's: http://127.0.0.1:9901/stats/prometheus (tokens):"
  curl -s --max-time 10 http://127.0.0.1:9901/stats/prometheus |
    grep '^envoy_responses_module_tokens_total' >&2 || true
else
  say "demo: the processor's metrics: http://127.0.0.1:9464/metrics (tokens):"
  curl -s --max-time 10 http://127.0.0.1:9464/metrics | grep '^responses_extproc_tokens_total' >&2 || true
fi

if [ -n "${DEMO_ONESHOT:-}" ]; then
  exit 0
fi

cat >&2 <<'TXT'

demo: running until Ctrl-C (logs in target/demo/). Try:
  curl -s localhost:10000/v1/responses -H 'content-type: application/json' \
    -d '{"model":"m","input":"What is the weather in Paris?","tools":[{"type":"function","name":"get_weather","parameters":{"type":"object","properties":{"location":{"type":"string"}},"required":["location"]}}]}'
  curl -sN localhost:10000/v1/responses -H 'content-type: application/json' \
    -d '{"model":"m","input":[{"role":"user","content":"Tell me a story"}],"stream":true}'
  curl -s localhost:10000/v1/responses/compact -H 'content-type: application/json' \
    -d '{"model":"m","input":[{"role":"user","content":"My name is Ada."},{"role":"user","content":"Remember 42."}]}'
  curl -s localhost:10000/v1/models          # not translated: passes through
  curl -s localhost:9901/stats | grep ext_proc  # Envoy's ext_proc counters
  curl -s localhost:9901/stats | grep responses_module  # module mode: the module's stats
  curl -s localhost:9464/metrics                # the processor's Prometheus metrics
  # The WebSocket transport: any OpenResponses WebSocket client on ws://localhost:10000/v1/responses,
  # e.g. openai-python: OpenAI(base_url="http://localhost:10000/v1", api_key="x").responses.connect()
TXT

# Until Ctrl-C, or until one of them exits.
while true; do
  check_children
  sleep 1
done
