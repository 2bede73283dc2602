"""Bearer-token authentication and authorization of API requests.

- `TokenFileAuth` (local use, or a cluster without TokenReview rights): a Kubernetes static token file,
  `token,user,uid[,"group1,group2"]` per line. Tokens in group `flywheel:viewers` may only read.
- `KubeAuth` (cluster): the token is checked with a TokenReview and every request with a SubjectAccessReview
  against the TrainingJob verbs (get/list on `trainingjobs`, patch on `trainingjobs` or `trainingjobs/scale`),
  so who may read or act is decided by the cluster's RBAC. Results are cached briefly so a busy dashboard does not
  cost two API calls per request.
"""

from __future__ import annotations

import csv
import hmac
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from flywheel.crd import GROUP, PLURAL

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
    def authenticate(self, token: str) -> Principal | None: ...
    def authorize(self, who: Principal, access: Access) -> tuple[bool, str]: ...


class AuthConfigError(ValueError):
    pass


@dataclass
class TokenFileAuth:
    tokens: dict[str, Principal] = field(default_factory=dict)
    blocking = False  # answers from memory: the app may call it on the event loop (KubeAuth goes to a thread)

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

    def authenticate(self, token: str) -> Principal | None:
        for known, who in self.tokens.items():  # constant-time compare: no timing oracle on tokens
            if hmac.compare_digest(known.encode(), token.encode()):
                return who
        return None

    def authorize(self, who: Principal, access: Access) -> tuple[bool, str]:
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


class KubeAuth:
    """TokenReview + SubjectAccessReview through the kubernetes client (`api_client` is a kubernetes.ApiClient,
    or any object with the two API objects passed in explicitly, as the unit tests do)."""

    def __init__(self, api_client: Any = None, *, authn: Any = None, authz: Any = None,
                 cache_seconds: float = 10.0) -> None:
        if authn is None or authz is None:
            from kubernetes import client

            authn = authn or client.AuthenticationV1Api(api_client)
            authz = authz or client.AuthorizationV1Api(api_client)
        self._authn, self._authz = authn, authz
        self._who = _TTLCache(cache_seconds)
        self._decisions = _TTLCache(cache_seconds)

    def authenticate(self, token: str) -> Principal | None:
        cached = self._who.get(token)
        if cached is not None:
            return cached or None  # False caches a rejected token
        review = self._authn.create_token_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
        status = _get(review, "status") or {}
        who: Principal | None = None
        if _get(status, "authenticated"):
            user = _get(status, "user") or {}
            who = Principal(_get(user, "username") or "", _get(user, "uid") or "",
                            tuple(_get(user, "groups") or ()))
        self._who.put(token, who or False)
        return who

    def authorize(self, who: Principal, access: Access) -> tuple[bool, str]:
        key = (who, access)
        cached: tuple[bool, str] | None = self._decisions.get(key)
        if cached is not None:
            return cached
        attrs = {"group": GROUP, "resource": PLURAL, "verb": access.verb}
        attrs |= {k: v for k, v in (("namespace", access.namespace), ("name", access.name),
                                    ("subresource", access.subresource)) if v}
        review = self._authz.create_subject_access_review(
            {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
             "spec": {"user": who.user, "uid": who.uid, "groups": list(who.groups), "resourceAttributes": attrs}})
        status = _get(review, "status") or {}
        allowed = bool(_get(status, "allowed")) and not _get(status, "denied")
        resource = PLURAL + (f"/{access.subresource}" if access.subresource else "")
        where = f"namespace {access.namespace!r}" if access.namespace else "all namespaces"
        message = "" if allowed else (f"user {who.user!r} may not {access.verb} {resource}.{GROUP} in {where}"
                                      + (f": {_get(status, 'reason')}" if _get(status, "reason") else ""))
        decision = (allowed, message)
        self._decisions.put(key, decision)
        return decision


def _get(obj: Any, name: str) -> Any:
    """Read a field from a client model object or from a plain dict."""
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)
