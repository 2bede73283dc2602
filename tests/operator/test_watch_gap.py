"""A pod deleted while the operator's watches were down leaves its caches at the relist (operator/watch_relist.py).

The test cluster holds the operator's requests at its fault proxy and ends every watch, then deletes a worker pod
with no watcher to tell, restarts kube-apiserver (its watch cache then starts at etcd's newest revision) and
compacts etcd: kopf's watches reconnect, get 410 Gone (resource version too old, as after any API server restart)
and list again. kopf alone never drops the pod from its index (it waits for a DELETED event), so the runner would
wait for that ghost forever; with the relist reconciled the pod is missed and replaced.
"""

from __future__ import annotations

import pytest

from tests.operator.conftest import IDLE_STEP_S, OpEnv, eventually


def _lose_pod_in_a_watch_gap(env: OpEnv, name: str) -> None:
    api, plane = env.cluster.api, env.cluster.control_plane
    assert api is not None
    api.pause()
    try:
        api.drop_watches()
        plane.request(f"/api/v1/namespaces/default/pods/{name}", "DELETE", {"gracePeriodSeconds": 0})
        api.restart("kube-apiserver")
        api.compact()
    finally:
        api.resume()


@pytest.mark.heavy
def test_a_pod_deleted_in_a_watch_gap_leaves_the_caches_and_is_replaced(op_env: OpEnv) -> None:
    env = op_env
    name = "watch-gap"
    env.kubectl("apply", "-f", str(env.job_yaml(name, step_delay_s=IDLE_STEP_S, **{
        "replicas.min": 1, "replicas.max": 1, "trainer.training.steps": 100000,
        "faultTolerance.progressTimeoutSeconds": 0, "faultTolerance.firstStepTimeoutSeconds": 900})))
    try:
        (victim,) = eventually(lambda: [p for p in env.pods(name) if p.get("status", {}).get("phase") == "Running"],
                               180, "the worker pod Running", interval=0.5)
        env.wait_phase(name, "Running", 120)
        _lose_pod_in_a_watch_gap(env, victim["metadata"]["name"])
        eventually(lambda: {p["metadata"]["uid"] for p in env.pods(name)} - {victim["metadata"]["uid"]}, 60,
                   "a replacement for the pod lost in the watch gap")
        log = env.operator.log_path.read_text()
        assert "relisted pods cluster-wide: dropping 1 deleted while the watch was down" in log, log[-3000:]
    finally:
        env.delete(name)
