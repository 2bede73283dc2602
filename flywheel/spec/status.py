"""The TrainingJob status subresource: what the operator writes, and the shape the REST API serves."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel

from flywheel.spec.base import _Model


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
    REPLICA_FAILURE = "ReplicaFailure"  # a worker pod or the Service could not be created (policy/create_failures)
    SPEC_CHANGED = "SpecChanged"  # workers run an older spec than the job's (policy/spec_change.py)
    CHECKPOINT_DIR_IN_USE = "CheckpointDirInUse"  # an older unfinished job has its checkpoint location


class Condition(_Model):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    type: str = Field(description="Created, Invalid, Running, Restarting, Suspended, Succeeded, Failed, Degraded, "
                                  "Hung, Unschedulable, ReplicaFailure, SpecChanged or CheckpointDirInUse.")
    status: Literal["True", "False", "Unknown"] = Field(description="Whether the condition holds.")
    reason: str = Field("", description="Why, in one CamelCase word.")
    message: str = Field("", description="Why, for people.")
    last_transition_time: str | None = Field(None, description="When the status last changed (RFC 3339).")


class ReplicaStatus(_Model):
    desired: int = Field(0, description="Workers the job should run now (spec.replicas.target, else max).")
    current: int = Field(0, description="Worker pods that exist.")
    ready: int = Field(0, description="Worker pods that are ready.")


class CheckpointStatus(_Model):
    step: int = Field(0, description="The step it holds.")
    time: str | None = Field(None, description="When it was committed (RFC 3339).")
    path: str = Field("", description="Its directory under spec.checkpoint.dir.")


class RecoveryCostStatus(_Model):
    cause: str = Field("", description="Why the job recovered (status.lastRestartReason then).")
    total_seconds: float = Field(0.0, description="The fault to the first step after it: the sum of the parts.")
    detect_seconds: float = Field(0.0, description="The fault to the operator's restart decision.")
    decide_seconds: float = Field(0.0, description="The decision to its actions carried out (pods deleted, a spare "
                                                   "promoted or a pod created).")
    pod_ready_seconds: float = Field(0.0, description="The actions to the replacement worker ready (0 for a "
                                                      "promoted spare: it waited ready).")
    rendezvous_seconds: float = Field(0.0, description="The replacement ready to the new group formed and its "
                                                       "restore begun.")
    restore_seconds: float = Field(0.0, description="Loading the checkpoint (restoreSource).")
    first_step_seconds: float = Field(0.0, description="The group's start to its first step.")
    restore_source: str = Field("", description="Where the state came from: memory-own, memory-peer or disk "
                                                "(none: no checkpoint, started over).")
    replayed_steps: int = Field(0, description="Steps trained before the fault and again after it.")


class GoodputStatus(_Model):
    ratio: float = Field(0.0, description="Productive step time over the wall time since the first start (0 to 1).")
    productive_seconds: float = Field(0.0, description="Seconds of productive step time.")
    lost_steps: int = Field(0, description="Steps trained again after restarts (reached, then resumed from an "
                                           "earlier checkpoint).")
    mean_time_to_recover_seconds: float = Field(0.0, description="Mean seconds from a failure to the first step "
                                                                 "after it.")
    last_recovery: RecoveryCostStatus | None = Field(None, description="Where the last recovery's time went.")
    badput_seconds: dict[str, float] = Field(default_factory=dict, description="Seconds from a fault to the first "
                                             "step after it, added up by cause (lastRestartReason), since this "
                                             "operator started.")


class RestoreStatus(_Model):
    source: str = Field("", description="memory-own, memory-peer or disk.")
    step: int = Field(0, description="The step restored.")


class RestartBudgetStatus(_Model):
    used: int = Field(0, description="Restarts counted against faultTolerance.maxRestarts.")
    window_start_step: int = Field(0, description="The step the count started at (it resets after "
                                                  "faultTolerance.budgetResetAfterSteps committed steps).")


class StartupFailureStatus(_Model):
    reason: str = Field("", description="The crash reason before the first step.")
    attempts: int = Field(0, description="Attempts in a row that crashed so before the first step.")
    step: int = Field(0, description="The step the attempts started from.")


class DrainStatus(_Model):
    node: str = Field("", description="The node a worker is being moved off (empty: no drain under way).")
    cause: str = Field("", description="Why: cordoned, a taint's key, or a fatal GPU XID.")
    request_id: str = Field("", description="The checkpoint request asked of the ranks (etcd "
                            "/flywheel/requests/<run>/checkpoint).")
    requested_at: str = Field("", description="When the checkpoint was requested (RFC 3339; empty while warm "
                              "replacements start).")
    started_at: str = Field("", description="When the drain began (RFC 3339).")
    replacements: int = Field(0, description="Spare pods started for this drain beyond spec.replicas.spares, so "
                              "that each worker on the node moves to a warm pod (0: enough spares were ready).")


class SpareMoveStatus(_Model):
    spare: int = Field(-1, description="The number of the spare being started on a node with no pod of the job, to "
                       "replace a ready spare that shares a worker's node (-1: no move under way).")
    started_at: str = Field("", description="When that spare was created (RFC 3339).")
    nodes: list[str] = Field(default_factory=list, description="The nodes it may start on (required affinity).")
    gave_up_on: list[str] = Field(default_factory=list, description="Nodes a move found no room on (its spare not "
                                  "ready in time): not tried again while they stay usable.")


class TrainingJobStatus(_Model):
    """What the operator writes (status subresource). Also the shape the REST API serves."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    phase: Phase = Field(Phase.PENDING, description="Pending, Running, Restarting, Succeeded, Failed or Suspended.")
    conditions: list[Condition] = Field(default_factory=list, description="The job's conditions: its history "
                                        "(Created, Invalid) and its current state.")
    replicas: ReplicaStatus = Field(default_factory=ReplicaStatus, description="Worker counts.")
    selector: str = Field("", description="The worker pods' label selector (for the scale subresource).")
    world_size: int = Field(0, description="Ranks in the running world (workers x procsPerReplica).")
    step: int = Field(0, description="The last optimizer step the workers reported.")
    eval_loss: float | None = Field(None, description="The latest evaluation's mean validation loss "
                                    "(training.evalEverySteps).")
    eval_step: int = Field(0, description="The step the latest evaluation followed (0: none yet).")
    restarts: int = Field(0, description="Recoveries since the job was created: decided restarts, replaced pods "
                          "and ranks restarted in place by a worker's agent.")
    last_restart_reason: str = Field("", description="Why the job last restarted.")
    last_checkpoint: CheckpointStatus = Field(default_factory=CheckpointStatus,
                                              description="The last committed checkpoint.")
    goodput: GoodputStatus = Field(default_factory=GoodputStatus, description="How much of the time trained.")
    last_restore: RestoreStatus | None = Field(None, description="The checkpoint the last (re)started group "
                                               "restored, and from where (the trainer's restore report).")
    restart_budget: RestartBudgetStatus = Field(default_factory=RestartBudgetStatus,
                                                description="Restarts used of faultTolerance.maxRestarts.")
    # policy/startup_failure.py: the same crash before the first step on 2 attempts in a row fails the job.
    startup_failure: StartupFailureStatus = Field(default_factory=StartupFailureStatus, description="The last "
                                                  "failure's start-up record: the same crash before the first step "
                                                  "twice in a row fails the job.")
    restart_request_handled: str = Field("", description="The flywheel.dev/restart-requested-at annotation value "
                                         "already acted on, so each request restarts the job once.")
    worker_generation: int | None = Field(None, description="The worker generation (the pods' flywheel.dev/"
                                          "generation label), bumped by every decided restart; absent in a status "
                                          "written before it existed (then `restarts` is the generation).")
    rank_restarts: dict[str, int] = Field(default_factory=dict, description="Rank restarts in place already "
                                          "counted in `restarts`, per worker pod uid (current pods only).")
    last_restart_time: str | None = Field(None, description="When the last counted recovery began: reports of one "
                                          "recovery (a crashed rank and its peers) count once.")
    rank_restart_reporters: list[str] = Field(default_factory=list, description="Worker pod uids that reported a "
                                              "rank restart in the recovery begun at lastRestartTime: a pod's first "
                                              "report is that recovery's echo, its later ones new restarts.")
    in_place_restart_generation: int = Field(0, description="The worker generation begun by restarting every "
                                             "worker's ranks in place after a hang (no pod recreated); 0: none. A "
                                             "hang of that generation before it trained a step recreates the pods.")
    spares: int = Field(0, description="Warm spare pods ready to be promoted (spec.replicas.spares).")
    next_spare: int = Field(0, description="The number the next spare pod is named with (<job>-spare-<n>): "
                            "names are never reused.")
    drain: DrainStatus = Field(default_factory=DrainStatus, description="Drain ahead: the node a worker is being "
                               "moved off after a memory checkpoint (policy/drain.py); empty when none.")
    # policy/pending_timeout.py: pendingTimeoutSeconds and the Unschedulable condition's grace count from it.
    unschedulable_since: str = Field("", description="When the operator first saw a current worker "
                                            "unschedulable (PodScheduled reason Unschedulable; a pod gated for "
                                            "admission is not), RFC 3339. Kept while its pods are recreated, "
                                            "empty once every worker is scheduled, one is gated, or the job is "
                                            "suspended or finished.")
    spare_move: SpareMoveStatus = Field(default_factory=SpareMoveStatus, description="A spare beside a worker "
                                        "being moved to a free node (policy/spare_placement.py).")
    deleted_by_operator: list[str] = Field(default_factory=list, description="Uids of the pods the operator "
                                           "deleted itself (scaled down, suspended, replaced) while they may still "
                                           "be terminating: such a pod is never read as deleted by someone else.")
    observed_generation: int = Field(0, description="The metadata.generation of the spec this status is about.")

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
