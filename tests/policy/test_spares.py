"""Warm spares (policy/spares.py and its place in create_missing / reconcile): pure rules."""

from __future__ import annotations

from dataclasses import replace

from flywheel.policy import reasons as R
from flywheel.policy.decisions import CreatePod, CreateSpare, DeletePod, PromoteSpare, Relabel, ResetRendezvous
from flywheel.policy.job_view import JobView
from flywheel.policy.observed import ObservedProgress, PodView
from flywheel.policy.scale_create import create_missing
from flywheel.policy.spares import keep_spares, split_roles
from flywheel.spec.status import Phase, TrainingJobStatus
from tests.builders import NOW, fresh, pod, reconcile, spare, spec, view


def with_spares(job: JobView, *spares: PodView) -> JobView:
    return replace(job, spares=list(spares))


def running(generation: int = 0) -> TrainingJobStatus:
    return TrainingJobStatus(phase=Phase.RUNNING, worker_generation=generation)


def test_split_roles_keeps_spares_apart() -> None:
    workers, spares = split_roles([pod(0), spare(0), pod(1)])
    assert [p.name for p in workers] == ["j-worker-0", "j-worker-1"]
    assert [p.name for p in spares] == ["j-spare-0"]


def test_spares_are_created_up_to_the_count_with_names_never_reused() -> None:
    out = fresh(next_spare=3)
    keep_spares(out, view(spec(**{"replicas.spares": 2}), [pod(0), pod(1)]))
    assert out.actions == [CreateSpare(3, 0), CreateSpare(4, 0)]
    assert out.status.next_spare == 5


def test_no_spares_by_default() -> None:
    out = fresh()
    keep_spares(out, view(spec(), [pod(0), pod(1)]))
    assert out.actions == [] and out.status.spares == 0


def test_status_counts_ready_spares_only() -> None:
    out = fresh()
    keep_spares(out, with_spares(view(spec(**{"replicas.spares": 2}), [pod(0), pod(1)]),
                                 spare(0), spare(1, ready=False)))
    assert out.actions == [] and out.status.spares == 1


def test_failed_spare_is_deleted_and_replaced() -> None:
    out = fresh(next_spare=1)
    keep_spares(out, with_spares(view(spec(**{"replicas.spares": 1}), [pod(0), pod(1)]),
                                 spare(0, phase="Failed", ready=False)))
    assert out.actions == [DeletePod("j-spare-0", "s0"), CreateSpare(1, 0)]


def test_extra_spares_go_not_ready_first() -> None:
    out = fresh()
    keep_spares(out, with_spares(view(spec(**{"replicas.spares": 1}), [pod(0), pod(1)]),
                                 spare(0), spare(1, ready=False)))
    assert out.actions == [DeletePod("j-spare-1", "s1")]


def test_a_ready_spare_an_index_waits_for_is_no_extra() -> None:
    """Worker 1's pod is going (a drain's move, a loss) and its index is not filled in this pass: the ready spare
    waits for it beyond the count (here 0, a drain's spare) and is neither deleted nor doubled."""
    out = fresh()
    job = with_spares(view(spec(), [pod(0), pod(1, deleting_since=NOW)]), spare(0), spare(1, ready=False))
    keep_spares(out, job)
    assert out.actions == [DeletePod("j-spare-1", "s1")]  # the one not ready is an extra
    out = fresh()
    keep_spares(out, with_spares(view(spec(**{"replicas.spares": 1}), [pod(0), pod(1, deleting_since=NOW)]),
                                 spare(0)))
    assert out.actions == [CreateSpare(0, 0)]  # the count is kept beside the one the index waits for


def test_a_new_spare_waits_for_the_job_to_train_again() -> None:
    out = fresh(Phase.RESTARTING)
    keep_spares(out, with_spares(view(spec(**{"replicas.spares": 2}), [pod(0), pod(1)]), spare(0)))
    assert out.actions == [] and out.status.spares == 1
    out = fresh(Phase.RUNNING)
    keep_spares(out, with_spares(view(spec(**{"replicas.spares": 2}), [pod(0), pod(1)]), spare(0)))
    assert out.actions == [CreateSpare(0, 0)]


def test_every_spare_goes_when_the_job_ended() -> None:
    out = fresh(Phase.SUCCEEDED)
    keep_spares(out, with_spares(view(spec(**{"replicas.spares": 1}), []), spare(0)))
    assert out.actions == [DeletePod("j-spare-0", "s0")]


def test_spares_survive_a_new_generation_relabelled() -> None:
    out = fresh(worker_generation=2)
    workers = [pod(0, generation=2), pod(1, generation=2)]
    keep_spares(out, with_spares(view(spec(**{"replicas.spares": 1}), workers, generation=2),
                                 spare(0, generation=1)))
    assert out.actions == [Relabel("j-spare-0", 2)]


def test_a_lost_worker_is_replaced_by_a_ready_spare_not_a_new_pod() -> None:
    """Worker scope, the pass after the decision: index 1's old pod is still terminating (older generation)."""
    old = pod(1, generation=0, deleting_since=NOW - 1)
    job = with_spares(view(spec(**{"replicas.spares": 1}), [pod(0, generation=1), old], generation=1), spare(0))
    out = fresh(worker_generation=1, last_restart_reason="PodDeleted")
    create_missing(out, job)
    assert out.actions == [PromoteSpare("j-spare-0", 1, 1)]
    assert out.events[0].reason == R.SPARE_PROMOTED
    assert out.events[0].message == "spare j-spare-0 took replica 1 (worker j-worker-1 lost: PodDeleted)"


