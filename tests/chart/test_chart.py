"""The Helm chart (charts/flywheel): lint, renders with defaults and with every switch, security settings, least-
privilege RBAC equal to what the operator code uses, the copies of the CRD/rules/dashboards, and (where
kubernetes-validate is installed) every built-in object against the Kubernetes 1.33 schema."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.conftest import CHART, KUBE_VERSION, NAMESPACE, RELEASE, ROOT, by_kind, find_tool, one, render, \
    run_helm

MONITORING = ("monitoring.coreos.com/v1",)
# Every optional switch on (with --api-versions monitoring.coreos.com/v1 for the Prometheus Operator objects).
ALL_ON = ("rbac.clusterWide=true", "api.enabled=true", "operator.healthMonitor.enabled=true",
          "operator.gangScheduler=scheduler-plugins", "operator.eventsDir.existingClaim=flywheel-events",
          "operator.workerEnv.OMP_NUM_THREADS=1", "etcd.replicas=3",
          "monitoring.additionalLabels.release=kube-prometheus-stack", "dashboards.annotations.grafana_folder=Flywheel")

# ---------------------------------------------------------------------------------------------------------------
# The operator's permissions, kept in this one place. Derived from flywheel/operator/*.py and kopf's own needs;
# the chart's rules must equal these exactly (a missing or an excess permission fails).
# Key: (apiGroup, resource) -> verbs.
NAMESPACED_RULES: dict[tuple[str, str], set[str]] = {
    # kopf: list + watch (its TrainingJob watch stream, handlers.py run_job/cleanup_etcd) and patch (the
    #   flywheel.dev/cleanup finalizer, progress and diff-base annotations);
    # executor.py JobRunner.reconcile_once: get; _act(DeleteJob) after ttlSecondsAfterFinished: delete;
    # health.py KubeJobInventory.jobs: list; KubeHealthActions._write_conditions: get.
    ("flywheel.dev", "trainingjobs"): {"delete", "get", "list", "patch", "watch"},
    # executor.py reconcile_once and health.py _write_conditions: merge patch on /status.
    ("flywheel.dev", "trainingjobs/status"): {"patch"},
    # executor.py _observe: list; _act: create (CreatePod), delete (DeletePod), patch (Relabel);
    # handlers.py @kopf.on.event pods: list + watch; health.py: list, delete (replace_pods / restart_ranks).
    ("", "pods"): {"create", "delete", "list", "patch", "watch"},
    # executor.py _ensure_service: the job's headless Service.
    ("", "services"): {"create"},
    # kube.py Kube.post_event (executor.py, health.py) and kopf's own event posting.
    ("", "events"): {"create"},
}
# executor.py _ensure_service with --gang-scheduler: one PodGroup (manifests.GANG) per job.
GANG_RULES: dict[str, dict[tuple[str, str], set[str]]] = {
    "none": {},
    "scheduler-plugins": {("scheduling.x-k8s.io", "podgroups"): {"create"}},
    "volcano": {("scheduling.volcano.sh", "podgroups"): {"create"}},
}
CLUSTER_SCOPED_RULES: dict[tuple[str, str], set[str]] = {
    # executor.py _observe: GET /api/v1/nodes every pass (a node not Ready is lost).
    ("", "nodes"): {"list"},
    # kopf _core/reactor/observation.py resource_observer: list + watch CRDs.
    ("apiextensions.k8s.io", "customresourcedefinitions"): {"list", "watch"},
}
# health.py KubeHealthActions.cordon_node: merge patch on the node (health monitor on, cordoning on).
CORDON_RULE = {("", "nodes"): {"patch"}}
# health.py cordon_node -> kube.py post_event: events about a node go to the "default" namespace (a Role there when
# not cluster-wide and "default" is not watched anyway).
NODE_EVENT_RULE = {("", "events"): {"create"}}
# kopf observation.py namespace_observer: lists + watches namespaces when given namespaces (not cluster-wide).
NAMESPACE_OBSERVER_RULE = {("", "namespaces"): {"list", "watch"}}


def merge(*parts: dict[tuple[str, str], set[str]]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for part in parts:
        for key, verbs in part.items():
            out.setdefault(key, set()).update(verbs)
    return out


def expected(cluster_wide: bool, gang: str = "none", cordon: bool = False) -> tuple[dict, dict]:
    """(rules of the Role or cluster-wide ClusterRole, rules of the cluster-scoped ClusterRole or {})."""
    cluster = merge(CLUSTER_SCOPED_RULES, CORDON_RULE if cordon else {},
                    {} if cluster_wide else NAMESPACE_OBSERVER_RULE)
    namespaced = merge(NAMESPACED_RULES, GANG_RULES[gang])
    if cluster_wide:
        return merge(namespaced, cluster), {}
    return namespaced, cluster


def rules_of(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, rule  # no resourceNames/nonResourceURLs surprises
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert (group, resource) not in out, f"{group}/{resource} appears twice"
                out[(group, resource)] = set(rule["verbs"])
    return out


# ---------------------------------------------------------------------------------------------------------------
def test_helm_lint_strict():
    for sets in ((), ALL_ON, ("etcd.enabled=false", "etcd.externalEndpoints[0]=etcd.example:2379")):
        args = ["lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION]
        for value in sets:
            args += ["--set", value]
        result = run_helm(*args, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


def kinds(docs: list[dict[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for doc in docs:
        out[doc["kind"]] = out.get(doc["kind"], 0) + 1
    return out


def test_default_render_kinds():
    assert kinds(render()) == {"ServiceAccount": 1, "Deployment": 1, "Role": 1, "RoleBinding": 1, "ClusterRole": 1,
                               "ClusterRoleBinding": 1, "StatefulSet": 1, "Service": 1, "ConfigMap": 3}


def test_all_switches_render_kinds():
    docs = render(*ALL_ON, api_versions=MONITORING)
    assert kinds(docs) == {"ServiceAccount": 1, "Deployment": 1, "ClusterRole": 1, "ClusterRoleBinding": 1,
                           "StatefulSet": 1, "Service": 2, "ConfigMap": 3, "PodMonitor": 2, "PrometheusRule": 1}
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]["name"]


def test_everything_off_is_just_the_operator():
    docs = render("etcd.enabled=false", "etcd.externalEndpoints[0]=etcd.example:2379", "dashboards.enabled=false",
                  "rbac.create=false", "serviceAccount.create=false", "monitoring.enabled=false",
                  api_versions=MONITORING)
    assert kinds(docs) == {"Deployment": 1}
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "default"


def test_monitoring_objects_need_the_prometheus_operator_api():
    assert not {"PodMonitor", "PrometheusRule", "ServiceMonitor"} & set(kinds(render()))
    assert not {"PodMonitor", "PrometheusRule"} & set(kinds(render("monitoring.enabled=false",
                                                                    api_versions=MONITORING)))
    assert {"PodMonitor", "PrometheusRule"} <= set(kinds(render(api_versions=MONITORING)))


# -- security ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sets", [(), ALL_ON], ids=["default", "all-on"])
def test_pods_are_non_root_read_only_and_drop_all(sets):
    docs = render(*sets, api_versions=MONITORING)
    workloads = by_kind(docs, "Deployment") + by_kind(docs, "StatefulSet")
    assert len(workloads) == 2
    for workload in workloads:
        pod = workload["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True, container["name"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"] == {"drop": ["ALL"]}
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), container["name"]
            assert "privileged" not in sc
        assert "hostNetwork" not in pod and "hostPID" not in pod


def test_operator_deployment_single_replica_probes_and_args():
    dep = one(render(), "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == f"{RELEASE}-flywheel"
    (op,) = pod["containers"]
    assert op["image"] == "ghcr.io/flywheel-dev/flywheel:0.1.0"
    args = op["args"]
    assert args[0] == "operator"
    assert f"--etcd-endpoints={RELEASE}-flywheel-etcd-0.{RELEASE}-flywheel-etcd.{NAMESPACE}.svc:2379" in args
    assert f"--namespace={NAMESPACE}" in args  # namespaced RBAC: the operator must not watch all namespaces
    assert "--no-health-monitor" in args and "--operator-metrics-port=8080" in args
    # No kopf --liveness in flywheel/operator/main.py: the probes use the operator's metrics server.
    assert op["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    assert op["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert op["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert {"name": "tmp", "mountPath": "/tmp"} in op["volumeMounts"]


def test_operator_args_accepted_by_the_operator_parser():
    """Every flag the chart passes (all switches on) parses with flywheel.operator.main's own parser."""
    main = pytest.importorskip("flywheel.operator.main")
    pod = one(render(*ALL_ON, "operator.verbose=true", "operator.healthMonitor.cordon=false"),
              "Deployment")["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[0] == "operator"
    parsed = main.build_parser().parse_args(args[1:])
    assert parsed.etcd_endpoints.count(",") == 2 and parsed.namespace == []
    assert parsed.gang_scheduler == "scheduler-plugins" and parsed.events_dir == "/flywheel-events"
    assert parsed.events_claim == "flywheel-events"  # the workers mount the same claim
    assert parsed.worker_env == ["OMP_NUM_THREADS=1"] and parsed.health_monitor and not parsed.cordon
    assert parsed.verbose
    parsed = main.build_parser().parse_args(one(render(), "Deployment")["spec"]["template"]["spec"]
                                            ["containers"][0]["args"][1:])
    assert parsed.namespace == [NAMESPACE] and not parsed.health_monitor


def test_metrics_port_off_means_no_probes():
    op = one(render("operator.metricsPort=0"), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "livenessProbe" not in op and "ports" not in op and "--operator-metrics-port=0" in op["args"]


# -- RBAC --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("gang", ["none", "scheduler-plugins", "volcano"])
@pytest.mark.parametrize("cordon", [False, True], ids=["no-cordon", "cordon"])
def test_namespaced_rbac_equals_what_the_code_uses(gang, cordon):
    sets = [f"operator.gangScheduler={gang}"]
    if cordon:
        sets.append("operator.healthMonitor.enabled=true")
    docs = render(*sets)
    want_ns, want_cluster = expected(cluster_wide=False, gang=gang, cordon=cordon)
    roles = {r["metadata"]["namespace"]: r for r in by_kind(docs, "Role")}
    assert rules_of(roles.pop(NAMESPACE)) == want_ns
    assert rules_of(one(docs, "ClusterRole")) == want_cluster
    if cordon:  # only the NodeCordoned event, which kube.py posts in "default" (the node is cluster-scoped)
        assert rules_of(roles.pop("default")) == NODE_EVENT_RULE
    assert not roles


@pytest.mark.parametrize("gang", ["none", "volcano"])
def test_cluster_wide_rbac_equals_what_the_code_uses(gang):
    docs = render("rbac.clusterWide=true", f"operator.gangScheduler={gang}", "operator.healthMonitor.enabled=true")
    assert not by_kind(docs, "Role") and not by_kind(docs, "RoleBinding")
    want, rest = expected(cluster_wide=True, gang=gang, cordon=True)
    assert rest == {} and rules_of(one(docs, "ClusterRole")) == want
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--namespace") for a in args)  # all namespaces


def test_health_monitor_without_cordon_cannot_patch_nodes():
    docs = render("operator.healthMonitor.enabled=true", "operator.healthMonitor.cordon=false")
    assert rules_of(one(docs, "ClusterRole"))[("", "nodes")] == {"list"}
    assert [r["metadata"]["namespace"] for r in by_kind(docs, "Role")] == [NAMESPACE]


def test_no_extra_node_event_role_when_default_is_watched():
    docs = render("operator.healthMonitor.enabled=true", "operator.watchNamespaces={default}")
    assert [r["metadata"]["namespace"] for r in by_kind(docs, "Role")] == ["default"]
    assert rules_of(one(docs, "Role")) == NAMESPACED_RULES


def test_bindings_name_the_operator_service_account():
    for sets in ((), ("rbac.clusterWide=true",), ("serviceAccount.name=custom",)):
        docs = render(*sets)
        sa = one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
        bindings = by_kind(docs, "RoleBinding") + by_kind(docs, "ClusterRoleBinding")
        assert bindings
        roles = {(r["kind"], r["metadata"]["name"], r["metadata"].get("namespace"))
                 for r in by_kind(docs, "Role") + by_kind(docs, "ClusterRole")}
        for b in bindings:
            assert b["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": NAMESPACE}]
            ns = b["metadata"].get("namespace") if b["roleRef"]["kind"] == "Role" else None
            assert (b["roleRef"]["kind"], b["roleRef"]["name"], ns) in roles


def test_watch_namespaces_get_a_role_each():
    docs = render("operator.watchNamespaces={team-a,team-b}")
    assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "Role")) == ["team-a", "team-b"]
    assert sorted(r["metadata"]["namespace"] for r in by_kind(docs, "RoleBinding")) == ["team-a", "team-b"]
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


