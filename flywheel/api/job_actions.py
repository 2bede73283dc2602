"""The API's actions. They only ever change the TrainingJob through the Kubernetes API (never its pods), so the
operator carries them out and Kubernetes' RBAC and audit log see every change.

- suspend / resume: merge patch `spec.suspend` (the operator deletes / recreates the pods).
- scale: the scale subresource, like `kubectl scale tj` (sets `spec.replicas.target`; CEL keeps it in range).
- restart: annotation `flywheel.dev/restart-requested-at` = an RFC 3339 time; the operator restarts every worker
  once per value and records it in `status.restartRequestHandled` (docs/operator.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from flywheel.contracts.labels import RESTART_ANNOTATION
from flywheel.contracts.timefmt import rfc3339
from flywheel.spec.crd.generate import GROUP, PLURAL, VERSION

if TYPE_CHECKING:  # the client is the `cluster` extra: loaded only when a cluster server starts
    from flywheel.kube.client import Kube, KubeApiError

Obj = dict[str, Any]


class ActionError(Exception):
    """A refused action, with the HTTP status and Kubernetes reason to answer with."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class Actions(Protocol):
    async def suspend(self, namespace: str, name: str, value: bool) -> Obj: ...
    async def restart(self, namespace: str, name: str) -> Obj: ...
    async def scale(self, namespace: str, name: str, replicas: int) -> Obj: ...


class KubeActions:
    """Actions through the product's Kubernetes client (flywheel/kube; the API server's own credentials; RBAC for
    the caller is checked beforehand by a SubjectAccessReview in auth.py)."""

    def __init__(self, kube: Kube) -> None:
        from flywheel.kube.client import KubeApiError

        self._kube, self._refused = kube, KubeApiError

    def _path(self, namespace: str, name: str, subresource: str = "") -> str:
        return self._kube.custom(GROUP, VERSION, namespace, PLURAL, name) + (f"/{subresource}" if subresource else "")

    async def _patch(self, path: str, patch: Obj) -> Obj:
        try:
            return await self._kube.merge_patch(path, patch)
        except self._refused as err:
            raise as_action_error(err) from None

    async def suspend(self, namespace: str, name: str, value: bool) -> Obj:
        return await self._patch(self._path(namespace, name), {"spec": {"suspend": value}})

    async def restart(self, namespace: str, name: str) -> Obj:
        return await self._patch(self._path(namespace, name),
                                 {"metadata": {"annotations": {RESTART_ANNOTATION: rfc3339()}}})

    async def scale(self, namespace: str, name: str, replicas: int) -> Obj:
        await self._patch(self._path(namespace, name, "scale"), {"spec": {"replicas": replicas}})
        try:
            job = await self._kube.request("GET", self._path(namespace, name))
        except self._refused as err:
            raise as_action_error(err) from None
        return dict(job)


def as_action_error(err: KubeApiError) -> ActionError:
    """Carry the API server's status (404, 409, 422 from the CEL rules, 403, ...) and message through."""
    body = err.body if isinstance(err.body, dict) else {}
    reason = str(body.get("reason") or "Error")
    message = str(body.get("message") or (err.body if isinstance(err.body, str) else "") or f"HTTP {err.status}")
    return ActionError(err.status, reason, f"Kubernetes API: {message}")
