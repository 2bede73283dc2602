"""A job resumed at or past its last step: the done record names the checkpoint, the Succeeded condition says
"already complete at step N (checkpoint PATH)"."""

from __future__ import annotations

from flywheel.eventlog.records import Done, parse_record
from flywheel.policy.finish import success
from flywheel.policy.observed import ObservedProgress
from flywheel.spec.status import ConditionType, Phase
from tests.unit.policy_helpers import fresh, pod, spec, view


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
