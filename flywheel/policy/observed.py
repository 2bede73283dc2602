"""What one reconcile pass observes besides the spec and the remembered status (plain data, built by executors):
the worker pods, the training progress read from the job's event log, the health monitor's findings, the leaving
nodes, ... -- gathered in one `Observed` value, the pass's only input besides the spec, the status and the time."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from flywheel.policy.checkpoint_events import CheckpointEventState, CommittedCheckpoint

DRAIN_TIMEOUT_SECONDS = 60.0  # a step plus a memory save take seconds; a node's maintenance notice gives minutes
XID_CAUSE = "has a fatal GPU XID"
CORDON_TAINT = "node.kubernetes.io/unschedulable"  # what the node lifecycle controller adds to a cordoned node


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
class ProgressClock:
    """What the operator saw of the etcd progress, on its own clock (unix seconds): what a progress hang is judged
    from (policy/progress_hang.py)."""

    running_since: float | None  # every worker pod of the current generation Running since; None: not all run
    last_step_seen: float | None  # when the runner last saw the step change (any generation); None: never
    # When the newest group began in these pods: its first record seen, or an agent's restart of its ranks
    # (the agent's clock); None: no such group since the pods ran.
    group_began: float | None = None
    last_activity_seen: float | None = None  # when the runner last saw an evaluation batch's heartbeat change
    saving_since: float | None = None  # when the runner saw the final save begin; None: not saving

    @property
    def began(self) -> float | None:
        """Since when the current group runs: its pods, or its restart in place if later."""
        if self.running_since is None or self.group_began is None:
            return self.running_since
        return max(self.running_since, self.group_began)

    @property
    def stepped(self) -> bool:
        began = self.began
        return began is not None and self.last_step_seen is not None and self.last_step_seen >= began


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


@dataclass(frozen=True)
class NodeMarks:
    """What a node of the job's pods says about leaving (built by the executor from the Node and the monitor)."""

    unschedulable: bool = False  # cordoned (spec.unschedulable)
    taints: tuple[str, ...] = ()  # keys of its NoSchedule/NoExecute taints that are in --drain-taint-keys
    fatal_xid: str = ""  # the health monitor's fatal XID on it, in words ("": none)

    @property
    def cause(self) -> str | None:
        """Why the node is leaving, in words; None when it is not. The cordon's own taint, which the node
        lifecycle controller adds with spec.unschedulable, is the cordon, not a taint of its own."""
        if self.fatal_xid:
            return f"{XID_CAUSE} ({self.fatal_xid})"
        taints = [key for key in self.taints if key != CORDON_TAINT]
        if taints:
            return f"is tainted {', '.join(taints)}"
        if self.unschedulable or CORDON_TAINT in self.taints:
            return "is cordoned"
        return None


@dataclass(frozen=True)
class DrainInput:
    """A pass's observations for drain ahead (policy/drain.py): the marked nodes, and the checkpoint request and
    answers in etcd."""

    nodes: Mapping[str, NodeMarks] = field(default_factory=dict)
    request_id: str = ""  # the request open in etcd ("": none)
    answers: Mapping[int, tuple[str, int]] = field(default_factory=dict)  # rank -> (request id, step it holds)
    timeout_seconds: float = DRAIN_TIMEOUT_SECONDS


@dataclass(frozen=True)
class Observed:
    """Everything one pass reads besides the spec, the remembered status and the time: built in one place by each
    executor (the operator's observer, operator/observe.py), so the pass's input is one value."""

    pods: list[PodView] = field(default_factory=list)  # the job's pods: workers and warm spares
    progress: ObservedProgress = field(default_factory=ObservedProgress)
    generation: int = 0  # the job's metadata.generation (the spec this pass reads)
    restart_requested_at: str | None = None  # annotation flywheel.dev/restart-requested-at (REST API `restart`)
    findings: HealthFindings = field(default_factory=HealthFindings)  # flywheel/monitor/findings.py
    drain: DrainInput = field(default_factory=DrainInput)  # marked nodes and the checkpoint request's answers
    # The Ready nodes neither cordoned nor tainted: where a spare may move (policy/spare_placement.py; empty where
    # there are no nodes, or no spare to place).
    usable_nodes: frozenset[str] = frozenset()
    create_failures: tuple[str, ...] = ()  # why the operator's creates were refused (policy/create_failures.py)
    sharing: CheckpointSharing = field(default_factory=CheckpointSharing)  # policy/checkpoint_sharing.py
    # The progress as a clock, to judge a hang by (policy/progress_hang.py); None: not followed (no etcd watch, the
    # job done or finished, hang detection off).
    progress_clock: ProgressClock | None = None
    # The executor's memory of earlier passes, handed back in each Pass: the generation whose progress hang was
    # reported, and which CheckpointCommitted events and checkpoint notices were posted (None: a new executor).
    hang_reported: int | None = None
    checkpoint_events: CheckpointEventState | None = None
