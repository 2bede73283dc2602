"""A worker that a drain moves waits for its pod's deletion instead of rejoining (agent/drain_hold.py), from the
request naming the moved replicas (etcd/requests.py `held_for_move`); pure, no etcd."""

from __future__ import annotations

from collections.abc import Collection

import pytest

from flywheel.agent import drain_hold
from flywheel.agent.hooks import AgentHooks
from flywheel.etcd.requests import (
    CheckpointDone,
    CheckpointRequest,
    RequestState,
    decode_request,
    encode_request,
    held_for_move,
)

REQUEST = CheckpointRequest("r1", "node n1 is cordoned", moving=(1, 3))


def answered(*ranks: int, request_id: str = "r1") -> dict[int, CheckpointDone]:
    return {r: CheckpointDone(r, request_id, 12) for r in ranks}


def test_the_request_names_the_moved_replicas_and_reads_back() -> None:
    assert decode_request(encode_request(REQUEST)) == REQUEST
    # A request from an operator before `moving` (or a broken list) moves nobody: nothing holds, as before.
    assert decode_request(b'{"id": "r1", "reason": "x"}') == CheckpointRequest("r1", "x")
    assert decode_request(b'{"id": "r1", "moving": "1"}') == CheckpointRequest("r1")
    assert decode_request(b'{"id": "r1", "moving": [1, "x", 2]}') == CheckpointRequest("r1", moving=(1, 2))


def test_only_a_moved_replica_whose_ranks_answered_is_held() -> None:
    state = RequestState(REQUEST, answered(2, 3))  # replica 1 (ranks 2, 3 at 2 per replica) answered
    assert held_for_move(state, "1", [2, 3])
    assert held_for_move(state, "1", [3])  # one rank's answer: they all stop after the same step
    assert not held_for_move(state, "0", [0, 1])  # a staying worker rejoins at once
    assert not held_for_move(RequestState(REQUEST, answered(0, 1)), "1", [2, 3])  # its ranks did not answer:
    # they crashed before the step boundary, and their restart is what will answer
    assert not held_for_move(RequestState(REQUEST, answered(2, 3, request_id="r0")), "1", [2, 3])  # another id
    assert not held_for_move(RequestState(None, answered(2, 3)), "1", [2, 3])  # the drain given up: cleared


@pytest.fixture(autouse=True)
def only_this_tests_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    """etcd-v3 handlers that earlier tests in this process created keep their sources (each reading a request from
    an etcd long gone would wait out its retries)."""
    monkeypatch.setattr(drain_hold, "sources", AgentHooks("drain request reader"))


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_moved_worker_waits_until_the_drain_no_longer_moves_it() -> None:
    clock, asked = FakeClock(), []

    def moving_for_two_seconds(ranks: Collection[int]) -> bool:
        asked.append(list(ranks))
        return clock.now < 2.0

    drain_hold.sources.add(moving_for_two_seconds)
    held = drain_hold.hold_while_moving([2, 3], poll=0.5, clock=clock, sleep=clock.sleep)
    assert held == 2.0 and asked[0] == [2, 3] and len(asked) == 5


def test_the_hold_ends_at_its_bound_and_never_starts_without_a_drain() -> None:
    clock = FakeClock()
    assert drain_hold.hold_while_moving([0], clock=clock, sleep=clock.sleep) == 0.0  # no source: c10d, `flywheel run`
    drain_hold.sources.add(lambda ranks: True)
    assert drain_hold.hold_while_moving([0], bound=10, poll=1, clock=clock, sleep=clock.sleep) == 10.0


def test_a_signal_ends_the_hold() -> None:
    class Stopped(Exception):
        pass

    def sigterm(seconds: float) -> None:
        raise Stopped  # what the agent's signal handler raises

    drain_hold.sources.add(lambda ranks: True)
    with pytest.raises(Stopped):
        drain_hold.hold_while_moving([0], sleep=sigterm)


def test_an_unreadable_request_does_not_hold() -> None:
    def etcd_down(ranks: Collection[int]) -> bool:
        raise ConnectionError("etcd unreachable")

    drain_hold.sources.add(etcd_down)
    assert not drain_hold.moving([0])