def test_every_resource_the_operator_code_names_is_covered():
    """A cheap cross-check of the list above: each core resource path in flywheel/operator/*.py has a rule."""
    names: set[str] = set()
    for path in (ROOT / "flywheel" / "operator").glob("*.py"):
        text = path.read_text()
        names.update(re.findall(r'Kube\.core\([^,()]+,\s*"(\w+)"', text))
        names.update(re.findall(r'/api/v1/(\w+)', text))
    names.discard("namespaces")  # part of namespaced paths, /api/v1/namespaces/<ns>/...
    covered = {res for (group, res) in merge(NAMESPACED_RULES, CLUSTER_SCOPED_RULES) if group == ""}
    assert names, "no resource paths found: has kube.py changed shape?"
    assert names <= covered, f"operator code uses {names - covered} without an RBAC rule in the chart"


# -- etcd --------------------------------------------------------------------------------------------------------
def test_etcd_statefulset_with_pvc_and_headless_service():
    docs = render("etcd.replicas=3", "etcd.persistence.storageClass=fast")
    sts = one(docs, "StatefulSet")
    name = f"{RELEASE}-flywheel-etcd"
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["serviceName"] == name
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["storageClassName"] == "fast" and claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
    svc = one(docs, "Service")
    assert svc["metadata"]["name"] == name and svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == sts["spec"]["selector"]["matchLabels"]
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    args = sts["spec"]["template"]["spec"]["containers"][0]["args"]
    cluster = next(a for a in args if a.startswith("--initial-cluster="))
    assert cluster.count("=http://") == 3
    endpoints = next(a for a in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
                     if a.startswith("--etcd-endpoints="))
    assert endpoints == "--etcd-endpoints=" + ",".join(f"{name}-{i}.{name}.{NAMESPACE}.svc:2379" for i in range(3))


