"""What a worker pod's status says of its containers (pure): the worker container's end or wait, or the
template's init container that holds it back. The operator's pod view (operator/manifests.py) and the REST API's
worker view (api/views.py) both read pods through it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from flywheel.contracts.timefmt import parse_rfc3339
from flywheel.spec.pod_template import WORKER_CONTAINER


class ContainerOutcome(NamedTuple):
    reason: str | None  # the container's terminated/waiting reason, else the pod's
    exit_code: int | None
    finished_at: float | None
    message: str | None  # its termination message's last line, or why it waits
    waiting_since: float | None  # never started: waiting since the kubelet took the pod
    init_container: str | None  # the init container it is about, when one holds the pod back


def container_outcome(obj: Mapping[str, Any]) -> ContainerOutcome:
    """The worker container's end or wait, or, while an init container from the template holds the pod back (it
    failed, or cannot start), that container's (`init_container` names it)."""
    meta, status = obj["metadata"], obj.get("status") or {}
    reason, code, finished, message, waiting_since = status.get("reason"), None, None, None, None
    statuses = status.get("containerStatuses") or []
    # With sidecars from the template, the worker container's state is the pod's (not a sidecar's).
    for cs in [c for c in statuses if c.get("name") == WORKER_CONTAINER] or statuses:
        state = cs.get("state") or {}
        if "terminated" in state:
            reason, code = state["terminated"].get("reason") or reason, state["terminated"].get("exitCode")
            finished = parse_rfc3339(state["terminated"].get("finishedAt"))
            message = exit_message(state["terminated"].get("message"))
        elif "waiting" in state:
            reason = state["waiting"].get("reason") or reason
            message = state["waiting"].get("message") or None
            # Never started (restartPolicy Never): waiting since the kubelet took the pod (its startTime).
            if "lastState" not in cs or not (cs.get("lastState") or {}).get("terminated"):
                waiting_since = (parse_rfc3339(status.get("startTime"))
                                 or parse_rfc3339(meta.get("creationTimestamp")))
    held = _holding_init_container(obj) if reason in (None, "PodInitializing") else None
    if held is not None:
        name, state = held
        if "terminated" in state:
            ended = state["terminated"]
            said = exit_message(ended.get("message"))
            return ContainerOutcome(ended.get("reason") or reason, ended.get("exitCode"),
                                    parse_rfc3339(ended.get("finishedAt")),
                                    f"init container {name} failed" + (f": {said}" if said else ""), None, name)
        waiting = state["waiting"]
        said = waiting.get("message") or waiting["reason"]
        return ContainerOutcome(waiting["reason"], None, None, f"init container {name}: {said}", waiting_since, name)
    return ContainerOutcome(reason, code, finished, message, waiting_since, None)


def _holding_init_container(obj: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The first init container that holds the pod back for a reason (failed, or waiting other than in
    PodInitializing): its name and state; None while they run or once done."""
    inits = (obj.get("spec") or {}).get("initContainers") or []
    sidecars = {c.get("name") for c in inits if c.get("restartPolicy") == "Always"}
    for cs in (obj.get("status") or {}).get("initContainerStatuses") or []:
        state = cs.get("state") or {}
        ended, waiting = state.get("terminated"), state.get("waiting") or {}
        if (ended is not None and ended.get("exitCode") == 0) or (cs.get("name") in sidecars and cs.get("started")):
            continue
        if ended is not None or waiting.get("reason") not in (None, "", "PodInitializing"):
            return str(cs.get("name")), state
        return None
    return None


def exit_message(text: str | None, limit: int = 500) -> str | None:
    """The reason a container gave for its exit: the last non-blank line of its termination message (the worker's
    one line, or the last line of the log tail the kubelet fell back to)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1][:limit] if lines else None
