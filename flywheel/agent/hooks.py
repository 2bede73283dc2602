"""The callables the etcd-v3 rendezvous handler gives `flywheel launch`'s agent (agent/rendezvous/handler.py adds
them when torch creates it and takes them away on release; launch.py calls them): rank-restart reporters
(rank_restarts.py), restart-request followers (restart_requests.py) and drain-request readers (drain_hold.py).
Without the handler (`flywheel run`'s c10d rendezvous) each set is empty. Torch-free."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T", bound=Callable[..., object])
R = TypeVar("R")
log = logging.getLogger(__name__)


class AgentHooks(Generic[T]):
    """One set of hooks; `what` names them in the warning for one that raises."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._hooks: list[T] = []

    def add(self, hook: T) -> None:
        self._hooks.append(hook)

    def remove(self, hook: T) -> None:
        if hook in self._hooks:
            self._hooks.remove(hook)

    def each(self, call: Callable[[T], R]) -> Iterator[R]:
        """`call(hook)` for every hook, in the order added; one that raises is logged and skipped (a hook never
        stops the agent) -- but a signal's exception propagates: the agent is being stopped (its pod deleted), and
        a SIGTERM landing in a drain-request read once read as "the drain no longer moves this worker"."""
        for hook in list(self._hooks):
            try:
                yield call(hook)
            except Exception as err:
                if isinstance(err, _signal_exceptions()):
                    raise
                log.warning("%s failed: %s", self.what, err)


def _signal_exceptions() -> tuple[type[BaseException], ...]:
    """torch's SignalException (its agent's SIGTERM/SIGINT handler raises it), where torch's elastic agent is loaded;
    looked up, not imported, so this module stays torch-free."""
    api = sys.modules.get("torch.distributed.elastic.multiprocessing.api")
    found = getattr(api, "SignalException", None)
    return (found,) if isinstance(found, type) and issubclass(found, BaseException) else ()
