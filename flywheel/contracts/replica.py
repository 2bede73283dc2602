"""A worker's replica identity, defined once for the executors that set it (worker_plan.py), the rendezvous that orders
ranks by it (agent/rank_order.py), the liveness keys (etcd/liveness.py) and the metrics labels. Dependency-free:
the local agent reads it before importing anything heavy."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

REPLICA_INDEX_ENV = "FLYWHEEL_REPLICA_INDEX"
# A warm spare starts like a worker but with SPARE_ENV=1 and no replica index; it waits to be promoted.
SPARE_ENV = "FLYWHEEL_SPARE"
# Local runs only: the file the supervisor writes the promotion JSON to (a cluster uses an etcd key instead).
SPARE_PROMOTION_FILE_ENV = "FLYWHEEL_SPARE_PROMOTION_FILE"
# The spare's name: its pod name on a cluster, "spare-<n>" locally.
SPARE_ID_ENV = "FLYWHEEL_SPARE_ID"


def is_spare(env: Mapping[str, str]) -> bool:
    """Whether this process was started as a warm spare (not yet promoted to a replica index)."""
    return env.get(SPARE_ENV, "") == "1"


def replica_id_from_env() -> str:
    """The worker's stable replica index when the executor set one, else the hostname (the pod name)."""
    return os.environ.get(REPLICA_INDEX_ENV) or socket.gethostname()
