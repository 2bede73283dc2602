"""The health monitor inside the operator process: `flywheel operator --prometheus-url <fake>` sees a job whose
rank stopped stepping, marks it Hung, and its reconcile pass restarts the job (counted as a Hang)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.cluster.fixtures import start_cluster
from tests.fakes.prometheus_api import FakePrometheus
from tests.operator.conftest import CRD, KUBECTL, OpEnv, OperatorProcess, eventually


@pytest.fixture(scope="module")
def health_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OpEnv, FakePrometheus]]:
    if not KUBECTL.exists():
        pytest.skip("real kubectl missing: run scripts/install-tools.sh")
    tmp = tmp_path_factory.mktemp("health-operator")
    cluster = start_cluster(tmp / "cluster", nodes=2, etcd=True, node_monitor_grace_seconds=3.0, heartbeat_seconds=0.5)
    for claim in ("flywheel-ckpt", "flywheel-events"):  # the example's and the events' (kube-scheduler waits for them)
        cluster.add_claim(claim)
    prom = FakePrometheus()
    events_dir = tmp / "events"
    events_dir.mkdir()
    operator = OperatorProcess(cluster, events_dir, tmp / "operator.log")
    operator.monitor_args = ["--prometheus-url", prom.url, "--health-interval", "0.3", "--scrape-interval", "0.5"]
    env = OpEnv(cluster, operator, events_dir, tmp)
    try:
        env.kubectl("apply", "-f", str(CRD))
        cluster.wait_established("trainingjobs.flywheel.dev")
        operator.start()
        yield env, prom
    finally:
        operator.stop()
        prom.stop()
        cluster.stop()


def test_operator_marks_a_stalled_job_hung_and_restarts_it(health_env: tuple[OpEnv, FakePrometheus]) -> None:
    env, prom = health_env
    name = "stall"
    env.kubectl("apply", "-f", str(env.job_yaml(name, **{"faultTolerance.progressTimeoutSeconds": 2})))
    try:
        env.wait_phase(name, "Running", 60)
        # Both ranks "stepped" once just now (after their pods started), then never again.
        last = time.time()
        prom.set("last_step", [({"namespace": "default", "job": name, "replica": str(i), "rank": str(i)}, last)
                               for i in range(2)])
        status = eventually(lambda: (s := env.status(name)).get("lastRestartReason") == "Hung" and s, 30,
                            "a restart for the hang")
        detected = time.time()
        assert status["restarts"] == 1
        hung = next(c for c in status["conditions"] if c["type"] == "Hung")
        assert hung["reason"] == "RestartedAfterHang" and "no training step" in hung["message"]
        # Events follow the status write (side effects only after it succeeds): wait for them, not just the status.
        eventually(lambda: {"ProgressStalled", "Restarting"} <= {e["reason"] for e in env.events_of(name)}, 10,
                   "the ProgressStalled and Restarting events")
        assert detected - last < 20  # detected within progressTimeoutSeconds + a few evaluations
        metrics = env.operator.metrics()
        assert "flywheel_monitor_evaluations_total" in metrics
        assert 'flywheel_monitor_decisions_total{decision="mark_hung"} 1.0' in metrics
    finally:
        env.delete(name)
