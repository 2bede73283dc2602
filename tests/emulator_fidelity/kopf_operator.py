"""A tiny kopf operator used by test_kopf.py to prove the emulator serves what kopf relies on."""

from __future__ import annotations

import os
from typing import Any

import kopf

GROUP, VERSION, PLURAL = "test.flywheel.dev", "v1", "minijobs"


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    return kopf.ConnectionInfo(server=os.environ["TEST_CLUSTER_API"], insecure=True)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = 0
    settings.watching.server_timeout = 10


@kopf.on.create(GROUP, VERSION, PLURAL)
def created(body: Any, spec: Any, patch: kopf.Patch, **_: Any) -> None:
    kopf.info(body, reason="Seen", message="created by test")
    patch.status["phase"] = "Running"
    patch.status["seenReplicas"] = spec["replicas"]


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec.replicas")
def scaled(new: Any, patch: kopf.Patch, **_: Any) -> None:
    patch.status["seenReplicas"] = new


@kopf.on.delete(GROUP, VERSION, PLURAL)
def deleted(name: str, logger: Any, **_: Any) -> None:
    logger.info(f"cleanup of {name}")
