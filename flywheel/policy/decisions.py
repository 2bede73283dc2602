"""What a reconcile pass decides: the new status, the actions that make the world match it, and the events to post
after the status write. Executors dispatch on `JobAction` exhaustively (`match` + `assert_never`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from flywheel.policy.checkpoint_events import CheckpointPosts
from flywheel.spec.status import TrainingJobStatus


@dataclass(frozen=True)
class CreatePod:
    index: int
    generation: int


@dataclass(frozen=True)
class DeletePod:
    name: str
    uid: str
    force: bool = False
    grace_seconds: int | None = None  # None: the pod's terminationGracePeriodSeconds


@dataclass(frozen=True)
class Relabel:
    name: str
    generation: int


@dataclass(frozen=True)
class RestartRanks:
    """Ask every worker's agent to restart its ranks in place for worker `generation` (the etcd key
    /flywheel/restart/<run_id>/ranks, flywheel/etcd/rank_restart.py): a hang answered without recreating a pod
    (policy/failure_decision.py); the pods are relabelled to `generation` before. The local executor has no such
    request: under `flywheel run` a hang is the rank's own watchdog exit, which its agent restarts in place."""

    generation: int
    reason: str


@dataclass(frozen=True)
class CreateSpare:
    """Create the warm spare pod `<job>-spare-<number>` (numbers count up in status.nextSpare, never reused);
    `nodes`: only on one of these (a spare moved off a worker's node, policy/spare_placement.py)."""

    number: int
    generation: int
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PromoteSpare:
    """Make the ready spare pod `name` the worker of replica `index`: relabel it (role worker, the index, the
    generation), then ask its agent through etcd to join the rendezvous with that index."""

    name: str
    index: int
    generation: int


@dataclass(frozen=True)
class RequestCheckpoint:
    """Ask every rank for a checkpoint at its next step boundary, then a stop (etcd request key, policy/drain.py)."""

    request_id: str
    reason: str
    moving: tuple[int, ...] = ()  # the replica indices of the workers the drain moves: their agents will not rejoin


@dataclass(frozen=True)
class ClearCheckpointRequest:
    """The drain is over: delete the run's checkpoint request and the ranks' answers."""


@dataclass(frozen=True)
class DeleteJob:
    pass


@dataclass(frozen=True)
class ResetRendezvous:
    """Forget the run's rendezvous state before an entirely new set of workers starts (after a job restart or a
    resume): otherwise the new agents wait for the old participants' heartbeats to expire (keep_alive_interval x
    keep_alive_max_attempt, 6 s) before their group forms. Only when no pod of the job exists any more."""


JobAction = (CreatePod | DeletePod | Relabel | DeleteJob | ResetRendezvous | CreateSpare | PromoteSpare
             | RequestCheckpoint | ClearCheckpointRequest | RestartRanks)


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class ProgressHang:
    """A hang judged from the progress (policy/progress_hang.py): how long nothing trained, in words."""

    idle_seconds: float
    message: str
    stepped: bool = False  # the current generation trained a step before it stopped


@dataclass
class Pass:
    status: TrainingJobStatus
    actions: list[JobAction] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    next_due: float | None = None  # when a time-based rule next comes due (policy/due.py); None: only on a change
    hang: ProgressHang | None = None  # the progress hang this pass found (logged and measured by the executor)
    # The executor's memory for the next pass (policy/observed.py `Observed`): the generation whose progress hang
    # was reported; and the checkpoint events to post after the actions, with the memory once they are posted.
    hang_reported: int | None = None
    checkpoints: CheckpointPosts | None = None

    def keep_only_force_deletes(self) -> None:
        """Drop every action decided so far but a force delete (a stuck pod on a lost node goes regardless)."""
        self.actions = [a for a in self.actions if isinstance(a, DeletePod) and a.force]
