"""What one reconcile pass observes besides the spec and the remembered status (plain data, built by executors):
the worker pods, the training progress read from the job's event log, and the health monitor's findings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flywheel.policy.checkpoint_events import CommittedCheckpoint


@dataclass(frozen=True)
class PodView:
    """What one observed pod of the job means for it (built by the executor from the Pod object): a worker, or a
    warm spare (`role` "spare", index -1) that the reconcile pass keeps apart from the workers."""

    name: str
    uid: str
    index: int  # -1 for a spare
    generation: int
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    ready: bool = False
    deleting_since: float | None = None  # unix time of metadata.deletionTimestamp
    node_lost: bool = False  # bound to a node that is not Ready
    reason: str | None = None  # container terminated/waiting reason, or the pod's reason
    exit_code: int | None = None
    unschedulable_since: float | None = None
    scheduler_message: str | None = None  # the PodScheduled=False condition's message (why it does not fit)
    gated: bool = False  # held by scheduling gates (PodScheduled reason SchedulingGated): queued, e.g. in Kueue
    liveness_lost: bool = False  # its etcd liveness key vanished while the pod still ran
    agent_alive: bool = False  # its own etcd liveness key is held now, not marked exited: its agent runs
    finished_at: float | None = None  # when its container terminated (the failure's time, for metrics)
    message: str | None = None  # why its container cannot start (waiting) or exited (its termination message)
    init_container: str | None = None  # the template's init container that failed or cannot start, if that is why
    waiting_since: float | None = None  # its container is waiting (not started yet) since then
    disruption: str | None = None  # reason of a True DisruptionTarget condition (preempted, evicted)
    deleted_for: str | None = None  # why Flywheel's health monitor deleted it (annotation flywheel.dev/deleted-for)
    rank_restarts: int = 0  # times its agent restarted crashed ranks in place (its etcd liveness key says)
    rank_restart_reason: str = ""  # the last of those restarts' reason
    rank_restart_at: float = 0.0  # and its unix time (0: not reported)
    role: str = "worker"  # label flywheel.dev/role: "worker" or "spare"
    spare_ready: bool = False  # its agent holds a ready spare key in etcd: it waits, warm, to be promoted
    node: str | None = None  # the node it is bound to
    spec_generation: int | None = None  # the job's metadata.generation it was created at (annotation; None: unknown)
    spec_hash: str = ""  # the hash of the spec part baked into it (policy/spec_change.py; "": unknown)

    @property
    def is_spare(self) -> bool:
        return self.role == "spare"

    @property
    def active(self) -> bool:
        return self.deleting_since is None and self.phase in ("Pending", "Running", "Unknown")


@dataclass(frozen=True)
class ObservedProgress:
    """Training progress read from the job's event log (see flywheel/operator/event_log.py)."""

    step: int = 0
    world_size: int = 0
    checkpoint_step: int = 0
    checkpoint_time: float | None = None
    checkpoint_path: str = ""
    done: bool = False
    done_time: float | None = None  # when the trainer reported done (its clock), if it did
    goodput: dict[str, Any] = field(default_factory=dict)
    # (time of the first step after a restart, seconds since the last step before it), oldest first.
    recoveries: tuple[tuple[float, float], ...] = ()
    checkpoints: tuple[CommittedCheckpoint, ...] = ()  # the most recent committed checkpoints, oldest first
    # Why the open incident's worker failed, in its own words (a USER_ERROR's exception line); "" once recovered.
    failure_reason: str = ""
    # The done record's: a job resumed at or past its last step trained nothing; this checkpoint was complete.
    already_complete_checkpoint: str = ""
    eval_step: int = 0  # the latest evaluation's step (0: none yet) and its loss
    eval_loss: float | None = None
    # Checkpoints going wrong, in words, numbered in log order: (ordinal, kind, message): each cause of failing
    # saves ("failed") and each damaged checkpoint a restore skipped ("damaged"); eventlog's checkpoint_notices.
    checkpoint_notices: tuple[tuple[int, str, str], ...] = ()
    last_restore: tuple[str, int] | None = None  # the newest group's restore report: (source, step)
    # The newest attempt (trainer group) that reported its start: when it started (its own clock; 0: none known)
    # and whether it trained a step. `failure_reason` is that attempt's (policy/startup_failure.py).
    attempt: float = 0.0
    attempt_stepped: bool = False


@dataclass(frozen=True)
class HangReport:
    """The health monitor found no step progress (policy/health_checks.py) while the job had `generation`
    restarts: a report about an older generation is stale and ignored. `stepped`: the finder saw this generation
    train a step before it stopped (False: it did not, or the finder cannot tell)."""

    message: str
    generation: int
    stepped: bool = False


@dataclass(frozen=True)
class StragglerReport:
    """The health monitor's latest straggler verdict for the job's `generation`."""

    degraded: bool
    message: str
    generation: int


@dataclass(frozen=True)
class HealthFindings:
    """The health monitor's findings handed to the job's reconcile pass (flywheel/monitor/findings.py): observed
    input like the pods, never written to the status by anyone but the pass."""

    hang: HangReport | None = None
    straggler: StragglerReport | None = None
    # Fatal GPU XIDs on nodes of a Running job's workers: (node, message), for drain ahead (policy/drain.py).
    node_faults: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class DirUser:
    """Another job whose checkpoints land where this job's do (policy/checkpoint_sharing.py), from the job cache."""

    namespace: str
    name: str
    created: str  # metadata.creationTimestamp (RFC 3339, UTC: ordered as text)
    finished: bool  # Succeeded or Failed
    uid: str = ""
    # A job already deleted whose pods are still stopping (their emergency checkpoint being written): these pods,
    # by name. Such a user holds the location whatever the order; empty for a job in the cache.
    stopping_pods: tuple[str, ...] = ()


@dataclass(frozen=True)
class CheckpointSharing:
    """This job's identity (for the order between jobs) and the other jobs sharing its checkpoint location."""

    namespace: str = ""
    name: str = ""
    created: str = ""
    others: tuple[DirUser, ...] = ()
