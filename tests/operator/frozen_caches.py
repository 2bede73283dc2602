"""A fake of the operator's watch-fed caches (operator/caches.py) for runner tests without a cluster."""

from __future__ import annotations

import copy
from typing import Any


class FrozenCaches:
    """Watch-fed caches that never catch up: the job as first seen, no pods, no Service, no lost node."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.first = copy.deepcopy(job)

    async def job(self, namespace: str, name: str) -> dict[str, Any]:
        return copy.deepcopy(self.first)

    async def pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return []

    async def service_exists(self, namespace: str, name: str) -> bool:
        return True

    async def lost_nodes(self) -> set[str]:
        return set()

    async def node_marks(self) -> list[Any]:
        return []

    async def usable_nodes(self) -> frozenset[str]:
        return frozenset()

    async def checkpoint_users(self, location: str) -> list[Any]:
        return []
