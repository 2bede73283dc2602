"""Pure pieces of the operator: pod/service manifests, pod status -> PodView, and the event-log fold."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from flywheel.operator import manifests as m
from flywheel.operator.event_log import EventLogTail
from flywheel.operator.observe import pod_view
from flywheel.policy.spec_change import baked_spec_hash
from flywheel.spec import SpecError, parse_job
from tests import builders
from tests.operator.liveness_verdict import verdict

JOB = parse_job({"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob",
                 "metadata": {"name": "j", "namespace": "ml"},
                 "spec": {"replicas": {"min": 1, "max": 3, "target": 2}, "procsPerReplica": 2,
                          "trainer": {"training": {"globalBatch": 12, "microBatch": 1}},
                          "scheduling": {"queue": "team-a", "schedulerName": "volcano"},
                          "checkpoint": {"dir": "/ckpt/j"}}})
SETTINGS = m.OperatorSettings(etcd_endpoints="etcd:2379", events_dir="/ev", metrics_port_base=9400,
                              worker_env=(("OMP_NUM_THREADS", "1"),))


def test_pods_follow_the_worker_contract() -> None:
    workers = m.plan(JOB, "0123456789abcdef", SETTINGS, "/ev/x.jsonl")
    assert [w.name for w in workers] == ["j-worker-0", "j-worker-1"]
    body = m.pod(JOB, workers[1], 3, SETTINGS)
    env = {e["name"]: e["value"] for e in body["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_BACKEND"] == "etcd-v3" and env["PET_RDZV_ENDPOINT"] == "etcd:2379"
    assert env["PET_RDZV_ID"] == "ml-j-01234567" and env["PET_NNODES"] == "1:3" and env["PET_NPROC_PER_NODE"] == "2"
    assert env["WORLD_SIZE"] == "4" and env["FLYWHEEL_REPLICA_INDEX"] == "1" and env["FLYWHEEL_JOB"] == "ml/j"
    # Every pod has its own network namespace on a cluster: one port for all (the test cluster spreads them).
    assert env["FLYWHEEL_METRICS_PORT"] == "9400" and env["FLYWHEEL_CHECKPOINT_DIR"] == "/ckpt/j"
    assert body["spec"]["containers"][0]["ports"] == [{"name": "metrics", "containerPort": 9400}]
    # No test-only annotation (the kubelet picks its directory); the queue's Kueue pod group (scheduling_meta.py),
    # the spec it is created with (policy/spec_change.py) and the autoscalers' opt-outs (contracts/labels.py).
    assert body["metadata"]["annotations"] == {"kueue.x-k8s.io/pod-group-total-count": "2",
                                               "flywheel.dev/spec-hash": baked_spec_hash(JOB.spec),
                                               "karpenter.sh/do-not-disrupt": "true",
                                               "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
    assert env["FLYWHEEL_EVENTS_FILE"] == "/ev/x.jsonl" and env["OMP_NUM_THREADS"] == "1"
    assert json.loads(env["FLYWHEEL_SPEC"])["replicas"]["target"] == 2
    assert body["spec"]["containers"][0]["command"] == ["python", "-m", "flywheel.cli", "launch"]
    assert body["metadata"]["labels"] == {m.JOB_LABEL: "j", m.INDEX_LABEL: "1", m.GENERATION_LABEL: "3",
                                          m.ROLE_LABEL: "worker", m.QUEUE_LABEL: "team-a",
                                          "kueue.x-k8s.io/pod-group-name": "j"}
    assert body["spec"]["hostname"] == "j-worker-1" and body["spec"]["subdomain"] == "j-workers"
    assert body["spec"]["restartPolicy"] == "Never" and body["spec"]["schedulerName"] == "volcano"
    svc = m.service(JOB)
    assert svc["metadata"]["name"] == "j-workers" and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {m.JOB_LABEL: "j"}


def test_worker_pods_are_hardened_and_mount_checkpoints_shm_and_events() -> None:
    claimed = parse_job({**JOB.model_dump(by_alias=True, exclude_none=True),
                         "spec": {**JOB.spec.model_dump(by_alias=True, exclude_none=True),
                                  "checkpoint": {"dir": "/ckpt/j", "claimName": "ckpt-rwx"}, "shmSize": "8Gi"}})
    settings = m.OperatorSettings(etcd_endpoints="etcd:2379", events_dir="/ev", events_claim="flywheel-events")
    body = m.pod(claimed, m.plan(claimed, "0123456789abcdef", settings, "/ev/x.jsonl")[0], 0, settings)
    spec, container = body["spec"], body["spec"]["containers"][0]
    assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["runAsUser"] == m.WORKER_UID
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {v["mountPath"]: v["name"] for v in container["volumeMounts"]}
    assert mounts == {"/dev/shm": "dshm", "/tmp": "tmp", "/home/flywheel": "cache-home", "/ckpt/j": "checkpoints",
                      "/ev": "events"}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "ckpt-rwx"}
    # The job's own folder on the claim: jobs sharing a claim never see each other's step folders.
    [ckpt_mount] = [v for v in container["volumeMounts"] if v["name"] == "checkpoints"]
    assert ckpt_mount == {"name": "checkpoints", "mountPath": "/ckpt/j", "subPath": "ckpt/j"}
    assert volumes["events"]["persistentVolumeClaim"] == {"claimName": "flywheel-events"}
    # Where its checkpoints land, so that it keeps that place from another job while it stops after a deletion.
    assert body["metadata"]["annotations"]["flywheel.dev/checkpoint-location"] == "ml/ckpt-rwx:/ckpt/j"
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "8Gi"}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["HOME"] == "/home/flywheel" and env["TRITON_CACHE_DIR"].startswith("/home/flywheel/")  # read-only root
    assert spec["terminationGracePeriodSeconds"] == 120  # faultTolerance.terminationGraceSeconds' default
    # Without a claim the checkpoints get an emptyDir (lost with the pod: documented); a relative dir is not mounted.
    plain = m.pod(JOB, m.plan(JOB, "0123456789abcdef", SETTINGS, None)[0], 0, SETTINGS)
    assert {v["name"]: v for v in plain["spec"]["volumes"]}["checkpoints"] == {"name": "checkpoints", "emptyDir": {}}
    assert all("subPath" not in v for v in plain["spec"]["containers"][0]["volumeMounts"])
    assert "events" not in {v["name"] for v in plain["spec"]["volumes"]}  # no claim: the test cluster's host dir
    assert "flywheel.dev/checkpoint-location" not in plain["metadata"]["annotations"]  # its own, shared with no one
    kv = pytest.importorskip("kubernetes_validate")
    for doc in (body, plain, m.service(JOB)):
        kv.validate(doc, "1.33.0", strict=True)


def _with_checkpoint(checkpoint: dict) -> dict:
    job = parse_job({**JOB.model_dump(by_alias=True, exclude_none=True),
                     "spec": {**JOB.spec.model_dump(by_alias=True, exclude_none=True), "checkpoint": checkpoint}})
    body = m.pod(job, m.plan(job, "0123456789abcdef", SETTINGS, None)[0], 0, SETTINGS)
    return {v["mountPath"]: v["name"] for v in body["spec"]["containers"][0]["volumeMounts"]}


def test_an_object_store_dir_is_not_mounted_and_its_local_dir_is() -> None:
    """s3://... is no path: staged under /tmp (the pod's emptyDir) by default, or in localDir's own emptyDir."""
    assert _with_checkpoint({"dir": "s3://bucket/j"}) == {"/dev/shm": "dshm", "/tmp": "tmp",
                                                          "/home/flywheel": "cache-home"}
    assert _with_checkpoint({"dir": "s3://bucket/j", "localDir": "/staging"})["/staging"] == "checkpoints"
    assert _with_checkpoint({"dir": "/tmp/ckpt"})["/tmp/ckpt"] == "checkpoints"  # a path dir as before


