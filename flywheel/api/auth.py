"""Bearer-token authentication and authorization of API requests.

- `TokenFileAuth` (local use, or a cluster without TokenReview rights): a Kubernetes static token file,
  `token,user,uid[,"group1,group2"]` per line. Tokens in group `flywheel:viewers` may only read.
- `KubeAuth` (cluster): the token is checked with a TokenReview and every request with a SubjectAccessReview
  against the TrainingJob verbs (get/list on `trainingjobs`, patch on `trainingjobs` or `trainingjobs/scale`),
  so who may read or act is decided by the cluster's RBAC. Results are cached briefly so a busy dashboard does not
  cost two API calls per request. The reviews go through the product's Kubernetes client (flywheel/kube), on the
  event loop.

Both are async (the app awaits them on its event loop): a token file answers from memory, a review awaits the API.
"""

from __future__ import annotations

import csv
import hmac
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from flywheel.spec.crd.generate import GROUP, PLURAL

VIEWERS_GROUP = "flywheel:viewers"
READ_VERBS = frozenset({"get", "list", "watch"})


@dataclass(frozen=True)
class Principal:
    user: str
    uid: str = ""
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class Access:
    """One request in SubjectAccessReview terms; `namespace` "" means all namespaces."""

    verb: str
    namespace: str = ""
    name: str = ""
    subresource: str = ""


class Auth(Protocol):
    async def authenticate(self, token: str) -> Principal | None: ...
    async def authorize(self, who: Principal, access: Access) -> tuple[bool, str]: ...


class AuthConfigError(ValueError):
    pass


@dataclass
class TokenFileAuth:
    tokens: dict[str, Principal] = field(default_factory=dict)

    @classmethod
    def from_file(cls, path: str | Path) -> TokenFileAuth:
        tokens: dict[str, Principal] = {}
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise AuthConfigError(f"token file {path}: {err.strerror}") from None
        for lineno, row in enumerate(csv.reader(text.splitlines()), 1):
            if not row or not row[0].strip() or row[0].lstrip().startswith("#"):
                continue
            if len(row) < 2 or not row[1].strip():
                raise AuthConfigError(f"token file {path} line {lineno}: expected token,user[,uid[,\"groups\"]]")
            groups = tuple(g.strip() for g in (row[3] if len(row) > 3 else "").split(",") if g.strip())
            tokens[row[0].strip()] = Principal(row[1].strip(), row[2].strip() if len(row) > 2 else "", groups)
        if not tokens:
            raise AuthConfigError(f"token file {path} holds no tokens")
        return cls(tokens)

    async def authenticate(self, token: str) -> Principal | None:
        for known, who in self.tokens.items():  # constant-time compare: no timing oracle on tokens
            if hmac.compare_digest(known.encode(), token.encode()):
                return who
        return None

    async def authorize(self, who: Principal, access: Access) -> tuple[bool, str]:
        if access.verb in READ_VERBS or VIEWERS_GROUP not in who.groups:
            return True, ""
        return False, f"user {who.user!r} is in {VIEWERS_GROUP} and may only read"


class _TTLCache:
    def __init__(self, seconds: float, size: int = 4096) -> None:
        self.seconds, self.size = seconds, size
        self._data: dict[Any, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            hit = self._data.get(key)
            return hit[1] if hit and hit[0] > time.monotonic() else None

    def put(self, key: Any, value: Any) -> None:
        with self._lock:
            if len(self._data) >= self.size:
                self._data.clear()  # crude but bounded; entries are cheap to recompute
            self._data[key] = (time.monotonic() + self.seconds, value)


class Reviewer(Protocol):
    """What KubeAuth needs of the client (flywheel.kube.client.Kube; the unit tests pass a stub)."""

    async def request(self, method: str, path: str, body: Any = None) -> Any: ...


TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"


class KubeAuth:
    """TokenReview + SubjectAccessReview, POSTed through `kube` (the API server's own credentials)."""

    def __init__(self, kube: Reviewer, cache_seconds: float = 10.0) -> None:
        self._kube = kube
        self._who = _TTLCache(cache_seconds)
        self._decisions = _TTLCache(cache_seconds)

    async def authenticate(self, token: str) -> Principal | None:
        cached = self._who.get(token)
        if cached is not None:
            return cached or None  # False caches a rejected token
        review = await self._kube.request("POST", TOKEN_REVIEWS, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
        status = (review or {}).get("status") or {}
        who: Principal | None = None
        if status.get("authenticated"):
            user = status.get("user") or {}
            who = Principal(user.get("username") or "", user.get("uid") or "", tuple(user.get("groups") or ()))
        self._who.put(token, who or False)
        return who

    async def authorize(self, who: Principal, access: Access) -> tuple[bool, str]:
        key = (who, access)
        cached: tuple[bool, str] | None = self._decisions.get(key)
        if cached is not None:
            return cached
        attrs = {"group": GROUP, "resource": PLURAL, "verb": access.verb}
        attrs |= {k: v for k, v in (("namespace", access.namespace), ("name", access.name),
                                    ("subresource", access.subresource)) if v}
        review = await self._kube.request("POST", ACCESS_REVIEWS, {
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": who.user, "uid": who.uid, "groups": list(who.groups), "resourceAttributes": attrs}})
        status = (review or {}).get("status") or {}
        allowed = bool(status.get("allowed")) and not status.get("denied")
        resource = PLURAL + (f"/{access.subresource}" if access.subresource else "")
        where = f"namespace {access.namespace!r}" if access.namespace else "all namespaces"
        message = "" if allowed else (f"user {who.user!r} may not {access.verb} {resource}.{GROUP} in {where}"
                                      + (f": {status['reason']}" if status.get("reason") else ""))
        decision = (allowed, message)
        self._decisions.put(key, decision)
        return decision
