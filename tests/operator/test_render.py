"""`flywheel render`: examples/gpu-cluster.yaml rendered as the operator would create it (tests/operator/
test_pod_template_cluster.py compares render with the operator's pods on the test cluster)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.cli import main
from flywheel.planner import DEVICES
from flywheel.spec import load_job
from flywheel.spec.auto import resolve_auto

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpu-cluster.yaml"


def render(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["render", *argv])
    return code, out.getvalue()


def test_the_gpu_cluster_example_renders_as_the_operator_creates_it():
    code, text = render(str(EXAMPLE), "-o", "json", "--rdma-resource", "rdma/ib")
    assert code == 0
    items: list[dict[str, Any]] = json.loads(text)["items"]
    assert [o["kind"] for o in items] == ["Service", "PodDisruptionBudget", "Pod", "Pod"]
    job = load_job(EXAMPLE)
    budget = items[1]  # no eviction of a healthy worker: a drain waits for drain ahead
    workers = {"flywheel.dev/job": "llama-8b", "flywheel.dev/role": "worker"}
    assert budget["spec"] == {"minAvailable": job.spec.replicas.max, "unhealthyPodEvictionPolicy": "AlwaysAllow",
                              "selector": {"matchLabels": workers}}
    assert all(budget["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
               for pod in items[2:])
    kv = pytest.importorskip("kubernetes_validate")
    kv.validate(budget, "1.33.0", strict=True)
    for index, pod in enumerate(items[2:]):
        spec = pod["spec"]
        worker = spec["containers"][0]
        assert pod["metadata"]["name"] == f"llama-8b-worker-{index}"
        assert pod["metadata"]["labels"]["team"] == "foundation"
        assert worker["image"] == "registry.example.com/team/flywheel-ngc:24.05"
        assert worker["resources"]["limits"] == {"memory": "1000Gi", "nvidia.com/gpu": "8", "rdma/ib": "1"}
        assert worker["resources"]["requests"] == {"cpu": "64", "memory": "800Gi", "nvidia.com/gpu": "8",
                                                   "rdma/ib": "1"}
        assert worker["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert worker["securityContext"]["readOnlyRootFilesystem"] is False
        assert spec["securityContext"]["runAsUser"] == 0 and "runAsNonRoot" not in spec["securityContext"]
        assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert spec["terminationGracePeriodSeconds"] == 300
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "checkpoints"}
        assert volumes["tokens"]["persistentVolumeClaim"]["claimName"] == "tokens" and "cache-home" not in volumes
        assert volumes["dshm"]["emptyDir"]["sizeLimit"] == "64Gi"
        env = {e["name"]: e for e in worker["env"]}
        assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
        assert "HOME" not in env  # a writable root: the image's HOME
        assert env["WORLD_SIZE"]["value"] == "16" and env["PET_NPROC_PER_NODE"]["value"] == "8"
        # The workers' layout is the planner's pick on the accelerator's device profile.
        chosen = resolve_auto(job.spec, DEVICES["h100"]).trainer.parallelism
        sent = json.loads(env["FLYWHEEL_SPEC"]["value"])["trainer"]["parallelism"]
        assert (sent["tp"], sent["pp"], sent["fsdp"]) == (chosen.tp, chosen.pp, chosen.fsdp)
        kv = pytest.importorskip("kubernetes_validate")
        kv.validate(pod, "1.33.0", strict=True)
    _, as_yaml = render(str(EXAMPLE), "--rdma-resource", "rdma/ib")
    assert list(yaml.safe_load_all(as_yaml)) == items


def test_render_options_shape_the_pods_like_the_operators():
    code, text = render(str(EXAMPLE), "-o", "json", "--security-profile", "image", "--gang-scheduler", "volcano",
                        "--uid", "abcdef12-0000", "--replicas", "2", "--worker-env", "OMP_NUM_THREADS=4",
                        "--no-disruption-budgets")
    assert code == 0
    items = json.loads(text)["items"]
    assert [o["kind"] for o in items] == ["Service", "PodGroup", "Pod", "Pod"]
    pod = items[2]
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env["PET_RDZV_ID"] == "default-llama-8b-abcdef12" and env["OMP_NUM_THREADS"] == "4"
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "runAsUser": 0,
                                              "runAsGroup": 0, "fsGroup": 0}


def test_render_refuses_an_invalid_job_naming_the_field(tmp_path):
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    code, text = render(str(bad))
    assert code == 2 and "spec.template.spec.restartPolicy" in text and "Traceback" not in text


def test_plan_sizes_layouts_for_the_accelerator_by_default():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", str(EXAMPLE), "-o", "json"])
    assert code == 0
    assert json.loads(out.getvalue())["layout"]["device"] == "h100"
