"""The reads: list jobs, one job, its events, its timeline. Async handlers: they only read the in-memory cache."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from flywheel.api import views
from flywheel.api.auth import Access
from flywheel.api.deps import (
    DNS,
    ERRORS,
    JOB_ERRORS,
    MAX_PAGE,
    NOT_SYNCED,
    Name,
    Namespace,
    ProblemError,
    Who,
    allow,
    detail,
    job,
    state,
)
from flywheel.api.schemas import EventList, JobDetail, JobList, JobSummary, Phase, Timeline

router = APIRouter(prefix="/v1/jobs", tags=["read"])


class SummaryMemo:
    """One summary per cached job, built again only for objects the source replaced since the last list (a change
    is a new dict, never an edit in place): a list of 500 jobs then costs a lookup per job instead of a model
    build per job, which was most of the API's CPU under load (bench/api_latency.py). Holding the object in the
    memo keeps its id from being reused while the entry lives. Lists run on the event loop, one at a time."""

    def __init__(self) -> None:
        self._memo: dict[int, tuple[dict[str, Any], JobSummary]] = {}

    def summaries(self, objs: list[dict[str, Any]]) -> list[JobSummary]:
        fresh: dict[int, tuple[dict[str, Any], JobSummary]] = {}
        for obj in objs:
            hit = self._memo.get(id(obj))
            fresh[id(obj)] = hit if hit is not None and hit[0] is obj else (obj, views.summary(obj))
        self._memo = fresh
        return [s for _, s in fresh.values()]


@router.get("", response_model=JobList, response_model_by_alias=True, responses=ERRORS)
async def list_jobs(request: Request, who: Who,
                    namespace: Annotated[str | None, Query(pattern=DNS, max_length=63)] = None,
                    phase: Phase | None = None,
                    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
                    offset: Annotated[int, Query(ge=0)] = 0) -> JobList:
    try:
        await allow(request, who, Access("list", namespace or ""))
    except ProblemError as err:
        if namespace is None and err.status_code == 403:  # rights may be namespaced: say how to ask
            err.detail = f"{err.detail}; ask for one namespace with ?namespace=NS"
        raise
    app_state = state(request)
    if not app_state.source.ready():
        raise ProblemError(503, "NotReady", NOT_SYNCED)
    objs = app_state.source.jobs()
    items = app_state.summary_memo.summaries(objs)
    progress = app_state.progress  # api/progress.py, with etcd endpoints only
    if progress is not None:
        items = [views.with_live_step(s, progress.live_step(o)) for s, o in zip(items, objs, strict=True)]
    items = sorted(items, key=lambda s: (s.namespace, s.name))
    items = [s for s in items if (namespace is None or s.namespace == namespace)
             and (phase is None or s.phase == phase)]
    page = items[offset:offset + limit]
    more = offset + limit < len(items)
    return JobList(items=page, total=len(items), limit=limit, offset=offset,
                   next_offset=offset + limit if more else None)


@router.get("/{namespace}/{name}", response_model=JobDetail, responses=JOB_ERRORS)
async def get_job(request: Request, who: Who, namespace: Namespace, name: Name) -> JobDetail:
    await allow(request, who, Access("get", namespace, name))
    return detail(request, job(request, namespace, name))


@router.get("/{namespace}/{name}/events", response_model=EventList, responses=JOB_ERRORS)
async def job_events(request: Request, who: Who, namespace: Namespace, name: Name) -> EventList:
    await allow(request, who, Access("get", namespace, name))
    job(request, namespace, name)
    source = request.app.state.source
    names = {name, *(p["metadata"]["name"] for p in source.pods(namespace, name))}
    return EventList(items=views.events(source.events(namespace, names)))


@router.get("/{namespace}/{name}/timeline", response_model=Timeline, responses=JOB_ERRORS)
async def job_timeline(request: Request, who: Who, namespace: Namespace, name: Name) -> Timeline:
    await allow(request, who, Access("get", namespace, name))
    obj = job(request, namespace, name)
    return views.timeline(obj, request.app.state.source.events(namespace, {name}))
