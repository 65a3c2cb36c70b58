#!/usr/bin/env python3
"""WebSocket turns per second of one Envoy worker: the module alone against the processor path.

Starts the release demo upstream (replaying benches/fixtures/chat.sse, 64 events, with no
pause between frames), then each mode in turn: Envoy (`--concurrency 1`) with
envoy/envoy-module.yaml (the filter serves the sockets), or with envoy/envoy.yaml and the
release processor (`--ws-listen`, its Chat requests back through Envoy); ports substituted.
SOCKETS clients each open one socket and send TURNS `response.create` messages one after
another (each waits for its `response.completed`; every tenth a fresh chain, the others
continuations), after WARMUP turns per socket. Prints, per mode: turns per second, the CPU
Envoy and the processor spent per turn (from /proc), and the client's share of a core (when
it nears 100%, or the machine's cores are busy, turns/s measures the client: compare the CPU
per turn, whose inverse is what one Envoy worker could serve).

    cargo build --release -p responses-module && cargo build --release
    .venv/bin/python benches/websocket_turns.py
    SOCKETS=32 TURNS=100 MODES=module,ext_proc .venv/bin/python benches/websocket_turns.py
    RECORDS=off .venv/bin/python benches/websocket_turns.py   # no turn records (as before them)
    INPUT_BYTES=40000 .venv/bin/python benches/websocket_turns.py   # 40 KB messages

Needs the `websockets` package (in .venv). Only loopback; bounded; stops by itself.
"""
import asyncio, json, os, re, socket, subprocess, sys, tempfile, time

import websockets

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENVOY = os.environ.get("ENVOY_BIN") or os.path.join(ROOT, ".venv/bin/envoy")
RELEASE = os.path.join(ROOT, "target/release")
SOCKETS = int(os.environ.get("SOCKETS", "32"))
TURNS = int(os.environ.get("TURNS", "100"))
WARMUP = int(os.environ.get("WARMUP", "5"))
MODES = os.environ.get("MODES", "module,ext_proc").split(",")
# RECORDS=off: no turn records (ws_turn_records false), to compare with builds from before them.
RECORDS = os.environ.get("RECORDS", "on") != "off"
# INPUT_BYTES=40000: each message's input padded to about that many bytes (an agent turn's
# size); continuations then carry their chain's whole context upstream.
PAD = "x" * int(os.environ.get("INPUT_BYTES", "0"))
# The upstream's answer: a recorded Chat stream (64 events), every frame written at once.
REPLAY = os.environ.get("REPLAY") or os.path.join(ROOT, "benches/fixtures/chat.sse")
TICK = os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def wait_port(port, what, proc):
    for _ in range(300):
        if proc.poll() is not None:
            sys.exit(f"{what} exited")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"{what} never listened on {port}")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def config(path, ports):
    text = open(os.path.join(ROOT, path)).read()
    if not RECORDS:
        settings = "value: |\n                  {}\n"
        if text.count(settings) == 1:
            text = text.replace(settings, 'value: |\n                  {"ws_turn_records": false}\n')
    for old, new in ports.items():
        line = f"port_value: {old}\n"
        if text.count(line) != 1:
            sys.exit(f"{path}: expected one {line!r}")
        text = text.replace(line, f"port_value: {new}\n")
    f = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
    f.write(text); f.close()
    return f.name


async def client(port, n, turns, done):
    # Each from its own loopback address: one address may hold ws_max_connections_per_address
    # (64) sockets.
    headers = {"authorization": f"Bearer bench-{n}"}
    source = (f"127.0.{1 + n // 250}.{1 + n % 250}", 0)
    async with websockets.connect(f"ws://127.0.0.1:{port}/v1/responses", max_size=None,
                                  additional_headers=headers, local_addr=source) as ws:
        previous = None
        for i in range(turns):
            body = {"type": "response.create", "model": "m", "input": f"turn {i} {PAD}"}
            if previous and i % 10:
                body["previous_response_id"] = previous
            await ws.send(json.dumps(body))
            while True:
                # Only the terminal event is parsed: the client's own cost stays small.
                message = await ws.recv()
                head = message[:48]
                if '"response.completed"' in head:
                    previous = json.loads(message)["response"]["id"]
                    break
                if any(t in head for t in ('"response.failed"', '"response.incomplete"', '"error"')):
                    sys.exit(f"turn failed: {message[:500]}")
            done.append(1)


async def load(port, turns):
    done = []
    await asyncio.gather(*(client(port, n, turns, done) for n in range(SOCKETS)))
    return len(done)


def run(mode, upstream_port):
    listener, admin = free_port(), free_port()
    procs, env = [], dict(os.environ)
    ports = {10000: listener, 9901: admin, 18080: upstream_port}
    if mode == "module":
        path = config("envoy/envoy-module.yaml", ports)
        env["ENVOY_DYNAMIC_MODULES_SEARCH_PATH"] = RELEASE
    else:
        grpc, ws = free_port(), free_port()
        path = config("envoy/envoy.yaml", {**ports, 50051: grpc, 50052: ws})
        processor = subprocess.Popen(
            [os.path.join(RELEASE, "responses-extproc"), "--listen", f"127.0.0.1:{grpc}",
             "--ws-listen", f"127.0.0.1:{ws}", "--ws-upstream", f"http://127.0.0.1:{listener}"]
            + ([] if RECORDS else ["--ws-turn-records", "false"]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(processor)
        wait_port(ws, "the processor", processor)
    envoy = subprocess.Popen([ENVOY, "-c", path, "--concurrency", "1", "--use-dynamic-base-id",
                              "--log-level", "error"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.insert(0, envoy)
    try:
        wait_port(listener, "Envoy", envoy)
        asyncio.run(load(listener, WARMUP))
        before = [cpu_seconds(p.pid) for p in procs]
        client_before = time.process_time()
        start = time.monotonic()
        turns = asyncio.run(load(listener, TURNS))
        wall = time.monotonic() - start
        cpu = [cpu_seconds(p.pid) - b for p, b in zip(procs, before)]
        client = time.process_time() - client_before
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=40)
            except subprocess.TimeoutExpired:
                p.kill()
        os.unlink(path)
    envoy_ms = cpu[0] / turns * 1000
    processor_ms = (cpu[1] / turns * 1000) if len(cpu) > 1 else 0.0
    print(f"{mode:9} {turns} turns in {wall:.2f} s: {turns / wall:7.0f} turns/s; CPU per turn: "
          f"Envoy {envoy_ms:.3f} ms, processor {processor_ms:.3f} ms, "
          f"together {envoy_ms + processor_ms:.3f} ms (the client: {client / wall:.0%} of a core)",
          flush=True)


def main():
    upstream_port = free_port()
    upstream = subprocess.Popen([os.path.join(RELEASE, "demo-upstream"), "--listen",
                                 f"127.0.0.1:{upstream_port}", "--replay", REPLAY,
                                 "--replay-delay-ms", "0"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(upstream_port, "the demo upstream", upstream)
        print(f"{SOCKETS} sockets x {TURNS} turns (after {WARMUP} each), Envoy --concurrency 1",
              flush=True)
        for mode in MODES:
            run(mode.strip(), upstream_port)
    finally:
        upstream.terminate()
        upstream.wait()


if __name__ == "__main__":
    main()
