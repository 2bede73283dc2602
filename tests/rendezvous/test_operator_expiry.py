"""The operator expires a lost worker's rendezvous heartbeat in etcd (operator/rendezvous_expiry.py): the
survivor's next round with the replacement forms at once, not after torch's heartbeat timeout. Real etcd, torch's
own DynamicRendezvousHandler (the ordered one every `flywheel launch` agent uses), in-process agents."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters

from flywheel.agent.rank_order import create_ordered_handler
from flywheel.agent.rendezvous.backend import EtcdV3RendezvousBackend
from flywheel.agent.rendezvous.store import EtcdStore
from flywheel.etcd.session import EtcdSession
from flywheel.operator.rendezvous_expiry import expire_pods
from flywheel.policy.lost_agents import AgentId

from .etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(90)
RUN = "job-uid"
KEEP_ALIVE_S, KEEP_ALIVE_ATTEMPTS = 2, 3  # a silent agent is dropped after 6 s, as with `flywheel launch`


def agent(session: EtcdSession, endpoint: str, host: str, replica: int) -> Any:
    params = RendezvousParameters(backend="etcd-v3", endpoint=endpoint, run_id=RUN, min_nodes=2, max_nodes=2,
                                  local_addr=host, join_timeout=60, last_call_timeout=1,
                                  keep_alive_interval=KEEP_ALIVE_S, keep_alive_max_attempt=KEEP_ALIVE_ATTEMPTS)
    return create_ordered_handler(EtcdStore(session, RUN), EtcdV3RendezvousBackend(session, RUN), params,
                                  str(replica))


def round_of(*handlers: Any) -> tuple[float, list[int]]:
    """One rendezvous round of all `handlers` (each in its thread): (seconds it took, their ranks)."""
    ranks: dict[int, int] = {}
    began = time.monotonic()

    def join(i: int, handler: Any) -> None:
        ranks[i] = handler.next_rendezvous().rank

    threads = [threading.Thread(target=join, args=(i, h), daemon=True) for i, h in enumerate(handlers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(ranks) == len(handlers), "a round did not form"
    return time.monotonic() - began, [ranks[i] for i in range(len(handlers))]


def test_a_lost_worker_is_expired_by_the_operator_and_the_next_round_does_not_wait_for_it(
        etcd_server: EtcdServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # Rank 0 would host the agents' TCPStore on its (here unresolvable) pod host name: not what is tested here.
    monkeypatch.setenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    svc = ".job-workers.default.svc"
    with EtcdSession(etcd_server.endpoint) as session:
        survivor = agent(session, etcd_server.endpoint, "job-worker-0" + svc, 0)
        lost = agent(session, etcd_server.endpoint, "job-worker-1" + svc, 1)
        assert round_of(survivor, lost)[1] == [0, 1]
        lost._stop_heartbeats()  # its pod is gone: no more heartbeats (torch's own timer, private)
        # The survivor's ranks failed with their peer: its agent leaves the round it completed and joins the next.
        # The operator's pass that gave up on job-worker-1 expires it (a spare's host is never matched).
        assert expire_pods(session, RUN, [AgentId("job-worker-1"), AgentId("job-spare-0")]) == 1
        spare = agent(session, etcd_server.endpoint, "job-spare-0" + svc, 1)  # promoted to replica 1
        seconds, ranks = round_of(survivor, spare)
        assert ranks == [0, 1]  # rank = replica index still holds
        assert seconds < KEEP_ALIVE_S * KEEP_ALIVE_ATTEMPTS - 2, f"the round waited {seconds:.1f} s for the lost agent"
        assert expire_pods(session, RUN, [AgentId("job-worker-1")]) == 0  # gone from the state: nothing to expire
        # Agents that share a host (the test cluster's pods are processes of one machine) are told apart by the pid
        # and replica index their liveness key gave: the survivor (replica 0) and the spare (pid, other replica)
        # never match the lost replica 1's agent of another pid.
        pid = os.getpid()
        assert expire_pods(session, RUN, [AgentId("job-worker-1", 1, "job-worker-1" + svc, pid + 1)]) == 0
        assert expire_pods(session, RUN, [AgentId("job-worker-1", 1, "job-spare-0" + svc, pid)]) == 1
        for h in (survivor, spare):
            h._stop_heartbeats()