def test_etcd_without_persistence_uses_empty_dir():
    sts = one(render("etcd.persistence.enabled=false"), "StatefulSet")
    assert "volumeClaimTemplates" not in sts["spec"]
    assert sts["spec"]["template"]["spec"]["volumes"] == [{"name": "data", "emptyDir": {}}]


def test_external_etcd():
    docs = render("etcd.enabled=false", "etcd.externalEndpoints={etcd-0.db:2379,etcd-1.db:2379}")
    assert not by_kind(docs, "StatefulSet") and not by_kind(docs, "Service")
    args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--etcd-endpoints=etcd-0.db:2379,etcd-1.db:2379" in args


# -- values schema -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [
    ("etcd.enabled=false",),                      # no etcd at all: the operator would refuse to start
    ("operator.gangScheduler=kueue",),            # not one the operator knows
    ("operator.bogus=1",),                        # typo in a key
    ("etcd.replicas=2",),                         # even-sized etcd cluster
    ("operator.healthMonitor.prometheusUrl=prometheus:9090",),
])
def test_schema_rejects_bad_values(bad):
    args = ["template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION]
    for value in bad:
        args += ["--set", value]
    result = run_helm(*args, check=False)
    assert result.returncode != 0, f"{bad} rendered"


# -- copies kept identical -----------------------------------------------------------------------------------
def same_files(source: Path, copy: Path, pattern: str) -> None:
    src = sorted(p.name for p in source.glob(pattern))
    assert src, f"nothing matches {source}/{pattern}"
    assert src == sorted(p.name for p in copy.glob(pattern)), f"{copy} and {source} hold different files"
    for name in src:
        assert (copy / name).read_bytes() == (source / name).read_bytes(), \
            f"{copy / name} differs from {source / name}: copy it again"


def test_chart_crds_equal_the_repo_crds():
    same_files(ROOT / "crds", CHART / "crds", "*.yaml")


def test_chart_dashboards_and_rules_equal_monitoring():
    same_files(ROOT / "monitoring" / "dashboards", CHART / "files" / "dashboards", "*.json")
    same_files(ROOT / "monitoring" / "rules", CHART / "files" / "rules", "*.yaml")


# -- monitoring objects ------------------------------------------------------------------------------------------
def test_dashboard_configmaps():
    docs = render("dashboards.annotations.grafana_folder=Flywheel")
    maps = by_kind(docs, "ConfigMap")
    sources = {p.name: p for p in (ROOT / "monitoring" / "dashboards").glob("*.json")}
    assert len(maps) == len(sources)
    for cm in maps:
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert cm["metadata"]["annotations"] == {"grafana_folder": "Flywheel"}
        ((key, text),) = cm["data"].items()
        assert json.loads(text) == json.loads(sources[key].read_text())


def test_podmonitors_and_prometheus_rule():
    docs = render("monitoring.additionalLabels.release=kps", api_versions=MONITORING)
    monitors = {m["metadata"]["name"]: m for m in by_kind(docs, "PodMonitor")}
    op, workers = monitors[f"{RELEASE}-flywheel-operator"], monitors[f"{RELEASE}-flywheel-workers"]
    for monitor in (op, workers, one(docs, "PrometheusRule")):
        assert monitor["metadata"]["labels"]["release"] == "kps"
    (endpoint,) = op["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True and endpoint["port"] == "metrics"
    # The OperatorDown alert looks for up{job="flywheel-operator"}.
    assert {"action": "replace", "targetLabel": "job", "replacement": "flywheel-operator"} in endpoint["relabelings"]
    dep = one(docs, "Deployment")
    assert op["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    (endpoint,) = workers["spec"]["podMetricsEndpoints"]
    assert endpoint["honorLabels"] is True and endpoint["port"] == "metrics"  # manifests.pod names the port so
    assert workers["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    rules = yaml.safe_load((ROOT / "monitoring" / "rules" / "flywheel.rules.yaml").read_text())
    assert one(docs, "PrometheusRule")["spec"]["groups"] == rules["groups"]
    cluster_wide = render("rbac.clusterWide=true", api_versions=MONITORING)
    workers = next(m for m in by_kind(cluster_wide, "PodMonitor") if m["metadata"]["name"].endswith("-workers"))
    assert workers["spec"]["namespaceSelector"] == {"any": True}


def test_rendered_prometheus_rule_passes_promtool(tmp_path):
    promtool = find_tool("promtool")
    if promtool is None:
        pytest.skip("promtool not installed")
    rule = one(render(api_versions=MONITORING), "PrometheusRule")
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


# -- the REST API stub -------------------------------------------------------------------------------------------
def test_api_disabled_by_default():
    docs = render()
    assert [c["name"] for c in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]] == ["operator"]
    assert not any(s["metadata"]["name"].endswith("-api") for s in by_kind(docs, "Service"))


def test_api_enabled_renders_container_and_service():
    docs = render("api.enabled=true", "api.port=9000", "api.readOnly=true")
    containers = {c["name"]: c for c in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]}
    api = containers["api"]
    assert api["args"] == ["api", "--host=0.0.0.0", "--port=9000", "--read-only"]
    assert api["ports"] == [{"name": "api", "containerPort": 9000, "protocol": "TCP"}]
    svc = next(s for s in by_kind(docs, "Service") if s["metadata"]["name"] == f"{RELEASE}-flywheel-api")
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8700, "targetPort": "api", "protocol": "TCP"}]
    labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()


# -- Kubernetes 1.33 schema --------------------------------------------------------------------------------------
def test_built_in_objects_validate_against_kubernetes_1_33():
    kv = pytest.importorskip("kubernetes_validate")
    docs = render(*ALL_ON, api_versions=MONITORING) + render() + render("api.enabled=true")
    docs += [yaml.safe_load(p.read_text()) for p in sorted((CHART / "crds").glob("*.yaml"))]
    checked = 0
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # CRD kinds: no schema in kubernetes-validate
        kv.validate(doc, KUBE_VERSION, strict=True)
        checked += 1
    assert checked >= 25


def test_notes_name_the_next_commands():
    result = run_helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--dry-run=client",
                      check=False)
    if result.returncode != 0:
        pytest.skip(f"helm install --dry-run=client needs more here: {result.stderr.strip()[:200]}")
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl apply -n flywheel -f examples/operator-tiny.yaml" in notes
    assert "kubectl get tj -n flywheel -w" in notes
