"""The operator's Prometheus metrics (prefix `flywheel_`; labels namespace, job, phase, reason; never step)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

PHASES = ("Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended")


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.jobs = Gauge("flywheel_operator_jobs", "TrainingJobs by phase.", ["phase"], registry=self.registry)
        self.reconcile = Histogram("flywheel_operator_reconcile_seconds", "Duration of one reconcile pass.",
                                   registry=self.registry,
                                   buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.restarts = Counter("flywheel_operator_restarts_total", "Restarts decided, by reason.",
                                ["namespace", "job", "reason"], registry=self.registry)
        self.goodput = Gauge("flywheel_job_goodput_ratio", "Productive step time / wall time since the first start.",
                             ["namespace", "job"], registry=self.registry)
        self._phase: dict[tuple[str, str], str] = {}
        for phase in PHASES:
            self.jobs.labels(phase).set(0)

    def serve(self, port: int) -> None:
        start_http_server(port, registry=self.registry)

    def observe_job(self, namespace: str, job: str, status: dict[str, object], previous_restarts: int) -> None:
        """Record one written status (called after the write succeeded)."""
        self._phase[(namespace, job)] = str(status.get("phase", "Pending"))
        self._publish_phases()
        restarts = int(status.get("restarts", 0) or 0)  # type: ignore[call-overload]
        if restarts > previous_restarts:
            self.restarts.labels(namespace, job, str(status.get("lastRestartReason", ""))).inc(
                restarts - previous_restarts)
        goodput = status.get("goodput")
        if isinstance(goodput, dict) and "ratio" in goodput:
            self.goodput.labels(namespace, job).set(float(goodput["ratio"]))

    def forget_job(self, namespace: str, job: str) -> None:
        self._phase.pop((namespace, job), None)
        self._publish_phases()
        try:
            self.goodput.remove(namespace, job)
        except KeyError:
            pass

    def _publish_phases(self) -> None:
        for phase in PHASES:
            self.jobs.labels(phase).set(sum(1 for p in self._phase.values() if p == phase))
