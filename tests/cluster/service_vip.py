"""The one piece of kube-proxy the real nodes need: the `kubernetes` Service's ClusterIP (pki.SERVICE_IP, port 443),
through which a pod's in-cluster client (kopf, the operator's, the API's) reaches the API server from the
KUBERNETES_SERVICE_HOST/PORT its kubelet sets. A real node's pods run on the host network, so the address is put on
the host's loopback interface and a TCP relay listens there, forwarding each connection to the API server as is (TLS
stays end to end: the API server's certificate names the ClusterIP). One machine has one such address: a second
cluster with real nodes waits for the first to release it (a lock in /run)."""

from __future__ import annotations

import fcntl
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from tests.cluster.pki import SERVICE_IP

SERVICE_PORT = 443
LOCK = Path("/run/flywheel-service-vip.lock")


class ServiceVip:
    def __init__(self, target: Callable[[], tuple[str, int]]) -> None:
        """`target`: the API server's address now (a restarted API server may have moved to another port)."""
        self.target = target
        self._lock: IO[str] | None = None
        self._server: socket.socket | None = None
        self._added = False

    def start(self) -> None:
        self._lock = open(LOCK, "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        added = subprocess.run(["ip", "addr", "add", f"{SERVICE_IP}/32", "dev", "lo"], capture_output=True, text=True)
        self._added = added.returncode == 0
        if not self._added and "File exists" not in added.stderr:
            raise RuntimeError(f"cannot put {SERVICE_IP} on lo: {added.stderr.strip()}")
        server = socket.socket()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((SERVICE_IP, SERVICE_PORT))
        server.listen(64)
        self._server = server
        threading.Thread(target=self._accept, name="service-vip", daemon=True).start()

    def _accept(self) -> None:
        assert self._server is not None
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed by stop()
            try:
                upstream = socket.create_connection(self.target(), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            done = threading.Barrier(2, action=_closer(client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_copy, args=(source, sink, done), daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self._added:
            subprocess.run(["ip", "addr", "del", f"{SERVICE_IP}/32", "dev", "lo"], capture_output=True)
            self._added = False
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None


def _closer(*sockets: socket.socket) -> Callable[[], None]:
    def close() -> None:
        for sock in sockets:
            sock.close()
    return close


def _copy(source: socket.socket, sink: socket.socket, done: threading.Barrier) -> None:
    """One direction; the connection's two sockets are closed once both directions ended."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    for sock, how in ((sink, socket.SHUT_WR), (source, socket.SHUT_RD)):
        try:
            sock.shutdown(how)
        except OSError:
            pass
    done.wait()
