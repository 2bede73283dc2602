"""A small RBAC evaluator over rendered chart objects, for comparing a ServiceAccount's grants with the requests its
code made (the API server's audit log shows them as (verb, group, resource[/subresource], namespace):
tests/cluster/audit.py).

- `missing`: recorded requests no grant allows (the code would get 403 on a cluster).
- `excess`: grants no recorded request needs, i.e. each request it allows is also allowed by another grant. That
  catches a verb or resource nobody uses, a rule granted twice, and a cluster-wide grant where a Role suffices.

Grants are expanded per (scope, group, resource, verb): scope is a namespace for a RoleBinding and "*" for a
ClusterRoleBinding. No wildcards, resourceNames or nonResourceURLs are accepted (the chart uses none).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

Request = tuple[str, str, str, str]  # verb, group, resource[/subresource], namespace ("" = cluster scope)
ALL = "*"


@dataclass(frozen=True)
class Grant:
    scope: str  # a namespace, or ALL (ClusterRoleBinding)
    group: str
    resource: str
    verb: str
    source: str  # "Role ns/name" or "ClusterRole name", for messages

    def allows(self, request: Request) -> bool:
        verb, group, resource, namespace = request
        in_scope = self.scope == ALL or (namespace != "" and namespace == self.scope)
        return in_scope and (self.group, self.resource, self.verb) == (group, resource, verb)


def rules_of(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs of one Role/ClusterRole; each pair may appear in one rule only."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role.get("rules") or []:
        assert set(rule) <= {"apiGroups", "resources", "verbs"}, rule  # no resourceNames/nonResourceURLs surprises
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"], rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert (group, resource) not in out, f"{group}/{resource} appears twice in {role['metadata']['name']}"
                out[(group, resource)] = set(rule["verbs"])
    return out


def grants_for(docs: list[dict[str, Any]], account: str, namespace: str) -> list[Grant]:
    """Every grant the rendered bindings give ServiceAccount `namespace/account`."""
    roles = {("Role", d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs if d["kind"] == "Role"}
    roles |= {("ClusterRole", None, d["metadata"]["name"]): d for d in docs if d["kind"] == "ClusterRole"}
    out: list[Grant] = []
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
        if subject not in binding.get("subjects") or []:
            continue
        ref = binding["roleRef"]
        scope = binding["metadata"]["namespace"] if binding["kind"] == "RoleBinding" else ALL
        key = (ref["kind"], scope if ref["kind"] == "Role" else None, ref["name"])
        assert key in roles, f"{binding['kind']} {binding['metadata']['name']} refers to a missing {key}"
        where = f"{ref['kind']} {scope + '/' if ref['kind'] == 'Role' else ''}{ref['name']}"
        for (group, resource), verbs in rules_of(roles[key]).items():
            out.extend(Grant(scope, group, resource, verb, where) for verb in sorted(verbs))
    return out


def missing(grants: Iterable[Grant], requests: Iterable[Request]) -> list[Request]:
    grants = list(grants)
    return sorted(r for r in set(requests) if not any(g.allows(r) for g in grants))


def excess(grants: Iterable[Grant], requests: Iterable[Request]) -> list[Grant]:
    grants, requests = list(grants), set(requests)
    out = []
    for grant in grants:
        others = [g for g in grants if g is not grant]
        if not any(grant.allows(r) and not any(g.allows(r) for g in others) for r in requests):
            out.append(grant)
    return out


def describe(requests: Iterable[Request]) -> str:
    return "; ".join(f"{verb} {group + '/' if group else ''}{resource}"
                     f"{' in ' + ns if ns else ' (cluster scope)'}" for verb, group, resource, ns in requests)
