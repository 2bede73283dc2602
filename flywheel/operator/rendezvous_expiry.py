"""The operator's half of the rendezvous expiry (the local runner's is agent/rendezvous/expiry.py): after the
status write that gave up on some workers (policy/lost_agents.py), mark their agents' heartbeats expired in the
run's etcd-v3 rendezvous state, so that the survivors' next round forms without them at once instead of after
torch's heartbeat timeout (6 s with `flywheel launch`'s settings).

Agents are matched by what their liveness key said (host name, pid, replica index: policy/lost_agents.py
`is_agent`), remembered per pod, or else by host name = pod name (a worker's node descriptor carries its pod's FQDN
under the job's headless Service); a replacement (a promoted spare, a new pod of the name) never matches. torch
is imported here only when there is an agent to expire.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flywheel.etcd.session import EtcdSession
from flywheel.policy.lost_agents import AgentId, is_agent
from flywheel.policy.observed import PodView


class AgentMemory:
    """The agent each worker pod was last seen to run (its liveness key: host, pid), kept past the key's expiry:
    a lost node's key is gone before the pass that gives up on the pod."""

    def __init__(self) -> None:
        self.agents: dict[str, AgentId] = {}

    def remember(self, view: PodView, own_key: Any) -> None:
        """`own_key`: the pod's own liveness key (etcd_views.key_owners), never a predecessor's or a replacement's
        of the same replica index: remembering a replacement's agent would expire it in the pod's name."""
        if own_key is not None and own_key.pid:
            self.agents[view.name] = AgentId(view.name, view.index, str(own_key.host), int(own_key.pid))

    def of(self, pods: Sequence[str]) -> list[AgentId]:
        return [self.agents.get(name, AgentId(name)) for name in pods]

    def keep(self, names: set[str]) -> None:
        self.agents = {k: v for k, v in self.agents.items() if k in names}


def expire_pods(session: EtcdSession, run_id: str, agents: Sequence[AgentId]) -> int:
    """Expire the rendezvous heartbeat of each of `agents`; returns how many (blocking: call it off the event
    loop)."""
    if not agents:
        return 0
    from flywheel.agent.rank_order import UNORDERED
    from flywheel.agent.rendezvous.backend import EtcdV3RendezvousBackend
    from flywheel.agent.rendezvous.expiry import expire_agents

    def is_dead(node: Any) -> bool:
        replica = int(getattr(node, "replica", UNORDERED))
        return any(is_agent(str(node.addr), int(node.pid), replica, agent) for agent in agents)

    return expire_agents(EtcdV3RendezvousBackend(session, run_id), is_dead)
