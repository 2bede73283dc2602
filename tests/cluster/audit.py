"""Who asked the API server for what: kube-apiserver's own audit log, read back as the authorizer sees each request
-- (verb, apiGroup, resource[/subresource], namespace) -- counted per user.

The control plane (controlplane.py) starts kube-apiserver with `POLICY`: every request at level Metadata (who, verb,
object reference, response code; no bodies), the RequestReceived stage omitted, the health probes not logged, written
by the log backend in blocking mode (each event is on disk before the API server goes on) to a JSON-lines file that is
never rotated. `AuditLog` tails that file. A request is counted once, at its first record: a watch has a
ResponseStarted record when its stream opens and a ResponseComplete one when it ends; any other request has only the
latter.

`mark()` and `since(mark)` give a window. Both first send a barrier (an admin GET of a ConfigMap that does not exist)
and wait for its record, so the window holds every request that was answered before the call. Non-resource requests
(discovery, /version, /openapi) are not counted: RBAC grants them to every authenticated user, so a Role never lists
them.

Identities: the log names the authenticated user (the impersonated one where a request impersonates).
`service_account()` makes a ServiceAccount and a bound token for it, so a client under test can have a user of its own
(`system:serviceaccount:<namespace>:<name>`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Attributes = tuple[str, str, str, str]  # verb, group, resource[/subresource], namespace ("" = cluster scope)
Request = Callable[..., Any]  # ControlPlane.request: (path, method="GET", body=None) -> the reply, None for 404

POLICY: dict[str, Any] = {
    "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
    "rules": [
        # The control plane's own readiness polls: many, and never a question of RBAC.
        {"level": "None", "nonResourceURLs": ["/healthz*", "/readyz*", "/livez*"]},
        {"level": "Metadata"}]}
BARRIER_NAMESPACE, BARRIER_PREFIX = "kube-system", "flywheel-audit-barrier-"


def apiserver_args(log_path: Path, policy_path: Path) -> list[str]:
    """kube-apiserver's flags for `POLICY` written to `policy_path` and the log at `log_path`."""
    policy_path.parent.mkdir(parents=True, exist_ok=True)
    policy_path.write_text(json.dumps(POLICY, indent=1))
    return [f"--audit-policy-file={policy_path}", f"--audit-log-path={log_path}", "--audit-log-format=json",
            "--audit-log-mode=blocking",  # on disk before the request goes on: a test reads it at once
            "--audit-log-maxsize=0"]  # never rotated: a mark is an offset into one file


@dataclass(frozen=True)
class Entry:
    user: str
    attributes: Attributes
    code: int  # the response's status (0 when the log has none: a stream cut by a restart)


def attributes_of(event: dict[str, Any]) -> Attributes | None:
    """The authorizer's view of one audit event, or None for a non-resource request."""
    ref = event.get("objectRef") or {}
    if "resource" not in ref:
        return None
    resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
    return event["verb"], ref.get("apiGroup", ""), resource, ref.get("namespace", "")


def user_of(event: dict[str, Any]) -> str:
    user = event.get("impersonatedUser") or event.get("user") or {}
    return str(user.get("username", ""))


def _is_barrier(event: dict[str, Any]) -> bool:
    return str((event.get("objectRef") or {}).get("name", "")).startswith(BARRIER_PREFIX)


@dataclass
class Recorded:
    """The requests of one window: `counts[(user, attributes)]`, and each user's set of request kinds."""

    entries: list[Entry]
    counts: Counter[tuple[str, Attributes]] = field(init=False)

    def __post_init__(self) -> None:
        self.counts = Counter((e.user, e.attributes) for e in self.entries)

    def of(self, user: str) -> set[Attributes]:
        return {a for (who, a) in self.counts if who == user}

    def counted(self, user: str) -> list[tuple[Attributes, int]]:
        """Each kind of request `user` made, with how many times, most first."""
        return sorted(((a, n) for (who, a), n in self.counts.items() if who == user), key=lambda kv: -kv[1])

    def refused(self, user: str) -> set[Attributes]:
        """The kinds of request of `user` the API server answered 403 (RBAC said no)."""
        return {e.attributes for e in self.entries if e.user == user and e.code == 403}

    def users(self) -> set[str]:
        return {e.user for e in self.entries}


