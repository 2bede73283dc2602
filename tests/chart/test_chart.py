"""The Helm chart (charts/flywheel): lint, renders with defaults and with every switch, security settings, probes,
the REST API's own Deployment, the copies of the CRD/rules/dashboards, and (where kubernetes-validate is installed)
every built-in object against the Kubernetes 1.33 schema. RBAC: test_rbac.py and test_rbac_recorded.py; the
Prometheus Operator objects against their CRD schemas: test_monitoring_objects.py."""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.conftest import (
    CHART,
    KUBE_VERSION,
    NAMESPACE,
    RELEASE,
    ROOT,
    by_kind,
    find_tool,
    one,
    render,
    run_helm,
)
from tests.chart.rbac import rules_of


def operator_deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (dep,) = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == f"{RELEASE}-flywheel-operator"]
    return dep

MONITORING = ("monitoring.coreos.com/v1",)
# Every optional switch on (with --api-versions monitoring.coreos.com/v1 for the Prometheus Operator objects).
ALL_ON = ("rbac.clusterWide=true", "api.enabled=true", "operator.healthMonitor.enabled=true",
          "operator.gangScheduler=scheduler-plugins", "operator.eventsDir.existingClaim=flywheel-events",
          "operator.workerEnv.OMP_NUM_THREADS=1", "etcd.replicas=3",
          "monitoring.additionalLabels.release=kube-prometheus-stack", "dashboards.annotations.grafana_folder=Flywheel")

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
    # The API has its own Deployment, ServiceAccount and ClusterRole (cluster-wide here).
    assert kinds(docs) == {"ServiceAccount": 2, "Deployment": 2, "ClusterRole": 2, "ClusterRoleBinding": 2,
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
    assert len(workloads) == (3 if sets else 2)
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
    assert "--no-hang-detection" not in args  # the hang part of the health loop needs no Prometheus: on
    # kopf's liveness endpoint (served from the operator's event loop), not the metrics server's thread.
    assert "--liveness=http://0.0.0.0:8081/healthz" in args
    assert op["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"},
                           {"name": "liveness", "containerPort": 8081, "protocol": "TCP"}]
    assert op["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert op["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "liveness"}
    assert {"name": "tmp", "mountPath": "/tmp"} in op["volumeMounts"]


