"""The operator's half of the rendezvous expiry (the local runner's is trainer/rendezvous_expiry.py): after the
status write that gave up on some workers (policy/lost_agents.py), mark their agents' heartbeats expired in the
run's etcd-v3 rendezvous state, so that the survivors' next round forms without them at once instead of after
torch's heartbeat timeout (6 s with `flywheel launch`'s settings).

Agents are matched by host name: every worker's node descriptor carries its pod's host name (the pod name, as an
FQDN under the job's headless Service), and a promoted spare's carries the spare pod's, so the replacement of a
replica is never matched with its predecessor. torch is imported here only when there is an agent to expire.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from flywheel.etcd.session import EtcdSession
from flywheel.policy.lost_agents import agent_host


def expire_pods(session: EtcdSession, run_id: str, pods: Collection[str]) -> int:
    """Expire the rendezvous heartbeat of every agent whose host is one of `pods`; returns how many (blocking:
    call it off the event loop)."""
    if not pods:
        return 0
    from flywheel.trainer.rendezvous.backend import EtcdV3RendezvousBackend
    from flywheel.trainer.rendezvous_expiry import expire_agents

    def is_dead(node: Any) -> bool:
        return agent_host(str(node.addr)) in pods

    return expire_agents(EtcdV3RendezvousBackend(session, run_id), is_dead)
