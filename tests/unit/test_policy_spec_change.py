"""A spec edited while the job runs: the workers created before keep the baked part (policy/spec_change.py)."""

from __future__ import annotations

from dataclasses import replace

from flywheel.policy.conditions import condition
from flywheel.policy.job_view import JobView
from flywheel.policy.spec_change import baked_spec_hash, track_spec_change
from flywheel.spec_status import ConditionType
from tests.unit.policy_helpers import fresh, pod, spec, view

STEPS = "trainer.training.steps"


def test_the_hash_leaves_out_what_the_operator_reads_live() -> None:
    base = baked_spec_hash(spec())
    live = spec(**{"suspend": True, "replicas": {"min": 1, "max": 2, "target": 1, "spares": 1},
                   "runPolicy.activeDeadlineSeconds": 60})
    assert baked_spec_hash(spec(**{"replicas": {"min": 1, "max": 2}})) == baked_spec_hash(live)
    assert baked_spec_hash(spec(**{STEPS: 999})) != base and baked_spec_hash(spec()) == base


def _job(new_steps: int, pods_hash: str, spec_generation: int = 2) -> JobView:
    workers = [pod(i, spec_generation=1, spec_hash=pods_hash) for i in range(2)]
    return replace(view(spec(**{STEPS: new_steps}), workers), spec_generation=spec_generation)


def test_workers_on_an_older_spec_are_named_once_then_cleared() -> None:
    old = baked_spec_hash(spec(**{STEPS: 400}))
    out = fresh()
    track_spec_change(out, _job(800, old))
    changed = condition(out.status, ConditionType.SPEC_CHANGED)
    assert changed is not None and changed.status == "True" and "j-worker-0, j-worker-1" in changed.message
    assert "suspend and resume" in changed.message and [e.reason for e in out.events] == ["SpecChanged"]
    out.events.clear()
    track_spec_change(out, _job(800, old))
    assert out.events == []  # said once
    recreated = replace(_job(800, old), pods=[pod(i, spec_generation=2, spec_hash=baked_spec_hash(spec(**{STEPS: 800})))
                                               for i in range(2)])
    track_spec_change(out, recreated)
    cleared = condition(out.status, ConditionType.SPEC_CHANGED)
    assert cleared is not None and cleared.status == "False" and cleared.reason == "SpecApplied"


def test_an_edit_of_a_live_field_only_is_no_change() -> None:
    out = fresh()
    track_spec_change(out, _job(400, baked_spec_hash(spec(**{STEPS: 400}))))  # e.g. a scale: generation 2, same hash
    assert condition(out.status, ConditionType.SPEC_CHANGED) is None and out.events == []


def test_pods_without_the_annotations_are_not_judged() -> None:
    out = fresh()
    track_spec_change(out, replace(view(spec(**{STEPS: 800}), [pod(0), pod(1)]), spec_generation=5))
    assert condition(out.status, ConditionType.SPEC_CHANGED) is None
