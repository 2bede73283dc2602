"""What every route shares: the problem error (the documented ErrorBody answer), path parameter types, the
documented error responses, and the dependencies that authenticate the caller, check its rights and find a job."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from flywheel.api import views
from flywheel.api.auth import Access, Principal
from flywheel.api.schemas import ErrorBody, JobDetail

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
NOT_SYNCED = "the job cache has not synced with the Kubernetes API yet; retry"


class ProblemError(HTTPException):
    """An HTTP error the app answers in the documented ErrorBody shape: `{"detail": ..., "reason": ...}`, with the
    reason spelled the Kubernetes way (Unauthorized, Forbidden, NotFound, ...)."""

    def __init__(self, status: int, reason: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(status, detail, headers)
        self.reason = reason


def state(request: Request) -> Any:
    app_state = request.app.state
    if getattr(app_state, "source", None) is None:
        raise ProblemError(503, "NotReady", "the API has no job source yet (still starting)")
    return app_state


_bearer = HTTPBearer(auto_error=False, description="a Kubernetes bearer token (cluster) or one from the token file")


async def _principal(request: Request,
                     creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)] = None) -> Principal:
    challenge = {"WWW-Authenticate": "Bearer"}
    if creds is None or not creds.credentials.strip():
        raise ProblemError(401, "Unauthorized", "missing bearer token: send 'Authorization: Bearer <token>'",
                           challenge)
    auth = state(request).auth
    who: Principal | None = await auth.authenticate(creds.credentials.strip())
    if who is None:
        raise ProblemError(401, "Unauthorized", "the bearer token was not accepted (unknown, expired or revoked)",
                           challenge)
    return who


Who = Annotated[Principal, Depends(_principal)]


async def allow(request: Request, who: Principal, access: Access) -> None:
    """The handlers are all async, on the event loop: the reads only read the in-memory cache (the thread hops of a
    sync handler were about 40% of a read's CPU, bench/api_latency.py), and auth and actions await the Kubernetes
    API through the async client."""
    _decide(who, access, *await state(request).auth.authorize(who, access))


def _decide(who: Principal, access: Access, allowed: bool, message: str) -> None:
    if not allowed:
        raise ProblemError(403, "Forbidden", message or f"user {who.user!r} may not {access.verb} this TrainingJob")


def job(request: Request, namespace: str, name: str) -> dict[str, Any]:
    app_state = state(request)
    if not app_state.source.ready():
        raise ProblemError(503, "NotReady", NOT_SYNCED)
    obj: dict[str, Any] | None = app_state.source.job(namespace, name)
    if obj is None:
        raise ProblemError(404, "NotFound", f"TrainingJob {namespace}/{name} not found")
    return obj


def detail(request: Request, obj: dict[str, Any]) -> JobDetail:
    source = request.app.state.source
    meta = obj["metadata"]
    ns, name = meta.get("namespace", "default"), meta["name"]
    pods = source.pods(ns, name)
    raw = source.events(ns, {name, *(p["metadata"]["name"] for p in pods)})
    progress = request.app.state.progress  # api/progress.py, with etcd endpoints only
    return views.detail(obj, pods, raw, progress.live(obj) if progress is not None else None)
