"""A fake dcgm-exporter: serves the metric names and labels the real one does, with XIDs injected over HTTP.

    python -m tests.fakes.dcgm_exporter --hostname node-a --gpus 2 --pod 0=ml/train-worker-0 [--port 0]

prints `listening on <port>` once it serves. Endpoints:
  GET  /metrics                 Prometheus text format, like dcgm-exporter 3.x with pod mapping on
  POST /xid?gpu=0&code=79       record an XID on a GPU (the gauge then holds it as its last XID)
  POST /util?gpu=0&value=3      set GPU utilisation (percent)
  GET  /state                   JSON: injected XID events so far, per GPU

As in the real exporter, `DCGM_FI_DEV_XID_ERRORS` is a gauge of the *last* XID per GPU, with that code again in
`err_code` (0 / "No Error" before any), and the GPU's user in `pod`/`namespace`/`container`. Prometheus turns those
into `exported_pod`/`exported_namespace` when the scrape target has pod/namespace labels of its own (the exporter's
pod, on Kubernetes); the tests' scrape config reproduces that with static target labels.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

XID_MESSAGES = {0: "No Error", 13: "Graphics Engine Exception", 31: "GPU memory page fault",
                43: "GPU stopped processing", 45: "Preemptive cleanup, due to previous errors",
                48: "Double Bit ECC Error", 63: "ECC page retirement or row remapping recording event",
                74: "NVLINK Error", 79: "GPU has fallen off the bus", 92: "High single-bit ECC error rate",
                94: "Contained ECC error", 95: "Uncontained ECC error"}


class FakeGpus:
    def __init__(self, hostname: str, count: int, users: dict[int, tuple[str, str]]):
        self.hostname = hostname
        self.count = count
        self.users = users  # gpu index -> (namespace, pod)
        self.last_xid = [0] * count
        self.util = [90.0] * count
        self.events = [0] * count
        self.lock = threading.Lock()

    def labels(self, gpu: int) -> str:
        node_index = sum(map(ord, self.hostname)) % 256
        parts = [f'gpu="{gpu}"', f'UUID="GPU-{node_index:02x}{gpu:02x}c0de-0000-4000-8000-{gpu:012d}"',
                 f'pci_bus_id="00000000:{gpu + 7:02X}:00.0"', f'device="nvidia{gpu}"',
                 'modelName="NVIDIA H100 80GB HBM3"', f'Hostname="{self.hostname}"',
                 'DCGM_FI_DRIVER_VERSION="550.54.15"']
        if gpu in self.users:
            namespace, pod = self.users[gpu]
            parts += ['container="trainer"', f'namespace="{namespace}"', f'pod="{pod}"']
        return ",".join(parts)

    def exposition(self) -> str:
        with self.lock:
            lines = ["# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).", "# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
            lines += [f"DCGM_FI_DEV_GPU_UTIL{{{self.labels(g)}}} {self.util[g]:g}" for g in range(self.count)]
            lines += ["# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
                      "# TYPE DCGM_FI_DEV_FB_USED gauge"]
            lines += [f"DCGM_FI_DEV_FB_USED{{{self.labels(g)}}} {61234 + g}" for g in range(self.count)]
            lines += ["# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.",
                      "# TYPE DCGM_FI_DEV_XID_ERRORS gauge"]
            for g in range(self.count):
                code = self.last_xid[g]
                msg = XID_MESSAGES.get(code, "Unknown Error")
                lines.append(f'DCGM_FI_DEV_XID_ERRORS{{{self.labels(g)},err_code="{code}",err_msg="{msg}"}} {code}')
            return "\n".join(lines) + "\n"

    def inject(self, gpu: int, code: int) -> None:
        with self.lock:
            self.last_xid[gpu] = code
            self.events[gpu] += 1


def _handler(gpus: FakeGpus) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: str, content_type: str = "text/plain; version=0.0.4") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            path = urlparse(self.path).path
            if path == "/metrics":
                self._send(200, gpus.exposition())
            elif path == "/state":
                with gpus.lock:
                    state = {"events": gpus.events, "last_xid": gpus.last_xid}
                self._send(200, json.dumps(state), "application/json")
            else:
                self._send(404, "not found\n")

        def do_POST(self) -> None:
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            try:
                gpu = int(query["gpu"])
                if not 0 <= gpu < gpus.count:
                    raise ValueError(f"no GPU {gpu}")
                if url.path == "/xid":
                    gpus.inject(gpu, int(query["code"]))
                elif url.path == "/util":
                    with gpus.lock:
                        gpus.util[gpu] = float(query["value"])
                else:
                    self._send(404, "not found\n")
                    return
            except (KeyError, ValueError) as err:
                self._send(400, f"bad request: {err}\n")
                return
            self._send(200, "ok\n")

        def log_message(self, *args: object) -> None:  # keep test output quiet
            pass

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hostname", required=True)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--pod", action="append", default=[], metavar="GPU=NAMESPACE/POD")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    users = {}
    for item in args.pod:
        gpu, _, ref = item.partition("=")
        namespace, _, pod = ref.partition("/")
        users[int(gpu)] = (namespace, pod)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(FakeGpus(args.hostname, args.gpus, users)))
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        sys.stdout.flush()


if __name__ == "__main__":
    main()
