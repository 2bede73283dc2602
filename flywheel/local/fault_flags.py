"""`--fault` flags of `flywheel run` (docs/contracts.md, "Injected faults").

`kill:rank=R:step=S` and `hang:rank=R:step=S` are fired by the embedded trainer (handed over in FLYWHEEL_FAULTS) at
the start of step S; for a user's command (`spec.command`) the supervisor SIGKILLs (SIGSTOPs) rank R's process once
the event log shows step S (the command reports its steps: flywheel.progress or an integration), as the OOM killer
would, so that any script's recovery can be tried. `lose-worker:replica=I:step=S` is carried out by the supervisor,
which SIGKILLs worker I's whole process tree once the event log shows step S.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from flywheel.contracts.faults import RANK_KINDS as RANK_FAULT_KINDS
from flywheel.contracts.faults import parse_fault_flag

WORKER_FAULT_KINDS = ("lose-worker",)


class FaultFlagError(ValueError):
    pass


@dataclass(frozen=True)
class LoseWorker:
    """Kill worker `replica` (agent and ranks) once training reached `step`."""

    id: str
    replica: int
    step: int


@dataclass(frozen=True)
class RankFault:
    """Kill (`kill`) or stop (`hang`) global rank `rank` of a user's command once training reached `step`."""

    id: str
    kind: str
    rank: int
    step: int


def parse_faults(flags: Iterable[str]) -> list[dict[str, object]]:
    """All `--fault` flags -> [{"id", "kind", "rank"|"replica", "step"}], ids f0, f1, ... in the order given (the
    trainer's once-only markers use them). The trainer owns the flag grammar; errors become FaultFlagError."""
    faults = []
    for index, flag in enumerate(flags):
        try:
            faults.append(parse_fault_flag(flag, index).to_json())
        except ValueError as err:
            raise FaultFlagError(str(err)) from None
    return faults


def check_targets(faults: Iterable[dict[str, object]], replicas: int, world_size: int) -> None:
    """Faults must name a rank/replica that exists in the planned world."""
    for f in faults:
        key, limit = ("rank", world_size) if f["kind"] in RANK_FAULT_KINDS else ("replica", replicas)
        if int(f[key]) >= limit:  # type: ignore[call-overload]
            raise FaultFlagError(f"--fault {f['kind']}: {key}={f[key]} does not exist ({key}s are 0..{limit - 1})")


def worker_faults(faults: Iterable[dict[str, object]]) -> list[LoseWorker]:
    return [LoseWorker(id=str(f["id"]), replica=int(f["replica"]), step=int(f["step"]))  # type: ignore[call-overload]
            for f in faults if f["kind"] in WORKER_FAULT_KINDS]


def command_rank_faults(faults: Iterable[dict[str, object]]) -> list[RankFault]:
    """The rank faults the supervisor carries out itself: a user's command has no trainer to fire them."""
    return [RankFault(id=str(f["id"]), kind=str(f["kind"]), rank=int(f["rank"]),  # type: ignore[call-overload]
                      step=int(f["step"]))  # type: ignore[call-overload]
            for f in faults if f["kind"] in RANK_FAULT_KINDS]


def next_due(pending: Iterable[LoseWorker | RankFault], last_step: int, previous_fired_at: float | None,
             last_start_at: float | None, stepped_since_start: bool) -> LoseWorker | RankFault | None:
    """The fault to fire now: the due one (its step reached) of the lowest step, one failure at a time: after a
    fault, none until the group it broke has started again (a start after it) and trained a step; two due in one
    poll would otherwise land in one recovery and be counted as one."""
    if previous_fired_at is not None and not (
            last_start_at is not None and last_start_at > previous_fired_at and stepped_since_start):
        return None
    return min((f for f in pending if f.step <= last_step), key=lambda f: f.step, default=None)
