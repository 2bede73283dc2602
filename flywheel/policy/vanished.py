"""Pods that vanished between two passes without ever being seen Terminating (pure).

A pod deleted with grace 0 (`kubectl delete pod --grace-period=0 --force`, a controller's force delete) is gone
from the API before any pass can see its deletionTimestamp: without this it would just be recreated as a missing
replica, uncounted. A pod of the current generation that the last written pass saw alive, that this pass does not
see, and that the executor did not delete itself, was deleted by someone else: it is handed to the pass as a pod
being deleted, which `JobView.interrupted` decides as `PodDeleted` like any other deletion from outside.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from flywheel.policy import reasons as R
from flywheel.policy.observed import PodView

ALIVE_PHASES = frozenset({"Pending", "Running", "Unknown"})  # a Succeeded or Failed pod was decided when seen


def vanished_pods(seen: Sequence[PodView], present: Sequence[PodView], deleted_by_executor: Collection[str],
                  generation: int, now: float) -> list[PodView]:
    """The pods of `seen` (the last written pass's observation) missing from `present`, of `generation`, alive
    when seen and not in `deleted_by_executor` (pod uids): as pods deleted at `now` by someone else."""
    here = {p.uid for p in present}
    return [replace(p, deleting_since=p.deleting_since or now, ready=False, message=p.message or R.MSG_POD_VANISHED)
            for p in seen
            if p.uid not in here and p.uid not in deleted_by_executor and p.generation == generation
            and p.phase in ALIVE_PHASES]
