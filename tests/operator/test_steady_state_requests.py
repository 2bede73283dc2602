"""The operator at steady state reads its watch-fed caches, not the API: with jobs Running and nothing changing,
the API server's audit log (tests/cluster/audit.py) shows no LIST and no GET of pods, nodes, Services or
TrainingJobs from the operator in a 10 s window (its watches stay open), and ~0 requests per job-minute. The operator
runs as a ServiceAccount of its own (bound to cluster-admin: what it may do is the chart tests' matter), so the log
tells its requests from the test's and the control plane's. The health monitor is on (a
fake Prometheus) and reads the same caches. After the window a deleted pod is still replaced from the caches.

The jobs (one pod each, to spare a loaded machine) hold Running without burning the CPU: the rank stops itself at
step 30 (an injected `hang` fault) and hang detection is off for them (`progressTimeoutSeconds: 0`, a long
`firstStepTimeoutSeconds` for a slow start on a loaded machine), so neither a status nor a pod changes while the
window records. No status write of a new job loses a race against kopf's own first patches.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from flywheel.contracts.labels import INDEX_LABEL
from tests.cluster.audit import Attributes, describe, service_account
from tests.cluster.fixtures import start_cluster
from tests.fakes.prometheus_api import FakePrometheus
from tests.operator.conftest import KUBECTL, OpEnv, OperatorProcess, eventually, operator_running

OPERATOR_ACCOUNT = "steady-state-operator"  # in namespace default: the operator's own user in the audit log
JOBS = ("steady-a", "steady-b", "steady-c")
WINDOW_SECONDS = 10.0
HANG_AT_STEP = 30  # late enough for a progress record to reach etcd before the rank stops (~0.1 s a step)
FAULTS = json.dumps([{"id": "stop", "kind": "hang", "rank": 0, "step": HANG_AT_STEP}])
CACHED_KINDS = ("pods", "nodes", "services", "trainingjobs")


@pytest.fixture(scope="module")
def steady_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpEnv]:
    if not KUBECTL.exists():
        pytest.skip("real kubectl missing: run scripts/install-tools.sh")
    tmp = tmp_path_factory.mktemp("steady-state")
    cluster = start_cluster(tmp / "cluster", nodes=2, etcd=True, heartbeat_seconds=0.5)
    cluster.add_claim("flywheel-ckpt")  # the example's checkpoint claim
    who = service_account(cluster.control_plane.request, "default", OPERATOR_ACCOUNT, cluster_role="cluster-admin")
    prom = FakePrometheus()  # answers no series: the monitor evaluates every 0.5 s and finds nothing
    kubeconfig = yaml.safe_load(cluster.kubeconfig.read_text())
    for user in kubeconfig["users"]:
        user["user"] = {"token": who.token}
    (tmp / "kubeconfig-operator").write_text(yaml.safe_dump(kubeconfig))
    operator = OperatorProcess(cluster, None, tmp / "operator.log")  # the chart's default: no events volume
    operator.monitor_args = ["--prometheus-url", prom.url, "--health-interval", "0.5", "--scrape-interval", "0.5"]
    operator.extra_args = ["--kubeconfig", str(tmp / "kubeconfig-operator"),  # the last --kubeconfig wins
                           "--worker-env", f"FLYWHEEL_FAULTS={FAULTS}"]
    try:
        with operator_running(cluster, operator):
            yield OpEnv(cluster, operator, tmp / "events", tmp)
    finally:
        prom.stop()


def _stopped_at_the_fault(env: OpEnv) -> bool:
    statuses = [env.status(name) for name in JOBS]
    return all(s.get("phase") == "Running" and s.get("step", 0) >= 1 for s in statuses)


def _settled(env: OpEnv) -> dict[str, Any]:
    """The jobs' statuses once two reads 2 s apart agree (the last progress has reached them)."""
    def same() -> dict[str, Any] | None:
        before = {name: env.status(name) for name in JOBS}
        time.sleep(2.0)
        after = {name: env.status(name) for name in JOBS}
        return after if after == before else None
    return eventually(same, 60, "the jobs' statuses to settle", interval=0.5)


def test_steady_state_reads_no_api_and_a_deleted_pod_is_still_replaced(steady_env: OpEnv) -> None:
    env = steady_env
    for name in JOBS:
        env.kubectl("apply", "-f", str(env.job_yaml(name, **{
            "replicas.min": 1, "replicas.max": 1, "trainer.training.steps": 400,
            "faultTolerance.progressTimeoutSeconds": 0, "faultTolerance.firstStepTimeoutSeconds": 900})))
    eventually(lambda: _stopped_at_the_fault(env), 300, "every job Running and stopped at its fault", interval=1.0)
    statuses = _settled(env)
    # kopf's own patch of each new job (its finalizer) came before the runner's first status write:
    # no write lost a race (409) and had its pass redone (pass_records.kopf_settled).
    log = env.operator.log_path.read_text()
    lost = [line for line in log.splitlines() if "status changed under us" in line]
    assert not lost, lost
    # The wake-up handlers' success lines (one per watch event of every job) are filtered out (QuietWakeups).
    assert "Handler 'pod_deleted' succeeded." not in log and "Handler 'service_changed' succeeded." not in log
    audit, user = env.cluster.control_plane.audit, f"system:serviceaccount:default:{OPERATOR_ACCOUNT}"
    mark = audit.mark()
    time.sleep(WINDOW_SECONDS)  # no kubectl in the window (not that it would count: the operator's user only)
    recorded = audit.since(mark).counted(user)

    lists = [a for a, _ in recorded if a[0] == "list"]
    reads = [a for a, _ in recorded if a[0] == "get" and a[2].split("/")[0] in CACHED_KINDS]
    assert not lists and not reads, f"the operator read the API at steady state: {lists + reads}"
    requests = sum(n for a, n in recorded if a[0] != "watch")  # a watch is one long request
    per_job_minute = requests / len(JOBS) / (WINDOW_SECONDS / 60)
    print(f"steady state: {per_job_minute:.2f} requests per job-minute; recorded {describe(recorded)}")
    assert per_job_minute <= 1.0, f"{per_job_minute:.1f} requests per job-minute at steady state: {recorded}"
    assert {name: env.status(name) for name in JOBS} == statuses  # nothing changed, so nothing was written

    # The caches still carry a change: a pod deleted mid-run is replaced and counted. Its requests are in the log
    # too, to show the window above heard the operator's user (an empty window must not pass for the wrong reason).
    mark = audit.mark()
    (victim,) = [p for p in env.pods("steady-a") if p["metadata"]["labels"][INDEX_LABEL] == "0"]
    env.kubectl("delete", "pod", victim["metadata"]["name"], "--wait=false")
    status = eventually(lambda: (s := env.status("steady-a")).get("restarts", 0) >= 1 and s, 60,
                        "the deleted pod to be counted")
    assert status["lastRestartReason"] == "PodDeleted"
    eventually(lambda: {p["metadata"]["uid"] for p in env.pods("steady-a")} - {victim["metadata"]["uid"]}, 60,
               "a replacement pod")
    replaced: set[Attributes] = audit.since(mark).of(user)
    assert ("create", "", "pods", "default") in replaced, replaced
    for name in JOBS:
        env.delete(name)
