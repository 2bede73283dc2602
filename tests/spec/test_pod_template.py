"""spec.template as pure functions: every field the operator owns is refused naming the field and the fix, the
shorthands are conflict-checked against it, and the merge keeps the worker contract while passing the rest
through (flywheel/spec/pod_template.py, spec/pod.py, spec/pod_merge.py, operator/manifests.py pod())."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from flywheel.operator import manifests as m
from flywheel.operator.observe import pod_view
from flywheel.policy.failures import FailureKind, classify_exit, classify_pod
from flywheel.policy.job_view import failure_of
from flywheel.spec import SpecError, TrainingJob, parse_job
from flywheel.spec.pod import planner_device
from tests import builders

SETTINGS = m.OperatorSettings(etcd_endpoints="etcd:2379")
CONTRACT = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "PET_NNODES", "PET_RDZV_ID", "FLYWHEEL_JOB",
            "FLYWHEEL_REPLICA_INDEX", "FLYWHEEL_SPEC", "FLYWHEEL_CHECKPOINT_DIR")
PASS_THROUGH: dict[str, Any] = {
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "nodeSelector": {"nvidia.com/gpu.product": "H100"},
    "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway",
                                   "labelSelector": {"matchLabels": {"app": "x"}}}],
    "imagePullSecrets": [{"name": "registry"}], "serviceAccountName": "trainer", "priorityClassName": "high",
    "runtimeClassName": "nvidia", "hostNetwork": True, "dnsPolicy": "ClusterFirstWithHostNet",
    "schedulingGates": [{"name": "example.com/hold"}],
    "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]},
                       {"name": "log-shipper", "image": "busybox", "restartPolicy": "Always"}],
}


def job(**spec: Any) -> TrainingJob:
    return builders.job({"replicas": {"min": 2, "max": 2}, **spec})


def refusal(**spec: Any) -> str:
    with pytest.raises(SpecError) as err:
        job(**spec)
    return " ".join(str(err.value).split())


def worker_pod(j: TrainingJob, settings: m.OperatorSettings = SETTINGS, index: int = 0) -> dict[str, Any]:
    return m.pod(j, m.plan(j, "0123456789abcdef", settings, None)[index], 0, settings)


def container(pod: dict[str, Any], name: str = "worker") -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == name)


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(pod)["env"]}


@pytest.mark.parametrize("pod_spec, field, fix", [
    ({"restartPolicy": "Always"}, "spec.template.spec.restartPolicy", "spec.faultTolerance"),
    ({"hostname": "h"}, "spec.template.spec.hostname", "remove it"),
    ({"subdomain": "s"}, "spec.template.spec.subdomain", "remove it"),
    ({"containers": [{"name": "worker", "command": ["python"]}]}, "spec.template.spec.containers[0].command",
     "spec.command"),
    ({"containers": [{"name": "side"}, {"name": "worker", "args": ["x"]}]}, "spec.template.spec.containers[1].args",
     "spec.command"),
    ({"containers": [{"name": "main", "command": ["python"]}]}, "spec.template.spec.containers[0].command",
     "spec.command"),
    ({"volumes": [{"name": "dshm", "emptyDir": {}}]}, "spec.template.spec.volumes[0].name", "rename yours"),
    ({"volumes": [{"name": "cache-home", "emptyDir": {}}]}, "spec.template.spec.volumes[0].name", "rename yours"),
    ({"containers": [{"name": "worker", "volumeMounts": [{"name": "tmp", "mountPath": "/scratch"}]}]},
     "spec.template.spec.containers[0].volumeMounts[0].name", "mount your own volume"),
    ({"containers": [{"name": "worker", "volumeMounts": [{"name": "data", "mountPath": "/ckpt"}]}]},
     "spec.template.spec.containers[0].volumeMounts[0].mountPath", "mount yours elsewhere"),
    ({"containers": [{"name": "worker", "volumeMounts": [{"name": "data", "mountPath": "/tmp/"}]}]},
     "spec.template.spec.containers[0].volumeMounts[0].mountPath", "mount yours elsewhere"),
    ({"containers": [{"name": "worker", "volumeMounts": [{"name": "data", "mountPath": "/home/flywheel"}]}]},
     "spec.template.spec.containers[0].volumeMounts[0].mountPath", "mount yours elsewhere"),
])
def test_every_field_the_operator_owns_is_refused(pod_spec, field, fix):
    text = refusal(template={"spec": pod_spec})
    assert field in text and fix in text, text


@pytest.mark.parametrize("name", ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                  "MASTER_ADDR", "MASTER_PORT", "PET_NNODES", "PET_RDZV_ENDPOINT",
                                  "TORCHELASTIC_RUN_ID", "FLYWHEEL_SPEC", "FLYWHEEL_JOB"])
def test_contract_env_is_refused(name):
    text = refusal(template={"spec": {"containers": [{"name": "worker", "env": [
        {"name": "OK", "value": "1"}, {"name": name, "value": "x"}]}]}})
    assert f"spec.template.spec.containers[0].env[1].name: {name} belongs to the worker contract" in text, text


def test_metadata_beyond_labels_and_annotations_and_operator_labels_are_refused():
    text = refusal(template={"metadata": {"name": "x", "labels": {"flywheel.dev/job": "other"}}, "kind": "Pod"})
    assert "spec.template.kind: a pod template has only metadata and spec" in text
    assert "spec.template.metadata.name: the operator names the worker pods" in text
    assert "spec.template.metadata.labels.flywheel.dev/job: the operator sets this label" in text


@pytest.mark.parametrize("where", ["labels", "annotations"])
@pytest.mark.parametrize("key", ["kueue.x-k8s.io/queue-name", "kueue.x-k8s.io/pod-group-name",
                                 "kueue.x-k8s.io/pod-group-total-count"])
def test_kueue_pod_group_metadata_in_the_template_is_refused(where, key):
    """Per pod, Kueue's queue, group or count would make each worker its own workload: spec.scheduling.queue is
    the way (the operator puts the job's pod-group metadata on every worker)."""
    text = refusal(template={"metadata": {where: {"team": "a", key: "x"}}})
    assert f"spec.template.metadata.{where}.{key}: Kueue would admit the worker pods as separate workloads" in text
    assert "set spec.scheduling.queue" in text, text
    fine = job(scheduling={"queue": "team-a"}, template={"metadata": {where: {"kueue.x-k8s.io/other": "x"}}})
    assert fine.spec.scheduling.queue == "team-a"


def test_a_template_scheduler_name_under_gang_scheduling_is_refused_naming_both_fields():
    text = refusal(template={"spec": {"schedulerName": "other"}})  # scheduling.gang is true by default
    assert "spec.scheduling.gang" in text and "template.spec.schedulerName 'other'" in text, text
    assert "set the scheduler in scheduling.schedulerName instead, or scheduling.gang: false" in text, text
    # Without gang scheduling the template's scheduler passes through, even where the operator runs a gang scheduler.
    volcano = m.OperatorSettings(etcd_endpoints="etcd:2379", gang_scheduler="volcano")
    no_gang = job(scheduling={"gang": False}, template={"spec": {"schedulerName": "other"}})
    assert worker_pod(no_gang, volcano)["spec"]["schedulerName"] == "other"
    # The shorthand and the template may say the same scheduler; the gang then uses it.
    same = job(scheduling={"schedulerName": "volcano"}, template={"spec": {"schedulerName": "volcano"}})
    assert worker_pod(same, volcano)["spec"]["schedulerName"] == "volcano"


@pytest.mark.parametrize("spec, field, other", [
    ({"image": "a:1", "template": {"spec": {"containers": [{"name": "worker", "image": "b:2"}]}}},
     "spec.image", "template.spec.containers[0].image 'b:2'"),
    ({"resources": {"limits": {"cpu": "2"}},
      "template": {"spec": {"containers": [{"name": "worker", "resources": {"limits": {"cpu": "4"}}}]}}},
     "spec.resources.limits.cpu", "template.spec.containers[0].resources.limits.cpu"),
    ({"scheduling": {"schedulerName": "volcano"}, "template": {"spec": {"schedulerName": "other"}}},
     "spec.scheduling.schedulerName", "template.spec.schedulerName"),
    ({"scheduling": {"priorityClassName": "low"}, "template": {"spec": {"priorityClassName": "high"}}},
     "spec.scheduling.priorityClassName", "template.spec.priorityClassName"),
    ({"faultTolerance": {"terminationGraceSeconds": 300},
      "template": {"spec": {"terminationGracePeriodSeconds": 60}}},
     "spec.faultTolerance.terminationGraceSeconds", "template.spec.terminationGracePeriodSeconds"),
    ({"accelerator": {"resource": "nvidia.com/gpu"}, "procsPerReplica": 2,
      "template": {"spec": {"containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": 4}}}]}}},
     "spec.template.spec.containers[0].resources.limits.nvidia.com/gpu", "procsPerReplica (2)"),
    ({"accelerator": {"resource": "nvidia.com/gpu"}, "resources": {"requests": {"nvidia.com/gpu": "1"}},
      "procsPerReplica": 2}, "spec.resources.requests.nvidia.com/gpu", "procsPerReplica (2)"),
    ({"accelerator": {"resource": "nvidia.com/gpu", "device": "h100"},
      "trainer": {"parallelism": {"device": "a100"}}},
     "spec.trainer.parallelism.device", "accelerator.device 'h100'"),
    ({"accelerator": {"resource": "nvidia.com/gpu"}, "trainer": {"parallelism": {"auto": True}}},
     "spec.accelerator.device", "set accelerator.device"),
])
def test_shorthands_that_disagree_with_the_template_name_both_fields(spec, field, other):
    text = refusal(**spec)
    assert field in text and other in text, text


