"""The operator's request that every agent restart its ranks in place, against a real etcd
(flywheel/etcd/rank_restart.py): what the key holds when an agent starts is served already; a newer generation is
taken once; the run's cleanup deletes the key."""

from __future__ import annotations

import time

import pytest

from flywheel.etcd import keys
from flywheel.etcd.liveness import delete_run
from flywheel.etcd.rank_restart import (
    RankRestartFollower,
    RankRestartRequest,
    decode_request,
    encode_request,
    put_request,
    read_request,
)
from flywheel.etcd.session import EtcdSession

from .etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(60)


def _taken(follower: RankRestartFollower, seconds: float = 5.0) -> RankRestartRequest | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        request = follower.take()
        if request is not None:
            return request
        time.sleep(0.02)
    return None


def test_the_request_codec_refuses_what_is_not_a_request() -> None:
    request = RankRestartRequest(3, "no training step for 5 s")
    assert decode_request(encode_request(request)) == request
    for value in (b"", b"[]", b"{}", b'{"generation": 0}', b'{"generation": "x"}', b"not json"):
        assert decode_request(value) is None, value


def test_an_agent_takes_each_newer_request_once_and_never_a_stale_one(etcd_server: EtcdServer) -> None:
    with EtcdSession(etcd_server.endpoint) as session:
        session.run(put_request(session, "job-r", RankRestartRequest(2, "an older generation's hang")))
        follower = RankRestartFollower(session, "job-r")  # an agent started after that request: served already
        try:
            assert _taken(follower, 0.5) is None
            session.run(put_request(session, "job-r", RankRestartRequest(3, "hung")))
            assert _taken(follower) == RankRestartRequest(3, "hung")
            assert follower.take() is None  # once
            session.run(put_request(session, "job-r", RankRestartRequest(3, "hung")))  # the operator again: same
            session.run(put_request(session, "job-r", RankRestartRequest(1, "stale")))
            assert _taken(follower, 0.5) is None
            assert session.run(read_request(session, "job-r")) == RankRestartRequest(1, "stale")
            session.run(put_request(session, "job-r", RankRestartRequest(5, "hung again")))
            assert _taken(follower) == RankRestartRequest(5, "hung again")
        finally:
            follower.stop()
        # No lease: the key outlives every agent; the run's cleanup deletes it.
        assert delete_run(session, "job-r") == 1
        assert session.call(lambda c: c.get(keys.rank_restart_key("job-r"))) is None


def test_an_agent_of_a_new_run_takes_the_first_request(etcd_server: EtcdServer) -> None:
    with EtcdSession(etcd_server.endpoint) as session:
        follower = RankRestartFollower(session, "job-n")
        try:
            assert session.run(read_request(session, "job-n")) is None
            session.run(put_request(session, "job-n", RankRestartRequest(1, "hung")))
            assert _taken(follower) == RankRestartRequest(1, "hung")
        finally:
            follower.stop()
            delete_run(session, "job-n")
