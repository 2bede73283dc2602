"""A group that re-forms as it was closes its rendezvous round at once.

torch's DynamicRendezvousHandler closes a round at `max_nodes` participants, or `last_call_timeout` after `min_nodes`
joined: the wait gives agents that start a little later the chance to join the same round. When ranks restart in
place (a rank crashed or was killed; every agent is still alive), every agent of the last group rejoins and nobody
else is on the way, so on an elastic job (min < max) that wait is paid on every restart for nothing (1 s with
`flywheel launch`'s settings, of a ~2.7 s recovery).

So a completed round records its participants (`formed`, an extra attribute of torch's pickled state), and a later
round closes as soon as every one of them has rejoined and no agent waits on the wait list. A round that lost an
agent, a first round, or one with agents waiting to scale up keeps torch's last call. Ranks are still assigned by
torch (sorted participants; agent/rank_order.py).
"""

from __future__ import annotations

from typing import Any

from torch.distributed.elastic.rendezvous.dynamic_rendezvous import _DistributedRendezvousOpExecutor

FORMED = "flywheel_formed"  # the attribute on torch's _RendezvousState: the last completed round's participants


def regrouped(state: Any) -> bool:
    """Every participant of the last completed round is back, and no agent waits for the next one."""
    formed = getattr(state, FORMED, None)
    return bool(formed) and not state.complete and not state.wait_list and formed <= state.participants.keys()


class RegroupingOpExecutor(_DistributedRendezvousOpExecutor):
    """torch's executor, closing a round early when `regrouped` (see the module docstring)."""

    def _add_to_participants(self) -> None:
        super()._add_to_participants()
        if regrouped(self._state):
            self._mark_rendezvous_complete()

    def _mark_rendezvous_complete(self) -> None:
        super()._mark_rendezvous_complete()
        setattr(self._state, FORMED, frozenset(self._state.participants))


def regroup_early(handler: Any) -> None:
    """Swap `handler`'s op executor (torch's, built in DynamicRendezvousHandler.__init__) for the regrouping one."""
    handler._op_executor = RegroupingOpExecutor(handler._this_node, handler._state_holder, handler._settings)