def test_shorthands_that_agree_or_stand_alone_are_fine():
    j = job(image="a:1", resources={"limits": {"cpu": "2"}}, accelerator={"resource": "nvidia.com/gpu"},
            template={"spec": {"containers": [{"name": "worker", "image": "a:1", "resources": {
                "limits": {"cpu": "2", "nvidia.com/gpu": "1"}, "requests": {"memory": "1Gi"}}}]}})
    res = container(worker_pod(j))["resources"]
    assert res == {"limits": {"cpu": "2", "nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1", "memory": "1Gi"}}
    only_template = job(template={"spec": {"containers": [{"name": "worker", "image": "mine:2"}]}})
    assert container(worker_pod(only_template))["image"] == "mine:2"


def test_pod_fields_pass_through_and_the_contract_stays():
    template = {"metadata": {"labels": {"team": "a"}, "annotations": {"note": "x"}},
                "spec": {**PASS_THROUGH, "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "ds"}}],
                         "securityContext": {"supplementalGroups": [5]},
                         "containers": [{"name": "side", "image": "busybox"},
                                        {"name": "worker", "envFrom": [{"secretRef": {"name": "hub"}}],
                                         "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub",
                                                                                                  "key": "t"}}}],
                                         "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                                         "ports": [{"name": "debug", "containerPort": 5678}],
                                         "lifecycle": {"preStop": {"exec": {"command": ["true"]}}},
                                         "workingDir": "/work"}]}}
    j = job(template=template)
    pod, plain = worker_pod(j), worker_pod(job())
    for key, value in PASS_THROUGH.items():
        assert pod["spec"][key] == value, key
    assert pod["metadata"]["labels"]["team"] == "a" and pod["metadata"]["annotations"]["note"] == "x"
    assert pod["metadata"]["labels"][m.INDEX_LABEL] == "0"
    assert [c["name"] for c in pod["spec"]["containers"]] == ["side", "worker"]
    assert pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"] == "worker"
    worker = container(pod)
    assert worker["envFrom"] == [{"secretRef": {"name": "hub"}}] and worker["workingDir"] == "/work"
    assert worker["lifecycle"] == {"preStop": {"exec": {"command": ["true"]}}}
    assert worker["command"] == container(plain)["command"]
    env, plain_env = env_of(pod), env_of(plain)
    assert all(env[k] == plain_env[k] for k in CONTRACT)
    assert env["TOKEN"] == {"secretKeyRef": {"name": "hub", "key": "t"}}
    assert {"name": "data", "mountPath": "/data"} in worker["volumeMounts"]
    assert {v["name"] for v in pod["spec"]["volumes"]} >= {"dshm", "tmp", "checkpoints", "data"}
    assert [p["name"] for p in worker["ports"]] == ["metrics", "debug"]
    assert pod["spec"]["securityContext"]["supplementalGroups"] == [5]
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True  # the rest of the hardened default stays
    assert (pod["spec"]["restartPolicy"], pod["spec"]["hostname"]) == ("Never", "j-worker-0")
    kv = pytest.importorskip("kubernetes_validate")
    kv.validate(pod, "1.33.0", strict=True)


