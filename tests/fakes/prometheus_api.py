"""A stand-in for Prometheus' instant-query API (`GET /api/v1/query`) for operator tests, where a real Prometheus
would need real scrape targets. Each query is answered with the samples set for the first marker found in its
PromQL (e.g. "last_step", "step_seconds", "XID"); anything else gets an empty vector. `down()` makes it answer 503.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse


class FakePrometheus:
    def __init__(self) -> None:
        self.answers: dict[str, list[tuple[dict[str, str], float]]] = {}
        self.queries: list[str] = []
        self.unavailable = False
        self._lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = parse_qs(url.query).get("query", [""])[0]
                status, body = fake._answer(url.path, query)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), name="fake-prometheus",
                                        daemon=True)
        self._thread.start()

    def set(self, marker: str, samples: list[tuple[dict[str, str], float]]) -> None:
        with self._lock:
            self.answers[marker] = list(samples)

    def _answer(self, path: str, query: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.queries.append(query)
            if self.unavailable:
                return 503, {"status": "error", "errorType": "unavailable", "error": "down (test)"}
            if path != "/api/v1/query":
                return 404, {"status": "error", "errorType": "not_found", "error": path}
            samples = next((s for marker, s in self.answers.items() if marker in query), [])
        now = time.time()
        result = [{"metric": labels, "value": [now, repr(float(value))]} for labels, value in samples]
        return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
