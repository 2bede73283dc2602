"""The operator's requests that this agent restart its ranks in place, from whoever follows them to the agent.

A hang while every worker's agent is alive is answered by the operator with a request in etcd
(flywheel/etcd/rank_restart.py) instead of new pods. The etcd-v3 rendezvous handler follows it
(agent/rendezvous/handler.py) and adds its follower here; `flywheel launch`'s agent asks `take()` every monitor
interval (it only reads memory) and, given a request, SIGKILLs its ranks and restarts them (launch.py). Without
etcd (`flywheel run`'s c10d rendezvous) nobody adds one: a hang there ends in the rank's own watchdog exit
(exitcodes.HANG), which the agent restarts in place as any crash.
"""

from __future__ import annotations

from collections.abc import Callable

from flywheel.agent.hooks import AgentHooks
from flywheel.etcd.rank_restart import RankRestartRequest

Source = Callable[[], RankRestartRequest | None]  # a follower's `take`: the request not served yet, or None
sources: AgentHooks[Source] = AgentHooks("rank restart request source")


def take() -> RankRestartRequest | None:
    """The newest request not served yet, now served (None: none). Every source is asked, so each marks what it
    held as served."""
    taken: RankRestartRequest | None = None
    for request in sources.each(lambda source: source()):
        if request is not None and (taken is None or request.generation > taken.generation):
            taken = request
    return taken


def restart_reason(request: RankRestartRequest) -> str:
    """The reason the agent reports for the rank restart it does for `request` (its liveness key's report)."""
    why = f": {request.reason}" if request.reason else ""
    return f"restart in place requested by the operator for generation {request.generation}{why}"
