"""Warm spares on the test cluster, driven by the real kubectl (issue 21): a job with `replicas.spares: 1` keeps a
spare pod running and registered; a deleted worker pod is replaced by promoting that spare (relabelled to the lost
index; no new worker pod in the critical path), a new spare is created behind it, and the job trains to the same
parameters as a fault-free run."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from flywheel.labels import INDEX_LABEL, ROLE_LABEL
from tests.operator.conftest import OpEnv, eventually
from tests.operator.test_operator_cluster import LONG, _columns, _reference_hash

pytestmark = pytest.mark.slow


def _labels(env: OpEnv, pod: str) -> dict[str, str]:
    found = [p for p in env.pods(pod.rsplit("-", 2)[0]) if p["metadata"]["name"] == pod]
    return dict(found[0]["metadata"].get("labels") or {}) if found else {}


class PodNames:
    """Every pod name of a job seen while it runs (polled): was a pod created that the test must not see?"""

    def __init__(self, env: OpEnv, job: str) -> None:
        self.env, self.job, self.seen, self.stop = env, job, set(), threading.Event()  # type: ignore[var-annotated]
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.wait(0.2):
            try:
                self.seen |= {p["metadata"]["name"] for p in self.env.pods(self.job)}
            except Exception:  # noqa: BLE001 (a kubectl hiccup: the next poll sees it)
                continue

    def close(self) -> set[str]:
        self.stop.set()
        self.thread.join(5)
        return self.seen


def test_a_deleted_worker_is_replaced_by_the_warm_spare(op_env: OpEnv) -> None:
    name = "spare-run"
    op_env.kubectl("apply", "-f", str(op_env.job_yaml(name, **LONG, **{"replicas.spares": 1})))
    # The spare runs, its agent registered as a ready spare: status.spares and the Spares column count it.
    eventually(lambda: op_env.status(name).get("spares") == 1, 120, "the spare to be ready")
    spare: dict[str, Any] = next(p for p in op_env.pods(name) if p["metadata"]["name"] == f"{name}-spare-0")
    assert spare["metadata"]["labels"][ROLE_LABEL] == "spare" and INDEX_LABEL not in spare["metadata"]["labels"]
    assert _columns(op_env, name)["SPARES"] == "1"
    eventually(lambda: op_env.last_step(name) >= 50, 120, f"{name} to pass step 50", interval=0.05)
    names = PodNames(op_env, name)
    op_env.kubectl("delete", "pod", f"{name}-worker-1", "--grace-period=0", "--force")
    eventually(lambda: _labels(op_env, f"{name}-spare-0").get(INDEX_LABEL) == "1", 30, "the spare to take index 1")
    assert _labels(op_env, f"{name}-spare-0")[ROLE_LABEL] == "worker"
    eventually(lambda: any(p["metadata"]["name"] == f"{name}-spare-1" for p in op_env.pods(name)), 30,
               "a new spare behind the promoted one")
    status = op_env.wait_phase(name, "Succeeded", 180)
    seen = names.close()
    assert f"{name}-worker-1" not in seen, "a cold worker pod was created instead of promoting the spare"
    assert status["step"] == 400 and status["restarts"] == 1 and status["lastRestartReason"] == "PodDeleted"
    events = [e for e in op_env.events_of(name) if e["reason"] == "SparePromoted"]
    # Force-deleted with grace 0, the old pod was gone before the pass that promoted: the event cannot name it.
    assert events and events[0]["message"] == f"spare {name}-spare-0 took replica 1 (its worker lost: PodDeleted)"
    assert op_env.done_hash(name) == _reference_hash(op_env)
    # Spares go with the finished job; none is left running.
    eventually(lambda: not [p for p in op_env.pods(name) if p["metadata"]["labels"].get(ROLE_LABEL) == "spare"
                            and p["status"].get("phase") in ("Pending", "Running")], 30, "the spares to go")
