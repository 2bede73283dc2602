"""`scheduling.topologyKey`: worker pods of a job land in one topology domain (pod affinity on the job label),
required for gang jobs and preferred otherwise; ranks stay row-major by replica index. Pure: manifests only."""

from __future__ import annotations

import pytest

from flywheel.operator import manifests as m
from tests import builders

SETTINGS = m.OperatorSettings(etcd_endpoints="etcd:2379")
ZONE = "topology.kubernetes.io/zone"


def job(**scheduling: object):
    return builders.job({"replicas": {"min": 2, "max": 4, "target": 3}, "procsPerReplica": 4,
                         "trainer": {"parallelism": {"tp": 2, "pp": 2},
                                     "training": {"globalBatch": 48, "microBatch": 1}},
                         "scheduling": scheduling, "checkpoint": {"dir": "/ckpt/rack"}}, name="rack", namespace="ml")


def pods(j) -> list[dict]:
    return [m.pod(j, w, 1, SETTINGS) for w in m.plan(j, "0123456789abcdef", SETTINGS, None)]


def test_gang_jobs_require_one_topology_domain():
    bodies = pods(job(topologyKey=ZONE))  # gang: true is the default
    assert len(bodies) == 3
    for body in bodies:
        terms = body["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms == [{"labelSelector": {"matchLabels": {m.JOB_LABEL: "rack"}}, "topologyKey": ZONE}]
        # The term matches the pod's own labels, so the first worker may open the domain.
        assert body["metadata"]["labels"][m.JOB_LABEL] == "rack"
        assert "preferredDuringSchedulingIgnoredDuringExecution" not in body["spec"]["affinity"]["podAffinity"]


def test_non_gang_jobs_prefer_one_topology_domain():
    for body in pods(job(topologyKey="example.com/rack", gang=False)):
        pa = body["spec"]["affinity"]["podAffinity"]
        assert pa == {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": {m.JOB_LABEL: "rack"}},
                                                "topologyKey": "example.com/rack"}}]}


def test_no_topology_key_no_affinity():
    assert all("affinity" not in body["spec"] for body in pods(job()))


def test_ranks_are_row_major_by_replica_index():
    # tp 2 x pp 2 inside a worker of 4 ranks: worker i holds ranks 4i .. 4i + 3, so a tp pair never spans workers.
    workers = m.plan(job(topologyKey=ZONE), "0123456789abcdef", SETTINGS, None)
    assert [(w.index, w.first_rank, w.last_rank) for w in workers] == [(0, 0, 3), (1, 4, 7), (2, 8, 11)]
    for rank in range(12):
        assert rank // 4 == (rank - rank % 2) // 4  # the tp pair (2r, 2r + 1) is on one worker


@pytest.mark.parametrize("gang", [True, False])
def test_pods_with_topology_affinity_pass_the_kubernetes_schema(gang):
    kv = pytest.importorskip("kubernetes_validate")
    for body in pods(job(topologyKey=ZONE, gang=gang)):
        kv.validate(body, "1.33.0", strict=True)
