"""Ranks follow the replica index at any size: 12 agents joining in a shuffled order, with host names whose string
order differs from their numeric order, against a real etcd."""

from __future__ import annotations

import random
import threading

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler, _NodeDesc

import flywheel.trainer.rendezvous  # noqa: F401  (registers the etcd-v3 handler)
from flywheel.trainer.rank_order import UNORDERED, ReplicaOrderedNode, create_ordered_c10d_handler, replica_order

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


def join_all(handlers: dict[int, DynamicRendezvousHandler]) -> dict[int, tuple[int, int]]:
    ranks = {}

    def join(index: int) -> None:
        info = handlers[index].next_rendezvous()
        ranks[index] = (info.rank, info.world_size)

    threads = [threading.Thread(target=join, args=(i,)) for i in handlers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    for handler in handlers.values():
        handler.shutdown()
    return ranks


def test_twelve_agents_get_ranks_in_replica_order(etcd_server: EtcdServer) -> None:
    size, handlers = 12, {}
    for index in random.Random(5).sample(range(size), size):  # created and joined in a shuffled order
        handlers[index] = rendezvous_handler_registry.create_handler(RendezvousParameters(
            backend="etcd-v3", endpoint=etcd_server.endpoint, run_id="job-order", min_nodes=size, max_nodes=size,
            local_addr=f"job-worker-{index}", replica_id=str(index), worker_ttl=5, last_call_timeout=1,
            join_timeout=60))
    assert join_all(handlers) == {i: (i, size) for i in range(size)}


def test_twelve_local_agents_on_one_address_get_ranks_in_replica_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local runner's c10d rendezvous: every replica on 127.0.0.1, which torch orders by pid."""
    size, handlers = 12, {}
    host = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for index in random.Random(7).sample(range(size), size):
        monkeypatch.setenv("FLYWHEEL_REPLICA_INDEX", str(index))
        handlers[index] = create_ordered_c10d_handler(RendezvousParameters(
            backend="c10d", endpoint=f"127.0.0.1:{host.port}", run_id="local-order", min_nodes=size,
            max_nodes=size, local_addr="127.0.0.1", is_host=False, last_call_timeout=1, join_timeout=60))
    assert join_all(handlers) == {i: (i, size) for i in range(size)}
