"""spec.template on the test cluster with the real kubectl: a job whose template carries the pass-through fields
has worker pods that carry them, keeps the worker contract and runs to Succeeded; `flywheel render` prints the
pods the operator created for that job (the same builders, compared with `kubectl get pod -o json`). A second job's
template carries the scheduling and Secret fields (nodeSelector, priorityClassName, env from a Secret both ways, a
scheduling gate of the user's, runtimeClassName, hostNetwork): it waits gated without failing, then runs with the
Secret's value in its processes."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import time
from typing import Any

from flywheel.cli import main
from tests.operator.conftest import OpEnv, eventually

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
    if isinstance(want, list) and isinstance(have, list):  # admission added entries (DefaultTolerationSeconds')
        return [f"{path}: rendered {w!r}, not live" for w in want if not any(_subset(w, h) == [] for h in have)]
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
    live[NAME] = json.loads(op_env.kubectl("get", "pdb", NAME, "-o", "json").stdout)
    assert set(rendered) == set(live)
    for name, obj in rendered.items():
        assert _subset(obj["spec"], live[name]["spec"]) == [], name
        assert obj["metadata"]["labels"] == live[name]["metadata"]["labels"], name
        assert _subset(obj["metadata"].get("annotations") or {}, live[name]["metadata"].get("annotations") or {}) == []


# The scheduling and Secret fields of a template: a nodeSelector every node matches, a PriorityClass, env from a
# Secret (secretKeyRef and envFrom secretRef), and a scheduling gate of the user's own, which holds the pods Pending
# (SchedulingGated, not Unschedulable: the job waits) until the test removes it as the user's controller would.
# runtimeClassName and hostNetwork are added on the test cluster (accepted, not acted on: docs/test-cluster.md); the
# real-cluster twin adds them only when asked (tests/e2e_real/test_real_pod_security.py).
SCHED_NAME, SECRET, SECRET_VALUE = "tmpl-sched", "tmpl-secret", "s3cret-token"
PRIORITY_CLASS, PRIORITY, HOLD_GATE = "flywheel-test-high", 1000, "example.com/hold"

# The worker reports what it got: its rank and replica (the contract), and a digest of the Secret's value as each
# route delivered it (no secret in the log).
REPORT_ENV = """
import hashlib, os
env = os.environ
def digest(name):
    return hashlib.sha256(env[name].encode()).hexdigest()[:16]
print(f"rank {env['RANK']} of {env['WORLD_SIZE']} replica {env['FLYWHEEL_REPLICA_INDEX']} "
      f"secretKeyRef {digest('TRACKER_TOKEN')} envFrom {digest('FROM_SECRET_token')}", flush=True)
"""


def scheduling_prerequisites(runtime_handler: str = "") -> list[dict[str, Any]]:
    """The cluster-scoped objects the template names: the PriorityClass (preemptionPolicy Never: it never evicts
    anything on a shared cluster) and, with a handler, a RuntimeClass of that handler."""
    objects: list[dict[str, Any]] = [{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                      "metadata": {"name": PRIORITY_CLASS}, "value": PRIORITY,
                                      "preemptionPolicy": "Never", "description": "Flywheel's template tests"}]
    if runtime_handler:
        objects.append({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                        "metadata": {"name": f"flywheel-test-{runtime_handler}"}, "handler": runtime_handler})
    return objects


def scheduling_template(runtime_handler: str = "", host_network: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "priorityClassName": PRIORITY_CLASS,
        "schedulingGates": [{"name": HOLD_GATE}],
        "containers": [{"name": "worker",
                        "env": [{"name": "TRACKER_TOKEN",
                                 "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "token"}}}],
                        "envFrom": [{"secretRef": {"name": SECRET}, "prefix": "FROM_SECRET_"}]}],
    }
    if runtime_handler:
        spec["runtimeClassName"] = f"flywheel-test-{runtime_handler}"
    if host_network:
        spec.update(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet")
    return {"spec": spec}


def assert_gated(pods: list[dict[str, Any]]) -> None:
    """The pods wait behind the user's gate, unscheduled, with the reason the scheduler gives."""
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["schedulingGates"] == [{"name": HOLD_GATE}] and not pod["spec"].get("nodeName")
        scheduled = next(c for c in pod["status"].get("conditions", []) if c["type"] == "PodScheduled")
        assert (scheduled["status"], scheduled["reason"]) == ("False", "SchedulingGated"), scheduled


