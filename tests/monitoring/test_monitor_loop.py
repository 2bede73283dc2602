"""The health loop's hand-over and error handling, with scripted query answers; the client against real
Prometheus answers (success, bad query, scalar) and a server that is not Prometheus."""

from __future__ import annotations

import argparse
import asyncio
import time

import pytest

from flywheel.monitor import (
    HealthMonitor,
    MonitorSettings,
    OperatorMetrics,
    PrometheusClient,
    PrometheusError,
    Sample,
    add_monitor_arguments,
    queries,
    settings_from_args,
)
from tests.builders import watched_job
from tests.fakes.dcgm_exporter import FakeGpus
from tests.monitoring.prometheus_server import ChildProcess, PrometheusServer
from tests.monitoring.recording import RecordingActions, StaticInventory

NS = "ml"
JOB = watched_job(first=60)  # train: 2 workers, progressTimeoutSeconds 10, firstStepTimeoutSeconds 60
NOW = 10_000.0


class ScriptedQuerier:
    """Answers by query kind; an exception instance is raised instead."""

    def __init__(self, progress, step_times, xids, final_saves=(), starts=()):
        saves = final_saves if isinstance(final_saves, Exception) else list(final_saves)
        self.answers = {"final_save": saves, "train_started": starts, "last_step": progress,
                        "step_seconds": step_times, "XID": xids}

    async def query(self, promql: str) -> list[Sample]:
        for marker, answer in self.answers.items():
            if marker in promql:
                if isinstance(answer, Exception):
                    raise answer
                return answer
        raise AssertionError(promql)


def rank_sample(replica: int, value: float) -> Sample:
    return Sample({"namespace": NS, "job": "train", "replica": str(replica), "rank": str(replica)}, value, NOW)


def xid_sample(node: str, code: int, pod: str | None = None) -> Sample:
    labels = {"Hostname": node, "gpu": "0", "UUID": f"GPU-{node}", "err_code": str(code)}
    if pod:
        labels |= {"exported_pod": pod, "exported_namespace": NS, "pod": "dcgm", "namespace": "gpu-operator"}
    return Sample(labels, float(code), NOW)


def monitor(querier, actions: RecordingActions, metrics: OperatorMetrics) -> HealthMonitor:
    return HealthMonitor(MonitorSettings(interval_seconds=0.05), StaticInventory([JOB]), actions, metrics,
                         querier=querier, clock=lambda: NOW)


