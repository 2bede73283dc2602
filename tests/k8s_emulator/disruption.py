"""kube-controller-manager's disruption controller: the status of every PodDisruptionBudget (pdb.py), which the
Eviction API (eviction.py) reads.

For each budget, the pods of its namespace its selector selects, as pkg/controller/disruption does it:

- integer `minAvailable`: desiredHealthy = it, expectedPods = the number of those pods (finished ones included);
- `maxUnavailable` (integer or percent) and percent `minAvailable`: expectedPods = the sum of the scales of the pods'
  controllers (ownerReference with `controller: true`): any served kind with a scale subresource (a Deployment's
  `spec.replicas`, a custom resource's `specReplicasPath`). Pods without a controller are left out of that sum (a
  real cluster says so in an `UnmanagedPods` event; none is posted here). A controller of a kind without a scale, one
  that is gone, or a custom resource without a value at its specReplicasPath (whose /scale answers 500) fails the
  sync: the fail-safe status, disruptionsAllowed 0 and `DisruptionAllowed=False` reason `SyncFailed` with the error;
  percentages round up (`maxUnavailable` too), as intstr.GetScaledValueFromIntOrPercent(..., true);
- currentHealthy: the Ready pods not being deleted and not in `disruptedPods`; disruptionsAllowed =
  currentHealthy - desiredHealthy, never below 0, and 0 while expectedPods is 0;
- `disruptedPods` (the Eviction API's record) keeps only pods still there, not yet being deleted, recorded less than
  2 minutes ago.

The status is written only when it changed. A pass after writes syncs the budgets they touched; every budget is
synced once a second.
"""

from __future__ import annotations

import datetime
import math
import time
from typing import Any

from tests.k8s_emulator import pdb
from tests.k8s_emulator.errors import StatusError
from tests.k8s_emulator.store import Event, Store
from tests.k8s_emulator.tables import json_path
from tests.k8s_emulator.woken_loop import WokenLoop

DELETION_TIMEOUT = datetime.timedelta(minutes=2)  # how long a disruptedPods entry waits for its pod's deletion


class SyncFailed(Exception):
    """The expected pod count cannot be found; the message is the real controller's."""


