"""The two servers bench/api_latency.py loads, each run as its own process (so the load generator never shares
a GIL with it), on 127.0.0.1 with the same uvicorn settings:

- `ours`: the real app (`flywheel.api.app.create_app`) over a MemorySource holding N synthetic jobs with their
  pods and events (bench/api_jobs.py), token-file auth, read-only.
- `peer`: the framework floor: a bare FastAPI app with the same routes (sync handlers, like ours) answering each
  URL of the workload with the bytes ours answers it with, prepared before it starts serving. The difference
  is what our app adds per request: auth, cache reads, building the views, pydantic validation and JSON.

    python -m bench.api_serve ours --port 8711 --jobs 500 --token-file tokens.csv
    python -m bench.api_serve peer --port 8712 --jobs 500 --token-file tokens.csv --urls urls.json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fastapi import FastAPI, Request, Response

from bench.api_jobs import populate
from flywheel.api.app import create_app
from flywheel.api.auth import TokenFileAuth
from tests.api.memory_source import MemorySource


def ours(jobs: int, token_file: str, seed: int = 0) -> FastAPI:
    source = MemorySource()
    populate(source, jobs, seed)
    return create_app(source, TokenFileAuth.from_file(token_file), None)


def peer(bodies: dict[str, bytes]) -> FastAPI:
    app = FastAPI(title="floor")

    def answer(request: Request) -> Response:
        url = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return Response(bodies[url], media_type="application/json")

    for path in ("/healthz", "/v1/jobs", "/v1/jobs/{namespace}/{name}", "/v1/jobs/{namespace}/{name}/events",
                 "/v1/jobs/{namespace}/{name}/timeline"):
        app.add_api_route(path, answer, methods=["GET"])
    return app


def render(app: FastAPI, urls: list[str], token: str) -> dict[str, bytes]:
    """Each distinct URL's response body from our app (in process), for the peer to replay."""
    from fastapi.testclient import TestClient

    bodies: dict[str, bytes] = {}
    with TestClient(app) as client:
        for url in dict.fromkeys(urls):
            resp = client.get(url, headers={"Authorization": f"Bearer {token}"})
            if resp.status_code != 200:
                raise RuntimeError(f"{url}: {resp.status_code} {resp.text[:200]}")
            bodies[url] = resp.content
    return bodies


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("ours", "peer"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--urls", help="peer: JSON list of the workload's URLs")
    args = parser.parse_args(argv)
    app: Any = ours(args.jobs, args.token_file, args.seed)
    if args.kind == "peer":
        with open(args.urls) as f:
            urls = json.load(f)
        token = next(iter(TokenFileAuth.from_file(args.token_file).tokens))
        app = peer(render(app, urls, token))
    # No access log on either: a line per request would measure the terminal, not the server.
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
