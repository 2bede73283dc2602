"""Spare placement (policy/spare_placement.py through keep_spares and next_due): a ready spare beside a worker is
moved to a free node, and a move that finds no room is given up without churning pods."""

from __future__ import annotations

from dataclasses import replace

from flywheel.contracts.timefmt import rfc3339
from flywheel.policy import reasons as R
from flywheel.policy.decisions import CreateSpare, DeletePod, Pass
from flywheel.policy.due import next_due
from flywheel.policy.job_view import JobView
from flywheel.policy.spare_placement import MOVE_NODES, MOVE_TIMEOUT_SECONDS, free_nodes, spare_number
from flywheel.policy.spares import keep_spares
from flywheel.spec.status import DrainStatus, Phase, SpareMoveStatus
from tests.builders import NOW, fresh, pod, spare, spec, view

NODES = frozenset({"a", "b", "c"})


def placed(*spares_on: tuple[int, str, bool], usable: frozenset[str] = NODES, now: float = NOW) -> JobView:
    """Workers 0 on a, 1 on c; spares (number, node, ready)."""
    job = view(spec(**{"replicas.spares": 1}), [pod(0, node="a"), pod(1, node="c")], now=now)
    return replace(job, spares=[spare(n, ready=r, node=node) for n, node, r in spares_on], usable_nodes=usable)


def moving(number: int, started: float = NOW, gave_up_on: list[str] | None = None) -> Pass:
    return fresh(next_spare=number + 1, spare_move=SpareMoveStatus(
        spare=number, started_at=rfc3339(started), nodes=["b"], gave_up_on=gave_up_on or []))


def test_a_spare_beside_a_worker_gets_a_new_one_required_on_the_free_node() -> None:
    out = fresh(next_spare=4)
    keep_spares(out, placed((3, "a", True)))
    assert out.actions == [CreateSpare(4, 0, ("b",))]
    assert out.status.spare_move.spare == 4 and out.status.spare_move.nodes == ["b"] and out.status.next_spare == 5


def test_no_move_for_a_well_placed_spare_a_full_pool_or_no_node_inventory() -> None:
    for job in (placed((3, "b", True)), placed((3, "a", True), usable=frozenset({"a", "c"})),
                placed((3, "a", True), usable=frozenset())):
        out = fresh(next_spare=4)
        keep_spares(out, job)
        assert out.actions == [] and out.status.spare_move.spare == -1


def test_no_move_while_restarting_draining_or_a_spare_is_still_starting() -> None:
    two_spares = replace(placed((3, "a", True), (4, "b", False)), spec=spec(**{"replicas.spares": 2}))
    for out, job in [(fresh(Phase.RESTARTING, next_spare=5), placed((3, "a", True))),
                     (fresh(next_spare=5, drain=DrainStatus(node="c", cause="cordoned")), placed((3, "a", True))),
                     (fresh(next_spare=5), two_spares)]:
        keep_spares(out, job)
        assert not [a for a in out.actions if isinstance(a, CreateSpare)], out.actions
        assert out.status.spare_move.spare == -1


def test_while_the_new_spare_starts_both_are_kept() -> None:
    out = moving(4)
    keep_spares(out, placed((3, "a", True), (4, "b", False), now=NOW + 10))
    assert out.actions == [] and out.status.spare_move.spare == 4


def test_a_new_spare_not_seen_yet_is_waited_for_without_another_create() -> None:
    out = moving(4)
    keep_spares(out, placed((3, "a", True), now=NOW + 1))  # the cache is behind the create
    assert out.actions == [] and out.status.spare_move.spare == 4


def test_once_warm_the_spare_beside_the_worker_goes() -> None:
    out = moving(4)
    keep_spares(out, placed((3, "a", True), (4, "b", True), now=NOW + 12))
    assert out.actions == [DeletePod("j-spare-3", "s3")]
    assert out.status.spare_move.spare == -1 and out.status.spares == 1
    assert [e.reason for e in out.events] == [R.SPARE_MOVED] and "j-spare-4" in out.events[0].message


