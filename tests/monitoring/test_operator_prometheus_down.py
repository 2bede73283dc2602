"""Prometheus unreachable: the operator process keeps reconciling. `flywheel operator --prometheus-url
http://127.0.0.1:1` (nothing listens there) runs a tiny job to Succeeded while its health monitor's queries fail,
each failure logged and counted in the operator's own metrics (flywheel_monitor_query_errors_total, reason
"connection"), and the evaluations go on."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from tests.cluster.fixtures import start_cluster
from tests.operator.conftest import KUBECTL, OpEnv, OperatorProcess, eventually, operator_running

pytestmark = pytest.mark.slow

UNREACHABLE = "http://127.0.0.1:1"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpEnv]:
    if not KUBECTL.exists():
        pytest.skip("real kubectl missing: run scripts/install-tools.sh")
    tmp = tmp_path_factory.mktemp("prometheus-down")
    # No node is lost here: a long node grace keeps a slow heartbeat on a loaded machine from looking like one.
    cluster = start_cluster(tmp / "cluster", nodes=2, etcd=True, node_monitor_grace_seconds=30.0,
                            heartbeat_seconds=0.5)
    events_dir = tmp / "events"
    events_dir.mkdir()
    operator = OperatorProcess(cluster, events_dir, tmp / "operator.log")
    operator.monitor_args = ["--prometheus-url", UNREACHABLE, "--health-interval", "0.5", "--prometheus-timeout", "1"]
    for claim in ("flywheel-ckpt", "flywheel-events"):  # the example's and the events': bound at once
        cluster.add_claim(claim)
    with operator_running(cluster, operator):
        yield OpEnv(cluster, operator, events_dir, tmp)


def counter(metrics: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in metrics.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_operator_reconciles_a_job_to_succeeded_while_prometheus_is_unreachable(env: OpEnv) -> None:
    name = "prom-down"
    env.kubectl("apply", "-f", str(env.job_yaml(name)))
    status = env.wait_phase(name, "Succeeded", 180)
    assert status["step"] == 30 and status["restarts"] == 0
    metrics = eventually(lambda: (m := env.operator.metrics()) and
                         counter(m, "flywheel_monitor_evaluations_total") >= 3 and m, 30, "monitor evaluations")
    for query in ("progress", "step_times", "xids"):
        assert counter(metrics, "flywheel_monitor_query_errors_total", query=query, reason="connection") >= 3, query
    assert counter(metrics, "flywheel_monitor_decisions_total") == 0  # no data, no decisions
    assert re.search(r'flywheel_job_phase\{[^}]*job="prom-down"[^}]*phase="Succeeded"[^}]*\} 1\.0', metrics)
    log = env.operator.log_path.read_text()
    assert f"querying {UNREACHABLE}" in log and "query failed (connection)" in log
    assert env.operator.proc is not None and env.operator.proc.poll() is None
