"""A refused create (a quota, an admission webhook) shows in the status as the ReplicaFailure condition while it
lasts, not only as an event; it turns False once the creates go through, and the phase ends it."""

from __future__ import annotations

from flywheel.operator.create_failures import STALE_SECONDS, CreateFailures
from flywheel.policy import reasons as R
from flywheel.policy.conditions import condition, set_phase
from flywheel.policy.observed import ObservedProgress
from flywheel.spec.status import ConditionType, Phase
from tests.builders import NOW, fresh, pod, reconcile, spec

REFUSED = "could not create pod j-worker-1: exceeded quota: pods"


def _pass(status, failures=(), **spec_changes):
    return reconcile(spec(**spec_changes), None, status, [pod(0)], ObservedProgress(), NOW,
                     create_failures=failures).status


def test_a_refused_create_is_a_condition_until_it_goes_through() -> None:
    failing = _pass(fresh().status, (REFUSED,))
    held = condition(failing, ConditionType.REPLICA_FAILURE)
    assert held is not None and (held.status, held.reason, held.message) == ("True", R.CREATE_FAILED, REFUSED)
    through = _pass(failing)
    ended = condition(through, ConditionType.REPLICA_FAILURE)
    assert ended is not None and (ended.status, ended.reason) == ("False", R.CREATED_AFTER_FAILURE)
    assert condition(_pass(fresh().status), ConditionType.REPLICA_FAILURE) is None  # never failed: absent


def test_a_suspended_or_finished_job_shows_no_create_failure() -> None:
    failing = _pass(fresh().status, (REFUSED,))
    suspended = _pass(failing, (REFUSED,), suspend=True)
    assert condition(suspended, ConditionType.REPLICA_FAILURE).status == "False"  # type: ignore[union-attr]
    set_phase(failing, Phase.FAILED, "X", "x", NOW)
    assert condition(failing, ConditionType.REPLICA_FAILURE).status == "False"  # type: ignore[union-attr]


def test_the_record_keeps_open_failures_only() -> None:
    record = CreateFailures()
    record.failed("j-worker-1", "w1 refused", 100.0)
    record.failed("j-workers", "service refused", 100.0)
    assert record.current(set(), 101.0) == ("w1 refused", "service refused")
    record.created("j-workers")
    assert record.current({"j-worker-1"}, 101.0) == ()  # it exists now: created after all
    record.failed("j-worker-2", "w2 refused", 100.0)
    assert record.current(set(), 100.0 + STALE_SECONDS) == ()  # not tried again: no longer wanted
