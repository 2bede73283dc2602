"""A worker that a drain moves off its node does not rejoin the group (drain ahead; flywheel/etcd/requests.py).

Once every rank answered the operator's checkpoint request and stopped, each agent restarts its ranks into a new
rendezvous round. The agents of the workers the drain moves must not: their pods are about to be deleted, and a
round formed with them before that would train steps that the move then throws away (the new group resumes from
the requested checkpoint: measured, 3 steps trained twice when the operator's deletion came after the round). Such
an agent waits instead, before it stops or restarts anything, until its pod's deletion stops it (SIGTERM), until the
request no longer moves it (the drain given up: it rejoins at once), or for at most HOLD_SECONDS (an operator that
never finishes the drain: it rejoins, training on where it is).

The etcd-v3 rendezvous handler adds the source (agent/rendezvous/handler.py): whether the open request moves this
agent's replica and one of its ranks answered it. Without one (`flywheel run`'s c10d rendezvous) nothing holds.
Torch-free, like restart_requests.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection

from flywheel.agent.hooks import AgentHooks

# Longer than the operator's wait for the answers (policy/drain.py DRAIN_TIMEOUT_SECONDS, 60 s) plus its move.
HOLD_SECONDS = 120.0
POLL_SECONDS = 0.1

Source = Callable[[Collection[int]], bool]  # the agent's last ranks -> whether the drain moves it now
sources: AgentHooks[Source] = AgentHooks("drain request reader")
log = logging.getLogger(__name__)


def moving(ranks: Collection[int]) -> bool:
    """Whether a drain is moving this agent's worker (its ranks stopped for it). A reader that fails (etcd
    unreachable) says nothing: the worker rejoins as before rather than hold blind."""
    return any(sources.each(lambda source: source(ranks)))


def hold_while_moving(ranks: Collection[int], *, bound: float = HOLD_SECONDS, poll: float = POLL_SECONDS,
                      clock: Callable[[], float] = time.monotonic,
                      sleep: Callable[[float], None] = time.sleep) -> float:
    """Wait while a drain moves this worker (a signal's exception ends the wait by propagating); the seconds
    held (0: not moving)."""
    if not moving(ranks):
        return 0.0
    began = clock()
    log.warning("a drain moves this worker off its node: waiting for its pod's deletion instead of rejoining "
                "(at most %.0f s)", bound)
    while clock() - began < bound:
        sleep(poll)
        if not moving(ranks):
            held = clock() - began
            log.warning("the drain no longer moves this worker (given up after %.1f s): rejoining", held)
            return held
    log.error("the drain did not move this worker within %.0f s (the operator gone?): rejoining", bound)
    return clock() - began
