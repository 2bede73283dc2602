"""The tests/operator scenarios on a real cluster (see conftest.py for the settings); skipped without KUBECONFIG."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e_real.conftest import RealCluster, eventually
from tests.integration.test_invalid_jobs import TABLE as INVALID_TABLE
from tests.integration.test_invalid_jobs import document as invalid_document
from tests.integration.test_invalid_jobs import names_field_and_fix
from tests.operator.conftest import node_tainted, worker_node
from tests.operator.test_pod_template_cluster import assert_carries_the_template, template_for

LONG = {"trainer.training.steps": 400, "checkpoint.everySteps": 20}
CRD = Path(__file__).resolve().parents[2] / "crds" / "trainingjobs.flywheel.dev.yaml"


def printed_columns() -> list[str]:
    """The header `kubectl get tj` prints: NAME, then the committed CRD's printer columns of priority 0 (the rest
    only with -o wide), upper-cased."""
    version = yaml.safe_load(CRD.read_text())["spec"]["versions"][0]
    return ["NAME", *(c["name"].upper() for c in version["additionalPrinterColumns"] if not c.get("priority"))]


@pytest.mark.skipif(not os.environ.get("FLYWHEEL_E2E_GPU"), reason="set FLYWHEEL_E2E_GPU=1 on a GPU cluster "
                    "prepared as examples/gpu-cluster.yaml's header says (docs/install.md)")
def test_gpu_example_trains_on_two_gpu_nodes(real: RealCluster, tmp_path: Path) -> None:
    """The first scenario: examples/gpu-cluster.yaml as written (its image, claims, Secret and RDMA resource must
    exist), shortened to 20 steps. Twin of tests/operator/test_gpu_example_cluster.py."""
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "gpu-cluster.yaml").read_text())
    doc["metadata"] = {"name": "e2e-gpu", "namespace": real.namespace}
    doc["spec"]["trainer"]["training"]["steps"] = 20
    doc["spec"]["checkpoint"]["everySteps"] = 10
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(doc))
    real.kubectl("apply", "-f", str(path))
    pods = eventually(lambda: len(p := [x for x in real.pods("e2e-gpu") if x["spec"].get("nodeName")]) == 2 and p,
                      900, "both GPU workers scheduled")
    assert len({p["spec"]["nodeName"] for p in pods}) == 2
    status = real.wait_phase("e2e-gpu", "Succeeded", 3600)
    assert status["step"] == 20 and status["lastCheckpoint"]["step"] == 20


def test_tiny_job_succeeds_with_columns(real: RealCluster, tmp_path: Path) -> None:
    real.apply_job("e2e-tiny", tmp_path)
    status = real.wait_phase("e2e-tiny", "Succeeded", 900)
    assert status["restarts"] == 0 and status["replicas"]["desired"] == 2
    header = real.kubectl("get", "tj", "e2e-tiny").stdout.splitlines()[0].split()
    assert header == printed_columns()
    assert "TrainingSucceeded" in real.kubectl("describe", "tj", "e2e-tiny").stdout


def test_a_new_jobs_first_status_write_does_not_lose_to_kopfs_own_patches(real: RealCluster, tmp_path: Path) -> None:
    """The twin of test_steady_state_requests' log checks: while a new job goes to Succeeded, the operator's log
    shows no lost status race (409) and none of the wake-up handlers' per-event success lines."""
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
    real.apply_job("e2e-first-write", tmp_path)
    real.wait_phase("e2e-first-write", "Succeeded", 900)
    log = real.kubectl("logs", "-l", real.operator_selector, f"--since-time={since}", "--tail=-1",
                       namespace=real.operator_ns).stdout
    assert "status changed under us" not in log
    assert "Handler 'pod_deleted' succeeded." not in log and "Handler 'service_changed' succeeded." not in log


def test_force_deleted_worker_pod_is_replaced(real: RealCluster, tmp_path: Path) -> None:
    real.apply_job("e2e-kill", tmp_path, **LONG)
    eventually(lambda: real.status("e2e-kill").get("step", 0) >= 40, 900, "step 40")
    old = next(p["metadata"]["uid"] for p in real.pods("e2e-kill") if p["metadata"]["name"].endswith("-1"))
    real.kubectl("delete", "pod", "e2e-kill-worker-1", "--grace-period=0", "--force")
    eventually(lambda: any(p["metadata"]["name"].endswith("-1") and p["metadata"]["uid"] != old
                           for p in real.pods("e2e-kill")), 300, "a replacement pod")
    status = real.wait_phase("e2e-kill", "Succeeded", 900)
    assert status["step"] == 400


def test_operator_restarts_do_not_duplicate_pods(real: RealCluster, tmp_path: Path) -> None:
    real.apply_job("e2e-chaos", tmp_path, **{**LONG, "trainer.training.steps": 2000})
    eventually(lambda: len(real.pods("e2e-chaos")) == 2, 600, "the pods")
    uids = {p["metadata"]["uid"] for p in real.pods("e2e-chaos")}
    rng = random.Random(3)
    for _ in range(10):
        real.kubectl("delete", "pod", "-l", real.operator_selector, "--wait=false", namespace=real.operator_ns)
        time.sleep(rng.uniform(2, 8))
        assert {p["metadata"]["uid"] for p in real.pods("e2e-chaos")} == uids
    status = real.wait_phase("e2e-chaos", "Succeeded", 1800)
    assert status["restarts"] == 0


