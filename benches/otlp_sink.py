#!/usr/bin/env python3
"""A minimal OTLP/gRPC trace sink for benches/side_by_side.py's traced scenarios.

    python benches/otlp_sink.py PORT

Answers every TraceService/Export with an empty ExportTraceServiceResponse (zero bytes in
protobuf) without decoding the request, so that its own CPU stays small next to what is
measured; on SIGTERM it prints "<exports> <bytes>" received and exits. Needs grpcio (the
bench installs it into .venv). tests/e2e/tracing.rs has the receiver that decodes and checks
spans; this one only takes them.
"""

import signal
import sys
import threading
from concurrent import futures

import grpc

received = [0, 0]
lock = threading.Lock()


def export(request, context):
    with lock:
        received[0] += 1
        received[1] += len(request)
    return b""


def main():
    port = int(sys.argv[1])
    handler = grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService",
        {"Export": grpc.unary_unary_rpc_method_handler(export)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    server.stop(0)
    with lock:
        print(f"{received[0]} {received[1]}", flush=True)


if __name__ == "__main__":
    main()
