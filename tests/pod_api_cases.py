"""The values the Pod API refuses in a worker pod, as changes to a valid TrainingJob, each with the field its
refusal names: refused by `flywheel plan` (tests/spec/test_pod_rules.py) and, at `kubectl apply`, by the CRD on a
real API server, whose Pod API refuses the operator's pods for them too (tests/k8s/test_apply_time_refusals.py)."""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel
from pydantic.alias_generators import to_snake

from flywheel.operator.manifests import OperatorSettings
from flywheel.operator.render import DEFAULT_ETCD, render_objects
from flywheel.spec import parse_job
from flywheel.spec.job import Accelerator


def merged(base: Any, patch: Any) -> Any:
    """`patch` over `base`: mappings merge, lists merge item by item (longer lists add), the rest replaces."""
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{k: merged(base.get(k), v) for k, v in patch.items()}}
    if isinstance(base, list) and isinstance(patch, list):
        return [merged(b, p) for b, p in zip(base, patch, strict=False)] + base[len(patch):] + patch[len(base):]
    return copy.deepcopy(patch)


BASE: dict[str, Any] = {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob",
                        "metadata": {"name": "refusal", "namespace": "default"},
                        "spec": {"replicas": {"min": 1, "max": 1}, "image": "flywheel:latest"}}


def spec(**fields: Any) -> dict[str, Any]:
    return {"spec": fields}


def pod_spec(**fields: Any) -> dict[str, Any]:
    return spec(template={"spec": fields})


def worker(**fields: Any) -> dict[str, Any]:
    return pod_spec(containers=[{"name": "worker", **fields}])


def ports(*items: dict[str, Any]) -> dict[str, Any]:
    return worker(ports=list(items))