def test_bad_shm_size_names_the_field() -> None:
    with pytest.raises(SpecError, match="shmSize"):
        parse_job({"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "j"},
                   "spec": {"shmSize": "lots"}})


def test_kueue_queue_label_of_the_job_passes_through() -> None:
    job = parse_job({"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob",
                     "metadata": {"name": "q", "labels": {m.QUEUE_LABEL: "lq"}}})
    worker = m.plan(job, "abcdefgh", SETTINGS, None)[0]
    assert m.pod(job, worker, 0, SETTINGS)["metadata"]["labels"][m.QUEUE_LABEL] == "lq"


def test_user_command_runs_under_the_agent() -> None:
    job = parse_job({"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "u"},
                     "spec": {"command": ["train.py", "--lr", "1"]}})
    worker = m.plan(job, "abcdefgh", SETTINGS, None)[0]
    assert m.pod(job, worker, 0, SETTINGS)["spec"]["containers"][0]["command"] == \
        ["python", "-m", "flywheel.cli", "launch", "--", "train.py", "--lr", "1"]


def test_pod_view_reads_exit_codes_nodes_and_deletion() -> None:
    obj = {"metadata": {"name": "j-worker-1", "uid": "u", "labels": {m.INDEX_LABEL: "1", m.GENERATION_LABEL: "2"},
                        "deletionTimestamp": "2026-01-01T00:00:30Z", "deletionGracePeriodSeconds": 30},
           "spec": {"nodeName": "node-2"},
           "status": {"phase": "Failed", "containerStatuses": [
               {"state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}}
    view = pod_view(obj, {"node-2"})
    assert view is not None and (view.index, view.generation, view.exit_code, view.reason) == (1, 2, 137, "OOMKilled")
    assert view.node_lost and view.deleting_since == 1767225600.0  # the delete request, not the grace end
    nodes = [{"metadata": {"name": "a"}, "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}},
             {"metadata": {"name": "b"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}]
    assert m.lost_nodes(nodes) == {"a"}
    assert pod_view({"metadata": {"name": "x", "uid": "y", "labels": {}}}, set()) is None


def test_event_log_fold_counts_lost_steps_and_recovery(tmp_path: Path) -> None:
    log = tmp_path / "ev.jsonl"
    rows = [{"event": "start", "time": 100.0}]
    rows += [{"event": "step", "time": 100.0 + s, "step": s, "step_seconds": 0.5, "world_size": 2} for s in (1, 2, 3)]
    rows += [{"event": "checkpoint", "time": 103.1, "step": 2, "path": "/c/2"},
             {"event": "start", "time": 107.0}, {"event": "restore", "time": 107.5, "step": 2},
             {"event": "step", "time": 110.0, "step": 3, "step_seconds": 0.5, "world_size": 2}]
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"event": "step", "ti')  # torn last line
    tail = EventLogTail(log)
    p = tail.poll()
    assert (p.step, p.world_size, p.checkpoint_step, p.checkpoint_path, p.done) == (3, 2, 2, "/c/2", False)
    assert p.goodput["lostSteps"] == 1 and p.goodput["meanTimeToRecoverSeconds"] == 7.0
    assert p.goodput["productiveSeconds"] == 1.5 and p.goodput["ratio"] == round(1.5 / 10, 4)
    with open(log, "a") as f:
        f.write('me": 111, "step": 4, "step_seconds": 0.5}\n{"event": "done", "time": 112, "step": 4}\n')
    p = tail.poll()
    assert p.step == 4 and p.done
    assert EventLogTail(tmp_path / "missing.jsonl").poll().step == 0


def test_operator_does_not_import_torch_numpy_or_httpx() -> None:
    """Its memory is held for the operator's life: numpy (~11 MB) and httpx (~6 MB, the health monitor's
    Prometheus client) load only where used."""
    import subprocess

    code = ("import sys, flywheel.operator.main, flywheel.operator.handlers; "
            "print([m for m in ('torch', 'numpy', 'httpx') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_liveness_keys_of_a_predecessor_do_not_count() -> None:
    import logging

    from flywheel.etcd.liveness import LiveWorker
    from flywheel.operator.executor import JobRunner

    runner = JobRunner(None, SETTINGS, "ml", "j", "uid", logging.getLogger("t"))  # type: ignore[arg-type]
    keys = runner.observer.etcd
    pod = builders.pod(0, generation=1, uid="new")
    keys.live = {"0": LiveWorker("0", "h", 1, since=90.0, lease_id=1)}  # the old pod's key, still in its TTL
    assert not verdict(runner, pod, 100.0, 101.0)
    keys.live = {}  # the old key expired before the new agent registered: not a death
    assert not verdict(runner, pod, 100.0, 110.0)
    keys.live = {"0": LiveWorker("0", "h", 2, since=104.0, lease_id=2)}  # the new agent registered
    assert not verdict(runner, pod, 100.0, 111.0)
    keys.live = {}
    assert not verdict(runner, pod, 100.0, 112.0)  # gone: the grace starts
    assert verdict(runner, pod, 100.0, 113.5)


def test_an_agent_that_exited_by_itself_is_not_a_lost_worker() -> None:
    """Its key is marked exited and then expires while the kubelet may still report the pod Running: the pod's own
    status decides (a revoke racing that report read as NodeLost and restarted finished jobs)."""
    import logging

    from flywheel.etcd.liveness import LiveWorker
    from flywheel.operator.executor import JobRunner

    runner = JobRunner(None, SETTINGS, "ml", "j", "uid", logging.getLogger("t"))  # type: ignore[arg-type]
    keys = runner.observer.etcd
    pod = builders.pod(0, generation=1, uid="p")
    keys.live = {"0": LiveWorker("0", "h", 2, since=104.0, lease_id=2)}
    assert not verdict(runner, pod, 100.0, 105.0)
    keys.live = {"0": LiveWorker("0", "h", 2, since=130.0, lease_id=2, exited=True)}
    assert not verdict(runner, pod, 100.0, 130.5)
    keys.live = {}  # expired with its lease; the pod still shows Running
    assert not verdict(runner, pod, 100.0, 136.0)
    assert not verdict(runner, pod, 100.0, 160.0)
    other = builders.pod(0, generation=2, uid="q")
    keys.live = {"0": LiveWorker("0", "h", 3, since=201.0, lease_id=3)}  # a new pod's agent: judged afresh
    assert not verdict(runner, other, 200.0, 202.0)
    keys.live = {}
    assert not verdict(runner, other, 200.0, 203.0)
    assert verdict(runner, other, 200.0, 204.5)


def test_a_live_key_after_an_exited_marker_makes_the_lease_count_again() -> None:
    """An exited marker seen for a pod (e.g. its predecessor's, written as that agent ended) and then the pod's own
    agent registering: when that key expires the worker is lost (goodput_operator found a lost node detected only
    by the 40 s node grace after a pod delete and a node loss of the same worker)."""
    import logging

    from flywheel.etcd.liveness import LiveWorker
    from flywheel.operator.executor import JobRunner

    runner = JobRunner(None, SETTINGS, "ml", "j", "uid", logging.getLogger("t"))  # type: ignore[arg-type]
    keys = runner.observer.etcd
    pod = builders.pod(1, generation=1, uid="b")
    keys.live = {"1": LiveWorker("1", "h", 2, since=100.5, lease_id=2, exited=True)}
    assert not verdict(runner, pod, 100.0, 101.0)
    keys.live = {"1": LiveWorker("1", "h", 3, since=103.0, lease_id=3)}  # this pod's agent registered
    assert not verdict(runner, pod, 100.0, 104.0)
    keys.live = {}  # its node died: the lease expired
    assert not verdict(runner, pod, 100.0, 110.0)
    assert verdict(runner, pod, 100.0, 111.5)


def test_operator_metrics_count_each_decided_restart_once() -> None:
    from flywheel.monitor.operator_metrics import OperatorMetrics

    metrics = OperatorMetrics()
    running = {"phase": "Running", "restarts": 0, "goodput": {"ratio": 0.5}}
    restarted = {"phase": "Restarting", "restarts": 1, "lastRestartReason": "Killed"}
    metrics.observe_job("ns", "a", running, 0)
    metrics.observe_job("ns", "a", restarted, 0)  # the pass that decided
    metrics.observe_job("ns", "a", restarted, 1)  # later passes read restarts=1 back
    metrics.observe_job("ns", "b", running, 0)
    value = metrics.registry.get_sample_value
    assert value("flywheel_job_restarts_total", {"namespace": "ns", "job": "a", "reason": "Killed"}) == 1
    assert value("flywheel_operator_jobs", {"namespace": "ns", "phase": "Restarting"}) == 1
    assert value("flywheel_operator_jobs", {"namespace": "ns", "phase": "Running"}) == 1
    assert value("flywheel_job_phase", {"namespace": "ns", "job": "a", "phase": "Restarting"}) == 1
    assert value("flywheel_job_phase", {"namespace": "ns", "job": "a", "phase": "Running"}) == 0
    assert value("flywheel_job_goodput_ratio", {"namespace": "ns", "job": "b"}) == 0.5
    metrics.forget_job("ns", "b")
    assert value("flywheel_operator_jobs", {"namespace": "ns", "phase": "Running"}) == 0
    metrics.observe_job("other", "c", {"phase": "Succeeded"}, 0)  # a second namespace: its own counts, all phases
    assert value("flywheel_operator_jobs", {"namespace": "other", "phase": "Succeeded"}) == 1
    assert value("flywheel_operator_jobs", {"namespace": "other", "phase": "Running"}) == 0
    assert value("flywheel_operator_jobs", {"namespace": "ns", "phase": "Restarting"}) == 1
    metrics.forget_job("other", "c")  # its last job gone: the namespace reads 0, not a stale 1
    assert value("flywheel_operator_jobs", {"namespace": "other", "phase": "Succeeded"}) == 0
    assert value("flywheel_job_phase", {"namespace": "ns", "job": "b", "phase": "Running"}) is None


def test_a_claims_sub_path_is_the_dirs_folder_normalised() -> None:
    assert m.claim_sub_path("/ckpt/a", "rwx") == {"subPath": "ckpt/a"}
    assert m.claim_sub_path("/ckpt/x/../a/", "rwx") == {"subPath": "ckpt/a"}  # never a '..' the API server refuses
    assert m.claim_sub_path("/", "rwx") == {}  # the claim's root itself
    assert m.claim_sub_path("/ckpt/a", "") == {}  # an emptyDir is the job's own
