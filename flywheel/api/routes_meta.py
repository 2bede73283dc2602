"""Probes and Prometheus: `/healthz`, `/readyz`, `/metrics`. No token needed (kubelet probes and the scraper)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from flywheel.api.schemas import Health

router = APIRouter(tags=["probes"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
async def readyz(request: Request) -> Any:
    src = getattr(request.app.state, "source", None)
    if src is None or not src.ready():
        return JSONResponse(Health(status="not ready", detail="job cache not synced").model_dump(), 503)
    return Health(status="ok")


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
async def metrics(request: Request) -> Response:
    state = request.app.state
    src = getattr(state, "source", None)
    state.metrics.cached_jobs.set(len(src.jobs()) if src is not None and src.ready() else 0)
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
