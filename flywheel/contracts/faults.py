"""Injected faults for tests and demos (docs/contracts.md, "Injected faults"): the flag, the environment and their
checks, shared by the local runner that takes `--fault`, the agent that hands them to its ranks and the rank that
fires them (flywheel/trainer/ft/fault_injector.py).

`FLYWHEEL_FAULTS` is a JSON list like `[{"id": "f0", "kind": "kill", "rank": 1, "step": 5}]`. Global rank R fires
its fault once at the start of step S: it creates `$FLYWHEEL_FAULT_DIR/<id>.fired` with O_EXCL (so a replay of step
S after the restart does not fire again), writes a `fault` event, then SIGKILLs (`kill`) or SIGSTOPs (`hang`)
itself. `lose-worker` faults name a replica and are carried out by the local supervisor, not here.

`FLYWHEEL_STEP_DELAY_SECONDS` makes every rank idle that long before each step: a job that trains slowly (as a
bigger model would) while leaving the CPU free, for tests and demos that need a job to stay running.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

FaultKind = Literal["kill", "hang", "lose-worker"]
KINDS: tuple[str, ...] = ("kill", "hang", "lose-worker")
RANK_KINDS = ("kill", "hang")
STEP_DELAY_ENV = "FLYWHEEL_STEP_DELAY_SECONDS"


@dataclass(frozen=True)
class Fault:
    id: str
    kind: FaultKind
    step: int
    rank: int | None = None  # kill / hang
    replica: int | None = None  # lose-worker

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, doc: Any) -> Fault:
        if not isinstance(doc, dict):
            raise ValueError(f"fault {doc!r} is not an object with id, kind, step and rank/replica")
        unknown = set(doc) - {"id", "kind", "step", "rank", "replica"}
        if unknown:
            raise ValueError(f"fault {doc!r} has unknown keys {sorted(unknown)}")
        try:
            return _checked(cls(id=str(doc["id"]), kind=doc["kind"], step=doc["step"], rank=doc.get("rank"),
                                replica=doc.get("replica")))
        except KeyError as err:
            raise ValueError(f"fault {doc!r} lacks {err.args[0]!r}") from None


def _checked(fault: Fault) -> Fault:
    if fault.kind not in KINDS:
        raise ValueError(f"fault kind {fault.kind!r} is unknown; use one of {', '.join(KINDS)}")
    target, other = ("rank", "replica") if fault.kind in RANK_KINDS else ("replica", "rank")
    for name, value in (("step", fault.step), (target, getattr(fault, target))):
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if name == "step" else 0):
            raise ValueError(f"fault {fault.id} ({fault.kind}) needs an integer {name} "
                             f"{'>= 1' if name == 'step' else '>= 0'}, got {value!r}")
    if getattr(fault, other) is not None:
        raise ValueError(f"fault {fault.id}: {fault.kind} takes {target}=, not {other}=")
    return fault


def parse_fault_flag(flag: str, index: int = 0) -> Fault:
    """`kill:rank=1:step=5`, `hang:rank=0:step=3` or `lose-worker:replica=1:step=8` -> Fault with id f<index>."""
    usage = "expected KIND:rank=R:step=S (KIND kill or hang) or lose-worker:replica=I:step=S"
    kind, *pairs = flag.strip().split(":")
    if kind not in KINDS:
        raise ValueError(f"--fault {flag!r}: unknown kind {kind!r}; {usage}")
    fields: dict[str, int] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key not in ("rank", "replica", "step") or key in fields:
            raise ValueError(f"--fault {flag!r}: bad or repeated field {pair!r}; {usage}")
        try:
            fields[key] = int(value)
        except ValueError:
            raise ValueError(f"--fault {flag!r}: {key}={value!r} is not an integer; {usage}") from None
    if "step" not in fields:
        raise ValueError(f"--fault {flag!r}: step= is missing; {usage}")
    try:
        return _checked(Fault(id=f"f{index}", kind=kind, step=fields["step"],  # type: ignore[arg-type]
                              rank=fields.get("rank"), replica=fields.get("replica")))
    except ValueError as err:
        raise ValueError(f"--fault {flag!r}: {err}; {usage}") from None


def faults_from_env(value: str | None) -> list[Fault]:
    if not value:
        return []
    try:
        docs = json.loads(value)
    except json.JSONDecodeError as err:
        raise ValueError(f"FLYWHEEL_FAULTS is not JSON: {err}") from None
    if not isinstance(docs, list):
        raise ValueError("FLYWHEEL_FAULTS must be a JSON list of faults")
    return [Fault.from_json(doc) for doc in docs]


def step_delay_from_env(value: str | None) -> float:
    """FLYWHEEL_STEP_DELAY_SECONDS as seconds (0 when unset)."""
    if not value:
        return 0.0
    try:
        delay = float(value)
    except ValueError:
        delay = -1.0
    if not math.isfinite(delay) or not 0 <= delay <= 60:
        raise ValueError(f"{STEP_DELAY_ENV}={value!r} is not a number of seconds from 0 to 60; "
                         "set e.g. 0.05 or unset it")
    return delay
