"""A worker's replica identity, defined once for the executors that set it (plan.py), the rendezvous that orders
ranks by it (trainer/rank_order.py), the liveness keys (etcd/liveness.py) and the metrics labels. Dependency-free:
the local agent reads it before importing anything heavy."""

from __future__ import annotations

import os
import socket

REPLICA_INDEX_ENV = "FLYWHEEL_REPLICA_INDEX"


def replica_id_from_env() -> str:
    """The worker's stable replica index when the executor set one, else the hostname (the pod name)."""
    return os.environ.get(REPLICA_INDEX_ENV) or socket.gethostname()
