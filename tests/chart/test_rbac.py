"""The chart's RBAC as rendered: which ServiceAccount each binding names, where Roles go, and how the switches change
the rules. Whether the rules equal what the code uses is decided from recorded requests in test_rbac_recorded.py
(slow: it runs the operator); the variants here are checked against the rendered full-feature configuration, and
the evaluator and the audit log's reader (tests/cluster/audit.py) themselves are checked on small cases."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.chart import rbac
from tests.chart.conftest import CHART, KUBE_VERSION, NAMESPACE, RELEASE, ROOT, by_kind, one, render, run_helm
from tests.chart.rbac import rules_of
from tests.cluster.audit import AuditLog

OPERATOR_SA, API_SA = f"{RELEASE}-flywheel", f"{RELEASE}-flywheel-api"


def deployment(docs: list[dict[str, Any]], component: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith(f"-{component}"))


def role(docs: list[dict[str, Any]], kind: str, suffix: str, namespace: str | None = None) -> dict[str, Any]:
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith(suffix)
             and d["metadata"].get("namespace") == namespace]
    assert len(found) == 1, [d["metadata"]["name"] for d in by_kind(docs, kind)]
    return found[0]


# -- the evaluator and the audit log's reader ----------------------------------------------------------------------
def _event(audit_id: str, stage: str, user: str, verb: str, ref: dict[str, str] | None, code: int = 200) -> str:
    """One line of kube-apiserver's audit log (level Metadata), as it writes them."""
    event: dict[str, Any] = {"kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
                             "auditID": audit_id, "stage": stage, "verb": verb, "requestURI": "/elided",
                             "user": {"username": user, "groups": ["system:authenticated"]},
                             "responseStatus": {"metadata": {}, "code": code}}
    if ref is not None:
        event["objectRef"] = ref
    return json.dumps(event) + "\n"


def test_audit_log_counts_each_request_once_per_user_as_the_authorizer_sees_it(tmp_path: Path):
    log = tmp_path / "audit.log"
    pods, jobs = {"resource": "pods", "namespace": "a", "apiVersion": "v1"}, {
        "resource": "trainingjobs", "subresource": "scale", "namespace": "a", "name": "j", "apiGroup": "flywheel.dev"}
    barrier = {"resource": "configmaps", "namespace": "kube-system"}

    rest: list[str] = []  # the end of a line the API server is writing

    def request(path: str) -> None:  # the barrier GET: the API server writes its record
        with log.open("a") as out:
            out.write("".join(rest) + _event(path, "ResponseComplete", "admin", "get",
                                             barrier | {"name": path.rsplit("/", 1)[1]}, 404))
        rest.clear()

    log.write_text(_event("w1", "ResponseStarted", "op", "watch", pods))  # a watch opened before the mark
    audit = AuditLog(log, request)
    mark = audit.mark()
    with log.open("a") as out:
        out.write(_event("w1", "ResponseComplete", "op", "watch", pods))  # its end: not a new request
        out.write(_event("w2", "ResponseStarted", "op", "watch", pods))
        out.write(_event("l1", "ResponseComplete", "op", "list", pods))
        out.write(_event("l2", "ResponseComplete", "op", "list", pods))
        out.write(_event("p1", "ResponseComplete", "bench", "patch", jobs, 403))
        out.write(_event("d1", "ResponseComplete", "op", "get", None))  # discovery: not counted
        end = _event("w2", "ResponseComplete", "op", "watch", pods)
        out.write(end[:40])  # not yet a whole line
    rest.append(end[40:])
    recorded = audit.since(mark)
    assert recorded.counted("op") == [(("list", "", "pods", "a"), 2), (("watch", "", "pods", "a"), 1)]
    assert recorded.of("bench") == {("patch", "flywheel.dev", "trainingjobs/scale", "a")}
    assert recorded.refused("bench") == recorded.of("bench") and not recorded.refused("op")
    assert recorded.users() == {"op", "bench"}  # the barriers are not requests of anyone's
    assert audit.since(0).counts[("op", ("watch", "", "pods", "a"))] == 2  # from the start: both watches


