"""The project's image on real nodes: the kubelet of the control plane's release on containerd and runc, joined to
the test cluster (conftest.py). What the process kubelet only emulates is the real one's here: the registration
(its version and runtime), the hardened pod's security context enforced by runc, `kubectl logs` and `exec` through
the kubelet's server, an OOM kill under a memory limit, and a 2-worker TrainingJob whose worker pod is deleted
mid-run and which the operator brings to Succeeded on them; then a node lost by killing its kubelet, containerd
and containers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.conftest import find_tool
from tests.cluster.real_node import REAL_NODE_LABEL
from tests.etcd_process import free_port
from tests.real_nodes.conftest import CLAIM, RealEnv, on_real_nodes

# Cold: the image built and imported into containerd (minutes); then each scenario in tens of seconds.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

CHART = Path(__file__).resolve().parents[2] / "charts" / "flywheel"
HARDENED = {"runAsUser": 10001, "runAsGroup": 10001, "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def pod(name: str, image: str, command: list[str], **container: Any) -> dict[str, Any]:
    spec = {"restartPolicy": "Never", "securityContext": {"runAsNonRoot": True},
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never", "command": command,
                            "securityContext": HARDENED, "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                            **container}],
            "volumes": [{"name": "tmp", "emptyDir": {}}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": on_real_nodes(spec)}


def test_real_nodes_register_with_the_release_kubelet_and_containerd(real_env: RealEnv) -> None:
    nodes = json.loads(real_env.kubectl("get", "nodes", "-l", REAL_NODE_LABEL, "-o", "json").stdout)["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == ["real-1", "real-2"]
    for node in nodes:
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == real_env.cluster.control_plane.version, info
        assert info["containerRuntimeVersion"].startswith("containerd://2."), info
        assert {"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
    wide = real_env.kubectl("get", "nodes", "-o", "wide").stdout
    print(wide)
    assert "containerd://" in wide


def test_a_hardened_pod_runs_the_image_and_answers_logs_and_exec(real_env: RealEnv) -> None:
    """runc enforces the security context (uid 10001, a read-only root, no capabilities); the kubelet serves
    `kubectl logs` from its pod log files and `kubectl exec` through containerd's streaming server."""
    script = ("import os, time; print('uid', os.getuid(), flush=True);"
              "open('/tmp/ok', 'w').write('x');"
              "exec(\"try:\\n open('/etc/x', 'w')\\nexcept OSError as e:\\n print('root', e.errno, flush=True)\");"
              "time.sleep(600)")
    real_env.apply(pod("hardened", real_env.image, ["python", "-c", script]))
    try:
        real_env.wait(lambda: "root 30" in real_env.logs("hardened"), 180,
                      f"the pod's log; state {real_env.pod_state('hardened')}")
        logs = real_env.logs("hardened")
        assert "uid 10001" in logs, logs
        assert real_env.get("pod", "hardened")["spec"]["nodeName"].startswith("real-")
        check = "import os; print(os.getuid(), open('/proc/self/status').read().count('CapEff:\\t' + '0' * 16))"
        out = real_env.kubectl("exec", "hardened", "--", "python", "-c", check).stdout
        assert out.split() == ["10001", "1"], out
        real_env.kubectl("exec", "hardened", "--", "flywheel", "--help")
    finally:
        real_env.kubectl("delete", "pod", "hardened", "--grace-period=1", "--wait=false", check=False)


def test_a_container_over_its_memory_limit_is_oom_killed(real_env: RealEnv) -> None:
    grow = "b = []\nwhile True:\n    b.append(bytearray(16 << 20))"
    real_env.apply(pod("oom", real_env.image, ["python", "-c", grow],
                       resources={"limits": {"memory": "96Mi", "cpu": "500m"}}))
    try:
        terminated = real_env.wait(lambda: real_env.pod_state("oom").get("terminated"), 180,
                                   f"an OOM kill; state {real_env.pod_state('oom')}")
        assert terminated["reason"] == "OOMKilled" and terminated["exitCode"] == 137, terminated
    finally:
        real_env.kubectl("delete", "pod", "oom", "--grace-period=1", "--wait=false", check=False)


