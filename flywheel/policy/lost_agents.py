"""Which workers' agents a reconcile pass gave up on (pure): their rendezvous heartbeats are expired at once
(operator/rendezvous_expiry.py), so the survivors' next round and the replacement (a promoted spare, a new pod)
do not wait out torch's heartbeat timeout (keep_alive_interval x keep_alive_max_attempt) for an agent that is gone.

An agent is given up on when the pass deletes its worker pod, or decides a restart (a new generation) that leaves
its pod behind: not relabelled into the new generation. A survivor is relabelled and keeps its heartbeat; a spare
never joined the rendezvous. Expiring a live agent would drop it from the group, so nothing else qualifies.
"""

from __future__ import annotations

from collections.abc import Sequence

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
