"""What the REST API shows of a job's training (api/progress_view.py, pure): the etcd ledger's view of a running
job that has records, else its status."""

from __future__ import annotations

from flywheel.api.progress_view import FollowedJob, from_status, live_view
from flywheel.api.schemas import JobSummary
from flywheel.api.views import with_live_step
from flywheel.etcd.progress import CheckpointRecord, ProgressRecord
from flywheel.monitor.etcd_progress import GoodputSeed, ProgressLedger
from flywheel.spec.status import CheckpointStatus, GoodputStatus, Phase, ReplicaStatus, TrainingJobStatus

T0 = 1_800_000_000.0


def followed(*records: ProgressRecord, seed: GoodputSeed | None = None) -> FollowedJob:
    job = FollowedJob(ProgressLedger(), seed or GoodputSeed(operator_started=T0))
    for record in records:
        job.add(record)
    return job


def status(phase: Phase = Phase.RUNNING, step: int = 3, checkpoint: int = 0) -> TrainingJobStatus:
    return TrainingJobStatus(phase=phase, step=step, last_checkpoint=CheckpointStatus(step=checkpoint, path="/s"),
                             goodput=GoodputStatus(ratio=0.25, productive_seconds=1.0))


def test_no_records_or_not_followed_shows_the_status() -> None:
    assert live_view(status(), None) == from_status(status())
    assert live_view(status(), followed()).source == "status"


def test_a_running_job_with_records_shows_the_newest_record_and_the_ledger() -> None:
    old = ProgressRecord(time=T0 + 5, attempt=T0, step=5, loss=3.0, productive_seconds=4.0)
    new = ProgressRecord(time=T0 + 10, attempt=T0, step=9, loss=2.0, tokens_per_second=50.0, productive_seconds=8.0,
                         checkpoint=CheckpointRecord(8, "/c8", T0 + 9), world_size=4)
    view = live_view(status(), followed(new, old))  # an older value after a newer one changes nothing
    assert (view.source, view.step, view.loss, view.tokens_per_second, view.world_size) == ("etcd", 9, 2.0, 50.0, 4)
    assert view.last_checkpoint.step == 8 and view.last_checkpoint.path == "/c8" and view.last_checkpoint.time
    assert view.goodput.ratio == 0.8 and view.goodput.productive_seconds == 8.0


def test_a_newer_checkpoint_in_the_status_wins() -> None:
    record = ProgressRecord(time=T0 + 10, attempt=T0, step=12, checkpoint=CheckpointRecord(8, "/c8", T0 + 9))
    assert live_view(status(checkpoint=10), followed(record)).last_checkpoint.step == 10


def test_the_newest_attempt_is_the_latest_record() -> None:
    first = ProgressRecord(time=T0 + 50, attempt=T0, step=40)
    second = ProgressRecord(time=T0 + 40, attempt=T0 + 30, step=21, resumed_from=20)
    job = followed(first, second)
    assert job.latest == second and live_view(status(), job).step == 21


def test_a_finished_job_shows_its_final_status() -> None:
    record = ProgressRecord(time=T0 + 10, attempt=T0, step=9)
    assert live_view(status(Phase.SUCCEEDED, step=30), followed(record)).source == "status"


def test_a_summary_takes_the_live_step_only_when_there_is_one() -> None:
    s = JobSummary(namespace="ns", name="j", phase="Running", replicas=ReplicaStatus(), step=3)
    assert with_live_step(s, None) is s and with_live_step(s, 3) is s
    assert with_live_step(s, 7).step == 7 and s.step == 3
