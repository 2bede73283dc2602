"""Lifecycle features on the test cluster: kubectl scale (elastic), suspend/resume, activeDeadlineSeconds,
ttlSecondsAfterFinished with the etcd-cleanup finalizer, user scripts, and gang scheduling PodGroups."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from flywheel.etcd import keys
from flywheel.etcd.session import EtcdSession
from flywheel.local import procs
from tests.operator.conftest import HOLD_TAINT, IDLE_STEP_S, LONG, LONG_STEPS, OpEnv, eventually

PODGROUP_CRD = Path(__file__).resolve().parents[1] / "fixtures" / "crds" / "scheduler-plugins-podgroup.yaml"


def _etcd_keys(env: OpEnv, prefix: bytes) -> int:
    session = EtcdSession(str(env.cluster.etcd_url))
    try:
        async def count(client: Any) -> int:
            return len(list(await client.get_prefix(prefix)))
        return int(session.call(count))
    finally:
        session.close()


@pytest.mark.heavy
@pytest.mark.slow
def test_kubectl_scale_shrinks_and_regrows_an_elastic_job(op_env: OpEnv) -> None:
    name = "elastic"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name, **{"trainer.training.steps": 300,
                                                                      "replicas": {"min": 1, "max": 2}})))
    eventually(lambda: op_env.last_step(name) >= 40, 120, "elastic to pass step 40", interval=0.05)
    op_env.kubectl("scale", "tj", name, "--replicas", "1")
    eventually(lambda: [p["metadata"]["name"] for p in op_env.pods(name)] == [f"{name}-worker-0"], 60,
               "worker 1 to go")
    eventually(lambda: any(r["event"] == "step" and r["world_size"] == 1 for r in op_env.records(name)), 90,
               "a step at world size 1")
    assert op_env.status(name)["replicas"]["desired"] == 1
    op_env.kubectl("scale", "tj", name, "--replicas", "2")
    eventually(lambda: (r := [x for x in op_env.records(name) if x["event"] == "step"]) and r[-1]["world_size"] == 2
               and any(x["world_size"] == 1 for x in r), 120, "training at world size 2 again")
    status = op_env.wait_phase(name, "Succeeded", 180)
    assert status["step"] == 300 and status["replicas"]["desired"] == 2
    restores = [r for r in op_env.records(name) if r["event"] == "restore"]
    assert {(r["from_world_size"], r["world_size"]) for r in restores} >= {(2, 1), (1, 2)}


@pytest.mark.heavy
@pytest.mark.slow
def test_quick_changes_of_mind_are_no_restarts(op_env: OpEnv) -> None:
    """Scaled down then up again while the scaled-down pod is still terminating, then suspended and resumed while
    the suspended pods are: neither is a pod deleted by someone else. No restart is counted and the job Succeeds."""
    name = "changes"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name, **{"trainer.training.steps": 300,
                                                                      "replicas": {"min": 1, "max": 2}})))
    eventually(lambda: op_env.last_step(name) >= 40, 120, f"{name} to pass step 40", interval=0.05)

    def terminating() -> bool:
        return any(p["metadata"].get("deletionTimestamp") for p in op_env.pods(name))
    op_env.kubectl("scale", "tj", name, "--replicas", "1")
    eventually(terminating, 30, "worker 1 terminating", interval=0.05)
    op_env.kubectl("scale", "tj", name, "--replicas", "2")
    eventually(lambda: len([p for p in op_env.pods(name) if not p["metadata"].get("deletionTimestamp")]) == 2
               and op_env.status(name).get("phase") == "Running", 120, "two workers running again")
    op_env.kubectl("patch", "tj", name, "--type=merge", "-p", '{"spec": {"suspend": true}}')
    eventually(terminating, 30, "the suspended workers terminating", interval=0.05)
    op_env.kubectl("patch", "tj", name, "--type=merge", "-p", '{"spec": {"suspend": false}}')
    status = op_env.wait_phase(name, "Succeeded", 240)
    events = [f"{e['reason']}: {e['message']}" for e in op_env.events_of(name)]
    assert status["restarts"] == 0 and status["step"] == 300, "\n".join(events)
    assert not any(e["reason"] == "Restarting" for e in op_env.events_of(name))


@pytest.mark.slow
def test_an_edit_the_workers_do_not_see_is_said_and_applied_when_a_worker_is_replaced(op_env: OpEnv) -> None:
    """steps raised mid-run: the running workers keep their 200, SpecChanged says so (condition and Warning event,
    naming them and the fix). Worker 1 is then deleted: its replacement is not created beside worker 0 on the old
    spec -- every worker is created again with the new one (RecreatingWithNewSpec), one restart counted (the
    PodDeleted), and the job ends at step 300. (A suspend and resume applies it the same way: every pod anew.)"""
    name = "edited"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name)))
    eventually(lambda: op_env.last_step(name) >= 40, 120, f"{name} to pass step 40", interval=0.05)
    op_env.kubectl("patch", "tj", name, "--type=merge", "-p", '{"spec": {"trainer": {"training": {"steps": 300}}}}')
    changed = eventually(lambda: next((c for c in op_env.status(name).get("conditions", [])
                                       if c["type"] == "SpecChanged" and c["status"] == "True"), None), 30,
                         "the SpecChanged condition")
    assert f"{name}-worker-0" in changed["message"] and "suspend and resume" in changed["message"]
    assert "SpecChanged" in op_env.kubectl("describe", "tj", name).stdout
    op_env.kubectl("delete", "pod", f"{name}-worker-1", "--wait=false")
    status = op_env.wait_phase(name, "Succeeded", 240)
    events = [f"{e['reason']}: {e['message']}" for e in op_env.events_of(name)]
    assert status["step"] == 300 and status["restarts"] == 1, (status, events)
    assert status["lastRestartReason"] == "PodDeleted", status
    assert not any(c["type"] == "SpecChanged" and c["status"] == "True" for c in status["conditions"])
    assert sum(e.startswith("SpecChanged:") for e in events) == 1, events
    assert any(e.startswith("RecreatingWithNewSpec:") and "replica(s) 1 would have joined" in e
               for e in events), events


# paced: ~45 s at world size 1, longer than the shrink and the regrowth take on a loaded host
SHRINK_REGROW_STEPS = 800


def _steps(env: OpEnv, name: str, after: float = 0.0) -> list[dict[str, Any]]:
    return [r for r in env.records(name) if r["event"] == "step" and r["time"] > after]




@pytest.mark.heavy
@pytest.mark.slow
def test_lost_worker_shrinks_the_world_to_min_and_regrows_when_its_node_returns(op_env: OpEnv) -> None:
    """Elastic (replicas 1..2): worker 1's node is lost and its replacement cannot be scheduled (the other node is
    held by a NoSchedule taint that is no drain key: a cordon would drain the survivor ahead), so training goes on at
    world size 1; when the node returns the replacement starts and the world grows back to 2, and the job Succeeds."""
    name = "shrink-regrow"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name, **{
        "trainer.training.steps": SHRINK_REGROW_STEPS, "replicas": {"min": 1, "max": 2},
        # The survivor's collective with the frozen peer times out after 0.8 x progressTimeoutSeconds.
        "faultTolerance.progressTimeoutSeconds": 10, "faultTolerance.nodeFailureGraceSeconds": 3})))
    eventually(lambda: op_env.last_step(name) >= 40 and any(r["event"] == "checkpoint" for r in op_env.records(name)),
               120, f"{name} to pass step 40 and commit a checkpoint", interval=0.05)
    nodes = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in op_env.pods(name)}
    kept, lost = nodes[f"{name}-worker-0"], nodes[f"{name}-worker-1"]
    assert kept != lost
    # The survivor keeps running there; nothing new may land on it.
    op_env.kubectl("taint", "node", kept, f"{HOLD_TAINT}=true:NoSchedule")
    try:
        op_env.cluster.kubelet.lose_node(lost)
        lost_at = time.time()
        shrunk = eventually(lambda: [r for r in _steps(op_env, name, lost_at) if r["world_size"] == 1], 90,
                            "training at world size 1")
        status = eventually(lambda: (s := op_env.status(name)).get("worldSize") == 1 and s, 30, "status.worldSize 1")
        assert status["phase"] == "Running" and status["lastRestartReason"] == "NodeLost"
        true = {c["type"] for c in status["conditions"] if c["status"] == "True"}
        assert {"Running", "Degraded"} <= true and "Restarting" not in true
        replacement = next(p for p in op_env.pods(name) if p["metadata"]["name"] == f"{name}-worker-1")
        assert replacement["status"].get("phase") == "Pending" and not replacement["spec"].get("nodeName")
        eventually(lambda: any(c["type"] == "Unschedulable" and c["status"] == "True"
                               for c in op_env.status(name)["conditions"]), 30, "the Unschedulable condition")
        assert shrunk
        op_env.cluster.kubelet.restore_node(lost)
        regrown_at = time.time()
        eventually(lambda: (r := _steps(op_env, name, regrown_at)) and r[-1]["world_size"] == 2, 120,
                   "training at world size 2 again")
    finally:
        op_env.cluster.kubelet.restore_node(lost)
        op_env.kubectl("taint", "node", kept, f"{HOLD_TAINT}-")
    status = op_env.wait_phase(name, "Succeeded", 240)
    assert status["step"] == SHRINK_REGROW_STEPS and status["worldSize"] == 2 and status["restartBudget"]["used"] == 0
    restores = [r for r in op_env.records(name) if r["event"] == "restore"]
    assert {(r["from_world_size"], r["world_size"]) for r in restores} >= {(2, 1), (1, 2)}
    assert not any(c["type"] == "Unschedulable" and c["status"] == "True" for c in status["conditions"])


@pytest.mark.heavy
@pytest.mark.slow
def test_suspend_then_resume_continues_from_the_checkpoint(op_env: OpEnv) -> None:
    name = "pause"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name)))
    eventually(lambda: op_env.last_step(name) >= 40, 120, "pause to pass step 40", interval=0.05)
    op_env.kubectl("patch", "tj", name, "--type=merge", "-p", '{"spec": {"suspend": true}}')
    op_env.wait_phase(name, "Suspended", 60)
    eventually(lambda: op_env.pods(name) == [], 60, "the workers to stop")
    stopped_at = op_env.last_step(name)
    op_env.kubectl("patch", "tj", name, "--type=merge", "-p", '{"spec": {"suspend": false}}')
    restore = eventually(lambda: [r for r in op_env.records(name) if r["event"] == "restore"], 90,
                         "the resumed workers to restore")
    assert 0 < restore[-1]["step"] <= stopped_at
    # A restart request (what the REST API's restart sets): every worker once, from the last checkpoint.
    op_env.kubectl("annotate", "tj", name, "flywheel.dev/restart-requested-at=2026-11-22T09:00:00Z")
    eventually(lambda: op_env.status(name).get("restarts") == 1, 60, "the requested restart")
    status = op_env.wait_phase(name, "Succeeded", 180)
    assert status["step"] == LONG_STEPS and status["restarts"] == 1
    assert status["lastRestartReason"] == "RestartRequested"
    assert status["restartRequestHandled"] == "2026-11-22T09:00:00Z" and status["restartBudget"]["used"] == 0
    describe = op_env.kubectl("describe", "tj", name).stdout
    assert "Suspended" in describe and "Resumed" in describe and "RestartRequested" in describe


@pytest.mark.heavy
def test_a_job_deleted_and_applied_again_at_once_waits_for_the_old_pods_then_resumes(op_env: OpEnv) -> None:
    """`kubectl delete` then `kubectl apply` of the same YAML: the new job's pods have the old ones' names, so each
    is created once its namesake is gone (the old job's pods are never taken for the new one's: another owner),
    and the new job resumes from the checkpoints its spec names, with no restart counted."""
    name = "again"
    path = op_env.long_job_yaml(name)
    op_env.kubectl("apply", "-f", str(path))
    eventually(lambda: op_env.status(name).get("lastCheckpoint", {}).get("step", 0) >= 20, 120, "a checkpoint")
    old = op_env.job(name)["metadata"]["uid"]
    op_env.kubectl("delete", "tj", name, "--wait=false")
    # (an apply while the finalizer still holds the old job would only patch it, on a real cluster too)
    eventually(lambda: op_env.kubectl("get", "tj", name, check=False).returncode != 0, 30, "the old job to go")
    op_env.kubectl("apply", "-f", str(path))
    new = op_env.job(name)["metadata"]["uid"]
    assert new != old
    restore = eventually(lambda: [r for r in op_env.records(name) if r["event"] == "restore"], 120,
                         "the new job's workers to restore")
    assert restore[-1]["step"] >= 20
    status = op_env.wait_phase(name, "Succeeded", 180)
    assert status["step"] == LONG_STEPS and status["restarts"] == 0, status
    owners = {o["uid"] for p in op_env.pods(name) for o in p["metadata"]["ownerReferences"]}
    assert owners == {new}


@pytest.mark.heavy
def test_a_job_naming_an_unfinished_jobs_checkpoint_dir_waits_for_it_then_resumes_from_it(op_env: OpEnv) -> None:
    """A copied YAML that kept checkpoint.dir (same claim): the newer job creates no worker while the older one is
    unfinished (here suspended, so it cannot finish before the copy is looked at), with CheckpointDirInUse and a
    Warning event; once the older one finished it runs, resuming from its last checkpoint."""
    first, second = "owner", "copied"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(first)))
    eventually(lambda: op_env.last_step(first) >= 20, 120, f"{first} to pass step 20", interval=0.05)
    op_env.kubectl("patch", "tj", first, "--type=merge", "-p", '{"spec": {"suspend": true}}')
    op_env.wait_phase(first, "Suspended", 60)
    directory = op_env.job(first)["spec"]["checkpoint"]["dir"]
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(second, **{"trainer.training.steps": LONG_STEPS + 20,
                                                                 "checkpoint.dir": directory + "/"})))
    held = eventually(lambda: next((c for c in op_env.status(second).get("conditions", [])
                                    if c["type"] == "CheckpointDirInUse" and c["status"] == "True"), None), 60,
                      "the copied job to wait")
    assert f"in use by TrainingJob default/{first}" in held["message"], held
    assert op_env.status(second)["phase"] == "Pending" and op_env.pods(second) == []
    assert "CheckpointDirInUse" in op_env.kubectl("describe", "tj", second).stdout
    op_env.kubectl("patch", "tj", first, "--type=merge", "-p", '{"spec": {"suspend": false}}')
    assert op_env.wait_phase(first, "Succeeded", 180)["step"] == LONG_STEPS
    status = op_env.wait_phase(second, "Succeeded", 240)
    assert status["step"] == LONG_STEPS + 20 and status["restarts"] == 0, status
    assert status["lastRestore"]["step"] == LONG_STEPS, status  # resumed where the first job ended
    freed = next(c for c in status["conditions"] if c["type"] == "CheckpointDirInUse")
    assert freed["status"] == "False" and freed["reason"] == "CheckpointDirFree", freed


def test_a_job_on_a_deleted_jobs_checkpoint_dir_waits_for_its_stopping_pods(op_env: OpEnv) -> None:
    """A job deleted, another applied at once on its checkpoint dir: the deleted job's pods train on through their
    preStop hook, then write their emergency checkpoint. The new job creates no worker while any of them remains
    (CheckpointDirInUse), then resumes from that last checkpoint."""
    first, second = "leaving", "successor"
    hook = {"spec": {"containers": [{"name": "worker", "lifecycle": {"preStop": {"sleep": {"seconds": 6}}}}]}}
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(first, step_delay_s=IDLE_STEP_S, **{
        **LONG, "trainer.training.steps": 5000, "template": hook})))
    eventually(lambda: op_env.last_step(first) >= 30, 120, f"{first} to pass step 30", interval=0.05)
    events, directory = op_env.events_file(first), op_env.job(first)["spec"]["checkpoint"]["dir"]
    op_env.kubectl("delete", "tj", first, "--wait=false")
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(second, step_delay_s=IDLE_STEP_S, **{
        **LONG, "trainer.training.steps": 5000, "checkpoint.dir": directory})))
    eventually(lambda: op_env.pods(first) and all(p["metadata"].get("deletionTimestamp")
                                                  for p in op_env.pods(first)), 30, f"{first}'s pods to stop")
    said = set()
    while first in (jobs := op_env.jobs_with_pods(first, second)):
        assert second not in jobs, "the new job's workers started beside the stopping ones"
        said |= {c["message"] for c in op_env.status(second).get("conditions", [])
                 if c["type"] == "CheckpointDirInUse" and c["status"] == "True"}
        time.sleep(0.2)
    assert any(f"TrainingJob default/{first}" in message for message in said), said
    restore = eventually(lambda: [r for r in op_env.records(second) if r["event"] == "restore"], 120,
                         f"{second}'s workers to restore")
    saved = [json.loads(line) for line in events.read_text().splitlines() if line.strip()]
    assert restore[0]["step"] == max(r["step"] for r in saved if r["event"] == "checkpoint")  # the emergency save
    op_env.delete(second)


def test_deadline_fails_the_job_and_stops_the_workers(op_env: OpEnv) -> None:
    name = "deadline"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, step_delay_s=IDLE_STEP_S, **{
        **LONG, "trainer.training.steps": 5000, "runPolicy.activeDeadlineSeconds": 4})))
    status = op_env.wait_phase(name, "Failed", 60)
    failed = [c for c in status["conditions"] if c["type"] == "Failed"][0]
    assert failed["reason"] == "DeadlineExceeded"
    eventually(lambda: all(p["status"].get("phase") in ("Succeeded", "Failed") for p in op_env.pods(name)), 60,
               "the workers to stop")


def test_ttl_deletes_the_finished_job_and_the_finalizer_cleans_etcd(op_env: OpEnv) -> None:
    name = "ttl"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, **{"runPolicy.ttlSecondsAfterFinished": 2})))
    job = eventually(lambda: "flywheel.dev/cleanup" in ((j := op_env.job(name))["metadata"].get("finalizers") or [])
                     and j, 30, "kopf's finalizer")
    run_id = f"default-{name}-{job['metadata']['uid'][:8]}"
    eventually(lambda: _etcd_keys(op_env, keys.rdzv_prefix(run_id)) > 0, 60, "the rendezvous keys")
    op_env.wait_phase(name, "Succeeded", 120)
    eventually(lambda: op_env.kubectl("get", "tj", name, check=False).returncode != 0, 30, "the TTL deletion")
    assert _etcd_keys(op_env, keys.rdzv_prefix(run_id)) == 0
    eventually(lambda: op_env.pods(name) == [], 30, "garbage collection of the pods")


def test_a_job_deleted_while_the_operator_is_down_has_its_etcd_keys_deleted_on_restart(op_env: OpEnv) -> None:
    """No daemon runs a job deleted while the operator is down: its index handler sees it deleting (kopf's
    finalizer holds it) and the keys go before kopf lets it go."""
    name = "deleted-while-down"
    op_env.kubectl("apply", "-f", str(op_env.long_job_yaml(name)))
    job = op_env.job(name)
    run_id = f"default-{name}-{job['metadata']['uid'][:8]}"
    eventually(lambda: _etcd_keys(op_env, keys.rdzv_prefix(run_id)) > 0, 60, "the rendezvous keys")
    op_env.operator.stop()
    try:
        op_env.kubectl("delete", "tj", name, "--wait=false")
        assert op_env.job(name)["metadata"].get("deletionTimestamp")  # held by the finalizer meanwhile
    finally:
        op_env.operator.start()
    eventually(lambda: op_env.kubectl("get", "tj", name, check=False).returncode != 0, 60, "the job to go")
    eventually(lambda: _etcd_keys(op_env, keys.rdzv_prefix(run_id)) == 0, 30, "its rendezvous keys to go")


def test_a_hugging_face_script_with_a_killed_rank_shows_its_restart_and_reason(op_env: OpEnv) -> None:
    """A user's Trainer script (examples/scripts/hf_trainer.py) as the job's command: a rank SIGKILLed after the
    first checkpoint is restarted in place by its agent, and the job says so where the user looks."""
    env = [{"name": "HF_STEPS", "value": "40"}, {"name": "HF_SAVE_STEPS", "value": "10"}]
    path = op_env.job_yaml("hf-script", command=["examples/scripts/hf_trainer.py"],
                           **{"faultTolerance.restartScope": "worker",
                              # a restarted rank imports transformers again: a minute on a loaded machine, no hang
                              "faultTolerance.progressTimeoutSeconds": 300,
                              "template": {"spec": {"containers": [{"name": "worker", "env": env}]}}})
    op_env.kubectl("apply", "-f", str(path))
    eventually(lambda: (op_env.status("hf-script").get("lastCheckpoint") or {}).get("step", 0) >= 10, 180,
               "the script's first checkpoint (through its FlywheelCallback)")
    every = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    ranks = procs.with_env(procs.with_env(every, "FLYWHEEL_JOB", "default/hf-script"), "RANK", "1")
    assert ranks, "rank 1's process"
    for pid in ranks:
        procs.signal_quietly(pid, signal.SIGKILL)
    op_env.wait_phase("hf-script", "Succeeded", 240)
    status = op_env.status("hf-script")
    assert status["restarts"] >= 1 and status["lastRestartReason"] == "RankRestarted", status
    assert status["step"] == 40 and status["lastCheckpoint"]["step"] == 40, status
    described = op_env.kubectl("describe", "tj", "hf-script").stdout
    assert "RankRestarted" in described and "rank 1: killed by SIGKILL" in described, described


def test_gang_jobs_get_a_podgroup(op_env: OpEnv) -> None:
    op_env.kubectl("apply", "-f", str(PODGROUP_CRD))  # the published schema: a field the operator misnames fails
    op_env.operator.restart("--gang-scheduler", "scheduler-plugins")
    try:
        op_env.kubectl("apply", "-f", str(op_env.job_yaml("gang")))
        group = eventually(lambda: json.loads(op_env.kubectl("get", "podgroups.scheduling.x-k8s.io", "gang", "-o",
                                                             "json", check=False).stdout or "null"), 30, "a PodGroup")
        assert group["spec"]["minMember"] == 2 and group["metadata"]["ownerReferences"][0]["name"] == "gang"
        pods = eventually(lambda: len(p := op_env.pods("gang")) == 2 and p, 30, "the pods")
        for p in pods:
            assert p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "gang"
            assert p["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
        op_env.wait_phase("gang", "Succeeded", 120)
    finally:
        op_env.operator.restart()


def test_operator_serves_the_rest_api_with_a_flag(op_env: OpEnv) -> None:
    """The REST API in the operator's process acts on a job only through its TrainingJob; each action shows in
    `kubectl get tj` (PHASE, RESTARTS, DESIRED), and the job's checkpoints arrive in its timeline over time."""
    import httpx

    from tests.operator.conftest import _free_port

    port, tokens = _free_port(), op_env.tmp / "api-tokens.csv"
    tokens.write_text("op-admin-token,alice,u1\n")
    op_env.operator.restart("--api-port", str(port), "--api-host", "127.0.0.1", "--api-token-file", str(tokens))
    try:
        # Elastic, and long enough to outlive every action below (it is deleted at the end).
        op_env.kubectl("apply", "-f", str(op_env.job_yaml("served", step_delay_s=IDLE_STEP_S, **{
            **LONG, "trainer.training.steps": 20000, "replicas": {"min": 1, "max": 2}})))
        base, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer op-admin-token"}

        def get(path: str) -> Any:
            try:
                resp = httpx.get(base + path, headers=auth, timeout=5)
            except httpx.TransportError:
                return None
            return resp.json() if resp.status_code == 200 else None

        def act(method: str, action: str, **body: Any) -> dict[str, Any]:
            resp = httpx.request(method, f"{base}/v1/jobs/default/served/{action}", headers=auth, timeout=10,
                                 **({"json": body} if body else {}))
            assert resp.status_code == 200, resp.text
            return dict(resp.json())

        def columns() -> dict[str, str]:  # `kubectl get tj`, as a person reads it
            header, row = op_env.kubectl("get", "tj", "served").stdout.splitlines()[:2]
            return dict(zip(header.split(), row.split()))

        detail = eventually(lambda: (d := get("/v1/jobs/default/served")) and d["phase"] == "Running" and d,
                            60, "the job through the operator's API")
        served = [(w["pod"], w["firstRank"]) for w in detail["workers"]]
        assert served == [("served-worker-0", 0), ("served-worker-1", 1)]
        assert httpx.get(base + "/v1/jobs", timeout=5).status_code == 401
        act("POST", "suspend")
        op_env.wait_phase("served", "Suspended", 60)
        assert columns()["PHASE"] == "Suspended"
        act("POST", "resume")
        eventually(lambda: columns()["PHASE"] == "Running", 60, "kubectl get tj to show the resumed job Running")
        assert columns()["RESTARTS"] == "0" and columns()["DESIRED"] == "2"
        # Restart: every worker once from the last checkpoint; the RESTARTS column counts it.
        requested = act("POST", "restart")["job"]["restartRequestedAt"]
        assert requested  # pending until the operator serves it
        eventually(lambda: columns()["RESTARTS"] == "1", 60, "kubectl get tj to count the requested restart")
        assert op_env.status("served")["lastRestartReason"] == "RestartRequested"
        assert eventually(lambda: (d := get("/v1/jobs/default/served")) and d["restartRequestedAt"] is None, 30,
                          "the request served")
        eventually(lambda: columns()["PHASE"] == "Running", 90, "the restarted job Running")
        # Scale the elastic job to one worker: DESIRED follows, the second worker goes.
        assert act("PATCH", "scale", replicas=1)["job"]["spec"]["replicasTarget"] == 1
        eventually(lambda: columns()["DESIRED"] == "1", 30, "kubectl get tj to show DESIRED 1")
        eventually(lambda: [p["metadata"]["name"] for p in op_env.pods("served")] == ["served-worker-0"], 60,
                   "worker 1 to go")
        assert columns()["RESTARTS"] == "1"  # a scale is no restart
        # Checkpoints over time: one CheckpointCommitted event per 30 s at most, each a timeline entry.
        def checkpoint_entries() -> list[dict[str, Any]]:
            items = (get("/v1/jobs/default/served/timeline") or {}).get("items", [])
            found = [i for i in items if i["kind"] == "checkpoint" and i["reason"] == "CheckpointCommitted"]
            return found if len(found) >= 2 else []
        entries = eventually(checkpoint_entries, 90, "two checkpoint events in the timeline")
        assert entries[0]["step"] < entries[-1]["step"] and entries[0]["time"] < entries[-1]["time"]
    finally:
        op_env.delete("served")
        op_env.operator.restart()
