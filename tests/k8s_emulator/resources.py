"""Resource types the emulator serves: the built-in ones and those that CustomResourceDefinitions add.

A `ResourceType` carries everything the HTTP layer, the store and discovery need to know about one resource;
the `Registry` turns a CRD object into one and back out of discovery documents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ResourceKey = tuple[str, str]  # (group, plural): one storage bucket, whatever version is requested

ALL_VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
SUBRESOURCE_VERBS = ["get", "patch", "update"]


@dataclass
class ResourceType:
    group: str
    versions: list[str]
    plural: str
    singular: str
    kind: str
    namespaced: bool
    short_names: list[str] = field(default_factory=list)
    categories: list[str] = field(default_factory=list)
    status_subresource: bool = False
    scale: dict[str, str] | None = None  # specReplicasPath, statusReplicasPath, labelSelectorPath
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)  # version -> openAPIV3Schema
    custom: bool = False
    extra_subresources: list[str] = field(default_factory=list)  # e.g. pods/log

    @property
    def key(self) -> ResourceKey:
        return (self.group, self.plural)

    @property
    def group_kind(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    def discovery_entries(self) -> list[dict[str, Any]]:
        main = {"name": self.plural, "singularName": self.singular, "namespaced": self.namespaced,
                "kind": self.kind, "verbs": ALL_VERBS}
        if self.short_names:
            main["shortNames"] = self.short_names
        if self.categories:
            main["categories"] = self.categories
        entries = [main]
        if self.status_subresource:
            entries.append({"name": f"{self.plural}/status", "singularName": "", "namespaced": self.namespaced,
                            "kind": self.kind, "verbs": SUBRESOURCE_VERBS})
        if self.scale is not None:
            entries.append({"name": f"{self.plural}/scale", "singularName": "", "namespaced": self.namespaced,
                            "group": "autoscaling", "version": "v1", "kind": "Scale", "verbs": SUBRESOURCE_VERBS})
        for sub in self.extra_subresources:
            entries.append({"name": f"{self.plural}/{sub}", "singularName": "", "namespaced": self.namespaced,
                            "kind": self.kind, "verbs": ["get"], **SUBRESOURCE_KINDS.get(sub, {})})
        return entries


# Subresources whose kind is not their resource's: what discovery says of them (kubectl drain looks for
# pods/eviction with its group and version, else it deletes pods instead of evicting them).
SUBRESOURCE_KINDS: dict[str, dict[str, Any]] = {
    "eviction": {"group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]},
}


def _builtin(group: str, plural: str, kind: str, namespaced: bool, short: list[str] | None = None,
             status: bool = False, extra: list[str] | None = None, version: str = "v1") -> ResourceType:
    return ResourceType(group=group, versions=[version], plural=plural, singular=kind.lower(), kind=kind,
                        namespaced=namespaced, short_names=short or [], status_subresource=status,
                        extra_subresources=extra or [], categories=["all"] if plural in ("pods", "services") else [])


BUILTIN_TYPES: list[ResourceType] = [
    _builtin("", "namespaces", "Namespace", False, ["ns"], status=True),
    _builtin("", "pods", "Pod", True, ["po"], status=True, extra=["log", "eviction"]),
    _builtin("", "services", "Service", True, ["svc"], status=True),
    _builtin("", "events", "Event", True, ["ev"]),
    _builtin("", "configmaps", "ConfigMap", True, ["cm"]),
    _builtin("", "secrets", "Secret", True),
    _builtin("", "serviceaccounts", "ServiceAccount", True, ["sa"]),
    _builtin("", "nodes", "Node", False, ["no"], status=True),
    _builtin("coordination.k8s.io", "leases", "Lease", True),
    # Reconciled by the minimal deployment controller (deployments.py): pods directly, no ReplicaSets.
    ResourceType(group="apps", versions=["v1"], plural="deployments", singular="deployment", kind="Deployment",
                 namespaced=True, short_names=["deploy"], categories=["all"], status_subresource=True,
                 scale={"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}),
    # Status written by the disruption controller (disruption.py); evictions check them (eviction.py).
    _builtin("policy", "poddisruptionbudgets", "PodDisruptionBudget", True, ["pdb"], status=True),
    _builtin("apiextensions.k8s.io", "customresourcedefinitions", "CustomResourceDefinition", False,
             ["crd", "crds"], status=True),
    # What a pod's priorityClassName and runtimeClassName name, resolved at pod admission as the Priority and
    # RuntimeClass admission plugins do (pod_classes.py); nothing preempts, and every handler runs the same process.
    ResourceType(group="scheduling.k8s.io", versions=["v1"], plural="priorityclasses", singular="priorityclass",
                 kind="PriorityClass", namespaced=False, short_names=["pc"]),  # its columns: tables.py
    ResourceType(group="node.k8s.io", versions=["v1"], plural="runtimeclasses", singular="runtimeclass",
                 kind="RuntimeClass", namespaced=False, printer_columns=[
                     {"name": "Handler", "type": "string", "jsonPath": ".handler"},
                     {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]),
    # Stored only (no controllers), so that RBAC objects from a Helm chart can be applied.
    _builtin("rbac.authorization.k8s.io", "roles", "Role", True),
    _builtin("rbac.authorization.k8s.io", "rolebindings", "RoleBinding", True),
    _builtin("rbac.authorization.k8s.io", "clusterroles", "ClusterRole", False),
    _builtin("rbac.authorization.k8s.io", "clusterrolebindings", "ClusterRoleBinding", False),
]

CRD_KEY: ResourceKey = ("apiextensions.k8s.io", "customresourcedefinitions")


def resource_type_from_crd(crd: dict[str, Any]) -> ResourceType:
    """Build the served type of a CRD (all served versions share one storage bucket; no conversion)."""
    spec = crd["spec"]
    names = spec["names"]
    served = [v for v in spec.get("versions", []) if v.get("served", True)]
    first = served[0] if served else {}
    subresources = first.get("subresources") or {}
    return ResourceType(
        group=spec["group"],
        versions=[v["name"] for v in served],
        plural=names["plural"],
        singular=names.get("singular") or names["kind"].lower(),
        kind=names["kind"],
        namespaced=spec.get("scope", "Namespaced") == "Namespaced",
        short_names=list(names.get("shortNames") or []),
        categories=list(names.get("categories") or []),
        status_subresource="status" in subresources,
        scale=subresources.get("scale"),
        printer_columns=list(first.get("additionalPrinterColumns") or []),
        schemas={v["name"]: (v.get("schema") or {}).get("openAPIV3Schema") or {} for v in served},
        custom=True,
    )


class Registry:
    """The resource types currently served, looked up the ways URLs and discovery need."""

    def __init__(self) -> None:
        self._types: dict[ResourceKey, ResourceType] = {}
        for resource_type in BUILTIN_TYPES:
            self.add(resource_type)

    def add(self, resource_type: ResourceType) -> None:
        self._types[resource_type.key] = resource_type

    def remove(self, key: ResourceKey) -> None:
        self._types.pop(key, None)

    def get(self, key: ResourceKey) -> ResourceType | None:
        return self._types.get(key)

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        resource_type = self._types.get((group, plural))
        if resource_type is None or version not in resource_type.versions:
            return None
        return resource_type

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        for resource_type in self._types.values():
            if resource_type.group == group and resource_type.kind == kind and version in resource_type.versions:
                return resource_type
        return None

    def all(self) -> list[ResourceType]:
        return list(self._types.values())

    def group_versions(self) -> dict[str, list[str]]:
        """Non-core groups and their versions, in registration order (the first is preferred)."""
        groups: dict[str, list[str]] = {}
        for resource_type in self._types.values():
            if resource_type.group:
                versions = groups.setdefault(resource_type.group, [])
                versions.extend(v for v in resource_type.versions if v not in versions)
        return groups

    def resource_list(self, group: str, version: str) -> dict[str, Any] | None:
        served = [t for t in self._types.values() if t.group == group and version in t.versions]
        if not served and not (group == "" and version == "v1"):
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": [entry for t in served for entry in t.discovery_entries()],
        }

    def api_group(self, group: str) -> dict[str, Any] | None:
        versions = self.group_versions().get(group)
        if not versions:
            return None
        entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
        return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": entries,
                "preferredVersion": entries[0]}

    def api_group_list(self) -> dict[str, Any]:
        return {"kind": "APIGroupList", "apiVersion": "v1",
                "groups": [self.api_group(g) for g in self.group_versions()]}
