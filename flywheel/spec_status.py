"""The TrainingJob status subresource: what the operator writes, and the shape the REST API serves."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from flywheel.spec_base import _Model


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


class TrainingJobStatus(_Model):
    """What the operator writes (status subresource). Also the shape the REST API serves."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    phase: Literal["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"] = "Pending"
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
    # The flywheel.dev/restart-requested-at value already acted on, so each request restarts the job once.
    restart_request_handled: str = ""
    observed_generation: int = 0
