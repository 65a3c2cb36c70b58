#!/usr/bin/env python3
"""Side by side: bare Envoy against Envoy with responses-extproc in both modes (the ext_proc
processor beside it, the dynamic module inside it), same upstream, same run.

    python3 benches/side_by_side.py            # 10 s per scenario (about 4 minutes in all)
    BENCH_SECONDS=30 python3 benches/side_by_side.py
    BENCH_ONLY=trickle python3 benches/side_by_side.py   # the trickle scenarios only
    BENCH_ONLY="Codex turn" python3 benches/side_by_side.py   # one realistic scenario

Knobs (environment): BENCH_SECONDS, BENCH_WARMUP_SECONDS, BENCH_CONNECTIONS (wrk -c, 32),
BENCH_TRICKLE_CONNECTIONS (wrk -c of the trickle scenarios, 256), BENCH_REPLAY_DELAY_MS (the
pause between two events of the 500-chunk stream, 5), BENCH_REPLAY_CONNECTIONS (its wrk -c,
64: 12,800 events/s like the other trickle scenario), BENCH_ONLY (scenarios whose
name contains this, with their baselines), BENCH_SKIP (not those whose name contains this),
BENCH_FILTER_CONFIG (another bootstrap for the ext_proc scenarios), BENCH_PROCESSOR_ARGS (extra processor flags), BENCH_PROCESSOR_BIN
(another processor build), BENCH_MODULE_DIR (the directory of another libresponses_module.so).

Brings up nginx (Debian) serving a fixed `chat.completion` (benches/fixtures/chat.json) and a
fixed 64-event llama-server stream (benches/fixtures/chat.sse), and the demo upstream, which
streams one word per event 20 ms apart like a model generating tokens (the *trickle*
scenarios: many concurrent streams, each event written on its own), then for each scenario a
fresh Envoy (`--concurrency 1`; benches/envoy-bare.yaml for the baseline, the shipped
envoy/envoy.yaml or one of envoy/examples/ with the release processor, or
envoy/envoy-module.yaml with the release module, found through
ENVOY_DYNAMIC_MODULES_SEARCH_PATH), and drives
it with wrk (Debian; 1 thread, 32 connections, as many requests as it can, each with the
headers openai-python sends). It prints, per scenario: requests/s, p50/p99 latency, the ratio
against bare Envoy, CPU microseconds per exchange of Envoy and of the processor (utime+stime
from /proc over the measured run), the ext_proc messages Envoy sent per exchange (its
stream_msgs_sent counter), the CPU of wrk and nginx per exchange, and how busy the machine's cores were (/proc/stat): at 100 % the
run is bound by the machine's CPU, below it by Envoy's one worker or by waiting.

Installs what is missing: nginx-light and wrk with apt-get (needs root or sudo), Envoy with
deploy/install-envoy.sh, and builds the release binaries. Every answer's status is counted
(wrk's non-2xx line), and each scenario's answer is checked once before the load (a Responses
object, a Responses event stream ending in response.completed, the Chat answer for other
traffic). Nothing here asserts speed; it measures.

The realistic scenarios (benches/fixtures/README.md): "Codex turn" posts a real Codex CLI 0.169
turn (40 KB, `stream: true`) as is, "400 KB turn" the same grown to a long agent session; both
are answered by the 64-event stream, and bare Envoy gets the same bytes on the Chat route.
Their ", gzip" variants post the same turns gzipped (`content-encoding: gzip`), which each mode
reads off the thread that serves the others (compared with bare Envoy given the plain turn).
"500-chunk trickled stream" is a trickle scenario: a second demo upstream replays
benches/fixtures/chat_500.sse (500 token-sized vLLM deltas and usage), each event written on
its own, BENCH_REPLAY_DELAY_MS apart.

The trickle scenarios print a second table: streams/s, the upstream events per stream, and the
CPU per streamed event of Envoy and of the processor, and what each mode adds per event over
bare Envoy proxying the same stream untranslated.

The "traced" scenarios are the same exchanges with traces on: the processor runs with
--otlp-endpoint and exports a span per exchange to an OTLP/gRPC sink (benches/otlp_sink.py,
grpcio installed into .venv; it takes the exports without decoding them, its CPU is printed
under the table). Envoy does not trace there, so the rows compare the processor's CPU per
exchange with traces off and on. For "off costs nothing", compare the untraced rows with an
older build: BENCH_PROCESSOR_BIN=/path/to/it BENCH_ONLY="ext_proc, /v1" BENCH_SKIP=traced.
"""