def training_job(name: str, image: str, steps: int = 60, namespace: str = "default",
                 worker: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"image": image, "replicas": {"min": 2, "max": 2}, "procsPerReplica": 1,
                     "trainer": {"model": {"preset": "gpt-tiny"}, "parallelism": {"fsdp": False},
                                 "training": {"steps": steps, "globalBatch": 8, "microBatch": 2, "lr": 3.0e-3,
                                              "warmupSteps": 3, "seed": 0},
                                 "data": {"source": "synthetic"}},
                     "checkpoint": {"dir": f"/ckpt/{name}", "claimName": CLAIM, "everySteps": 10, "keep": 2},
                     "faultTolerance": {"maxRestarts": 3, "progressTimeoutSeconds": 60,
                                        "firstStepTimeoutSeconds": 300, "restartScope": "job"},
                     "template": {"spec": on_real_nodes({"containers": [{"name": "worker", "imagePullPolicy": "Never",
                                                                         **(worker or {})}]})}}}


def job_status(env: RealEnv, name: str, namespace: str = "default") -> dict[str, Any]:
    return dict(env.get("tj", name, namespace).get("status") or {})


def job_pods(env: RealEnv, name: str) -> list[dict[str, Any]]:
    out = env.kubectl("get", "pods", "-l", f"flywheel.dev/job={name}", "-o", "json").stdout
    return list(json.loads(out)["items"])


def test_a_job_on_real_nodes_succeeds_after_a_worker_pod_is_deleted(real_env: RealEnv) -> None:
    """A worker's log and an exec into it (the container sees only its own processes: a PID namespace), then the
    other worker's pod deleted mid-run: the operator recreates it and the job ends at its last step."""
    name = "real-job"
    real_env.apply(training_job(name, real_env.image))
    try:
        real_env.wait(lambda: job_status(real_env, name).get("step", 0) >= 15, 300,
                      f"training to reach step 15; status {job_status(real_env, name)}")
        pods = job_pods(real_env, name)
        assert {p["spec"]["nodeName"] for p in pods} <= {"real-1", "real-2"}, pods
        worker = next(p["metadata"]["name"] for p in pods if p["metadata"]["name"].endswith("worker-0"))
        assert "step" in real_env.kubectl("logs", worker, "--tail=200").stdout
        listing = "import os; print(sorted(open(f'/proc/{p}/comm').read() for p in os.listdir('/proc') if p.isdigit()))"
        ps = real_env.kubectl("exec", worker, "--", "python", "-c", listing).stdout
        assert ("python" in ps or "flywheel" in ps) and "controlplane" not in ps, ps  # not the host's processes
        victim = next(p["metadata"]["name"] for p in pods if p["metadata"]["name"].endswith("worker-1"))
        real_env.kubectl("delete", "pod", victim, "--wait=false")
        done = real_env.wait(lambda: (s := job_status(real_env, name)).get("phase") in ("Succeeded", "Failed")
                             and s, 420, f"the job to end; status {job_status(real_env, name)}")
        assert done["phase"] == "Succeeded" and done["step"] == 60, done
        assert done["restarts"] >= 1, done
    finally:
        real_env.kubectl("delete", "tj", name, "--wait=false", check=False)


def test_a_lost_real_node_is_noticed_and_its_worker_replaced(real_env: RealEnv) -> None:
    """real-2 goes dark (kubelet, containerd and its containers killed): the node-lifecycle controller marks it
    NotReady, the operator replaces the job's pod there, and the job trains to the end on real-1."""
    name = "real-lost"
    real_env.apply(training_job(name, real_env.image, steps=80))
    try:
        real_env.wait(lambda: job_status(real_env, name).get("step", 0) >= 15, 300,
                      f"training to reach step 15; status {job_status(real_env, name)}")
        nodes = {p["spec"]["nodeName"] for p in job_pods(real_env, name)}
        lost = "real-2" if "real-2" in nodes else sorted(nodes)[0]
        real_env.cluster.real_nodes[lost].lose()
        real_env.wait(lambda: any(c["type"] == "Ready" and c["status"] != "True"
                                  for c in real_env.get("node", lost)["status"]["conditions"]), 120,
                      f"{lost} to be marked not ready")
        done = real_env.wait(lambda: (s := job_status(real_env, name)).get("phase") in ("Succeeded", "Failed")
                             and s, 600, f"the job to end; status {job_status(real_env, name)}")
        assert done["phase"] == "Succeeded" and done["step"] == 80, done
    finally:
        real_env.kubectl("delete", "tj", name, "--wait=false", check=False)
        node = real_env.cluster.real_nodes.get("real-2")
        if node is not None:
            node.start()