def test_the_first_container_is_the_worker_when_none_is_named_so():
    j = job(template={"spec": {"containers": [{"name": "trainer", "image": "mine:1"},
                                              {"name": "side", "image": "busybox"}]}})
    pod = worker_pod(j)
    assert [c["name"] for c in pod["spec"]["containers"]] == ["worker", "side"]
    assert container(pod)["image"] == "mine:1"


def test_template_env_overrides_the_defaults_but_not_the_contract():
    settings = m.OperatorSettings(etcd_endpoints="etcd:2379", worker_env=(("NCCL_IB_DISABLE", "1"),))
    j = job(template={"spec": {"containers": [{"name": "worker", "env": [
        {"name": "NCCL_IB_DISABLE", "value": "0"}, {"name": "HOME", "value": "/work"},
        {"name": "RUN", "value": "$(FLYWHEEL_JOB)"}]}]}})
    worker = container(worker_pod(j, settings))
    names = [e["name"] for e in worker["env"]]
    assert len(names) == len(set(names))  # one entry per name: the template's replaced the operator's
    env = env_of(worker_pod(j, settings))
    assert env["NCCL_IB_DISABLE"] == "0" and env["HOME"] == "/work"
    assert names.index("RUN") > names.index("FLYWHEEL_JOB")  # $(VAR) sees the contract's value