import gzip
import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECONDS = int(os.environ.get("BENCH_SECONDS", "10"))
WARMUP = int(os.environ.get("BENCH_WARMUP_SECONDS", "2"))
CONNECTIONS = int(os.environ.get("BENCH_CONNECTIONS", "32"))
TRICKLE_CONNECTIONS = int(os.environ.get("BENCH_TRICKLE_CONNECTIONS", "256"))
# Another bootstrap for the filter scenarios (same placeholders as envoy/envoy.yaml), to
# measure a setting before shipping it.
FILTER_CONFIG = os.environ.get("BENCH_FILTER_CONFIG", "envoy/envoy.yaml")
ONLY = os.environ.get("BENCH_ONLY")  # run only the scenarios whose name contains this
SKIP = os.environ.get("BENCH_SKIP")  # and not those whose name contains this
REPLAY_DELAY_MS = int(os.environ.get("BENCH_REPLAY_DELAY_MS", "5"))
REPLAY_CONNECTIONS = int(os.environ.get("BENCH_REPLAY_CONNECTIONS", "64"))
PROCESSOR_ARGS = os.environ.get("BENCH_PROCESSOR_ARGS", "").split()  # e.g. "--worker-threads 2"
# Another processor binary (e.g. an older build, to compare), with BENCH_FILTER_CONFIG.
PROCESSOR_BIN = os.environ.get("BENCH_PROCESSOR_BIN", f"{ROOT}/target/release/responses-extproc")
MODULE_DIR = os.environ.get("BENCH_MODULE_DIR", f"{ROOT}/target/release")
MODULE_CONFIG = "envoy/envoy-module.yaml"
# The OTLP sink of the traced scenarios runs on grpcio, pinned (installed into .venv).
GRPCIO = "grpcio==1.85.1"
TICK = os.sysconf("SC_CLK_TCK")

# What openai-python 3.57 sends with each request (its standard headers): the request-headers
# message carries whatever the client sent, so the benchmark sends what a real client does.
CLIENT_HEADERS = {
    "Accept": "application/json",
    "Authorization": "Bearer sk-bench-0123456789abcdefghijklmnopqrstuvwxyz",
    "User-Agent": "OpenAI/Python 3.57.0",
    "X-Stainless-Lang": "python",
    "X-Stainless-Package-Version": "3.57.0",
    "X-Stainless-OS": "Linux",
    "X-Stainless-Arch": "x64",
    "X-Stainless-Runtime": "CPython",
    "X-Stainless-Runtime-Version": "3.11.7",
    "X-Stainless-Async": "false",
    "X-Stainless-Retry-Count": "0",
    "X-Stainless-Read-Timeout": "600",
}

RESPONSES_JSON = {"model": "bench-model", "input": "Say something."}
RESPONSES_SSE = {"model": "bench-model", "input": "Say something.", "stream": True}
CHAT_JSON = {"model": "bench-model", "messages": [{"role": "user", "content": "Say something."}]}
# The demo upstream answers "Hello! This is the demo upstream. You said: <input>", one word per
# event, 20 ms apart: this input makes 46 words, about a second per stream.
TRICKLE_INPUT = " ".join(["tick"] * 38)
TRICKLE_CHAT = {"model": "bench-model", "stream": True,
                "messages": [{"role": "user", "content": TRICKLE_INPUT}]}
TRICKLE_RESPONSES = {"model": "bench-model", "input": TRICKLE_INPUT, "stream": True}
FIXTURES = os.path.join(ROOT, "benches", "fixtures")
# Request bodies posted byte for byte as recorded or generated (benches/fixtures/README.md).
CODEX_TURN = os.path.join(FIXTURES, "codex_turn.json")
LONG_TURN = os.path.join(FIXTURES, "codex_turn_400k.json")
# What the replaying demo upstream streams in the 500-chunk scenario.
REPLAYED_STREAM = os.path.join(FIXTURES, "chat_500.sse")


