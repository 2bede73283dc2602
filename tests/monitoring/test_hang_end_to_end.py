"""The health monitor's paths end to end: the test cluster runs the embedded trainer as pods, a real Prometheus
scrapes the trainer's /metrics (and a fake dcgm-exporter's, with the real metric names and labels), and
`flywheel operator --prometheus-url` runs the health monitor.

The job has one rank, and the test SIGSTOPs it mid-run: no in-process timer can see that hang (the rank's own
progress watchdog is frozen with it, and there is no peer whose collective could time out), so only the monitor
can. It must mark the job Hung within progressTimeoutSeconds + 2 scrape intervals of the SIGSTOP; the operator
then restarts the job (the stopped pod is deleted with a short grace) and the job completes from its checkpoint.
(With several ranks, the peers' collective timeout at 0.8 x progressTimeoutSeconds usually acts first:
tests/local and bench/hang_recovery.py cover that path.)

XIDs: >= 100 ignored XIDs on the job's node change nothing; a fatal one cordons the node and replaces the pod within
one scrape interval + 10 s; once the node is uncordoned the replacement runs and the job completes.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client, config

from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION
from tests.cluster.fixtures import start_cluster
from tests.monitoring.prometheus_server import PROMETHEUS_BINARY, ChildProcess, PrometheusServer, ScrapeJob, free_port
from tests.operator.conftest import CRD, IDLE_STEP_S, KUBECTL, OpEnv, OperatorProcess, eventually
from tests.rank_processes import alive, trainer_ranks

pytestmark = pytest.mark.slow

PROGRESS_TIMEOUT = 5.0
SCRAPE_INTERVAL = 1.0
NODE = "node-1"  # the test cluster's only node here
XID_JOB = "xid"


@pytest.fixture(scope="module")
def hang_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OpEnv, PrometheusServer, ChildProcess]]:
    if not KUBECTL.exists() or not Path(PROMETHEUS_BINARY).exists():
        pytest.skip("real kubectl or prometheus missing: run scripts/install-tools.sh")
    tmp = tmp_path_factory.mktemp("hang-e2e")
    cluster = start_cluster(tmp / "cluster", nodes=1, etcd=True, heartbeat_seconds=0.5)
    metrics_port = free_port()  # the one worker (index 0) serves its metrics on this port of the host
    # GPU 0 of the node is used by the XID test's pod (dcgm-exporter's pod mapping); the exporter pod's own
    # namespace/pod are target labels, so Prometheus keeps the user's as exported_namespace/exported_pod.
    dcgm = ChildProcess("tests.fakes.dcgm_exporter", "--hostname", NODE, "--gpus", "2",
                        "--pod", f"0=default/{XID_JOB}-worker-0")
    prom = PrometheusServer(tmp / "prometheus", [
        ScrapeJob("trainers", [f"127.0.0.1:{metrics_port}"], honor_labels=True),
        ScrapeJob("dcgm", [dcgm.address], {"namespace": "gpu-operator", "pod": "nvidia-dcgm-exporter"})],
        scrape_interval="1s")
    events_dir = tmp / "events"
    events_dir.mkdir()
    operator = OperatorProcess(cluster, events_dir, tmp / "operator.log")
    operator.monitor_args = ["--prometheus-url", prom.url, "--health-interval", "0.25",
                             "--scrape-interval", str(SCRAPE_INTERVAL)]
    # The Prometheus path is what this test proves: the etcd-progress hang detection (on by default) is off.
    operator.extra_args = ["--metrics-port-base", str(metrics_port), "--no-hang-detection"]
    env = OpEnv(cluster, operator, events_dir, tmp)
    try:
        for claim in ("flywheel-ckpt", "flywheel-events"):  # the example's and the events': bound at once
            cluster.add_claim(claim)
        env.kubectl("apply", "-f", str(CRD))
        cluster.wait_established("trainingjobs.flywheel.dev")
        operator.start()
        yield env, prom, dcgm
    finally:
        operator.stop()
        prom.stop()
        dcgm.stop()
        cluster.stop()


def test_sigstopped_rank_is_hung_then_restarted_and_completes(hang_env) -> None:
    env, prom, _ = hang_env
    name = "frozen"
    env.kubectl("apply", "-f", str(env.job_yaml(name, **{
        "replicas": {"min": 1, "max": 1}, "trainer.training.steps": 400, "checkpoint.everySteps": 50,
        "faultTolerance.progressTimeoutSeconds": PROGRESS_TIMEOUT})))
    custom = client.CustomObjectsApi(config.new_client_from_config(config_file=str(env.cluster.kubeconfig)))

    def status() -> dict:
        return custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, name).get("status") or {}

    try:
        # Stop the rank once Prometheus has seen it step (a rank never seen stepping is still within its start-up
        # allowance, firstStepTimeoutSeconds) and a checkpoint exists, with steps still to go.
        eventually(lambda: env.last_step(name) >= 50, 180, f"{name} to reach step 50")
        eventually(lambda: prom_saw_a_step(prom, name), 30, "a step of the trainer in Prometheus", interval=0.1)
        agent = env.cluster.kubelet.pid_of("default", f"{name}-worker-0")
        assert agent is not None
        [rank] = trainer_ranks(agent)
        os.kill(rank, signal.SIGSTOP)
        stopped, stopped_step = time.monotonic(), env.last_step(name)

        def hung_seen() -> bool:
            s = status()
            hung = any(c["type"] == "Hung" and c["status"] == "True" for c in s.get("conditions", []))
            return hung or s.get("lastRestartReason") == "Hung"

        try:
            eventually(hung_seen, 60, "the Hung condition (or the restart it caused)", interval=0.1)
        except AssertionError:
            print(status(), env.operator.metrics(), (env.tmp / "operator.log").read_text()[-3000:], sep="\n")
            raise
        detect = time.monotonic() - stopped
        budget = PROGRESS_TIMEOUT + 2 * SCRAPE_INTERVAL
        print(f"hung detected {detect:.2f}s after SIGSTOP at step {stopped_step} (budget {budget:.1f}s)")
        assert detect <= budget

        eventually(lambda: env.last_step(name) > stopped_step, 120, "a step after the restart")
        resumed = time.monotonic() - stopped
        print(f"first step after recovery {resumed:.2f}s after SIGSTOP ({resumed - detect:.2f}s after detection)")
        final = env.wait_phase(name, "Succeeded", 240)
        assert final["restarts"] == 1 and final["lastRestartReason"] == "Hung", final
        assert next(c for c in final["conditions"] if c["type"] == "Hung")["status"] == "False"
        reasons = [e["reason"] for e in env.events_of(name)]
        assert "ProgressStalled" in reasons and "Restarting" in reasons
        assert env.operator.metrics().count('flywheel_monitor_decisions_total{decision="mark_hung"} 1.0') == 1
        assert not trainer_ranks(agent) and not alive(rank)  # the stopped rank did not outlive its pod
    finally:
        env.delete(name)


def prom_saw_a_step(prom: PrometheusServer, job: str) -> bool:
    query = urllib.parse.quote(f'flywheel_train_last_step_timestamp_seconds{{job="{job}"}}')
    with urllib.request.urlopen(f"{prom.url}/api/v1/query?query={query}", timeout=5) as resp:
        return any(float(r["value"][1]) > 0 for r in json.load(resp)["data"]["result"])


def post(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=5).read()


def test_fatal_xid_cordons_and_replaces_and_ignored_xids_do_nothing(hang_env) -> None:
    env, prom, dcgm = hang_env
    name = XID_JOB
    env.kubectl("apply", "-f", str(env.job_yaml(name, step_delay_s=IDLE_STEP_S, **{
        "replicas": {"min": 1, "max": 1}, "trainer.training.steps": 20000, "checkpoint.everySteps": 20})))

    def pod_uid() -> str | None:
        pods = [p for p in env.pods(name) if not p["metadata"].get("deletionTimestamp")]
        return pods[0]["metadata"]["uid"] if pods else None

    def cordoned() -> bool:
        node = json.loads(env.kubectl("get", "node", NODE, "-o", "json").stdout)
        return bool(node.get("spec", {}).get("unschedulable"))

    try:
        eventually(lambda: env.last_step(name) >= 20, 180, f"{name} to train")
        first = pod_uid()
        time.sleep(2 * SCRAPE_INTERVAL)  # the monitor's first XID answer is its baseline
        for i in range(110):  # ignored XIDs (63: row remap pending, 92: high single-bit ECC), several per scrape
            post(f"http://{dcgm.address}/xid?gpu={i % 2}&code={(63, 92)[i % 2]}")
            time.sleep(0.03)
        time.sleep(2 * SCRAPE_INTERVAL + 1)
        assert not cordoned() and pod_uid() == first and env.status(name).get("phase") == "Running"

        post(f"http://{dcgm.address}/xid?gpu=0&code=79")  # fallen off the bus
        injected = time.monotonic()
        eventually(lambda: cordoned() and pod_uid() not in (None, first), SCRAPE_INTERVAL + 10,
                   "cordon + a replacement pod", interval=0.2)
        print(f"fatal XID -> cordon + replacement in {time.monotonic() - injected:.2f}s "
              f"(budget {SCRAPE_INTERVAL + 10:.0f}s)")
        eventually(lambda: "GPUFatalXid" in {e["reason"] for e in env.events_of(name)}, 10, "the GPUFatalXid event")
        # The only node is cordoned: the replacement waits until it is uncordoned, then resumes training from the
        # last checkpoint (the job is long: it is deleted once that is shown).
        time.sleep(1)
        assert env.pods(name)[0]["status"].get("phase") == "Pending"
        env.kubectl("uncordon", NODE)
        eventually(lambda: any(r["event"] == "start" and r.get("resumed_from") for r in env.records(name)), 120,
                   "the replacement to resume from the checkpoint")
        eventually(lambda: env.status(name).get("phase") == "Running", 60, "Running again")
        assert env.operator.metrics().count('flywheel_monitor_decisions_total{decision="cordon_node"} 1.0') == 1
    finally:
        env.kubectl("uncordon", NODE, check=False)
        env.delete(name)