def _when(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def scaled(value: int | str, total: int) -> int:
    """intstr.GetScaledValueFromIntOrPercent, rounding up."""
    if isinstance(value, int):
        return value
    return math.ceil(int(value.rstrip("%")) * total / 100)


class DisruptionController(WokenLoop):
    """Syncs the budgets a write touched (the budget itself, or one that selects the pod before or after the write),
    and every budget once each `resync_seconds` (disruptedPods entries time out without any write)."""

    watched = (pdb.PDBS, pdb.PODS)

    def __init__(self, store: Store, resync_seconds: float = 1.0) -> None:
        super().__init__(store, resync_seconds)
        self.paused = False  # fault hook: a controller manager that is down (fixtures.py's ApiHandle)
        self._touched_pods: list[dict[str, Any]] = []
        self._touched_budgets: set[tuple[str, str]] = set()
        self._last_full = -math.inf

    def noticed(self, event: Event) -> None:
        meta = event.obj["metadata"]
        if event.key == pdb.PDBS:
            self._touched_budgets.add((meta.get("namespace", ""), meta["name"]))
        else:
            self._touched_pods.extend(p for p in (event.obj, event.old) if p is not None)

    def run_pass(self) -> None:
        if self.paused:
            return
        pods, budgets = self._touched_pods, self._touched_budgets
        self._touched_pods, self._touched_budgets = [], set()
        if time.monotonic() - self._last_full >= self.resync_seconds:
            self._last_full = time.monotonic()
            self.sync_all()
        elif pods or budgets:
            self.sync_all(pods, budgets)

    def sync_all(self, pods: list[dict[str, Any]] | None = None,
                 budgets: set[tuple[str, str]] | None = None) -> None:
        for budget, selected in pdb.pods_by_budget(self.store, pods, budgets):
            try:
                self.sync(budget, selected)
            except StatusError:
                self.again()  # a conflict with an eviction's write, or a forced one: the next pass retries
                self._last_full = -math.inf

    def sync(self, budget: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        try:
            expected, desired = self.expected_and_desired(budget, pods)
        except SyncFailed as err:
            self._write(budget, fail_safe(budget.get("status") or {}, str(err)))
            return
        self._write(budget, computed_status(budget, pods, expected, desired))

    def _write(self, budget: dict[str, Any], status: dict[str, Any]) -> None:
        if status == budget.get("status"):
            return
        rt = self.store.registry.get(pdb.PDBS)
        assert rt is not None
        meta = budget["metadata"]
        self.store.update(rt, meta["namespace"], meta["name"], {**budget, "status": status}, "status")

    def expected_and_desired(self, budget: dict[str, Any], pods: list[dict[str, Any]]) -> tuple[int, int]:
        spec = budget.get("spec") or {}
        most_unavailable, least_available = spec.get("maxUnavailable"), spec.get("minAvailable")
        if most_unavailable is not None:
            expected = self.expected_scale(pods)
            return expected, max(expected - scaled(most_unavailable, expected), 0)
        if isinstance(least_available, int):
            return len(pods), least_available
        if least_available is not None:
            expected = self.expected_scale(pods)
            return expected, scaled(least_available, expected)
        return 0, 0

    def expected_scale(self, pods: list[dict[str, Any]]) -> int:
        """The sum of the scales of the pods' controllers, each counted once."""
        scales: dict[str, int] = {}
        for pod in pods:
            ref = next((o for o in pod["metadata"].get("ownerReferences") or [] if o.get("controller")), None)
            if ref is not None and ref.get("uid") not in scales:
                scales[ref.get("uid", "")] = self._scale_of(ref, pod)
        return sum(scales.values())

    def _scale_of(self, ref: dict[str, Any], pod: dict[str, Any]) -> int:
        api_version, kind = ref.get("apiVersion", ""), ref.get("kind", "")
        rt = self.store.registry.by_kind(api_version, kind)
        if rt is None:
            raise SyncFailed(f'no matches for kind "{kind}" in version "{api_version}"')
        if rt.scale is None:
            raise SyncFailed(f"{rt.group_kind} does not implement the scale subresource")
        owner = self.store.peek(rt.key, pod["metadata"]["namespace"], ref.get("name", ""))
        if owner is None or owner["metadata"]["uid"] != ref.get("uid"):
            raise SyncFailed(f'found no controllers for pod "{pod["metadata"]["name"]}"')
        replicas = json_path(owner, rt.scale["specReplicasPath"])
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise SyncFailed(f'Internal error occurred: the spec replicas field "{rt.scale["specReplicasPath"]}" '
                             "does not exist")
        return replicas


def computed_status(budget: dict[str, Any], pods: list[dict[str, Any]], expected: int,
                    desired: int) -> dict[str, Any]:
    """The budget's status from its pods; the old one, unchanged, when it is up to date."""
    old = budget.get("status") or {}
    now = datetime.datetime.now(datetime.UTC)
    recorded = old.get("disruptedPods") or {}
    disrupted = {p["metadata"]["name"]: recorded[p["metadata"]["name"]] for p in pods
                 if p["metadata"]["name"] in recorded and not p["metadata"].get("deletionTimestamp")
                 and _when(recorded[p["metadata"]["name"]]) + DELETION_TIMEOUT >= now}
    healthy = sum(1 for p in pods if pdb.ready(p) and not p["metadata"].get("deletionTimestamp")
                  and p["metadata"]["name"] not in disrupted)
    allowed = max(healthy - desired, 0) if expected > 0 else 0
    generation = budget["metadata"].get("generation", 1)
    counts = {"currentHealthy": healthy, "desiredHealthy": desired, "disruptionsAllowed": allowed,
              "expectedPods": expected}
    if all(old.get(k) == v for k, v in counts.items()) and recorded == disrupted \
            and old.get("observedGeneration") == generation and _condition_up_to_date(old):
        return old
    status: dict[str, Any] = {"observedGeneration": generation, **counts,
                              "conditions": old.get("conditions") or []}
    if disrupted:
        status["disruptedPods"] = disrupted
    return pdb.with_allowed_condition(status)


def _condition_up_to_date(status: dict[str, Any]) -> bool:
    condition: dict[str, Any] = next((c for c in status.get("conditions") or []
                                      if c.get("type") == pdb.CONDITION), {})
    if status.get("disruptionsAllowed", 0) > 0:
        return (condition.get("status"), condition.get("reason")) == ("True", "SufficientPods")
    return (condition.get("status"), condition.get("reason")) == ("False", "InsufficientPods")


def fail_safe(old: dict[str, Any], message: str) -> dict[str, Any]:
    """The controller's failSafe: no disruption allowed, and why (the rest of the status left as it was)."""
    return pdb.with_condition({**old, "disruptionsAllowed": 0}, False, "SyncFailed", message)