@dataclass
class Scenario:
    name: str
    envoy_config: str  # path relative to ROOT
    upstream: str  # "json", "sse", "trickle" (the demo) or "replay" (the 500-chunk stream)
    path: str
    body: dict | str  # a JSON object, or the path of a file posted as is
    processor: bool  # start the processor
    baseline: str  # name of the scenario it is compared with
    expect: str  # a substring of a correct answer
    uds: bool = False
    # Turn the filter on for every route (it is off by default in http_filters): each request
    # then costs one gRPC stream and one message, answered "not ours" (ext_proc), or one
    # filter created and asked "not ours" (module). The floor of any exchange with the filter,
    # measured on the same traffic as bare Envoy.
    filter_everywhere: bool = False
    # The module inside Envoy instead of the processor beside it.
    module: bool = False
    # Many concurrent paced streams (wrk -c BENCH_TRICKLE_CONNECTIONS); CPU per event.
    trickle: bool = False
    # Traces on: the processor exports a span per exchange to an OTLP sink.
    traced: bool = False
    # The body posted gzipped (`content-encoding: gzip`): a compressed body is read off the
    # thread that serves the others (the processor's blocking pool, the module's work threads).
    gzip: bool = False


SCENARIOS = [
    Scenario("bare Envoy, JSON", "benches/envoy-bare.yaml", "json", "/v1/chat/completions",
             CHAT_JSON, False, "bare Envoy, JSON", '"object":"chat.completion"'),
    Scenario("ext_proc, /v1/responses JSON", FILTER_CONFIG, "json", "/v1/responses",
             RESPONSES_JSON, True, "bare Envoy, JSON", '"object":"response"'),
    Scenario("ext_proc over a Unix socket, JSON", "envoy/examples/extproc-uds.yaml", "json",
             "/v1/responses", RESPONSES_JSON, True, "bare Envoy, JSON", '"object":"response"',
             uds=True),
    Scenario("module, /v1/responses JSON", MODULE_CONFIG, "json", "/v1/responses",
             RESPONSES_JSON, False, "bare Envoy, JSON", '"object":"response"', module=True),
    Scenario("ext_proc: other traffic through the chain, JSON", FILTER_CONFIG, "json",
             "/v1/chat/completions", CHAT_JSON, True, "bare Envoy, JSON",
             '"object":"chat.completion"'),
    Scenario("module: other traffic through the chain, JSON", MODULE_CONFIG, "json",
             "/v1/chat/completions", CHAT_JSON, False, "bare Envoy, JSON",
             '"object":"chat.completion"', module=True),
    Scenario("ext_proc floor: any exchange (1 message, not ours)", FILTER_CONFIG, "json",
             "/v1/chat/completions", CHAT_JSON, True, "bare Envoy, JSON",
             '"object":"chat.completion"', filter_everywhere=True),
    Scenario("module floor: the filter on every route (not ours)", MODULE_CONFIG, "json",
             "/v1/chat/completions", CHAT_JSON, False, "bare Envoy, JSON",
             '"object":"chat.completion"', filter_everywhere=True, module=True),
    Scenario("ext_proc, /v1/responses JSON, traced", FILTER_CONFIG, "json", "/v1/responses",
             RESPONSES_JSON, True, "bare Envoy, JSON", '"object":"response"', traced=True),
    Scenario("bare Envoy, SSE", "benches/envoy-bare.yaml", "sse", "/v1/chat/completions",
             CHAT_JSON, False, "bare Envoy, SSE", "data: [DONE]"),
    Scenario("ext_proc, /v1/responses SSE", FILTER_CONFIG, "sse", "/v1/responses",
             RESPONSES_SSE, True, "bare Envoy, SSE", "event: response.completed"),
    Scenario("ext_proc, /v1/responses SSE, traced", FILTER_CONFIG, "sse", "/v1/responses",
             RESPONSES_SSE, True, "bare Envoy, SSE", "event: response.completed", traced=True),
    Scenario("module, /v1/responses SSE", MODULE_CONFIG, "sse", "/v1/responses",
             RESPONSES_SSE, False, "bare Envoy, SSE", "event: response.completed", module=True),
    Scenario("bare Envoy, Codex turn", "benches/envoy-bare.yaml", "sse", "/v1/chat/completions",
             CODEX_TURN, False, "bare Envoy, Codex turn", "data: [DONE]"),
    Scenario("ext_proc, Codex turn", FILTER_CONFIG, "sse", "/v1/responses", CODEX_TURN, True,
             "bare Envoy, Codex turn", "event: response.completed"),
    Scenario("module, Codex turn", MODULE_CONFIG, "sse", "/v1/responses", CODEX_TURN, False,
             "bare Envoy, Codex turn", "event: response.completed", module=True),
    Scenario("bare Envoy, 400 KB turn", "benches/envoy-bare.yaml", "sse", "/v1/chat/completions",
             LONG_TURN, False, "bare Envoy, 400 KB turn", "data: [DONE]"),
    Scenario("ext_proc, 400 KB turn", FILTER_CONFIG, "sse", "/v1/responses", LONG_TURN, True,
             "bare Envoy, 400 KB turn", "event: response.completed"),
    Scenario("module, 400 KB turn", MODULE_CONFIG, "sse", "/v1/responses", LONG_TURN, False,
             "bare Envoy, 400 KB turn", "event: response.completed", module=True),
    Scenario("ext_proc, Codex turn, gzip", FILTER_CONFIG, "sse", "/v1/responses", CODEX_TURN,
             True, "bare Envoy, Codex turn", "event: response.completed", gzip=True),
    Scenario("module, Codex turn, gzip", MODULE_CONFIG, "sse", "/v1/responses", CODEX_TURN,
             False, "bare Envoy, Codex turn", "event: response.completed", module=True,
             gzip=True),
    Scenario("ext_proc, 400 KB turn, gzip", FILTER_CONFIG, "sse", "/v1/responses", LONG_TURN,
             True, "bare Envoy, 400 KB turn", "event: response.completed", gzip=True),
    Scenario("module, 400 KB turn, gzip", MODULE_CONFIG, "sse", "/v1/responses", LONG_TURN,
             False, "bare Envoy, 400 KB turn", "event: response.completed", module=True,
             gzip=True),
    Scenario("bare Envoy, trickle SSE", "benches/envoy-bare.yaml", "trickle",
             "/v1/chat/completions", TRICKLE_CHAT, False, "bare Envoy, trickle SSE",
             "data: [DONE]", trickle=True),
    Scenario("ext_proc, trickle SSE", FILTER_CONFIG, "trickle", "/v1/responses",
             TRICKLE_RESPONSES, True, "bare Envoy, trickle SSE", "event: response.completed",
             trickle=True),
    Scenario("module, trickle SSE", MODULE_CONFIG, "trickle", "/v1/responses",
             TRICKLE_RESPONSES, False, "bare Envoy, trickle SSE", "event: response.completed",
             module=True, trickle=True),
    Scenario("bare Envoy, 500-chunk trickled stream", "benches/envoy-bare.yaml", "replay",
             "/v1/chat/completions", CHAT_JSON | {"stream": True}, False,
             "bare Envoy, 500-chunk trickled stream", "data: [DONE]", trickle=True),
    Scenario("ext_proc, 500-chunk trickled stream", FILTER_CONFIG, "replay", "/v1/responses",
             RESPONSES_SSE, True, "bare Envoy, 500-chunk trickled stream",
             "event: response.completed", trickle=True),
    Scenario("module, 500-chunk trickled stream", MODULE_CONFIG, "replay", "/v1/responses",
             RESPONSES_SSE, False, "bare Envoy, 500-chunk trickled stream",
             "event: response.completed", module=True, trickle=True),
]


