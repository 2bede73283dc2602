"""Server-side printing: meta.k8s.io/v1 Table answers for `kubectl get`, with CRD additionalPrinterColumns
(simple JSONPath), the pod and node columns kubectl users expect, and Name/Age for everything else."""

from __future__ import annotations

import datetime
import re
from typing import Any

from tests.k8s_emulator import deployments, pdb
from tests.k8s_emulator.resources import ResourceType

_STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]|\[\?\(@\.([A-Za-z0-9_.-]+)\s*==\s*['\"]([^'\"]*)['\"]\)\]")


def json_path(obj: Any, path: str) -> Any:
    """Evaluate `.a.b[0].c` and `.items[?(@.type=="Ready")].status` (the forms printer columns use)."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    node, pos = obj, 0
    while pos < len(path) and node is not None:
        match = _STEP.match(path, pos)
        if not match:
            return None
        pos = match.end()
        field, index, filter_key, filter_value = match.groups()
        if field is not None:
            node = node.get(field) if isinstance(node, dict) else None
        elif index is not None:
            node = node[int(index)] if isinstance(node, list) and int(index) < len(node) else None
        else:
            node = next((item for item in node or [] if isinstance(item, dict)
                         and str(json_path(item, "." + filter_key)) == filter_value), None)
    return node


def human_duration(since: str | None) -> str:
    """kube's duration.HumanDuration of the time since an RFC 3339 timestamp."""
    if not since:
        return "<unknown>"
    try:
        moment = datetime.datetime.fromisoformat(since.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    seconds = int((datetime.datetime.now(datetime.UTC) - moment).total_seconds())
    if seconds < 0:
        return "<invalid>"
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    return f"{days}d" if days < 365 * 2 else f"{days // 365}y"


def _column(name: str, kind: str = "string", priority: int = 0, description: str = "") -> dict[str, Any]:
    return {"name": name, "type": kind, "format": "name" if name == "Name" else "", "description": description,
            "priority": priority}


def _pod_cells(pod: dict[str, Any]) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    shown = status.get("reason") or status.get("phase") or "Pending"
    initializing = _init_status(spec, status)
    for container in statuses if initializing is None else []:
        state = container.get("state") or {}
        reason = (state.get("waiting") or {}).get("reason") or (state.get("terminated") or {}).get("reason")
        if reason:
            shown = reason
    shown = initializing or shown
    if pod["metadata"].get("deletionTimestamp"):
        shown = "Terminating"
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    return [pod["metadata"]["name"], f"{ready}/{len(spec.get('containers') or [])}", shown, restarts,
            human_duration(pod["metadata"].get("creationTimestamp")), status.get("podIP") or "<none>",
            spec.get("nodeName") or "<none>"]


def _init_status(spec: dict[str, Any], status: dict[str, Any]) -> str | None:
    """kubectl's STATUS while init containers hold the pod: `Init:<reason>` for one that failed or cannot start,
    else `Init:<done>/<all>`; None once they are done (completed, or sidecars started)."""
    inits = spec.get("initContainers") or []
    sidecars = {c.get("name") for c in inits if c.get("restartPolicy") == "Always"}
    for i, container in enumerate(status.get("initContainerStatuses") or []):
        state = container.get("state") or {}
        ended, waiting = state.get("terminated"), state.get("waiting") or {}
        if ended is not None and ended.get("exitCode") == 0:
            continue
        if container.get("name") in sidecars and container.get("started"):
            continue
        if ended is not None:
            return "Init:" + (ended.get("reason") or f"ExitCode:{ended.get('exitCode')}")
        if waiting.get("reason") and waiting["reason"] != "PodInitializing":
            return "Init:" + waiting["reason"]
        return f"Init:{i}/{len(inits)}"
    return None


def _node_cells(node: dict[str, Any]) -> list[Any]:
    conditions = {c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or []}
    ready = {"True": "Ready", "False": "NotReady"}.get(conditions.get("Ready", ""), "Unknown")
    if (node.get("spec") or {}).get("unschedulable"):
        ready += ",SchedulingDisabled"
    version = ((node.get("status") or {}).get("nodeInfo") or {}).get("kubeletVersion", "")
    return [node["metadata"]["name"], ready, "<none>", human_duration(node["metadata"].get("creationTimestamp")),
            version]


def columns_and_cells(rt: ResourceType, version: str):
    """(column definitions, function obj -> cells) for a resource type."""
    if rt.key == ("", "pods"):
        columns = [_column("Name"), _column("Ready"), _column("Status"), _column("Restarts", "integer"),
                   _column("Age"), _column("IP", priority=1), _column("Node", priority=1)]
        return columns, _pod_cells
    if rt.key == ("", "nodes"):
        return [_column("Name"), _column("Status"), _column("Roles"), _column("Age"), _column("Version")], _node_cells
    if rt.key == deployments.DEPLOYMENTS:
        return [_column(n, k) for n, k in deployments.TABLE_COLUMNS], lambda obj: deployments.table_cells(
            obj, human_duration(obj["metadata"].get("creationTimestamp")))
    if rt.key == pdb.PDBS:
        return [_column(n, k) for n, k in pdb.TABLE_COLUMNS], lambda obj: pdb.table_cells(
            obj, human_duration(obj["metadata"].get("creationTimestamp")))
    if rt.key == ("scheduling.k8s.io", "priorityclasses"):  # a Go bool: printed false when omitted
        return [_column("Name"), _column("Value", "integer"), _column("Global-Default", "boolean"), _column("Age"),
                _column("PreemptionPolicy")], lambda obj: [
            obj["metadata"]["name"], obj.get("value", 0), bool(obj.get("globalDefault")),
            human_duration(obj["metadata"].get("creationTimestamp")), obj.get("preemptionPolicy", "")]
    if rt.printer_columns:  # a CRD's additionalPrinterColumns, or a built-in's (resources.py)
        printer = rt.printer_columns

        def custom_cells(obj: dict[str, Any]) -> list[Any]:
            cells: list[Any] = [obj["metadata"]["name"]]
            for column in printer:
                value = json_path(obj, column.get("jsonPath", ""))
                if column.get("type") == "date" and value is not None:
                    value = human_duration(str(value))
                cells.append(value)
            return cells

        columns = [_column("Name", description="Name must be unique within a namespace.")] + [
            _column(c["name"], c.get("type", "string"), int(c.get("priority", 0)), c.get("description", ""))
            for c in printer]
        return columns, custom_cells
    return [_column("Name"), _column("Age")], lambda obj: [obj["metadata"]["name"],
                                                           human_duration(obj["metadata"].get("creationTimestamp"))]


def to_table(rt: ResourceType, version: str, objects: list[dict[str, Any]], resource_version: str,
             include_object: str = "Metadata") -> dict[str, Any]:
    columns, cells = columns_and_cells(rt, version)
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": cells(obj)}
        if include_object == "Object":
            row["object"] = obj
        elif include_object != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": obj["metadata"]}
        rows.append(row)
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": columns, "rows": rows}
