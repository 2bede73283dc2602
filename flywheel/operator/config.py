"""The operator process's configuration, shared by its entry point (main.py) and its kopf handlers (handlers.py):
the settings handed to the handlers in kopf's memo, the log filter and the garbage collector's tuning."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from dataclasses import dataclass

from flywheel.monitor import MonitorSettings
from flywheel.operator.manifests import OperatorSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperatorConfig:
    kubeconfig: str | None
    settings: OperatorSettings
    metrics_port: int = 0  # the operator's own /metrics; 0 = not served
    monitor: MonitorSettings | None = None  # the health monitor (Prometheus); None = off
    namespaces: tuple[str, ...] = ()  # watched namespaces; () = all


class QuietWakeups(logging.Filter):
    """Drops kopf's "Handler 'pod_deleted' succeeded." line, one per deleted pod of every job: the event handlers
    below only wake a runner, and their lines were ~5% of the operator's CPU in a burst of jobs."""

    NAMES = ("pod_deleted", "service_changed")
    LINES = frozenset(f"Handler {name!r} succeeded." for name in NAMES)

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.INFO and record.msg in self.LINES)


# The operator holds every job's body, pods and watches for its life: with the interpreter's default thresholds a
# burst of jobs spent ~17% of the operator's CPU in the collector, mostly re-scanning those long-lived objects.
GC_THRESHOLDS = (10_000, 10, 10)  # the defaults are (700, 10, 10)
# With fewer collections, the reference cycles of finished work (asyncio tasks, kopf's per-event objects) wait
# for the oldest generation's turn, which the interpreter takes once it has grown by a quarter: 200 jobs created and
# deleted left ~12 MB until then. A full collection every 10 s bounded that, but scanned every live object (~0.2 s
# with 500 jobs held: ~1 of the 7 ms of CPU per job in bench/operator_scale's burst) and lowered no RSS peak there
# (188 MB either way: the freed memory is reused). Under churn it does bound the garbage, so it stays, once a
# minute at most and at most GC_FULL_SHARE of the time.
GC_FULL_SECONDS = 60.0
GC_FULL_SHARE = 0.01


def tune_gc() -> None:
    """Leave the objects of start-up (modules, kopf's registry) out of every collection, and collect less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def next_full_collection(every: float, took: float) -> float:
    """Seconds until the next full collection, after one that took `took` seconds."""
    return max(every, took / GC_FULL_SHARE)


async def collect_cycles(every: float = GC_FULL_SECONDS) -> None:
    """A full collection every `every` seconds or more (GC_FULL_SHARE), for the operator's life (started by the
    startup handler)."""
    wait = every
    while True:
        await asyncio.sleep(wait)
        began = time.monotonic()
        freed = gc.collect()
        took = time.monotonic() - began
        wait = next_full_collection(every, took)
        log.debug("full collection: %.3f s, %d objects freed; the next in %.0f s", took, freed, wait)