def body_bytes(scenario):
    """What a scenario posts: its JSON object, or a fixture's bytes as they are."""
    if isinstance(scenario.body, str):
        with open(scenario.body, "rb") as f:
            body = f.read()
    else:
        body = json.dumps(scenario.body).encode()
    return gzip.compress(body, 6) if scenario.gzip else body


def request_headers(scenario):
    """The headers of each request: openai-python's, and the body's coding."""
    headers = {"content-type": "application/json", **CLIENT_HEADERS}
    if scenario.gzip:
        headers["content-encoding"] = "gzip"
    return headers


@dataclass
class Result:
    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    envoy_us: float
    processor_us: float | None
    extproc_messages: float | None  # gRPC messages Envoy sent the processor per exchange
    machine_busy: float  # share of all cores busy during the run (0..1)
    others_us: float  # CPU of wrk and nginx per exchange: the fixed costs of the setup
    notes: list = field(default_factory=list)
    sink_us: float | None = None  # CPU of the OTLP sink per exchange (traced scenarios)


def log(msg):
    print(f"bench: {msg}", file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_sink_python():
    """The Python that runs benches/otlp_sink.py: .venv's, with grpcio."""
    python = os.path.join(ROOT, ".venv", "bin", "python")
    if subprocess.run([python, "-c", "import grpc"], capture_output=True).returncode != 0:
        log(f"installing {GRPCIO} into .venv (the OTLP sink of the traced scenarios)")
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                        GRPCIO], check=True)
    return python


