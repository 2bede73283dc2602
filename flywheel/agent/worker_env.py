"""The worker contract's environment as this process reads it (docs/contracts.md), and the error a restart
cannot fix."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import FrameType

from flywheel.contracts.faults import STEP_DELAY_ENV, Fault, faults_from_env, step_delay_from_env
from flywheel.spec import TrainingJobSpec, parse_spec
from flywheel.spec import storage as object_store


class UserError(Exception):
    """Configuration or data that a restart cannot fix: exit USER_ERROR."""




@dataclass(frozen=True)
class WorkerEnv:
    """What the worker contract's environment says about this process."""

    rank: int
    local_rank: int
    world_size: int
    restart_count: int
    namespace: str
    job: str
    replica: str
    spec: TrainingJobSpec
    checkpoint_dir: str
    metrics_port: int
    events_file: str | None
    faults: list[Fault] = field(default_factory=list)
    fault_dir: str | None = None
    step_delay_s: float = 0.0  # idle before each step (ft/fault_injector.py)

    @property
    def local_checkpoint_dir(self) -> str:
        """checkpoint.dir on this machine: the dir itself, or the local staging dir of an object-store URL."""
        return object_store.local_dir(self.checkpoint_dir, self.spec.checkpoint.local_dir)

    @classmethod
    def from_environ(cls, env: Mapping[str, str]) -> WorkerEnv:
        def integer(key: str, default: int | None = None) -> int:
            raw = env.get(key)
            if raw is None or raw == "":
                if default is None:
                    raise UserError(f"{key} is not set; start the trainer with `flywheel launch` or torchrun")
                return default
            try:
                return int(raw)
            except ValueError:
                raise UserError(f"{key}={raw!r} is not an integer") from None

        raw_spec = env.get("FLYWHEEL_SPEC")
        if not raw_spec:
            raise UserError("FLYWHEEL_SPEC is not set; it must hold the TrainingJob spec as JSON")
        try:
            spec = parse_spec(json.loads(raw_spec))
        except ValueError as err:  # JSONDecodeError and SpecError are ValueErrors
            raise UserError(f"FLYWHEEL_SPEC: {err}") from None
        namespace, _, name = env.get("FLYWHEEL_JOB", "default/flywheel").rpartition("/")
        checkpoint_dir = env.get("FLYWHEEL_CHECKPOINT_DIR") or spec.checkpoint.dir
        try:
            faults = faults_from_env(env.get("FLYWHEEL_FAULTS"))
            step_delay_s = step_delay_from_env(env.get(STEP_DELAY_ENV))
        except ValueError as err:
            raise UserError(str(err)) from None
        return cls(rank=integer("RANK"), local_rank=integer("LOCAL_RANK", 0), world_size=integer("WORLD_SIZE"),
                   restart_count=integer("TORCHELASTIC_RESTART_COUNT", 0), namespace=namespace or "default",
                   job=name, replica=env.get("FLYWHEEL_REPLICA_INDEX", "0"), spec=spec,
                   checkpoint_dir=checkpoint_dir, metrics_port=integer("FLYWHEEL_METRICS_PORT", 0),
                   events_file=env.get("FLYWHEEL_EVENTS_FILE") or None, faults=faults, step_delay_s=step_delay_s,
                   # Markers must outlive restarts and be shared by all workers, like the checkpoints.
                   fault_dir=env.get("FLYWHEEL_FAULT_DIR") or os.path.join(
                       object_store.local_dir(checkpoint_dir, spec.checkpoint.local_dir), ".faults"))


class StopRequest:
    """SIGTERM sets a flag; the loop acts on it at the next step boundary that all ranks agree on."""

    def __init__(self) -> None:
        self.requested = False

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.requested = True
