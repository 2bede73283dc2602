"""flywheel/kube/pod_state.py read through the REST API's worker view: the same outcome the operator decides on."""

from __future__ import annotations

from flywheel.api.views import worker
from flywheel.contracts.labels import INDEX_LABEL


def pod(status: dict, inits: list[dict] | None = None) -> dict:
    return {"metadata": {"name": "j-worker-1", "labels": {INDEX_LABEL: "1"}},
            "spec": {"initContainers": inits or []}, "status": status}


def test_the_api_worker_names_the_init_container_that_failed() -> None:
    failed = pod({"phase": "Failed", "initContainerStatuses": [
        {"name": "fetch", "state": {"terminated": {"exitCode": 3, "reason": "Error", "message": "no dataset\n"}}}],
        "containerStatuses": [{"name": "worker", "state": {"waiting": {"reason": "PodInitializing"}}}]},
        [{"name": "fetch"}])
    shown = worker(failed, procs=2)
    assert (shown.first_rank, shown.last_rank, shown.phase) == (2, 3, "Failed")
    assert (shown.exit_code, shown.reason, shown.message) == (3, "Error", "init container fetch failed: no dataset")


def test_the_api_worker_reads_the_worker_container_not_a_sidecar() -> None:
    ended = pod({"phase": "Failed", "containerStatuses": [
        {"name": "side", "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
        {"name": "worker", "state": {"terminated": {"exitCode": 1, "reason": "Error",
                                                    "message": "Traceback\nValueError: bad lr\n"}}}]})
    shown = worker(ended, procs=1)
    assert (shown.exit_code, shown.reason, shown.message) == (1, "Error", "ValueError: bad lr")
