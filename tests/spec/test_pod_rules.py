"""The Pod API's rules on what a TrainingJob copies into its pods (flywheel/spec/pod_rules/rules.py), as pure functions:
the syntaxes they are made of, `flywheel plan` refusing every value of the table (tests/pod_api_cases.py) naming the
field, and the CRD carrying the rules with the bounds CEL's cost budget needs. Their CEL text is judged by a real API
server in tests/k8s/test_pod_rules_server.py (the same SYNTAXES and table), and the table runs at `kubectl apply`
in tests/k8s/test_apply_time_refusals.py."""

from __future__ import annotations

import contextlib
import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.cli import main
from flywheel.spec import SpecError, parse_job
from flywheel.spec.crd.generate import build_crd
from flywheel.spec.crd.podtemplate import pod_template_schema
from flywheel.spec.field_rules import Bound, Text, attach
from flywheel.spec.k8s_syntax import (
    ANNOTATION_KEY,
    CONFIG_KEY,
    CONTAINER_RESOURCE,
    DNS_LABEL,
    ENV_NAME,
    EXTENDED_RESOURCE,
    FIELD_PATH,
    IMAGE,
    IP,
    LABEL_VALUE,
    PORT_NAME,
    QUALIFIED_NAME,
    QUANTITY,
    SUB_PATH,
    Syntax,
    quantity_value,
)
from flywheel.spec.object_names import (
    DNS_LABEL_MAX,
    MAX_NAME_LENGTH,
    MAX_REPLICAS,
    service_name,
    spare_name,
    worker_name,
)
from flywheel.spec.pod_rules.pod import VOLUME_SOURCES
from flywheel.spec.pod_rules.rules import JOB_NAME
from tests.pod_api_cases import BASE, GAPS, REFUSED, job, merged, pod_spec, spec, worker

SYNTAXES: list[tuple[Syntax, list[str], list[str]]] = [
    (DNS_LABEL, ["a", "a-1", "1a", "a" * 63], ["", "A", "-a", "a-", "a.b", "a_b", "a" * 64]),
    (JOB_NAME, ["a", "job-1", "a" * MAX_NAME_LENGTH], ["1job", "a.b", "Job", "a-", "a" * (MAX_NAME_LENGTH + 1)]),
    (LABEL_VALUE, ["", "a", "A.b_c-1", "a" * 63], ["-a", "a-", "a b", "a/b", "a" * 64]),
    (QUALIFIED_NAME, ["a", "example.com/a", "a.B_c", "k8s.io/" + "a" * 63],
     ["", "/a", "a/", "a/b/c", "Example.com/a", "a b", "example.com/" + "a" * 64, "a" * 254 + "/b"]),
    (ANNOTATION_KEY, ["Example.com/a", "a"], ["a/b/c", "bad key", "-a"]),
    (PORT_NAME, ["http", "h2c", "a-b", "8080a", "a" * 15], ["", "8080", "a--b", "-a", "a-", "a_b", "A", "a" * 16]),
    (ENV_NAME, ["A", "a.b-c", "1ABC", "MY VAR"], ["", "A=B", "é", "a\n"]),
    (IMAGE, ["busybox", "registry.example.com:5000/a/b:1@sha256:abc"], ["", " busybox", "busybox ", "a b", "a\tb"]),
    (QUANTITY, ["1", "0.5", ".5", "1.", "500m", "4Gi", "1e3", "1E", "+1", "2Ei"],
     ["", "-1", "1.5.5", "lots", "1Kb", "1e", "1 Gi", "1ki"]),
    (CONTAINER_RESOURCE, ["cpu", "memory", "ephemeral-storage", "hugepages-2Mi", "nvidia.com/gpu", "kubernetes.io/x"],
     ["gpu", "storage", "requests.example.com/x", "example.com/", "a/b/c", "hugepages-"]),
    (EXTENDED_RESOURCE, ["nvidia.com/gpu", "amd.com/gpu", "rdma/hca"],
     ["gpu", "kubernetes.io/gpu", "example.kubernetes.io/gpu", "requests.example.com/x", "cpu"]),
    (SUB_PATH, ["", "a", "a/b", "a..b"], ["/a", "..", "a/../b", "../a", "a/.."]),
    (FIELD_PATH, ["metadata.name", "metadata.labels['app']", "status.podIP", "spec.nodeName"],
     ["spec.bogus", "metadata", "status.phase"]),
    (CONFIG_KEY, ["a", "key.name", "KEY_NAME", "..a"[1:]], ["", ".", "..", "..a", "a/b", "a b"]),
    (IP, ["10.9.8.7", "2001:db8::ffff", "010.1.1.1"], ["", "x", "256.1.1.1", "1.2.3", "dns.example.com"]),
]


@pytest.mark.parametrize("syntax, good, bad", SYNTAXES, ids=[s.message[:40] for s, _, _ in SYNTAXES])
def test_each_syntax_takes_what_kubernetes_takes_and_refuses_the_rest(syntax, good, bad):
    assert [v for v in good if not syntax.ok(v)] == []
    assert [v for v in bad if syntax.ok(v)] == []


@pytest.mark.parametrize("text, amount", [("1", 1), ("500m", Decimal("0.5")), ("4Gi", 4 * 2**30), ("1e3", 1000),
                                          ("1.5k", 1500), (".5", Decimal("0.5")), (2, 2)])
