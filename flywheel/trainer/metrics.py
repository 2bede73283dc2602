"""The trainer's Prometheus metrics (prefix `flywheel_`; docs/monitoring.md), on a private registry.

Labels are job, namespace, replica, rank: low cardinality, never the step. Each metric is exposed as a child
already bound to this process's labels, e.g. `metrics.checkpoint_blocking_seconds.observe(s)`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import PROCESS_COLLECTOR, CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from flywheel.trainer.checkpoint.failure import FailureReason

LABELS = ("job", "namespace", "replica", "rank")
STEP_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
CHECKPOINT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def process_started() -> float:
    """When this process started (prometheus_client's process collector reads /proc): a user script builds its
    metrics at its first `flywheel.progress.step`, and its start-up is what the hang check's allowance is for. Now
    where the collector cannot tell (no /proc)."""
    return next((sample.value for family in PROCESS_COLLECTOR.collect() for sample in family.samples
                 if sample.name == "process_start_time_seconds"), time.time())


class TrainerMetrics:
    """`labels` must give job, namespace, replica and rank. Serves /metrics on `port` when port > 0 (the worker's
    local rank 0 only: one port per worker)."""

    def __init__(self, port: int, labels: dict[str, str]):
        missing = set(LABELS) - set(labels)
        if missing:
            raise ValueError(f"metric labels missing: {', '.join(sorted(missing))}")
        values = {k: str(labels[k]) for k in LABELS}
        self.registry = CollectorRegistry(auto_describe=True)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, LABELS, registry=self.registry).labels(**values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, LABELS, registry=self.registry).labels(**values)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry).labels(**values)

        self.train_steps_total = counter("flywheel_train_steps_total", "Optimizer steps finished by this process.")
        self.train_last_step_timestamp_seconds = gauge("flywheel_train_last_step_timestamp_seconds",
                                                       "Unix time the last optimizer step finished.")
        # Progress as the watchdog counts it (a step or an evaluation batch): what the health monitor's hang check
        # reads, so a long evaluation is no hang there either.
        self.train_last_progress_timestamp_seconds = gauge(
            "flywheel_train_last_progress_timestamp_seconds",
            "Unix time of the last progress: an optimizer step or an evaluation batch finished.")
        self.train_final_save_started_timestamp_seconds = gauge(
            "flywheel_train_final_save_started_timestamp_seconds",
            "Unix time the final blocking checkpoint save began (0: not begun); the hang check pauses, bounded.")
        # A rank restarted in place keeps its pod and its labels: this tells the hang check that a new process is
        # in its start-up and restore (firstStepTimeoutSeconds), not a rank idle since its last step.
        self.train_started_timestamp_seconds = gauge(
            "flywheel_train_started_timestamp_seconds",
            "Unix time this trainer process started (a rank restarted in place starts a new one).")
        self.train_started_timestamp_seconds.set(process_started())
        self.train_loss = gauge("flywheel_train_loss", "Loss of the last step, mean over the global batch.")
        self.train_tokens_per_second = gauge("flywheel_train_tokens_per_second",
                                             "Tokens of the global batch per second of the last step.")
        self.train_step_seconds = histogram("flywheel_train_step_seconds", "Wall time of one optimizer step.",
                                            STEP_BUCKETS)
        self._declare_eval_and_checkpoint(gauge, counter, histogram, values)
        self.port = port
        if port > 0:
            start_http_server(port, registry=self.registry)

    def _declare_eval_and_checkpoint(self, gauge: Callable[[str, str], Gauge], counter: Callable[[str, str], Counter],
                                     histogram: Callable[[str, str, tuple[float, ...]], Histogram],
                                     values: dict[str, str]) -> None:
        self.eval_loss = gauge("flywheel_eval_loss", "Loss of the last evaluation, mean over the validation samples.")
        self.eval_perplexity = gauge("flywheel_eval_perplexity", "exp(eval loss) of the last evaluation.")
        self.eval_step = gauge("flywheel_eval_step", "Optimizer step the last evaluation was taken after.")
        self.checkpoint_blocking_seconds = histogram("flywheel_checkpoint_blocking_seconds",
                                                     "Time the training loop was held by a checkpoint save.",
                                                     CHECKPOINT_BUCKETS)
        self.checkpoint_total_seconds = histogram("flywheel_checkpoint_total_seconds",
                                                  "Time from starting a checkpoint until it was committed.",
                                                  CHECKPOINT_BUCKETS)
        self.checkpoint_last_step = gauge("flywheel_checkpoint_last_step", "Step of the newest committed checkpoint.")
        self.checkpoint_memory_bytes = gauge("flywheel_checkpoint_memory_bytes",
                                             "Host shared memory held by this rank's memory-tier copies (its own "
                                             "newest step and the replica it keeps for its peer).")
        self.checkpoint_failures_total = ReasonCounter(Counter(
            "flywheel_checkpoint_failures_total", "Checkpoint saves that failed, by reason (counted by global rank 0).",
            (*LABELS, "reason"), registry=self.registry), values, [r.value for r in FailureReason])
        self.rendezvous_seconds = gauge("flywheel_rendezvous_seconds",
                                        "Time this process took to join the process group.")
        self.watchdog_fired_total = counter("flywheel_watchdog_fired_total",
                                            "Progress watchdog firings (the process exits right after).")
        self.collective_failures_total = counter("flywheel_collective_failures_total",
                                                 "Collectives that timed out or were aborted (exit code 5).")

    def record_step(self, *, loss: float, step_seconds: float, tokens_per_second: float, timestamp: float) -> None:
        self.train_steps_total.inc()
        self.train_last_step_timestamp_seconds.set(timestamp)
        self.train_last_progress_timestamp_seconds.set(timestamp)
        self.train_loss.set(loss)
        self.train_tokens_per_second.set(tokens_per_second)
        self.train_step_seconds.observe(step_seconds)

    def record_eval_batch(self, *, timestamp: float) -> None:
        self.train_last_progress_timestamp_seconds.set(timestamp)

    def record_final_save(self, *, timestamp: float) -> None:
        self.train_final_save_started_timestamp_seconds.set(timestamp)

    def record_eval(self, *, loss: float, perplexity: float, step: int) -> None:
        self.eval_loss.set(loss)
        self.eval_perplexity.set(perplexity)
        self.eval_step.set(step)

class ReasonCounter:
    """A counter with a `reason` label besides this process's: `.labels(reason=...).inc()`. Every reason is
    exported from the start (at 0), so a rate over it exists before the first failure."""

    def __init__(self, counter: Counter, values: dict[str, str], reasons: list[str]) -> None:
        self._counter, self._values = counter, values
        for reason in reasons:
            self.labels(reason=reason)

    def labels(self, *, reason: str) -> Counter:
        return self._counter.labels(**self._values, reason=reason)
