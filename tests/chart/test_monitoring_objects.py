"""The chart's PodMonitors and PrometheusRule against the monitoring.coreos.com/v1 CRD schemas.

No registry here ships prometheus-operator's CRDs (PyPI has only generated model classes, npm TypeScript models), so
tests/chart/prometheus_operator_subset.schema.json is a hand-written, honest SUBSET of the podmonitors and
prometheusrules CRD schemas: the apiVersion/kind/metadata/spec fields this chart renders, with the CRDs' types,
enums and duration patterns, validated with jsonschema. It is stricter than the CRDs (a field it does not list
fails), so a field the chart starts to use must be added there with its CRD type; it cannot catch a CEL rule or a
field the CRD itself has dropped."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.chart.conftest import by_kind, render

SCHEMA = json.loads((Path(__file__).with_name("prometheus_operator_subset.schema.json")).read_text())
MONITORING = ("monitoring.coreos.com/v1",)
ALL_ON = ("rbac.clusterWide=true", "monitoring.additionalLabels.release=kube-prometheus-stack",
          "monitoring.interval=30s", "api.enabled=true", "operator.healthMonitor.enabled=true")


def validator(kind: str) -> Any:
    jsonschema = pytest.importorskip("jsonschema")
    schema = {**SCHEMA, "$ref": f"#/$defs/{kind[0].lower() + kind[1:]}"}
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def errors(doc: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator(doc["kind"]).iter_errors(doc)]


@pytest.mark.parametrize("sets", [(), ALL_ON], ids=["default", "all-on"])
def test_rendered_monitoring_objects_match_the_crd_schemas(sets):
    docs = render(*sets, api_versions=MONITORING)
    objects = by_kind(docs, "PodMonitor") + by_kind(docs, "PrometheusRule")
    assert [o["kind"] for o in objects] == ["PodMonitor", "PodMonitor", "PrometheusRule"]
    for obj in objects:
        assert errors(obj) == [], obj["metadata"]["name"]


def test_the_subset_schema_rejects_what_the_crds_reject():
    docs = render(api_versions=MONITORING)
    monitor, rule = by_kind(docs, "PodMonitor")[0], by_kind(docs, "PrometheusRule")[0]

    def broken(doc: dict[str, Any], change: Any) -> list[str]:
        doc = copy.deepcopy(doc)
        change(doc)
        return errors(doc)

    endpoint = lambda d: d["spec"]["podMetricsEndpoints"][0]  # noqa: E731
    assert broken(monitor, lambda d: endpoint(d).update(honorLabels="yes"))  # wrong type
    assert broken(monitor, lambda d: endpoint(d).update(interval="15 seconds"))  # not a Prometheus duration
    assert broken(monitor, lambda d: endpoint(d).update(targetPort="metrics"))  # not in the subset: add it first
    assert broken(monitor, lambda d: endpoint(d)["relabelings"][0].update(action="rename"))  # unknown action
    assert broken(monitor, lambda d: d["spec"].pop("selector"))  # required
    assert broken(monitor, lambda d: d.update(apiVersion="monitoring.coreos.com/v1alpha1"))
    first = lambda d: d["spec"]["groups"][0]["rules"][0]  # noqa: E731
    assert broken(rule, lambda d: first(d).pop("expr"))  # required
    assert broken(rule, lambda d: first(d).update({"for": "ten minutes"}))
    assert broken(rule, lambda d: first(d).update(labels={"severity": 3}))  # label values are strings
    assert broken(rule, lambda d: d["spec"]["groups"][0].pop("name"))
