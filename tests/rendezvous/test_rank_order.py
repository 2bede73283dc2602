"""Ranks follow the replica index at any size: 12 agents joining in a shuffled order, with host names whose string
order differs from their numeric order, against a real etcd."""

from __future__ import annotations

import random
import threading

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _NodeDesc

from flywheel.trainer.rendezvous.rank_order import UNORDERED, ReplicaOrderedNode, replica_order

from .etcd_server import EtcdServer

pytestmark = pytest.mark.timeout(120)


def test_replica_order_reads_an_index_or_the_number_ending_a_host_name() -> None:
    assert [replica_order(r) for r in ("0", "7", "12", "job-worker-10", " 3 ")] == [0, 7, 12, 10, 3]
    assert replica_order("worker") == UNORDERED


def test_nodes_sort_by_replica_before_address_and_pid() -> None:
    nodes = [ReplicaOrderedNode(f"job-worker-{i}.svc", 100 - i, 0, i) for i in (10, 2, 1, 11, 0)]
    assert [n.replica for n in sorted(nodes)] == [0, 1, 2, 10, 11]
    assert sorted(_NodeDesc(n.addr, n.pid, 0) for n in nodes)[0].addr == "job-worker-0.svc"
    assert sorted(_NodeDesc(n.addr, n.pid, 0) for n in nodes)[1].addr == "job-worker-1.svc"
    assert sorted(_NodeDesc(n.addr, n.pid, 0) for n in nodes)[2].addr == "job-worker-10.svc"  # torch's own order
    same_host = [ReplicaOrderedNode("127.0.0.1", pid, 0, i) for i, pid in enumerate((900, 300, 600))]
    assert [n.replica for n in sorted(same_host)] == [0, 1, 2]  # not by pid
    unindexed = ReplicaOrderedNode("b", 1, 0)
    assert sorted([unindexed, nodes[0]])[-1] is unindexed


def test_twelve_agents_get_ranks_in_replica_order(etcd_server: EtcdServer) -> None:
    size, ranks = 12, {}
    handlers = {}
    for index in random.Random(5).sample(range(size), size):  # created and joined in a shuffled order
        handlers[index] = rendezvous_handler_registry.create_handler(RendezvousParameters(
            backend="etcd-v3", endpoint=etcd_server.endpoint, run_id="job-order", min_nodes=size, max_nodes=size,
            local_addr=f"job-worker-{index}", replica_id=str(index), worker_ttl=5, last_call_timeout=1,
            join_timeout=60))

    def join(index: int) -> None:
        info = handlers[index].next_rendezvous()
        ranks[index] = (info.rank, info.world_size)

    threads = [threading.Thread(target=join, args=(i,)) for i in handlers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    try:
        assert ranks == {i: (i, size) for i in range(size)}
    finally:
        for handler in handlers.values():
            handler.shutdown()