def test_quantities_are_read_as_the_api_server_reads_them(text, amount):
    assert quantity_value(text) == amount


@pytest.mark.parametrize("value", ["-1", -1, "lots", 0.5, True, None, [1]])
def test_what_is_no_quantity_has_no_amount(value):
    assert quantity_value(value) is None


def test_the_job_name_leaves_room_for_every_name_the_operator_derives():
    longest = "a" * MAX_NAME_LENGTH
    names = [worker_name(longest, MAX_REPLICAS - 1), spare_name(longest, MAX_REPLICAS - 1), service_name(longest)]
    assert max(len(n) for n in names) == DNS_LABEL_MAX
    assert all(DNS_LABEL.ok(n) for n in names)
    with pytest.raises(SpecError, match="spec.replicas.max"):
        parse_job(job(spec(replicas={"min": 1, "max": MAX_REPLICAS + 1})))


def plan_output(doc: dict[str, Any], tmp_path: Path) -> tuple[int, str]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["plan", str(path)])
    return code, out.getvalue().replace("\n", "")


@pytest.mark.parametrize("case, change, field", REFUSED + GAPS, ids=[c for c, _, _ in REFUSED + GAPS])
def test_flywheel_plan_refuses_the_value_naming_the_field(case, change, field, tmp_path):
    code, text = plan_output(job(change), tmp_path)
    assert code != 0 and field in text, text


def test_flywheel_plan_takes_the_valid_job_and_a_full_template(tmp_path):
    full = job(merged(pod_spec(
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                     {"operator": "Exists"}, {"key": "k", "value": "v", "effect": "NoExecute", "tolerationSeconds": 5}],
        nodeSelector={"nvidia.com/gpu.product": "H100"}, priorityClassName="high", hostNetwork=True,
        volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}, {"name": "cfg", "configMap": {
            "name": "cfg", "items": [{"key": "a.yaml", "path": "conf/a.yaml"}]}}],
        initContainers=[{"name": "fetch", "image": "busybox", "restartPolicy": "Always"}],
        containers=[{"name": "worker", "ports": [{"containerPort": 8080, "hostPort": 8080, "name": "http"}],
                     "env": [{"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                     "volumeMounts": [{"name": "data", "mountPath": "/data", "subPath": "a/b"},
                                      {"name": "cfg", "mountPath": "/cfg"}],
                     "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}},
                    {"name": "side", "image": "busybox", "ports": [{"containerPort": 9400, "name": "metrics"}],
                     "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}]),
        spec(image="registry.example.com/flywheel:1.0", resources={"limits": {"cpu": 4}},
             scheduling={"priorityClassName": "high", "queue": "team-a",
                         "topologyKey": "topology.kubernetes.io/zone"})))
    full["spec"]["template"]["metadata"] = {"labels": {"team": "ml"}, "annotations": {"Example.com/x": "anything"}}
    for doc in (BASE, full):
        code, text = plan_output(doc, tmp_path)
        assert code == 0, text


def test_every_cel_rule_under_a_list_or_map_is_bounded():
    with pytest.raises(ValueError, match="no Bound limits"):
        attach({"properties": {"items": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}}}}}}, [Text("items[].name", "m", syntax=DNS_LABEL)])
    bounded = [Bound("items", "m", most=4), Text("items[].name", "m", syntax=DNS_LABEL)]
    schema = attach({"properties": {"items": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}}}}}}, bounded)
    assert schema["properties"]["items"]["maxItems"] == 4
    assert schema["properties"]["items"]["items"]["properties"]["name"]["maxLength"] == 63


def test_the_crd_carries_the_rules_where_the_pods_take_the_fields():
    spec_schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    container = spec_schema["properties"]["template"]["properties"]["spec"]["properties"]["containers"]
    assert container["maxItems"] == 16 and container["x-kubernetes-list-map-keys"] == ["name"]
    port_name = container["items"]["properties"]["ports"]["items"]["properties"]["name"]
    assert port_name["maxLength"] == 15
    assert [v["message"] for v in port_name["x-kubernetes-validations"]] == [PORT_NAME.message]
    assert spec_schema["properties"]["image"]["x-kubernetes-validations"][0]["message"] == IMAGE.message
    quantity = spec_schema["properties"]["resources"]["properties"]["limits"]["additionalProperties"]
    assert quantity["x-kubernetes-int-or-string"] is True and quantity["pattern"].startswith("^(")


def test_the_volume_sources_are_the_pod_apis():
    volume = pod_template_schema()["properties"]["spec"]["properties"]["volumes"]["items"]["properties"]
    assert set(VOLUME_SOURCES) == set(volume) - {"name"}


def test_every_refusal_names_the_field_once_per_problem():
    with pytest.raises(SpecError) as err:
        parse_job(job(worker(ports=[{"containerPort": 0, "name": "http_port"}], imagePullPolicy="Sometimes")))
    assert sorted(err.value.problems) == [
        "spec.template.spec.containers[0].imagePullPolicy: must be Always, IfNotPresent or Never",
        "spec.template.spec.containers[0].ports[0].containerPort: must be a port number from 1 to 65535",
        f"spec.template.spec.containers[0].ports[0].name: {PORT_NAME.message}",
    ]
