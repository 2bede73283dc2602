"""A cut-off agent that was replaced never takes its replica back (real etcd).

A lost node's agent is frozen or partitioned, not dead: when the node comes back it resumes, its lease is gone, and
it used to re-register the replica's liveness key over the replacement's (a promoted spare's) and rejoin the
rendezvous, so the operator read the replacement as lost later and the live group restarted to admit a second agent
of the replica (bench/goodput_operator, lose-node then the node's return). Now it re-attaches the key only while it
is absent or still its own, checks before every round it joins, and otherwise ends (on_replaced)."""

from __future__ import annotations

import json
import time

import pytest

from flywheel.etcd import keys
from flywheel.etcd.liveness import WorkerRegistration
from flywheel.etcd.session import EtcdSession

from .etcd_server import EtcdServer


def _read(session: EtcdSession, key: bytes) -> dict | None:  # type: ignore[type-arg]
    found = session.call(lambda c: c.get(key))
    return json.loads(found.value) if found is not None else None


def _wait_for(what: str, probe, timeout: float = 8.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (value := probe()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
    return value


def test_a_replaced_agent_does_not_take_the_key_back_and_is_told(etcd_server: EtcdServer) -> None:
    key, told = keys.worker_key("job-f", "1"), []
    with EtcdSession(etcd_server.endpoint) as session:
        old = WorkerRegistration(session, "job-f", "1", ttl=3, on_replaced=told.append).start()
        mine = _wait_for("the old agent's key", lambda: _read(session, key))
        assert old.still_held() and not told
        time.sleep(0.05)
        new = WorkerRegistration(session, "job-f", "1", ttl=3).start()  # the promoted spare's agent
        taken = _wait_for("the replacement's key", lambda: (v := _read(session, key)) and v["since"] > mine["since"]
                          and v)
        assert not old.still_held()  # before joining a round
        assert len(told) == 1 and json.loads(told[0]) == taken
        # Cut off: its lease expires while it is frozen; on its return it grants a new one and must not re-attach.
        session.call(lambda c: c.revoke_lease(old._lease.lease_id))  # type: ignore[union-attr]
        _wait_for("the old agent to notice its lost lease", lambda: len(told) >= 2)
        assert _read(session, key) == taken
        new.close()
        old._lease.stop()  # type: ignore[union-attr]


def test_an_agent_whose_key_merely_expired_re_attaches_it(etcd_server: EtcdServer) -> None:
    """Nobody replaced it (e.g. etcd was briefly unreachable): it is still the replica's agent."""
    key, told = keys.worker_key("job-g", "0"), []
    with EtcdSession(etcd_server.endpoint) as session:
        registration = WorkerRegistration(session, "job-g", "0", ttl=3, on_replaced=told.append).start()
        first = _wait_for("its key", lambda: _read(session, key))
        session.call(lambda c: c.delete(key))
        assert registration.still_held() and _read(session, key) == first
        session.call(lambda c: c.revoke_lease(registration._lease.lease_id))  # type: ignore[union-attr]
        again = _wait_for("the key re-attached under a new lease", lambda: _read(session, key))
        assert {**again, "since": 0} == {**first, "since": 0}
        assert not told
        registration.close()


def test_the_rendezvous_handler_checks_before_every_round() -> None:
    """rank_order.create_ordered_handler's `before_join` runs before the agent joins a round (and can stop it)."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous.api import RendezvousParameters
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    from flywheel.agent.rank_order import create_ordered_handler

    class Replaced(Exception):
        pass

    calls = []

    def before_join() -> None:
        calls.append(1)
        if len(calls) > 1:
            raise Replaced

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
    params = RendezvousParameters("c10d", "127.0.0.1:0", "fence", 1, 1, join_timeout=10)
    handler = create_ordered_handler(store, C10dRendezvousBackend(store, "fence"), params, "0",
                                     before_join=before_join)
    handler.next_rendezvous()
    with pytest.raises(Replaced):
        handler.next_rendezvous()
    assert len(calls) == 2


def test_etcd_unreachable_during_the_check_does_not_stop_the_agent(etcd_server: EtcdServer, monkeypatch) -> None:
    """The check cannot tell (etcd down): the agent goes on to the rendezvous, whose backend retries for
    etcd_retry_timeout; the check must not fail it after one RPC timeout."""
    key, told = keys.worker_key("job-h", "0"), []
    with EtcdSession(etcd_server.endpoint) as session:
        registration = WorkerRegistration(session, "job-h", "0", ttl=3, on_replaced=told.append).start()
        _wait_for("its key", lambda: _read(session, key))

        async def unreachable(_fn):  # type: ignore[no-untyped-def]
            raise ConnectionError("etcd at 127.0.0.1 unavailable")

        monkeypatch.setattr(session, "call_async", unreachable)
        assert registration.still_held() and not told
        monkeypatch.undo()
        registration.close()
