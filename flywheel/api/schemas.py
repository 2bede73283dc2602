"""Response and request models of the REST status API (pydantic v2). The OpenAPI document is built from these,
so field names are camelCase on the wire like the TrainingJob itself."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from flywheel.spec.status import CheckpointStatus, Condition, GoodputStatus, ReplicaStatus

Phase = Literal["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"]


class _Out(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


class JobSummary(_Out):
    namespace: str
    name: str
    phase: Phase
    replicas: ReplicaStatus
    step: int = 0
    eval_loss: float | None = Field(None, description="the latest evaluation's mean validation loss, if any")
    restarts: int = 0
    suspended: bool = False
    created: str | None = Field(None, description="metadata.creationTimestamp (RFC 3339)")


class JobList(_Out):
    items: list[JobSummary]
    total: int = Field(description="jobs matching the filters, over all pages")
    limit: int
    offset: int
    next_offset: int | None = Field(None, description="offset of the next page; null on the last page")


class SpecSummary(_Out):
    image: str = ""
    replicas_min: int
    replicas_max: int
    replicas_target: int | None = None
    procs_per_replica: int
    suspend: bool = False
    workload: Literal["trainer", "command"] = "trainer"
    model: str = Field("", description="model preset (embedded trainer) or the command line (user script)")
    steps: int = 0
    checkpoint_dir: str = ""
    checkpoint_every_steps: int = 0
    max_restarts: int = 0
    restart_scope: str = "job"


class Worker(_Out):
    """One worker pod: replica index, the global ranks it hosts, and what the kubelet reports."""

    index: int
    pod: str
    first_rank: int
    last_rank: int
    phase: str = "Unknown"
    ready: bool = False
    node: str = ""
    generation: int | None = Field(None, description="restart generation the pod was created for")
    exit_code: int | None = None
    reason: str = ""
    message: str = Field("", description="why it ended or cannot start: its termination message's last line, or "
                                         "the init container's that failed")


class RestartRecord(_Out):
    time: str | None = None
    reason: str
    message: str = ""


class Restarts(_Out):
    count: int = 0
    last_reason: str = ""
    history: list[RestartRecord] = Field(default_factory=list, description="from the job's Restarting events")


class CheckpointRecord(_Out):
    time: str | None = None
    step: int | None = Field(None, description="the (latest) step the entry stands for")
    message: str = ""


class Evaluation(_Out):
    """The latest evaluation on the validation data (spec.trainer.training.evalEverySteps)."""

    step: int = Field(description="the optimizer step it followed")
    loss: float | None = Field(None, description="mean validation loss; null if it was not finite")
    perplexity: float | None = Field(None, description="exp(loss); null if it overflows")


class JobDetail(_Out):
    namespace: str
    name: str
    uid: str = ""
    created: str | None = None
    generation: int = 0
    observed_generation: int = 0
    phase: Phase
    spec: SpecSummary
    conditions: list[Condition] = Field(default_factory=list)
    replicas: ReplicaStatus
    world_size: int = 0
    step: int = 0
    workers: list[Worker] = Field(default_factory=list)
    restarts: Restarts
    last_checkpoint: CheckpointStatus
    checkpoints: list[CheckpointRecord] = Field(
        default_factory=list, description="committed checkpoints, oldest first (from CheckpointCommitted events; "
        "on a cluster one event may stand for several coalesced checkpoints: its message lists their steps)")
    goodput: GoodputStatus
    evaluation: Evaluation | None = Field(None, description="null until the job has evaluated")
    restart_requested_at: str | None = Field(None, description="pending restart request (annotation), if any")
    loss: float | None = Field(None, description="the last step's loss (etcd progress only; null without it)")
    tokens_per_second: float | None = Field(None, description="training throughput (etcd progress only)")
    progress_source: Literal["etcd", "status"] = Field(
        "status", description="where step, checkpoint and goodput come from: the workers' etcd progress (an API "
        "with etcd endpoints, a job not finished) or the TrainingJob status")


class JobEvent(_Out):
    type: str = "Normal"
    reason: str = ""
    message: str = ""
    object: str = Field("", description="Kind/name the event is about (the job or one of its pods)")
    count: int = 1
    first_time: str | None = None
    last_time: str | None = None


class EventList(_Out):
    items: list[JobEvent]


class TimelineEntry(_Out):
    time: str | None
    kind: Literal["failure", "restart", "checkpoint", "lifecycle", "condition"]
    reason: str = ""
    message: str = ""
    step: int | None = None


class Timeline(_Out):
    items: list[TimelineEntry]


class ScaleRequest(_Out):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    replicas: int = Field(ge=1, description="the new replicas.target; must lie within [min, max]")


class ActionResult(_Out):
    action: Literal["suspend", "resume", "restart", "scale"]
    job: JobDetail


class Health(_Out):
    status: Literal["ok", "not ready"]
    detail: str = ""


class ErrorBody(BaseModel):
    """Every 4xx/5xx other than 422 (which is FastAPI's list of field errors)."""

    detail: str
    reason: str = Field(description="machine-readable: Unauthorized, Forbidden, NotFound, Invalid, Conflict, ...")
