"""Fault schedule, injection and log reading for bench/goodput.py.

A rank process is a descendant of the launcher(s) named `fw-rank-<RANK>` (ours: forked by the warm-start zygote),
or whose environment has LOCAL_RANK while its parent's has not (a cold rank, the peer's: the elastic agent sets it
per rank; a rank's own helper processes inherit it, so they are excluded); its global rank is its RANK. A worker
(ours) is the `flywheel launch` agent: FLYWHEEL_REPLICA_INDEX set, LOCAL_RANK not.
"""

from __future__ import annotations

import random
import re
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from flywheel.eventlog import EventName, EventTail, Failure, Incident, Record, Start, Step, fold, read_records
from flywheel.local import procs

KINDS = ("kill", "hang", "lose-worker")


@dataclass(frozen=True)
class Planned:
    at_s: float  # seconds after the run's first step
    kind: str
    target: int  # global rank (kill, hang) or replica index (lose-worker)


def schedule(seed: int, period_s: float, horizon_s: float, world: int, replicas: int,
             mix: dict[str, float] | None = None) -> list[Planned]:
    """Faults at (k + 1/2) x period after the first step (rate 1/period), kinds and targets from a seeded RNG: the
    same seed gives both sides the same schedule."""
    rng = random.Random(seed)
    mix = mix or {"kill": 1.0}
    kinds, weights = list(mix), list(mix.values())
    out, k = [], 0
    while (k + 0.5) * period_s < horizon_s:
        kind = rng.choices(kinds, weights)[0]
        target = rng.randrange(replicas) if kind == "lose-worker" else rng.randrange(world)
        out.append(Planned((k + 0.5) * period_s, kind, target))
        k += 1
    return out


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return "X"
    return stat[stat.rfind(b")") + 2:].split()[0].decode()


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _is_warm_client(pid: int) -> bool:
    try:
        return b"flywheel.agent.warm" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def find_ranks(roots: list[int]) -> dict[int, int]:
    """{global rank: pid} of the live (not zombie, not stopped) rank processes below `roots`. A rank forked by a
    warm-start zygote (flywheel/agent/warm.py) is named `fw-rank-<RANK>`; its /proc environ is the zygote's, and
    the client the agent started for it is not the rank."""
    out: dict[int, int] = {}
    for root in roots:
        for pid in procs.descendants(root):
            if _state(pid) in ("Z", "X", "T", "t"):
                continue
            comm = _comm(pid)
            if comm.startswith("fw-rank-") and comm[8:].isdigit():
                out[int(comm[8:])] = pid
                continue
            env = _environ(pid)
            if "LOCAL_RANK" not in env or _is_warm_client(pid):
                continue
            try:
                ppid = int(Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if "LOCAL_RANK" not in _environ(ppid):
                out[int(env["RANK"])] = pid
    return out


def find_workers(roots: list[int]) -> dict[int, int]:
    """{replica index: agent pid} below `roots` (ours)."""
    out = {}
    for root in roots:
        for pid in procs.descendants(root):
            env = _environ(pid)
            if "FLYWHEEL_REPLICA_INDEX" in env and "LOCAL_RANK" not in env and _state(pid) not in ("Z", "X"):
                out[int(env["FLYWHEEL_REPLICA_INDEX"])] = pid
    return out


@dataclass
class Injector:
    """Carries a schedule out against a running side. Faults fire only while the group trains (a start after the
    previous fault and a step after that start), so a fault never lands inside the previous one's recovery; a late
    fault is recorded as late."""

    plan: list[Planned]
    events_file: Path
    roots: list[int]
    stop_at_step: int  # no faults once training got this far (the run is ending)
    fired: list[dict[str, Any]] = field(default_factory=list)
    first_step_time: float | None = None
    _halt: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Injector:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        tail = EventTail(self.events_file)
        last_start = last_step_time = None
        last_step = 0
        pending = list(self.plan)
        while pending and not self._halt.wait(0.05):
            for ev in self._new_records(tail):
                if isinstance(ev, Start):
                    last_start = ev.time
                elif isinstance(ev, Step):
                    last_step, last_step_time = ev.step, ev.time
                    if self.first_step_time is None:
                        self.first_step_time = ev.time
            if self.first_step_time is None or last_step >= self.stop_at_step:
                continue
            due = pending[0]
            if time.time() < self.first_step_time + due.at_s:
                continue
            # Trains again: a (re)start after the previous fault and a step after that start. A step logged after
            # the fault by the old group (in flight) does not count.
            since = max(last_start or 0.0, self.fired[-1]["time"] if self.fired else 0.0)
            restarted = not self.fired or (last_start is not None and last_start > self.fired[-1]["time"])
            if not (restarted and last_step_time is not None and last_step_time > since):
                continue
            victim = self._victim(due)
            if victim is None:
                continue
            pending.pop(0)
            sig = signal.SIGSTOP if due.kind == "hang" else signal.SIGKILL
            now = time.time()
            if due.kind == "lose-worker":
                procs.kill_tree(victim)
            else:
                procs.signal_quietly(victim, sig)
            self.fired.append({"kind": due.kind, "target": due.target, "pid": victim, "time": now,
                               "planned_s": due.at_s, "late_s": now - (self.first_step_time + due.at_s),
                               "step_at_fault": last_step})

    def _new_records(self, tail: EventTail) -> list[Record]:
        return tail.read_new()

    def _victim(self, due: Planned) -> int | None:
        if due.kind == "lose-worker":
            return find_workers(self.roots).get(due.target)
        return find_ranks(self.roots).get(due.target)


def stop_run(injector: Injector | None, popens: Sequence[subprocess.Popen]) -> float:
    """Stop the injector and every launcher with all it started; when the run ended (wall time)."""
    if injector:
        injector.stop()
    for p in popens:
        procs.kill_tree(p.pid)
        p.wait(timeout=10)
    return time.time()


# --- logs ----------------------------------------------------------------------------------------------------------
# torch.distributed.elastic's agent log lines: "E1122 15:46:59.745000 32339 path:line] message" (local time).
_TORCH_LINE = re.compile(r"^[IWE](\d\d)(\d\d) (\d\d):(\d\d):(\d\d(?:\.\d+)?) \d+ .*?\] (.*)$")
_FAILURE = ("failed (exitcode", "Worker group FAILED", "Worker group UNHEALTHY")


def agent_failure_times(logs: list[Path]) -> list[float]:
    """Wall times at which an elastic agent logged a failed rank (sorted)."""
    year = datetime.now().year
    out = []
    for path in logs:
        for line in path.read_text(errors="replace").splitlines() if path.exists() else ():
            m = _TORCH_LINE.match(line)
            if m and any(s in m.group(6) for s in _FAILURE):
                month, day, hour, minute, sec = m.groups()[:5]
                whole = int(float(sec))
                stamp = datetime(year, int(month), int(day), int(hour), int(minute), whole)
                out.append(stamp.timestamp() + float(sec) - whole)
    return sorted(out)


def read_events(path: Path) -> list[Record]:
    return read_records(path)


def _incident_at(incidents: list[Incident], t: float) -> Incident | None:
    """The incident a fault injected at `t` belongs to: the last one begun by then."""
    return next((i for i in reversed(incidents) if i.began <= t), None)


def analyse_faults(fired: list[dict[str, Any]], events: list[Record], failure_times: list[float],
                   extra_detections: Sequence[float] = ()) -> list[dict[str, Any]]:
    """Per fault: detection (fault -> first failure an agent or the trainer reported), and from the one fold of the
    log (flywheel/eventlog/fold.py) with the injected faults added as failure records at their times: restart
    (recovery time: fault -> first step of a group started after it), stall (last step before the fault -> that
    step) and lost steps (the steps reached before it that were trained again)."""
    injected = [Failure(f["time"], EventName.FAULT, f["kind"], "injected by the benchmark") for f in fired]
    log = fold(sorted([*events, *injected], key=lambda r: r.time), keep_attempts=False)
    detections = sorted([*failure_times, *extra_detections])
    rows = []
    for i, f in enumerate(fired):
        t = f["time"]
        until = fired[i + 1]["time"] if i + 1 < len(fired) else float("inf")
        detect = next((d for d in detections if t - 0.05 <= d < until), None)
        rows.append({**f, "detect_s": None if detect is None else detect - t,
                     **_recovery_columns(_incident_at(log.incidents, t))})
    return rows


def _recovery_columns(incident: Incident | None) -> dict[str, Any]:
    if incident is None:
        return {"restart_s": None, "stall_s": None, "restarts_until_next_step": 0, "lost_steps": None,
                "step_at_fault": 0, "resumed_from": None, "recovered_at": None}
    at, healthy = incident.recovered_at, incident.healthy_until
    return {"restart_s": incident.recovery_seconds, "recovered_at": at,
            "stall_s": None if at is None or healthy is None else at - healthy,
            "restarts_until_next_step": incident.starts,
            "lost_steps": None if at is None else incident.lost_steps,
            "step_at_fault": incident.step_at_failure, "resumed_from": incident.resumed_from}