def test_invalid_job_rejected_or_marked(real: RealCluster, tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(f"apiVersion: flywheel.dev/v1alpha1\nkind: TrainingJob\nmetadata: {{name: e2e-bad, namespace: "
                    f"{real.namespace}}}\nspec: {{replicas: {{min: 3, max: 2}}}}\n")
    assert real.kubectl("apply", "-f", str(path), check=False).returncode != 0
    real.apply_job("e2e-preset", tmp_path, **{"trainer.model.preset": "gpt-huge"})
    status = real.wait_phase("e2e-preset", "Failed", 120)
    assert any(c["type"] == "Invalid" and c["status"] == "True" for c in status["conditions"])


def test_scale_and_suspend(real: RealCluster, tmp_path: Path) -> None:
    real.apply_job("e2e-elastic", tmp_path,
                   **{**LONG, "trainer.training.steps": 1000, "replicas": {"min": 1, "max": 2}})
    eventually(lambda: real.status("e2e-elastic").get("step", 0) >= 40, 900, "step 40")
    real.kubectl("scale", "tj", "e2e-elastic", "--replicas", "1")
    eventually(lambda: len(real.pods("e2e-elastic")) == 1, 300, "one worker")
    real.kubectl("patch", "tj", "e2e-elastic", "--type=merge", "-p", '{"spec": {"suspend": true}}')
    real.wait_phase("e2e-elastic", "Suspended", 300)
    real.kubectl("patch", "tj", "e2e-elastic", "--type=merge", "-p", '{"spec": {"suspend": false}}')
    real.kubectl("scale", "tj", "e2e-elastic", "--replicas", "2")
    real.wait_phase("e2e-elastic", "Succeeded", 1800)


# SIGKILLs every rank process of a worker from inside its container (ranks are named fw-rank-<RANK>; the agent is
# PID 1, which a signal from inside its own namespace cannot kill). Only this pod's: the processes with its
# HOSTNAME, which is every process of the container on a cluster and what tells the pods apart where they share a
# PID namespace (the test cluster's process kubelet).
KILL_RANKS = ("import os, signal\n"
              "mine = ('HOSTNAME=' + os.environ['HOSTNAME']).encode()\n"
              "for p in filter(str.isdigit, os.listdir('/proc')):\n"
              "    try:\n"
              "        if open(f'/proc/{p}/comm').read().startswith('fw-rank-') and \\\n"
              "                mine in open(f'/proc/{p}/environ', 'rb').read().split(b'\\0'):\n"
              "            os.kill(int(p), signal.SIGKILL)\n"
              "    except OSError:\n"
              "        pass\n")


def _params_hash(real: RealCluster, name: str) -> str:
    found = re.findall(r"params sha256 ([0-9a-f]{64})", real.kubectl("logs", f"{name}-worker-0").stdout)
    assert found, f"{name}-worker-0's log has no final parameter hash"
    return found[-1]


def test_killed_ranks_recover_to_the_fault_free_parameters(real: RealCluster, tmp_path: Path) -> None:
    real.apply_job("e2e-ref", tmp_path, **LONG)
    real.apply_job("e2e-rankkill", tmp_path, **LONG)
    eventually(lambda: real.status("e2e-rankkill").get("step", 0) >= 40, 900, "step 40")
    real.kubectl("exec", "e2e-rankkill-worker-1", "--", "python", "-c", KILL_RANKS)
    status = real.wait_phase("e2e-rankkill", "Succeeded", 1800)
    assert status["step"] == 400
    # The agent restarted them in place (agent/agent.py), once: the pod kept.
    assert "restarting the ranks in place (1 so far)" in real.kubectl("logs", "e2e-rankkill-worker-1").stdout
    # Counted once as a rank restart in place (tests/operator/test_rank_restart_cluster.py), the pods kept.
    assert status["restarts"] == 1 and status["lastRestartReason"] == "RankRestarted", status
    real.wait_phase("e2e-ref", "Succeeded", 1800)
    assert _params_hash(real, "e2e-rankkill") == _params_hash(real, "e2e-ref")


def test_etcd_member_restart_mid_run_is_survived(real: RealCluster, tmp_path: Path) -> None:
    ns, _, selector = os.environ.get("FLYWHEEL_E2E_ETCD",
                                     f"{real.operator_ns}:app.kubernetes.io/component=etcd").partition(":")
    if not real.kubectl("get", "pods", "-l", selector, "-o", "name", namespace=ns).stdout.strip():
        pytest.skip("no in-cluster etcd (the chart points at an external endpoint)")
    real.apply_job("e2e-etcd", tmp_path, **LONG)
    eventually(lambda: real.status("e2e-etcd").get("step", 0) >= 40, 900, "step 40")
    real.kubectl("delete", "pod", "-l", selector, "--wait=false", namespace=ns)
    status = real.wait_phase("e2e-etcd", "Succeeded", 1800)
    assert status["step"] == 400


@pytest.mark.parametrize("name, changes, field, fix, by_cel", INVALID_TABLE, ids=[row[0] for row in INVALID_TABLE])
def test_invalid_table_is_refused_before_any_pod(real: RealCluster, tmp_path: Path, name: str,
                                                   changes: dict[str, Any], field: str, fix: str,
                                                   by_cel: bool) -> None:
    """tests/integration/test_invalid_jobs.py's table: what CEL decides is refused by the API server; the rest is
    marked Invalid by the operator with no pod created, each naming the field and the fix."""
    doc = invalid_document(f"e2e-inv-{name}", changes)
    doc["metadata"]["namespace"] = real.namespace
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    if by_cel:
        result = real.kubectl("apply", "--dry-run=server", "-f", str(path), check=False)
        assert result.returncode != 0 and names_field_and_fix(result.stderr, field, fix), result.stderr
        return
    job = doc["metadata"]["name"]
    # create, not apply: client-side apply drops a null (model-missing's `preset: null`), and the CRD's default
    # then fills it in -- a valid job; create sends the null, which a nullable field keeps.
    real.kubectl("create", "-f", str(path))
    try:
        status = real.wait_phase(job, "Failed", 120)
        invalid = next(c for c in status["conditions"] if c["type"] == "Invalid")
        assert invalid["status"] == "True" and names_field_and_fix(invalid["message"], field, fix)
        assert real.pods(job) == []
    finally:
        real.kubectl("delete", "tj", job, "--wait=false", check=False)


def test_deleted_headless_service_is_recreated(real: RealCluster, tmp_path: Path) -> None:
    real.apply_job("e2e-svc", tmp_path, **LONG)
    eventually(lambda: real.status("e2e-svc").get("step", 0) >= 10, 900, "step 10")
    real.kubectl("delete", "service", "e2e-svc-workers")
    eventually(lambda: real.kubectl("get", "service", "e2e-svc-workers", check=False).returncode == 0, 60,
               "the Service to come back")
    assert real.wait_phase("e2e-svc", "Succeeded", 900)["step"] == 400


def test_status_fills_from_etcd_progress(real: RealCluster, tmp_path: Path) -> None:
    """The chart's defaults (etcd, no events volume, no Prometheus): step, checkpoint and goodput still fill in."""
    real.apply_job("e2e-progress", tmp_path, **{"trainer.training.steps": 60, "checkpoint.everySteps": 20})
    eventually(lambda: 0 < real.status("e2e-progress").get("step", 0) < 60, 900, "a step between 0 and 60")
    status = real.wait_phase("e2e-progress", "Succeeded", 900)
    assert status["step"] == 60 and status["lastCheckpoint"]["step"] == 60 and status["goodput"]["ratio"] > 0


def test_deleted_pod_is_counted_with_its_reason(real: RealCluster, tmp_path: Path) -> None:
    real.apply_job("e2e-podgone", tmp_path, **LONG)
    eventually(lambda: real.status("e2e-podgone").get("step", 0) >= 40, 900, "step 40")
    real.kubectl("delete", "pod", "e2e-podgone-worker-1", "--wait=false")
    status = eventually(lambda: (s := real.status("e2e-podgone")).get("restarts", 0) >= 1 and s, 300, "a restart")
    assert status["lastRestartReason"] == "PodDeleted"
    assert real.wait_phase("e2e-podgone", "Succeeded", 900)["step"] == 400


def test_force_deleted_pod_is_counted_as_pod_deleted(real: RealCluster, tmp_path: Path) -> None:
    real.apply_job("e2e-podforce", tmp_path, **LONG)
    eventually(lambda: real.status("e2e-podforce").get("step", 0) >= 40, 900, "step 40")
    real.kubectl("delete", "pod", "e2e-podforce-worker-1", "--grace-period=0", "--force")
    status = eventually(lambda: (s := real.status("e2e-podforce")).get("restarts", 0) >= 1 and s, 300, "a restart")
    assert status["lastRestartReason"] == "PodDeleted"
    assert real.wait_phase("e2e-podforce", "Succeeded", 900)["step"] == 400


def test_an_evicted_worker_restarts_without_spending_budget(real: RealCluster, tmp_path: Path) -> None:
    """Twin of test_operator_cluster's `kubectl drain` test, through the Eviction API on the one worker pod (what
    kubectl drain does for each pod of the node) so that nothing else on a shared node is evicted."""
    name = "e2e-evicted"
    real.apply_job(name, tmp_path, **LONG, **{"faultTolerance.maxRestarts": 0})
    eventually(lambda: real.status(name).get("step", 0) >= 40, 900, "step 40")
    pod = f"{name}-worker-1"
    eviction = tmp_path / "eviction.json"
    eviction.write_text(json.dumps({"apiVersion": "policy/v1", "kind": "Eviction",
                                    "metadata": {"name": pod, "namespace": real.namespace}}))
    evict = ("create", "--raw", f"/api/v1/namespaces/{real.namespace}/pods/{pod}/eviction", "-f", str(eviction))
    refused = real.kubectl(*evict, check=False)  # the job's PodDisruptionBudget holds its healthy workers
    assert refused.returncode != 0 and "disruption budget" in refused.stderr, refused.stderr
    real.kubectl("delete", "pdb", name)  # how an administrator lets evictions through at once
    real.kubectl(*evict)
    status = real.wait_phase(name, "Succeeded", 900)
    assert status["restarts"] == 1 and status["lastRestartReason"] == "Evicted", status
    assert status["restartBudget"].get("used", 0) == 0 and status["step"] == 400
    assert "DisruptionTarget: EvictionByEvictionAPI" in real.kubectl("describe", "tj", name).stdout


def test_a_no_execute_taint_evicts_a_worker_without_spending_budget(real: RealCluster, tmp_path: Path) -> None:
    """Twin of test_operator_cluster's NoExecute test: the real taint manager evicts the worker from its node.
    Every pod there without a toleration of the taint goes too (a daemonset's tolerate it): use a test node pool."""
    name = "e2e-tainted"
    real.apply_job(name, tmp_path, **LONG, **{"faultTolerance.maxRestarts": 0})
    eventually(lambda: real.status(name).get("step", 0) >= 40, 900, "step 40")
    with node_tainted(real.kubectl, worker_node(real.pods(name), f"{name}-worker-1"),
                      "flywheel.dev/e2e-maintenance=now:NoExecute"):
        status = real.wait_phase(name, "Succeeded", 900)
    assert status["restarts"] == 1 and status["lastRestartReason"] == "Evicted", status
    assert status["restartBudget"].get("used", 0) == 0 and status["step"] == 400
    assert "DisruptionTarget: DeletionByTaintManager" in real.kubectl("describe", "tj", name).stdout


def test_import_error_fails_in_two_attempts_with_the_error(real: RealCluster, tmp_path: Path) -> None:
    real.apply_job("e2e-import", tmp_path, command=["python", "-c", "import flywheel_no_such_module"])
    status = real.wait_phase("e2e-import", "Failed", 600)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert "flywheel_no_such_module" in failed["message"] and status.get("restarts", 0) <= 1
    assert "flywheel_no_such_module" in real.kubectl("describe", "tj", "e2e-import").stdout


def test_a_failing_init_container_fails_in_two_attempts_with_its_words(real: RealCluster, tmp_path: Path) -> None:
    """Twin of tests/operator/test_interruptions_cluster.py's: the template's init container fails with its message."""
    fetch = {"name": "fetch", "image": real.image, "terminationMessagePolicy": "FallbackToLogsOnError",
             "command": ["python", "-c", "import sys; sys.exit('dataset s3://bucket/train is missing')"]}
    real.apply_job("e2e-init", tmp_path, template={"spec": {"initContainers": [fetch]}},
                   **{"faultTolerance.maxRestarts": 10})
    status = real.wait_phase("e2e-init", "Failed", 600)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "StartupFailure" and status.get("restarts", 0) <= 1, failed
    assert "init container fetch failed: dataset s3://bucket/train is missing" in failed["message"], failed
    assert "init container fetch failed" in real.kubectl("describe", "tj", "e2e-init").stdout


def test_all_ranks_stopped_is_restarted_in_place_as_hung_without_prometheus(real: RealCluster, tmp_path: Path) -> None:
    """Twin of tests/operator/test_etcd_progress_operator.py: every rank SIGSTOPped, the agents alive: Hung, the
    ranks restarted in place (the same pods, relabelled to generation 1), counted once, and the job finishes."""
    real.apply_job("e2e-stopped", tmp_path, **{**LONG, "faultTolerance.progressTimeoutSeconds": 20})
    eventually(lambda: real.status("e2e-stopped").get("step", 0) >= 20, 900, "step 20")
    pods = {p["metadata"]["name"]: p["metadata"]["uid"] for p in real.pods("e2e-stopped")}
    # The rank processes: forked by the warm zygote (named fw-rank-<RANK>) or a cold `python -m flywheel.trainer`;
    # not the zygote itself nor the warm client the agent started for a rank.
    # Only this pod's (its HOSTNAME: see KILL_RANKS).
    stop = ("import os, signal\nmine = ('HOSTNAME=' + os.environ['HOSTNAME']).encode()\n"
            "for p in filter(str.isdigit, os.listdir('/proc')):\n    try:\n"
            "        cmd = open(f'/proc/{p}/cmdline', 'rb').read().split(b'\\0')\n"
            "        comm = open(f'/proc/{p}/comm').read()\n"
            "        env = open(f'/proc/{p}/environ', 'rb').read().split(b'\\0')\n"
            "    except OSError:\n        continue\n"
            "    if int(p) != os.getpid() and mine in env and (comm.startswith('fw-rank-') or "
            "(b'flywheel.trainer' in cmd and b'flywheel.agent.warm' not in cmd)):\n"
            "        os.kill(int(p), signal.SIGSTOP)\n")
    for pod in pods:
        real.kubectl("exec", pod, "--", "python", "-c", stop)
    status = eventually(lambda: (s := real.status("e2e-stopped")).get("lastRestartReason") == "Hung" and s, 300,
                        "a Hung restart")
    assert status["restarts"] == 1 and status["inPlaceRestartGeneration"] == 1, status
    hung_at = status["step"]
    eventually(lambda: real.status("e2e-stopped").get("step", 0) > hung_at, 600, "a step after the restart")
    after = real.pods("e2e-stopped")
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in after} == pods
    assert {p["metadata"]["labels"]["flywheel.dev/generation"] for p in after} == {"1"}
    final = real.wait_phase("e2e-stopped", "Succeeded", 1200)
    assert final["step"] == 400 and final["restarts"] == 1, final


