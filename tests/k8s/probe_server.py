"""A pod for the process kubelet's probe and hook tests: a small HTTP server whose answers and notes a test reads
from files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client

from tests.etcd_process import free_port

# Serves /ready with 200 while the file READY names exists (else 503), creates ALIVE at start, notes every path it
# is asked for in ALIVE, and notes a SIGTERM there too.
SERVER = """
import http.server, os, pathlib, signal, sys
pathlib.Path(os.environ["ALIVE"]).touch()
def note(line):
    with open(os.environ["ALIVE"], "a") as f:
        f.write(line + "\\n")
signal.signal(signal.SIGTERM, lambda *a: (note("SIGTERM"), sys.exit(0)))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        note(self.path)
        self.send_response(200 if os.path.exists(os.environ["READY"]) else 503)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
"""
QUICK = {"periodSeconds": 1, "timeoutSeconds": 1, "failureThreshold": 2}


def server_pod(name: str, tmp: Path, restart: str = "Always", **probes: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """The pod (its container `main`, port `http`) and the port it listens on."""
    port = free_port()
    env = [{"name": "PORT", "value": str(port)}, {"name": "READY", "value": str(tmp / "ready")},
           {"name": "ALIVE", "value": str(tmp / "alive")}]
    container = {"name": "main", "image": "python:3.11", "command": ["python", "-c", SERVER], "env": env,
                 "ports": [{"name": "http", "containerPort": port}], **probes}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"restartPolicy": restart, "terminationGracePeriodSeconds": 1, "containers": [container]}}, port


def is_ready(core: client.CoreV1Api, name: str) -> bool:
    pod = core.read_namespaced_pod(name, "default")
    ready = [c.status for c in pod.status.conditions or [] if c.type == "Ready"]
    statuses = pod.status.container_statuses or []
    return ready == ["True"] and bool(statuses) and bool(statuses[0].ready)