GPU = "nvidia.com/gpu"
# (id, the change to a valid job, the field the refusal names; a repeated key of a list-map is named by its list).
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("name-starts-with-a-digit", {"metadata": {"name": "1job"}}, "metadata.name"),
    ("name-too-long-for-pod-names", {"metadata": {"name": "a" * 51}}, "metadata.name"),
    ("name-with-a-dot", {"metadata": {"name": "a.b"}}, "metadata.name"),
    ("replicas-beyond-the-name-room", spec(replicas={"min": 1, "max": 100_001}), "spec.replicas.max"),
    ("image-empty", spec(image=""), "spec.image"),
    ("image-with-a-space", spec(image="flywheel: latest"), "spec.image"),
    ("resource-amount-not-a-quantity", spec(resources={"requests": {"cpu": "lots"}}), "spec.resources.requests"),
    ("resource-amount-negative", spec(resources={"limits": {"cpu": -1}}), "spec.resources.limits"),
    ("resource-name-not-standard", spec(resources={"requests": {"gpu": 1}}), "spec.resources.requests"),
    ("resource-name-requests-prefix", spec(resources={"limits": {"requests.example.com/x": 1}}),
     "spec.resources.limits"),
    ("request-above-limit", spec(resources={"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}),
     "spec.resources.requests"),
    ("extended-request-without-limit", spec(resources={"requests": {GPU: 1}}), "spec.resources.limits"),
    ("extended-request-below-limit", spec(resources={"requests": {GPU: 1}, "limits": {GPU: 2}}),
     "spec.resources.requests"),
    ("extended-fraction", spec(resources={"limits": {GPU: "0.5"}}), "spec.resources.limits"),
    ("hugepages-without-cpu-or-memory", spec(resources={"limits": {"hugepages-2Mi": "4Mi"}}), "spec.resources"),
    ("resources-claims", spec(resources={"claims": [{"name": "x"}]}), "spec.resources"),
    ("accelerator-without-domain", spec(accelerator={"resource": "gpu"}), "spec.accelerator.resource"),
    ("accelerator-native", spec(accelerator={"resource": "kubernetes.io/gpu"}), "spec.accelerator.resource"),
    ("priority-class-capitals", spec(scheduling={"priorityClassName": "High"}), "spec.scheduling.priorityClassName"),
    ("queue-not-a-label-value", spec(scheduling={"queue": "team_a"}), "spec.scheduling.queue"),
    ("topology-key-bad", spec(scheduling={"topologyKey": "-zone"}), "spec.scheduling.topologyKey"),
    ("label-key", spec(template={"metadata": {"labels": {"bad key": "x"}}}), "spec.template.metadata.labels"),
    ("label-value", spec(template={"metadata": {"labels": {"team": "a b"}}}), "spec.template.metadata.labels"),
    ("label-value-too-long", spec(template={"metadata": {"labels": {"team": "a" * 64}}}),
     "spec.template.metadata.labels"),
    ("annotation-key", spec(template={"metadata": {"annotations": {"a/b/c": "x"}}}),
     "spec.template.metadata.annotations"),
    ("node-selector-value", pod_spec(nodeSelector={"disk": "ssd/fast"}), "spec.template.spec.nodeSelector"),
    ("toleration-without-key-not-exists", pod_spec(tolerations=[{"operator": "Equal", "value": "x"}]),
     "spec.template.spec.tolerations[0].operator"),
    ("toleration-exists-with-value", pod_spec(tolerations=[{"key": "k", "operator": "Exists", "value": "v"}]),
     "spec.template.spec.tolerations[0].value"),
    ("toleration-operator", pod_spec(tolerations=[{"key": "k", "operator": "Sometimes"}]),
     "spec.template.spec.tolerations[0].operator"),
    ("toleration-effect", pod_spec(tolerations=[{"key": "k", "effect": "NoRun"}]),
     "spec.template.spec.tolerations[0].effect"),
    ("toleration-seconds-without-no-execute",
     pod_spec(tolerations=[{"key": "k", "tolerationSeconds": 5, "effect": "NoSchedule"}]),
     "spec.template.spec.tolerations[0].effect"),
    ("toleration-key", pod_spec(tolerations=[{"key": "bad key", "operator": "Exists"}]),
     "spec.template.spec.tolerations[0].key"),
    ("toleration-value", pod_spec(tolerations=[{"key": "k", "value": "a b"}]),
     "spec.template.spec.tolerations[0].value"),
    ("pod-priority-class", pod_spec(priorityClassName="High"), "spec.template.spec.priorityClassName"),
    ("pod-service-account", pod_spec(serviceAccountName="bad_sa"), "spec.template.spec.serviceAccountName"),
    ("pod-runtime-class", pod_spec(runtimeClassName="Nvidia"), "spec.template.spec.runtimeClassName"),
    ("pod-dns-policy", pod_spec(dnsPolicy="Sometimes"), "spec.template.spec.dnsPolicy"),
    ("pod-dns-none-without-config", pod_spec(dnsPolicy="None"), "spec.template.spec.dnsConfig"),
    ("pod-priority", pod_spec(priority=1000), "spec.template.spec.priority"),
    ("pod-overhead", pod_spec(overhead={"cpu": "1"}), "spec.template.spec.overhead"),
    ("pod-deadline", pod_spec(activeDeadlineSeconds=0), "spec.template.spec.activeDeadlineSeconds"),
    ("pod-preemption", pod_spec(preemptionPolicy="Sometimes"), "spec.template.spec.preemptionPolicy"),
    ("scheduling-gate-twice", pod_spec(schedulingGates=[{"name": "a"}, {"name": "a"}]),
     "spec.template.spec.schedulingGates"),
    ("scheduling-gate-name", pod_spec(schedulingGates=[{"name": "bad gate"}]),
     "spec.template.spec.schedulingGates[0].name"),
    ("spread-skew", pod_spec(topologySpreadConstraints=[
        {"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]),
     "spec.template.spec.topologySpreadConstraints[0].maxSkew"),
    ("spread-when", pod_spec(topologySpreadConstraints=[
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Maybe"}]),
     "spec.template.spec.topologySpreadConstraints[0].whenUnsatisfiable"),
    ("pod-run-as-user", pod_spec(securityContext={"runAsUser": -1}), "spec.template.spec.securityContext.runAsUser"),
    ("seccomp-localhost-without-profile", pod_spec(securityContext={"seccompProfile": {"type": "Localhost"}}),
     "spec.template.spec.securityContext.seccompProfile"),
    ("pod-affinity-without-topology-key", pod_spec(affinity={"podAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}, "topologyKey": ""}]}}),
     "spec.template.spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey"),
    ("node-affinity-operator", pod_spec(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Like", "values": ["x"]}]}]}}}),
     "operator"),
    ("container-name", pod_spec(containers=[{"name": "worker"}, {"name": "Side_Car", "image": "busybox"}]),
     "spec.template.spec.containers[1].name"),
    ("container-twice", pod_spec(containers=[{"name": "worker"}, {"name": "side", "image": "busybox"},
                                             {"name": "side", "image": "busybox"}]),
     "spec.template.spec.containers"),
    ("sidecar-without-image", pod_spec(containers=[{"name": "worker"}, {"name": "side"}]),
     "spec.template.spec.containers"),
    ("init-without-image", pod_spec(initContainers=[{"name": "init"}]), "spec.template.spec.initContainers"),
    ("init-named-worker", pod_spec(initContainers=[{"name": "worker", "image": "busybox"}]),
     "spec.template.spec.initContainers"),
    ("init-restart-policy", pod_spec(initContainers=[{"name": "init", "image": "busybox", "restartPolicy": "Later"}]),
     "spec.template.spec.initContainers[0].restartPolicy"),
    ("container-image-space", pod_spec(containers=[{"name": "worker"}, {"name": "side", "image": " busybox"}]),
     "spec.template.spec.containers[1].image"),
    ("port-zero", ports({"containerPort": 0}), "spec.template.spec.containers[0].ports[0].containerPort"),
    ("port-too-big", ports({"containerPort": 70000}), "spec.template.spec.containers[0].ports[0].containerPort"),
    ("host-port-too-big", ports({"containerPort": 80, "hostPort": 70000}),
     "spec.template.spec.containers[0].ports[0].hostPort"),
    ("port-name-underscore", ports({"containerPort": 80, "name": "http_port"}),
     "spec.template.spec.containers[0].ports[0].name"),
    ("port-name-digits", ports({"containerPort": 80, "name": "8080"}),
     "spec.template.spec.containers[0].ports[0].name"),
    ("port-name-too-long", ports({"containerPort": 80, "name": "a" * 16}),
     "spec.template.spec.containers[0].ports[0].name"),
    ("port-name-twice", ports({"containerPort": 80, "name": "web"}, {"containerPort": 81, "name": "web"}),
     "spec.template.spec.containers[0].ports"),
    ("port-protocol", ports({"containerPort": 80, "protocol": "HTTP"}),
     "spec.template.spec.containers[0].ports[0].protocol"),
    ("port-named-like-the-operators", ports({"containerPort": 80, "name": "metrics"}), "spec.template.spec"),
    ("host-network-port-mismatch", merged(pod_spec(hostNetwork=True), ports({"containerPort": 80, "hostPort": 81})),
     "spec.template.spec"),
    ("env-name-with-equals", worker(env=[{"name": "A=B", "value": "x"}]),
     "spec.template.spec.containers[0].env[0].name"),
    ("env-name-empty", worker(env=[{"name": "", "value": "x"}]), "spec.template.spec.containers[0].env[0].name"),
    ("env-value-and-value-from", worker(env=[{"name": "A", "value": "x", "valueFrom": {
        "fieldRef": {"fieldPath": "metadata.name"}}}]), "spec.template.spec.containers[0].env[0].valueFrom"),
    ("env-value-from-nothing", worker(env=[{"name": "A", "valueFrom": {}}]),
     "spec.template.spec.containers[0].env[0].valueFrom"),
    ("env-from-nothing", worker(envFrom=[{"prefix": "X_"}]), "spec.template.spec.containers[0].envFrom[0]"),
    ("mount-of-no-volume", worker(volumeMounts=[{"name": "data", "mountPath": "/data"}]), "spec.template.spec"),
    ("mount-path-empty", merged(pod_spec(volumes=[{"name": "data", "emptyDir": {}}]),
                                worker(volumeMounts=[{"name": "data", "mountPath": ""}])),
     "spec.template.spec.containers[0].volumeMounts[0].mountPath"),
    ("mount-sub-path-up", merged(pod_spec(volumes=[{"name": "data", "emptyDir": {}}]),
                                 worker(volumeMounts=[{"name": "data", "mountPath": "/data", "subPath": "../x"}])),
     "spec.template.spec.containers[0].volumeMounts[0].subPath"),
    ("mount-sub-path-absolute", merged(pod_spec(volumes=[{"name": "data", "emptyDir": {}}]),
                                       worker(volumeMounts=[{"name": "data", "mountPath": "/data", "subPath": "/x"}])),
     "spec.template.spec.containers[0].volumeMounts[0].subPath"),
    ("mount-path-twice", merged(pod_spec(volumes=[{"name": "data", "emptyDir": {}}]), worker(volumeMounts=[
        {"name": "data", "mountPath": "/data"}, {"name": "data", "mountPath": "/data"}])),
     "volumeMounts"),
    ("mount-bidirectional-unprivileged", merged(pod_spec(volumes=[{"name": "data", "emptyDir": {}}]), worker(
        volumeMounts=[{"name": "data", "mountPath": "/data", "mountPropagation": "Bidirectional"}])),
     "spec.template.spec.containers[0].volumeMounts"),
    ("container-quantity", worker(resources={"limits": {"cpu": "lots"}}),
     "spec.template.spec.containers[0].resources.limits"),
    ("container-extended-without-limit", worker(resources={"requests": {GPU: 1}}),
     "spec.template.spec.containers[0].resources.limits"),
    ("container-resource-name", worker(resources={"limits": {"gpu": 1}}),
     "spec.template.spec.containers[0].resources.limits"),
    ("pull-policy", worker(imagePullPolicy="Sometimes"), "spec.template.spec.containers[0].imagePullPolicy"),
    ("termination-message-policy", pod_spec(containers=[{"name": "worker"}, {
        "name": "side", "image": "busybox", "terminationMessagePolicy": "Never"}]),
     "spec.template.spec.containers[1].terminationMessagePolicy"),
    ("worker-restart-policy", worker(restartPolicy="Always"), "spec.template.spec.containers[0].restartPolicy"),
    ("probe-without-handler", worker(livenessProbe={"periodSeconds": 5}),
     "spec.template.spec.containers[0].livenessProbe"),
    ("probe-port-zero", worker(readinessProbe={"httpGet": {"port": 0}}),
     "spec.template.spec.containers[0].readinessProbe.httpGet.port"),
    ("probe-port-name", worker(readinessProbe={"tcpSocket": {"port": "not_a_port"}}),
     "spec.template.spec.containers[0].readinessProbe.tcpSocket.port"),
    ("liveness-success-threshold", worker(livenessProbe={"exec": {"command": ["true"]}, "successThreshold": 2}),
     "spec.template.spec.containers[0].livenessProbe.successThreshold"),
    ("pre-stop-without-handler", worker(lifecycle={"preStop": {}}),
     "spec.template.spec.containers[0].lifecycle.preStop"),
    ("container-run-as-user", worker(securityContext={"runAsUser": -5}),
     "spec.template.spec.containers[0].securityContext.runAsUser"),
    ("volume-name", pod_spec(volumes=[{"name": "Data", "emptyDir": {}}]), "spec.template.spec.volumes[0].name"),
    ("volume-twice", pod_spec(volumes=[{"name": "a", "emptyDir": {}}, {"name": "a", "emptyDir": {}}]),
     "spec.template.spec.volumes"),
    ("volume-named-like-the-operators", pod_spec(volumes=[{"name": "dshm", "emptyDir": {}}]),
     "spec.template.spec.volumes[0].name"),
    ("volume-two-sources", pod_spec(volumes=[{"name": "a", "emptyDir": {}, "hostPath": {"path": "/x"}}]),
     "spec.template.spec.volumes[0]"),
    ("volume-size-limit", pod_spec(volumes=[{"name": "a", "emptyDir": {"sizeLimit": "big"}}]),
     "spec.template.spec.volumes[0].emptyDir.sizeLimit"),
    ("volume-mode", pod_spec(volumes=[{"name": "a", "configMap": {"name": "c", "defaultMode": 1000}}]),
     "spec.template.spec.volumes[0].configMap.defaultMode"),
    ("volume-claim-empty", pod_spec(volumes=[{"name": "a", "persistentVolumeClaim": {"claimName": ""}}]),
     "spec.template.spec.volumes[0].persistentVolumeClaim.claimName"),
    ("volume-secret-unnamed", pod_spec(volumes=[{"name": "a", "secret": {}}]),
     "spec.template.spec.volumes[0].secret.secretName"),
    ("too-many-containers", pod_spec(containers=[{"name": "worker"}] + [
        {"name": f"c{i}", "image": "busybox"} for i in range(16)]), "spec.template.spec.containers"),
    ("annotations-too-big", spec(template={"metadata": {"annotations": {"big": "x" * 262_100}}}),
     "spec.template.metadata.annotations"),
    ("sysctl-name", pod_spec(securityContext={"sysctls": [{"name": "bad name", "value": "1"}]}),
     "spec.template.spec.securityContext.sysctls[0].name"),
    ("apparmor-localhost-without-profile", pod_spec(securityContext={"appArmorProfile": {"type": "Localhost"}}),
     "spec.template.spec.securityContext.appArmorProfile"),
    ("pod-os-windows", pod_spec(os={"name": "windows"}), "spec.template.spec.os.name"),
    ("host-users-with-host-network", pod_spec(hostUsers=False, hostNetwork=True), "spec.template.spec.hostUsers"),
    ("share-process-namespace-with-host-pid", pod_spec(shareProcessNamespace=True, hostPID=True),
     "spec.template.spec.shareProcessNamespace"),
    ("host-alias-ip", pod_spec(hostAliases=[{"ip": "not-an-ip", "hostnames": ["a"]}]),
     "spec.template.spec.hostAliases[0].ip"),
    ("nameserver-ip", pod_spec(dnsPolicy="None", dnsConfig={"nameservers": ["dns.example.com"]}),
     "spec.template.spec.dnsConfig.nameservers[0]"),
    ("pod-level-gpu", pod_spec(resources={"limits": {GPU: 1}}), "spec.template.spec.resources.limits"),
    ("spread-twice", pod_spec(topologySpreadConstraints=[
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"},
        {"maxSkew": 2, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]),
     "spec.template.spec.topologySpreadConstraints"),
    ("spread-min-domains-anyway", pod_spec(topologySpreadConstraints=[
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway", "minDomains": 2}]),
     "spec.template.spec.topologySpreadConstraints[0].minDomains"),
    ("selector-in-without-values", pod_spec(affinity={"podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": "zone", "labelSelector": {
            "matchExpressions": [{"key": "app", "operator": "In"}]}}]}}),
     "spec.template.spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector."
     "matchExpressions[0].values"),
    ("selector-label-value", pod_spec(affinity={"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "a b"}}}]}}),
     "spec.template.spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector."
     "matchLabels"),
    ("node-exists-with-values", pod_spec(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["x"]}]}]}}}),
     "matchExpressions[0].values"),
    ("node-no-terms", pod_spec(affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": []}}}), "nodeSelectorTerms"),
    ("env-field-path", worker(env=[{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.bogus"}}}]),
     "spec.template.spec.containers[0].env[0].valueFrom.fieldRef.fieldPath"),
    ("env-resource-field", worker(env=[{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.gpu"}}}]),
     "spec.template.spec.containers[0].env[0].valueFrom.resourceFieldRef.resource"),
    ("env-config-map-key", worker(env=[{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "a/b"}}}]),
     "spec.template.spec.containers[0].env[0].valueFrom.configMapKeyRef.key"),
    ("probe-grace-zero", worker(livenessProbe={"exec": {"command": ["true"]}, "terminationGracePeriodSeconds": 0}),
     "spec.template.spec.containers[0].livenessProbe.terminationGracePeriodSeconds"),
    ("pre-stop-sleep-negative", worker(lifecycle={"preStop": {"sleep": {"seconds": -1}}}),
     "spec.template.spec.containers[0].lifecycle.preStop.sleep.seconds"),
    ("privileged-worker-without-escalation", worker(securityContext={"privileged": True}), "spec.template.spec"),
    ("privileged-without-escalation", pod_spec(containers=[{"name": "worker"}, {
        "name": "side", "image": "busybox", "securityContext": {"privileged": True,
                                                                 "allowPrivilegeEscalation": False}}]),
     "spec.template.spec.containers[1].securityContext"),
    ("proc-mount", worker(securityContext={"procMount": "Weird"}),
     "spec.template.spec.containers[0].securityContext.procMount"),
    ("resize-restart", worker(resizePolicy=[{"resourceName": "cpu", "restartPolicy": "RestartContainer"}]),
     "spec.template.spec.containers[0].resizePolicy[0].restartPolicy"),
    ("recursive-read-only-writable", merged(pod_spec(volumes=[{"name": "data", "emptyDir": {}}]), worker(
        volumeMounts=[{"name": "data", "mountPath": "/data", "recursiveReadOnly": "Enabled"}])),
     "spec.template.spec.containers[0].volumeMounts[0]"),
    ("empty-dir-medium", pod_spec(volumes=[{"name": "a", "emptyDir": {"medium": "Disk"}}]),
     "spec.template.spec.volumes[0].emptyDir.medium"),
    ("host-path-type", pod_spec(volumes=[{"name": "a", "hostPath": {"path": "/x", "type": "Folder"}}]),
     "spec.template.spec.volumes[0].hostPath.type"),
    ("csi-without-driver", pod_spec(volumes=[{"name": "a", "csi": {"driver": ""}}]),
     "spec.template.spec.volumes[0].csi.driver"),
    ("ephemeral-without-template", pod_spec(volumes=[{"name": "a", "ephemeral": {}}]),
     "spec.template.spec.volumes[0].ephemeral"),
    ("config-map-item-up", pod_spec(volumes=[{"name": "a", "configMap": {"name": "c", "items": [
        {"key": "k", "path": "../x"}]}}]), "spec.template.spec.volumes[0].configMap.items[0].path"),
]
# Cases whose rule is stricter than the Pod API on purpose, or whose job cannot be built into pods at all.
NO_POD = {
    "replicas-beyond-the-name-room",  # 100,001 pods
    "resources-claims",  # claims go in the template's container
    "too-many-containers",  # a bound of the CRD's, for CEL's cost budget
    "image-with-a-space",  # inside the reference: the kubelet refuses it, the API server only at either end
    "accelerator-native",  # a native resource is no device
    "worker-restart-policy",  # the operator decides restarts
    "queue-not-a-label-value",  # a valid label value, but no LocalQueue's name
    "empty-dir-medium",  # the kubelet refuses it
    # Names: a Service's name must be a DNS-1035 label where relaxed Service names are off (before 1.37's
    # default), and a job's name leaves room for every replica index the schema allows.
    "name-starts-with-a-digit", "name-too-long-for-pod-names",
}


def operator_objects(change: dict[str, Any]) -> list[dict[str, Any]]:
    """What the operator would create for the valid job with `change` set after validation (as a job that reached
    it without the CRD's rules), made by its own builders (`flywheel render`'s)."""
    valid = parse_job(BASE)
    updates: dict[str, Any] = {}
    for key, value in change.get("spec", {}).items():
        current = getattr(valid.spec, to_snake(key))
        if key == "accelerator":
            value = Accelerator.model_construct(resource=value["resource"], device=None)
        elif isinstance(current, BaseModel):
            value = current.model_copy(update={to_snake(k): v for k, v in value.items()})
        updates[to_snake(key)] = value
    metadata = valid.metadata.model_copy(update=change.get("metadata", {}))
    job = valid.model_copy(update={"metadata": metadata, "spec": valid.spec.model_copy(update=updates)})
    return render_objects(job, OperatorSettings(etcd_endpoints=DEFAULT_ETCD))


# Values the Pod API refuses that the CRD cannot afford to check (CEL prices every quantity under the list of
# containers as a whole request long): the worker container's amounts. `flywheel plan` and the operator refuse them.
GAPS: list[tuple[str, dict[str, Any], str]] = [
    ("container-request-above-limit", worker(resources={"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}),
     "spec.template.spec.containers[0].resources"),
    ("container-extended-fraction", worker(resources={"limits": {GPU: "0.5"}}),
     "spec.template.spec.containers[0].resources"),
    ("container-extended-below-limit", worker(resources={"requests": {GPU: 1}, "limits": {GPU: 2}}),
     "spec.template.spec.containers[0].resources"),
    ("shorthand-request-above-template-limit", merged(spec(resources={"requests": {"cpu": "4"}}),
                                                      worker(resources={"limits": {"cpu": "2"}})),
     "spec.template.spec.containers[0].resources"),
]


def job(change: dict[str, Any]) -> dict[str, Any]:
    return merged(BASE, change)


