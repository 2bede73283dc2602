"""The health monitor against a real Prometheus scraping real processes (1 s scrape interval).

(a) a rank stops (SIGSTOP) -> Hung within progressTimeoutSeconds + 2 scrape intervals;
(b) fake dcgm-exporter: >= 100 non-fatal/ignored XIDs -> no drain; a fatal XID on a node hosting a job pod ->
    cordon + replace within one scrape interval + 10 s;
(c) Prometheus unreachable or not answering -> logged, metered, the loop goes on.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import urllib.request
from pathlib import Path

import pytest

from flywheel.monitor import HealthMonitor, MonitorSettings, OperatorMetrics, PrometheusClient
from flywheel.policy.health_checks import HealthSettings, WatchedJob
from flywheel.policy.xid import WatchedPod
from tests.monitoring.prometheus_server import ChildProcess, PrometheusServer, ScrapeJob
from tests.monitoring.recording import RecordingActions, StaticInventory

SCRAPE_INTERVAL = 1.0
NS = "ml"


def job_view(pods: list[tuple[str, str]], timeout: float = 3.0) -> WatchedJob:
    started = time.time()
    return WatchedJob(NS, "train", "Running", timeout, 60.0,
                   tuple(WatchedPod(name, NS, "train", str(i), node, "Running", started)
                         for i, (name, node) in enumerate(pods)))


def settings(url: str, interval: float = 0.5) -> MonitorSettings:
    return MonitorSettings(prometheus_url=url, interval_seconds=interval, query_timeout_seconds=2.0,
                           health=HealthSettings(staleness_allowance_seconds=SCRAPE_INTERVAL))


async def wait_until(predicate, timeout: float, poll: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(poll)
    return predicate()


async def series_count(client: PrometheusClient, promql: str) -> int:
    return len(await client.query(promql))


@pytest.fixture
def children():
    started: list[ChildProcess] = []
    yield started
    for child in started:
        child.stop()


@pytest.fixture
def servers():
    started: list[PrometheusServer] = []
    yield started
    for server in started:
        server.stop()


@pytest.mark.slow
def test_stopped_rank_is_hung_within_timeout_plus_two_scrapes(tmp_path: Path, children, servers) -> None:
    ranks = [ChildProcess("tests.monitoring.progress_exporter", "--job", "train", "--namespace", NS,
                          "--replica", str(i), "--rank", str(i)) for i in range(2)]
    children.extend(ranks)
    prom = PrometheusServer(tmp_path, [ScrapeJob("trainers", [r.address for r in ranks], honor_labels=True)])
    servers.append(prom)
    view = job_view([("train-worker-0", "node-a"), ("train-worker-1", "node-b")], timeout=3.0)
    actions = RecordingActions()
    metrics = OperatorMetrics()

    async def scenario() -> float:
        async with PrometheusClient(prom.url) as client:
            assert await wait_until_async(lambda: series_count(client, "flywheel_train_last_step_timestamp_seconds"),
                                          2, timeout=15)
        monitor = HealthMonitor(settings(prom.url), StaticInventory([view]), actions, metrics)
        stop = asyncio.Event()
        task = asyncio.create_task(monitor.run(stop))
        await asyncio.sleep(3.5)  # healthy ranks: longer than the timeout, and no verdict
        assert actions.calls == []
        ranks[1].pause()
        paused = time.monotonic()
        await wait_until(lambda: actions.named("mark_hung"), timeout=15)
        stop.set()
        await task
        return actions.named("mark_hung")[0][0] - paused

    detect = asyncio.run(scenario())
    hung = actions.named("mark_hung")
    assert len(hung) == 1, actions.calls
    finding = hung[0][1]
    assert [(r.replica, r.rank) for r in finding.ranks] == [("1", "1")]
    print(f"hang detected {detect:.2f}s after SIGSTOP (budget {3.0 + 2 * SCRAPE_INTERVAL:.1f}s)")
    assert detect <= 3.0 + 2 * SCRAPE_INTERVAL
    assert metrics.registry.get_sample_value("flywheel_operator_time_to_detect_seconds_sum", {"reason": "Hang"}) >= 3.0


async def wait_until_async(count, expected: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await count() >= expected:
            return True
        await asyncio.sleep(0.2)
    return False


def post(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=5).read()


@pytest.mark.slow
def test_xids_from_fake_dcgm_exporter(tmp_path: Path, children, servers) -> None:
    node_a = ChildProcess("tests.fakes.dcgm_exporter", "--hostname", "node-a", "--gpus", "2",
                          "--pod", f"0={NS}/train-worker-0")
    node_b = ChildProcess("tests.fakes.dcgm_exporter", "--hostname", "node-b", "--gpus", "2",
                          "--pod", f"0={NS}/train-worker-1")
    children.extend([node_a, node_b])
    # The exporter pod's own namespace/pod as target labels, as Kubernetes service discovery adds them: Prometheus
    # then stores the GPU user's labels as exported_namespace/exported_pod, like on a real cluster.
    prom = PrometheusServer(tmp_path, [
        ScrapeJob("dcgm-a", [node_a.address], {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-a"}),
        ScrapeJob("dcgm-b", [node_b.address], {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter-b"})])
    servers.append(prom)
    view = job_view([("train-worker-0", "node-a"), ("train-worker-1", "node-b")])
    actions = RecordingActions()

    async def scenario() -> tuple[float, int]:
        async with PrometheusClient(prom.url) as client:
            assert await wait_until_async(lambda: series_count(client, 'DCGM_FI_DEV_XID_ERRORS{exported_pod!=""}'),
                                          2, timeout=15)
        monitor = HealthMonitor(settings(prom.url), StaticInventory([view]), actions, OperatorMetrics())
        stop = asyncio.Event()
        task = asyncio.create_task(monitor.run(stop))
        await asyncio.sleep(1.0)  # the first evaluation is the XID baseline
        codes = [13, 31, 43, 45, 94, 63, 92]
        injected = 0
        for i in range(105):  # spread over several scrapes so Prometheus sees many of them change
            await asyncio.to_thread(post, f"http://{node_b.address}/xid?gpu={i % 2}&code={codes[i % len(codes)]}")
            injected += 1
            await asyncio.sleep(0.06)
        await asyncio.sleep(2 * SCRAPE_INTERVAL + 1)
        assert not actions.named("cordon_node") and not actions.named("replace_pods"), actions.calls
        await asyncio.to_thread(post, f"http://{node_a.address}/xid?gpu=0&code=79")
        injected_at = time.monotonic()
        await wait_until(lambda: actions.named("replace_pods"), timeout=SCRAPE_INTERVAL + 12)
        stop.set()
        await task
        return actions.named("replace_pods")[0][0] - injected_at, injected

    delay, injected = asyncio.run(scenario())
    assert injected >= 100
    assert [d for _, d in actions.named("cordon_node")] == ["node-a"]
    assert [d for _, d in actions.named("replace_pods")] == [("train-worker-0",)]
    # App-level XIDs restart the affected ranks, once per cooldown however many arrive.
    assert [d for _, d in actions.named("restart_ranks")] == [("train-worker-1",)]
    cordoned_at = actions.named("cordon_node")[0][0]
    assert cordoned_at <= actions.named("replace_pods")[0][0]  # cordon first: replacements must land elsewhere
    print(f"fatal XID -> cordon + replace in {delay:.2f}s (budget {SCRAPE_INTERVAL + 10:.0f}s)")
    assert delay <= SCRAPE_INTERVAL + 10


def test_unreachable_and_unresponsive_prometheus_are_metered_and_survived(caplog) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)  # accepts connections (backlog) but never answers: a hung Prometheus
    view = job_view([("train-worker-0", "node-a")])
    try:
        for sock, reason in ((closed, "connection"), (silent, "timeout")):
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            metrics = OperatorMetrics()
            s = MonitorSettings(prometheus_url=url, interval_seconds=0.2, query_timeout_seconds=0.3)
            monitor = HealthMonitor(s, StaticInventory([view]), RecordingActions(), metrics)

            async def run_for(seconds: float) -> None:
                stop = asyncio.Event()
                task = asyncio.create_task(monitor.run(stop))
                await asyncio.sleep(seconds)
                stop.set()
                await task

            with caplog.at_level(logging.WARNING, logger="flywheel.monitor.health_loop"):
                asyncio.run(run_for(1.2))
            evaluations = metrics.registry.get_sample_value("flywheel_monitor_evaluations_total")
            assert evaluations >= 2, reason
            for query in ("progress", "step_times", "xids"):
                assert metrics.registry.get_sample_value("flywheel_monitor_query_errors_total",
                                                         {"query": query, "reason": reason}) == evaluations
            assert any(f"query failed ({reason})" in r.getMessage() for r in caplog.records)
            caplog.clear()
    finally:
        closed.close()
        silent.close()