def test_without_a_ready_spare_the_index_waits_for_its_name_then_gets_a_pod() -> None:
    old = pod(1, generation=0, deleting_since=NOW - 1)
    job = with_spares(view(spec(**{"replicas.spares": 1}), [pod(0, generation=1), old], generation=1),
                      spare(0, ready=False))
    out = fresh(worker_generation=1)
    create_missing(out, job)
    assert out.actions == []
    out = fresh(worker_generation=1)
    create_missing(out, with_spares(view(spec(), [pod(0, generation=1)], generation=1), spare(0, ready=False)))
    assert out.actions == [CreatePod(1, 1)]


def test_a_worker_gone_before_the_pass_is_replaced_all_the_same() -> None:
    """Force-deleted with grace 0: the pass that promotes never saw the old pod."""
    out = fresh(worker_generation=1, last_restart_reason="PodDeleted")
    create_missing(out, with_spares(view(spec(**{"replicas.spares": 1}), [pod(0, generation=1)], generation=1),
                                    spare(0)))
    assert out.actions == [PromoteSpare("j-spare-0", 1, 1)]
    assert out.events[0].message == "spare j-spare-0 took replica 1 (its worker lost: PodDeleted)"


def test_a_spare_on_a_node_no_worker_uses_is_preferred() -> None:
    job = with_spares(view(spec(**{"replicas.spares": 2}), [pod(0, generation=1, node="a")], generation=1),
                      spare(0, node="a"), spare(1, node="b"))
    out = fresh(worker_generation=1)
    create_missing(out, job)
    assert out.actions == [PromoteSpare("j-spare-1", 1, 1)]


def test_a_whole_new_group_waits_for_the_old_one_and_its_fresh_rendezvous() -> None:
    old = [pod(0, deleting_since=NOW - 1), pod(1, deleting_since=NOW - 1)]
    out = fresh(worker_generation=1)
    create_missing(out, with_spares(view(spec(**{"replicas.spares": 1}), old, generation=1), spare(0)))
    assert out.actions == []
    out = fresh(worker_generation=1)
    create_missing(out, with_spares(view(spec(**{"replicas.spares": 1}), [], generation=1), spare(0)))
    assert out.actions == [ResetRendezvous(), PromoteSpare("j-spare-0", 0, 1), CreatePod(1, 1)]


def test_reconcile_promotes_and_creates_a_spare_behind() -> None:
    pods = [pod(0, generation=1), pod(1, generation=0, deleting_since=NOW - 1), spare(0)]
    result = reconcile(spec(**{"replicas.spares": 1}), None, running(1).model_copy(update={"next_spare": 1}), pods,
                       ObservedProgress(), NOW)
    assert result.status.phase is Phase.RESTARTING
    assert result.actions == [PromoteSpare("j-spare-0", 1, 1)]  # the spare behind waits for the job to train
    assert result.status.replicas.current == 2  # worker 0, and the spare promoted to worker 1 by this pass
    assert result.status.spares == 0
    promoted = PodView(name="j-spare-0", uid="s0", index=1, generation=1, phase="Running", ready=True)
    trains = reconcile(spec(**{"replicas.spares": 1}), None, result.status, [pod(0, generation=1), promoted],
                       ObservedProgress(step=5, world_size=2), NOW + 2)
    assert trains.status.phase is Phase.RUNNING and trains.actions == [CreateSpare(1, 1)]


def test_spares_never_count_as_workers_for_failure_or_readiness() -> None:
    pods = [pod(0), pod(1), spare(0, phase="Failed", ready=False, exit_code=1, reason="Error")]
    result = reconcile(spec(**{"replicas.spares": 1}), None, running(0), pods, ObservedProgress(), NOW)
    assert result.status.phase is Phase.RUNNING and result.status.restarts == 0
    assert result.status.replicas.ready == 2
    assert DeletePod("j-spare-0", "s0") in result.actions


def test_an_interrupted_promotion_is_repeated() -> None:
    """Relabelled to worker 1 but the agent still holds its spare key: the operator stopped before the promotion."""
    promoted = PodView(name="j-spare-0", uid="s0", index=1, generation=1, phase="Running", ready=True,
                       spare_ready=True)
    result = reconcile(spec(), None, running(1), [pod(0, generation=1), promoted], ObservedProgress(), NOW)
    assert PromoteSpare("j-spare-0", 1, 1) in result.actions
    assert not any(isinstance(a, CreatePod) for a in result.actions)


def test_a_lost_node_with_a_ready_spare_replaces_only_its_worker() -> None:
    """The survivors stay (their agents restart their ranks in place when the spare joins); recreating them too made
    every one a cold pod, and a spare-backed job lost a node at no-spare cost (bench/goodput_operator)."""
    pods = [pod(0), pod(1, liveness_lost=True), spare(0)]
    result = reconcile(spec(**{"replicas.spares": 1}), None, running(0), pods, ObservedProgress(), NOW)
    deleted = [a.name for a in result.actions if isinstance(a, DeletePod)]
    assert deleted == ["j-worker-1"]
    assert Relabel("j-worker-0", 1) in result.actions
    assert result.status.last_restart_reason == "NodeLost"
    without = reconcile(spec(**{"replicas.spares": 1}), None, running(0), [pod(0), pod(1, liveness_lost=True),
                                                                           spare(0, ready=False)],
                        ObservedProgress(), NOW)
    assert sorted(a.name for a in without.actions if isinstance(a, DeletePod)) == ["j-worker-0", "j-worker-1"]