def test_a_move_with_no_room_is_given_up_once_and_not_retried_on_the_same_nodes() -> None:
    out = moving(4)
    job = placed((3, "a", True), (4, None, False), now=NOW + MOVE_TIMEOUT_SECONDS)  # type: ignore[arg-type]
    keep_spares(out, job)
    assert out.actions == [DeletePod("j-spare-4", "s4")]
    assert out.status.spare_move.spare == -1 and out.status.spare_move.gave_up_on == ["b"]
    assert [e.reason for e in out.events] == [R.SPARE_NOT_MOVED] and "b" in out.events[0].message
    again = fresh(next_spare=5, spare_move=out.status.spare_move)
    keep_spares(again, placed((3, "a", True), now=NOW + MOVE_TIMEOUT_SECONDS + 1))
    assert again.actions == []
    bigger = fresh(next_spare=5, spare_move=out.status.spare_move)  # another node became usable: it is tried
    keep_spares(bigger, placed((3, "a", True), usable=NODES | {"d"}, now=NOW + MOVE_TIMEOUT_SECONDS + 1))
    assert bigger.actions == [CreateSpare(5, 0, ("d",))] and bigger.status.spare_move.gave_up_on == ["b"]
    bigger.status.spare_move.started_at = rfc3339(NOW)  # ... and given up on too: both are remembered
    keep_spares(bigger, placed((3, "a", True), (5, None, False), usable=NODES | {"d"},  # type: ignore[arg-type]
                               now=NOW + MOVE_TIMEOUT_SECONDS + 1))
    assert bigger.status.spare_move.gave_up_on == ["b", "d"] and bigger.status.spare_move.spare == -1
    back = fresh(next_spare=6, spare_move=bigger.status.spare_move)  # b left and came back: it may have room now
    keep_spares(back, placed((3, "a", True), usable=frozenset({"a", "c"}), now=NOW + 200))
    assert back.actions == [] and back.status.spare_move.gave_up_on == []
    keep_spares(back, placed((3, "a", True), now=NOW + 201))
    assert back.actions == [CreateSpare(6, 0, ("b",))]


def test_a_move_asks_for_a_bounded_list_of_nodes() -> None:
    out = fresh(next_spare=4)
    many = frozenset({"a", "c", *(f"n{i:03d}" for i in range(100))})
    keep_spares(out, placed((3, "a", True), usable=many))
    (create,) = out.actions
    assert isinstance(create, CreateSpare) and create.nodes == tuple(f"n{i:03d}" for i in range(MOVE_NODES))


def test_a_move_ends_when_its_reason_goes() -> None:
    # The spare beside the worker was promoted (it is a worker now): the new spare is the one spare, kept.
    out = moving(4)
    job = replace(placed((4, "b", False), now=NOW + 3), pods=[pod(0, node="a"), pod(1, node="c")])
    keep_spares(out, job)
    assert out.actions == [] and out.status.spare_move.spare == -1
    # The new spare itself was promoted.
    out = moving(4)
    promoted = replace(pod(1, node="b"), name="j-spare-4")
    keep_spares(out, replace(placed((3, "a", True), now=NOW + 3), pods=[pod(0, node="a"), promoted]))
    assert out.status.spare_move.spare == -1
    # The job restarts: the starting new spare is an extra, and goes first.
    out = moving(4)
    out.status.phase = Phase.RESTARTING
    keep_spares(out, placed((3, "a", True), (4, "b", False), now=NOW + 3))
    assert out.actions == [DeletePod("j-spare-4", "s4")] and out.status.spare_move.spare == -1


def test_extras_beside_a_worker_go_before_well_placed_ones() -> None:
    out = fresh(next_spare=9)
    keep_spares(out, placed((7, "b", True), (8, "a", True)))
    assert out.actions == [DeletePod("j-spare-8", "s8")]


def test_the_give_up_is_due_without_another_event() -> None:
    out = moving(4)
    job = placed((3, "a", True), (4, None, False), now=NOW + 5)  # type: ignore[arg-type]
    keep_spares(out, job)
    assert next_due(out.status, job) == NOW + MOVE_TIMEOUT_SECONDS


def test_free_nodes_and_spare_numbers() -> None:
    assert free_nodes(placed((3, "a", True)), []) == ["b"]
    assert free_nodes(placed(), placed((3, "b", True)).spares) == []
    assert spare_number("my-job-spare-12") == 12 and spare_number("my-job-worker-1") == -1
    assert spare_number("spare-3") == -1
