"""The ASGI app: `create_app(source, auth, actions)`, and `app` for `uvicorn flywheel.api.app:app`, which builds
its cluster cache from the environment when it starts (see `flywheel.api.server.from_env`).

Reads come from the JobSource (a watch-backed cache); actions go through `Actions` to the TrainingJob. Every
`/v1` endpoint needs `Authorization: Bearer <token>`; `/healthz`, `/readyz` and `/metrics` do not (probes and
Prometheus scrape them). The routes live in `routes_meta`, `routes_jobs` and `routes_actions`; what they share
(the problem error, auth dependencies) in `deps`.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.exceptions import HTTPException as StarletteHTTPException

from flywheel import __version__
from flywheel.api import routes_actions, routes_jobs, routes_meta
from flywheel.api.auth import Auth
from flywheel.api.cache import JobSource
from flywheel.api.deps import ProblemError
from flywheel.api.job_actions import Actions
from flywheel.api.progress_view import LiveSource


@dataclass(frozen=True)
class ApiMetrics:
    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    cached_jobs: Gauge

    @classmethod
    def create(cls) -> ApiMetrics:
        r = CollectorRegistry()
        return cls(r, Counter("flywheel_api_requests_total", "API requests", ["method", "route", "code"], registry=r),
                   Histogram("flywheel_api_request_seconds", "API request latency", ["route"], registry=r),
                   Gauge("flywheel_api_cache_jobs", "TrainingJobs in the API's cache", registry=r))


class _Metrics:
    """Counts and times every request by route template. A plain ASGI middleware rather than
    `@app.middleware("http")` (BaseHTTPMiddleware), which costs a task and a body stream per request: about a
    fifth of the app's CPU per read under load (bench/api_latency.py)."""

    def __init__(self, app: Any, requests: Counter, latency: Histogram) -> None:
        self.app, self.requests, self.latency = app, requests, latency

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, code = time.perf_counter(), 500  # 500: the app raised before answering

        async def send_status(message: Any) -> None:
            nonlocal code
            if message["type"] == "http.response.start":
                code = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")  # the router sets it on this same scope
            self.requests.labels(scope["method"], route, str(code)).inc()
            self.latency.labels(route).observe(time.perf_counter() - start)


async def _problem(_: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, ProblemError)
    return JSONResponse({"detail": err.detail, "reason": err.reason}, err.status_code, headers=err.headers)


async def _http_error(_: Request, err: Exception) -> JSONResponse:
    """FastAPI's and Starlette's own errors (400 unparsable body, 404 unknown path, 405 wrong method) in the
    documented ErrorBody shape too, with the reason spelled the Kubernetes way ("Bad Request" -> BadRequest)."""
    assert isinstance(err, StarletteHTTPException)
    reason = HTTPStatus(err.status_code).phrase.title().replace(" ", "").replace("-", "")
    return JSONResponse({"detail": str(err.detail), "reason": reason}, err.status_code, headers=err.headers)


def create_app(source: JobSource | None = None, auth: Auth | None = None, actions: Actions | None = None,
               startup: Callable[[FastAPI], Any] | None = None, progress: LiveSource | None = None) -> FastAPI:
    """`startup(app)` (optional; a coroutine function or a plain one) fills app.state.source/auth/actions (and
    progress) when the server starts, on its event loop, and may return a callable (or coroutine function) run at
    shutdown. `progress`: the etcd progress of running jobs (api/progress.py); None: the
    TrainingJob status alone."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = startup(app) if startup is not None else None
        if inspect.isawaitable(stop):
            stop = await stop
        yield
        if callable(stop):
            done = stop()
            if inspect.isawaitable(done):
                await done

    app = FastAPI(title="Flywheel status API", version=__version__, lifespan=lifespan,
                  description="Read TrainingJobs (watch-backed cache) and act on them through the Kubernetes API.")
    app.state.source, app.state.auth, app.state.actions = source, auth, actions
    app.state.progress = progress
    app.state.metrics = metrics = ApiMetrics.create()
    app.state.summary_memo = routes_jobs.SummaryMemo()
    app.add_exception_handler(ProblemError, _problem)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_middleware(_Metrics, requests=metrics.requests, latency=metrics.latency)
    for module in (routes_meta, routes_jobs, routes_actions):
        app.include_router(module.router)
    return app


def _from_env(app: FastAPI) -> Any:
    from flywheel.api.server import from_env  # the Kubernetes client loads only when a server starts

    return from_env(app)


app = create_app(startup=_from_env)
