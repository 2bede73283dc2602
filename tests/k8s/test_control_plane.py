"""The test cluster's control plane is the real one: its version, its authorizer and admission, its controllers
acting on what the process kubelet reports (Leases, pods, a lost node), and `kubectl logs` through the API server
to the kubelet."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.binary import kubernetes_version
from tests.cluster.cluster import TestCluster
from tests.waiting import eventually

REPO = Path(__file__).resolve().parents[2]
KUBECTL = REPO / ".tools" / "bin" / "kubectl"

pytestmark = pytest.mark.slow


def kubectl(cluster: TestCluster, *args: str, check: bool = True, stdin: str | None = None) -> str:
    result = subprocess.run([str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), *args], capture_output=True,
                            text=True, timeout=60, input=stdin)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result.stdout + (result.stderr if not check else "")


def get(cluster: TestCluster, *args: str) -> Any:
    return json.loads(kubectl(cluster, "get", *args, "-o", "json"))


def pod(name: str, command: list[str], **spec: Any) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
        "containers": [{"name": "main", "image": "python:3.11", "command": command}], **spec}})


def test_the_server_is_the_release_built_from_the_go_modules(cluster: TestCluster) -> None:
    version = json.loads(kubectl(cluster, "version", "-o", "json"))
    assert version["serverVersion"]["gitVersion"] == kubernetes_version()
    assert version["serverVersion"]["gitVersion"].startswith("v1.37.")


def test_the_kubelet_nodes_hold_leases_and_report_ready(cluster: TestCluster) -> None:
    leases = get(cluster, "leases", "-n", "kube-node-lease")["items"]
    assert {lease["metadata"]["name"] for lease in leases} >= {"node-1", "node-2"}
    owner = leases[0]["metadata"]["ownerReferences"][0]
    assert owner["kind"] == "Node" and owner["name"] == leases[0]["metadata"]["name"]
    nodes = get(cluster, "nodes")["items"]
    ready = {n["metadata"]["name"]: next(c["status"] for c in n["status"]["conditions"] if c["type"] == "Ready")
             for n in nodes}
    assert ready == {"node-1": "True", "node-2": "True"}
    assert all(n["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] > 0 for n in nodes)


def test_the_authorizer_is_rbac_and_the_node_authorizer(cluster: TestCluster) -> None:
    assert kubectl(cluster, "auth", "can-i", "create", "pods").strip() == "yes"
    answer = kubectl(cluster, "auth", "can-i", "create", "pods", "--as", "system:serviceaccount:default:default",
                     check=False)
    assert answer.splitlines()[0].strip() == "no"
    # A node may update its own Node, not another's (the Node authorizer and NodeRestriction together).
    own = kubectl(cluster, "auth", "can-i", "get", "nodes/node-1", "--as", "system:node:node-1", "--as-group",
                  "system:nodes", check=False)
    assert own.splitlines()[0].strip() == "yes"


def test_admission_refuses_a_pod_the_api_refuses(cluster: TestCluster) -> None:
    bad = json.loads(pod("bad-port", ["true"]))
    bad["spec"]["containers"][0]["ports"] = [{"containerPort": 70000}]
    result = subprocess.run([str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), "create", "-f", "-"],
                            input=json.dumps(bad), capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "containerPort" in result.stderr


def test_a_pod_runs_to_completion_and_its_log_comes_through_the_api_server(cluster: TestCluster) -> None:
    kubectl(cluster, "create", "-f", "-", stdin=pod("hello", ["python", "-c", "print('hello from the kubelet')"]))
    eventually(lambda: get(cluster, "pod", "hello")["status"].get("phase") == "Succeeded", timeout=60,
               what="the pod did not succeed")
    observed = get(cluster, "pod", "hello")
    assert observed["spec"]["nodeName"] in {"node-1", "node-2"}  # bound by kube-scheduler
    assert observed["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    assert "hello from the kubelet" in kubectl(cluster, "logs", "hello")
    # The ServiceAccount admission plugin added the projected token volume; DefaultTolerationSeconds its tolerations.
    assert any(v["name"].startswith("kube-api-access-") for v in observed["spec"]["volumes"])
    assert {t["key"] for t in observed["spec"]["tolerations"]} >= {"node.kubernetes.io/not-ready",
                                                                   "node.kubernetes.io/unreachable"}


def test_a_pod_reads_the_api_with_its_bound_service_account_token(cluster: TestCluster) -> None:
    script = ("import os, yaml, urllib.request, ssl, json; c = yaml.safe_load(open(os.environ['KUBECONFIG']));"
              "cl = c['clusters'][0]['cluster']; tok = c['users'][0]['user']['token'];"
              "ctx = ssl.create_default_context(cafile=cl['certificate-authority']);"
              "r = urllib.request.Request(cl['server'] + '/apis/authentication.k8s.io/v1/selfsubjectreviews',"
              " data=b'{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"SelfSubjectReview\"}', method='POST',"
              " headers={'Authorization': 'Bearer ' + tok, 'Content-Type': 'application/json'});"
              "print(json.load(urllib.request.urlopen(r, context=ctx))['status']['userInfo']['username'])")
    kubectl(cluster, "create", "-f", "-", stdin=pod("whoami", ["python", "-c", script]))
    eventually(lambda: get(cluster, "pod", "whoami")["status"].get("phase") in ("Succeeded", "Failed"),
               timeout=60, what="the pod did not end")
    assert "system:serviceaccount:default:default" in kubectl(cluster, "logs", "whoami")


def test_a_deleted_pod_is_stopped_and_finalized_by_the_kubelet(cluster: TestCluster) -> None:
    kubectl(cluster, "create", "-f", "-", stdin=pod("sleeper", ["sleep", "300"]))
    eventually(lambda: get(cluster, "pod", "sleeper")["status"].get("phase") == "Running", timeout=60,
               what="the pod did not start")
    assert cluster.kubelet is not None and cluster.kubelet.pid_of("default", "sleeper") is not None
    started = time.monotonic()
    kubectl(cluster, "delete", "pod", "sleeper", "--wait=true", "--timeout=30s")
    assert time.monotonic() - started < 10  # SIGTERM ended it: no wait for the 5 s grace and the kill
    assert "NotFound" in kubectl(cluster, "get", "pod", "sleeper", check=False)


def test_a_lost_node_is_marked_unreachable_by_the_node_lifecycle_controller(cluster: TestCluster) -> None:
    assert cluster.kubelet is not None
    cluster.kubelet.lose_node("node-2")
    try:
        def unreachable() -> bool:
            node = get(cluster, "node", "node-2")
            ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
            taints = {t["key"] for t in node["spec"].get("taints") or []}
            return ready["status"] == "Unknown" and "node.kubernetes.io/unreachable" in taints
        eventually(unreachable, timeout=60, what="node-2 was not marked unreachable")
    finally:
        cluster.kubelet.restore_node("node-2")
    eventually(lambda: not any(t["key"] == "node.kubernetes.io/unreachable"
                               for t in get(cluster, "node", "node-2")["spec"].get("taints") or []),
               timeout=60, what="node-2's taint was not removed once it reported again")


def test_the_fault_proxy_ends_watches_and_forces_conflicts(cluster: TestCluster) -> None:
    assert cluster.api is not None
    watch = subprocess.Popen([str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), "get", "configmaps", "-w",
                              "--request-timeout=0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        eventually(lambda: cluster.api.watch_count >= 1, timeout=20, what="kubectl's watch through the proxy")
        assert cluster.api.drop_watches() >= 1
        watch.wait(timeout=20)  # kubectl get -w ends when its stream does
    finally:
        watch.kill()
    kubectl(cluster, "create", "configmap", "contested")
    cluster.api.force_conflict("configmaps", "default", "contested", count=1)
    refused = kubectl(cluster, "label", "configmap", "contested", "a=b", check=False)
    assert "the object has been modified" in refused
    kubectl(cluster, "label", "configmap", "contested", "a=b")  # only the next write was refused


def test_an_etcd_compaction_drops_the_history_before_it(cluster: TestCluster) -> None:
    """The compaction is etcd's own. What a client sees of it is the API server's: with the watch cache in front
    (consistent reads and list snapshots from it since 1.34), an old resourceVersion may still be served."""
    assert cluster.api is not None
    for i in range(3):
        kubectl(cluster, "create", "configmap", f"churn-{i}")
    revision = cluster.api.compact()
    request = urllib.request.Request(cluster.control_plane.etcd.client_url + "/v3/kv/range", method="POST",
                                     data=json.dumps({"key": "AA==", "revision": revision - 1}).encode())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert "compacted" in refused.value.read().decode()
    kubectl(cluster, "get", "configmaps", "churn-0")  # the API serves on


def test_a_restarted_api_server_serves_again_and_the_kubelet_reconnects(cluster: TestCluster) -> None:
    assert cluster.api is not None
    cluster.api.restart("kube-apiserver")
    kubectl(cluster, "create", "-f", "-", stdin=pod("after-restart", ["true"]))
    eventually(lambda: get(cluster, "pod", "after-restart")["status"].get("phase") == "Succeeded", timeout=60,
               what="a pod created after the restart to run")
