"""The process kubelet on the real control plane: pods bound by kube-scheduler run as local processes, report phase,
exit codes and termination messages through `pods/status`, die on deletion within their grace period, and a lost
node leaves its pods Terminating until they are force-deleted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests.cluster.cluster import TestCluster
from tests.k8s.kubelet_pods import REPO, core_api, gone, phase_is
from tests.rank_processes import alive, process_state
from tests.waiting import eventually as wait_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def core(cluster: TestCluster) -> Iterator[client.CoreV1Api]:
    yield from core_api(cluster)


def pod(name: str, code: str, restart: str = "Never", grace: int = 30, node: str | None = None,
        env: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"restartPolicy": restart, "terminationGracePeriodSeconds": grace,
                            "containers": [{"name": "main", "image": "python:3.11",
                                            "command": ["python", "-c", code], "env": env or []}]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": "demo"},
                                                            "annotations": {"team": "ml"}}, "spec": spec}


def test_pod_runs_to_succeeded_with_env_and_logs(core: client.CoreV1Api) -> None:
    env = [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
           {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
           {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['team']"}}},
           {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
           {"name": "GREETING", "value": "hi $(POD)"}]
    code = "import os; print(*(os.environ[k] for k in ('POD', 'NS', 'APP', 'TEAM', 'IP', 'GREETING')), os.getcwd())"
    core.create_namespaced_pod("default", pod("ok", code, env=env))
    done = wait_for(phase_is(core, "ok", "Succeeded"), 30, what="Succeeded")
    terminated = done.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (0, "Completed")
    assert done.spec.node_name in ("node-1", "node-2") and done.status.pod_ip == "127.0.0.1"
    # The log comes through the API server from the kubelet's /containerLogs.
    assert core.read_namespaced_pod_log("ok", "default") == f"ok default demo ml 127.0.0.1 hi ok {REPO}\n"
    reasons = [e.reason for e in core.list_namespaced_event("default", field_selector="involvedObject.name=ok").items]
    assert {"Scheduled", "Started"} <= set(reasons)  # kube-scheduler's and the kubelet's


def test_failing_pod_reports_its_exit_code(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod("default", pod("fails", "import sys; sys.exit(3)"))
    failed = wait_for(phase_is(core, "fails", "Failed"), 30, what="Failed")
    terminated = failed.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (3, "Error")


def test_the_termination_message_is_the_file_or_the_log_tail_on_error(core: client.CoreV1Api) -> None:
    written = pod("says", "import os, sys; open(os.environ['MSG'], 'w').write('ValueError: no'); sys.exit(1)",
                  env=[{"name": "MSG", "value": "/dev/termination-log"}])
    quiet = pod("quiet", "import sys; print('line 1'); print('ImportError: x'); sys.exit(2)")
    quiet["spec"]["containers"][0]["terminationMessagePolicy"] = "FallbackToLogsOnError"
    silent = pod("silent", "import sys; print('no message without the policy'); sys.exit(2)")
    for body in (written, quiet, silent):
        core.create_namespaced_pod("default", body)
    messages = {name: wait_for(phase_is(core, name, "Failed"), 30, what="Failed").status.container_statuses[0]
                .state.terminated.message for name in ("says", "quiet", "silent")}
    assert messages == {"says": "ValueError: no", "quiet": "line 1\nImportError: x", "silent": None}


def test_on_failure_restarts_in_place(core: client.CoreV1Api, tmp_path: Path) -> None:
    marker = tmp_path / "tried"
    code = (f"import pathlib, sys; m = pathlib.Path({str(marker)!r}); first = not m.exists(); m.touch(); "
            "sys.exit(5 if first else 0)")
    core.create_namespaced_pod("default", pod("retry", code, restart="OnFailure"))
    done = wait_for(phase_is(core, "retry", "Succeeded"), 30, what="Succeeded after a restart")
    status = done.status.container_statuses[0]
    assert status.restart_count == 1 and status.last_state.terminated.exit_code == 5


def test_oom_hook_reports_oomkilled(cluster: TestCluster, core: client.CoreV1Api) -> None:
    assert cluster.kubelet is not None
    kubelet = cluster.kubelet
    core.create_namespaced_pod("default", pod("hog", "import time; time.sleep(60)"))
    wait_for(lambda: kubelet.pid_of("default", "hog"), 30, what="process start")
    assert kubelet.oom_kill("default", "hog")
    failed = wait_for(phase_is(core, "hog", "Failed"), 30, what="Failed")
    terminated = failed.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (137, "OOMKilled")


def test_delete_sends_sigterm_then_sigkill_after_grace(cluster: TestCluster, core: client.CoreV1Api,
                                                       tmp_path: Path) -> None:
    assert cluster.kubelet is not None
    kubelet = cluster.kubelet
    marker, ready = tmp_path / "term", tmp_path / "ready"
    code = (f"import pathlib, signal, time\n"
            f"signal.signal(signal.SIGTERM, lambda *a: pathlib.Path({str(marker)!r}).write_text('TERM'))\n"
            f"pathlib.Path({str(ready)!r}).touch()\n"
            "while True: time.sleep(0.05)")
    core.create_namespaced_pod("default", pod("stubborn", code, grace=1))
    wait_for(phase_is(core, "stubborn", "Running"), 30, what="Running")
    # Running means the process exists, not that Python has installed its handler yet (slow under load).
    wait_for(ready.exists, 30, what="handler installed")
    pid = wait_for(lambda: kubelet.pid_of("default", "stubborn"), what="pid")
    started = time.monotonic()
    core.delete_namespaced_pod("stubborn", "default")
    assert core.read_namespaced_pod("stubborn", "default").metadata.deletion_timestamp is not None
    wait_for(marker.exists, what="SIGTERM handled")
    wait_for(gone(core, "stubborn"), 30, what="pod removed")
    assert time.monotonic() - started >= 0.9  # it ignored SIGTERM, so only SIGKILL after the grace ended it
    wait_for(lambda: not alive(pid), what="process dead")


def test_pod_finalizer_holds_a_terminated_pod(cluster: TestCluster, core: client.CoreV1Api) -> None:
    assert cluster.kubelet is not None
    kubelet = cluster.kubelet
    body = pod("held", "import time; time.sleep(60)", grace=5)
    body["metadata"]["finalizers"] = ["flywheel.dev/keep"]
    core.create_namespaced_pod("default", body)
    pid = wait_for(lambda: kubelet.pid_of("default", "held"), 30, what="pid")
    core.delete_namespaced_pod("held", "default")
    wait_for(lambda: not alive(pid), what="SIGTERM kills the sleeper")
    # The kubelet's final delete (grace 0) leaves the pod to its finalizer, terminal.
    held = wait_for(lambda: (p := core.read_namespaced_pod("held", "default")).metadata
                    .deletion_grace_period_seconds == 0 and p, what="kubelet's final delete")
    assert held.status.phase in ("Succeeded", "Failed")
    core.patch_namespaced_pod("held", "default", {"metadata": {"finalizers": None}})
    wait_for(gone(core, "held"), what="removal after the finalizer")


def test_each_node_has_its_own_dev_shm(core: client.CoreV1Api) -> None:
    """Host memory is per node, as on a cluster: a pod sees what another pod on its node left in /dev/shm, never
    what a pod on another node did (the memory tier's own copies and peer replicas depend on it)."""
    write = "open('/dev/shm/fw-shm-probe', 'w').write('here')"
    look = "import os; print(os.path.exists('/dev/shm/fw-shm-probe'))"
    core.create_namespaced_pod("default", pod("shm-writer", write, node="node-1"))
    wait_for(phase_is(core, "shm-writer", "Succeeded"), 30, what="the writer done")
    assert not Path("/dev/shm/fw-shm-probe").exists()  # not in the machine's own /dev/shm either
    for name, node in (("shm-same", "node-1"), ("shm-other", "node-2")):
        core.create_namespaced_pod("default", pod(name, look, node=node))
    for name, seen in (("shm-same", "True"), ("shm-other", "False")):
        wait_for(phase_is(core, name, "Succeeded"), 30, what=f"{name} done")
        assert core.read_namespaced_pod_log(name, "default").strip() == seen, name


def _ready_condition(core: client.CoreV1Api, node: str) -> str:
    return str(next(c.status for c in core.read_node(node).status.conditions if c.type == "Ready"))


def test_lost_node_leaves_pods_terminating_until_force_deleted(cluster: TestCluster,
                                                               core: client.CoreV1Api) -> None:
    """Last in the module: it takes node-1 away for a while."""
    assert cluster.kubelet is not None
    kubelet = cluster.kubelet
    core.create_namespaced_pod("default", pod("stranded", "import time; time.sleep(120)", grace=1, node="node-1"))
    wait_for(phase_is(core, "stranded", "Running"), 30, what="Running")
    pid = wait_for(lambda: kubelet.pid_of("default", "stranded"), what="pid")
    kubelet.lose_node("node-1")
    # Frozen, like a dead machine. The stop takes effect when the target next runs: under load, not at once.
    wait_for(lambda: process_state(pid) == "T", what="the pod's process stopped")

    def node_unknown() -> bool:
        node = core.read_node("node-1")
        ready = next(c for c in node.status.conditions if c.type == "Ready")
        return ready.status == "Unknown" and any(t.key == "node.kubernetes.io/unreachable"
                                                 for t in node.spec.taints or [])

    wait_for(node_unknown, 30, what="node Ready=Unknown (the node-lifecycle controller)")
    core.delete_namespaced_pod("stranded", "default")
    time.sleep(2.0)  # twice the grace period: a live kubelet would have finished by now
    stuck = core.read_namespaced_pod("stranded", "default")
    assert stuck.metadata.deletion_timestamp is not None
    # The node-lifecycle controller marks the pods of an unreachable node not Ready.
    wait_for(lambda: next(c for c in core.read_namespaced_pod("stranded", "default").status.conditions
                          if c.type == "Ready").status == "False", 15, what="the stranded pod not Ready")
    core.delete_namespaced_pod("stranded", "default", grace_period_seconds=0)
    wait_for(gone(core, "stranded"), what="force delete")
    assert alive(pid)  # nobody on the dead node has killed it yet
    kubelet.restore_node("node-1")
    wait_for(lambda: not alive(pid), 15, what="orphan killed after restore")
    wait_for(lambda: _ready_condition(core, "node-1") == "True", 30, what="node-1 Ready again")
