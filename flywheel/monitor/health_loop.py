"""The health loop: every `interval`, query Prometheus, let `policy.health_checks.evaluate` decide, hand the
decisions to the executor. It never raises out of `run`: a failed query is logged and metered and its check
skipped; a failed action is logged and metered too.

The operator runs it as a background task:

    monitor = HealthMonitor(settings, inventory, actions, metrics)
    task = asyncio.create_task(monitor.run(stop_event))
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

from flywheel.contracts.labels import XID_HANDLED_ANNOTATION
from flywheel.monitor import queries
from flywheel.monitor.executor_api import HealthActions, JobInventory, XidMemory
from flywheel.monitor.operator_metrics import OperatorMetrics
from flywheel.monitor.prometheus import PrometheusClient, PrometheusError, Sample
from flywheel.policy.health_checks import (
    HealthDecisions,
    HealthSettings,
    HealthState,
    Observations,
    WatchedJob,
    evaluate,
)
from flywheel.policy.xid import NodeFault, XidClass, XidSample
from flywheel.policy.xid_memory import nodes_to_check

log = logging.getLogger(__name__)


class Querier(Protocol):
    async def query(self, promql: str) -> list[Sample]: ...


@dataclass(frozen=True)
class MonitorSettings:
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    interval_seconds: float = 5.0
    query_timeout_seconds: float = 3.0
    progress_lookback_seconds: int = 3600  # how far back a silent rank's last step is still found
    step_time_window_seconds: int = 120
    health: HealthSettings = field(default_factory=HealthSettings)


def add_monitor_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags `flywheel operator` exposes for the monitor."""
    g = parser.add_argument_group("health monitor")
    g.add_argument("--no-health-monitor", dest="health_monitor", action="store_false",
                   help="do not query Prometheus or act on hangs, GPU XIDs and stragglers")
    g.add_argument("--prometheus-url", default=MonitorSettings.prometheus_url)
    g.add_argument("--health-interval", type=float, default=MonitorSettings.interval_seconds, metavar="SECONDS")
    g.add_argument("--prometheus-timeout", type=float, default=MonitorSettings.query_timeout_seconds,
                   metavar="SECONDS")
    g.add_argument("--scrape-interval", type=float, default=HealthSettings.staleness_allowance_seconds,
                   metavar="SECONDS", help="the trainers' scrape interval: how stale a last-step time may be")
    g.add_argument("--no-cordon", dest="cordon", action="store_false",
                   help="on a fatal GPU XID replace the pods but leave the node schedulable")
    g.add_argument("--straggler-factor", type=float, default=HealthSettings.straggler_factor)
    g.add_argument("--straggler-evaluations", type=int, default=HealthSettings.straggler_evaluations)


def settings_from_args(args: argparse.Namespace) -> MonitorSettings:
    if args.health_interval <= 0 or args.prometheus_timeout <= 0:
        raise ValueError("--health-interval and --prometheus-timeout must be positive")
    health = HealthSettings(staleness_allowance_seconds=args.scrape_interval, cordon_nodes=args.cordon,
                            straggler_factor=args.straggler_factor, straggler_evaluations=args.straggler_evaluations)
    return MonitorSettings(prometheus_url=args.prometheus_url, interval_seconds=args.health_interval,
                           query_timeout_seconds=args.prometheus_timeout, health=health)