def value(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_hand_over_and_metering() -> None:
    querier = ScriptedQuerier([rank_sample(0, NOW - 100), rank_sample(1, NOW)],
                              [rank_sample(0, 1.0), rank_sample(1, 1.0)], [xid_sample("node-1", 0, "train-worker-1")])
    actions, metrics = RecordingActions(), OperatorMetrics()
    m = monitor(querier, actions, metrics)
    asyncio.run(m.evaluate_once())
    querier.answers["XID"] = [xid_sample("node-1", 79, "train-worker-1")]
    asyncio.run(m.evaluate_once())
    assert [a for _, a, _ in actions.calls] == ["mark_hung", "cordon_node", "replace_pods"]
    assert value(metrics, "flywheel_monitor_decisions_total", decision="mark_hung") == 1
    assert value(metrics, "flywheel_monitor_evaluations_total") == 2
    assert value(metrics, "flywheel_job_straggler_ranks", job="train", namespace=NS) == 0
    assert value(metrics, "flywheel_operator_time_to_detect_seconds_count", reason="Hang") == 1


def test_failed_hand_over_is_metered_and_retried() -> None:
    querier = ScriptedQuerier([rank_sample(0, NOW - 100)], [], [])
    actions, metrics = RecordingActions(fail={"mark_hung"}), OperatorMetrics()
    m = monitor(querier, actions, metrics)
    asyncio.run(m.evaluate_once())
    asyncio.run(m.evaluate_once())
    assert len(actions.named("mark_hung")) == 2  # forgotten after the failure, so reported again
    assert value(metrics, "flywheel_monitor_action_errors_total", action="mark_hung") == 2
    actions.fail.clear()
    asyncio.run(m.evaluate_once())
    asyncio.run(m.evaluate_once())
    assert len(actions.named("mark_hung")) == 3  # handed over once it worked, then not again


def test_one_failed_query_skips_only_its_check() -> None:
    querier = ScriptedQuerier(PrometheusError("timeout", "slow"), [], [xid_sample("node-0", 0)])
    actions, metrics = RecordingActions(), OperatorMetrics()
    m = monitor(querier, actions, metrics)
    asyncio.run(m.evaluate_once())
    querier.answers["XID"] = [xid_sample("node-0", 48)]
    asyncio.run(m.evaluate_once())
    assert [a for _, a, _ in actions.calls] == ["cordon_node", "replace_pods"]
    assert value(metrics, "flywheel_monitor_query_errors_total", query="progress", reason="timeout") == 2
    assert value(metrics, "flywheel_monitor_query_errors_total", query="xids", reason="timeout") == 0


def test_without_the_final_saves_answer_there_is_no_hang_check() -> None:
    # A rank in its final save looks idle by its progress alone: no verdict without knowing whether it saves.
    querier = ScriptedQuerier([rank_sample(0, NOW - 100), rank_sample(1, NOW - 100)], [], [],
                              final_saves=PrometheusError("timeout", "slow"))
    actions, metrics = RecordingActions(), OperatorMetrics()
    asyncio.run(monitor(querier, actions, metrics).evaluate_once())
    assert actions.calls == []
    assert value(metrics, "flywheel_monitor_query_errors_total", query="final_saves", reason="timeout") == 1
    # Both in their final save: paused for firstStepTimeoutSeconds (60 s here).
    querier.answers["final_save"] = [rank_sample(0, NOW - 30), rank_sample(1, NOW - 30)]
    asyncio.run(monitor(querier, actions, metrics).evaluate_once())
    assert actions.calls == []


def test_run_survives_a_broken_inventory_and_stops_promptly() -> None:
    class BrokenInventory:
        calls = 0

        async def jobs(self):
            BrokenInventory.calls += 1
            raise RuntimeError("cache not ready")

    metrics = OperatorMetrics()
    m = HealthMonitor(MonitorSettings(interval_seconds=0.05), BrokenInventory(), RecordingActions(), metrics,
                      querier=ScriptedQuerier([], [], []))

    async def scenario() -> float:
        stop = asyncio.Event()
        task = asyncio.create_task(m.run(stop))
        await asyncio.sleep(0.3)
        stop.set()
        began = time.monotonic()
        await task
        return time.monotonic() - began

    assert asyncio.run(scenario()) < 0.2
    assert BrokenInventory.calls >= 3


def test_no_cordon_setting_skips_cordon_but_replaces() -> None:
    parser = argparse.ArgumentParser()
    add_monitor_arguments(parser)
    args = parser.parse_args(["--prometheus-url", "http://p:9090", "--no-cordon", "--health-interval", "2",
                              "--scrape-interval", "30"])
    s = settings_from_args(args)
    assert (s.prometheus_url, s.interval_seconds, s.health.cordon_nodes, s.health.staleness_allowance_seconds) == (
        "http://p:9090", 2.0, False, 30.0)
    assert args.health_monitor is True and parser.parse_args(["--no-health-monitor"]).health_monitor is False
    with pytest.raises(ValueError):
        settings_from_args(parser.parse_args(["--health-interval", "0"]))
    actions = RecordingActions()
    m = HealthMonitor(s, StaticInventory([JOB]), actions, OperatorMetrics(),
                      querier=ScriptedQuerier([], [], [xid_sample("node-0", 79)]), clock=lambda: NOW)
    asyncio.run(m.evaluate_once())
    assert [a for _, a, _ in actions.calls] == ["replace_pods"]


def test_xid_parsing_prefers_exported_labels_and_accepts_variants() -> None:
    parsed = queries.parse_xids([
        xid_sample("node-a", 79, "train-worker-0"),
        Sample({"hostname": "node-b", "gpu": "1", "err_code": "13", "pod": "p", "namespace": "n"}, 13, NOW),
        Sample({"Hostname": "node-c", "gpu": "2"}, 31.0, NOW),  # old exporter: the code is only the value
        Sample({"gpu": "3", "err_code": "79"}, 79, NOW),  # no node: ignored
    ])
    assert [(x.node, x.gpu, x.code, x.pod, x.namespace) for x in parsed] == [
        ("node-a", "GPU-node-a", 79, "train-worker-0", NS), ("node-b", "1", 13, "p", "n"),
        ("node-c", "2", 31, None, None)]


def test_fake_exporter_exposition_parses_as_prometheus_text() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    gpus = FakeGpus("node-a", 2, {0: (NS, "train-worker-0")})
    gpus.inject(1, 79)
    families = {f.name: f for f in text_string_to_metric_families(gpus.exposition())}
    xids = {s.labels["gpu"]: s for s in families["DCGM_FI_DEV_XID_ERRORS"].samples}
    assert xids["1"].value == 79 and xids["1"].labels["err_code"] == "79" and xids["1"].labels["Hostname"] == "node-a"
    assert xids["0"].labels["pod"] == "train-worker-0" and xids["0"].labels["err_msg"] == "No Error"
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"} <= families.keys()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    server = PrometheusServer(tmp_path_factory.mktemp("prom"), [])
    yield server
    server.stop()


def test_client_against_real_prometheus(prometheus: PrometheusServer) -> None:
    async def scenario() -> None:
        async with PrometheusClient(prometheus.url, timeout_s=2) as client:
            vector = await client.query('label_replace(vector(3), "rank", "1", "", "")')
            assert [(s.labels, s.value) for s in vector] == [({"rank": "1"}, 3.0)]
            assert abs(vector[0].timestamp - time.time()) < 60
            assert [s.value for s in await client.query("scalar(vector(2))")] == [2.0]
            with pytest.raises(PrometheusError) as bad:
                await client.query("sum(")
            assert bad.value.reason == "query"
            with pytest.raises(PrometheusError) as matrix:
                await client.query("vector(1)[1m:]")
            assert matrix.value.reason == "query"

    asyncio.run(scenario())


def test_client_against_something_that_is_not_prometheus() -> None:
    exporter = ChildProcess("tests.fakes.dcgm_exporter", "--hostname", "node-a")
    try:
        async def scenario() -> str:
            async with PrometheusClient(f"http://{exporter.address}", timeout_s=2) as client:
                with pytest.raises(PrometheusError) as err:
                    await client.query("up")
                return err.value.reason

        assert asyncio.run(scenario()) == "http"
    finally:
        exporter.stop()


class NodeMemory:
    """The node annotations, in memory."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, int]] = {}

    async def handled(self, nodes):
        return {n: dict(self.nodes[n]) for n in nodes if n in self.nodes}

    async def remember(self, fault) -> None:
        self.nodes.setdefault(fault.node, {}).update(dict(fault.gpus))


@pytest.mark.parametrize("failing", ["replace_pods", "cordon_node"])
def test_a_failed_fatal_xid_action_is_not_remembered_and_is_tried_again(failing: str) -> None:
    querier = ScriptedQuerier([], [], [xid_sample("node-0", 79)])
    actions, metrics, memory = RecordingActions(fail={failing}), OperatorMetrics(), NodeMemory()

    def fresh() -> HealthMonitor:  # an operator (re)started
        return HealthMonitor(MonitorSettings(interval_seconds=0.05), StaticInventory([JOB]), actions, metrics,
                             querier=querier, clock=lambda: NOW, xid_memory=memory)
    m = fresh()
    asyncio.run(m.evaluate_once())
    asyncio.run(m.evaluate_once())
    assert len(actions.named("replace_pods")) == 2 and memory.nodes == {}  # every evaluation, never remembered
    asyncio.run(fresh().evaluate_once())  # nor skipped after a restart
    assert len(actions.named("replace_pods")) == 3
    actions.fail.clear()
    asyncio.run(m.evaluate_once())
    asyncio.run(m.evaluate_once())
    asyncio.run(fresh().evaluate_once())
    assert len(actions.named("replace_pods")) == 4 and memory.nodes == {"node-0": {"GPU-node-0": 79}}
