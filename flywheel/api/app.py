"""The ASGI app: `create_app(source, auth, actions)`, and `app` for `uvicorn flywheel.api.app:app`, which builds
its cluster cache from the environment when it starts (see `flywheel.api.server.from_env`).

Reads come from the JobSource (a watch-backed cache); actions go through `Actions` to the TrainingJob. Every
`/v1` endpoint needs `Authorization: Bearer <token>`; `/healthz`, `/readyz` and `/metrics` do not (probes and
Prometheus scrape them).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from flywheel import __version__
from flywheel.api import views
from flywheel.api.auth import Access, Auth, Principal
from flywheel.api.cache import JobSource
from flywheel.api.job_actions import ActionError, Actions
from flywheel.api.schemas import (
    ActionResult,
    ErrorBody,
    EventList,
    Health,
    JobDetail,
    JobList,
    JobSummary,
    Phase,
    ScaleRequest,
    Timeline,
)

MAX_PAGE = 500
DNS = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
Namespace = Annotated[str, Path(pattern=DNS, max_length=63)]
Name = Annotated[str, Path(pattern=DNS, max_length=63)]
ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "no or bad bearer token"},
    403: {"model": ErrorBody, "description": "the token's user may not do this"},
    503: {"model": ErrorBody, "description": "the cache has not synced yet"},
}
JOB_ERRORS = {**ERRORS, 404: {"model": ErrorBody, "description": "no such TrainingJob"}}

log = logging.getLogger(__name__)


class ApiError(HTTPException):
    def __init__(self, status: int, reason: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, detail, headers)
        self.reason = reason


def _state(request: Request) -> Any:
    state = request.app.state
    if getattr(state, "source", None) is None:
        raise ApiError(503, "NotReady", "the API has no job source yet (still starting)")
    return state


_bearer = HTTPBearer(auto_error=False, description="a Kubernetes bearer token (cluster) or one from the token file")


async def _off_loop(auth: Auth, fn: Callable[..., Any], *args: Any) -> Any:
    """Run an auth call: TokenReview/SubjectAccessReview block on the network, so those go to a worker thread;
    a token file (`blocking = False`) answers on the event loop. The reads are async handlers (they only read the
    in-memory cache) because the three thread hops of a sync one (dependency, handler, response check) were
    about 40% of a read's CPU (bench/api_latency.py); the actions, which call the Kubernetes API, stay sync."""
    if getattr(auth, "blocking", True):
        return await run_in_threadpool(fn, *args)
    return fn(*args)


async def _principal(request: Request,
                     creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)] = None) -> Principal:
    challenge = {"WWW-Authenticate": "Bearer"}
    if creds is None or not creds.credentials.strip():
        raise ApiError(401, "Unauthorized", "missing bearer token: send 'Authorization: Bearer <token>'", challenge)
    auth = _state(request).auth
    who = await _off_loop(auth, auth.authenticate, creds.credentials.strip())
    if who is None:
        raise ApiError(401, "Unauthorized", "the bearer token was not accepted (unknown, expired or revoked)",
                       challenge)
    return who


Who = Annotated[Principal, Depends(_principal)]


def _allow(request: Request, who: Principal, access: Access) -> None:
    _decide(who, access, *_state(request).auth.authorize(who, access))


async def _may_read(request: Request, who: Principal, access: Access) -> None:
    auth = _state(request).auth
    _decide(who, access, *await _off_loop(auth, auth.authorize, who, access))


def _decide(who: Principal, access: Access, allowed: bool, message: str) -> None:
    if not allowed:
        raise ApiError(403, "Forbidden", message or f"user {who.user!r} may not {access.verb} this TrainingJob")


def _job(request: Request, namespace: str, name: str) -> dict[str, Any]:
    state = _state(request)
    if not state.source.ready():
        raise ApiError(503, "NotReady", "the job cache has not synced with the Kubernetes API yet; retry")
    obj = state.source.job(namespace, name)
    if obj is None:
        raise ApiError(404, "NotFound", f"TrainingJob {namespace}/{name} not found")
    return obj


def _detail(request: Request, obj: dict[str, Any]) -> JobDetail:
    source = request.app.state.source
    meta = obj["metadata"]
    ns, name = meta.get("namespace", "default"), meta["name"]
    pods = source.pods(ns, name)
    raw = source.events(ns, {name, *(p["metadata"]["name"] for p in pods)})
    return views.detail(obj, pods, raw)


