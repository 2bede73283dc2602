"""The agent's watch of the rendezvous state key (agent/rendezvous/state_watch.py) on a real etcd: a change of
the state wakes a waiting poll at once and drops the handler's cached copy, so a round moves on the change rather
than on the next poll; with nothing changing the poll waits its interval out (the fallback)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from flywheel.agent.rendezvous.state_watch import RendezvousStateWatch
from flywheel.etcd import keys
from flywheel.etcd.session import EtcdSession

from .etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(60)


def test_a_state_change_wakes_the_waiting_poll_and_drops_the_cached_state(etcd_server: EtcdServer) -> None:
    handler = SimpleNamespace(_state_holder=SimpleNamespace(_last_sync_time=0.0))
    with EtcdSession(etcd_server.endpoint) as session:
        watch = RendezvousStateWatch(session, keys.state_key("run-w"), handler)
        try:
            watch.wait(5.0)  # the wake-up the watch gives as it starts (what changed before it is read again)
            began = time.monotonic()
            watch.wait(0.5)  # nothing changes: the fallback poll interval passes
            assert time.monotonic() - began >= 0.45
            handler._state_holder._last_sync_time = time.monotonic()  # a fresh read, cached
            woke: list[float] = []
            waiter = threading.Thread(target=lambda: (watch.wait(30.0), woke.append(time.monotonic())))
            waiter.start()
            time.sleep(0.2)
            changed_at = time.monotonic()
            session.call(lambda c: c.put(keys.state_key("run-w"), b"state"))
            waiter.join(10)
            assert woke and woke[0] - changed_at < 10, "the poll waited its 30 s out"
            assert handler._state_holder._last_sync_time == -1.0  # the next read goes to etcd
        finally:
            watch.stop()