def ensure_tools():
    missing = [t for t in ("nginx", "wrk") if not shutil.which(t) and not os.path.exists(f"/usr/sbin/{t}")]
    if missing:
        log(f"installing {' '.join(missing)} with apt-get")
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        pkgs = ["nginx-light" if t == "nginx" else t for t in missing]
        if subprocess.run(sudo + ["apt-get", "install", "-y", "-q"] + pkgs).returncode != 0:
            subprocess.run(sudo + ["apt-get", "update", "-q"], check=True)
            subprocess.run(sudo + ["apt-get", "install", "-y", "-q"] + pkgs, check=True)
    envoy = subprocess.run(["bash", f"{ROOT}/deploy/install-envoy.sh"], check=True,
                           capture_output=True, text=True).stdout.strip()
    log("building the release binaries and the module")
    subprocess.run(["cargo", "build", "--release", "--bins"], cwd=ROOT, check=True)
    if MODULE_DIR == f"{ROOT}/target/release":
        subprocess.run(["cargo", "build", "--release", "-p", "responses-module"], cwd=ROOT, check=True)
    return envoy


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def machine_ticks():
    """(busy, stolen, total) jiffies of all cores, from /proc/stat. Stolen time is CPU the
    virtual machine's host gave to someone else: a run with much of it measured a busy host."""
    with open("/proc/stat") as f:
        # user nice system idle iowait irq softirq steal (guest time is counted in user)
        values = [int(x) for x in f.readline().split()[1:9]]
    idle, steal = values[3] + values[4], values[7]
    return sum(values) - idle - steal, steal, sum(values)


def nginx_seconds(master):
    """CPU seconds of nginx's master and worker processes."""
    pids = [master.pid] + [int(p) for p in subprocess.run(["pgrep", "-P", str(master.pid)],
                                                          capture_output=True, text=True).stdout.split()]
    return sum(cpu_seconds(p) for p in pids)


def children_seconds():
    """CPU seconds of the children this script has waited for (wrk)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def extproc_messages_sent(admin):
    """Envoy's count of ext_proc messages sent to the processor (all filters)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{admin}/stats?filter=ext_proc.stream_msgs_sent$",
                                timeout=5) as resp:
        text = resp.read().decode()
    return sum(int(v) for v in re.findall(r": (\d+)$", text, re.M))


