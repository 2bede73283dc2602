"""Rank restarts in place, counted into `status.restarts` (pure), one count per recovery.

torch's elastic agent restarts a worker's crashed ranks without the pod failing; the agent reports how many times,
the last one's reason and time in its etcd liveness key, which the operator puts on the pod's view
(`PodView.rank_restarts`). The status keeps, per pod uid, the count already seen (`status.rankRestarts`), so every
report is taken once: across passes, across operator restarts (the map is in the status), and never again for a
pod that is gone (the map is pruned to the pods observed). The count only grows: a lower report (a restarted agent
in the same pod) adds nothing.

One interruption often restarts the ranks of several workers: a rank is killed, its agent restarts it, and its peers'
collectives fail with it, so their agents restart theirs too (exit 5, a moment later); a deleted pod's survivors do
the same. A pod's first report within SAME_RECOVERY_SECONDS of the last counted recovery (`status.lastRestartTime`:
a rank restart or a decided restart) is that recovery's echo: recorded, not counted (`status.rankRestartReporters`
names the pods that caused or echoed it). A pod's later reports are its agent's next restarts: they count however
soon they come. The agents' reports of a hang's restart in place (policy/failure_decision.py) are echoes too: every
agent reports the restart it was asked for, moments after the decided restart counted it. After a decided restart
that keeps survivors (a Shrink, a replaced pod), a survivor notices the loss only when its collective times out
(trainer/distributed/collective_env.py: 0.8 x progressTimeoutSeconds, past SAME_RECOVERY_SECONDS): its first report that
follows a peer's failure is that recovery's echo up to `consequence_window` after it. A decided restart right after a
counted rank restart, or for a pod that ended shortly before it (a consequence's report may precede the failed pod's
end by up to `consequence_window` when a loaded kubelet reports it late), replaces its reason instead of counting
again (`begin_generation`). Because the peers' reports
can reach the operator before the crashed rank's, a report whose reason follows a peer's failure (a collective
timeout) waits up to CAUSE_WAIT_SECONDS for the cause's report, so the counted recovery is named by its cause. A user
script knows no consequence's exit code (its collective raises on a lost peer: a plain crash, counted at once): a
later echo that names a clearer cause (a rank killed by a signal) gets an event of its own.

Only pods of the current generation that are not being deleted count: an older generation's pods are the leftovers
of a restart already counted, and a counted rank restart must not rename a pending whole-job restart
(`lastRestartReason` Hung or RestartRequested makes the clean-up delete every older pod)."""

from __future__ import annotations

from collections.abc import Sequence

from flywheel.contracts import exitcodes
from flywheel.contracts.timefmt import parse_rfc3339, rfc3339
from flywheel.policy import reasons as R
from flywheel.policy.decisions import Event
from flywheel.policy.observed import PodView
from flywheel.spec.job import FaultTolerance
from flywheel.spec.status import TrainingJobStatus
from flywheel.spec.timeouts import collective_timeouts

# The peers of a crashed rank fail within their collective's detection of the loss (a closed connection: well
# under a second, measured 0.1 s); a deleted pod's survivors once its ranks have stopped (its shutdown grace, 20 s).
SAME_RECOVERY_SECONDS = 30.0
# Each agent notices its ranks' exit within its monitor interval (0.1 s) once they exit: the cause's report trails
# its consequences' by well under a second, by a few seconds on a loaded node.
CAUSE_WAIT_SECONDS = 5.0
_CONSEQUENCES = tuple(f"({exitcodes.describe(code)})" for code in exitcodes.FOLLOWS_A_PEER)
_CRASH = f"({exitcodes.describe(exitcodes.CRASH)})"


def follows_a_peer(reason: str) -> bool:
    """Whether a rank restart's reported reason is a consequence of another rank's failure."""
    return any(reason.endswith(name) for name in _CONSEQUENCES)