def _role(kind: str, name: str, namespace: str | None, rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    meta = {"name": name} | ({"namespace": namespace} if namespace else {})
    binding = {"kind": f"{kind}Binding", "metadata": dict(meta),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": "sa", "namespace": "ns"}]}
    return [{"kind": kind, "metadata": meta, "rules": rules}, binding]


def test_evaluator_finds_missing_and_excess_permissions():
    pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}
    docs = _role("Role", "r", "ns", [pods]) + _role("ClusterRole", "c", None, [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}])
    used = {("list", "", "pods", "ns"), ("watch", "", "pods", "ns"), ("list", "", "nodes", "")}
    grants = rbac.grants_for(docs, "sa", "ns")
    assert rbac.missing(grants, used) == [] and rbac.excess(grants, used) == []
    # A request outside the Role's namespace, or a verb nobody granted: missing.
    assert rbac.missing(grants, used | {("list", "", "pods", "other")}) == [("list", "", "pods", "other")]
    assert rbac.missing(grants, used | {("delete", "", "pods", "ns")}) == [("delete", "", "pods", "ns")]
    # A verb nobody uses, and a cluster-wide grant where the Role already suffices: excess.
    assert [(g.verb, g.resource) for g in rbac.excess(grants, used - {("watch", "", "pods", "ns")})] == \
        [("watch", "pods")]
    wide = docs + _role("ClusterRole", "w", None, [pods])
    assert {(g.source, g.verb) for g in rbac.excess(rbac.grants_for(wide, "sa", "ns"), used)} == {
        ("Role ns/r", "list"), ("Role ns/r", "watch"), ("ClusterRole w", "list"), ("ClusterRole w", "watch")}
    assert rbac.grants_for(docs, "other", "ns") == []  # bindings for another account give nothing


# -- operator: switches, relative to the full-feature render ----------------------------------------------------
FULL = ("operator.healthMonitor.enabled=true", "operator.gangScheduler=scheduler-plugins")


def test_gang_scheduler_switch_changes_only_the_podgroup_rule():
    full = rules_of(role(render(*FULL), "Role", "-operator", NAMESPACE))
    assert full[("scheduling.x-k8s.io", "podgroups")] == {"create"}
    volcano = rules_of(role(render(*FULL[:1], "operator.gangScheduler=volcano"), "Role", "-operator", NAMESPACE))
    none = rules_of(role(render(*FULL[:1]), "Role", "-operator", NAMESPACE))
    rest = {k: v for k, v in full.items() if k[1] != "podgroups"}
    assert none == rest and volcano == rest | {("scheduling.volcano.sh", "podgroups"): {"create"}}


@pytest.mark.parametrize(("sets", "node_verbs"), [
    ((), {"list", "watch"}),
    # Without cordoning the monitor still patches the node: its memory of the fatal XIDs acted on.
    (("operator.healthMonitor.enabled=true", "operator.healthMonitor.cordon=false"), {"list", "patch", "watch"})],
    ids=["no-monitor", "no-cordon"])
def test_without_the_monitor_nodes_are_only_watched(sets, node_verbs):
    docs = render(*sets)
    full = render(*FULL[:1])
    cluster = rules_of(role(docs, "ClusterRole", "-operator-cluster"))
    assert cluster == rules_of(role(full, "ClusterRole", "-operator-cluster")) | {("", "nodes"): node_verbs}
    assert [r["metadata"]["namespace"] for r in by_kind(docs, "Role")] == [NAMESPACE]  # no node-events Role
    assert rules_of(role(full, "Role", "-operator-node-events", "default")) == {("", "events"): {"create"}}


def test_no_extra_node_event_role_when_default_is_watched():
    docs = render(*FULL[:1], "operator.watchNamespaces={default}")
    assert [r["metadata"]["namespace"] for r in by_kind(docs, "Role")] == ["default"]
    assert rules_of(one(docs, "Role")) == rules_of(role(render(*FULL[:1]), "Role", "-operator", NAMESPACE))


def test_cluster_wide_is_one_cluster_role_with_the_namespaced_and_cluster_rules():
    docs = render("rbac.clusterWide=true", *FULL)
    namespaced = render(*FULL)
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")
    want = rules_of(role(namespaced, "Role", "-operator", NAMESPACE)) | rules_of(
        role(namespaced, "ClusterRole", "-operator-cluster"))
    del want[("", "namespaces")]  # kopf observes namespaces only when given a list of them
    assert rules_of(one(docs, "ClusterRole")) == want
    assert not any(a.startswith("--namespace") for a in deployment(docs, "operator")["spec"]["template"]["spec"]
                   ["containers"][0]["args"])


