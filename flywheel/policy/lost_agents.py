"""Which workers' agents a reconcile pass gave up on (pure): their rendezvous heartbeats are expired at once
(operator/rendezvous_expiry.py), so the survivors' next round and the replacement (a promoted spare, a new pod)
do not wait out torch's heartbeat timeout (keep_alive_interval x keep_alive_max_attempt) for an agent that is gone.

An agent is given up on when the pass deletes its worker pod, or decides a restart (a new generation) that leaves
its pod behind: not relabelled into the new generation. A survivor is relabelled and keeps its heartbeat; a spare
never joined the rendezvous. Expiring a live agent would drop it from the group, so nothing else qualifies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flywheel.policy.decisions import DeletePod, JobAction, Relabel
from flywheel.policy.observed import PodView


def lost_agents(pods: Sequence[PodView], generation_before: int, generation_after: int,
                actions: Sequence[JobAction]) -> list[str]:
    """The names of the worker pods (= their agents' host names) whose rendezvous heartbeats are to expire."""
    deleted = {a.name for a in actions if isinstance(a, DeletePod)}
    kept = {a.name for a in actions if isinstance(a, Relabel)}
    restarted = generation_after > generation_before
    return sorted({p.name for p in pods if not p.is_spare and p.index >= 0
                   and (p.name in deleted or (restarted and p.generation <= generation_before
                                              and p.name not in kept))})


def agent_host(addr: str) -> str:
    """The pod name in a node descriptor's address: the host name, or the first label of its FQDN
    (`<pod>.<job>-workers.<namespace>.svc...`)."""
    return addr.split(".", 1)[0]


LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class AgentId:
    """A worker pod's agent as its liveness key named it (host name and pid, with its replica index), or by the pod
    name alone when no key of it was seen."""

    pod: str
    replica: int = -1
    host: str = ""
    pid: int = 0


def is_agent(addr: str, pid: int, replica: int, agent: AgentId) -> bool:
    """Whether a rendezvous node descriptor (address, pid, replica index) is `agent`'s. With its key: the same pid
    and replica, and the same host unless the address is a loopback name (pods that are processes of one machine,
    the test cluster, all resolve to one; containers of one replica index may share a pid, never a host).
    Without: its host is the pod's name (a worker's address is its pod's FQDN)."""
    if agent.pid:
        same_host = agent_host(addr) == agent_host(agent.host) or addr.split(".", 1)[0] in LOOPBACK or \
            addr in LOOPBACK
        return pid == agent.pid and replica == agent.replica and same_host
    return agent_host(addr) == agent.pod