def test_a_queued_job_waits_for_kueue_admission_then_runs(real: RealCluster, tmp_path: Path) -> None:
    """Twin of tests/operator/test_kueue_admission.py: the test plays Kueue (a cluster running Kueue with a
    LocalQueue named by FLYWHEEL_E2E_QUEUE admits it by itself)."""
    queue = os.environ.get("FLYWHEEL_E2E_QUEUE", "")
    real.apply_job("e2e-queued", tmp_path, **{"scheduling.queue": queue or "e2e-no-such-queue",
                                               "faultTolerance.pendingTimeoutSeconds": 5})
    pods = eventually(lambda: len(p := real.pods("e2e-queued")) == 2 and p, 300, "the gated pods")
    for p in pods:
        assert p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] == "e2e-queued"
        assert p["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    if not queue:
        assert all(p["spec"].get("schedulingGates") == [{"name": "kueue.x-k8s.io/admission"}] for p in pods)
        time.sleep(10)  # past pendingTimeoutSeconds: waiting for admission is neither Unschedulable nor a failure
        status = real.status("e2e-queued")
        held = {c["type"] for c in status.get("conditions", []) if c["status"] == "True"}
        assert status.get("phase", "Pending") == "Pending" and not held & {"Unschedulable", "Failed"}, status
        for p in pods:
            real.kubectl("patch", "pod", p["metadata"]["name"], "--type=json",
                         "-p", '[{"op": "remove", "path": "/spec/schedulingGates"}]')
    assert real.wait_phase("e2e-queued", "Succeeded", 900).get("restarts", 0) == 0


def test_a_script_writing_outside_its_volumes_fails_under_the_hardened_context(real: RealCluster,
                                                                             tmp_path: Path) -> None:
    """Twin of tests/emulator_fidelity/test_security_context.py at the job level: the default worker context has a
    read-only root, so the write fails and the reason reaches the status."""
    real.apply_job("e2e-readonly", tmp_path, command=["python", "-c", "open('/opt/flywheel-e2e', 'w')"])
    status = real.wait_phase("e2e-readonly", "Failed", 600)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert "Read-only file system" in failed["message"], failed


def test_templated_job_carries_every_pass_through_field_and_succeeds(real: RealCluster, tmp_path: Path) -> None:
    """The twin of tests/operator/test_pod_template_cluster.py (busybox:1.36 must be pullable)."""
    real.kubectl("create", "configmap", "tmpl-config", "--from-literal=url=http://tracker", check=False)
    real.apply_job("e2e-tmpl", tmp_path, template=template_for("e2e-tmpl"), **{"trainer.training.steps": 10})
    real.wait_phase("e2e-tmpl", "Succeeded", 900)
    assert_carries_the_template(real.pods("e2e-tmpl"), "e2e-tmpl")


def _pod(real: RealCluster, job: str, name: str) -> dict[str, Any] | None:
    return next((p for p in real.pods(job) if p["metadata"]["name"] == name), None)


def test_a_deleted_worker_is_replaced_by_the_warm_spare(real: RealCluster, tmp_path: Path) -> None:
    name = "e2e-spare"
    real.apply_job(name, tmp_path, **LONG, **{"replicas.spares": 1})
    eventually(lambda: real.status(name).get("spares") == 1, 600, "the spare to be ready")
    eventually(lambda: real.status(name).get("step", 0) >= 40, 900, "step 40")
    real.kubectl("delete", "pod", f"{name}-worker-1", "--grace-period=0", "--force")
    eventually(lambda: ((p := _pod(real, name, f"{name}-spare-0")) is not None
                        and p["metadata"]["labels"].get("flywheel.dev/replica-index") == "1"), 120,
               "the spare to take index 1")
    eventually(lambda: _pod(real, name, f"{name}-spare-1") is not None, 120, "a new spare behind it")
    status = real.wait_phase(name, "Succeeded", 900)
    assert status["step"] == 400 and status["lastRestartReason"] == "PodDeleted", status
    assert _pod(real, name, f"{name}-worker-1") is None  # no cold pod of that index


def _train_with_a_ready_spare(real: RealCluster, tmp_path: Path, name: str, **spec: Any) -> str:
    """The LONG job with a ready spare and memory checkpoints, past step 40: the node of a worker not beside the
    spare (the one to take away)."""
    real.apply_job(name, tmp_path, **LONG, **{"replicas.spares": 1, "checkpoint.memoryEverySteps": 10, **spec})
    eventually(lambda: real.status(name).get("spares") == 1, 600, "the spare to be ready")
    eventually(lambda: real.status(name).get("step", 0) >= 40, 900, "step 40")
    spare_node = (_pod(real, name, f"{name}-spare-0") or {}).get("spec", {}).get("nodeName")
    worker = next(p for p in real.pods(name) if p["metadata"]["labels"].get("flywheel.dev/role") == "worker"
                  and p["spec"].get("nodeName") != spare_node)
    return str(worker["spec"]["nodeName"])


def test_a_tainted_node_is_drained_ahead_without_replay(real: RealCluster, tmp_path: Path) -> None:
    name, taint = "e2e-drain", "nvidia.com/gpu-xid-error"
    node = _train_with_a_ready_spare(real, tmp_path, name)
    real.kubectl("taint", "node", node, f"{taint}=true:NoSchedule")
    try:
        status = real.wait_phase(name, "Succeeded", 900)
    finally:
        real.kubectl("taint", "node", node, f"{taint}-", check=False)
    assert status["lastRestartReason"] == "NodeDraining" and status["goodput"].get("lostSteps", 0) == 0, status
    assert status["restartBudget"].get("used", 0) == 0


def test_kubectl_drain_waits_on_the_jobs_budget_while_the_worker_moves_ahead(real: RealCluster, tmp_path: Path) -> None:
    """Twin of test_drain_cluster's: `kubectl drain` of a worker's node is refused the worker's eviction by the
    job's PodDisruptionBudget until drain ahead has moved it; the drain then completes, no step lost. The drain
    evicts every other pod of that node too: use a test node pool."""
    name = "e2e-kdrain"
    node = _train_with_a_ready_spare(real, tmp_path, name, **{"faultTolerance.maxRestarts": 0})
    budget = json.loads(real.kubectl("get", "pdb", name, "-o", "json").stdout)
    assert budget["spec"]["minAvailable"] == 2 and budget["status"]["disruptionsAllowed"] == 0, budget
    try:
        drained = subprocess.run([real.kubectl_bin, "--kubeconfig", real.kubeconfig, "drain", node,
                                  "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=600s"],
                                 capture_output=True, text=True, timeout=700)
        status = real.wait_phase(name, "Succeeded", 900)
    finally:
        real.kubectl("uncordon", node, namespace="default", check=False)
    said = drained.stdout + drained.stderr
    assert drained.returncode == 0 and "violate the pod's disruption budget" in said, said
    assert status["lastRestartReason"] == "NodeDraining" and status["goodput"].get("lostSteps", 0) == 0, status
    assert status["restartBudget"].get("used", 0) == 0


def test_without_a_spare_a_drain_starts_a_warm_pod_first(real: RealCluster, tmp_path: Path) -> None:
    """The twin of test_drain_cluster's: spares 0; the drain starts a spare off the tainted node, waits for it to be
    warm while the job trains, then moves the worker to it with no replayed step."""
    name, taint = "e2e-drain-no-spare", "nvidia.com/gpu-xid-error"
    real.apply_job(name, tmp_path, **LONG, **{"checkpoint.memoryEverySteps": 10})
    eventually(lambda: real.status(name).get("step", 0) >= 40, 900, "step 40")
    worker = _pod(real, name, f"{name}-worker-1") or {}
    node = worker["spec"]["nodeName"]
    real.kubectl("taint", "node", node, f"{taint}=true:NoSchedule")
    try:
        eventually(lambda: any((_pod(real, name, f"{name}-spare-{n}") or {}).get("metadata", {}).get("labels", {})
                               .get("flywheel.dev/replica-index") == "1" for n in range(2)), 900,
                   "a spare of the drain to take index 1")
        status = real.wait_phase(name, "Succeeded", 900)
    finally:
        real.kubectl("taint", "node", node, f"{taint}-", check=False)
    assert status["lastRestartReason"] == "NodeDraining" and status["goodput"].get("lostSteps", 0) == 0, status
    assert status["restartBudget"].get("used", 0) == 0
    assert _pod(real, name, f"{name}-worker-1") is None  # no cold pod of that index


def test_a_spare_beside_a_worker_moves_to_a_node_that_frees_up(real: RealCluster, tmp_path: Path) -> None:
    """The twin of test_spares_cluster's: every schedulable node but one held off with a NoSchedule taint (a key
    outside the drain keys), the job and its spare start on that one; the hold lifted from a second node, the
    operator starts a spare there and lets the one beside the workers go. Skips with fewer than 2 usable nodes."""
    name, hold = "e2e-spare-moves", "flywheel.dev/e2e-hold"
    nodes = json.loads(real.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    usable = [n["metadata"]["name"] for n in nodes if not n["spec"].get("unschedulable") and not any(
        t.get("effect") in ("NoSchedule", "NoExecute") for t in n["spec"].get("taints") or [])]
    if len(usable) < 2:
        pytest.skip(f"needs 2 schedulable untainted nodes, found {usable}")
    home, freed = usable[0], usable[1]
    held = usable[1:]
    for node in held:
        real.kubectl("taint", "node", node, f"{hold}=true:NoSchedule")
    try:
        real.apply_job(name, tmp_path, **{**LONG, "trainer.training.steps": 5000, "replicas.spares": 1})
        eventually(lambda: real.status(name).get("spares") == 1, 600, "the spare to be ready")
        assert {p["spec"].get("nodeName") for p in real.pods(name)} == {home}
        real.kubectl("taint", "node", freed, f"{hold}-")

        def spares() -> list[dict[str, Any]]:
            return [p for p in real.pods(name) if p["metadata"]["labels"].get("flywheel.dev/role") == "spare"
                    and not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"]
        eventually(lambda: [p["metadata"]["name"] for p in spares()] == [f"{name}-spare-1"], 900,
                   "the spare to move and the old one to go")
        assert spares()[0]["spec"]["nodeName"] == freed
        status = real.status(name)
        assert status["spares"] == 1 and status["spareMove"]["spare"] == -1 and not status.get("restarts"), status
    finally:
        for node in held:
            real.kubectl("taint", "node", node, f"{hold}-", check=False)
        real.kubectl("delete", "tj", name, "--wait=false", check=False)


def test_a_job_deleted_while_the_operator_is_down_has_its_etcd_keys_deleted(real: RealCluster,
                                                                             tmp_path: Path) -> None:
    """The twin of test_operator_lifecycle's: no daemon runs a job deleted while the operator is down; its index
    handler sees it deleting (kopf's finalizer holds it) after the restart and deletes its run's keys."""
    ns, _, selector = os.environ.get("FLYWHEEL_E2E_ETCD",
                                     f"{real.operator_ns}:app.kubernetes.io/component=etcd").partition(":")
    etcd_pods = real.kubectl("get", "pods", "-l", selector, "-o", "name", namespace=ns).stdout.split()
    if not etcd_pods:
        pytest.skip("no in-cluster etcd (the chart points at an external endpoint)")
    name = "e2e-deleted-while-down"
    real.apply_job(name, tmp_path, **LONG)
    eventually(lambda: real.status(name).get("step", 0) >= 10, 900, "step 10")
    uid = json.loads(real.kubectl("get", "tj", name, "-o", "json").stdout)["metadata"]["uid"]
    prefix = f"/flywheel/rdzv/{real.namespace}-{name}-{uid[:8]}/"

    def keys() -> int:
        out = real.kubectl("exec", etcd_pods[0], "--", "etcdctl", "get", "--prefix", "--keys-only", prefix,
                           namespace=ns).stdout
        return len([line for line in out.splitlines() if line.strip()])

    assert keys() > 0
    operator = ["deployment", "-l", real.operator_selector]
    real.kubectl("scale", *operator, "--replicas=0", namespace=real.operator_ns)
    try:
        eventually(lambda: not real.kubectl("get", "pods", "-l", real.operator_selector, "-o", "name",
                                            namespace=real.operator_ns).stdout.strip(), 300, "the operator to stop")
        real.kubectl("delete", "tj", name, "--wait=false")
        assert json.loads(real.kubectl("get", "tj", name, "-o", "json").stdout)["metadata"].get("deletionTimestamp")
    finally:
        real.kubectl("scale", *operator, "--replicas=1", namespace=real.operator_ns)
    eventually(lambda: real.kubectl("get", "tj", name, check=False).returncode != 0, 600, "the job to go")
    eventually(lambda: keys() == 0, 120, "its rendezvous keys to go")


@pytest.mark.skipif(not os.environ.get("FLYWHEEL_E2E_CKPT_CLAIM"), reason="two jobs sharing a checkpoint claim: "
                    "set FLYWHEEL_E2E_CKPT_CLAIM to a ReadWriteMany claim in the namespace")
def test_jobs_sharing_a_claim_keep_their_checkpoints_apart(real: RealCluster, tmp_path: Path) -> None:
    """Each job's checkpoints are in the claim's folder named by its dir (subPath): a second job with the same
    model on the same claim starts from scratch, never from (or pruning) the first's step folders; a third naming
    the first's dir resumes from it, already complete."""
    steps = {"trainer.training.steps": 30, "checkpoint.everySteps": 10, "checkpoint.keep": 1}
    real.apply_job("e2e-claim-a", tmp_path, **steps)
    assert real.wait_phase("e2e-claim-a", "Succeeded", 900)["step"] == 30
    real.apply_job("e2e-claim-b", tmp_path, **steps)
    done = real.wait_phase("e2e-claim-b", "Succeeded", 900)
    assert not done.get("lastRestore"), done  # nothing of job a's was restored
    assert done.get("restarts", 0) == 0 and done["step"] == 30
    first_dir = json.loads(real.kubectl("get", "tj", "e2e-claim-a", "-o", "json").stdout)["spec"]["checkpoint"]["dir"]
    real.apply_job("e2e-claim-c", tmp_path, **steps, **{"checkpoint.dir": first_dir})
    again = real.wait_phase("e2e-claim-c", "Succeeded", 900)
    finished = next(c for c in again["conditions"] if c["type"] == "Succeeded")
    assert f"already complete at step 30 (checkpoint {first_dir}/step-00000030)" in finished["message"], finished


@pytest.mark.skipif(not os.environ.get("FLYWHEEL_E2E_CKPT_CLAIM"), reason="two jobs naming one checkpoint dir on a "
                    "claim: set FLYWHEEL_E2E_CKPT_CLAIM to a ReadWriteMany claim in the namespace")
def test_a_job_naming_an_unfinished_jobs_checkpoint_dir_waits_for_it(real: RealCluster, tmp_path: Path) -> None:
    """Twin of test_operator_lifecycle's: the newer job creates no worker while the older one is unfinished (here
    suspended: CheckpointDirInUse), then resumes from its last checkpoint once that one finished."""
    real.apply_job("e2e-dir-owner", tmp_path, **{"trainer.training.steps": 400, "checkpoint.everySteps": 20})
    eventually(lambda: real.status("e2e-dir-owner").get("step", 0) >= 20, 900, "the owner to pass step 20")
    real.kubectl("patch", "tj", "e2e-dir-owner", "--type=merge", "-p", '{"spec": {"suspend": true}}')
    real.wait_phase("e2e-dir-owner", "Suspended", 300)
    directory = json.loads(real.kubectl("get", "tj", "e2e-dir-owner", "-o", "json").stdout)["spec"]["checkpoint"]["dir"]
    real.apply_job("e2e-dir-copied", tmp_path, **{"trainer.training.steps": 420, "checkpoint.dir": directory})
    eventually(lambda: any(c["type"] == "CheckpointDirInUse" and c["status"] == "True"
                           for c in real.status("e2e-dir-copied").get("conditions", [])), 120, "the copied job to wait")
    assert real.pods("e2e-dir-copied") == []
    real.kubectl("patch", "tj", "e2e-dir-owner", "--type=merge", "-p", '{"spec": {"suspend": false}}')
    assert real.wait_phase("e2e-dir-owner", "Succeeded", 1800)["step"] == 400
    status = real.wait_phase("e2e-dir-copied", "Succeeded", 900)
    assert status["step"] == 420 and status["lastRestore"]["step"] == 400, status


@pytest.mark.skipif(not os.environ.get("FLYWHEEL_E2E_CKPT_CLAIM"), reason="a job on a deleted job's checkpoint dir: "
                    "set FLYWHEEL_E2E_CKPT_CLAIM to a ReadWriteMany claim in the namespace")
def test_a_job_on_a_deleted_jobs_checkpoint_dir_waits_for_its_stopping_pods(real: RealCluster, tmp_path: Path) -> None:
    """Twin of test_operator_lifecycle's: the deleted job's pods train through a 6 s preStop hook, then save; the
    new job creates no worker while any of them remains and resumes from at least the step they had reached."""
    hook = {"spec": {"containers": [{"name": "worker", "lifecycle": {"preStop": {"sleep": {"seconds": 6}}}}]}}
    real.apply_job("e2e-leaving", tmp_path, **{"trainer.training.steps": 5000, "checkpoint.everySteps": 20,
                                               "template": hook})
    eventually(lambda: real.status("e2e-leaving").get("step", 0) >= 30, 900, "the first job to pass step 30")
    directory = json.loads(real.kubectl("get", "tj", "e2e-leaving", "-o", "json").stdout)["spec"]["checkpoint"]["dir"]
    reached = real.status("e2e-leaving")["step"]
    real.kubectl("delete", "tj", "e2e-leaving", "--wait=false")
    real.apply_job("e2e-successor", tmp_path, **{"trainer.training.steps": 5000, "checkpoint.dir": directory})
    while "e2e-leaving" in (jobs := real.jobs_with_pods("e2e-leaving", "e2e-successor")):
        assert "e2e-successor" not in jobs, "the new job's workers started beside the stopping ones"
        time.sleep(0.5)
    restored = eventually(lambda: real.status("e2e-successor").get("lastRestore"), 900, "the successor to restore")
    assert restored["step"] >= reached, (restored, reached)  # the stopping pods' emergency checkpoint
    real.kubectl("delete", "tj", "e2e-successor", "--wait=false")


@pytest.mark.skipif(not os.environ.get("FLYWHEEL_E2E_CKPT_CLAIM"), reason="a checkpoint damaged on a shared claim: "
                    "set FLYWHEEL_E2E_CKPT_CLAIM to a ReadWriteMany claim in the namespace")
def test_a_damaged_checkpoint_is_a_warning_event(real: RealCluster, tmp_path: Path) -> None:
    """The emulator's test_a_damaged_checkpoint_is_a_warning_event_without_an_events_dir: a byte of the newest
    checkpoint flipped (by a one-worker job whose script does it on the claim), then a job resuming from that dir
    skips it for the previous one and posts CheckpointDamaged."""
    real.apply_job("e2e-damaged", tmp_path, **{"trainer.training.steps": 20, "checkpoint.everySteps": 10,
                                               "checkpoint.keep": 2})
    assert real.wait_phase("e2e-damaged", "Succeeded", 900)["step"] == 20
    directory = json.loads(real.kubectl("get", "tj", "e2e-damaged", "-o", "json").stdout)["spec"]["checkpoint"]["dir"]
    flip = (f"import glob; p = sorted(glob.glob('{directory}/step-00000020/__0_*.distcp'))[0]; "
            "b = bytearray(open(p, 'rb').read()); b[len(b) // 2] ^= 1; open(p, 'wb').write(bytes(b))")
    real.apply_job("e2e-damage-it", tmp_path, command=["python", "-c", flip],
                   **{"replicas.min": 1, "replicas.max": 1, "checkpoint.dir": directory})
    real.wait_phase("e2e-damage-it", "Succeeded", 600)
    real.apply_job("e2e-resumed", tmp_path, **{"trainer.training.steps": 30, "checkpoint.dir": directory})
    done = real.wait_phase("e2e-resumed", "Succeeded", 900)
    assert done["step"] == 30 and done["lastRestore"] == {"source": "disk", "step": 10}, done
    events = json.loads(real.kubectl("get", "events", "--field-selector", "involvedObject.name=e2e-resumed",
                                     "-o", "json").stdout)["items"]
    damaged = [e for e in events if e["reason"] == "CheckpointDamaged"]
    assert damaged and "checkpoint at step 20 is damaged" in damaged[0]["message"], events


def test_a_refused_pod_create_is_a_replica_failure_condition_until_it_goes_through(real: RealCluster,
                                                                                    tmp_path: Path) -> None:
    """Twin of tests/operator/test_executor_service.py's refused create: a ResourceQuota (scoped to a priority class
    only this job uses) admits one of its two pods; the refusal shows as ReplicaFailure=True (CreateFailed, the API's
    words), and once the quota is raised the pod is created and the condition turns False."""
    manifests = tmp_path / "quota.yaml"
    quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "e2e-quota"},
             "spec": {"hard": {"pods": "1"}, "scopeSelector": {"matchExpressions": [
                 {"scopeName": "PriorityClass", "operator": "In", "values": ["flywheel-e2e-quota"]}]}}}
    priority = {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": "flywheel-e2e-quota"}, "value": 0}
    manifests.write_text(yaml.safe_dump_all([priority, quota]))
    real.kubectl("apply", "-f", str(manifests))
    try:
        real.apply_job("e2e-quota", tmp_path, **{**LONG, "scheduling.priorityClassName": "flywheel-e2e-quota"})
        refused = eventually(lambda: next((c for c in real.status("e2e-quota").get("conditions", [])
                                           if c["type"] == "ReplicaFailure" and c["status"] == "True"), None),
                             300, "ReplicaFailure=True")
        assert refused["reason"] == "CreateFailed" and "exceeded quota" in refused["message"], refused
        real.kubectl("patch", "resourcequota", "e2e-quota", "--type=merge", "-p", '{"spec":{"hard":{"pods":"2"}}}')
        eventually(lambda: any(c["type"] == "ReplicaFailure" and c["status"] == "False"
                               for c in real.status("e2e-quota").get("conditions", [])), 300, "ReplicaFailure=False")
        assert real.wait_phase("e2e-quota", "Succeeded", 900)["step"] == 400
    finally:
        real.kubectl("delete", "tj", "e2e-quota", "--wait=false", check=False)
        real.kubectl("delete", "-f", str(manifests), "--wait=false", check=False)