def _metrics(registry: CollectorRegistry) -> tuple[Counter, Histogram, Gauge]:
    return (Counter("flywheel_api_requests_total", "API requests", ["method", "route", "code"], registry=registry),
            Histogram("flywheel_api_request_seconds", "API request latency", ["route"], registry=registry),
            Gauge("flywheel_api_cache_jobs", "TrainingJobs in the API's cache", registry=registry))


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


def create_app(source: JobSource | None = None, auth: Auth | None = None, actions: Actions | None = None,
               startup: Callable[[FastAPI], Any] | None = None) -> FastAPI:
    """`startup(app)` (optional) fills app.state.source/auth/actions when the server starts, and may return a
    callable run at shutdown."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = startup(app) if startup is not None else None
        yield
        if callable(stop):
            stop()

    app = FastAPI(title="Flywheel status API", version=__version__, lifespan=lifespan,
                  description="Read TrainingJobs (watch-backed cache) and act on them through the Kubernetes API.")
    app.state.source, app.state.auth, app.state.actions = source, auth, actions
    app.state.registry = registry = CollectorRegistry()
    requests, latency, cached_jobs = _metrics(registry)
    memo: dict[int, tuple[dict[str, Any], JobSummary]] = {}

    def summaries(objs: list[dict[str, Any]]) -> list[JobSummary]:
        """One summary per cached job, built again only for objects the source replaced since the last list (a
        change is a new dict, never an edit in place): a list of 500 jobs then costs a lookup per job instead of
        a model build per job, which was most of the API's CPU under load (bench/api_latency.py). Holding the
        object in the memo keeps its id from being reused while the entry lives."""
        nonlocal memo
        fresh: dict[int, tuple[dict[str, Any], JobSummary]] = {}
        for obj in objs:
            hit = memo.get(id(obj))
            fresh[id(obj)] = hit if hit is not None and hit[0] is obj else (obj, views.summary(obj))
        memo = fresh  # lists run on the event loop, one at a time
        return [s for _, s in fresh.values()]

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, err: ApiError) -> JSONResponse:
        return JSONResponse({"detail": err.detail, "reason": err.reason}, err.status_code, headers=err.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, err: StarletteHTTPException) -> JSONResponse:
        # FastAPI's and Starlette's own errors (400 unparsable body, 404 unknown path, 405 wrong method) in the
        # documented ErrorBody shape too, with the reason spelled the Kubernetes way ("Bad Request" -> BadRequest).
        reason = HTTPStatus(err.status_code).phrase.title().replace(" ", "").replace("-", "")
        return JSONResponse({"detail": str(err.detail), "reason": reason}, err.status_code, headers=err.headers)

    app.add_middleware(_Metrics, requests=requests, latency=latency)

    @app.get("/healthz", response_model=Health, tags=["probes"])
    async def healthz() -> Health:
        return Health(status="ok")

    @app.get("/readyz", response_model=Health, tags=["probes"], responses={503: {"model": Health}})
    async def readyz(request: Request) -> Any:
        src = getattr(request.app.state, "source", None)
        if src is None or not src.ready():
            return JSONResponse(Health(status="not ready", detail="job cache not synced").model_dump(), 503)
        return Health(status="ok")

    @app.get("/metrics", tags=["probes"], response_class=Response,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
    async def metrics(request: Request) -> Response:
        src = getattr(request.app.state, "source", None)
        cached_jobs.set(len(src.jobs()) if src is not None and src.ready() else 0)
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/jobs", response_model=JobList, response_model_by_alias=True, tags=["read"], responses=ERRORS)
    async def list_jobs(request: Request, who: Who,
                        namespace: Annotated[str | None, Query(pattern=DNS, max_length=63)] = None,
                        phase: Phase | None = None,
                        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
                        offset: Annotated[int, Query(ge=0)] = 0) -> JobList:
        try:
            await _may_read(request, who, Access("list", namespace or ""))
        except ApiError as err:
            if namespace is None and err.status_code == 403:  # rights may be namespaced: say how to ask
                err.detail = f"{err.detail}; ask for one namespace with ?namespace=NS"
            raise
        state = _state(request)
        if not state.source.ready():
            raise ApiError(503, "NotReady", "the job cache has not synced with the Kubernetes API yet; retry")
        items = sorted(summaries(state.source.jobs()), key=lambda s: (s.namespace, s.name))
        items = [s for s in items if (namespace is None or s.namespace == namespace)
                 and (phase is None or s.phase == phase)]
        page = items[offset:offset + limit]
        more = offset + limit < len(items)
        return JobList(items=page, total=len(items), limit=limit, offset=offset,
                       next_offset=offset + limit if more else None)

    @app.get("/v1/jobs/{namespace}/{name}", response_model=JobDetail, tags=["read"], responses=JOB_ERRORS)
    async def get_job(request: Request, who: Who, namespace: Namespace, name: Name) -> JobDetail:
        await _may_read(request, who, Access("get", namespace, name))
        return _detail(request, _job(request, namespace, name))

    @app.get("/v1/jobs/{namespace}/{name}/events", response_model=EventList, tags=["read"], responses=JOB_ERRORS)
    async def job_events(request: Request, who: Who, namespace: Namespace, name: Name) -> EventList:
        await _may_read(request, who, Access("get", namespace, name))
        _job(request, namespace, name)
        source = request.app.state.source
        names = {name, *(p["metadata"]["name"] for p in source.pods(namespace, name))}
        return EventList(items=views.events(source.events(namespace, names)))

    @app.get("/v1/jobs/{namespace}/{name}/timeline", response_model=Timeline, tags=["read"], responses=JOB_ERRORS)
    async def job_timeline(request: Request, who: Who, namespace: Namespace, name: Name) -> Timeline:
        await _may_read(request, who, Access("get", namespace, name))
        obj = _job(request, namespace, name)
        return views.timeline(obj, request.app.state.source.events(namespace, {name}))

    def act(request: Request, who: Principal, namespace: str, name: str, action: str, subresource: str,
            do: Callable[[Actions], dict[str, Any]]) -> ActionResult:
        _allow(request, who, Access("patch", namespace, name, subresource))
        _job(request, namespace, name)  # a clear 404 before touching the API
        actions = request.app.state.actions
        if actions is None:
            raise ApiError(501, "NotImplemented", "this server is read-only (no actions configured)")
        try:
            updated = do(actions)
        except ActionError as err:
            log.info("%s %s/%s by %r refused: %s", action, namespace, name, who.user, err.message)
            raise ApiError(err.status, err.reason, err.message) from None
        # The Kubernetes audit log names the server's account (no impersonation, docs/api.md): name the caller here.
        log.info("%s %s/%s by %r", action, namespace, name, who.user)
        return ActionResult(action=action, job=_detail(request, updated))  # type: ignore[arg-type]

    ACT_ERRORS: dict[int | str, dict[str, Any]] = {
        **JOB_ERRORS, 409: {"model": ErrorBody, "description": "conflict (retry)"},
        501: {"model": ErrorBody, "description": "read-only server"}}

    @app.post("/v1/jobs/{namespace}/{name}/suspend", response_model=ActionResult, tags=["act"], responses=ACT_ERRORS)
    def suspend(request: Request, who: Who, namespace: Namespace, name: Name) -> ActionResult:
        return act(request, who, namespace, name, "suspend", "", lambda a: a.suspend(namespace, name, True))

    @app.post("/v1/jobs/{namespace}/{name}/resume", response_model=ActionResult, tags=["act"], responses=ACT_ERRORS)
    def resume(request: Request, who: Who, namespace: Namespace, name: Name) -> ActionResult:
        return act(request, who, namespace, name, "resume", "", lambda a: a.suspend(namespace, name, False))

    @app.post("/v1/jobs/{namespace}/{name}/restart", response_model=ActionResult, tags=["act"], responses=ACT_ERRORS)
    def restart(request: Request, who: Who, namespace: Namespace, name: Name) -> ActionResult:
        return act(request, who, namespace, name, "restart", "", lambda a: a.restart(namespace, name))

    @app.patch("/v1/jobs/{namespace}/{name}/scale", response_model=ActionResult, tags=["act"],
               responses={**ACT_ERRORS, 400: {"model": ErrorBody, "description": "the body is not JSON"},
                          422: {"description": "bad replicas (the field is named in detail[].loc)"}})
    def scale(request: Request, who: Who, namespace: Namespace, name: Name, body: ScaleRequest) -> ActionResult:
        _allow(request, who, Access("patch", namespace, name, "scale"))
        replicas = (_job(request, namespace, name).get("spec") or {}).get("replicas") or {}
        low, high = int(replicas.get("min", 1)), int(replicas.get("max", replicas.get("min", 1)))
        if not low <= body.replicas <= high:  # the CEL rule would refuse it too; name the field here
            raise RequestValidationError([{"type": "value_error", "loc": ("body", "replicas"), "input": body.replicas,
                                           "msg": f"replicas must lie within [min, max] = [{low}, {high}]"}])
        return act(request, who, namespace, name, "scale", "scale",
                   lambda a: a.scale(namespace, name, body.replicas))

    return app


def _from_env(app: FastAPI) -> Any:
    from flywheel.api.server import from_env  # the kubernetes client loads only when a server starts

    return from_env(app)


app = create_app(startup=_from_env)
