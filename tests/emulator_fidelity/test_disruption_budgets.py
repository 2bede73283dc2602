"""PodDisruptionBudgets (policy/v1) as a Kubernetes 1.31+ cluster serves them: the API server's validation, the
disruption controller's status, the Eviction API enforcing them, and `kubectl drain` and `kubectl get pdb` on them
with the real kubectl. Each test has its own namespace on one module cluster."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tests.emulator_fidelity.conftest import KUBECTL
from tests.k8s_emulator.fixtures import RunningCluster
from tests.waiting import eventually as wait_for

SLEEP = "import time; time.sleep(600)"
VIOLATION = "Cannot evict pod as it would violate the pod's disruption budget."


class Clients:
    def __init__(self, cluster: RunningCluster) -> None:
        self.cluster = cluster
        self.api_client = config.new_client_from_config(config_file=str(cluster.kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.policy = client.PolicyV1Api(self.api_client)
        self.apps = client.AppsV1Api(self.api_client)


@pytest.fixture(scope="module")
def k8s(two_node_cluster: RunningCluster) -> Iterator[Clients]:
    clients = Clients(two_node_cluster)
    yield clients
    clients.api_client.close()


@pytest.fixture
def ns(k8s: Clients, request: pytest.FixtureRequest) -> str:
    name = request.node.name.removeprefix("test_").replace("_", "-")[:40].strip("-")
    k8s.core.create_namespace({"metadata": {"name": name}})
    return name


# ---- helpers ---------------------------------------------------------------------------------------------------
def _pod(name: str, app: str, code: str = SLEEP, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "python:3.11", "command": ["python", "-c", code]}
    container.update(spec.pop("container", {}))
    return {"metadata": {"name": name, "labels": {"app": app}},
            "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [container], **spec}}


def _deployment(name: str, replicas: int) -> dict[str, Any]:
    template = _pod(name, name)
    template["spec"]["restartPolicy"] = "Always"
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": template["metadata"], "spec": template["spec"]}}}


def _budget(name: str, app: str | None, **spec: Any) -> dict[str, Any]:
    selector = None if app is None else {"matchLabels": {"app": app}} if app else {}
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name},
            "spec": {"selector": selector, **spec}}


def _read(k8s: Clients, ns: str, name: str) -> dict[str, Any]:
    raw = k8s.policy.read_namespaced_pod_disruption_budget(name, ns, _preload_content=False)
    return json.loads(raw.data)


def _condition(budget: dict[str, Any]) -> tuple[str, str, str]:
    found = next(c for c in budget["status"].get("conditions") or [] if c["type"] == "DisruptionAllowed")
    return found["status"], found["reason"], found["message"]


def _status_is(k8s: Clients, ns: str, name: str, timeout: float = 15.0, **wanted: Any) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        budget = _read(k8s, ns, name)
        status = budget["status"]
        return budget if all(status.get(k) == v for k, v in wanted.items()) else None
    return wait_for(check, timeout, f"{ns}/{name} status {wanted}")


def _ready_pods(k8s: Clients, ns: str, app: str, count: int) -> list[client.V1Pod]:
    def check() -> list[client.V1Pod] | None:
        pods = [p for p in k8s.core.list_namespaced_pod(ns, label_selector=f"app={app}").items
                if not p.metadata.deletion_timestamp
                and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]
        return pods if len(pods) == count else None
    return wait_for(check, 20, f"{count} ready pods of {app}")


def _evict(k8s: Clients, ns: str, pod: str, dry_run: str | None = None) -> None:
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=pod, namespace=ns))
    kwargs = {"dry_run": dry_run} if dry_run else {}
    k8s.core.create_namespaced_pod_eviction(pod, ns, body, **kwargs)


def _deleted(k8s: Clients, ns: str, pod: str) -> bool:
    """Terminating, or gone already: a 1 s grace period can end before the next read on a loaded machine."""
    try:
        return k8s.core.read_namespaced_pod(pod, ns).metadata.deletion_timestamp is not None
    except ApiException as gone:
        return gone.status == 404


def _refused(k8s: Clients, ns: str, pod: str) -> tuple[int, dict[str, Any], Any]:
    with pytest.raises(ApiException) as refused:
        _evict(k8s, ns, pod)
    return refused.value.status, json.loads(refused.value.body), refused.value.headers


def _invalid(k8s: Clients, ns: str, body: dict[str, Any]) -> list[dict[str, str]]:
    with pytest.raises(ApiException) as invalid:
        k8s.policy.create_namespaced_pod_disruption_budget(ns, body)
    assert invalid.value.status == 422
    return json.loads(invalid.value.body)["details"]["causes"]


# ---- the API server ------------------------------------------------------------------------------------------
def test_validation_generation_and_status_reset(k8s: Clients, ns: str) -> None:
    [both] = _invalid(k8s, ns, _budget("both", "x", minAvailable=1, maxUnavailable=1))
    assert both["field"] == "spec" and both["message"].startswith(
        "Invalid value: policy.PodDisruptionBudgetSpec{MinAvailable:(*intstr.IntOrString)(0xc") \
        and both["message"].endswith("}: minAvailable and maxUnavailable cannot be both set")
    [percent] = _invalid(k8s, ns, _budget("percent", "x", minAvailable="50"))
    assert percent == {"reason": "FieldValueInvalid", "field": "spec.minAvailable", "message":
                       'Invalid value: intstr.IntOrString{Type:1, IntVal:0, StrVal:"50"}: a valid percent string must '
                       "be a numeric string followed by an ending '%' (e.g. '1%',  or '93%', regex used for "
                       "validation is '[0-9]+%')"}
    [over] = _invalid(k8s, ns, _budget("over", "x", maxUnavailable="101%"))
    assert over["message"].endswith(': must not be greater than 100%') and over["field"] == "spec.maxUnavailable"
    [negative] = _invalid(k8s, ns, _budget("negative", "x", maxUnavailable=-1))
    assert negative["message"] == "Invalid value: -1: must be greater than or equal to 0"
    [policy] = _invalid(k8s, ns, _budget("policy", "x", minAvailable=1, unhealthyPodEvictionPolicy="Sometimes"))
    assert (policy["field"], policy["message"]) == (
        "spec.unhealthyPodEvictionPolicy", 'Unsupported value: "Sometimes": supported values: "AlwaysAllow", '
        '"IfHealthyBudget"')
    sent = {**_budget("fine", "x", minAvailable="100%"), "status": {"disruptionsAllowed": 5, "expectedPods": 9}}
    created = k8s.policy.create_namespaced_pod_disruption_budget(ns, sent)
    assert created.metadata.generation == 1 and created.status.disruptions_allowed == 0  # the client's status dropped
    patched = k8s.policy.patch_namespaced_pod_disruption_budget("fine", ns, {"spec": {"minAvailable": 2}})
    assert patched.metadata.generation == 2
    relabelled = k8s.policy.patch_namespaced_pod_disruption_budget("fine", ns, {"metadata": {"labels": {"a": "b"}}})
    assert relabelled.metadata.generation == 2  # only a spec change moves it


# ---- the disruption controller ------------------------------------------------------------------------------
def test_integer_min_available_counts_the_selected_pods_as_they_turn_ready(k8s: Clients, ns: str) -> None:
    k8s.policy.create_namespaced_pod_disruption_budget(ns, _budget("web", "web", minAvailable=2))
    empty = _status_is(k8s, ns, "web", observedGeneration=1)
    assert empty["status"]["expectedPods"] == 0 and empty["status"]["disruptionsAllowed"] == 0
    assert _condition(empty) == ("False", "InsufficientPods", "")
    k8s.apps.create_namespaced_deployment(ns, _deployment("web", 3))
    budget = _status_is(k8s, ns, "web", timeout=20, currentHealthy=3)
    status = budget["status"]
    assert (status["expectedPods"], status["desiredHealthy"], status["disruptionsAllowed"]) == (3, 2, 1)
    assert _condition(budget) == ("True", "SufficientPods", "") and "disruptedPods" not in status


def test_percentages_and_max_unavailable_read_the_controllers_scale(k8s: Clients, ns: str) -> None:
    k8s.apps.create_namespaced_deployment(ns, _deployment("app", 3))
    k8s.policy.create_namespaced_pod_disruption_budget(ns, _budget("most", "app", maxUnavailable="34%"))
    k8s.policy.create_namespaced_pod_disruption_budget(ns, _budget("least", "app", minAvailable="50%"))
    _ready_pods(k8s, ns, "app", 3)
    # Rounded up both: 34 % of 3 is 2 unavailable (desired 1), 50 % of 3 is 2 available.
    _status_is(k8s, ns, "most", currentHealthy=3, expectedPods=3, desiredHealthy=1, disruptionsAllowed=2)
    _status_is(k8s, ns, "least", currentHealthy=3, expectedPods=3, desiredHealthy=2, disruptionsAllowed=1)
    k8s.apps.patch_namespaced_deployment_scale("app", ns, {"spec": {"replicas": 5}})
    # The scale counts, not the pods there: ceil(1.7) = 2 unavailable of 5.
    _status_is(k8s, ns, "most", expectedPods=5, desiredHealthy=3)


def test_unmanaged_pods_are_left_out_and_scaleless_controllers_fail_the_sync(k8s: Clients, ns: str) -> None:
    k8s.core.create_namespaced_pod(ns, _pod("solo", "solo"))
    k8s.policy.create_namespaced_pod_disruption_budget(ns, _budget("solo", "solo", maxUnavailable=1))
    solo = _status_is(k8s, ns, "solo", currentHealthy=1)
    assert (solo["status"]["expectedPods"], solo["status"]["disruptionsAllowed"]) == (0, 0)
    assert _condition(solo) == ("False", "InsufficientPods", "")
    owner = k8s.core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    owned = _pod("owned", "owned")
    owned["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                                             "uid": owner.metadata.uid, "controller": True}]
    k8s.core.create_namespaced_pod(ns, owned)
    k8s.policy.create_namespaced_pod_disruption_budget(ns, _budget("owned", "owned", maxUnavailable=1))
    failed = wait_for(lambda: (b := _read(k8s, ns, "owned")).get("status", {}).get("conditions") and b,
                      10, "a condition")
    assert _condition(failed) == ("False", "SyncFailed", "configmaps does not implement the scale subresource")
    assert failed["status"]["disruptionsAllowed"] == 0


def test_a_custom_resource_scale_needs_its_replicas_value(k8s: Clients, ns: str) -> None:
    ext = client.ApiextensionsV1Api(k8s.api_client)
    group = f"{ns}.pdb.test"
    ext.create_custom_resource_definition({
        "metadata": {"name": f"sizers.{group}"},
        "spec": {"group": group, "scope": "Namespaced", "names": {"plural": "sizers", "kind": "Sizer"},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "subresources": {"scale": {"specReplicasPath": ".spec.size",
                                                          "statusReplicasPath": ".status.size"}},
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]}})
    custom = client.CustomObjectsApi(k8s.api_client)
    sizer = wait_for(lambda: _created(custom, group, ns), 10, "the Sizer type served")
    pod = _pod("sized", "sized")
    pod["metadata"]["ownerReferences"] = [{"apiVersion": f"{group}/v1", "kind": "Sizer", "name": "s",
                                           "uid": sizer["metadata"]["uid"], "controller": True}]
    k8s.core.create_namespaced_pod(ns, pod)
    k8s.policy.create_namespaced_pod_disruption_budget(ns, _budget("sized", "sized", maxUnavailable=1))
    failed = wait_for(lambda: (b := _read(k8s, ns, "sized")).get("status", {}).get("conditions") and b,
                      10, "a condition")
    assert _condition(failed) == ("False", "SyncFailed",
                                  'Internal error occurred: the spec replicas field ".spec.size" does not exist')
    custom.patch_namespaced_custom_object(group, "v1", ns, "sizers", "s", {"spec": {"size": 3}})
    scaled = _status_is(k8s, ns, "sized", expectedPods=3, desiredHealthy=2)
    assert _condition(scaled)[1] == "InsufficientPods"


def _created(custom: client.CustomObjectsApi, group: str, ns: str) -> dict[str, Any] | None:
    try:
        return custom.create_namespaced_custom_object(group, "v1", ns, "sizers", {
            "apiVersion": f"{group}/v1", "kind": "Sizer", "metadata": {"name": "s"}, "spec": {}})
    except ApiException:
        return None


# ---- the Eviction API ------------------------------------------------------------------------------------------
def test_eviction_takes_a_disruption_from_the_budget_or_is_refused(k8s: Clients, ns: str) -> None:
    k8s.apps.create_namespaced_deployment(ns, _deployment("web", 2))
    k8s.policy.create_namespaced_pod_disruption_budget(ns, _budget("web", "web", minAvailable=2))
    first, second = (p.metadata.name for p in _ready_pods(k8s, ns, "web", 2))
    _status_is(k8s, ns, "web", currentHealthy=2, disruptionsAllowed=0)
    code, body, headers = _refused(k8s, ns, first)
    assert (code, body["reason"], body["message"]) == (429, "TooManyRequests", VIOLATION)
    assert body["details"] == {"causes": [{"reason": "DisruptionBudget",
                                           "message": "The disruption budget web needs 2 healthy pods and has 2 "
                                                      "currently"}]}
    assert "Retry-After" not in headers
    k8s.policy.patch_namespaced_pod_disruption_budget("web", ns, {"spec": {"minAvailable": 1}})
    _status_is(k8s, ns, "web", observedGeneration=2, disruptionsAllowed=1)
    k8s.cluster.api.pause_disruption_controller()
    try:
        _evict(k8s, ns, first, dry_run="All")  # a dry run takes nothing
        assert _read(k8s, ns, "web")["status"]["disruptionsAllowed"] == 1
        _evict(k8s, ns, first)
        budget = _read(k8s, ns, "web")
        assert budget["status"]["disruptionsAllowed"] == 0 and list(budget["status"]["disruptedPods"]) == [first]
        assert _condition(budget)[:2] == ("False", "InsufficientPods")
        assert _deleted(k8s, ns, first)
        assert _refused(k8s, ns, second)[1]["details"]["causes"][0]["message"] == \
            "The disruption budget web needs 1 healthy pods and has 2 currently"
        k8s.policy.patch_namespaced_pod_disruption_budget("web", ns, {"spec": {"minAvailable": 0}})
        code, body, headers = _refused(k8s, ns, second)  # generation 3, observed 2
        assert (code, body["details"]["retryAfterSeconds"], headers["Retry-After"]) == (429, 10, "10")
        assert body["details"]["causes"][0]["message"] == \
            "The disruption budget web is still being processed by the server."
    finally:
        k8s.cluster.api.pause_disruption_controller(False)
    settled = _status_is(k8s, ns, "web", observedGeneration=3, currentHealthy=2)
    assert "disruptedPods" not in settled["status"]  # the evicted pod went; its replacement is Ready


def test_unready_pods_follow_the_unhealthy_pod_eviction_policy(k8s: Clients, ns: str) -> None:
    never_ready = {"readinessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 1}}
    k8s.core.create_namespaced_pod(ns, _pod("healthy", "mixed"))
    k8s.core.create_namespaced_pod(ns, _pod("unready", "mixed", container=never_ready))
    k8s.policy.create_namespaced_pod_disruption_budget(ns, _budget("mixed", "mixed", minAvailable=2))
    _status_is(k8s, ns, "mixed", currentHealthy=1, desiredHealthy=2, expectedPods=2)
    wait_for(lambda: k8s.core.read_namespaced_pod("unready", ns).status.phase == "Running", 10, "Running")
    # IfHealthyBudget (the default) while the application is disrupted: the budget decides, and it is spent.
    assert _refused(k8s, ns, "unready")[1]["details"]["causes"][0]["message"] == \
        "The disruption budget mixed needs 2 healthy pods and has 1 currently"
    k8s.policy.patch_namespaced_pod_disruption_budget("mixed", ns, {"spec": {"unhealthyPodEvictionPolicy":
                                                                             "AlwaysAllow"}})
    _status_is(k8s, ns, "mixed", observedGeneration=2)
    _evict(k8s, ns, "unready")
    assert "disruptedPods" not in _read(k8s, ns, "mixed")["status"]  # nothing taken from the budget
    # IfHealthyBudget while healthy enough (1 of 1): an unready pod goes, though no disruption is allowed.
    k8s.core.create_namespaced_pod(ns, _pod("unready-2", "mixed", container=never_ready))
    k8s.policy.patch_namespaced_pod_disruption_budget("mixed", ns, {"spec": {
        "minAvailable": 1, "unhealthyPodEvictionPolicy": "IfHealthyBudget"}})
    _status_is(k8s, ns, "mixed", observedGeneration=3, currentHealthy=1, desiredHealthy=1, disruptionsAllowed=0)
    wait_for(lambda: k8s.core.read_namespaced_pod("unready-2", ns).status.phase == "Running", 10, "Running")
    _evict(k8s, ns, "unready-2")
    assert _refused(k8s, ns, "healthy")[0] == 429


def test_pending_and_finished_pods_are_evicted_whatever_the_budget(k8s: Clients, ns: str) -> None:
    k8s.core.create_namespaced_pod(ns, _pod("done", "any", code="pass"))
    k8s.core.create_namespaced_pod(ns, _pod("waiting", "any", nodeSelector={"kubernetes.io/hostname": "nowhere"}))
    k8s.core.create_namespaced_pod(ns, _pod("running", "any"))
    k8s.policy.create_namespaced_pod_disruption_budget(ns, _budget("none", "any", maxUnavailable=0))
    wait_for(lambda: k8s.core.read_namespaced_pod("done", ns).status.phase == "Succeeded", 15, "Succeeded")
    _ready_pods(k8s, ns, "any", 1)
    assert _refused(k8s, ns, "running")[0] == 429
    for name in ("done", "waiting"):
        _evict(k8s, ns, name)
        with pytest.raises(ApiException):
            k8s.core.read_namespaced_pod(name, ns)  # gone at once: unbound or finished


def test_a_pod_under_two_budgets_cannot_be_evicted(k8s: Clients, ns: str) -> None:
    k8s.core.create_namespaced_pod(ns, _pod("shared", "shared"))
    k8s.policy.create_namespaced_pod_disruption_budget(ns, _budget("named", "shared", minAvailable=1))
    k8s.policy.create_namespaced_pod_disruption_budget(ns, _budget("everything", "", minAvailable=1))  # {}: all
    k8s.policy.create_namespaced_pod_disruption_budget(ns, _budget("nothing", None, minAvailable=1))  # null: none
    _ready_pods(k8s, ns, "shared", 1)
    code, body, _ = _refused(k8s, ns, "shared")
    assert code == 500 and body["message"] == ("This pod has more than one PodDisruptionBudget, which the eviction "
                                               "subresource does not support.") and "reason" not in body
    k8s.policy.delete_namespaced_pod_disruption_budget("everything", ns)
    _status_is(k8s, ns, "named", currentHealthy=1)
    assert _refused(k8s, ns, "shared")[0] == 429  # one budget now: the null selector selects nothing
    assert _read(k8s, ns, "nothing")["status"]["expectedPods"] == 0


# ---- kubectl -----------------------------------------------------------------------------------------------------
def _kubectl(cluster: RunningCluster, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    if not KUBECTL.exists():
        pytest.skip("run scripts/install-tools.sh for .tools/bin/kubectl")
    return subprocess.run([str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), *args], input=stdin,
                          capture_output=True, text=True, timeout=90)


def test_kubectl_get_pdb_and_its_validation(k8s: Clients, ns: str) -> None:
    applied = _kubectl(k8s.cluster, "apply", "-n", ns, "-f", "-", stdin=json.dumps(_budget("min-int", "a",
                                                                                          minAvailable=2)))
    assert applied.returncode == 0, applied.stderr
    created = _kubectl(k8s.cluster, "create", "pdb", "max-pct", "-n", ns, "--selector=app=b",
                       "--max-unavailable=25%")  # a protobuf body, as typed clients send
    assert created.returncode == 0, created.stderr
    assert _read(k8s, ns, "max-pct")["spec"] == {"maxUnavailable": "25%", "selector": {"matchLabels": {"app": "b"}}}
    listed = _kubectl(k8s.cluster, "get", "pdb", "-n", ns)
    rows = [line.split() for line in listed.stdout.splitlines()]
    assert listed.stdout.split()[:8] == ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED", "DISRUPTIONS",
                                         "AGE"], listed.stdout
    assert [r[:4] for r in rows[1:]] == [["max-pct", "N/A", "25%", "0"], ["min-int", "2", "N/A", "0"]]
    both = _budget("both", "a", minAvailable=1, maxUnavailable=1)
    refused = _kubectl(k8s.cluster, "apply", "-n", ns, "-f", "-", stdin=json.dumps(both))
    assert refused.returncode != 0 and "minAvailable and maxUnavailable cannot be both set" in refused.stderr


class Drain:
    """`kubectl drain` in the background, its output lines gathered as they come."""

    def __init__(self, cluster: RunningCluster, node: str, *flags: str) -> None:
        if not KUBECTL.exists():
            pytest.skip("run scripts/install-tools.sh for .tools/bin/kubectl")
        self.process = subprocess.Popen([str(KUBECTL), "--kubeconfig", str(cluster.kubeconfig), "drain", node,
                                         "--timeout=60s", *flags], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
        self.lines: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream,), daemon=True)
                         for stream in (self.process.stdout, self.process.stderr)]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: Any) -> None:
        self.lines.extend(iter(stream.readline, ""))

    def finish(self) -> str:
        """Its exit status checked; all it printed."""
        self.process.wait(60)
        for reader in self._readers:
            reader.join(5)
        assert self.process.returncode == 0, "".join(self.lines)
        return "".join(self.lines)


def test_kubectl_drain_waits_on_a_budget(k8s: Clients, ns: str) -> None:
    k8s.apps.create_namespaced_deployment(ns, _deployment("web", 1))
    k8s.policy.create_namespaced_pod_disruption_budget(ns, _budget("web", "web", minAvailable=1))
    [pod] = _ready_pods(k8s, ns, "web", 1)
    _status_is(k8s, ns, "web", currentHealthy=1, disruptionsAllowed=0)
    node, name, selector = pod.spec.node_name, pod.metadata.name, "--pod-selector=app=web"
    retry = (f'error when evicting pods/"{name}" -n "{ns}" (will retry after 5s): Cannot evict pod as it would '
             "violate the pod's disruption budget.\n")
    try:
        drain = Drain(k8s.cluster, node, selector)
        wait_for(lambda: retry in drain.lines, 20, "drain's retry line")
        k8s.policy.patch_namespaced_pod_disruption_budget("web", ns, {"spec": {"minAvailable": 0}})
        out = drain.finish()
        assert f"pod/{name} evicted" in out and f"node/{node} drained" in out
        k8s.core.patch_node(node, json.loads('{"spec": {"unschedulable": null}}'))
        # The replacement, on the other node: with --disable-eviction, drain deletes it despite the budget.
        k8s.policy.patch_namespaced_pod_disruption_budget("web", ns, {"spec": {"minAvailable": 1}})
        [moved] = _ready_pods(k8s, ns, "web", 1)
        _status_is(k8s, ns, "web", observedGeneration=3, currentHealthy=1, disruptionsAllowed=0)
        out = Drain(k8s.cluster, moved.spec.node_name, selector, "--disable-eviction").finish()
        assert f"pod/{moved.metadata.name} deleted" in out and "error when evicting" not in out
    finally:
        for each in ("node-1", "node-2"):
            k8s.core.patch_node(each, json.loads('{"spec": {"unschedulable": null}}'))
