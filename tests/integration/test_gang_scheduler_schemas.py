"""The operator's gang-scheduling objects against the schedulers' published CRD schemas on the test cluster, with
the real kubectl (strict field validation): Volcano's and scheduler-plugins' PodGroups as the operator creates them
(tests/fixtures/crds, trimmed from the published CRDs, never downloaded), and a Kueue-queued worker pod with Kueue's
pod-group metadata and admission gate, read back with `kubectl get pod -o json`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from flywheel.operator import manifests as m
from flywheel.operator import scheduling_meta as k
from flywheel.spec import TrainingJob
from tests import builders
from tests.integration.kubectl_cluster import kubectl_on_test_cluster

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "crds"
SCHEDULERS = {"volcano": ("volcano-podgroup.yaml", "podgroups.scheduling.volcano.sh"),
              "scheduler-plugins": ("scheduler-plugins-podgroup.yaml", "podgroups.scheduling.x-k8s.io")}


@pytest.fixture(scope="module")
def kubectl() -> Iterator[Any]:
    with kubectl_on_test_cluster(*(FIXTURES / crd for crd, _ in SCHEDULERS.values())) as run:
        yield run


def job(queue: str = "team-a") -> TrainingJob:
    return builders.job({"replicas": {"min": 2, "max": 2}, "scheduling": {"queue": queue},
                         "trainer": {"training": {"globalBatch": 8, "microBatch": 1}}}, name="llm", namespace="default")


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_the_operator_s_podgroup_fits_the_published_schema(kubectl, scheduler):
    group = m.pod_group(job(), m.OperatorSettings(etcd_endpoints="", gang_scheduler=scheduler))
    assert group is not None
    created = kubectl("create", "--validate=strict", "-f", "-", stdin=json.dumps(group))
    assert created.returncode == 0, created.stderr
    stored = json.loads(kubectl("get", SCHEDULERS[scheduler][1], "llm", "-o", "json").stdout)
    assert stored["spec"] == group["spec"]  # nothing pruned: every field is the scheduler's
    assert stored["spec"]["minMember"] == 2
    if scheduler == "volcano":
        assert stored["spec"]["queue"] == "team-a"


@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_the_fixture_schemas_are_live(kubectl, scheduler):
    group = m.pod_group(job(), m.OperatorSettings(etcd_endpoints="", gang_scheduler=scheduler))
    assert group is not None
    group["metadata"]["name"] = "typo"
    group["spec"]["minMembers"] = 2  # a misspelt field is refused, a wrong type too
    typo = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(group))
    assert typo.returncode != 0 and 'unknown field "spec.minMembers"' in typo.stderr, typo.stderr
    group["spec"] = {"minMember": "two"}
    wrong = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(group))
    assert wrong.returncode != 0 and "spec.minMember" in wrong.stderr, wrong.stderr


@pytest.mark.parametrize("scheduler, key", [("volcano", "annotations"), ("scheduler-plugins", "labels")])
def test_gang_pods_name_their_group_and_scheduler(scheduler, key):
    settings = m.OperatorSettings(etcd_endpoints="etcd:2379", gang_scheduler=scheduler)
    j = job()
    p = m.pod(j, m.plan(j, "0123456789abcdef", settings, None)[0], 0, settings)
    name_key = m.GANG[scheduler].get("annotation") or m.GANG[scheduler]["label"]
    assert p["metadata"][key][name_key] == "llm"
    assert p["spec"]["schedulerName"] == m.GANG[scheduler]["scheduler"]


def test_a_kueue_queued_worker_pod_is_created_gated_with_its_group(kubectl):
    j = job()
    settings = m.OperatorSettings(etcd_endpoints="127.0.0.1:1")
    body = m.pod(j, m.plan(j, "0123456789abcdef", settings, None)[1], 0, settings)
    created = kubectl("create", "--validate=strict", "-f", "-", stdin=yaml.safe_dump(body))
    assert created.returncode == 0, created.stderr
    stored = json.loads(kubectl("get", "pod", "llm-worker-1", "-o", "json").stdout)
    assert stored["metadata"]["labels"][k.POD_GROUP_LABEL] == "llm"
    assert stored["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert stored["metadata"]["annotations"][k.POD_GROUP_TOTAL_ANNOTATION] == "2"
    assert stored["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/admission"}]
    kubectl("delete", "pod", "llm-worker-1", "--grace-period=0", "--force")