def test_operator_args_accepted_by_the_operator_parser():
    """Every flag the chart passes (all switches on) parses with flywheel.operator.main's own parser."""
    main = pytest.importorskip("flywheel.operator.main")
    pod = operator_deployment(render(*ALL_ON, "operator.verbose=true", "operator.healthMonitor.cordon=false")
                              )["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert args[0] == "operator"
    parsed = main.build_parser().parse_args(args[1:])
    assert parsed.etcd_endpoints.count(",") == 2 and parsed.namespace == []
    assert parsed.gang_scheduler == "scheduler-plugins" and parsed.events_dir == "/flywheel-events"
    assert parsed.events_claim == "flywheel-events"  # the workers mount the same claim
    assert parsed.worker_env == ["OMP_NUM_THREADS=1"] and parsed.health_monitor and not parsed.cordon
    assert parsed.verbose and parsed.liveness == "http://0.0.0.0:8081/healthz"
    parsed = main.build_parser().parse_args(one(render(), "Deployment")["spec"]["template"]["spec"]
                                            ["containers"][0]["args"][1:])
    assert parsed.namespace == [NAMESPACE] and not parsed.health_monitor


def test_security_profile_and_rdma_resource_reach_the_operator_args():
    """operator.securityProfile and operator.rdmaResource are the operator's --security-profile and --rdma-resource
    (what every worker pod's security context and a `network: rdma` job's device request come from); the chart's
    defaults are the operator's own."""
    main = pytest.importorskip("flywheel.operator.main")
    parser = main.build_parser()

    def parsed(*sets: str) -> argparse.Namespace:
        args = operator_deployment(render(*sets))["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args[0] == "operator"
        return parser.parse_args(args[1:])

    default, bare = parsed(), parser.parse_args([])
    assert (default.security_profile, default.rdma_resource) == (bare.security_profile, bare.rdma_resource) == (
        "hardened", "rdma/rdma_shared_device_a")
    custom = parsed("operator.securityProfile=image", "operator.rdmaResource=nvidia.com/hostdev")
    assert (custom.security_profile, custom.rdma_resource) == ("image", "nvidia.com/hostdev")


def test_liveness_port_off_means_no_probes_and_metrics_port_off_keeps_them():
    op = one(render("operator.livenessPort=0"), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "livenessProbe" not in op and "readinessProbe" not in op
    assert not any(a.startswith("--liveness") for a in op["args"]) and [p["name"] for p in op["ports"]] == ["metrics"]
    op = one(render("operator.metricsPort=0"), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--operator-metrics-port=0" in op["args"] and [p["name"] for p in op["ports"]] == ["liveness"]
    assert op["livenessProbe"]["httpGet"]["port"] == "liveness"
    both = one(render("operator.metricsPort=0", "operator.livenessPort=0"), "Deployment")
    assert "ports" not in both["spec"]["template"]["spec"]["containers"][0]


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
    ("operator.securityProfile=root",),           # not a profile the operator knows
    ("operator.rdmaResource=",),                  # a network: rdma job would request a nameless resource
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
    dep = operator_deployment(docs)
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


# -- the REST API ------------------------------------------------------------------------------------------------
def test_api_disabled_by_default():
    docs = render()
    assert [d["metadata"]["name"] for d in by_kind(docs, "Deployment")] == [f"{RELEASE}-flywheel-operator"]
    assert [c["name"] for c in one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]] == ["operator"]
    assert not any(d["metadata"]["name"].endswith("-api") for d in docs)


def test_api_enabled_renders_its_own_deployment_and_service():
    docs = render("api.enabled=true", "api.port=9000", "api.readOnly=true")
    assert [c["name"] for c in operator_deployment(docs)["spec"]["template"]["spec"]["containers"]] == ["operator"]
    dep = next(d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == f"{RELEASE}-flywheel-api")
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == f"{RELEASE}-flywheel-api"  # not the operator's
    (api,) = pod["containers"]
    etcd = f"--etcd-endpoints={RELEASE}-flywheel-etcd-0.{RELEASE}-flywheel-etcd.{NAMESPACE}.svc:2379"
    assert api["args"] == ["api", "--host=0.0.0.0", "--port=9000", etcd, f"--namespace={NAMESPACE}", "--read-only"]
    assert api["ports"] == [{"name": "api", "containerPort": 9000, "protocol": "TCP"}]
    assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "api"}
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "api"}
    svc = next(s for s in by_kind(docs, "Service") if s["metadata"]["name"] == f"{RELEASE}-flywheel-api")
    assert svc["spec"]["ports"] == [{"name": "http", "port": 8700, "targetPort": "api", "protocol": "TCP"}]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert not svc["spec"]["selector"].items() <= operator_deployment(docs)["spec"]["template"]["metadata"][
        "labels"].items()
    sa = next(s for s in by_kind(docs, "ServiceAccount") if s["metadata"]["name"] == f"{RELEASE}-flywheel-api")
    assert sa["metadata"]["namespace"] == NAMESPACE


def test_api_args_accepted_by_the_cli_parser():
    cli = pytest.importorskip("flywheel.cli")
    for sets in (("api.enabled=true",), ("api.enabled=true", "rbac.clusterWide=true", "api.readOnly=true")):
        dep = next(d for d in by_kind(render(*sets), "Deployment") if d["metadata"]["name"].endswith("-api"))
        parsed = cli.build_parser().parse_args(dep["spec"]["template"]["spec"]["containers"][0]["args"])
        assert parsed.subcommand == "api" and parsed.port == 8700
        assert parsed.namespace == (None if "rbac.clusterWide=true" in sets else NAMESPACE)


# -- Kubernetes 1.33 schema --------------------------------------------------------------------------------------
def test_built_in_objects_validate_against_kubernetes_1_33():
    kv = pytest.importorskip("kubernetes_validate")
    docs = render(*ALL_ON, api_versions=MONITORING) + render() + render("api.enabled=true", "api.readOnly=true")
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


def test_hang_detection_is_on_by_default_and_can_be_turned_off():
    main = pytest.importorskip("flywheel.operator.main")

    def parsed(*values: str) -> argparse.Namespace:
        args = one(render(*values), "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        return main.build_parser().parse_args(args[1:])

    assert parsed().hang_detection and not parsed("operator.healthMonitor.hangDetection=false").hang_detection



def test_disruption_budgets_are_on_by_default_and_off_drops_their_permission():
    """operator.disruptionBudgets: the operator's PodDisruptionBudget per job and the grant it needs go together."""
    main = pytest.importorskip("flywheel.operator.main")

    def parsed(*values: str) -> tuple[argparse.Namespace, set[str]]:
        docs = render(*values)
        args = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
        verbs = {verb for role in by_kind(docs, "Role") + by_kind(docs, "ClusterRole")
                 for (group, resource), granted in rules_of(role).items()
                 if (group, resource) == ("policy", "poddisruptionbudgets") for verb in granted}
        return main.build_parser().parse_args(args[1:]), verbs

    on, on_verbs = parsed()
    off, off_verbs = parsed("operator.disruptionBudgets=false")
    assert on.disruption_budgets and on_verbs == {"create", "patch"}
    assert not off.disruption_budgets and off_verbs == set()
