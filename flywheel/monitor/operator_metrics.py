"""The operator's own metrics, health monitor included: every name in one place (prefix `flywheel_`).

Per-job series carry `job` and `namespace` like the trainer's, so the operator's scrape must keep them
(`honorLabels: true` in the PodMonitor/ServiceMonitor; see docs/monitoring.md). The operator creates one
`OperatorMetrics` and serves `registry`; tests give each instance a private registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

JOB_LABELS = ("job", "namespace")
PHASES = ("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended")
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
# Detection and recovery run from about a second (a crashed rank) to many minutes (a hang with a long timeout).
RECOVERY_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600)
QUERY_ERROR_REASONS = ("timeout", "connection", "http", "bad_response", "query")


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self._phases: dict[tuple[str, str], str] = {}  # (namespace, job) -> phase, of the jobs this process runs
        # (namespace, phase) -> jobs, kept with _phases; a namespace whose jobs are all gone keeps reading 0
        self._phase_counts: dict[tuple[str, str], int] = {}
        self._namespaces: set[str] = set()

        # Operator (set by the reconciler).
        self.jobs = Gauge("flywheel_operator_jobs", "TrainingJobs by phase.", ("namespace", "phase"), registry=r)
        self.job_phase = Gauge("flywheel_job_phase", "1 for the phase a TrainingJob is in, 0 for the others.",
                               JOB_LABELS + ("phase",), registry=r)
        self.reconcile_duration_seconds = Histogram(
            "flywheel_operator_reconcile_duration_seconds", "Time one reconcile of a TrainingJob took.",
            ("result",), buckets=RECONCILE_BUCKETS, registry=r)
        self.restarts_total = Counter("flywheel_job_restarts_total",
                                      "Job or worker restarts, by reason (status.lastRestartReason).",
                                      JOB_LABELS + ("reason",), registry=r)
        self.time_to_detect_seconds = Histogram(
            "flywheel_operator_time_to_detect_seconds",
            "From a failure (last step, pod exit, XID) until the operator decided what to do.", ("reason",),
            buckets=RECOVERY_BUCKETS, registry=r)
        self.time_to_recover_seconds = Histogram(
            "flywheel_operator_time_to_recover_seconds",
            "From a failure until the job made its first step again.", ("reason",), buckets=RECOVERY_BUCKETS,
            registry=r)
        self.recovery_part_seconds = Histogram(
            "flywheel_operator_recovery_part_seconds",
            "Each part of a recovery (detect, decide, pod_ready, rendezvous, restore, first_step), by reason.",
            ("reason", "part"), buckets=RECOVERY_BUCKETS, registry=r)
        self.badput_seconds_total = Counter("flywheel_job_badput_seconds_total",
                                            "Seconds from a fault to the first step after it, by cause.",
                                            JOB_LABELS + ("cause",), registry=r)
        self.replayed_steps_total = Counter("flywheel_job_replayed_steps_total",
                                            "Steps trained again after a recovery, by cause.",
                                            JOB_LABELS + ("cause",), registry=r)
        self.goodput_ratio = Gauge("flywheel_job_goodput_ratio",
                                   "Productive training time over wall time since the job started.", JOB_LABELS,
                                   registry=r)

        self._declare_monitor(r)

    def _declare_monitor(self, r: CollectorRegistry) -> None:
        """The health monitor's own metrics."""
        self.monitor_evaluations_total = Counter("flywheel_monitor_evaluations_total",
                                                 "Health evaluations run (including ones with failed queries).",
                                                 registry=r)
        self.monitor_query_errors_total = Counter("flywheel_monitor_query_errors_total",
                                                  "Prometheus queries that failed, by query and reason.",
                                                  ("query", "reason"), registry=r)
        self.monitor_decisions_total = Counter("flywheel_monitor_decisions_total",
                                               "Decisions handed to the executor, by kind.", ("decision",), registry=r)
        self.monitor_action_errors_total = Counter("flywheel_monitor_action_errors_total",
                                                   "Decisions the executor failed to carry out, by action.",
                                                   ("action",), registry=r)
        self.monitor_last_evaluation_timestamp_seconds = Gauge(
            "flywheel_monitor_last_evaluation_timestamp_seconds", "Unix time the last health evaluation finished.",
            registry=r)
        self.job_stragglers = Gauge("flywheel_job_straggler_ranks",
                                    "Ranks persistently slower than their peers (Degraded when > 0).", JOB_LABELS,
                                    registry=r)
        # export zeros so rate() and alerts see the first error
        for query in ("progress", "final_saves", "process_starts", "step_times", "xids"):
            for reason in QUERY_ERROR_REASONS:
                self.monitor_query_errors_total.labels(query, reason)

    def observe_recovery(self, namespace: str, job: str, cause: str, parts: dict[str, float], replayed: int) -> None:
        """One recovery's record (operator/recovery_record.py): its parts, its badput, its replayed steps."""
        for part, seconds in parts.items():
            self.recovery_part_seconds.labels(cause, part).observe(seconds)
        self.badput_seconds_total.labels(job, namespace, cause).inc(sum(parts.values()))
        self.replayed_steps_total.labels(job, namespace, cause).inc(replayed)

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)

    def observe_job(self, namespace: str, job: str, status: dict[str, object], previous_restarts: int) -> None:
        """Record one status the reconciler wrote (after the write succeeded)."""
        phase = str(status.get("phase", "Pending"))
        old = self._phases.get((namespace, job))
        if old != phase:
            self._phases[(namespace, job)] = phase
            self._count_phase(namespace, old, phase)
            self.set_job_phase(namespace, job, phase)
        restarts = int(status.get("restarts", 0) or 0)  # type: ignore[call-overload]
        if restarts > previous_restarts:
            self.restarts_total.labels(job, namespace, str(status.get("lastRestartReason", ""))).inc(
                restarts - previous_restarts)
        goodput = status.get("goodput")
        if isinstance(goodput, dict) and "ratio" in goodput:
            self.goodput_ratio.labels(job, namespace).set(float(goodput["ratio"]))

    def _count_phase(self, namespace: str, old: str | None, new: str | None) -> None:
        """A job of `namespace` left phase `old` for `new` (None: it came or went): only those two series change,
        so a pass costs the same with 5 jobs or 5,000."""
        if namespace not in self._namespaces:
            self._namespaces.add(namespace)
            for phase in PHASES:  # a namespace's first job: every phase reads 0 until it counts
                self._phase_counts[(namespace, phase)] = 0
                self.jobs.labels(namespace, phase).set(0)
        for changed, step in ((old, -1), (new, 1)):
            if changed is not None:
                key = (namespace, changed)
                self._phase_counts[key] = self._phase_counts.get(key, 0) + step
                self.jobs.labels(namespace, changed).set(self._phase_counts[key])

    def set_job_phase(self, namespace: str, job: str, phase: str) -> None:
        for p in PHASES:
            self.job_phase.labels(job, namespace, p).set(1 if p == phase else 0)

    def forget_job(self, namespace: str, job: str) -> None:
        """Drop a deleted job's per-job series (restart counters stay: they are history)."""
        old = self._phases.pop((namespace, job), None)
        if old is not None:
            self._count_phase(namespace, old, None)
        for gauge in (self.goodput_ratio, self.job_stragglers):
            try:
                gauge.remove(job, namespace)
            except KeyError:
                pass
        for p in PHASES:
            try:
                self.job_phase.remove(job, namespace, p)
            except KeyError:
                pass
