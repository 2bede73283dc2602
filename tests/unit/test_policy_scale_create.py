from flywheel.policy.decisions import CreatePod, DeletePod, ResetRendezvous
from flywheel.policy.scale_create import clean_up, create_missing
from tests.unit.policy_helpers import NOW, fresh, pod, spec, view


def test_clean_up_deletes_extra_and_decided_pods_and_force_deletes_lost_ones() -> None:
    pods = [pod(0, generation=1), pod(1, "Failed", exit_code=1), pod(2),
            pod(3, deleting_since=NOW - 10, node_lost=True)]
    out = clean_up(fresh(), view(spec(), pods, generation=1))
    assert out.actions == [DeletePod("j-worker-1", "u1-0"), DeletePod("j-worker-2", "u2-0"),
                           DeletePod("j-worker-3", "u3-0", force=True)]
    assert [e.reason for e in out.events] == ["ForceDeleted"]


def test_create_missing_reuses_free_names_and_resets_the_rendezvous_for_a_new_group() -> None:
    assert create_missing(fresh(), view(spec(), [pod(1)])).actions == [CreatePod(0, 0)]
    assert create_missing(fresh(), view(spec(), [pod(0, generation=0)], generation=1)).actions == []  # old group
    new_group = create_missing(fresh(), view(spec(), [], generation=1)).actions
    assert new_group == [ResetRendezvous(), CreatePod(0, 1), CreatePod(1, 1)]
