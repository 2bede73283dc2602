"""What the API server does to an object before it is stored: built-in defaults and validation per type,
structural-schema admission of custom resources, and the CRD's own status."""

from __future__ import annotations

import base64
import itertools
import re
from typing import Any

from tests.k8s_emulator import deployments, pdb, schema
from tests.k8s_emulator.errors import StatusError
from tests.k8s_emulator.resources import CRD_KEY, ResourceType

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_cluster_ips = itertools.count(10)


def validate_name(resource_type: ResourceType, name: str) -> None:
    label_only = resource_type.key in {("", "namespaces"), ("", "services")}
    pattern = _DNS_LABEL if label_only else _DNS_SUBDOMAIN
    limit = 63 if label_only else 253
    if not pattern.match(name) or len(name) > limit:
        what = "RFC 1123 label" if label_only else "RFC 1123 subdomain"
        raise StatusError.invalid(resource_type.group_kind, name, [
            f'metadata.name: Invalid value: "{name}": a lowercase {what} must consist of lower case alphanumeric '
            "characters, '-' or '.', and must start and end with an alphanumeric character"])


def _pod_defaults(pod: dict[str, Any]) -> list[str]:
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("serviceAccountName", "default")
    spec.setdefault("enableServiceLinks", True)
    errors = []
    containers = spec.get("containers") or []
    if not containers:
        errors.append("spec.containers: Required value")
    for i, container in enumerate(containers):
        if not container.get("name"):
            errors.append(f"spec.containers[{i}].name: Required value")
        if not container.get("image"):
            errors.append(f"spec.containers[{i}].image: Required value")
        container.setdefault("imagePullPolicy", "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        for port in container.get("ports") or []:
            port.setdefault("protocol", "TCP")
    for container in [*containers, *(spec.get("initContainers") or [])]:
        for port in container.get("ports") or [] if spec.get("hostNetwork") else []:
            if not port.get("hostPort"):  # SetDefaults_Pod: with host networking, each port is a host port
                port["hostPort"] = port.get("containerPort")
    if spec.get("restartPolicy") not in ("Always", "OnFailure", "Never"):
        errors.append(f'spec.restartPolicy: Unsupported value: "{spec.get("restartPolicy")}": supported values: '
                      '"Always", "OnFailure", "Never"')
    pod["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    return errors


def _service_defaults(service: dict[str, Any]) -> list[str]:
    spec = service.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec.get("clusterIP") != "None":
        number = next(_cluster_ips)
        spec["clusterIP"] = spec.get("clusterIP") or f"10.96.{number // 250}.{number % 250 + 1}"
    spec["clusterIPs"] = [spec["clusterIP"]]
    for port in spec.get("ports") or []:
        port.setdefault("protocol", "TCP")
        port.setdefault("targetPort", port.get("port"))
    service.setdefault("status", {"loadBalancer": {}})
    return []


def _crd_admit(crd: dict[str, Any]) -> list[str]:
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    errors = []
    for field in ("group", "scope"):
        if not spec.get(field):
            errors.append(f"spec.{field}: Required value")
    if not names.get("plural") or not names.get("kind"):
        errors.append("spec.names: Required value: plural and kind")
    expected = f"{names.get('plural')}.{spec.get('group')}"
    if crd["metadata"]["name"] != expected:
        errors.append(f'metadata.name: Invalid value: "{crd["metadata"]["name"]}": must be spec.names.plural+"."+'
                      f"spec.group")
    versions = spec.get("versions") or []
    if not versions:
        errors.append("spec.versions: Invalid value: must have exactly one version marked as storage version")
    for i, version in enumerate(versions):
        root = (version.get("schema") or {}).get("openAPIV3Schema")
        if root is None:
            errors.append(f"spec.versions[{i}].schema.openAPIV3Schema: Required value: schemas are required")
    accepted = {**names, "singular": names.get("singular") or str(names.get("kind", "")).lower()}
    accepted.setdefault("listKind", f"{names.get('kind')}List")
    crd["status"] = {
        "acceptedNames": accepted,
        "storedVersions": [v["name"] for v in versions if v.get("storage")],
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found"},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted"},
        ],
    }
    return errors


def admit_create(resource_type: ResourceType, obj: dict[str, Any], strict: bool) -> dict[str, Any]:
    errors: list[str] = []
    if resource_type.key == ("", "pods"):
        errors = _pod_defaults(obj)
    elif resource_type.key == ("", "services"):
        errors = _service_defaults(obj)
    elif resource_type.key == ("", "namespaces"):
        obj["status"] = {"phase": "Active"}
    elif resource_type.key == ("", "secrets"):
        obj["type"] = obj.get("type") or "Opaque"
    elif resource_type.key == CRD_KEY:
        errors = _crd_admit(obj)
    elif resource_type.key == deployments.DEPLOYMENTS:
        errors = deployments.admit(obj, None)
    elif resource_type.key == pdb.PDBS:
        errors = pdb.admit(obj, None)
    elif resource_type.custom and resource_type.status_subresource:
        obj.pop("status", None)  # status of a CR with a status subresource is only written through /status
    if errors:
        raise StatusError.invalid(resource_type.group_kind, obj["metadata"]["name"], errors)
    return admit_custom(resource_type, obj, None, strict)


def _fold_string_data(secret: dict[str, Any]) -> None:
    """A Secret's `stringData` is write-only: the API server stores it in `data` (base64; its keys win) and drops it."""
    string_data = secret.pop("stringData", None) or {}
    if string_data:
        secret["data"] = {**(secret.get("data") or {}),
                          **{k: base64.b64encode(str(v).encode()).decode() for k, v in string_data.items()}}


_ADMIT_ON_UPDATE = {CRD_KEY: lambda obj, old: _crd_admit(obj), deployments.DEPLOYMENTS: deployments.admit,
                    pdb.PDBS: pdb.admit}


def admit_custom(resource_type: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None,
                 strict: bool) -> dict[str, Any]:
    if resource_type.key == ("", "secrets"):
        _fold_string_data(obj)
    if resource_type.key in _ADMIT_ON_UPDATE and old is not None:
        errors = _ADMIT_ON_UPDATE[resource_type.key](obj, old)
        if errors:
            raise StatusError.invalid(resource_type.group_kind, obj["metadata"]["name"], errors)
    if not resource_type.custom:
        return obj
    version = obj.get("apiVersion", "").rpartition("/")[2]
    root = resource_type.schemas.get(version) or next(iter(resource_type.schemas.values()), {})
    obj, dropped, errors = schema.admit(obj, root, old)
    if strict and dropped:
        raise StatusError.bad_request("strict decoding error: " + ", ".join(f'unknown field "{p}"' for p in dropped))
    if errors:
        raise StatusError.invalid(resource_type.group_kind, obj["metadata"]["name"], errors)
    return obj
