"""A job resumed at or past its last step: the done record names the checkpoint, the Succeeded condition says
"already complete at step N (checkpoint PATH)"."""

from __future__ import annotations

from dataclasses import replace

from flywheel.eventlog.records import Done, parse_record
from flywheel.policy.due import next_due
from flywheel.policy.finish import DONE_REPORT_WAIT_SECONDS, success
from flywheel.policy.observed import ObservedProgress
from flywheel.spec.status import ConditionType, Phase
from tests.builders import NOW, fresh, pod, spec, view


def test_the_done_record_carries_the_complete_checkpoint_and_old_records_still_parse() -> None:
    done = parse_record({"event": "done", "t": 1.0, "step": 6, "already_complete_checkpoint": "/ckpt/step-6"})
    assert isinstance(done, Done) and done.already_complete_checkpoint == "/ckpt/step-6"
    old = parse_record({"event": "done", "t": 1.0, "step": 6, "params_sha256": "ab"})
    assert isinstance(old, Done) and old.already_complete_checkpoint is None


def test_succeeded_says_already_complete_with_the_checkpoint() -> None:
    progress = ObservedProgress(step=6, done=True, already_complete_checkpoint="/ckpt/step-6")
    out = success(fresh(step=6), view(spec(), [pod(0, "Succeeded"), pod(1, "Succeeded")], progress=progress))
    assert out is not None and out.status.phase is Phase.SUCCEEDED
    done = next(c for c in out.status.conditions if c.type == ConditionType.SUCCEEDED)
    assert done.message == "already complete at step 6 (checkpoint /ckpt/step-6)"
    trained = success(fresh(step=6), view(spec(), [pod(0, "Succeeded"), pod(1, "Succeeded")],
                                          progress=ObservedProgress(step=6, done=True)))
    assert trained is not None
    assert next(c for c in trained.status.conditions if c.type == ConditionType.SUCCEEDED).message == \
        "training finished at step 6"


def test_a_success_seen_before_the_done_report_waits_for_it_then_says_what_it_says() -> None:
    """The pod's exit can be seen before etcd's watch brings the done record: the job stays Running (and a pass is
    due at the wait's end) rather than finishing with words that miss the already complete checkpoint."""
    pods = [pod(0, "Succeeded", finished_at=NOW - 2), pod(1, "Succeeded", finished_at=NOW - 1)]
    started = ObservedProgress(step=6, attempt=NOW - 5)
    waiting = success(fresh(step=6), view(spec(), pods, progress=started))
    assert waiting is not None and waiting.status.phase is Phase.RUNNING and not waiting.actions
    assert next_due(waiting.status, view(spec(), pods, progress=started)) == NOW - 2 + DONE_REPORT_WAIT_SECONDS
    reported = replace(started, done=True, done_time=NOW - 2, already_complete_checkpoint="/ckpt/step-6")
    out = success(fresh(step=6), view(spec(), pods, progress=reported))
    assert out is not None and out.status.phase is Phase.SUCCEEDED
    assert "already complete at step 6" in next(c.message for c in out.status.conditions
                                                 if c.type == ConditionType.SUCCEEDED)
    # The report never comes (etcd was down at the exit): the success is not held past the wait.
    late = success(fresh(step=6), view(spec(), pods, now=NOW - 2 + DONE_REPORT_WAIT_SECONDS, progress=started))
    assert late is not None and late.status.phase is Phase.SUCCEEDED


def test_nothing_is_waited_for_without_a_trainer_that_reports_done() -> None:
    """A user script reports no done, and a job whose trainer's start was never seen has no channel to report it."""
    pods = [pod(0, "Succeeded", finished_at=NOW - 1), pod(1, "Succeeded", finished_at=NOW - 1)]
    script = spec(command=["python", "train.py"])
    out = success(fresh(step=6), view(script, pods, progress=ObservedProgress(step=6, attempt=NOW - 5)))
    assert out is not None and out.status.phase is Phase.SUCCEEDED
    unseen = success(fresh(), view(spec(), pods))
    assert unseen is not None and unseen.status.phase is Phase.SUCCEEDED