def _doubt(reason: str) -> int:
    """How little a report's reason says of the interruption's cause: 0, a cause (a rank killed by a signal, a
    named exit); 1, a plain crash, which may be a user script's collective raising on a lost peer (it knows no
    consequence's exit code); 2, a consequence of a peer's failure. Reports are taken least doubtful first."""
    return 2 if follows_a_peer(reason) else 1 if reason.endswith(_CRASH) else 0


def _names_the_cause(pod: PodView, pods: Sequence[PodView], reporters: Sequence[str]) -> bool:
    """Whether `pod`'s echo of a counted recovery says more of its cause than every report taken for it (a rank
    killed, reported after a peer's plain crash): it gets an event of its own, so the cause is where users look."""
    known = [_doubt(p.rank_restart_reason) for p in pods if p.uid in reporters and p.uid != pod.uid]
    return bool(known) and _doubt(pod.rank_restart_reason) < min(known)


def last_restart(status: TrainingJobStatus) -> float | None:
    try:
        return parse_rfc3339(status.last_restart_time)
    except ValueError:
        return None


def consequence_window(ft: FaultTolerance) -> float:
    """How long after a decided restart a survivor's first consequence report is still its echo: the survivors'
    collective timeout (once trained: a Shrink of a job still starting is not covered), then its agent's restart and
    report, which SAME_RECOVERY_SECONDS allows for a peer's."""
    return collective_timeouts(ft).steady.total_seconds() + SAME_RECOVERY_SECONDS


def _same_recovery(status: TrainingJobStatus, at: float) -> bool:
    last = last_restart(status)
    return last is not None and abs(at - last) <= SAME_RECOVERY_SECONDS


def _echoes(status: TrainingJobStatus, pod: PodView, window: float, stalled: bool = False) -> bool:
    """Whether `pod`'s new report is the current recovery's echo: its first since that recovery began, within
    SAME_RECOVERY_SECONDS of it, or (a survivor's consequence of a decided restart) up to `window` after it; or, while
    the job has not trained a step since that recovery (`stalled`), any later report of a pod that reported it: a
    crash loop before training resumes (an import error the agent restarts in place) is one interruption."""
    last = last_restart(status)
    if last is None:
        return False
    if pod.uid in status.rank_restart_reporters:
        return stalled
    after = pod.rank_restart_at - last
    if status.last_restart_reason != R.RESTART_RANK and follows_a_peer(pod.rank_restart_reason):
        return -SAME_RECOVERY_SECONDS <= after <= max(window, SAME_RECOVERY_SECONDS)
    return abs(after) <= SAME_RECOVERY_SECONDS


def _caused_by(status: TrainingJobStatus, pods: Sequence[PodView], fault_at: float, window: float) -> bool:
    """Whether the counted rank restart (`status.lastRestartTime`) came of the fault at `fault_at` (a failed pod's
    end): within SAME_RECOVERY_SECONDS of it, or -- a consequence's report (a collective that timed out on the
    dead peer) -- up to `window` after it. The pod's end can reach the operator long after the survivors' report
    (its kubelet's status update is late on a loaded node): the fault's time decides, not the decision's."""
    last = last_restart(status)
    if last is None:
        return False
    consequence = any(p.uid in status.rank_restart_reporters and follows_a_peer(p.rank_restart_reason) for p in pods)
    latest = max(window, SAME_RECOVERY_SECONDS) if consequence else SAME_RECOVERY_SECONDS
    return -SAME_RECOVERY_SECONDS <= last - fault_at <= latest


def begin_generation(status: TrainingJobStatus, generation: int, now: float, merge: bool = True,
                     fault_at: float | None = None, pods: Sequence[PodView] = (), window: float = 0.0) -> None:
    """A decided restart: a new worker generation and one more restart -- unless (`merge`) a rank restart was
    counted for this same recovery (the survivors' ranks failed with the pod being replaced): moments before the
    decision, or (`fault_at`: when the failed pod ended; `pods`: the job's, `window`: `consequence_window`) caused
    by that failure (`_caused_by`); then the decided reason names that one recovery instead."""
    ranks_first = merge and status.last_restart_reason == R.RESTART_RANK
    if not (ranks_first and (_same_recovery(status, now)
                             or (fault_at is not None and _caused_by(status, pods, fault_at, window)))):
        status.restarts += 1
        if status.rank_restart_reporters:
            status.rank_restart_reporters = []  # a new recovery: no pod has reported it yet
    status.worker_generation = generation
    status.last_restart_time = rfc3339(now)


