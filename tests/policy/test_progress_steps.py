"""The two steps of the pass that keep a small memory for the executor (policy/observed.py `Observed`): the progress
hang (policy/progress_hang.py), reported once per generation, and the CheckpointCommitted throttle
(policy/checkpoint_events.py); both make the pass due when their time comes (`Pass.next_due`)."""

from __future__ import annotations

from flywheel.policy import reasons as R
from flywheel.policy.checkpoint_events import CHECKPOINT_EVENT_INTERVAL_SECONDS, CommittedCheckpoint
from flywheel.policy.decisions import Relabel
from flywheel.policy.observed import ObservedProgress, ProgressClock
from flywheel.spec.status import Phase, TrainingJobStatus
from tests.builders import NOW, fresh, pod, reconcile, spec

RUNNING = [pod(0, agent_alive=True), pod(1, agent_alive=True)]


def _running() -> TrainingJobStatus:
    return reconcile(spec(), None, TrainingJobStatus(), RUNNING, ObservedProgress(), NOW - 1000).status


def test_a_progress_hang_is_decided_in_its_pass_and_reported_once_per_generation() -> None:
    stepped = ProgressClock(running_since=NOW - 500, last_step_seen=NOW - 61)  # progressTimeoutSeconds: 60
    out = reconcile(spec(), None, _running(), RUNNING, ObservedProgress(step=3), NOW, progress_clock=stepped)
    assert out.hang is not None and out.hang.stepped and out.hang_reported == 0
    assert R.HUNG in [e.reason for e in out.events] and Relabel("j-worker-0", 1) in out.actions
    again = reconcile(spec(), None, _running(), RUNNING, ObservedProgress(step=3), NOW, progress_clock=stepped,
                      hang_reported=0)
    assert again.hang is None and again.hang_reported == 0 and again.actions == []


def test_a_progress_hang_to_come_makes_the_pass_due_and_a_stopped_job_is_not_judged() -> None:
    clock = ProgressClock(running_since=NOW - 500, last_step_seen=NOW - 10)
    out = reconcile(spec(), None, _running(), RUNNING, ObservedProgress(step=3), NOW, progress_clock=clock)
    assert out.hang is None and out.next_due == NOW + 50
    suspended = fresh(Phase.SUSPENDED).status
    late = ProgressClock(running_since=NOW - 500, last_step_seen=NOW - 100)
    assert reconcile(spec(), None, suspended, [], ObservedProgress(), NOW, progress_clock=late).hang is None


def test_checkpoint_events_are_held_back_by_the_interval_and_their_memory_handed_back() -> None:
    first = (CommittedCheckpoint(1, 5, "/c/5", NOW - 2),)
    out = reconcile(spec(), None, _running(), RUNNING, ObservedProgress(checkpoints=first), NOW)
    assert out.checkpoints is not None and out.checkpoints.event is not None  # a new executor: seeded, then posted
    memory = out.checkpoints.memory
    both = (*first, CommittedCheckpoint(2, 10, "/c/10", NOW))
    held = reconcile(spec(), None, out.status, RUNNING, ObservedProgress(checkpoints=both), NOW + 1,
                     checkpoint_events=memory)
    assert held.checkpoints is not None and held.checkpoints.event is None
    assert held.next_due == NOW + CHECKPOINT_EVENT_INTERVAL_SECONDS
