"""OpenAPI v3 documents, enough for kubectl: the root index, and one document per group-version whose paths
declare PATCH with `x-kubernetes-group-version-kind` and the `fieldValidation` parameter (so kubectl validates
server-side instead of downloading /openapi/v2), plus the schemas of custom resources for `kubectl explain`."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tests.k8s_emulator.resources import Registry, ResourceType

_PATCH_TYPES = ["application/json-patch+json", "application/merge-patch+json",
                "application/strategic-merge-patch+json", "application/apply-patch+yaml"]
_QUERY_PARAMS = ["fieldValidation", "fieldManager", "dryRun", "pretty"]


def _gv_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _schema_name(rt: ResourceType, version: str) -> str:
    reversed_group = ".".join(reversed(rt.group.split("."))) if rt.group else "io.k8s.api.core"
    return f"{reversed_group}.{version}.{rt.kind}"


def group_version_document(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    served = [rt for rt in registry.all() if rt.group == group and version in rt.versions]
    if not served:
        return None
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    parameters = [{"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
                  for name in _QUERY_PARAMS]
    for rt in served:
        gvk = {"group": group, "version": version, "kind": rt.kind}
        ref = {"$ref": f"#/components/schemas/{_schema_name(rt, version)}"}
        # Custom resources do not take strategic merge patches; kubectl reads that from here.
        patch_types = [t for t in _PATCH_TYPES if not (rt.custom and "strategic" in t)]
        prefix = f"/{_gv_path(group, version)}/" + ("namespaces/{namespace}/" if rt.namespaced else "")
        operation = {"x-kubernetes-group-version-kind": gvk, "parameters": parameters,
                     "responses": {"200": {"content": {"application/json": {"schema": ref}}}}}
        paths[f"{prefix}{rt.plural}/{{name}}"] = {
            "parameters": parameters,
            "get": {**operation, "operationId": f"read{rt.kind}", "x-kubernetes-action": "get"},
            "put": {**operation, "operationId": f"replace{rt.kind}", "x-kubernetes-action": "put"},
            "patch": {**operation, "operationId": f"patch{rt.kind}", "x-kubernetes-action": "patch",
                      "requestBody": {"content": {t: {"schema": {"type": "object"}} for t in patch_types}}},
            "delete": {**operation, "operationId": f"delete{rt.kind}", "x-kubernetes-action": "delete"},
        }
        paths[f"{prefix}{rt.plural}"] = {
            "parameters": parameters,
            "post": {**operation, "operationId": f"create{rt.kind}", "x-kubernetes-action": "post"},
        }
        if rt.custom:
            # Built-in types have no schema here on purpose: kubectl then falls back to its compiled-in types
            # for strategic merge, which knows more than a stub schema would.
            body = dict(rt.schemas.get(version) or {"type": "object"})
            body["x-kubernetes-group-version-kind"] = [gvk]
            schemas[_schema_name(rt, version)] = body
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0"}, "paths": paths,
            "components": {"schemas": schemas}}


def root_document(registry: Registry) -> dict[str, Any]:
    paths = {}
    gvs = {("", "v1")} | {(rt.group, v) for rt in registry.all() for v in rt.versions}
    for group, version in sorted(gvs):
        document = group_version_document(registry, group, version)
        digest = hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()[:32].upper()
        path = _gv_path(group, version)
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}
