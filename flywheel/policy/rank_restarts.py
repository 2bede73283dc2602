"""Rank restarts in place, counted into `status.restarts` (pure).

torch's elastic agent restarts a worker's crashed ranks without the pod failing; the agent reports how many times
in its etcd liveness key, which the operator puts on the pod's view (`PodView.rank_restarts`). The status keeps,
per pod uid, the count already added (`status.rankRestarts`), so every restart is counted once: across passes,
across operator restarts (the map is in the status), and never again for a pod that is gone (the map is pruned to
the pods observed). The count only grows: a lower report (a restarted agent in the same pod) adds nothing.

Only pods of the current generation that are not being deleted add to the count: an older generation's pods are
the leftovers of a restart already counted (their ranks may restart once more while they are stopped), and a
counted rank restart must not rename a pending whole-job restart (`lastRestartReason` Hung or RestartRequested
makes the clean-up delete every older pod). Their reports are still recorded, never counted later."""

from __future__ import annotations

from collections.abc import Sequence

from flywheel.policy import reasons as R
from flywheel.policy.decisions import Event
from flywheel.policy.observed import PodView
from flywheel.spec_status import TrainingJobStatus


def count_rank_restarts(status: TrainingJobStatus, pods: Sequence[PodView], generation: int) -> list[Event]:
    """Add the rank restarts reported since the last pass to `status.restarts` (lastRestartReason RankRestarted),
    record the counts per pod in `status.rankRestarts` (pruned to `pods`); return an event per pod that restarted
    ranks."""
    counted = status.rank_restarts
    recorded = {p.uid: counted[p.uid] for p in pods if p.uid in counted}
    events: list[Event] = []
    for pod in pods:
        before = recorded.get(pod.uid, 0)
        if pod.rank_restarts <= before:
            continue
        recorded[pod.uid] = pod.rank_restarts
        if pod.generation != generation or pod.deleting_since is not None:
            continue
        status.worker_generation = generation  # pinned: `restarts` no longer equals it
        status.restarts += pod.rank_restarts - before
        status.last_restart_reason = R.RESTART_RANK
        events.append(Event("Warning", R.RESTART_RANK, R.MSG_RANK_RESTARTED.format(
            pod=pod.name, count=pod.rank_restarts, reason=pod.rank_restart_reason or "reason not reported")))
    if recorded != counted:
        status.rank_restarts = recorded
    return events
