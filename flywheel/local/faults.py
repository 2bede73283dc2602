"""`--fault` flags of `flywheel run` (docs/contracts.md, "Injected faults").

`kill:rank=R:step=S` and `hang:rank=R:step=S` are fired by the trainer (handed over in FLYWHEEL_FAULTS);
`lose-worker:replica=I:step=S` is carried out by the supervisor, which SIGKILLs worker I's whole process tree once
the event log shows step S.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

RANK_FAULT_KINDS = ("kill", "hang")
WORKER_FAULT_KINDS = ("lose-worker",)
_TARGET = {"kill": "rank", "hang": "rank", "lose-worker": "replica"}


class FaultFlagError(ValueError):
    pass


@dataclass(frozen=True)
class LoseWorker:
    """Kill worker `replica` (agent and ranks) once training reached `step`."""

    id: str
    replica: int
    step: int


def parse_fault(flag: str, fault_id: str) -> dict[str, object]:
    """One `--fault` flag -> {"id", "kind", "rank"|"replica", "step"}; raises FaultFlagError naming the problem."""
    kind, *fields = flag.strip().split(":")
    if kind not in _TARGET:
        raise FaultFlagError(f"--fault {flag!r}: unknown kind {kind!r}; use one of {', '.join(_TARGET)}")
    values: dict[str, int] = {}
    for item in fields:
        key, sep, raw = item.partition("=")
        if not sep or key not in (_TARGET[kind], "step"):
            raise FaultFlagError(f"--fault {flag!r}: {item!r} is not {_TARGET[kind]}=N or step=N")
        if key in values:
            raise FaultFlagError(f"--fault {flag!r}: {key} given twice")
        try:
            values[key] = int(raw)
        except ValueError:
            raise FaultFlagError(f"--fault {flag!r}: {key}={raw!r} is not an integer") from None
        if values[key] < (1 if key == "step" else 0):
            raise FaultFlagError(f"--fault {flag!r}: {key} must be {'>= 1' if key == 'step' else '>= 0'}")
    missing = [k for k in (_TARGET[kind], "step") if k not in values]
    if missing:
        raise FaultFlagError(f"--fault {flag!r}: missing {' and '.join(missing)}; e.g. "
                             f"{kind}:{_TARGET[kind]}=0:step=5")
    return {"id": fault_id, "kind": kind, **values}


def parse_faults(flags: Iterable[str]) -> list[dict[str, object]]:
    """All `--fault` flags, with ids f0, f1, ... in the order given (the trainer's once-only markers use them)."""
    return [parse_fault(flag, f"f{i}") for i, flag in enumerate(flags)]


def check_targets(faults: Iterable[dict[str, object]], replicas: int, world_size: int) -> None:
    """Faults must name a rank/replica that exists in the planned world."""
    for f in faults:
        key, limit = ("rank", world_size) if f["kind"] in RANK_FAULT_KINDS else ("replica", replicas)
        if int(f[key]) >= limit:  # type: ignore[call-overload]
            raise FaultFlagError(f"--fault {f['kind']}: {key}={f[key]} does not exist ({key}s are 0..{limit - 1})")


def worker_faults(faults: Iterable[dict[str, object]]) -> list[LoseWorker]:
    return [LoseWorker(id=str(f["id"]), replica=int(f["replica"]), step=int(f["step"]))  # type: ignore[call-overload]
            for f in faults if f["kind"] in WORKER_FAULT_KINDS]
