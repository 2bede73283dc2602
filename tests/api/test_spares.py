"""The REST API's job detail lists workers only: a warm spare (role=spare) holds no replica index or ranks."""

from __future__ import annotations

from typing import Any

from flywheel.api.views import detail
from flywheel.contracts.labels import GENERATION_LABEL, INDEX_LABEL, JOB_LABEL, ROLE_LABEL


def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {JOB_LABEL: "j", GENERATION_LABEL: "0", **labels}},
            "status": {"phase": "Running"}}


def test_spares_are_not_listed_as_workers_until_promoted() -> None:
    job = {"metadata": {"name": "j", "namespace": "ml", "uid": "u"}, "spec": {"procsPerReplica": 2}, "status": {}}
    pods = [pod("j-worker-1", {INDEX_LABEL: "1", ROLE_LABEL: "worker"}), pod("j-spare-0", {ROLE_LABEL: "spare"}),
            pod("j-spare-1", {INDEX_LABEL: "0", ROLE_LABEL: "worker"})]
    workers = detail(job, pods, []).workers
    assert [(w.index, w.pod, w.first_rank) for w in workers] == [(0, "j-spare-1", 0), (1, "j-worker-1", 2)]
