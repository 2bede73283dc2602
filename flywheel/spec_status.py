"""The TrainingJob status subresource: what the operator writes, and the shape the REST API serves."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from flywheel.spec_base import _Model


class Phase(StrEnum):  # status.phase (no docstring: it would become the CRD field's description)
    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


class ConditionType(StrEnum):  # status.conditions[].type: history (Created, Invalid), state (policy/conditions.py)
    CREATED = "Created"
    INVALID = "Invalid"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    DEGRADED = "Degraded"
    HUNG = "Hung"
    UNSCHEDULABLE = "Unschedulable"


class Condition(_Model):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None


class ReplicaStatus(_Model):
    desired: int = 0
    current: int = 0
    ready: int = 0


class CheckpointStatus(_Model):
    step: int = 0
    time: str | None = None
    path: str = ""


class GoodputStatus(_Model):
    ratio: float = 0.0
    productive_seconds: float = 0.0
    lost_steps: int = 0
    mean_time_to_recover_seconds: float = 0.0


class RestartBudgetStatus(_Model):
    used: int = 0
    window_start_step: int = 0


class StartupFailureStatus(_Model):
    reason: str = ""
    attempts: int = 0
    step: int = 0


class TrainingJobStatus(_Model):
    """What the operator writes (status subresource). Also the shape the REST API serves."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    phase: Phase = Phase.PENDING
    conditions: list[Condition] = Field(default_factory=list)
    replicas: ReplicaStatus = Field(default_factory=ReplicaStatus)
    selector: str = ""
    world_size: int = 0
    step: int = 0
    restarts: int = 0
    last_restart_reason: str = ""
    last_checkpoint: CheckpointStatus = Field(default_factory=CheckpointStatus)
    goodput: GoodputStatus = Field(default_factory=GoodputStatus)
    restart_budget: RestartBudgetStatus = Field(default_factory=RestartBudgetStatus)
    # The last decided failure's start-up record (policy/startup_failure.py): the same crash before the first step
    # on 2 attempts in a row fails the job.
    startup_failure: StartupFailureStatus = Field(default_factory=StartupFailureStatus)
    # The flywheel.dev/restart-requested-at value already acted on, so each request restarts the job once.
    restart_request_handled: str = ""
    # The worker generation (pods' flywheel.dev/generation label): bumped by every decided restart. `restarts` also
    # counts the ranks the agents restarted in place, which keep their pods (policy/rank_restarts.py).
    worker_generation: int | None = None  # None (no default in the CRD): a status written before it existed
    # Rank restarts in place already counted in `restarts`, per worker pod uid (current pods only).
    rank_restarts: dict[str, int] = Field(default_factory=dict)
    # When the last counted recovery began: reports of one recovery (a crashed rank and its peers) count once.
    last_restart_time: str | None = None
    observed_generation: int = 0

    def to_json(self) -> dict[str, Any]:
        """The status as written to Kubernetes: only the fields that were read or set (an unset field keeps the
        server's value under a merge patch), no nulls (a null in a merge patch deletes the field)."""
        return self.model_dump(by_alias=True, exclude_unset=True, exclude_none=True, mode="json")

    @property
    def generation(self) -> int:
        """The current worker generation. A status written before `workerGeneration` existed counted only decided
        restarts, so its `restarts` is the generation."""
        return self.restarts if self.worker_generation is None else self.worker_generation

    @property
    def has_restart_budget(self) -> bool:
        """False for a status written before the schema kept the restart budget."""
        return "restart_budget" in self.model_fields_set
