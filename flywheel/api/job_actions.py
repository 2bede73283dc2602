"""The API's actions. They only ever change the TrainingJob through the Kubernetes API (never its pods), so the
operator carries them out and Kubernetes' RBAC and audit log see every change.

- suspend / resume: merge patch `spec.suspend` (the operator deletes / recreates the pods).
- scale: the scale subresource, like `kubectl scale tj` (sets `spec.replicas.target`; CEL keeps it in range).
- restart: annotation `flywheel.dev/restart-requested-at` = an RFC 3339 time; the operator restarts every worker
  once per value and records it in `status.restartRequestHandled` (docs/operator.md).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from flywheel.crd import GROUP, PLURAL, VERSION
from flywheel.labels import RESTART_ANNOTATION
from flywheel.timefmt import rfc3339

MERGE_PATCH = "application/merge-patch+json"
Obj = dict[str, Any]


class ActionError(Exception):
    """A refused action, with the HTTP status and Kubernetes reason to answer with."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


class Actions(Protocol):
    def suspend(self, namespace: str, name: str, value: bool) -> Obj: ...
    def restart(self, namespace: str, name: str) -> Obj: ...
    def scale(self, namespace: str, name: str, replicas: int) -> Obj: ...


class KubeActions:
    """Actions through a kubernetes.ApiClient (the API server's own credentials; RBAC for the caller is checked
    beforehand by a SubjectAccessReview in auth.py)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes import client

        self._custom = client.CustomObjectsApi(api_client)

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Obj:
        from kubernetes.client.exceptions import ApiException

        try:
            return dict(fn(GROUP, VERSION, *args, **kwargs))
        except ApiException as err:
            raise _as_action_error(err) from None

    def suspend(self, namespace: str, name: str, value: bool) -> Obj:
        return self._call(self._custom.patch_namespaced_custom_object, namespace, PLURAL, name,
                          {"spec": {"suspend": value}}, _content_type=MERGE_PATCH)

    def restart(self, namespace: str, name: str) -> Obj:
        patch = {"metadata": {"annotations": {RESTART_ANNOTATION: rfc3339()}}}
        return self._call(self._custom.patch_namespaced_custom_object, namespace, PLURAL, name, patch,
                          _content_type=MERGE_PATCH)

    def scale(self, namespace: str, name: str, replicas: int) -> Obj:
        self._call(self._custom.patch_namespaced_custom_object_scale, namespace, PLURAL, name,
                   {"spec": {"replicas": replicas}}, _content_type=MERGE_PATCH)
        return self._call(self._custom.get_namespaced_custom_object, namespace, PLURAL, name)


def _as_action_error(err: Any) -> ActionError:
    """Carry the API server's status (404, 409, 422 from the CEL rules, 403, ...) and message through."""
    reason, message = "Error", str(err.reason or "")
    try:
        body = json.loads(err.body or "{}")
        reason, message = body.get("reason") or reason, body.get("message") or message
    except (TypeError, ValueError):
        pass
    return ActionError(int(err.status or 500), reason, f"Kubernetes API: {message}")
