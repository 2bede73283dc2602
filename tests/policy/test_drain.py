"""Drain ahead (policy/drain.py and its place in reconcile): pure rules."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from flywheel.contracts.timefmt import rfc3339
from flywheel.policy import reasons as R
from flywheel.policy.decisions import (
    ClearCheckpointRequest,
    CreatePod,
    CreateSpare,
    DeletePod,
    PromoteSpare,
    Relabel,
    RequestCheckpoint,
)
from flywheel.policy.drain import (
    DRAIN_PREPARE_SECONDS,
    DRAIN_TIMEOUT_SECONDS,
    MOVE_GRACE_SECONDS,
    XID_DRAIN_TIMEOUT_SECONDS,
    DrainInput,
    NodeMarks,
    answered_step,
    drain_ahead,
    drain_due,
)
from flywheel.policy.observed import ObservedProgress, PodView
from flywheel.spec.status import DrainStatus, Phase, RestartBudgetStatus, TrainingJobStatus
from tests.builders import NOW, pod, reconcile, spare, spec, view

CORDONED = {"n1": NodeMarks(unschedulable=True)}


def on(index: int, node: str, generation: int = 0, **kw: Any) -> PodView:
    return pod(index, generation=generation, node=node, **kw)


def running(**fields: Any) -> TrainingJobStatus:
    return TrainingJobStatus(phase=Phase.RUNNING, worker_generation=0, world_size=2, **fields)


def draining(at: float = NOW, request_id: str = "r1", replacements: int = 0, **fields: Any) -> TrainingJobStatus:
    return running(drain=DrainStatus(node="n1", cause="is cordoned", request_id=request_id,
                                     requested_at=rfc3339(at), started_at=rfc3339(at), replacements=replacements),
                   **fields)


def decide(status: TrainingJobStatus, pods: list[PodView], seen: DrainInput, now: float = NOW, **spec_kw: Any):
    return reconcile(spec(**spec_kw), None, status, pods, ObservedProgress(step=10, world_size=2), now, drain=seen)


PODS = [on(0, "n0"), on(1, "n1")]


@pytest.mark.parametrize("marks, cause", [
    (NodeMarks(unschedulable=True), "is cordoned"),
    # kubectl cordon on a real cluster: the node lifecycle controller's taint comes with spec.unschedulable.
    (NodeMarks(unschedulable=True, taints=("node.kubernetes.io/unschedulable",)), "is cordoned"),
    (NodeMarks(taints=("node.kubernetes.io/unschedulable",)), "is cordoned"),
    (NodeMarks(unschedulable=True, taints=("node.kubernetes.io/unschedulable", "karpenter.sh/disrupted")),
     "is tainted karpenter.sh/disrupted"),
    (NodeMarks(taints=("nvsentinel.dgxc.nvidia.com/cordon",)), "is tainted nvsentinel.dgxc.nvidia.com/cordon"),
    (NodeMarks(fatal_xid="XID 79 on GPU 0"), "has a fatal GPU XID (XID 79 on GPU 0)"),
])
def test_each_trigger_requests_a_checkpoint_and_records_the_drain(marks: NodeMarks, cause: str) -> None:
    # A ready spare off the node waits for the worker: the checkpoint is asked at once.
    out = decide(running(), PODS + [spare(0, node="n2")], DrainInput(nodes={"n1": marks}), **{"replicas.spares": 1})
    drain = out.status.drain
    assert (drain.node, drain.cause) == ("n1", cause) and drain.request_id and drain.requested_at
    assert RequestCheckpoint(drain.request_id, f"node n1 {cause}", moving=(1,)) in out.actions  # worker 1 is on n1
    assert not any(isinstance(a, DeletePod) for a in out.actions)  # nothing moves before the checkpoint
    assert out.status.phase is Phase.RUNNING and out.status.restarts == 0
    drained = [e for e in out.events if e.reason == R.NODE_DRAINING]
    assert len(drained) == 1 and "j-worker-1" in drained[0].message
    assert drain.replacements == 0 and drain.started_at == drain.requested_at
    assert not any(isinstance(a, CreateSpare) for a in out.actions)


def preparing(replacements: int = 1, at: float = NOW) -> TrainingJobStatus:
    return running(drain=DrainStatus(node="n1", cause="is cordoned", started_at=rfc3339(at),
                                     replacements=replacements))


def test_without_a_ready_spare_a_warm_pod_starts_before_the_checkpoint() -> None:
    """No spare at all: one is started for the drain (the cordon keeps it off n1) and the job trains on; no
    checkpoint is asked yet, so nothing stalls while the new pod imports."""
    out = decide(running(), PODS, DrainInput(nodes=CORDONED))
    drain = out.status.drain
    assert (drain.node, drain.replacements, drain.request_id) == ("n1", 1, "") and drain.started_at
    assert [a for a in out.actions if isinstance(a, CreateSpare)] == [CreateSpare(0, 0)]
    assert not any(isinstance(a, (RequestCheckpoint, DeletePod)) for a in out.actions)
    assert out.status.phase is Phase.RUNNING and out.status.restarts == 0
    message = next(e.message for e in out.events if e.reason == R.NODE_DRAINING)
    assert "j-worker-1" in message and "1 new spare" in message and "trains on" in message


def test_a_spare_on_the_draining_node_is_replaced_before_the_checkpoint() -> None:
    out = decide(running(), PODS + [spare(0, node="n1")], DrainInput(nodes=CORDONED), **{"replicas.spares": 1})
    assert DeletePod("j-spare-0", "s0") in out.actions
    # Its replacement (the job keeps one spare anyway) is the warm pod the drain waits for: none beyond it.
    assert out.status.drain.replacements == 0 and not out.status.drain.request_id
    assert [a for a in out.actions if isinstance(a, CreateSpare)] == [CreateSpare(0, 0)]
    two = decide(running(), [on(0, "n1"), on(1, "n1"), spare(0, node="n1")], DrainInput(nodes=CORDONED),
                 **{"replicas.spares": 1})
    assert two.status.drain.replacements == 1 and len([a for a in two.actions if isinstance(a, CreateSpare)]) == 2


def test_a_spare_still_starting_off_the_node_is_waited_for_without_another() -> None:
    out = decide(running(), PODS + [spare(0, node="n2", ready=False)], DrainInput(nodes=CORDONED),
                 **{"replicas.spares": 1})
    assert out.status.drain.replacements == 0 and not out.status.drain.request_id
    assert not any(isinstance(a, (CreateSpare, DeletePod, RequestCheckpoint)) for a in out.actions)


def test_a_spare_on_another_leaving_node_does_not_count() -> None:
    nodes = {**CORDONED, "n2": NodeMarks(taints=("karpenter.sh/disrupted",))}
    out = decide(running(), PODS + [spare(0, node="n2")], DrainInput(nodes=nodes), **{"replicas.spares": 1})
    assert out.status.drain.replacements == 1 and not out.status.drain.request_id


def test_the_checkpoint_is_asked_once_the_replacement_is_warm() -> None:
    waiting = decide(preparing(), PODS + [spare(0, node="n2", ready=False)], DrainInput(nodes=CORDONED), now=NOW + 3)
    assert not any(isinstance(a, (RequestCheckpoint, CreateSpare, DeletePod)) for a in waiting.actions)
    assert waiting.next_due == NOW + DRAIN_PREPARE_SECONDS
    out = decide(preparing(), PODS + [spare(0, node="n2")], DrainInput(nodes=CORDONED), now=NOW + 4)
    drain = out.status.drain
    assert drain.request_id and drain.requested_at == rfc3339(NOW + 4) and drain.started_at == rfc3339(NOW)
    assert RequestCheckpoint(drain.request_id, "node n1 is cordoned", (1,)) in out.actions
    assert not any(isinstance(a, (CreateSpare, DeletePod)) for a in out.actions)  # the drain's spare is kept


def test_replacements_not_warm_within_the_bound_ask_for_the_checkpoint_anyway() -> None:
    out = decide(preparing(), PODS + [spare(0, node="", ready=False)], DrainInput(nodes=CORDONED),
                 now=NOW + DRAIN_PREPARE_SECONDS)
    assert out.status.drain.request_id and any(isinstance(a, RequestCheckpoint) for a in out.actions)
    assert any(e.type == "Warning" and "not warm after 120s" in e.message for e in out.events)


def test_the_drains_spare_survives_the_move_and_takes_the_index() -> None:
    """spares: 0. The spare started for the drain is no extra to delete when the drain ends with the move: the
    moved index waits for it; once promoted no spare is left or created."""
    seen = DrainInput(nodes=CORDONED, request_id="r1", answers={0: ("r1", 12), 1: ("r1", 12)})
    status = draining(replacements=1)
    moved = decide(status, PODS + [spare(0, node="n2")], seen, now=NOW + 3)
    assert moved.status.drain.replacements == 0 and moved.status.last_restart_reason == R.NODE_DRAINING
    assert not any(isinstance(a, (CreateSpare, CreatePod)) for a in moved.actions)
    assert DeletePod("j-spare-0", "s0") not in moved.actions
    after = [on(0, "n0", generation=1), on(1, "n1", deleting_since=NOW + 3.5), spare(0, node="n2")]
    nxt = decide(moved.status, after, DrainInput(nodes=CORDONED), now=NOW + 4)
    assert PromoteSpare("j-spare-0", 1, 1) in nxt.actions
    assert not any(isinstance(a, (CreateSpare, CreatePod)) for a in nxt.actions)


def test_a_drain_given_up_while_preparing_lets_its_spare_go() -> None:
    pods = [on(0, "n0", phase="Failed", exit_code=1), on(1, "n1")]
    out = decide(preparing(), pods + [spare(0, node="n2", ready=False)], DrainInput(nodes=CORDONED), now=NOW + 2)
    assert out.status.drain.node == "" and out.status.drain.replacements == 0
    assert DeletePod("j-spare-0", "s0") in out.actions


def test_a_fatal_xid_asks_at_once_even_without_a_spare() -> None:
    out = decide(running(), PODS, DrainInput(nodes={"n1": NodeMarks(fatal_xid="XID 79")}))
    assert out.status.drain.request_id and any(isinstance(a, RequestCheckpoint) for a in out.actions)
    # No spare started for a move that will not wait for it (it would go again as an extra).
    assert out.status.drain.replacements == 0 and not any(isinstance(a, CreateSpare) for a in out.actions)


def test_unmarked_nodes_and_nodes_without_workers_start_nothing() -> None:
    assert decide(running(), PODS, DrainInput(nodes={"n1": NodeMarks()})).status.drain.node == ""
    assert decide(running(), PODS, DrainInput(nodes={"n9": NodeMarks(unschedulable=True)})).status.drain.node == ""


def test_only_a_running_job_drains_ahead() -> None:
    status = running()
    status.phase = Phase.RESTARTING
    out = decide(status, PODS, DrainInput(nodes=CORDONED))
    assert out.status.drain.node == "" and not any(isinstance(a, RequestCheckpoint) for a in out.actions)


def test_spares_on_the_draining_node_go_at_once() -> None:
    out = decide(running(), PODS + [spare(0, node="n1"), spare(1, node="n2")], DrainInput(nodes=CORDONED),
                 **{"replicas.spares": 2})
    assert DeletePod("j-spare-0", "s0") in out.actions and DeletePod("j-spare-1", "s1") not in out.actions


def test_waiting_for_the_answers_repeats_the_request_and_moves_nothing() -> None:
    seen = DrainInput(nodes=CORDONED, request_id="r1", answers={0: ("r1", 12)})  # rank 1 has not answered yet
    out = decide(draining(), PODS, seen, now=NOW + 5)
    assert out.actions == [RequestCheckpoint("r1", "node n1 is cordoned", (1,))]
    assert out.status.drain.request_id == "r1" and out.status.restarts == 0


def test_every_rank_answered_moves_the_worker_without_budget() -> None:
    seen = DrainInput(nodes=CORDONED, request_id="r1", answers={0: ("r1", 12), 1: ("r1", 12)})
    out = decide(draining(restart_budget=RestartBudgetStatus(used=1)), PODS, seen, now=NOW + 3)
    status = out.status
    assert status.last_restart_reason == R.NODE_DRAINING and status.restarts == 1 and status.generation == 1
    assert status.restart_budget.used == 1  # a planned move is no failure
    assert status.phase is Phase.RESTARTING and status.drain.node == ""
    assert DeletePod("j-worker-1", "u1-0", grace_seconds=MOVE_GRACE_SECONDS) in out.actions
    assert Relabel("j-worker-0", 1) in out.actions
    # The answered request stays while the moved pod is there: it keeps that worker's agent out of the new group.
    assert ClearCheckpointRequest() not in out.actions
    moved = [e for e in out.events if e.reason == R.NODE_DRAINING]
    assert moved and "n1" in moved[0].message and "step 12" in moved[0].message and "cordoned" in moved[0].message
    # The cleared drain is written field by field: a merge patch must overwrite the recorded one.
    assert status.to_json()["drain"] == {"node": "", "cause": "", "requestId": "", "requestedAt": "", "startedAt": "",
                                         "replacements": 0}


def test_answers_of_another_request_do_not_count() -> None:
    assert answered_step(2, "r1", {0: ("r1", 12), 1: ("r0", 7)}) is None
    assert answered_step(2, "r1", {0: ("r1", 12), 1: ("r1", 12)}) == 12
    assert answered_step(0, "r1", {0: ("r1", 12)}) is None  # the world size is not known yet


def test_the_moved_index_goes_to_a_ready_spare_in_the_next_pass() -> None:
    seen = DrainInput(nodes=CORDONED, request_id="r1", answers={0: ("r1", 12), 1: ("r1", 12)})
    moved = decide(draining(), PODS + [spare(0, node="n2")], seen, **{"replicas.spares": 1})
    after = [on(0, "n0", generation=1), on(1, "n1", deleting_since=NOW + 0.5), spare(0, node="n2")]
    nxt = decide(moved.status, after, DrainInput(nodes=CORDONED), now=NOW + 1, **{"replicas.spares": 1})
    assert PromoteSpare("j-spare-0", 1, 1) in nxt.actions
    assert not any(isinstance(a, CreatePod) for a in nxt.actions)
    assert not any(isinstance(a, RequestCheckpoint) for a in nxt.actions)  # the node is left: no new drain


def test_no_answer_within_the_bound_moves_the_worker_anyway() -> None:
    out = decide(draining(), PODS, DrainInput(nodes=CORDONED, request_id="r1", timeout_seconds=60), now=NOW + 61)
    assert out.status.last_restart_reason == R.NODE_DRAINING and out.status.drain.node == ""
    assert DeletePod("j-worker-1", "u1-0", grace_seconds=MOVE_GRACE_SECONDS) in out.actions
    assert any("did not come within 60s" in e.message for e in out.events)
    # Nobody answered it: it goes now, or the new group's ranks would stop for it.
    assert ClearCheckpointRequest() in out.actions


def test_the_pod_vanishing_first_falls_back_to_the_loss_path() -> None:
    gone = [on(0, "n0"), on(1, "n1", deleting_since=NOW + 1)]  # deleted by someone else before the answers
    out = decide(draining(), gone, DrainInput(nodes=CORDONED, request_id="r1"), now=NOW + 2)
    assert out.status.drain.node == "" and ClearCheckpointRequest() in out.actions
    assert out.status.last_restart_reason == "PodDeleted"  # decided as the usual failure, counted once
    assert out.status.restarts == 1


def test_a_failure_elsewhere_ends_the_drain_and_is_decided_as_usual() -> None:
    pods = [on(0, "n0", phase="Failed", exit_code=1), on(1, "n1")]
    out = decide(draining(), pods, DrainInput(nodes=CORDONED, request_id="r1"), now=NOW + 2)
    assert out.status.drain.node == "" and out.status.last_restart_reason == "Crash"
    assert any(e.reason == R.NODE_DRAINING and "failed first" in e.message for e in out.events)


def test_a_repeated_pass_over_the_same_status_decides_the_same() -> None:
    """An operator restarted after writing the status re-reads it: the same drain, not a second request id."""
    pods = PODS + [spare(0, node="n2")]
    first = decide(running(), pods, DrainInput(nodes=CORDONED), **{"replicas.spares": 1})
    again = decide(first.status, pods, DrainInput(nodes=CORDONED, request_id=first.status.drain.request_id),
                   now=NOW + 1, **{"replicas.spares": 1})
    assert again.status.drain == first.status.drain
    assert again.actions == [RequestCheckpoint(first.status.drain.request_id, "node n1 is cordoned", (1,))]
    # Waiting for the drain's spare: its create is seen, nothing more is created or asked.
    prepared = decide(running(), PODS, DrainInput(nodes=CORDONED))
    created = spare(0, ready=False, phase="Pending")
    repeat = decide(prepared.status, PODS + [created], DrainInput(nodes=CORDONED), now=NOW + 1)
    assert repeat.status.drain == prepared.status.drain and repeat.actions == []


def test_a_leftover_request_is_cleared_when_no_drain_is_recorded() -> None:
    out = decide(running(), [on(0, "n0"), on(1, "n2")], DrainInput(request_id="old"))
    assert ClearCheckpointRequest() in out.actions


def test_a_moves_request_is_cleared_once_the_moved_pods_are_gone() -> None:
    seen = DrainInput(nodes=CORDONED, request_id="r1", answers={0: ("r1", 12), 1: ("r1", 12)})
    moved = decide(draining(), PODS + [spare(0, node="n2")], seen, **{"replicas.spares": 1})
    after = DrainInput(nodes=CORDONED, request_id="r1", answers={0: ("r1", 12), 1: ("r1", 12)})
    terminating = [on(0, "n0", generation=1), on(1, "n1", deleting_since=NOW + 0.5), spare(0, node="n2")]
    kept = decide(moved.status, terminating, after, now=NOW + 1, **{"replicas.spares": 1})
    assert ClearCheckpointRequest() not in kept.actions
    gone = [on(0, "n0", generation=1), on(1, "n2", generation=1)]  # the spare took index 1
    cleared = decide(kept.status, gone, after, now=NOW + 3, **{"replicas.spares": 1})
    assert ClearCheckpointRequest() in cleared.actions


def test_drain_ahead_alone_returns_no_decision_while_it_waits() -> None:
    from flywheel.policy.decisions import Pass
    out = Pass(draining())
    assert drain_ahead(out, replace(view(spec(), PODS), drain=DrainInput(nodes=CORDONED, request_id="r1"))) is None


def test_a_fatal_xid_drain_waits_only_the_short_bound() -> None:
    status = running(drain=DrainStatus(node="n1", cause="has a fatal GPU XID (XID 79)", request_id="r1",
                                       requested_at=rfc3339(NOW)))
    waiting = decide(status, PODS, DrainInput(nodes=CORDONED, request_id="r1"), now=NOW + 5)
    assert waiting.status.drain.node == "n1"
    moved = decide(status, PODS, DrainInput(nodes=CORDONED, request_id="r1"), now=NOW + 11)
    assert moved.status.last_restart_reason == R.NODE_DRAINING
    assert any("did not come within 10s" in e.message for e in moved.events)


@pytest.mark.parametrize("cause, bound", [("is cordoned", DRAIN_TIMEOUT_SECONDS),
                                          ("has a fatal GPU XID (XID 79 on GPU 0)", XID_DRAIN_TIMEOUT_SECONDS)])
def test_a_drain_waiting_for_its_answers_is_due_when_its_bound_ends(cause: str, bound: float) -> None:
    status = draining()
    status.drain.cause = cause
    seen = DrainInput(nodes=CORDONED, request_id="r1")
    waiting = decide(status, PODS, seen, now=NOW + 1)
    assert waiting.next_due == NOW + bound == drain_due(status)
    assert not any(isinstance(a, DeletePod) for a in decide(status, PODS, seen, now=NOW + bound - 0.01).actions)
    assert any(isinstance(a, DeletePod) for a in decide(status, PODS, seen, now=NOW + bound).actions)
    assert drain_due(running()) is None
