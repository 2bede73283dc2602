"""Where a test-cluster test's time went, for the message of a failed timing assertion: the job's records, its
Kubernetes events, its pods' log lines and the cluster's etcd warnings inside a window, merged on one clock (seconds
from a moment the caller names). A stall seen once in a loaded CI run is then explained by that run's own output."""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.operator.conftest import OpEnv

_PYTHON_LOG = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")  # logging's default asctime
_GLOG = re.compile(r"^[IWEF](\d{4}) (\d\d:\d\d:\d\d\.\d{6}) ")  # torch.distributed.elastic's own log lines
_NOISE = ("collective watchdog:", "INFO flywheel.trainer: step ")  # steps: from the records


def log_time(line: str) -> float | None:
    """The local-time stamp a pod log line starts with, as epoch seconds (None: no stamp)."""
    if m := _PYTHON_LOG.match(line):
        return datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
    if m := _GLOG.match(line):
        stamp = f"{time.localtime().tm_year}{m.group(1)} {m.group(2)}"
        return datetime.strptime(stamp, "%Y%m%d %H:%M:%S.%f").timestamp()
    return None


def _pod_lines(log_dir: Path, job: str, start: float, end: float) -> list[tuple[float, str]]:
    out = []
    for path in sorted(log_dir.glob(f"*_{job}-*.log")):
        pod = path.name.split("_")[1]
        for line in path.read_text(errors="replace").splitlines():
            at = log_time(line)
            if at is not None and start <= at <= end and not any(n in line for n in _NOISE):
                out.append((at, f"{pod}: {line[:220]}"))
    return out


def _etcd_lines(log: Path, start: float, end: float) -> list[tuple[float, str]]:
    """The test cluster's etcd warnings (zap JSON lines: slow applies, slow fdatasync, elections)."""
    out = []
    for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
        try:
            entry = json.loads(line)
            at = datetime.fromisoformat(str(entry["ts"]).replace("Z", "+00:00")).timestamp()
        except (ValueError, KeyError, TypeError):
            continue
        if start <= at <= end:
            out.append((at, f"etcd {entry.get('level')}: {entry.get('msg')} {entry.get('took', '')}"))
    return out


def _event_lines(events: list[dict[str, Any]], start: float, end: float) -> list[tuple[float, str]]:
    out = []
    for e in events:
        stamp = e.get("eventTime") or e.get("lastTimestamp") or e.get("firstTimestamp")
        if not stamp:
            continue
        at = datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
        if start - 1 <= at <= end + 1:  # event stamps may be whole seconds
            out.append((at, f"event (to the second) {e.get('reason')}: {str(e.get('message'))[:200]}"))
    return out


def _record_lines(records: list[dict[str, Any]], start: float, end: float) -> list[tuple[float, str]]:
    inside = [r for r in records if start <= r["time"] <= end]
    steps = [r for r in inside if r["event"] == "step"]
    edges = {id(r) for r in steps[:2] + steps[-2:]}
    for a, b in zip(steps, steps[1:]):
        if b["time"] - a["time"] > 0.5 or b["step"] != a["step"] + 1:
            edges |= {id(a), id(b)}
    return [(r["time"], f"record {r['event']} " + " ".join(f"{k}={v}" for k, v in r.items()
                                                         if k in ("step", "resumed_from", "restore_seconds",
                                                                  "world_size", "group", "rank")))
            for r in inside if r["event"] != "step" or id(r) in edges]


def timeline(env: OpEnv, job: str, start: float, end: float, zero: float | None = None) -> str:
    """What happened to `job` from `start` to `end` (epoch seconds), a line each, oldest first, in seconds from
    `zero` (default: `start`). Kubernetes events are stamped to the second."""
    lines = (_record_lines(env.records(job), start, end) + _event_lines(env.events_of(job), start, end)
             + _pod_lines(env.cluster.log_dir, job, start, end)
             + _etcd_lines(next((p for p in (env.cluster.work_dir / n for n in ("rendezvous-etcd.log", "etcd-data.log"))
                                 if p.exists()), env.cluster.work_dir / "etcd-data.log"), start, end))
    zero = start if zero is None else zero
    return "\n".join(f"{at - zero:+8.3f}s {text}" for at, text in sorted(lines))
