"""Expire a dead agent's rendezvous heartbeat at once, for an executor that knows it died.

torch's DynamicRendezvousHandler drops a participant only when its heartbeat is older than keep_alive_interval x
keep_alive_max_attempt (6 s with `flywheel launch`'s settings): until then the survivors' next round waits for it,
and so does its replacement, however warm (a promoted spare included). The local supervisor sees the agent's process
exit, so it marks the dead agent's heartbeat expired in the rendezvous state (compare-and-set on the backend's
token, like any agent's write); the next sync of any agent then removes it (torch's own `_sanitize`). Only ever for
agents known dead: expiring a live one would drop it from the group.

The state is torch's private `_RendezvousState` (pickled; its `last_heartbeats`): named in torch_compat.py.
An agent that is stopped (SIGTERM) leaves its round itself instead (`leave_round`, torch's own exit op).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch is imported only when an agent is expired: `flywheel run` starts without it
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import RendezvousBackend

log = logging.getLogger(__name__)

EXPIRED = datetime(1970, 1, 1, tzinfo=timezone.utc)
CAS_ATTEMPTS = 5


def expire_agents(backend: RendezvousBackend, is_dead: Callable[[Any], bool]) -> int:
    """Mark every participant `is_dead(node)` says is dead as expired; returns how many (0: none, or the state kept
    changing under us: the heartbeats then expire by themselves)."""
    for _ in range(CAS_ATTEMPTS):
        current = backend.get_state()
        if current is None:
            return 0
        bits, token = current
        state = pickle.loads(bits)  # the state this run's own agents wrote
        dead = [node for node, beat in state.last_heartbeats.items() if is_dead(node) and beat > EXPIRED]
        if not dead:
            return 0
        for node in dead:
            state.last_heartbeats[node] = EXPIRED
        written = backend.set_state(pickle.dumps(state), token)
        if written is not None and written[2]:
            log.info("expired the rendezvous heartbeat of dead agent(s) %s", ", ".join(map(repr, dead)))
            return len(dead)
    return 0


def expire_local_agent(store: Any, run_id: str, pid: int) -> int:
    """`flywheel run`: expire the agent with process id `pid` in the c10d rendezvous `run_id` on `store` (the
    TCPStore the supervisor hosts; every local agent shares its address, so the pid names it)."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

    return expire_agents(C10dRendezvousBackend(store, run_id), lambda node: int(node.pid) == pid)


LEAVE_ROUND_SECONDS = 2.0


def leave_round(handler: Any) -> None:
    """A stopped agent (its pod deleted: drain ahead, preemption, a move) leaves its rendezvous round, so the
    others' next round forms without waiting ~6 s for its heartbeat to expire. Best effort."""
    if handler is None:
        return
    from flywheel import torch_compat

    try:
        torch_compat.leave_rendezvous(handler, LEAVE_ROUND_SECONDS)
    except Exception as exc:  # noqa: BLE001 - the heartbeat then expires as before
        log.info("could not leave the rendezvous round (%s); its heartbeat expires instead", exc)
