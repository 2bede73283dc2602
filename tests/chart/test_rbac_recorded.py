"""The chart's RBAC equals what the code asks for, derived from the requests it really makes on the real API server.

Each component runs under the chart's own ServiceAccount, with the chart's Roles, ClusterRoles and bindings applied
to the test cluster (the real control plane) and a bound token from the TokenRequest API: kube-apiserver's RBAC
authorizer decides each request by the chart's grants alone, and its audit log (tests/cluster/audit.py) records each
one as the authorizer sees it (verb, apiGroup, resource[/subresource], namespace), refused or not. The operator runs
as a process with exactly the chart Deployment's arguments, and one job goes from apply to Succeeded to its TTL
deletion (kopf's watches, finalizer and namespace/CRD observers, the executor's pods, Service, PodGroup, status,
events, nodes and job deletion); then the paths one clean run does not take are driven in-process with the same
token (tests/chart/rbac_drivers.py: a worker-scope restart, every health-monitor action). The REST API is wired as
`flywheel api` wires it, with the chart's API arguments and its account's token.

Each component's requests (the audit log's window over its run) are compared with the grants the rendered chart
gives that ServiceAccount (tests/chart/rbac.py): a request no grant allows is a missing permission (and the API
server answered it 403), a grant no request needs is an excess one. Both fail.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.kube.client import Connection, Kube
from tests.chart import rbac
from tests.chart.conftest import NAMESPACE, RELEASE, ROOT, find_tool, render
from tests.chart.rbac_drivers import drive_api, drive_executor, drive_health, kubeconfig_with_token
from tests.chart.test_apply_test_cluster import free_port
from tests.cluster.audit import Identity, Recorded, service_account
from tests.cluster.cluster import TestCluster
from tests.cluster.fixtures import start_cluster
from tests.waiting import eventually

pytestmark = pytest.mark.slow

KUBECTL = find_tool("kubectl")
OPERATOR_SA, API_SA = f"{RELEASE}-flywheel", f"{RELEASE}-flywheel-api"
PODGROUP_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "podgroups.scheduling.x-k8s.io"},
    "spec": {"group": "scheduling.x-k8s.io", "scope": "Namespaced",
             "names": {"plural": "podgroups", "singular": "podgroup", "kind": "PodGroup"},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}
# One shared host: workers serve no metrics port, one torch thread each (values, not code paths). And no etcd
# liveness watch: with a job this short a worker's lease key can vanish before its pod reports Succeeded, which the
# operator takes for a lost worker and restarts the job (the same requests either way; the liveness watch talks to
# etcd, not to the Kubernetes API).
HOST_VALUES = ("operator.workerMetricsPortBase=0", "operator.workerEnv.OMP_NUM_THREADS=1",
               "operator.extraArgs={--no-worker-liveness}")


RBAC_KINDS = ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")


@dataclass
class Env:
    cluster: TestCluster
    tmp: Path

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        result = subprocess.run([str(KUBECTL), "--kubeconfig", str(self.cluster.kubeconfig), *args], input=stdin,
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == 0 or not check, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout if result.returncode == 0 else ""

    def recorded(self, mark: int) -> Recorded:
        """Every request since `mark` (`self.cluster.control_plane.audit.mark()`), from the audit log."""
        return self.cluster.control_plane.audit.since(mark)

    def kubeconfig(self, who: Identity, label: str) -> Path:
        return kubeconfig_with_token(self.cluster.kubeconfig, self.tmp / f"kubeconfig-{label}", who.token)

    def drive(self, who: Identity, prefix: str, *drivers: Any) -> None:
        async def main() -> None:
            cluster, ca = self.cluster, str(self.cluster.ca_file)
            admin = Kube(Connection(cluster.api_url, cluster.admin_token, ca))
            kube = Kube(Connection(cluster.api_url, who.token, ca))
            try:
                for driver in drivers:
                    await driver(admin, kube, NAMESPACE, self.tmp / "ckpt", prefix)
            finally:
                await admin.close()
                await kube.close()
        asyncio.run(main())

    @contextmanager
    def granted(self, docs: list[dict[str, Any]], account: str) -> Iterator[Identity]:
        """`account` with the rendered chart's RBAC objects applied, as `helm install` applies them; they are
        deleted after, so the next variant's account has its own grants only."""
        roles = [d for d in docs if d["kind"] in RBAC_KINDS]
        (sa,) = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == account]
        self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all([sa, *roles]))
        try:
            who = service_account(self.cluster.control_plane.request, NAMESPACE, account)
            self._wait_authorized(who, rbac.grants_for(docs, account, NAMESPACE)[0])
            yield who
        finally:
            self.kubectl("delete", "--wait=true", "-f", "-", stdin=yaml.safe_dump_all(roles))

    def _wait_authorized(self, who: Identity, grant: rbac.Grant) -> None:
        """Until the authorizer's informers hold the new bindings (a moment after their create)."""
        attrs = {"verb": grant.verb, "group": grant.group, "resource": grant.resource}
        if grant.scope != rbac.ALL:
            attrs["namespace"] = grant.scope
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": who.user, "groups": ["system:serviceaccounts", "system:authenticated"],
                           "resourceAttributes": attrs}}
        request = self.cluster.control_plane.request
        eventually(lambda: request("/apis/authorization.k8s.io/v1/subjectaccessreviews", "POST", review)
                   ["status"].get("allowed"), 30, f"{who.user} allowed by {grant.source}", interval=0.1)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    if KUBECTL is None:
        pytest.skip("kubectl not found (make tools)")
    tmp = tmp_path_factory.mktemp("rbac-recorded")
    # No node is lost here: a long node grace keeps a slow kubelet heartbeat on a loaded machine from looking like one.
    with start_cluster(tmp / "cluster", nodes=2, etcd=True, node_monitor_grace_seconds=30.0, heartbeat_seconds=0.5,
                       scheduler_names=("scheduler-plugins-scheduler",)) as cluster:
        env = Env(cluster, tmp)
        env.kubectl("create", "namespace", NAMESPACE)
        env.kubectl("apply", "-f", str(ROOT / "crds" / "trainingjobs.flywheel.dev.yaml"))
        env.kubectl("apply", "-f", "-", stdin=json.dumps(PODGROUP_CRD))
        for crd in ("trainingjobs.flywheel.dev", PODGROUP_CRD["metadata"]["name"]):
            cluster.wait_established(crd)
        # The job's checkpoint claim, and the namespace's default ServiceAccount its pods run as (the controller
        # makes it a moment after the namespace; ServiceAccount admission refuses pods until then).
        cluster.add_claim("flywheel-ckpt", namespace=NAMESPACE)
        eventually(lambda: cluster.control_plane.request(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default"),
                   30, "the namespace's default ServiceAccount", interval=0.1)
        yield env


def compare(docs: list[dict[str, Any]], account: str, recorded: Recorded) -> None:
    user = f"system:serviceaccount:{NAMESPACE}:{account}"
    requests = recorded.of(user)
    grants = rbac.grants_for(docs, account, NAMESPACE)
    assert requests, f"nothing recorded for {user}: {sorted(recorded.users())}"
    missing, excess = rbac.missing(grants, requests), rbac.excess(grants, requests)
    assert not missing, f"{account} lacks permissions its code uses: {rbac.describe(missing)}"
    assert not excess, (f"{account} has permissions no request of its code needed: " +
                        ", ".join(f"{g.verb} {g.group}/{g.resource} ({g.source})" for g in excess))
    # What the grants allow, the API server allowed: the evaluator and the real authorizer agree.
    refused = recorded.refused(user)
    assert not refused, f"the API server refused {account}: {rbac.describe(sorted(refused))}"


def operator_run(env: Env, docs: list[dict[str, Any]], who: Identity, name: str, prometheus_url: str) -> None:
    """The operator process with the chart Deployment's args runs one job to Succeeded and its TTL deletion."""
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-operator"))
    (op,) = dep["spec"]["template"]["spec"]["containers"]
    args = [f"--etcd-endpoints={env.cluster.etcd_url}" if a.startswith("--etcd-endpoints=") else
            f"--prometheus-url={prometheus_url}" if a.startswith("--prometheus-url=") else a for a in op["args"][1:]]
    liveness = next(p["containerPort"] for p in op["ports"] if p["name"] == "liveness")
    log = env.tmp / f"operator-{name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "flywheel.cli", "operator", "--kubeconfig",
                                 str(env.kubeconfig(who, name)), *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"})
    try:
        probe = op["livenessProbe"]["httpGet"]
        deadline = time.monotonic() + 30
        while True:  # kopf's liveness endpoint answers once the operator has started
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{liveness}{probe['path']}", timeout=2) as resp:
                    assert resp.status == 200
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
        job = yaml.safe_load((ROOT / "examples" / "operator-tiny.yaml").read_text())
        job["metadata"]["name"] = name
        job["spec"]["trainer"]["training"]["steps"] = 6
        job["spec"]["checkpoint"].update({"dir": str(env.tmp / "ckpt" / name), "everySteps": 3})
        job["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 0}
        env.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(job))
        deadline = time.monotonic() + 150
        while obj := env.kubectl("get", "tj", name, "-n", NAMESPACE, "-o", "json", check=False):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, (f"{name} not deleted by its TTL: {json.loads(obj).get('status')}\n"
                                                 + env.kubectl("get", "events", "-n", NAMESPACE)[-3000:])
            time.sleep(0.5)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def operator_values(*sets: str) -> tuple[str, ...]:
    return (*sets, *HOST_VALUES, f"operator.metricsPort={free_port()}", f"operator.livenessPort={free_port()}")


def test_operator_namespaced_rbac_equals_its_recorded_requests(env: Env):
    """Namespaced (the default), with every operator feature that needs a permission: health monitor with
    cordoning, gang scheduling (scheduler-plugins)."""
    from tests.fakes.prometheus_api import FakePrometheus

    sets = operator_values("operator.healthMonitor.enabled=true", "operator.gangScheduler=scheduler-plugins")
    docs = render(*sets)
    with env.granted(docs, OPERATOR_SA) as who:
        mark = env.cluster.control_plane.audit.mark()
        prom = FakePrometheus()
        try:
            operator_run(env, docs, who, "rbac-ns", prom.url)
        finally:
            prom.stop()
        env.drive(who, "operator-ns", drive_executor, drive_health)
        recorded = env.recorded(mark)
    requests = recorded.of(who.user)
    assert ("create", "scheduling.x-k8s.io", "podgroups", NAMESPACE) in requests  # the gang path was taken
    assert ("patch", "", "nodes", "") in requests and ("create", "", "events", "default") in requests  # cordon
    compare(docs, OPERATOR_SA, recorded)


@pytest.mark.heavy
def test_operator_cluster_wide_rbac_equals_its_recorded_requests(env: Env):
    """rbac.clusterWide=true (all namespaces), health monitor off, no gang scheduler."""
    docs = render(*operator_values("rbac.clusterWide=true"))
    with env.granted(docs, OPERATOR_SA) as who:
        mark = env.cluster.control_plane.audit.mark()
        operator_run(env, docs, who, "rbac-cw", "")
        env.drive(who, "operator-cw", drive_executor)
        recorded = env.recorded(mark)
    assert ("watch", "flywheel.dev", "trainingjobs", "") in recorded.of(who.user)  # all namespaces
    compare(docs, OPERATOR_SA, recorded)


@pytest.mark.parametrize("sets", [(), ("api.readOnly=true",), ("rbac.clusterWide=true",)],
                         ids=["namespaced", "read-only", "cluster-wide"])
def test_api_rbac_equals_its_recorded_requests(env: Env, sets: tuple[str, ...]):
    docs = render("api.enabled=true", *sets)
    dep = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == f"{RELEASE}-flywheel-api")
    (api,) = dep["spec"]["template"]["spec"]["containers"]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == API_SA
    label = "api-" + ("-".join(s.replace("=", "-").replace(".", "-") for s in sets) or "default")
    job = f"drv-{label}".lower()[:50]
    doc = yaml.safe_load((ROOT / "examples" / "operator-tiny.yaml").read_text())
    doc["metadata"]["name"] = job
    doc["spec"]["replicas"] = {"min": 1, "max": 2}
    doc["spec"]["suspend"] = True  # nothing runs it: only the API's requests matter
    env.kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump(doc))
    # A caller of the REST API: the API server authenticates its token (TokenReview) and, having no grant on
    # TrainingJobs, it is refused (SubjectAccessReview).
    caller = service_account(env.cluster.control_plane.request, NAMESPACE, "rest-api-caller")
    with env.granted(docs, API_SA) as who:
        mark = env.cluster.control_plane.audit.mark()
        drive_api(env.kubeconfig(who, label), api["args"], NAMESPACE, job, caller)
        recorded = env.recorded(mark)
    compare(docs, API_SA, recorded)


