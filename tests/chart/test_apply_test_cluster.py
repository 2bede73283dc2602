"""The rendered chart installed on the test cluster (the real control plane, the process kubelet, an etcd for
rendezvous) with the real kubectl, as on a real cluster: `helm template --include-crds | kubectl apply -f -`.

Every rendered object is applied: the CRD, the ServiceAccount, RBAC (enforced: the operator is authorized by the
chart's grants alone), ConfigMaps and the operator's Deployment. kube-controller-manager's deployment and replicaset
controllers create the operator pod from the Deployment's template and the process kubelet runs it: no image is
pulled, the container's `args` follow the image's ENTRYPOINT (`flywheel`), and the pod reaches the API through its
service account's bound token ($KUBECONFIG written by the kubelet: there is no /var/run/secrets mount). The values are
the defaults plus what one shared host needs: the test cluster's etcd (etcd.externalEndpoints: the chart's etcd
StatefulSet is not rendered), free ports for the operator's metrics and liveness endpoints (all pods share
127.0.0.1), no worker metrics port, one torch thread per worker, and an events directory on the host
(`operator.eventsDir`: volumes are not mounted, so its mountPath is a host path; its claim is bound to a volume of its
own). examples/operator-tiny.yaml, applied as NOTES.txt says, runs to Succeeded, and the API server's audit log shows
that the pod's ServiceAccount was refused nothing; deleting the release's objects takes the operator pod with them
(garbage collection through its owner reference)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from flywheel.local.procs import descendants
from tests.chart import rbac
from tests.chart.conftest import CHART, KUBE_VERSION, NAMESPACE, RELEASE, ROOT, find_tool, run_helm
from tests.cluster.fixtures import start_cluster
from tests.waiting import eventually

KUBECTL = find_tool("kubectl")
OPERATOR = f"{RELEASE}-flywheel-operator"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(what: str, check: Callable[[], Any], timeout: float, describe: Callable[[], str] = str) -> Any:
    """tests/waiting.eventually, with what the cluster looked like when it timed out."""
    try:
        return eventually(check, timeout, what, interval=0.3)
    except AssertionError as err:
        raise AssertionError(f"{what} within {timeout}s: {describe()}") from err


class Env:
    def __init__(self, cluster: Any, tmp: Path, ports: dict[str, int], manifest: Path) -> None:
        self.cluster, self.tmp, self.ports, self.manifest = cluster, tmp, ports, manifest
        self.docs = [d for d in yaml.safe_load_all(manifest.read_text()) if d]

    def kubectl(self, *args: str, stdin: str | None = None, timeout: float = 30) -> str:
        result = subprocess.run([str(KUBECTL), "--kubeconfig", str(self.cluster.kubeconfig), *args], input=stdin,
                                capture_output=True, text=True, timeout=timeout)
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout

    def operator_pods(self) -> list[dict[str, Any]]:
        dep = next(d for d in self.docs if d["kind"] == "Deployment" and d["metadata"]["name"] == OPERATOR)
        selector = ",".join(f"{k}={v}" for k, v in dep["spec"]["selector"]["matchLabels"].items())
        return json.loads(self.kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json"))["items"]

    def wait_live(self, url: str) -> None:
        def answers() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    return r.status == 200 and r.headers["Content-Type"].startswith("application/json")
            except OSError:
                return False

        wait_for(f"{url} answers", answers, 60, self.operator_log)

    def operator_log(self) -> str:
        logs = sorted(self.cluster.log_dir.glob(f"{NAMESPACE}_{OPERATOR}-*.log"), key=lambda p: p.stat().st_mtime)
        return logs[-1].read_text()[-3000:] if logs else "(no operator pod log)"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    if KUBECTL is None:
        pytest.skip("kubectl not found (make tools)")
    tmp = tmp_path_factory.mktemp("chart-cluster")
    events = tmp / "events"
    events.mkdir()
    ports = {"metrics": free_port(), "liveness": free_port()}
    with start_cluster(tmp / "cluster", nodes=2, etcd=True, node_monitor_grace_seconds=3.0,
                       heartbeat_seconds=0.5) as cluster:
        etcd = urlparse(cluster.etcd_url)
        rendered = run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
                            "--include-crds", "--set", "etcd.enabled=false",
                            "--set", f"etcd.externalEndpoints={{{etcd.hostname}:{etcd.port}}}",
                            "--set", f"operator.metricsPort={ports['metrics']}",
                            "--set", f"operator.livenessPort={ports['liveness']}",
                            "--set", "operator.workerMetricsPortBase=0",
                            "--set", "operator.workerEnv.OMP_NUM_THREADS=1",
                            "--set", "operator.eventsDir.existingClaim=flywheel-events",
                            "--set", f"operator.eventsDir.mountPath={events}").stdout
        manifest = tmp / "flywheel.yaml"
        manifest.write_text(rendered)
        yield Env(cluster, tmp, ports, manifest)


@pytest.mark.slow
def test_chart_installs_with_kubectl_and_runs_the_example_to_succeeded(env: Env):
    kinds = {d["kind"] for d in env.docs}
    assert {"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
            "Deployment"} <= kinds
    assert "StatefulSet" not in kinds  # etcd.enabled=false: the test cluster's etcd instead
    mark = env.cluster.control_plane.audit.mark()  # who asked for what from here on: the API server's audit log
    env.kubectl("create", "namespace", NAMESPACE)
    for claim in ("flywheel-events", "flywheel-ckpt"):  # the operator's events volume; the example's checkpoints
        env.cluster.add_claim(claim, namespace=NAMESPACE)
    applied = env.kubectl("apply", "-f", str(env.manifest))
    assert f"deployment.apps/{OPERATOR} created" in applied, applied
    for doc in env.docs:  # everything is served and stored
        ns, group = doc["metadata"].get("namespace"), doc["apiVersion"].rpartition("/")[0]
        env.kubectl("get", doc["kind"].lower() + (f".{group}" if group else ""), doc["metadata"]["name"],
                    *(["-n", ns] if ns else []))
    again = env.kubectl("apply", "-f", str(env.manifest)).splitlines()
    assert len(again) == len(env.docs) and all(line.endswith(" unchanged") for line in again), again

    # The Deployment's pod: Running, its liveness endpoint answers, `kubectl rollout status` is satisfied.
    env.kubectl("rollout", "status", f"deployment/{OPERATOR}", "-n", NAMESPACE, "--timeout=60s", timeout=70)
    (pod,) = env.operator_pods()
    assert pod["status"]["phase"] == "Running"
    (owner,) = pod["metadata"]["ownerReferences"]  # the Deployment's ReplicaSet, as on any cluster
    replica_set = json.loads(env.kubectl("get", "replicaset", owner["name"], "-n", NAMESPACE, "-o", "json"))
    assert owner["kind"] == "ReplicaSet" and replica_set["metadata"]["ownerReferences"][0]["name"] == OPERATOR
    (container,) = pod["spec"]["containers"]
    assert "command" not in container and container["args"][0] == "operator"  # the image's ENTRYPOINT runs it
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == env.ports
    for probe in (container["livenessProbe"]["httpGet"], container["readinessProbe"]["httpGet"]):
        env.wait_live(f"http://127.0.0.1:{ports[probe['port']]}{probe['path']}")
    with urllib.request.urlopen(f"http://127.0.0.1:{env.ports['metrics']}/metrics", timeout=5) as r:
        assert b"flywheel_operator_jobs" in r.read()
    pid = env.cluster.kubelet.pid_of(NAMESPACE, pod["metadata"]["name"])
    assert pid is not None

    # The example job, as NOTES.txt says to apply it.
    job = yaml.safe_load((ROOT / "examples" / "operator-tiny.yaml").read_text())
    job["spec"]["checkpoint"]["dir"] = str(env.tmp / "ckpt")  # /ckpt on a real cluster (a shared volume)
    env.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(job))

    def finished() -> dict[str, Any] | None:
        obj = json.loads(env.kubectl("get", "tj", "op-tiny", "-n", NAMESPACE, "-o", "json"))
        status = obj.get("status") or {}
        assert status.get("phase") != "Failed", status
        assert env.cluster.kubelet.pid_of(NAMESPACE, pod["metadata"]["name"]) == pid, env.operator_log()
        return status if status.get("phase") == "Succeeded" else None

    status = wait_for("op-tiny Succeeded", finished, 150, env.operator_log)
    assert status["step"] == job["spec"]["trainer"]["training"]["steps"], status  # from the workers' event logs
    table = env.kubectl("get", "tj", "-n", NAMESPACE).splitlines()
    assert table[1].split()[:2] == ["op-tiny", "Succeeded"]
    # The pod called the API as the Deployment's ServiceAccount, and the chart's RBAC allows all it asked for
    # (test_rbac_recorded.py checks the converse: no grant goes unused).
    account = pod["spec"]["serviceAccountName"]
    recorded = env.cluster.control_plane.audit.since(mark)
    user = f"system:serviceaccount:{NAMESPACE}:{account}"
    requests = recorded.of(user)
    assert ("watch", "flywheel.dev", "trainingjobs", NAMESPACE) in requests
    assert rbac.missing(rbac.grants_for(env.docs, account, NAMESPACE), requests) == []
    assert not recorded.refused(user), recorded.refused(user)  # the real authorizer agrees

    # Uninstall. The job first, while the operator runs to remove its finalizer (on a real cluster a CRD's deletion
    # waits for its objects, and a finalizer nobody removes holds them); then the release's objects: the operator
    # pod goes with its Deployment (ownerReference GC; SIGTERM to the process).
    env.kubectl("delete", "tj", "op-tiny", "-n", NAMESPACE, "--wait=true", timeout=40)

    # A new template rolls out by the chart's Recreate strategy: the old operator has stopped before the new pod
    # exists, so two operators never act at once. The old pod's object may outlive its process for a moment (the
    # deployment controller waits for a terminal phase, not for the object's removal). The new template's probes
    # are the chart's, made quick (a startup probe holds the liveness probe until the operator answers).
    old = pod["metadata"]["name"]
    env.kubectl("patch", "deployment", OPERATOR, "-n", NAMESPACE, "-p", json.dumps(QUICK_PROBES))

    def replaced() -> dict[str, Any] | None:
        pods = env.operator_pods()
        new = next((p for p in pods if p["metadata"]["name"] != old), None)
        if new is not None:
            for gone in (p for p in pods if p["metadata"]["name"] == old):
                assert gone["status"].get("phase") in ("Succeeded", "Failed"), [p["status"] for p in pods]
                assert env.cluster.kubelet.pid_of(NAMESPACE, old) is None, "the old operator still runs"
        return new

    pod = wait_for("a new operator pod", replaced, 40, lambda: str(env.operator_pods()))
    env.kubectl("rollout", "status", f"deployment/{OPERATOR}", "-n", NAMESPACE, "--timeout=60s", timeout=70)
    env.wait_live(f"http://127.0.0.1:{env.ports['liveness']}/healthz")
    _a_hung_operator_is_restarted_by_its_liveness_probe(env, pod["metadata"]["name"])
    env.kubectl("delete", "-f", str(env.manifest), "--wait=true", timeout=60)
    wait_for("the operator pod deleted", lambda: not env.operator_pods(), 40, lambda: str(env.operator_pods()))
    assert env.cluster.kubelet.pid_of(NAMESPACE, pod["metadata"]["name"]) is None
    assert "trainingjobs.flywheel.dev" not in env.kubectl("get", "crd")


# The chart's probes with seconds a test can wait for (a hang is seen within ~3 x (1 + 2) s, yet 2 s answers a busy
# loop on 2 loaded cores); the startup probe lets the liveness probe start at once.
_QUICK = {"periodSeconds": 1, "timeoutSeconds": 2}
QUICK_PROBES = {"spec": {"template": {"spec": {"containers": [{
    "name": "operator",
    "startupProbe": {"httpGet": {"path": "/healthz", "port": "liveness"}, "failureThreshold": 120, **_QUICK},
    "livenessProbe": {"initialDelaySeconds": 0, "failureThreshold": 3, "terminationGracePeriodSeconds": 1, **_QUICK},
    "readinessProbe": _QUICK}]}}}}


def _a_hung_operator_is_restarted_by_its_liveness_probe(env: Env, name: str) -> None:
    """The operator's event loop stops (SIGSTOP, as a deadlock would): kopf's liveness endpoint, served from that
    loop, stops answering, the kubelet kills the container and starts it again, and the new process serves."""
    def container() -> dict[str, Any]:
        pod = json.loads(env.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "json"))
        return (pod["status"].get("containerStatuses") or [{}])[0]

    restarts = container()["restartCount"]
    pid = env.cluster.kubelet.pid_of(NAMESPACE, name)
    assert pid is not None
    for hung in (pid, *descendants(pid)):
        os.kill(hung, signal.SIGSTOP)
    wait_for("the hung operator restarted",
             lambda: container()["restartCount"] == restarts + 1 and container()["ready"], 60, lambda: str(container()))
    events = json.loads(env.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                                    f"involvedObject.name={name}", "-o", "json"))["items"]
    assert "Container operator failed liveness probe, will be restarted" in [
        e["message"] for e in events if e["reason"] == "Killing"], events
    assert env.cluster.kubelet.pid_of(NAMESPACE, name) not in (None, pid)
    env.wait_live(f"http://127.0.0.1:{env.ports['liveness']}/healthz")

