"""The operator's follower of a run's progress keys (`/flywheel/progress/<run_id>/`, records: progress.py).

Like `WorkerWatch` (prefix_watch.py): level-triggered, `on_change(records)` gets every current record by rank once
at start and after each change, and a broken watch (etcd restart, compaction) lists again. A deleted key (its
writer's lease expired: the process ended or stopped) simply leaves the set; the reader keeps what it learned from it.
"""

from __future__ import annotations

from collections.abc import Callable

from . import keys
from .prefix_watch import PrefixWatch
from .progress import ProgressRecord, decode
from .session import EtcdSession

OnProgress = Callable[[dict[str, ProgressRecord]], None]


class ProgressWatch(PrefixWatch[ProgressRecord]):
    """A garbled record or another codec version is left out (`decode` gives None)."""

    def __init__(self, endpoints: str | EtcdSession, run_id: str, on_change: OnProgress, *,
                 shared: bool = False) -> None:
        super().__init__(endpoints, keys.progress_prefix(run_id), lambda kv: decode(kv.value), on_change,
                         "progress watch", shared=shared)


def watch_progress(endpoints: str | EtcdSession, run_id: str, on_change: OnProgress, *,
                   shared: bool = False) -> ProgressWatch:
    """Start following the progress records of `run_id`; `.stop()` the returned watch when done (shared: see
    liveness.watch_workers)."""
    return ProgressWatch(endpoints, run_id, on_change, shared=shared)
