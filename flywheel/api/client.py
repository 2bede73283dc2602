"""`flywheel status`: read the REST API with httpx and print a table (or the JSON as served)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from flywheel.api.server import DEFAULT_PORT
from flywheel.contracts.timefmt import parse_rfc3339

DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"


class StatusError(Exception):
    pass


@dataclass
class StatusOptions:
    job: str | None = None  # NAME (with namespace) or NAMESPACE/NAME
    namespace: str | None = None
    phase: str | None = None
    server: str | None = None
    token: str | None = None
    token_file: str | None = None
    output: str = "table"


def _token(opts: StatusOptions) -> str:
    if opts.token:
        return opts.token
    path = opts.token_file
    if path:
        try:
            return Path(path).read_text().strip().splitlines()[0].strip()
        except (OSError, IndexError) as err:
            raise StatusError(f"--token-file {path}: cannot read a token ({err})") from None
    token = os.environ.get("FLYWHEEL_API_TOKEN", "")
    if not token:
        raise StatusError("no token: pass --token or --token-file, or set FLYWHEEL_API_TOKEN")
    return token


def fetch(opts: StatusOptions, transport: httpx.BaseTransport | None = None) -> dict[str, Any]:
    base = (opts.server or os.environ.get("FLYWHEEL_API_URL") or DEFAULT_URL).rstrip("/")
    if opts.job:
        ns, _, name = opts.job.rpartition("/")
        path, params = f"/v1/jobs/{ns or opts.namespace or 'default'}/{name}", {}
    else:
        path = "/v1/jobs"
        params = {k: v for k, v in (("namespace", opts.namespace), ("phase", opts.phase)) if v}
    headers = {"Authorization": f"Bearer {_token(opts)}"}
    items: list[dict[str, Any]] = []
    with httpx.Client(base_url=base, headers=headers, timeout=10.0, transport=transport) as http:
        offset: int | None = 0
        while offset is not None:  # follow the pages of a list; a single job is one request
            try:
                resp = http.get(path, params={**params, **({"offset": offset} if not opts.job else {})})
            except httpx.HTTPError as err:
                raise StatusError(f"cannot reach the Flywheel API at {base}: {err}") from None
            if resp.status_code != 200:
                raise StatusError(f"{resp.status_code} from {base}{path}: {_message(resp)}")
            body = resp.json()
            if opts.job:
                return dict(body)
            items += body["items"]
            offset = body.get("nextOffset")
    return {"items": items, "total": len(items)}


def _message(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail")
    except ValueError:
        return resp.text[:200]
    if isinstance(detail, list):  # 422: name each field
        return "; ".join(f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}" for d in detail)
    return str(detail)


def _age(created: str | None) -> str:
    if not created:
        return ""
    seconds = int(time.time() - (parse_rfc3339(created) or 0.0))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def render(body: dict[str, Any], output: str) -> Any:
    """JSON text, or a rich renderable (a table, or a group of tables for one job)."""
    if output == "json":
        return json.dumps(body, indent=2)
    from rich.console import Group
    from rich.table import Table

    if "items" in body:
        table = Table(box=None)
        for col in ("NAMESPACE", "NAME", "PHASE", "READY", "DESIRED", "STEP", "RESTARTS", "AGE"):
            table.add_column(col)
        for j in body["items"]:
            table.add_row(j["namespace"], j["name"], j["phase"], str(j["replicas"]["ready"]),
                          str(j["replicas"]["desired"]), str(j["step"]), str(j["restarts"]), _age(j.get("created")))
        return table
    head = Table(box=None, show_header=False)
    ckpt, goodput, restarts = body["lastCheckpoint"], body["goodput"], body["restarts"]
    for key, value in (("job", f"{body['namespace']}/{body['name']}"), ("phase", body["phase"]),
                       ("replicas", (f"{body['replicas']['ready']}/{body['replicas']['desired']} ready, "
                                     f"world size {body['worldSize']}")),
                       ("step", f"{body['step']} of {body['spec']['steps']}"),
                       ("restarts", f"{restarts['count']} (last: {restarts['lastReason'] or '-'})"),
                       ("checkpoint", f"step {ckpt['step']} {ckpt['path']}" if ckpt["step"] else "-"),
                       ("goodput", f"{goodput['ratio']:.2f}, {goodput['lostSteps']} lost steps")):
        head.add_row(key, value)
    workers = Table(title="workers", box=None)
    for col in ("INDEX", "POD", "RANKS", "PHASE", "READY", "NODE", "EXIT"):
        workers.add_column(col)
    for w in body["workers"]:
        workers.add_row(str(w["index"]), w["pod"], f"{w['firstRank']}-{w['lastRank']}", w["phase"],
                        "yes" if w["ready"] else "no", w["node"], "" if w["exitCode"] is None else str(w["exitCode"]))
    conditions = Table(title="conditions", box=None)
    for col in ("TYPE", "STATUS", "REASON", "MESSAGE"):
        conditions.add_column(col)
    for c in body["conditions"]:
        conditions.add_row(c["type"], c["status"], c.get("reason", ""), c.get("message", ""))
    return Group(head, workers, conditions)
