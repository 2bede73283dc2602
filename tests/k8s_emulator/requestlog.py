"""Request recording for RBAC tests: each API request as Kubernetes' authorizer sees it -- (verb, apiGroup,
resource[/subresource], namespace) -- keyed by the caller's bearer token, so a test can give each client its own
identity and compare what it really asked for with a Role.

Off by default (the API server's `recorder` is None: one attribute check per request). `POST
/_flywheel/record-requests?on=true` starts a fresh recording, `GET /_flywheel/recorded-requests` returns it
(`?counts=true`: each request kind with how many times it was made, for load tests).
Discovery, OpenAPI, /version and health paths are not recorded: RBAC grants them to every authenticated user
(system:discovery), so a Role never lists them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

ANONYMOUS = "<anonymous>"
Attributes = tuple[str, str, str, str]  # verb, group, resource[/subresource], namespace ("" = cluster scope)


def bearer(headers: Mapping[str, str]) -> str:
    value = headers.get("Authorization", "")
    return value[7:].strip() if value.lower().startswith("bearer ") else ANONYMOUS


def rbac_attributes(method: str, path: str, query: Mapping[str, str]) -> Attributes | None:
    """The authorizer's view of one request (k8s.io/apiserver RequestInfo), or None for a non-resource path."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 3 and parts[0] == "api":
        group, rest = "", parts[2:]
    elif len(parts) >= 4 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return None  # /, /api, /apis, /api/v1, /apis/<group>[/<version>], /openapi, /version, /healthz, /_flywheel
    namespace = ""
    # /namespaces/<ns>/<resource>... names a namespaced resource; /namespaces/<ns>[/status|/finalize] the namespace.
    if len(rest) >= 3 and rest[0] == "namespaces" and not (len(rest) == 3 and rest[2] in ("status", "finalize")):
        namespace, rest = rest[1], rest[2:]
    elif rest[0] == "namespaces" and len(rest) >= 2:
        namespace = rest[1]  # a namespace is in its own namespace for RBAC (a Role there may grant get on it)
    resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
    named = len(rest) > 1
    if method == "GET":
        verb = "get" if named else "watch" if query.get("watch") in ("true", "1") else "list"
    elif method == "DELETE":
        verb = "delete" if named else "deletecollection"
    else:
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch"}.get(method, method.lower())
    return verb, group, resource, namespace


@dataclass
class RequestRecorder:
    by_identity: dict[str, set[Attributes]] = field(default_factory=dict)
    counts: Counter[tuple[str, Attributes]] = field(default_factory=Counter)

    def record(self, method: str, path: str, query: Mapping[str, str], headers: Mapping[str, str]) -> None:
        attributes = rbac_attributes(method, path, query)
        if attributes is not None:
            self.by_identity.setdefault(bearer(headers), set()).add(attributes)
            self.counts[(bearer(headers), attributes)] += 1

    def as_json(self, counts: bool = False) -> dict[str, list[list[str | int]]]:
        """Per identity: [verb, group, resource, namespace] of each kind of request, with its count when `counts`."""
        return {who: sorted([*a, self.counts[(who, a)]] if counts else list(a) for a in seen)
                for who, seen in self.by_identity.items()}
