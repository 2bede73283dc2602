"""Set-up shared by the test-cluster tests that take a worker's node away from a job with a warm spare."""

from __future__ import annotations

from typing import Any

from tests.operator.conftest import OpEnv, eventually


def node_of(env: OpEnv, job: str, pod: str) -> str:
    return next(str(p["spec"].get("nodeName") or "") for p in env.pods(job) if p["metadata"]["name"] == pod)


def train_with_a_ready_spare(env: OpEnv, name: str, spec: dict[str, Any]) -> str:
    """Apply the LONG job with `spec` over it (and `replicas.spares: 1`), wait for its spare to be ready and step 50
    to pass; the worker not beside the spare. With 2 nodes the spare shares one with a worker whatever its preferred
    anti-affinity: the other worker's node is the one to take away (a node holding the spare too would take both
    with it)."""
    env.kubectl("apply", "-f", str(env.long_job_yaml(name, **spec)))
    eventually(lambda: env.status(name).get("spares") == 1, 120, "the spare to be ready")
    eventually(lambda: env.last_step(name) >= 50, 120, f"{name} to pass step 50", interval=0.05)
    spare_node = node_of(env, name, f"{name}-spare-0")
    return next(f"{name}-worker-{i}" for i in (1, 0) if node_of(env, name, f"{name}-worker-{i}") != spare_node)
