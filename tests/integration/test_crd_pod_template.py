"""The CRD's `spec.template` is the real PodTemplateSpec schema: with the real kubectl on the test cluster, a typo or
a wrong type under the template is refused at apply time as it would be for a Pod, the operator-owned pod fields
and Kueue's pod-group metadata are refused with their fix (the operator's words), and `kubectl explain` walks into
the pod template."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.spec.pod_template import kueue_key_problem, owned_field_problem
from tests.builders import job_doc
from tests.integration.kubectl_cluster import kubectl_on_test_cluster

CRD = Path(__file__).resolve().parents[2] / "crds" / "trainingjobs.flywheel.dev.yaml"


@pytest.fixture(scope="module")
def kubectl() -> Iterator[Any]:
    with kubectl_on_test_cluster(CRD) as run:  # client-side apply: the last-applied annotation fits
        yield run


def job(template: dict[str, Any]) -> str:
    return yaml.safe_dump(job_doc({"trainer": {"training": {"steps": 2}}, "template": template}, name="t"))


GPU_TEMPLATE = {
    "metadata": {"labels": {"team": "llm"}, "annotations": {"note": "x"}},
    "spec": {
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "nodeSelector": {"nvidia.com/gpu.product": "H100"},
        "terminationGracePeriodSeconds": 120,
        "containers": [{"name": "worker", "resources": {"limits": {"nvidia.com/gpu": 8, "memory": "64Gi"}},
                        "env": [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}],
                        "livenessProbe": {"httpGet": {"port": "metrics", "path": "/"}}},
                       {"name": "sidecar", "image": "busybox", "ports": [{"containerPort": 8080}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "dataset"}}],
    },
}


def test_a_full_pod_template_is_accepted(kubectl):
    result = kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-", stdin=job(GPU_TEMPLATE))
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["spec"]["template"] == GPU_TEMPLATE  # nothing pruned


@pytest.mark.parametrize("template, words", [
    ({"spec": {"tolerations": [{"keyy": "x"}]}}, 'unknown field "spec.template.spec.tolerations[0].keyy"'),
    ({"spec": {"nodeSelectr": {"a": "b"}}}, 'unknown field "spec.template.spec.nodeSelectr"'),
    ({"spec": {"containers": [{"name": "worker", "imagePullPolicy": "Always", "envv": []}]}},
     'unknown field "spec.template.spec.containers[0].envv"'),
], ids=["toleration-key", "node-selector", "container-env"])
def test_a_typo_under_the_template_is_refused(kubectl, template, words):
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=job(template))
    assert result.returncode != 0 and words in result.stderr, result.stderr


@pytest.mark.parametrize("template, words", [
    ({"spec": {"terminationGracePeriodSeconds": "long"}}, "spec.template.spec.terminationGracePeriodSeconds"),
    ({"spec": {"tolerations": {"key": "x"}}}, "spec.template.spec.tolerations"),
    ({"spec": {"containers": [{"image": "x"}]}}, "spec.template.spec.containers[0].name: Required value"),
    ({"spec": {"containers": [{"name": "w", "resources": {"limits": {"cpu": [1]}}}]}},
     "spec.template.spec.containers[0].resources.limits.cpu"),
], ids=["grace-type", "tolerations-type", "container-name", "quantity-type"])
def test_a_wrong_type_under_the_template_is_refused(kubectl, template, words):
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=job(template))
    assert result.returncode != 0 and words in result.stderr, result.stderr


@pytest.mark.parametrize("field", ["restartPolicy", "hostname", "subdomain"])
def test_operator_owned_pod_fields_are_refused_with_the_fix(kubectl, field):
    """In the operator's words (spec/pod_template.py), so that kubectl and the Invalid condition say the same."""
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=job({"spec": {field: "Always"}}))
    assert result.returncode != 0, result.stderr
    assert f"spec.template.spec.{field}" in result.stderr, result.stderr
    assert owned_field_problem(field) in " ".join(result.stderr.split()), result.stderr


@pytest.mark.parametrize("where, key", [("labels", "kueue.x-k8s.io/queue-name"),
                                        ("labels", "kueue.x-k8s.io/pod-group-name"),
                                        ("annotations", "kueue.x-k8s.io/pod-group-total-count")])
def test_kueue_pod_group_metadata_is_refused_with_the_fix(kubectl, where, key):
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=job({"metadata": {where: {key: "x"}}}))
    assert result.returncode != 0, result.stderr
    assert kueue_key_problem(where, key) in " ".join(result.stderr.split()), result.stderr
    fine = kubectl("apply", "--dry-run=server", "-f", "-", stdin=job({"metadata": {where: {"team": "a"}}}))
    assert fine.returncode == 0, fine.stderr


def test_kubectl_explain_walks_into_the_pod_template(kubectl):
    result = kubectl("explain", "trainingjob.spec.template.spec.tolerations")
    assert result.returncode == 0, result.stderr
    assert "tolerationSeconds" in result.stdout and "<[]Object>" in result.stdout, result.stdout
    assert "If specified, the pod's tolerations." in result.stdout, result.stdout
    sections = kubectl("explain", "trainingjob.spec.scheduling")
    assert sections.returncode == 0 and "Kueue" in sections.stdout, sections.stdout
    status = kubectl("explain", "trainingjob.status.goodput.ratio")
    assert status.returncode == 0 and "wall time" in status.stdout, status.stdout