def _waits_for_cause(status: TrainingJobStatus, pod: PodView, now: float | None, window: float,
                     stalled: bool) -> bool:
    """A consequence's report, not the echo of a counted recovery, still within the wait for its cause's."""
    return (now is not None and follows_a_peer(pod.rank_restart_reason)
            and not _echoes(status, pod, window, stalled) and now - pod.rank_restart_at < CAUSE_WAIT_SECONDS)


def cause_wait_due(status: TrainingJobStatus, pods: Sequence[PodView], window: float = 0.0,
                   stalled: bool = False) -> list[float]:
    """When each consequence's report left waiting for its cause's (`count_rank_restarts` with `now`) stops
    waiting and is counted by itself. `status`: as the pass left it (its `rankRestarts` record what was taken)."""
    taken = status.rank_restarts
    return [p.rank_restart_at + CAUSE_WAIT_SECONDS for p in pods
            if p.rank_restarts > taken.get(p.uid, 0) and follows_a_peer(p.rank_restart_reason)
            and not _echoes(status, p, window, stalled)]


def count_rank_restarts(status: TrainingJobStatus, pods: Sequence[PodView], generation: int,
                        now: float | None = None, window: float = 0.0, stalled: bool = False) -> list[Event]:
    """Add the rank restarts reported since the last pass to `status.restarts` (lastRestartReason RankRestarted),
    one per recovery; record the counts per pod in `status.rankRestarts` (pruned to `pods`); return an event for
    each pod whose restart was counted (and for an echo that names a clearer cause). Causes are taken before
    consequences; with `now`, a consequence's report is left for a later pass while its cause's may still come.
    `window`: `consequence_window` of the spec; `stalled`: no step trained since the last counted recovery
    (policy/startup_failure.py's rule)."""
    counted = status.rank_restarts
    recorded = {p.uid: counted[p.uid] for p in pods if p.uid in counted}
    uids = {p.uid for p in pods}
    reporters = [u for u in status.rank_restart_reporters if u in uids]
    events: list[Event] = []
    for pod in sorted(pods, key=lambda p: (_doubt(p.rank_restart_reason), p.rank_restart_at)):
        before = recorded.get(pod.uid, 0)
        if pod.rank_restarts <= before or _waits_for_cause(status, pod, now, window, stalled):
            continue
        recorded[pod.uid] = pod.rank_restarts
        echo = _echoes(status, pod, window, stalled)
        looping = echo and pod.uid in status.rank_restart_reporters  # every restart of a crash loop: none new
        added = 0 if looping else pod.rank_restarts - before - (1 if echo else 0)
        if echo and not looping and _names_the_cause(pod, pods, reporters):
            events.append(_event(pod))
        if echo:
            reporters.append(pod.uid)
        if added <= 0 or pod.generation != generation or pod.deleting_since is not None:
            continue
        status.worker_generation = generation  # pinned: `restarts` no longer equals it
        status.restarts += added
        status.last_restart_reason = R.RESTART_RANK
        if pod.rank_restart_at:
            status.last_restart_time = rfc3339(pod.rank_restart_at)
            reporters = [pod.uid]  # a new recovery, begun by this pod's report
        events.append(_event(pod))
    if recorded != counted:
        status.rank_restarts = recorded
    if reporters != status.rank_restart_reporters:
        status.rank_restart_reporters = reporters
    return events


def _event(pod: PodView) -> Event:
    return Event("Warning", R.RESTART_RANK, R.MSG_RANK_RESTARTED.format(
        pod=pod.name, count=pod.rank_restarts, reason=pod.rank_restart_reason or "reason not reported"))