class AuditLog:
    """The audit log at `path`, read incrementally (from one thread); `request` (ControlPlane.request) sends the
    barriers."""

    def __init__(self, path: Path, request: Request) -> None:
        self.path, self._request = path, request
        self._offset, self._partial = 0, b""
        self._entries: list[Entry] = []
        self._open: set[str] = set()  # audit IDs of streams whose ResponseStarted was counted
        self._barriers: set[str] = set()  # barrier names seen

    def mark(self, timeout: float = 30.0) -> int:
        """A position in the log: every request answered before this call lies before it."""
        self._barrier(timeout)
        return len(self._entries)

    def since(self, mark: int = 0, timeout: float = 30.0) -> Recorded:
        """The requests after `mark` (0: since the API server started), up to those answered before this call."""
        self._barrier(timeout)
        return Recorded(self._entries[mark:])

    def _barrier(self, timeout: float) -> None:
        name = f"{BARRIER_PREFIX}{uuid.uuid4().hex[:12]}"
        self._request(f"/api/v1/namespaces/{BARRIER_NAMESPACE}/configmaps/{name}")  # 404: only its record matters
        deadline = time.monotonic() + timeout
        while name not in self._barriers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the barrier request's record not in {self.path} after {timeout:g} s")
            if not self._read():
                time.sleep(0.01)

    def _read(self) -> bool:
        """Takes in the complete lines written since the last read; False when there were none."""
        try:
            with open(self.path, "rb") as log:
                log.seek(self._offset)
                chunk = log.read()
        except FileNotFoundError:
            return False
        self._offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        for line in lines:
            if line.strip():
                self._take(json.loads(line))
        return bool(lines)

    def _take(self, event: dict[str, Any]) -> None:
        audit_id, stage = event.get("auditID", ""), event.get("stage")
        if stage == "ResponseComplete" and audit_id in self._open:
            self._open.discard(audit_id)  # the end of a stream counted when it opened
            return
        if stage == "ResponseStarted":
            self._open.add(audit_id)
        if _is_barrier(event):
            self._barriers.add(event["objectRef"]["name"])
            return
        attributes = attributes_of(event)
        if attributes is not None:
            code = int((event.get("responseStatus") or {}).get("code", 0))
            self._entries.append(Entry(user_of(event), attributes, code))


@dataclass(frozen=True)
class Identity:
    user: str
    token: str


def service_account(request: Request, namespace: str, name: str, cluster_role: str | None = None,
                    seconds: int = 4 * 3600) -> Identity:
    """A ServiceAccount (made if missing; the namespace must exist) with a bound token from the TokenRequest API,
    bound to `cluster_role` cluster-wide when given: a user of its own in the audit log."""
    base = f"/api/v1/namespaces/{namespace}/serviceaccounts"
    if request(f"{base}/{name}") is None:
        request(base, "POST", {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    user = f"system:serviceaccount:{namespace}:{name}"
    if cluster_role is not None:
        binding = f"{namespace}-{name}-{cluster_role}".replace(":", "-")
        bindings = "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
        if request(f"{bindings}/{binding}") is None:
            request(bindings, "POST", {
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": binding},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
                "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]})
    reply = request(f"{base}/{name}/token", "POST", {"apiVersion": "authentication.k8s.io/v1",
                                                     "kind": "TokenRequest", "spec": {"expirationSeconds": seconds}})
    return Identity(user, reply["status"]["token"])


def describe(entries: Iterable[tuple[Attributes, int]]) -> str:
    return ", ".join(f"{n} x {verb} {group + '/' if group else ''}{resource}{' in ' + ns if ns else ''}"
                     for (verb, group, resource, ns), n in entries)
