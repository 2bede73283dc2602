"""examples/gpu-cluster.yaml on the test cluster with fake GPUs (docs/test-cluster.md): two nodes with 8
`nvidia.com/gpu` each (and such a node's CPUs and memory), the GPU taint and the H100 product label. Without the
example's toleration the job stays Pending with the scheduler's own reason in its Unschedulable condition; as written
it is admitted by the API server (the CRD's real PodTemplateSpec schema), its two 8-GPU workers land on two different
nodes with the template's fields, and nothing in its pods is what the test cluster cannot serve but the image (made
unpullable here so that an 8B model does not start training on CPU). Twin: tests/e2e_real (the first scenario
there)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.operator.conftest import OpEnv, eventually

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpu-cluster.yaml"
GPU, RDMA, PRODUCT = "nvidia.com/gpu", "rdma/rdma_shared_device_a", "NVIDIA-H100-80GB-HBM3"
# An 8-GPU H100 node as a cloud sells it: kube-scheduler fits the example's 64 CPUs and 800Gi per worker against
# the node's allocatable (the process kubelet reports the host's few cores and 16Gi unless told otherwise).
GPU_NODE = {GPU: "8", RDMA: "4", "cpu": "192", "memory": "2Ti"}


def gpu_job(name: str, tolerate: bool) -> dict[str, Any]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["metadata"]["name"] = name
    pod = doc["spec"]["template"]["spec"]
    pod["containers"][0]["image"] = "registry.invalid/team/flywheel-ngc:24.05"  # scheduled, never started
    if not tolerate:
        del pod["tolerations"]
        doc["spec"]["faultTolerance"]["nodeFailureGraceSeconds"] = 2  # Unschedulable after 2 s, not the default
    return doc


def apply(op_env: OpEnv, doc: dict[str, Any]) -> None:
    path = op_env.tmp / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(doc))
    op_env.kubectl("apply", "-f", str(path))


def make_gpu_nodes(op_env: OpEnv) -> list[str]:
    nodes = [n.split("/", 1)[1] for n in op_env.kubectl("get", "nodes", "-o", "name").stdout.split()]
    assert op_env.cluster.kubelet is not None
    for claim in ("checkpoints", "tokens"):  # the example's claims (its header says to create them)
        op_env.cluster.add_claim(claim)  # kube-scheduler places no pod whose claim is unbound
    for node in nodes:
        op_env.kubectl("label", "node", node, f"{GPU}.product={PRODUCT}", "--overwrite")
        op_env.kubectl("taint", "node", node, f"{GPU}=present:NoSchedule", "--overwrite")
        op_env.cluster.kubelet.set_resources(node, GPU_NODE)
    return nodes


def test_the_gpu_example_waits_for_its_toleration_then_lands_one_worker_per_gpu_node(op_env: OpEnv) -> None:
    nodes = make_gpu_nodes(op_env)
    op_env.kubectl("create", "secret", "generic", "hf-token", "--from-literal=token=t", check=False)

    apply(op_env, gpu_job("gpu-untolerated", tolerate=False))
    status = eventually(lambda: (s := op_env.status("gpu-untolerated")) and any(
        c["type"] == "Unschedulable" and c["status"] == "True" for c in s.get("conditions", [])) and s, 60,
        "the Unschedulable condition")
    held = next(c for c in status["conditions"] if c["type"] == "Unschedulable")
    # kube-scheduler's words (1.37): "0/2 nodes are available: 2 node(s) had untolerated taint(s). ..."
    assert "untolerated taint" in held["message"], held
    assert status.get("phase", "Pending") == "Pending"
    op_env.delete("gpu-untolerated")

    apply(op_env, gpu_job("gpu-example", tolerate=True))
    pods = eventually(lambda: len(p := [x for x in op_env.pods("gpu-example") if x["spec"].get("nodeName")]) == 2
                      and p, 60, "both workers scheduled")
    assert sorted(p["spec"]["nodeName"] for p in pods) == sorted(nodes)  # 8 GPUs each: one worker per node
    for pod in pods:
        worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
        assert worker["resources"]["limits"][GPU] == "8" and worker["resources"]["requests"][GPU] == "8"
        assert worker["resources"]["limits"][RDMA] == "1"
        assert "IPC_LOCK" in worker["securityContext"]["capabilities"]["add"]
        assert pod["spec"]["nodeSelector"] == {f"{GPU}.product": PRODUCT}
        assert pod["spec"]["securityContext"]["runAsUser"] == 0
        assert pod["metadata"]["labels"]["team"] == "foundation"
        env = {e["name"]: e for e in worker["env"]}
        assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "hf-token" and env["WORLD_SIZE"]
        assert {"name": "tokens", "mountPath": "/data/tokens", "readOnly": True} in worker["volumeMounts"]
        assert pod["spec"]["terminationGracePeriodSeconds"] == 300
    reasons = {json.dumps(p["status"].get("containerStatuses", [{}])[0].get("state", {})) for p in pods}
    assert all("running" not in r for r in reasons), reasons  # the unpullable image: nothing started
    op_env.delete("gpu-example")


def test_with_the_toleration_a_gpu_job_is_scheduled_on_the_tainted_gpu_nodes_and_runs_to_success(
        op_env: OpEnv) -> None:
    """The same taint and GPU capacity, a tiny job with the example's toleration and node selector: it runs (the
    trainer falls back to CPU here: the GPUs are fake) on the GPU nodes, each worker holding its GPU."""
    nodes = make_gpu_nodes(op_env)
    name = "gpu-tolerated"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, **{
        "accelerator": {"resource": GPU},
        "template": {"spec": {"tolerations": [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}],
                              "nodeSelector": {f"{GPU}.product": PRODUCT}}}})))
    try:
        pods = eventually(lambda: len(p := [x for x in op_env.pods(name) if x["spec"].get("nodeName")]) == 2
                          and p, 60, "both workers scheduled")
        assert {p["spec"]["nodeName"] for p in pods} <= set(nodes)
        for pod in pods:
            worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
            assert worker["resources"]["limits"][GPU] == "1"
        assert op_env.wait_phase(name, "Succeeded", 240)["phase"] == "Succeeded"
    finally:
        op_env.delete(name)
