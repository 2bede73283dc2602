"""What the REST API shows of a job's training (pure): the workers' etcd progress records folded by the operator's
ledger (monitor/etcd_progress.py), or the TrainingJob status alone. Fed by api/progress.py's follower."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from flywheel.contracts.timefmt import rfc3339
from flywheel.etcd.progress import ProgressRecord
from flywheel.monitor.etcd_progress import GoodputSeed, ProgressLedger
from flywheel.spec.status import CheckpointStatus, GoodputStatus, Phase, TrainingJobStatus

FINISHED = frozenset({Phase.SUCCEEDED, Phase.FAILED})


@dataclass(frozen=True)
class LiveProgress:
    """What the API shows of a job's training: from etcd (`source` "etcd") or the status alone ("status")."""

    step: int
    world_size: int
    last_checkpoint: CheckpointStatus
    goodput: GoodputStatus
    loss: float | None = None
    tokens_per_second: float | None = None
    source: str = "status"


class LiveSource(Protocol):
    """What the app reads the live progress from (api/progress.py's follower)."""

    def live(self, obj: dict[str, Any]) -> LiveProgress: ...
    def live_step(self, obj: dict[str, Any]) -> int | None: ...


def from_status(status: TrainingJobStatus) -> LiveProgress:
    return LiveProgress(status.step, status.world_size, status.last_checkpoint, status.goodput)


@dataclass
class FollowedJob:
    """One job's records as seen by the follower: the ledger (every attempt), the newest record, the seed."""

    ledger: ProgressLedger
    seed: GoodputSeed
    latest: ProgressRecord | None = None

    def add(self, record: ProgressRecord) -> None:
        self.ledger.add(record)
        if self.latest is None or (record.attempt, record.time) >= (self.latest.attempt, self.latest.time):
            self.latest = record


def live_view(status: TrainingJobStatus, followed: FollowedJob | None) -> LiveProgress:
    """The etcd view of a followed job that has records, else the status's. The checkpoint is the newer of the
    two (the status may know one from before the records the follower saw)."""
    if followed is None or followed.latest is None or status.phase in FINISHED:
        return from_status(status)
    seen, latest = followed.ledger.progress(followed.seed), followed.latest
    checkpoint = status.last_checkpoint
    if seen.checkpoint_path and seen.checkpoint_step >= checkpoint.step:
        checkpoint = CheckpointStatus(step=seen.checkpoint_step, path=seen.checkpoint_path,
                                      time=rfc3339(seen.checkpoint_time) if seen.checkpoint_time else None)
    return LiveProgress(step=seen.step, world_size=seen.world_size or status.world_size, last_checkpoint=checkpoint,
                        goodput=GoodputStatus.model_validate(seen.goodput) if seen.goodput else status.goodput,
                        loss=latest.loss, tokens_per_second=latest.tokens_per_second, source="etcd")
