#!/usr/bin/env python3
"""Slow reader against a flooding upstream: memory of Envoy and the processor.

Starts a flood upstream (a Chat SSE answer of FLOOD_MIB MiB written as fast as the socket
takes it), the release processor and Envoy (envoy/envoy.yaml, ports substituted), then reads
a streamed /v1/responses answer at READ_BPS bytes/s for SECONDS seconds, sampling the RSS of
Envoy and the processor. Prints one line per sample and a summary.

    cargo build --release && python3 benches/slow_reader.py
    FLOOD_MIB=200 READ_BPS=1024 SECONDS=120 python3 benches/slow_reader.py

Only loopback; bounded in time; stops by itself.
"""
import json, os, re, socket, subprocess, sys, tempfile, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOOD_MIB = int(os.environ.get("FLOOD_MIB", "100"))
READ_BPS = int(os.environ.get("READ_BPS", "1024"))
SECONDS = int(os.environ.get("SECONDS", "60"))
ENVOY = os.environ.get("ENVOY_BIN") or os.path.join(ROOT, ".venv/bin/envoy")
PROCESSOR = os.path.join(ROOT, "target/release/responses-extproc")


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def frame(text):
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return ("data: " + json.dumps(chunk) + "\n\n").encode()


class Flood(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        piece = frame("z" * 4000) * 64  # ~256 KiB per write
        sent = 0
        try:
            while sent < FLOOD_MIB << 20:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                sent += len(piece)
            end = b"data: [DONE]\n\n"
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(end), end))
        except OSError:
            pass


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def main():
    up_port, ext_port = free_port(), free_port()
    server = ThreadingHTTPServer(("127.0.0.1", up_port), Flood)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    tmp = tempfile.mkdtemp(prefix="slow-reader-")
    proc = subprocess.Popen([PROCESSOR, "--listen", f"127.0.0.1:{ext_port}"],
                            stderr=open(os.path.join(tmp, "processor.log"), "w"))
    cfg = open(os.path.join(ROOT, "envoy/envoy.yaml")).read()
    port = free_port()
    for a, b in [("address: 0.0.0.0", "address: 127.0.0.1"), ("port_value: 10000", f"port_value: {port}"),
                 ("port_value: 9901", "port_value: 0"), ("port_value: 50051", f"port_value: {ext_port}"),
                 ("port_value: 18080", f"port_value: {up_port}")]:
        cfg = cfg.replace(a, b)
    path = os.path.join(tmp, "envoy.yaml"); open(path, "w").write(cfg)
    envoy = subprocess.Popen([ENVOY, "-c", path, "--concurrency", "1", "--use-dynamic-base-id",
                              "--log-level", "error"], stderr=open(os.path.join(tmp, "envoy.log"), "w"))
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close(); break
            except OSError:
                time.sleep(0.2)
        base = (rss_kib(envoy.pid), rss_kib(proc.pid))
        body = json.dumps({"model": "m", "input": "hi", "stream": True}).encode()
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                  b"content-length: %d\r\n\r\n%s" % (len(body), body))
        got, start, peak = 0, time.time(), [0, 0]
        print(f"idle RSS: envoy {base[0]/1024:.1f} MiB, processor {base[1]/1024:.1f} MiB")
        next_sample = start
        while time.time() - start < SECONDS:
            data = s.recv(READ_BPS // 10 or 1)
            if not data:
                break
            got += len(data)
            time.sleep(0.1)
            if time.time() >= next_sample:
                e, p = rss_kib(envoy.pid), rss_kib(proc.pid)
                peak = [max(peak[0], e), max(peak[1], p)]
                print(f"t={time.time()-start:5.1f}s read={got/1024:8.1f} KiB  envoy RSS {e/1024:6.1f} MiB  processor RSS {p/1024:6.1f} MiB", flush=True)
                next_sample += 10
        print(f"summary: flood {FLOOD_MIB} MiB, read {got/1024:.1f} KiB in {time.time()-start:.0f} s; "
              f"peak RSS envoy {peak[0]/1024:.1f} MiB (+{(peak[0]-base[0])/1024:.1f}), "
              f"processor {peak[1]/1024:.1f} MiB (+{(peak[1]-base[1])/1024:.1f})")
        s.close()
    finally:
        envoy.kill(); proc.kill(); server.shutdown()


if __name__ == "__main__":
    sys.exit(main())
