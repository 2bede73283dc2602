"""Ranks follow the replica index, at any size.

torch's DynamicRendezvousHandler numbers the agents of a round by sorting their node descriptors, whose first field
is the address string: `worker-10` sorts before `worker-2`, and agents that share an address (every replica of a
local run on 127.0.0.1) are ordered by pid, i.e. by chance. Topology-aware placement and every debugging session
assume rank = replica order, so the descriptor this handler joins with sorts by the replica index first. The
address is kept as it is: the rank 0 agent still publishes it as MASTER_ADDR.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.distributed import Store
from torch.distributed.elastic.rendezvous.api import RendezvousParameters
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousBackend,
    RendezvousTimeout,
    _NodeDesc,
    _NodeDescGenerator,
)
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _get_timeout as rdzv_timeout

from flywheel import torch_compat
from flywheel.agent.rendezvous.regroup import regroup_early
from flywheel.contracts.replica import replica_id_from_env

UNORDERED = 1 << 62  # agents without a replica index sort after every indexed one, then by address
_TRAILING_NUMBER = re.compile(r"(\d+)$")
# How often a waiting agent reads the rendezvous state, and how old a copy of it the agent's monitor may use (torch:
# 1 s each). A restart waits through up to three such reads (the survivor notices the joiner, the joiner sees the new
# round, the last joiner sees it complete); each is one small read of the backend (etcd): 4 a second per agent.
RENDEZVOUS_POLL_SECONDS = 0.25


def replica_order(replica_id: str) -> int:
    """The sort position of a replica: its index ("7"), or the number ending its host name ("job-worker-7")."""
    match = _TRAILING_NUMBER.search(replica_id.strip())
    return int(match.group(1)) if match else UNORDERED


@dataclass(eq=True, frozen=True)
class ReplicaOrderedNode(_NodeDesc):
    """A node descriptor that sorts by (replica index, address, pid, local id). Every agent of a run joins with one
    (they all create their handler here), so the round's `sorted(participants)` gives ranks in replica order."""

    replica: int = UNORDERED

    def _key(self) -> tuple[int, str, int, int]:
        return self.replica, self.addr, self.pid, self.local_id

    def __lt__(self, other: Any) -> bool:
        return self._key() < other._key()

    def __le__(self, other: Any) -> bool:
        return self._key() <= other._key()

    def __gt__(self, other: Any) -> bool:
        return self._key() > other._key()

    def __ge__(self, other: Any) -> bool:
        return self._key() >= other._key()

    def __repr__(self) -> str:
        return f"{self.addr}_{self.pid}_{self.local_id}#{self.replica}"


class _ReplicaOrderedNodes(_NodeDescGenerator):
    def __init__(self, replica: int) -> None:
        super().__init__()
        self.replica = replica

    def generate(self, local_addr: str | None = None) -> _NodeDesc:
        node = super().generate(local_addr)
        return ReplicaOrderedNode(node.addr, node.pid, node.local_id, self.replica)


def create_ordered_handler(store: Store, backend: RendezvousBackend, params: RendezvousParameters,
                           replica_id: str, before_join: Callable[[], object] | None = None
                           ) -> DynamicRendezvousHandler:
    """torch's `create_handler`, joining with a descriptor that sorts by `replica_id`'s index, and closing a round
    as soon as the last group has re-formed (agent/rendezvous/regroup.py). `before_join` runs before every
    round this agent joins (the etcd handler's check that the agent has not been replaced meanwhile)."""
    members: dict[str, Any] = {"_node_desc_generator": _ReplicaOrderedNodes(replica_order(replica_id))}
    if before_join is not None:
        def next_rendezvous(self: DynamicRendezvousHandler) -> Any:
            before_join()
            return DynamicRendezvousHandler.next_rendezvous(self)

        members["next_rendezvous"] = next_rendezvous
    handler_class: type[DynamicRendezvousHandler] = type("ReplicaOrderedRendezvousHandler",
                                                         (DynamicRendezvousHandler,), members)
    timeout = RendezvousTimeout(rdzv_timeout(params, "join"), rdzv_timeout(params, "last_call"),
                                rdzv_timeout(params, "close"), rdzv_timeout(params, "heartbeat"))
    handler: DynamicRendezvousHandler = handler_class.from_backend(
        params.run_id, store, backend, params.min_nodes, params.max_nodes, params.local_addr, timeout,
        keep_alive_interval=params.get_as_int("keep_alive_interval", 5) or 5,
        keep_alive_max_attempt=params.get_as_int("keep_alive_max_attempt", 3) or 3)
    regroup_early(handler)  # a group re-forming as it was does not wait out the last call
    torch_compat.set_rendezvous_poll_interval(RENDEZVOUS_POLL_SECONDS)
    torch_compat.set_rendezvous_state_cache(handler, RENDEZVOUS_POLL_SECONDS)
    return handler


def create_ordered_c10d_handler(params: RendezvousParameters) -> DynamicRendezvousHandler:
    """torch's `c10d` handler (the local runner's: every replica on 127.0.0.1), in replica order."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

    backend, store = create_backend(params)
    return create_ordered_handler(store, backend, params, replica_id_from_env())