def test_watch_namespaces_get_a_role_each():
    docs = render("operator.watchNamespaces={team-a,team-b}")
    assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "Role")) == ["team-a", "team-b"]
    assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "RoleBinding")) == ["team-a", "team-b"]
    args = deployment(docs, "operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


@pytest.mark.parametrize("sets", [(), ("rbac.clusterWide=true",), ("serviceAccount.name=custom",),
                                  ("api.serviceAccount.name=reader",)])
def test_each_binding_names_its_own_service_account(sets):
    docs = render("api.enabled=true", *sets)
    accounts = {c: deployment(docs, c)["spec"]["template"]["spec"]["serviceAccountName"] for c in ("operator", "api")}
    assert accounts["operator"] != accounts["api"]
    roles = {(r["kind"], r["metadata"]["name"], r["metadata"].get("namespace"))
             for r in by_kind(docs, "Role") + by_kind(docs, "ClusterRole")}
    for b in by_kind(docs, "RoleBinding") + by_kind(docs, "ClusterRoleBinding"):
        component = "api" if b["metadata"]["name"].endswith("-api") else "operator"
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": accounts[component], "namespace": NAMESPACE}]
        ns = b["metadata"].get("namespace") if b["roleRef"]["kind"] == "Role" else None
        assert (b["roleRef"]["kind"], b["roleRef"]["name"], ns) in roles


def test_every_resource_the_operator_code_names_is_covered():
    """A cheap static cross-check beside the recorded one: each core resource path in flywheel/operator/*.py has a
    rule in the full-feature render."""
    names: set[str] = set()
    for path in (ROOT / "flywheel" / "operator").glob("*.py"):
        text = path.read_text()
        names.update(re.findall(r'Kube\.core\([^,()]+,\s*"(\w+)"', text))
        names.update(re.findall(r'/api/v1/(\w+)', text))
    names.discard("namespaces")  # part of namespaced paths, /api/v1/namespaces/<ns>/...
    docs = render(*FULL)
    covered = {res for r in by_kind(docs, "Role") + by_kind(docs, "ClusterRole") for (group, res) in rules_of(r)
               if group == ""}
    assert names, "no resource paths found: has kube.py changed shape?"
    assert names <= covered, f"operator code uses {names - covered} without an RBAC rule in the chart"


# -- the REST API ------------------------------------------------------------------------------------------------
def test_api_scope_follows_rbac_cluster_wide():
    docs = render("api.enabled=true")
    api = deployment(docs, "api")["spec"]["template"]["spec"]
    assert api["serviceAccountName"] == API_SA and f"--namespace={NAMESPACE}" in api["containers"][0]["args"]
    assert rules_of(role(docs, "Role", "-api", NAMESPACE)) == {
        ("flywheel.dev", "trainingjobs"): {"get", "list", "patch", "watch"},
        ("flywheel.dev", "trainingjobs/scale"): {"patch"}, ("", "events"): {"list", "watch"},
        ("", "pods"): {"list", "watch"}}
    reviews = {("authentication.k8s.io", "tokenreviews"): {"create"},
               ("authorization.k8s.io", "subjectaccessreviews"): {"create"}}
    assert rules_of(role(docs, "ClusterRole", "-api")) == reviews
    wide = render("api.enabled=true", "rbac.clusterWide=true")
    assert not any(a.startswith("--namespace") for a in deployment(wide, "api")["spec"]["template"]["spec"]
                   ["containers"][0]["args"])
    assert rules_of(role(wide, "ClusterRole", "-api")) == rules_of(role(docs, "Role", "-api", NAMESPACE)) | reviews
    read_only = rules_of(role(render("api.enabled=true", "api.readOnly=true"), "Role", "-api", NAMESPACE))
    assert read_only == {("flywheel.dev", "trainingjobs"): {"list", "watch"}, ("", "events"): {"list", "watch"},
                         ("", "pods"): {"list", "watch"}}


def test_api_namespace_with_several_watched_namespaces():
    docs = render("api.enabled=true", "operator.watchNamespaces={team-a,team-b}", "api.namespace=team-b")
    assert "--namespace=team-b" in deployment(docs, "api")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert role(docs, "Role", "-api", "team-b")
    result = run_helm("template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, "--set", "api.enabled=true",
                      "--set", "operator.watchNamespaces={team-a,team-b}", check=False)
    assert result.returncode != 0 and "set api.namespace" in result.stderr