class HealthMonitor:
    def __init__(self, settings: MonitorSettings, inventory: JobInventory, actions: HealthActions,
                 metrics: OperatorMetrics, querier: Querier | None = None,
                 clock: Callable[[], float] = time.time, xid_memory: XidMemory | None = None):
        """`xid_memory`: where fatal-XID actions are remembered (none: only in this process)."""
        self.settings = settings
        self.inventory = inventory
        self.actions = actions
        self.metrics = metrics
        self._owns_querier = querier is None
        self.querier: Querier = querier or PrometheusClient(settings.prometheus_url, settings.query_timeout_seconds)
        self.clock = clock
        self.xid_memory = xid_memory
        self.state = HealthState()

    async def run(self, stop: asyncio.Event) -> None:
        """Evaluate every `interval_seconds` until `stop` is set."""
        log.info("health monitor: querying %s every %.1fs", self.settings.prometheus_url,
                 self.settings.interval_seconds)
        try:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    await self.evaluate_once()
                except Exception:  # a bug here must not end health monitoring for good
                    log.exception("health evaluation failed")
                pause = max(0.0, self.settings.interval_seconds - (time.monotonic() - began))
                try:
                    await asyncio.wait_for(stop.wait(), pause)
                except asyncio.TimeoutError:
                    pass
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the Prometheus client this monitor made (`run` does so when it ends)."""
        if self._owns_querier and isinstance(self.querier, PrometheusClient):
            await self.querier.aclose()

    async def evaluate_once(self) -> HealthDecisions:
        jobs = list(await self.inventory.jobs())
        lookback = self.settings.progress_lookback_seconds
        progress, final_saves, starts, step_times, xids = await asyncio.gather(
            self._query("progress", queries.progress_query(lookback)),
            self._query("final_saves", queries.final_save_query(lookback)),
            self._query("process_starts", queries.process_start_query(lookback)),
            self._query("step_times", queries.step_time_query(self.settings.step_time_window_seconds)),
            self._query("xids", queries.XID_QUERY))
        xid_samples = None if xids is None else queries.parse_xids(xids)
        obs = Observations(
            now=self.clock(), jobs=jobs,
            # Without the final saves' or the process starts' answer a save or a restart in place could look like a
            # hang: no hang check this time.
            progress=None if progress is None or final_saves is None or starts is None else
            queries.parse_progress(progress, final_saves, starts),
            step_times=None if step_times is None else queries.parse_step_times(step_times),
            xids=xid_samples, xid_handled=await self._handled_xids(xid_samples, jobs))
        decisions, self.state = evaluate(obs, self.state, self.settings.health)
        await self._hand_over(decisions)
        self.metrics.monitor_evaluations_total.inc()
        self.metrics.monitor_last_evaluation_timestamp_seconds.set(time.time())
        return decisions

    async def _handled_xids(self, samples: list[XidSample] | None,
                            jobs: list[WatchedJob]) -> dict[str, dict[str, int]]:
        """What the nodes remember of fatal XIDs this process has no memory of (an unreadable memory: none)."""
        if self.xid_memory is None or samples is None:
            return {}
        nodes = nodes_to_check(self.state.xid_codes, samples, [p for j in jobs for p in j.pods])
        if not nodes:
            return {}
        try:
            handled = await self.xid_memory.handled(nodes)
        except Exception:  # the API down: act as before rather than never
            log.exception("health monitor: cannot read the fatal XIDs already handled on %s", ", ".join(nodes))
            return {}
        for node, gpus in handled.items():
            log.info("node %s: fatal XIDs %s were acted on before (annotation %s): not again while they show",
                     node, gpus, XID_HANDLED_ANNOTATION)
        return handled

    async def _query(self, name: str, promql: str) -> list[Sample] | None:
        try:
            return await self.querier.query(promql)
        except PrometheusError as err:
            self.metrics.monitor_query_errors_total.labels(name, err.reason).inc()
            log.warning("health monitor: %s query failed (%s): %s; skipping that check", name, err.reason, err)
            return None

    async def _act(self, action: str, call: Callable[[], Awaitable[None]]) -> bool:
        self.metrics.monitor_decisions_total.labels(action).inc()
        try:
            await call()
            return True
        except Exception:
            self.metrics.monitor_action_errors_total.labels(action).inc()
            log.exception("health monitor: %s failed", action)
            return False

    async def _node_fault(self, fault: NodeFault) -> bool:
        """Cordon the node (when allowed) and replace each job's pods there; True when every action succeeded (each
        is tried even after one failed: the others' jobs need not wait for the retry)."""
        ok = True
        if fault.cordon:
            ok = await self._act("cordon_node", functools.partial(self.actions.cordon_node, fault.node, fault))
        for key in sorted({(p.namespace, p.job) for p in fault.pods}):
            pods = [p for p in fault.pods if (p.namespace, p.job) == key]
            ok = await self._act("replace_pods", functools.partial(self.actions.replace_pods, pods, fault)) and ok
        return ok

    async def _hand_over(self, d: HealthDecisions) -> None:
        for hang in d.hangs:
            log.warning("job %s/%s is hung: %s", hang.namespace, hang.job, hang.message)
            self.metrics.time_to_detect_seconds.labels("Hang").observe(hang.idle_seconds)
            if not await self._act("mark_hung", functools.partial(self.actions.mark_hung, hang)):
                self.state = self.state.forget_hang((hang.namespace, hang.job))
        for fault in d.node_faults:
            log.error("%s", fault.message)
            if not await self._node_fault(fault):
                # Neither remembered here nor on the node: the next evaluation raises it again (a retry per interval).
                log.warning("node %s: the actions for fatal XID %s failed; trying again at the next evaluation",
                            fault.node, "/".join(map(str, fault.codes)))
                self.state = self.state.forget_fault(fault)
            elif self.xid_memory is not None:
                await self._act("remember_xid", functools.partial(self.xid_memory.remember, fault))
        for restart in d.rank_restarts:
            log.warning("job %s/%s: %s", restart.namespace, restart.job, restart.message)
            await self._act("restart_ranks", functools.partial(self.actions.restart_ranks, restart))
        for change in d.degradations:
            log.warning("job %s/%s %s: %s", change.namespace, change.job,
                        "degraded" if change.degraded else "recovered", change.message)
            await self._act("mark_degraded", functools.partial(self.actions.mark_degraded, change))
        for notice in d.notices:
            s = notice.sample
            level = logging.INFO if notice.xid_class is XidClass.IGNORED else logging.WARNING
            log.log(level, "GPU XID %d (%s) on node %s gpu %s%s: no action (no job pod there, or not actionable)",
                    s.code, notice.xid_class.value, s.node, s.gpu, f" used by {s.namespace}/{s.pod}" if s.pod else "")
        for (namespace, job), count in d.stragglers.items():
            self.metrics.job_stragglers.labels(job, namespace).set(count)
