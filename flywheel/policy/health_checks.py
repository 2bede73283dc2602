"""Health decisions from monitoring data (pure): hung jobs, GPU XIDs (see xid.py), stragglers.

The health monitor queries Prometheus, turns the answers into the plain records below, and calls `evaluate` with the
state it got back last time. A query that failed is passed as None: that check is skipped and its memory kept, so
an unreachable Prometheus never looks like a healthy (or a hung) cluster.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from flywheel.etcd.progress import final_save_allowance
from flywheel.policy.xid import (
    GpuKey,
    NodeFault,
    RankRestart,
    WatchedPod,
    XidEvent,
    XidSample,
    decide_xids,
    same_node,
    xid_events,
)
from flywheel.policy.xid_memory import already_handled

JobKey = tuple[str, str]  # (namespace, name)
RankKey = tuple[str, str, str, str]  # (namespace, job, replica, rank)


@dataclass(frozen=True)
class WatchedJob:
    """A job the monitor watches, with its pods (from the executor's cache)."""

    namespace: str
    name: str
    phase: str
    progress_timeout_seconds: float
    first_step_timeout_seconds: float
    pods: tuple[WatchedPod, ...] = ()
    # status.lastRestartTime: a restart decided then (a hang's, in place: same pods) starts every rank's first-step
    # allowance anew, before any agent's report of restarting its ranks reaches the monitor.
    restarted_at: float = 0.0

    @property
    def key(self) -> JobKey:
        return (self.namespace, self.name)


@dataclass(frozen=True)
class RankProgress:
    """One rank's last progress: `flywheel_train_last_progress_timestamp_seconds` (a step or an evaluation batch, as
    the trainer's watchdog counts it), or `..._last_step_...` where a trainer exports no such gauge; when its
    final blocking save began (`..._final_save_started_...`, 0: not begun); and when its newest process started
    (`flywheel_train_started_timestamp_seconds`, 0: unknown): a rank restarted in place keeps its pod."""

    namespace: str
    job: str
    replica: str
    rank: str
    last_step_timestamp: float
    final_save_started: float = 0.0
    process_started: float = 0.0


@dataclass(frozen=True)
class RankStepTime:
    """A rank's mean step time over the recent window (from the `flywheel_train_step_seconds` histogram)."""

    namespace: str
    job: str
    replica: str
    rank: str
    mean_step_seconds: float

    @property
    def key(self) -> RankKey:
        return (self.namespace, self.job, self.replica, self.rank)


@dataclass(frozen=True)
class HealthSettings:
    # Prometheus holds a value up to one scrape interval old: waiting that much longer never calls a rank that
    # stepped just after the last scrape hung.
    staleness_allowance_seconds: float = 15.0
    cordon_nodes: bool = True  # on a fatal XID; off leaves the node schedulable and only replaces the pods
    xid_restart_cooldown_seconds: float = 60.0
    straggler_factor: float = 1.5  # slower than the peers' median step time by more than this ...
    straggler_evaluations: int = 3  # ... this many evaluations in a row


@dataclass(frozen=True)
class StalledRank:
    replica: str
    rank: str  # "" when the replica exports no progress at all
    last_step_timestamp: float | None
    idle_seconds: float


@dataclass(frozen=True)
class HangFinding:
    """No step progress on some rank for longer than the job allows while all its pods run."""

    namespace: str
    job: str
    ranks: tuple[StalledRank, ...]
    progress_timeout_seconds: float

    @property
    def idle_seconds(self) -> float:
        return max(r.idle_seconds for r in self.ranks)

    @property
    def message(self) -> str:
        which = ", ".join(f"replica {r.replica} rank {r.rank}" if r.rank else f"replica {r.replica} (no metrics)"
                          for r in self.ranks)
        return (f"no training step for {self.idle_seconds:.0f}s (progressTimeoutSeconds="
                f"{self.progress_timeout_seconds:g}) on {which}")


@dataclass(frozen=True)
class Straggler:
    replica: str
    rank: str
    ratio: float  # its mean step time over the peers' median


@dataclass(frozen=True)
class Degradation:
    """The job's Degraded condition changes: on with its stragglers, or off again."""

    namespace: str
    job: str
    degraded: bool
    stragglers: tuple[Straggler, ...]

    @property
    def message(self) -> str:
        if not self.degraded:
            return "no rank is persistently slower than its peers any more"
        return "persistently slow: " + ", ".join(f"replica {s.replica} rank {s.rank} ({s.ratio:.2f}x the median)"
                                                  for s in self.stragglers)


@dataclass(frozen=True)
class Observations:
    """One evaluation's input. None = that query failed this time."""

    now: float
    jobs: Sequence[WatchedJob]
    progress: Sequence[RankProgress] | None
    step_times: Sequence[RankStepTime] | None
    xids: Sequence[XidSample] | None
    # node -> gpu -> fatal code already acted on (node annotations, policy/xid_memory.py): read for nodes_to_check
    xid_handled: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class HealthState:
    """What one evaluation hands the next. Start with `HealthState()`."""

    reported_hangs: frozenset[JobKey] = frozenset()
    xid_codes: Mapping[GpuKey, int] | None = None  # None until the first XID answer (see xid_events)
    xid_restarted_at: Mapping[tuple[str, str], float] = field(default_factory=dict)
    straggler_streaks: Mapping[RankKey, int] = field(default_factory=dict)
    degraded: Mapping[JobKey, tuple[Straggler, ...]] = field(default_factory=dict)

    def forget_hang(self, job: JobKey) -> HealthState:
        """The hang could not be handed over: report it again next time."""
        return HealthState(self.reported_hangs - {job}, self.xid_codes, self.xid_restarted_at,
                           self.straggler_streaks, self.degraded)

    def forget_fault(self, fault: NodeFault) -> HealthState:
        """The fault's actions failed: forget its GPUs' codes, so the next evaluation (one interval later) sees them
        as new and acts again. Keyed by the exporter's host name, which may be the FQDN of `fault.node`."""
        if self.xid_codes is None:
            return self
        gpus = {gpu for gpu, _ in fault.gpus}
        codes = {key: code for key, code in self.xid_codes.items()
                 if not (key[1] in gpus and same_node(key[0], fault.node))}
        return HealthState(self.reported_hangs, codes, self.xid_restarted_at, self.straggler_streaks, self.degraded)


@dataclass(frozen=True)
class HealthDecisions:
    hangs: tuple[HangFinding, ...] = ()
    node_faults: tuple[NodeFault, ...] = ()
    rank_restarts: tuple[RankRestart, ...] = ()
    degradations: tuple[Degradation, ...] = ()
    notices: tuple[XidEvent, ...] = ()
    stragglers: Mapping[JobKey, int] = field(default_factory=dict)  # stragglers per watched job, for a gauge


def _stalled_ranks(job: WatchedJob, progress: Sequence[RankProgress], now: float,
                   allowance: float) -> list[StalledRank]:
    by_replica: dict[str, list[RankProgress]] = {}
    for p in progress:
        by_replica.setdefault(p.replica, []).append(p)
    stalled = []
    for pod in job.pods:
        # Its ranks' newest processes began with the pod, or with their agent's restart of them in place, or at the
        # latest with the restart the operator decided (whose report may lag): a rank that exports nothing until
        # its first step (a user script) has no start gauge of its own to say so.
        started = max(pod.started_at, pod.ranks_restarted_at, job.restarted_at) if pod.started_at is not None else None
        ranks = by_replica.get(pod.replica, [])
        if not ranks:
            # Only a replica that stays silent while its peers export progress is stalled: a job with no series at
            # all is a scrape problem, not a hang.
            if by_replica and started is not None and now > started + job.first_step_timeout_seconds + allowance:
                stalled.append(StalledRank(pod.replica, "", None, now - started))
            continue
        for p in ranks:
            deadline = _deadline(job, p, started)
            if now > deadline + allowance:
                stalled.append(StalledRank(p.replica, p.rank, p.last_step_timestamp, now - p.last_step_timestamp))
    return stalled


def _deadline(job: WatchedJob, p: RankProgress, started: float | None) -> float:
    """When the rank is hung without further progress (before the staleness allowance)."""
    began = max(started or 0.0, p.process_started)
    if began > 0 and p.last_step_timestamp < began:
        # Not stepped since its pod, or its process restarted in place, started: still within the start-up and
        # restore allowance.
        return began + job.first_step_timeout_seconds
    if p.final_save_started >= p.last_step_timestamp > 0:
        # The final save pauses the check, bounded as on the etcd path (policy/progress_hang.py).
        return p.final_save_started + final_save_allowance(job.progress_timeout_seconds,
                                                           job.first_step_timeout_seconds)
    return p.last_step_timestamp + job.progress_timeout_seconds


def find_hangs(jobs: Sequence[WatchedJob], progress: Sequence[RankProgress], now: float,
               allowance: float) -> list[HangFinding]:
    """Jobs with a rank that made no step for `progressTimeoutSeconds` (plus `allowance`) while every one of the
    job's pods is Running. Pending or terminating pods mean the executor is already acting: no verdict then."""
    found = []
    for job in jobs:
        if job.progress_timeout_seconds <= 0 or not job.pods or any(p.phase != "Running" for p in job.pods):
            continue
        mine = [p for p in progress if (p.namespace, p.job) == job.key]
        stalled = _stalled_ranks(job, mine, now, allowance)
        if stalled:
            found.append(HangFinding(job.namespace, job.name, tuple(stalled), job.progress_timeout_seconds))
    return found


def update_stragglers(step_times: Sequence[RankStepTime], streaks: Mapping[RankKey, int], *, factor: float,
                      evaluations: int) -> tuple[dict[JobKey, tuple[Straggler, ...]], dict[RankKey, int]]:
    """Stragglers per job and the new streaks. A rank's streak grows while its mean step time exceeds `factor`
    times the median of its peers' (the other ranks of its job), and resets otherwise; it is a straggler once the
    streak reaches `evaluations`. Ranks without a number this time lose their streak."""
    by_job: dict[JobKey, list[RankStepTime]] = {}
    for t in step_times:
        if t.mean_step_seconds > 0:
            by_job.setdefault((t.namespace, t.job), []).append(t)
    new_streaks: dict[RankKey, int] = {}
    stragglers: dict[JobKey, tuple[Straggler, ...]] = {}
    for job, ranks in by_job.items():
        slow = []
        for t in ranks:
            peers = [o.mean_step_seconds for o in ranks if o is not t]
            if not peers:
                continue
            ratio = t.mean_step_seconds / statistics.median(peers)
            streak = streaks.get(t.key, 0) + 1 if ratio > factor else 0
            new_streaks[t.key] = streak
            if streak >= evaluations:
                slow.append(Straggler(t.replica, t.rank, ratio))
        stragglers[job] = tuple(sorted(slow, key=lambda s: (s.replica, s.rank)))
    return stragglers, new_streaks


def _degradations(stragglers: Mapping[JobKey, tuple[Straggler, ...]], before: Mapping[JobKey, tuple[Straggler, ...]],
                  watched: set[JobKey]) -> tuple[list[Degradation], dict[JobKey, tuple[Straggler, ...]]]:
    changes, degraded = [], {}
    for job in sorted(watched):
        slow = stragglers.get(job, ())
        was = before.get(job)
        if slow:
            degraded[job] = slow
            if was is None or {(s.replica, s.rank) for s in was} != {(s.replica, s.rank) for s in slow}:
                changes.append(Degradation(job[0], job[1], True, slow))
        elif was is not None:
            changes.append(Degradation(job[0], job[1], False, ()))
    return changes, degraded


def evaluate(obs: Observations, state: HealthState, settings: HealthSettings) -> tuple[HealthDecisions, HealthState]:
    """One evaluation: the decisions to hand to the executor and the state for the next one.

    A hang is reported once per episode (until the job is seen not hung); XIDs act on changes only; Degraded is
    reported when a job's set of stragglers changes. Jobs no longer watched are forgotten.
    """
    watched = {j.key for j in obs.jobs if j.phase == "Running"}
    running = [j for j in obs.jobs if j.key in watched]

    hangs: list[HangFinding] = []
    reported = state.reported_hangs & watched
    if obs.progress is not None:
        current = find_hangs(running, obs.progress, obs.now, settings.staleness_allowance_seconds)
        hung_now = {(h.namespace, h.job) for h in current}
        hangs = [h for h in current if (h.namespace, h.job) not in reported]
        reported = frozenset(hung_now)

    xid_codes, restarted_at = state.xid_codes, state.xid_restarted_at
    faults: tuple[NodeFault, ...] = ()
    restarts: tuple[RankRestart, ...] = ()
    notices: tuple[XidEvent, ...] = ()
    if obs.xids is not None:
        events, xid_codes = xid_events(state.xid_codes, obs.xids)
        events = [e for e in events if not already_handled(e, state.xid_codes, obs.xid_handled)]
        pods = [p for j in running for p in j.pods]
        xid = decide_xids(events, pods, cordon=settings.cordon_nodes, now=obs.now,
                          restart_cooldown_seconds=settings.xid_restart_cooldown_seconds, restarted_at=restarted_at)
        faults, restarts, notices, restarted_at = xid.node_faults, xid.rank_restarts, xid.notices, xid.restarted_at

    streaks, degraded = state.straggler_streaks, {k: v for k, v in state.degraded.items() if k in watched}
    changes: list[Degradation] = []
    counts: dict[JobKey, int] = {}
    if obs.step_times is not None:
        mine = [t for t in obs.step_times if (t.namespace, t.job) in watched]
        stragglers, streaks = update_stragglers(mine, streaks, factor=settings.straggler_factor,
                                                evaluations=settings.straggler_evaluations)
        changes, degraded = _degradations(stragglers, degraded, watched)
        counts = {job: len(stragglers.get(job, ())) for job in watched}

    decisions = HealthDecisions(tuple(hangs), faults, restarts, tuple(changes), notices, counts)
    return decisions, HealthState(frozenset(reported), xid_codes, restarted_at, streaks, degraded)