def chart_values(env: RealEnv, namespace: str) -> dict[str, Any]:
    """The chart's operator on a real node, in the image the nodes hold, for the jobs of `namespace`."""
    repository, tag = env.image.rsplit(":", 1)
    etcd = str(env.cluster.etcd_url).split("://", 1)[-1]
    return {"image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
            "etcd": {"enabled": False, "externalEndpoints": [etcd]},
            "operator": {"hostNetwork": True, "nodeSelector": {REAL_NODE_LABEL: "true"},
                         "tolerations": [{"key": REAL_NODE_LABEL, "operator": "Exists", "effect": "NoSchedule"}],
                         "metricsPort": free_port(), "livenessPort": free_port(), "workerMetricsPortBase": 0,
                         "workerEnv": {"OMP_NUM_THREADS": "1"}, "watchNamespaces": [namespace]}}


def test_the_charts_operator_runs_as_a_container_on_a_real_node(real_env: RealEnv) -> None:
    """helm template | kubectl apply, as docs/install.md says: the operator's pod runs the image on a real node,
    reaches the API server through the `kubernetes` Service's ClusterIP (service_vip.py), and brings a job of its
    namespace to Succeeded."""
    namespace, release = "flywheel-real", "fw"
    real_env.kubectl("create", "namespace", namespace)
    real_env.cluster.add_claim(CLAIM, namespace=namespace)
    values = real_env.tmp / "values.yaml"
    values.write_text(yaml.safe_dump(chart_values(real_env, namespace)))
    rendered = subprocess.run([find_tool("helm") or "helm", "template", release, str(CHART), "--namespace",
                               namespace, "-f", str(values)], capture_output=True, text=True, timeout=60, check=True)
    real_env.kubectl("apply", "-n", namespace, "-f", "-", stdin=rendered.stdout)
    deployment = f"deployment/{release}-flywheel-operator"
    rollout = real_env.kubectl("rollout", "status", deployment, "-n", namespace, "--timeout=240s", check=False,
                               timeout=250)
    operator_pods = json.loads(real_env.kubectl("get", "pods", "-n", namespace, "-l",
                                                "app.kubernetes.io/component=operator", "-o", "json").stdout)["items"]
    assert rollout.returncode == 0, (rollout.stderr, [p.get("status") for p in operator_pods],
                                     real_env.kubectl("logs", "-n", namespace, deployment, check=False).stdout[-3000:])
    assert operator_pods[0]["spec"]["nodeName"].startswith("real-"), operator_pods[0]["spec"]
    name = "chart-job"
    real_env.apply(training_job(name, real_env.image, steps=30, namespace=namespace))
    try:
        done = real_env.wait(lambda: (s := job_status(real_env, name, namespace)).get("phase")
                             in ("Succeeded", "Failed") and s, 420,
                             f"the job to end; status {job_status(real_env, name, namespace)}")
        assert done["phase"] == "Succeeded" and done["step"] == 30, done
    finally:
        real_env.kubectl("delete", "tj", name, "-n", namespace, "--wait=false", check=False)
        real_env.kubectl("delete", deployment, "-n", namespace, "--wait=false", check=False)


def test_a_worker_over_its_memory_limit_is_reported_oom_killed(real_env: RealEnv) -> None:
    """A worker whose container limit cannot hold a rank: the kernel kills in its cgroup, containerd reports the
    container OOMKilled, and the operator names it as the job's restart or failure reason."""
    name = "real-oom"
    job = training_job(name, real_env.image, worker={"resources": {"limits": {"memory": "160Mi"}}})
    job["spec"]["faultTolerance"]["maxRestarts"] = 1
    real_env.apply(job)
    try:
        said = real_env.wait(lambda: _oom_condition(job_status(real_env, name)), 420,
                             f"the operator to report OOMKilled; status {job_status(real_env, name)}")
        assert f"worker {name}-worker-" in said["message"] and "OOMKilled" in said["message"], said
    finally:
        real_env.kubectl("delete", "tj", name, "--wait=false", check=False)


def _oom_condition(status: dict[str, Any]) -> dict[str, Any] | None:
    """The job's condition whose reason is OOMKilled (Restarting, or Failed once the restarts ran out)."""
    return next((c for c in status.get("conditions") or [] if c.get("reason") == "OOMKilled"), None)