def assert_waiting_not_failed(status: dict[str, Any]) -> None:
    held = {c["type"] for c in status.get("conditions", []) if c["status"] == "True"}
    assert status.get("phase", "Pending") == "Pending" and not held & {"Unschedulable", "Failed"}, status


def ungate(pod_name: str) -> list[str]:
    """kubectl arguments that remove the pod's scheduling gates (as the user's controller would)."""
    return ["patch", "pod", pod_name, "--type=json",
            "-p", json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}])]


def assert_carries_the_scheduling_template(pods: list[dict[str, Any]], logs: dict[str, str], runtime_handler: str = "",
                                           host_network: bool = False) -> None:
    """Every pod ran with the template's scheduling fields, the class's priority and the Secret's value by both
    routes, its gate gone; each worker's rank is its replica index (the contract env intact)."""
    assert len(pods) == 2
    digest = hashlib.sha256(SECRET_VALUE.encode()).hexdigest()[:16]
    for pod in pods:
        spec = pod["spec"]
        assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"} and spec.get("nodeName")
        assert (spec["priorityClassName"], spec["priority"], spec["preemptionPolicy"]) == (PRIORITY_CLASS, PRIORITY,
                                                                                          "Never")
        assert not spec.get("schedulingGates")
        assert spec.get("runtimeClassName") == (f"flywheel-test-{runtime_handler}" if runtime_handler else None)
        assert bool(spec.get("hostNetwork")) is host_network
        assert spec["dnsPolicy"] == ("ClusterFirstWithHostNet" if host_network else "ClusterFirst")
        worker = next(c for c in spec["containers"] if c["name"] == "worker")
        env = {e["name"]: e for e in worker["env"]}
        assert env["TRACKER_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": SECRET, "key": "token"}}
        assert env["WORLD_SIZE"]["value"] == "2" and env["PET_NNODES"]["value"] == "2:2"
        assert worker["envFrom"] == [{"secretRef": {"name": SECRET}, "prefix": "FROM_SECRET_"}]
        index = pod["metadata"]["labels"]["flywheel.dev/replica-index"]
        assert f"rank {index} of 2 replica {index} secretKeyRef {digest} envFrom {digest}" in \
            logs[pod["metadata"]["name"]], logs
        assert pod["status"]["phase"] == "Succeeded"


def test_a_gated_templated_job_with_secrets_and_a_priority_class_waits_then_runs(op_env: OpEnv) -> None:
    for obj in scheduling_prerequisites("runc"):
        op_env.kubectl("apply", "-f", "-", stdin=json.dumps(obj))
    op_env.kubectl("create", "secret", "generic", SECRET, f"--from-literal=token={SECRET_VALUE}")
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(
        SCHED_NAME, template=scheduling_template("runc", host_network=True), command=["python", "-c", REPORT_ENV],
        **{"faultTolerance.pendingTimeoutSeconds": 1, "faultTolerance.nodeFailureGraceSeconds": 1})))
    pods = eventually(lambda: len(p := op_env.pods(SCHED_NAME)) == 2 and all(any(
        c.get("reason") == "SchedulingGated" for c in x["status"].get("conditions", [])) for x in p) and p, 30,
        "both pods gated")
    assert_gated(pods)
    time.sleep(3)  # past pendingTimeoutSeconds and the grace: a gated pod waits for its gate, it is not unschedulable
    assert_waiting_not_failed(op_env.status(SCHED_NAME))
    assert_gated(op_env.pods(SCHED_NAME))
    for pod in pods:
        op_env.kubectl(*ungate(pod["metadata"]["name"]))
    status = eventually(lambda: (s := op_env.status(SCHED_NAME)).get("phase") in ("Succeeded", "Failed") and s, 120,
                        f"{SCHED_NAME} to finish")
    assert status["phase"] == "Succeeded" and status.get("restarts", 0) == 0, status
    pods = op_env.pods(SCHED_NAME)
    logs = {p["metadata"]["name"]: op_env.kubectl("logs", p["metadata"]["name"]).stdout for p in pods}
    assert_carries_the_scheduling_template(pods, logs, "runc", host_network=True)
    op_env.delete(SCHED_NAME)