def wait_http(url, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except Exception:
            time.sleep(0.1)
    raise SystemExit(f"bench: {url} did not come up")


def wait_path(path, timeout=20):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if time.time() > deadline:
            raise SystemExit(f"bench: {path} did not appear")
        time.sleep(0.05)


def wait_port(port, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"bench: port {port} did not open")


def start_nginx(tmp):
    ports = {"json": free_port(), "sse": free_port()}
    fixtures = os.path.join(ROOT, "benches", "fixtures")
    # Static files, answered to POST too: nginx's static module refuses POST (405), and an
    # error_page redirect serves the same file with 200.
    conf = f"""
daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body;
  proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fastcgi;
  uwsgi_temp_path {tmp}/uwsgi;
  scgi_temp_path {tmp}/scgi;
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{ports['json']};
    location / {{ root {fixtures}; default_type application/json; try_files /chat.json =404; error_page 405 =200 $uri; }}
  }}
  server {{
    listen 127.0.0.1:{ports['sse']};
    location / {{ root {fixtures}; default_type text/event-stream; try_files /chat.sse =404; error_page 405 =200 $uri; }}
  }}
}}
"""
    path = os.path.join(tmp, "nginx.conf")
    with open(path, "w") as f:
        f.write(conf)
    nginx = shutil.which("nginx") or "/usr/sbin/nginx"
    proc = subprocess.Popen([nginx, "-c", path, "-p", tmp], stderr=open(f"{tmp}/nginx.out", "w"))
    for p in ports.values():
        wait_port(p)
    return proc, ports


def start_trickle(tmp, replay_delay_ms=None):
    """The demo upstream (release build): paced streams, one word per event; or, with a
    delay, replaying the 500-chunk stream (each event on its own, that many ms apart)."""
    port = free_port()
    replay = [] if replay_delay_ms is None else ["--replay", REPLAYED_STREAM,
                                                  "--replay-delay-ms", str(replay_delay_ms)]
    name = "demo-upstream" if replay_delay_ms is None else "replay-upstream"
    proc = subprocess.Popen([f"{ROOT}/target/release/demo-upstream", "--listen", f"127.0.0.1:{port}",
                             *replay],
                            env={**os.environ, "RUST_LOG": "warn"},
                            stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/{name}.log", "w"))
    wait_port(port)
    # Events per stream: what the upstream writes, each on its own (the [DONE] line included).
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                                 data=json.dumps(TRICKLE_CHAT).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        events = resp.read().decode().count("data: ")
    return proc, port, events


def envoy_config(scenario, tmp, listen, admin, extproc, upstream, socket_path):
    with open(os.path.join(ROOT, scenario.envoy_config)) as f:
        text = f.read()
    subs = [("address: 0.0.0.0", "address: 127.0.0.1"), ("port_value: 10000", f"port_value: {listen}"),
            ("port_value: 9901", f"port_value: {admin}"), ("port_value: 18080", f"port_value: {upstream}")]
    if scenario.processor and not scenario.uds:
        subs.append(("port_value: 50051", f"port_value: {extproc}"))
    if scenario.uds:
        subs.append(("path: /run/responses-extproc/extproc.sock", f"path: {socket_path}"))
    if scenario.filter_everywhere:
        subs.append(("disabled: true", "disabled: false"))
    for a, b in subs:
        if text.count(a) != 1:
            raise SystemExit(f"bench: {scenario.envoy_config}: expected '{a}' once")
        text = text.replace(a, b)
    path = os.path.join(tmp, "envoy.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def wrk_script(tmp, scenario):
    # The body from a file: fixtures are hundreds of KB, and posted byte for byte.
    body = os.path.join(tmp, "body.json")
    with open(body, "wb") as f:
        f.write(body_bytes(scenario))
    path = os.path.join(tmp, "post.lua")
    with open(path, "w") as f:
        f.write(f'local file = io.open("{body}", "rb")\nwrk.body = file:read("*a")\nfile:close()\n'
                f'wrk.method = "POST"\n')
        for name, value in request_headers(scenario).items():
            f.write(f'wrk.headers["{name}"] = "{value}"\n')
    return path


def run_wrk(url, script, seconds, connections):
    # The trickle streams last about a second each: a timeout well above that.
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s",
                          "--latency", "-s", script, url],
                         capture_output=True, text=True, check=True).stdout
    def ms(label):
        m = re.search(rf"^\s+{label}%\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        value, unit = float(m.group(1)), m.group(2)
        return value / 1000 if unit == "us" else value * 1000 if unit == "s" else value
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    errors = sum(int(x) for x in re.findall(r"Non-2xx or 3xx responses: (\d+)", out))
    errors += sum(int(x) for x in re.findall(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)[0]) \
        if "Socket errors" in out else 0
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    return rps, ms("50"), ms("99"), requests, errors


def check_answer(url, scenario):
    req = urllib.request.Request(url, data=body_bytes(scenario), headers=request_headers(scenario))
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, body = resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read().decode()
    if status != 200 or scenario.expect not in body:
        raise SystemExit(f"bench: {scenario.name}: unexpected answer {status}: {body[:300]}")


def run(scenario, envoy_bin, ports, tmp, nginx, sink_python):
    listen, admin, extproc = free_port(), free_port(), free_port()
    socket_path = os.path.join(tmp, "extproc.sock")
    config = envoy_config(scenario, tmp, listen, admin, extproc, ports[scenario.upstream], socket_path)
    procs = []
    sink = None
    try:
        processor = None
        tracing = []
        if scenario.traced:
            sink_port = free_port()
            sink = subprocess.Popen([sink_python, os.path.join(ROOT, "benches", "otlp_sink.py"),
                                     str(sink_port)], stdout=subprocess.PIPE, text=True,
                                    stderr=open(f"{tmp}/sink.log", "w"))
            wait_port(sink_port)
            tracing = ["--otlp-endpoint", f"http://127.0.0.1:{sink_port}"]
        if scenario.processor:
            addr = f"unix:{socket_path}" if scenario.uds else f"127.0.0.1:{extproc}"
            processor = subprocess.Popen([PROCESSOR_BIN, "--listen", addr, *tracing, *PROCESSOR_ARGS],
                                         env={**os.environ, "RUST_LOG": "warn"},
                                         stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/processor.log", "w"))
            procs.append(processor)
            wait_path(socket_path) if scenario.uds else wait_port(extproc)
        env = {**os.environ, "ENVOY_DYNAMIC_MODULES_SEARCH_PATH": MODULE_DIR} if scenario.module else None
        envoy = subprocess.Popen([envoy_bin, "-c", config, "--concurrency", "1", "--log-level", "warn",
                                  "--base-id", str(listen)], env=env,
                                 stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/envoy.log", "w"))
        procs.append(envoy)
        wait_http(f"http://127.0.0.1:{admin}/ready")
        url = f"http://127.0.0.1:{listen}{scenario.path}"
        check_answer(url, scenario)
        script = wrk_script(tmp, scenario)
        connections = {"trickle": TRICKLE_CONNECTIONS, "replay": REPLAY_CONNECTIONS}.get(
            scenario.upstream, CONNECTIONS)
        run_wrk(url, script, WARMUP, connections)
        e0 = cpu_seconds(envoy.pid)
        p0 = cpu_seconds(processor.pid) if processor else 0
        s0 = cpu_seconds(sink.pid) if sink else 0
        m0 = machine_ticks()
        o0 = children_seconds() + nginx_seconds(nginx)
        x0 = extproc_messages_sent(admin) if processor else 0
        rps, p50, p99, requests, errors = run_wrk(url, script, SECONDS, connections)
        x1 = extproc_messages_sent(admin) if processor else 0
        m1 = machine_ticks()
        o1 = children_seconds() + nginx_seconds(nginx)
        e1 = cpu_seconds(envoy.pid)
        p1 = cpu_seconds(processor.pid) if processor else 0
        s1 = cpu_seconds(sink.pid) if sink else 0
        ticks = max(1, m1[2] - m0[2])
        busy = (m1[0] - m0[0]) / ticks
        stolen = (m1[1] - m0[1]) / ticks
        if stolen > 0.05:
            log(f"{scenario.name}: {stolen:.0%} of the CPU was stolen by the host: re-run on a quieter machine")
        if requests == 0:
            raise SystemExit(f"bench: {scenario.name}: no exchange completed in {SECONDS} s "
                             "(raise BENCH_SECONDS)")
        result = Result(rps, p50, p99, requests, errors, (e1 - e0) / requests * 1e6,
                        (p1 - p0) / requests * 1e6 if processor else None,
                        (x1 - x0) / requests if processor else None, busy,
                        (o1 - o0) / requests * 1e6)
        if sink:
            result.sink_us = (s1 - s0) / requests * 1e6
        return result
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        if sink:
            # After the processor's shutdown flushed its last spans.
            sink.send_signal(signal.SIGTERM)
            exports, size = (sink.communicate(timeout=10)[0].split() + ["0", "0"])[:2]
            if int(exports) == 0:
                raise SystemExit(f"bench: {scenario.name}: the OTLP sink received no spans")
            with open(f"{tmp}/processor.log") as f:
                if "dropping" in f.read():
                    log(f"{scenario.name}: the processor dropped spans (see its log)")
            log(f"{scenario.name}: the sink received {exports} exports, {int(size) / 1e6:.1f} MB")
        if os.path.exists(socket_path):
            os.unlink(socket_path)


def chosen(s):
    return (not ONLY or ONLY in s.name) and not (SKIP and SKIP in s.name)


def wanted(s):
    """BENCH_ONLY and BENCH_SKIP; a baseline runs when a chosen scenario is measured against it."""
    if s.name == s.baseline:
        return chosen(s) or any(o.baseline == s.name and chosen(o) for o in SCENARIOS)
    return chosen(s)


def main():
    envoy_bin = ensure_tools()
    selected = [s for s in SCENARIOS if wanted(s)]
    sink_python = ensure_sink_python() if any(s.traced for s in selected) else None
    tmp = tempfile.mkdtemp(prefix="side-by-side-")
    nginx, ports = start_nginx(tmp)
    trickle, ports["trickle"], demo_events = start_trickle(tmp)
    replay, ports["replay"], replay_events = start_trickle(tmp, REPLAY_DELAY_MS)
    events = {"trickle": demo_events, "replay": replay_events}
    results = {}
    try:
        for s in selected:
            log(f"{s.name}: {SECONDS} s")
            results[s.name] = run(s, envoy_bin, ports, tmp, nginx, sink_python)
    finally:
        nginx.send_signal(signal.SIGQUIT)
        nginx.wait(10)
        for upstream in (trickle, replay):
            upstream.send_signal(signal.SIGTERM)
            upstream.wait(10)
    version = subprocess.run([envoy_bin, "--version"], capture_output=True, text=True).stdout
    version = re.search(r"version: \S+", version).group(0) if version else envoy_bin
    print(f"\nside by side: {os.cpu_count()} cores, Envoy {version} --concurrency 1, wrk -t1 "
          f"-c{CONNECTIONS} (trickle: -c{TRICKLE_CONNECTIONS}, replay: -c{REPLAY_CONNECTIONS}), {SECONDS} s per scenario, "
          f"{time.strftime('%Y-%m-%d')}\n")
    print("| scenario | req/s | vs bare | p50 ms | p99 ms | p99 vs bare | errors | Envoy µs/exchange "
          "| processor µs/exchange | wrk+nginx µs/exchange | ext_proc messages/exchange | machine busy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in SCENARIOS:
        if s.name not in results or s.baseline not in results or s.trickle:
            continue
        r, b = results[s.name], results[s.baseline]
        proc = f"{r.processor_us:.0f}" if r.processor_us is not None else "-"
        msgs = f"{r.extproc_messages:.2f}" if r.extproc_messages is not None else "-"
        print(f"| {s.name} | {r.rps:,.0f} | {r.rps / b.rps:.2f} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | "
              f"{r.p99_ms / b.p99_ms:.1f} | {r.errors} | {r.envoy_us:.0f} | {proc} | {r.others_us:.0f} | {msgs} | "
              f"{r.machine_busy:.0%} |")
    trickles = [s for s in SCENARIOS if s.trickle and s.name in results and s.baseline in results]
    if trickles:
        print(f"\ntrickle: the demo upstream writes each of its {demo_events} events on its own, "
              f"20 ms apart; the replay upstream its {replay_events} events {REPLAY_DELAY_MS} ms "
              f"apart; {TRICKLE_CONNECTIONS} and {REPLAY_CONNECTIONS} concurrent streams\n")
        print("| scenario | streams/s | p50 ms | p99 ms | events/stream | Envoy µs/event | "
              "processor µs/event | added µs/event (Envoy + processor, over bare) | errors | "
              "machine busy |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for s in trickles:
            r, b, n = results[s.name], results[s.baseline], events[s.upstream]
            envoy_ev, bare_ev = r.envoy_us / n, b.envoy_us / n
            proc_ev = (r.processor_us or 0) / n
            proc = f"{proc_ev:.2f}" if r.processor_us is not None else "-"
            added = "-" if s.name == s.baseline else f"{envoy_ev - bare_ev + proc_ev:.2f}"
            print(f"| {s.name} | {r.rps:,.0f} | {r.p50_ms:.0f} | {r.p99_ms:.0f} | {n} | "
                  f"{envoy_ev:.2f} | {proc} | {added} | {r.errors} | {r.machine_busy:.0%} |")
    for name, r in results.items():
        if r.sink_us is not None:
            print(f"\n{name}: the OTLP sink took {r.sink_us:.0f} µs of CPU per exchange "
                  "(not counted in the columns above)")
    shutil.rmtree(tmp, ignore_errors=True)
    if any(r.errors for r in results.values()):
        raise SystemExit("bench: some answers were errors (see the table)")


if __name__ == "__main__":
    main()
