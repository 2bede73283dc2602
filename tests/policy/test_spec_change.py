"""A spec edited while the job runs: the workers created before keep the baked part (policy/spec_change.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from flywheel.policy import reasons as R
from flywheel.policy.conditions import condition
from flywheel.policy.decisions import CreatePod, CreateSpare, DeletePod, Pass, Relabel, ResetRendezvous
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import ObservedProgress, PodView
from flywheel.policy.spec_change import baked_spec_hash, track_spec_change
from flywheel.spec import TrainingJobSpec
from flywheel.spec.status import ConditionType, Phase, TrainingJobStatus
from tests.builders import NOW, fresh, pod, reconcile, spare, spec, view

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


# -- a worker never joins workers on an older spec -------------------------------------------------------------
WORKER_SCOPE = {"faultTolerance.restartScope": "worker"}


def _stale(index: int, **kw: Any) -> PodView:
    """A worker created at spec generation 1, when the job trained 400 steps (the job now says 800)."""
    return pod(index, spec_generation=1, spec_hash=baked_spec_hash(spec(**WORKER_SCOPE, **{STEPS: 400})), **kw)


def _pass(s: TrainingJobSpec, status: TrainingJobStatus, pods: list[PodView]) -> Pass:
    return reconcile(s, None, status, pods, ObservedProgress(), NOW, generation=2)


def test_a_replacement_beside_workers_on_an_older_spec_recreates_the_group() -> None:
    """Worker scope: worker 1 is deleted by someone; its survivor runs the old spec. The failure is decided as
    usual (the survivor joins the new generation), but the replacement is not created beside it: the survivor goes
    too, and the whole group is created again with the job's spec -- no second restart counted."""
    edited = spec(**WORKER_SCOPE, **{STEPS: 800})
    decided = _pass(edited, TrainingJobStatus(phase=Phase.RUNNING, worker_generation=0),
                    [_stale(0), _stale(1, deleting_since=NOW - 1)])
    assert decided.status.restarts == 1 and decided.status.last_restart_reason == "PodDeleted"
    assert Relabel("j-worker-0", 1) in decided.actions
    regroup = _pass(edited, decided.status, [_stale(0, generation=1)])
    assert [a for a in regroup.actions if isinstance(a, CreatePod | Relabel)] == []
    assert DeletePod("j-worker-0", "u0-1") in regroup.actions
    status = regroup.status
    assert status.generation == 2 and status.restarts == 1 and status.phase is Phase.RESTARTING
    restarting = condition(status, ConditionType.RESTARTING)
    assert restarting is not None and restarting.reason == R.SPEC_REGROUP
    assert "replica(s) 1 would have joined j-worker-0" in restarting.message
    assert [e.reason for e in regroup.events if e.reason == R.SPEC_REGROUP] == [R.SPEC_REGROUP]
    # The old worker still terminating: nothing is created, and its end is no failure.
    waiting = _pass(edited, status, [_stale(0, generation=1, deleting_since=NOW)])
    assert [a for a in waiting.actions if isinstance(a, CreatePod)] == [] and waiting.status.restarts == 1
    # Gone: the whole group, on a fresh rendezvous.
    created = _pass(edited, waiting.status, [])
    assert [a for a in created.actions if isinstance(a, CreatePod)] == [CreatePod(0, 2), CreatePod(1, 2)]
    assert ResetRendezvous() in created.actions


def test_a_scale_up_beside_workers_on_an_older_spec_recreates_the_group_without_a_restart() -> None:
    elastic = {"replicas": {"min": 1, "max": 2, "target": 2}}  # scaled up from 1
    edited = spec(**elastic, **{STEPS: 800})
    old = baked_spec_hash(spec(**elastic, **{STEPS: 400}))
    out = _pass(edited, TrainingJobStatus(phase=Phase.RUNNING), [pod(0, spec_generation=1, spec_hash=old)])
    assert [a for a in out.actions if isinstance(a, CreatePod)] == []
    assert [a.name for a in out.actions if isinstance(a, DeletePod)] == ["j-worker-0"]
    assert out.status.generation == 1 and out.status.restarts == 0 and out.status.phase is Phase.RESTARTING
    # A scale up alone (the baked spec unchanged) adds the worker to the running group.
    same = [pod(0, spec_generation=1, spec_hash=baked_spec_hash(edited))]
    out = _pass(edited, TrainingJobStatus(phase=Phase.RUNNING), same)
    assert CreatePod(1, 0) in out.actions and not any(isinstance(a, DeletePod) for a in out.actions)


def test_an_older_generation_on_an_older_spec_is_deleted_whatever_the_scope() -> None:
    """A regroup's pass repeated after an operator crash (its deletes never sent): clean_up finishes it."""
    out = _pass(spec(**WORKER_SCOPE, **{STEPS: 800}),
                TrainingJobStatus(phase=Phase.RESTARTING, worker_generation=2),
                [_stale(0, generation=1), _stale(1, generation=1)])
    assert {a.name for a in out.actions if isinstance(a, DeletePod)} == {"j-worker-0", "j-worker-1"}
    assert not any(isinstance(a, CreatePod) for a in out.actions)


def test_a_spare_on_an_older_spec_is_replaced() -> None:
    edited = spec(**{"replicas.spares": 1, STEPS: 800})
    current = baked_spec_hash(edited)
    workers = [pod(i, spec_generation=2, spec_hash=current) for i in range(2)]
    old_spare = spare(0, spec_generation=1, spec_hash=baked_spec_hash(spec(**{"replicas.spares": 1, STEPS: 400})))
    out = _pass(edited, TrainingJobStatus(phase=Phase.RUNNING, next_spare=1), [*workers, old_spare])
    assert DeletePod("j-spare-0", "s0") in out.actions and CreateSpare(1, 0) in out.actions
