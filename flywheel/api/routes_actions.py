"""The actions: suspend, resume, restart, scale. Async handlers: they await the Kubernetes API through `Actions`.
Each needs `patch` on the TrainingJob (the scale subresource for scale)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError

from flywheel.api.auth import Access, Principal
from flywheel.api.deps import JOB_ERRORS, Name, Namespace, ProblemError, Who, allow, detail, job
from flywheel.api.job_actions import ActionError, Actions
from flywheel.api.schemas import ActionResult, ErrorBody, ScaleRequest

ACT_ERRORS: dict[int | str, dict[str, Any]] = {
    **JOB_ERRORS, 409: {"model": ErrorBody, "description": "conflict (retry)"},
    501: {"model": ErrorBody, "description": "read-only server"}}
SCALE_ERRORS: dict[int | str, dict[str, Any]] = {
    **ACT_ERRORS, 400: {"model": ErrorBody, "description": "the body is not JSON"},
    422: {"description": "bad replicas (the field is named in detail[].loc)"}}

router = APIRouter(prefix="/v1/jobs/{namespace}/{name}", tags=["act"])
log = logging.getLogger(__name__)


async def act(request: Request, who: Principal, namespace: str, name: str, action: str, subresource: str,
              do: Callable[[Actions], Awaitable[dict[str, Any]]]) -> ActionResult:
    await allow(request, who, Access("patch", namespace, name, subresource))
    job(request, namespace, name)  # a clear 404 before touching the API
    actions = request.app.state.actions
    if actions is None:
        raise ProblemError(501, "NotImplemented", "this server is read-only (no actions configured)")
    try:
        updated = await do(actions)
    except ActionError as err:
        log.info("%s %s/%s by %r refused: %s", action, namespace, name, who.user, err.message)
        raise ProblemError(err.status, err.reason, err.message) from None
    # The Kubernetes audit log names the server's account (no impersonation, docs/api.md): name the caller here.
    log.info("%s %s/%s by %r", action, namespace, name, who.user)
    return ActionResult(action=action, job=detail(request, updated))


@router.post("/suspend", response_model=ActionResult, responses=ACT_ERRORS)
async def suspend(request: Request, who: Who, namespace: Namespace, name: Name) -> ActionResult:
    return await act(request, who, namespace, name, "suspend", "", lambda a: a.suspend(namespace, name, True))


@router.post("/resume", response_model=ActionResult, responses=ACT_ERRORS)
async def resume(request: Request, who: Who, namespace: Namespace, name: Name) -> ActionResult:
    return await act(request, who, namespace, name, "resume", "", lambda a: a.suspend(namespace, name, False))


@router.post("/restart", response_model=ActionResult, responses=ACT_ERRORS)
async def restart(request: Request, who: Who, namespace: Namespace, name: Name) -> ActionResult:
    return await act(request, who, namespace, name, "restart", "", lambda a: a.restart(namespace, name))


@router.patch("/scale", response_model=ActionResult, responses=SCALE_ERRORS)
async def scale(request: Request, who: Who, namespace: Namespace, name: Name, body: ScaleRequest) -> ActionResult:
    await allow(request, who, Access("patch", namespace, name, "scale"))
    replicas = (job(request, namespace, name).get("spec") or {}).get("replicas") or {}
    low, high = int(replicas.get("min", 1)), int(replicas.get("max", replicas.get("min", 1)))
    if not low <= body.replicas <= high:  # the CEL rule would refuse it too; name the field here
        raise RequestValidationError([{"type": "value_error", "loc": ("body", "replicas"), "input": body.replicas,
                                       "msg": f"replicas must lie within [min, max] = [{low}, {high}]"}])
    return await act(request, who, namespace, name, "scale", "scale", lambda a: a.scale(namespace, name, body.replicas))