def test_the_hardened_default_and_its_field_by_field_overrides():
    hardened = worker_pod(job())
    ctx = container(hardened)["securityContext"]
    assert ctx == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    assert {"name": "cache-home", "mountPath": "/home/flywheel"} in container(hardened)["volumeMounts"]
    env = env_of(hardened)
    assert env["HOME"] == "/home/flywheel" and env["XDG_CACHE_HOME"] == "/home/flywheel/.cache"
    assert env["TRITON_CACHE_DIR"].startswith("/home/flywheel/") and env["TORCHINDUCTOR_CACHE_DIR"].startswith(
        "/home/flywheel/")
    root = worker_pod(job(template={"spec": {"securityContext": {"runAsUser": 0, "runAsGroup": 0},
                                             "containers": [{"name": "worker", "securityContext": {
                                                 "readOnlyRootFilesystem": False}}]}}))
    assert root["spec"]["securityContext"] == {"runAsUser": 0, "runAsGroup": 0, "fsGroup": m.WORKER_UID,
                                               "seccompProfile": {"type": "RuntimeDefault"}}
    worker = container(root)
    assert worker["securityContext"]["readOnlyRootFilesystem"] is False
    assert worker["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "cache-home" not in {v["name"] for v in root["spec"]["volumes"]} and "HOME" not in env_of(root)
    assert {"name": "tmp", "mountPath": "/tmp"} in worker["volumeMounts"]  # /tmp always


def test_the_image_profile_keeps_the_images_user_and_a_writable_root():
    image = m.OperatorSettings(etcd_endpoints="etcd:2379", security_profile="image")
    pod = worker_pod(job(), image)
    assert pod["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert container(pod)["securityContext"] == {"allowPrivilegeEscalation": False}
    assert "HOME" not in env_of(pod) and "cache-home" not in {v["name"] for v in pod["spec"]["volumes"]}
    strict = worker_pod(job(template={"spec": {"containers": [{"name": "worker", "securityContext": {
        "readOnlyRootFilesystem": True}}]}}), image)
    assert env_of(strict)["HOME"] == "/home/flywheel"  # a read-only root again gets the cache home


def test_accelerator_rdma_and_the_termination_grace():
    settings = m.OperatorSettings(etcd_endpoints="etcd:2379", rdma_resource="rdma/ib")
    j = job(procsPerReplica=4, accelerator={"resource": "nvidia.com/gpu", "device": "h100"}, network="rdma",
            trainer={"training": {"globalBatch": 32, "microBatch": 4}},
            faultTolerance={"terminationGraceSeconds": 600})
    pod = worker_pod(j, settings)
    worker = container(pod)
    for kind in ("requests", "limits"):
        assert worker["resources"][kind] == {"nvidia.com/gpu": "4", "rdma/ib": "1"}
    assert worker["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert pod["spec"]["terminationGracePeriodSeconds"] == 600
    assert "resources" not in container(worker_pod(job())) or not container(worker_pod(job()))["resources"]


def test_the_planner_device_follows_the_accelerator():
    assert planner_device(job().spec.pod_view()) == "cpu"
    assert planner_device(job(accelerator={"resource": "nvidia.com/gpu", "device": "h100"}).spec.pod_view()) == "h100"
    assert planner_device(job(accelerator={"resource": "nvidia.com/gpu"}).spec.pod_view()) == "cpu"
    same = job(accelerator={"resource": "nvidia.com/gpu", "device": "a100"},
               trainer={"parallelism": {"device": "a100"}})
    assert planner_device(same.spec.pod_view()) == "a100"


def test_pods_opt_out_of_autoscaler_consolidation_unless_the_template_says_otherwise():
    annotations = worker_pod(job())["metadata"]["annotations"]
    assert annotations["karpenter.sh/do-not-disrupt"] == "true"
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    mine = {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"}  # an elastic job its team lets be moved
    annotations = worker_pod(job(template={"metadata": {"annotations": mine}}))["metadata"]["annotations"]
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "true"
    assert annotations["karpenter.sh/do-not-disrupt"] == "true"


def test_template_affinity_adds_to_the_topology_affinity():
    node = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["h100"]}]}]}}}
    anti = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"x": "y"}}, "topologyKey": "host"}]}}
    j = job(scheduling={"topologyKey": "zone"}, template={"spec": {"affinity": {**node, **copy.deepcopy(anti)}}})
    affinity = worker_pod(j)["spec"]["affinity"]
    assert affinity["nodeAffinity"] == node["nodeAffinity"]
    terms = affinity["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["topologyKey"] for t in terms] == ["zone", "host"]


def test_pod_view_reads_the_worker_container_not_a_sidecar():
    obj = {"metadata": {"name": "j-worker-0", "uid": "u", "labels": {m.INDEX_LABEL: "0"}},
           "status": {"phase": "Failed", "containerStatuses": [
               {"name": "worker", "state": {"terminated": {"exitCode": 3, "reason": "Error"}}},
               {"name": "zz-side", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}}
    view = pod_view(obj, set())
    assert view is not None and view.exit_code == 3 and view.reason == "Error"


def _initializing(inits: list[dict], statuses: list[dict], phase: str = "Pending") -> dict:
    return {"metadata": {"name": "j-worker-0", "uid": "u", "labels": {m.INDEX_LABEL: "0"}},
            "spec": {"initContainers": inits},
            "status": {"phase": phase, "startTime": "2026-11-30T07:00:00Z", "initContainerStatuses": statuses,
                       "containerStatuses": [{"name": "worker", "state": {"waiting": {"reason": "PodInitializing"}}}]}}


def test_pod_view_names_the_init_container_that_failed():
    obj = _initializing([{"name": "fetch"}, {"name": "next"}], [
        {"name": "fetch", "state": {"terminated": {"exitCode": 3, "reason": "Error",
                                                   "message": "trace\ndataset s3://x missing\n"}}},
        {"name": "next", "state": {"waiting": {"reason": "PodInitializing"}}}], phase="Failed")
    view = pod_view(obj, set())
    assert view is not None and (view.exit_code, view.reason) == (3, "Error")
    assert view.message == "init container fetch failed: dataset s3://x missing" and view.init_container == "fetch"
    # 3 is the trainer's user-error code, not the init container's: its failure is a crash, as any exit but a signal
    assert failure_of(view, 0.0, 60.0) is FailureKind.CRASH and classify_exit(3) is FailureKind.USER_ERROR


def test_pod_view_names_the_init_container_that_cannot_start():
    obj = _initializing([{"name": "side", "restartPolicy": "Always"}, {"name": "fetch"}], [
        {"name": "side", "started": True, "state": {"running": {}}},
        {"name": "fetch", "state": {"waiting": {"reason": "ErrImagePull", "message": "no such host"}}}])
    view = pod_view(obj, set())
    assert view is not None and view.reason == "ErrImagePull" and view.exit_code is None
    assert view.message == "init container fetch: no such host" and view.waiting_since is not None
    assert classify_pod(view.phase, view.reason, view.exit_code) is FailureKind.IMAGE_PULL


def test_pod_view_while_init_containers_run_or_after_them():
    running = _initializing([{"name": "fetch"}], [{"name": "fetch", "state": {"running": {}}}])
    view = pod_view(running, set())
    assert view is not None and view.reason == "PodInitializing" and view.message is None
    done = _initializing([{"name": "fetch"}], [{"name": "fetch", "state": {"terminated": {"exitCode": 0}}}])
    done["status"]["containerStatuses"] = [{"name": "worker", "state": {"terminated": {"exitCode": 1,
                                                                                      "reason": "Error"}}}]
    view = pod_view(done, set())
    assert view is not None and view.exit_code == 1 and view.message is None  # the worker's own failure


def test_a_job_as_the_api_server_stores_it_is_valid_and_renders_the_same():
    """The CRD writes every default into the stored object: a shorthand at its default yields to the template."""
    j = job(accelerator={"resource": "nvidia.com/gpu", "device": "h100"},
            template={"spec": {"terminationGracePeriodSeconds": 45,
                               "containers": [{"name": "worker", "image": "nvcr.io/nvidia/pytorch:24.05-py3"}]}})
    stored = parse_job(j.model_dump(by_alias=True, mode="json"))
    assert worker_pod(stored) == worker_pod(j)
    assert container(worker_pod(stored))["image"] == "nvcr.io/nvidia/pytorch:24.05-py3"
    assert worker_pod(stored)["spec"]["terminationGracePeriodSeconds"] == 45
    assert planner_device(stored.spec.pod_view()) == "h100"
