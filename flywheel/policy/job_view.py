"""One pass's observations with what every policy derives from them: the generation, the current pods, and
which of them failed (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field

from flywheel.policy.failures import START_FAILURES_AFTER_GRACE, FailureKind, classify_pod, classify_waiting
from flywheel.policy.observed import (
    CheckpointSharing,
    DrainInput,
    HealthFindings,
    ObservedProgress,
    PodView,
    ProgressClock,
)
from flywheel.spec import TrainingJobSpec


def node_lost(pod: PodView) -> bool:
    """Its node is not Ready and nothing says its worker still runs. A worker whose agent holds its etcd liveness key
    (refreshed every second) is alive whatever the node's Ready condition says: the kubelet lost the API server, or
    the control plane's view lags (a node controller starved for its grace period marks every node at once), while
    the worker trains on. It is lost once that key lapses (`liveness_lost`), or is deleted or evicted (the taint
    manager's NoExecute eviction of an unreachable node's pods)."""
    return pod.liveness_lost or (pod.node_lost and not pod.agent_alive)


def failure_of(pod: PodView, now: float, start_grace: float) -> FailureKind | None:
    """The failure `pod` shows at `now`, or None. `start_grace`: how long a container may wait on a retryable start
    failure (an image pull error, a missing Secret or ConfigMap) first: the job's startFailureGraceSeconds."""
    if pod.phase == "Succeeded":
        return None
    ended = pod.phase == "Failed" and pod.disruption is None and pod.deleting_since is None
    if ended and pod.exit_code is not None:  # its container's own end names it, though its liveness key lapsed first
        return _ended_as(pod)
    if node_lost(pod):
        return FailureKind.NODE_LOST
    if pod.disruption is not None:
        return classify_pod(pod.phase, pod.reason, pod.exit_code, disruption=True)
    if pod.deleting_since is not None:  # JobView.interrupted: deleted by someone else, whatever its exit says
        return FailureKind.POD_DELETED
    if pod.phase == "Pending" and pod.waiting_since is not None:
        return classify_waiting(pod.reason, now - pod.waiting_since, start_grace)
    if pod.phase != "Failed":
        return None
    return _ended_as(pod)


def _ended_as(pod: PodView) -> FailureKind:
    """A failed pod's kind from its own end (a crash when nothing names it)."""
    return classify_pod(pod.phase, pod.reason, pod.exit_code, init_container=pod.init_container is not None) \
        or FailureKind.CRASH


@dataclass(frozen=True)
class JobView:
    """`generation` is `status.generation` (workerGeneration) at the start of the pass: the generation the current
    pods belong to. `pods` are the workers; the spares (policy/spares.py) are apart."""

    spec: TrainingJobSpec
    pods: list[PodView]
    progress: ObservedProgress
    now: float
    generation: int
    restart_requested_at: str | None = None
    findings: HealthFindings = field(default_factory=HealthFindings)
    spares: list[PodView] = field(default_factory=list)  # the warm spare pods (never in `pods`)
    usable_nodes: frozenset[str] = frozenset()  # Ready, not cordoned, tainted or draining (empty: not known)
    create_failures: tuple[str, ...] = ()  # why creates the operator tried are refused (policy/create_failures.py)
    deleted_by_operator: frozenset[str] = frozenset()  # pod uids it deleted itself (status.deletedByOperator)
    spec_generation: int = 0  # the job's metadata.generation (the spec this pass reads)
    sharing: CheckpointSharing = field(default_factory=CheckpointSharing)  # policy/checkpoint_sharing.py
    drain: DrainInput = field(default_factory=DrainInput)  # marked nodes and the request's answers (policy/drain.py)
    progress_clock: ProgressClock | None = None  # to judge a progress hang by (policy/progress_hang.py)

    @property
    def desired(self) -> int:
        return self.spec.replicas.desired

    def failure(self, pod: PodView) -> FailureKind | None:
        """`failure_of` with this job's start-failure grace, at this pass's time."""
        return failure_of(pod, self.now, self.spec.fault_tolerance.start_failure_grace_seconds)

    @property
    def mine(self) -> list[PodView]:
        """Pods within the desired count, and every pod that is not active any more."""
        return [p for p in self.pods if p.index < self.desired or not p.active]

    @property
    def current(self) -> list[PodView]:
        """Pods of the current generation not being deleted."""
        return [p for p in self.mine if p.generation == self.generation and p.deleting_since is None]

    @property
    def interrupted(self) -> list[PodView]:
        """Pods of the current generation within the desired count being deleted by someone else (preempted or
        evicted with DisruptionTarget, `kubectl delete`, the health monitor): not one the operator deleted itself
        (a pod it scaled down is within the count again when the job is scaled back up before it is gone). Still a
        failure to decide."""
        return [p for p in self.mine if p.generation == self.generation and p.deleting_since is not None
                and p.index < self.desired and p.uid not in self.deleted_by_operator]

    def start_failures_due(self) -> list[float]:
        """When each current pod waiting on a retryable start failure (an image pull error, a missing Secret or
        ConfigMap) has waited out startFailureGraceSeconds and `failure` calls it failed."""
        grace = self.spec.fault_tolerance.start_failure_grace_seconds
        return [p.waiting_since + grace for p in self.current if p.phase == "Pending" and p.waiting_since is not None
                and p.reason in START_FAILURES_AFTER_GRACE and self.failure(p) is None]

    @property
    def failed(self) -> list[PodView]:
        return sorted((p for p in self.current + self.interrupted if self.failure(p) is not None),
                      key=lambda p: p.index)
