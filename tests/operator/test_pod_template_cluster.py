"""spec.template on the test cluster with the real kubectl: a job whose template carries the pass-through fields
has worker pods that carry them, keeps the worker contract and runs to Succeeded; `flywheel render` prints the
pods the operator created for that job (the same builders, compared with `kubectl get pod -o json`)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from typing import Any

from flywheel.cli import main
from tests.operator.conftest import OpEnv

NAME = "tmpl-ok"


def template_for(name: str) -> dict[str, Any]:
    """A template with every pass-through field a cluster without GPUs runs (tests/e2e_real has the twin)."""
    template = copy.deepcopy(TEMPLATE)
    template["spec"]["topologySpreadConstraints"][0]["labelSelector"]["matchLabels"]["flywheel.dev/job"] = name
    return template


TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"team": "vision"}, "annotations": {"example.com/owner": "alice"}},
    "spec": {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [
                {"key": "gpu", "operator": "In", "values": ["h100"]}]}}]}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                       "whenUnsatisfiable": "ScheduleAnyway",
                                       "labelSelector": {"matchLabels": {"flywheel.dev/job": NAME}}}],
        "imagePullSecrets": [{"name": "registry-creds"}], "serviceAccountName": "default",
        "dnsPolicy": "ClusterFirst", "terminationGracePeriodSeconds": 45,
        "securityContext": {"supplementalGroups": [4242]},
        "volumes": [{"name": "scratch", "emptyDir": {}}],
        # A helper runs as a native sidecar (restartPolicy: Always): it stops when the worker exits, so the pod
        # finishes with the worker (a plain second container would keep the pod Running).
        "initContainers": [{"name": "prepare", "image": "busybox:1.36", "command": ["true"]},
                           {"name": "sidecar", "image": "busybox:1.36", "command": ["sleep", "infinity"],
                            "restartPolicy": "Always"}],
        "containers": [
            {"name": "worker", "env": [{"name": "FROM_TEMPLATE", "value": "yes"},
                                       {"name": "TRACKER_URL", "valueFrom": {"configMapKeyRef": {
                                           "name": "tmpl-config", "key": "url"}}}],
             "envFrom": [{"configMapRef": {"name": "tmpl-config"}}],
             "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
             "resources": {"requests": {"cpu": "100m"}}}],
    },
}


def _job(env: OpEnv) -> dict[str, Any]:
    """The template job, applied once and run to Succeeded (shared by this module's tests)."""
    if env.kubectl("get", "tj", NAME, check=False).returncode != 0:
        env.kubectl("create", "configmap", "tmpl-config", "--from-literal=url=http://tracker",
                    "--from-literal=EXTRA=1", check=False)
        env.kubectl("apply", "-f", str(env.job_yaml(NAME, template=template_for(NAME),
                                                    **{"trainer.training.steps": 10})))
    env.wait_phase(NAME, "Succeeded", 180)
    return env.job(NAME)


def test_a_templated_job_carries_every_pass_through_field_and_succeeds(op_env: OpEnv) -> None:
    _job(op_env)
    assert_carries_the_template(op_env.pods(NAME), NAME)


def _has(items: list[dict[str, Any]], want: dict[str, Any]) -> bool:
    """`want` is among `items`, allowing the fields the API server defaults (e.g. an init container's policies)."""
    return any(not _subset(want, item) for item in items)


def assert_carries_the_template(pods: list[dict[str, Any]], name: str) -> None:
    """Every pod of the job carries the template's fields beside the operator's, with the contract env intact."""
    template = template_for(name)["spec"]
    assert len(pods) == 2
    for pod in pods:
        spec, meta = pod["spec"], pod["metadata"]
        for key in ("tolerations", "topologySpreadConstraints", "imagePullSecrets", "initContainers", "volumes"):
            assert all(_has(spec[key], item) for item in template[key]), key
        assert spec["affinity"]["nodeAffinity"] == template["affinity"]["nodeAffinity"]
        assert (spec["serviceAccountName"], spec["dnsPolicy"], spec["terminationGracePeriodSeconds"]) == \
            ("default", "ClusterFirst", 45)
        assert spec["securityContext"]["supplementalGroups"] == [4242] and spec["securityContext"]["runAsNonRoot"]
        assert meta["labels"]["team"] == "vision" and meta["annotations"]["example.com/owner"] == "alice"
        assert [c["name"] for c in spec["containers"]] == ["worker"] and spec["restartPolicy"] == "Never"
        worker = spec["containers"][0]
        env = {e["name"]: e.get("value") for e in worker["env"]}
        assert env["FROM_TEMPLATE"] == "yes" and env["PET_NNODES"] == "2:2" and env["PET_RDZV_BACKEND"] == "etcd-v3"
        assert env["FLYWHEEL_REPLICA_INDEX"] == meta["labels"]["flywheel.dev/replica-index"]
        assert env["MASTER_ADDR"].startswith(f"{name}-worker-0.") and env["WORLD_SIZE"] == "2"
        assert worker["envFrom"] == [{"configMapRef": {"name": "tmpl-config"}}]
        assert {"name": "scratch", "mountPath": "/scratch"} in worker["volumeMounts"]
        assert worker["resources"]["requests"]["cpu"] == "100m" and worker["command"][-1] == "launch"
        assert pod["status"]["phase"] == "Succeeded"


def _subset(want: Any, have: Any, path: str = "") -> list[str]:
    """Where `have` (the live object, with the API server's defaults) lacks or changes what `want` sets."""
    if isinstance(want, dict) and isinstance(have, dict):
        return [d for k, v in want.items() for d in _subset(v, have.get(k), f"{path}.{k}")]
    if isinstance(want, list) and isinstance(have, list) and len(want) == len(have):
        return [d for i, (w, h) in enumerate(zip(want, have)) for d in _subset(w, h, f"{path}[{i}]")]
    return [] if want == have else [f"{path}: rendered {want!r}, live {have!r}"]


def test_render_prints_the_pods_the_operator_created(op_env: OpEnv) -> None:
    job = _job(op_env)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["render", str(op_env.tmp / f"{NAME}.yaml"), "-o", "json", "--uid", job["metadata"]["uid"],
                     "--etcd-endpoints", str(op_env.cluster.etcd_url), "--events-dir", str(op_env.events_dir),
                     "--events-claim", "flywheel-events",
                     "--metrics-port-base", "0", "--worker-env", "OMP_NUM_THREADS=1"])
    assert code == 0
    rendered = {o["metadata"]["name"]: o for o in json.loads(out.getvalue())["items"]}
    live = {p["metadata"]["name"]: p for p in op_env.pods(NAME)}
    live[f"{NAME}-workers"] = json.loads(op_env.kubectl("get", "service", f"{NAME}-workers", "-o", "json").stdout)
    assert set(rendered) == set(live)
    for name, obj in rendered.items():
        assert _subset(obj["spec"], live[name]["spec"]) == [], name
        assert obj["metadata"]["labels"] == live[name]["metadata"]["labels"], name
        assert _subset(obj["metadata"].get("annotations") or {}, live[name]["metadata"].get("annotations") or {}) == []