def test_the_audit_log_sees_each_request_as_the_authorizer_does(env: Env):
    """The requests' attributes in the audit log, for the shapes the evaluator must tell apart (a watch, a list
    across namespaces, a subresource, a cluster-scoped object, a deletecollection, a namespace and its
    subresources), sent by an account with no grant: each is refused, and recorded with its 403; discovery and
    /version are not counted (RBAC grants them to everyone)."""
    plane = env.cluster.control_plane
    who = service_account(plane.request, NAMESPACE, "attributes-probe")
    jobs = "/apis/flywheel.dev/v1alpha1"
    sent = {
        ("GET", f"{jobs}/namespaces/a/trainingjobs?watch=true"): ("watch", "flywheel.dev", "trainingjobs", "a"),
        ("GET", f"{jobs}/trainingjobs"): ("list", "flywheel.dev", "trainingjobs", ""),
        ("PATCH", f"{jobs}/namespaces/a/trainingjobs/j/scale"): ("patch", "flywheel.dev", "trainingjobs/scale", "a"),
        ("PATCH", "/api/v1/nodes/n1"): ("patch", "", "nodes", ""),
        ("DELETE", "/api/v1/namespaces/a/pods"): ("deletecollection", "", "pods", "a"),
        ("GET", "/api/v1/namespaces"): ("list", "", "namespaces", ""),
        ("GET", "/api/v1/namespaces/a"): ("get", "", "namespaces", "a"),
        ("GET", "/api/v1/namespaces/a/status"): ("get", "", "namespaces/status", "a"),
        ("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews"):
            ("create", "authorization.k8s.io", "subjectaccessreviews", "")}
    mark = plane.audit.mark()
    codes = {path: _call(env, who, method, path) for method, path in [*sent, ("GET", "/api"), ("GET", "/version"),
                                                                        ("GET", f"{jobs}")]}
    recorded = env.recorded(mark)
    assert recorded.of(who.user) == set(sent.values()), recorded.counted(who.user)
    assert recorded.refused(who.user) == set(sent.values())
    assert {codes[path] for _, path in sent} == {403}, codes


def _call(env: Env, who: Identity, method: str, path: str) -> int:
    body = b"{}" if method in ("PATCH", "POST") else None
    request = urllib.request.Request(env.cluster.api_url + path, data=body, method=method, headers={
        "Authorization": f"Bearer {who.token}", "Content-Type": "application/merge-patch+json"})
    context = ssl.create_default_context(cafile=str(env.cluster.ca_file))
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
