"""The operator runner's liveness verdict on one pod, as its pass judges it (etcd_views.key_owners first)."""

from __future__ import annotations

from typing import Any

from flywheel.operator.etcd_views import key_owners


def verdict(runner: Any, pod: Any, created: float, now: float) -> bool:
    """Whether `runner` judges `pod` (the only pod of its index, created at `created`) lost at `now`."""
    keys = runner.observer.etcd
    keys.key_owner = key_owners([(pod, created)], keys.live)
    return bool(keys.liveness_lost(pod, now))
