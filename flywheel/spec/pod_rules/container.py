"""The Pod API's rules on one container of the pod template (its name, image, ports, env, mounts, resources,
probes, security context), as field rules (flywheel/spec/field_rules.py) for `containers[]` and `initContainers[]`
alike; the pod-level rules, and the spec's own fields, are flywheel/spec/pod_rules/rules.py's. Each mirrors what the API
server refuses in a pod (k8s.io/kubernetes pkg/apis/core/validation), in our words. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flywheel.spec.field_rules import Bound, Check, Enum, IntOrText, Keys, Range, Rule, Text, UniqueBy, one_of
from flywheel.spec.k8s_syntax import (
    CONFIG_KEY,
    CONTAINER_RESOURCE,
    DNS_LABEL,
    ENV_NAME,
    FIELD_PATH,
    IMAGE,
    MOUNT_PATH,
    PORT_NAME,
    QUANTITY,
    RESOURCE_FIELD,
    SUB_PATH,
    cel_overcommits,
    overcommits,
)

MAX_PORTS, MAX_ENV, MAX_ENV_FROM, MAX_MOUNTS, MAX_RESOURCES = 32, 128, 32, 64, 16
MAX_ID = 2**31 - 1  # user and group ids are int32s on Linux
PROBE_HANDLERS = ("exec", "httpGet", "tcpSocket", "grpc")
LIFECYCLE_HANDLERS = ("exec", "httpGet", "tcpSocket", "sleep")
ENV_SOURCES = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef", "fileKeyRef")
ENV_FROM_SOURCES = ("configMapRef", "secretRef")
PROFILE_TYPES = ("RuntimeDefault", "Unconfined", "Localhost")


def mapping(value: Any, key: str) -> dict[str, Any]:
    item = value.get(key) if isinstance(value, dict) else None
    return item if isinstance(item, dict) else {}


def items(value: Any, key: str) -> list[dict[str, Any]]:
    found = value.get(key) if isinstance(value, dict) else None
    return [i for i in found if isinstance(i, dict)] if isinstance(found, list) else []


def has(value: Any, key: str) -> bool:
    return isinstance(value, dict) and value.get(key) is not None


def set_count(value: Any, keys: tuple[str, ...]) -> int:
    return sum(has(value, k) for k in keys)


def unique(values: list[Any]) -> bool:
    return len(values) == len(set(values))


def profile_rules(path: str, kind: str = "seccomp") -> list[Rule]:
    """A seccomp or AppArmor profile: a known type, with localhostProfile exactly when the type is Localhost."""
    return [
        Enum(f"{path}.type", f"must be one of {', '.join(PROFILE_TYPES)}", values=PROFILE_TYPES),
        Check(path, f"a {kind} localhostProfile goes with type Localhost, and only with it; set both or neither",
              sub_field="localhostProfile",
              cel="has(self.localhostProfile) == (has(self.type) && self.type == 'Localhost')",
              ok=lambda p: has(p, "localhostProfile") == (p.get("type") == "Localhost")),
    ]


def resource_rules(path: str) -> list[Rule]:
    """The rules of a container's `resources` on names and syntax, which CEL can afford under a list of
    containers: resource names, quantities, and huge pages only with cpu or memory (limit_rule and
    pod_rules.amount_rules relate requests to limits)."""
    out: list[Rule] = []
    for kind in ("requests", "limits"):
        out += [Bound(f"{path}.{kind}", f"must name at most {MAX_RESOURCES} resources", most=MAX_RESOURCES,
                      keyword="maxProperties"),
                Keys(f"{path}.{kind}", f"resource names {CONTAINER_RESOURCE.message}", syntax=CONTAINER_RESOURCE),
                IntOrText(f"{path}.{kind}.{{}}", QUANTITY.message, syntax=QUANTITY)]
    hugepages = "(has(self.{0}) && self.{0}.exists(k, k.startsWith('hugepages-')))"
    cpu_or_memory = "(has(self.{0}) && ('cpu' in self.{0} || 'memory' in self.{0}))"
    out.append(Check(path, "huge pages need a cpu or memory request or limit beside them; add one",
                     cel=f"!({hugepages.format('requests')} || {hugepages.format('limits')}) || "
                         f"{cpu_or_memory.format('requests')} || {cpu_or_memory.format('limits')}",
                     ok=_hugepages_with_cpu_or_memory))
    return out


@dataclass(frozen=True)
class ResourcesAt:
    """Where a rule on a resources mapping sits: on the mapping itself (a container's), or on the spec, reading
    spec.resources, whose accelerator resource the operator requests and limits itself (spec/pod.py checks its
    amounts against procsPerReplica)."""

    path: str
    on_spec: bool = False

    @property
    def cel(self) -> str:
        return "self.resources" if self.on_spec else "self"

    def cel_guard(self, rule: str) -> str:
        """`rule`, true where the spec has no resources (the API server defaults them to {})."""
        return f"!has(self.resources) || ({rule})" if self.on_spec else rule

    def cel_exempt(self, var: str) -> str:
        return f"(has(self.accelerator) && {var} == self.accelerator.resource) || " if self.on_spec else ""

    def kind_path(self, kind: str) -> str:
        """The path of the requests or limits mapping."""
        return f"resources.{kind}" if self.on_spec else f"{self.path}.{kind}"

    def of(self, node: Any) -> tuple[dict[str, Any], str | None]:
        """(the resources mapping, the exempt resource name) of the rule's node."""
        if not self.on_spec:
            return (node if isinstance(node, dict) else {}), None
        return mapping(node, "resources"), mapping(node, "accelerator").get("resource")


def limit_rule(at: ResourcesAt) -> Check:
    """A limit beside every request that may not overcommit (extended resources, huge pages)."""
    res = at.cel

    def ok(node: Any) -> bool:
        resources, exempt = at.of(node)
        limits = mapping(resources, "limits")
        return all(overcommits(str(k)) or k in limits or k == exempt for k in mapping(resources, "requests"))

    return Check(at.path, "an extended resource or huge pages request needs a limit, equal to it; set limits too",
                 sub_field="resources.limits" if at.on_spec else "limits", ok=ok,
                 cel=at.cel_guard(f"!has({res}.requests) || {res}.requests.all(k, {at.cel_exempt('k')}"
                                  f"{cel_overcommits('k')} || (has({res}.limits) && k in {res}.limits))"))


def _hugepages_with_cpu_or_memory(res: Any) -> bool:
    names = {str(k) for kind in ("requests", "limits") for k in mapping(res, kind)}
    return not any(n.startswith("hugepages-") for n in names) or bool(names & {"cpu", "memory"})


def _port_rules(path: str) -> list[Rule]:
    ports = f"{path}.ports"
    return [
        Bound(ports, f"must list at most {MAX_PORTS} ports", most=MAX_PORTS),
        Range(f"{ports}[].containerPort", "must be a port number from 1 to 65535", low=1, high=65535),
        Range(f"{ports}[].hostPort", "must be a port number from 1 to 65535 (0: none)", low=0, high=65535),
        Enum(f"{ports}[].protocol", "must be TCP, UDP or SCTP", values=("", "TCP", "UDP", "SCTP")),
        Text(f"{ports}[].name", PORT_NAME.message, syntax=PORT_NAME),
        Check(ports, "port names must be unique within a container; rename one",
              cel="self.all(p, !has(p.name) || p.name == '' || self.exists_one(q, has(q.name) && q.name == p.name))",
              ok=lambda ps: unique([p["name"] for p in ps if isinstance(p, dict) and p.get("name")])),
    ]


def _env_rules(path: str) -> list[Rule]:
    env, env_from = f"{path}.env", f"{path}.envFrom"
    return [
        Bound(env, f"must list at most {MAX_ENV} variables", most=MAX_ENV),
        Text(f"{env}[].name", ENV_NAME.message, syntax=ENV_NAME, required=True),
        Check(f"{env}[]", "value and valueFrom exclude each other; keep one", sub_field="valueFrom",
              cel="!has(self.valueFrom) || !has(self.value) || size(self.value) == 0",
              ok=lambda e: not has(e, "valueFrom") or not e.get("value")),
        Check(f"{env}[].valueFrom", f"must set exactly one of {', '.join(ENV_SOURCES)}",
              cel=f"{one_of(ENV_SOURCES)} == 1", ok=lambda v: set_count(v, ENV_SOURCES) == 1),
        Text(f"{env}[].valueFrom.fieldRef.fieldPath", FIELD_PATH.message, syntax=FIELD_PATH, required=True),
        Text(f"{env}[].valueFrom.resourceFieldRef.resource", RESOURCE_FIELD.message, syntax=RESOURCE_FIELD,
             required=True),
        Text(f"{env}[].valueFrom.configMapKeyRef.key", CONFIG_KEY.message, syntax=CONFIG_KEY, required=True),
        Text(f"{env}[].valueFrom.secretKeyRef.key", CONFIG_KEY.message, syntax=CONFIG_KEY, required=True),
        Bound(env_from, f"must list at most {MAX_ENV_FROM} sources", most=MAX_ENV_FROM),
        Text(f"{env_from}[].prefix", ENV_NAME.message, syntax=ENV_NAME),
        Check(f"{env_from}[]", "must set exactly one of configMapRef and secretRef",
              cel=f"{one_of(ENV_FROM_SOURCES)} == 1", ok=lambda v: set_count(v, ENV_FROM_SOURCES) == 1),
    ]


def _mount_rules(path: str) -> list[Rule]:
    mounts = f"{path}.volumeMounts"
    bidirectional = "has(m.mountPropagation) && m.mountPropagation == 'Bidirectional'"
    privileged = "has(self.securityContext) && has(self.securityContext.privileged) && self.securityContext.privileged"
    return [
        Bound(mounts, f"must list at most {MAX_MOUNTS} mounts", most=MAX_MOUNTS),
        Text(f"{mounts}[].mountPath", MOUNT_PATH.message, syntax=MOUNT_PATH, required=True),
        Text(f"{mounts}[].subPath", SUB_PATH.message, syntax=SUB_PATH),
        Enum(f"{mounts}[].mountPropagation", "must be None, HostToContainer or Bidirectional",
             values=("None", "HostToContainer", "Bidirectional")),
        Enum(f"{mounts}[].recursiveReadOnly", "must be Disabled, IfPossible or Enabled",
             values=("Disabled", "IfPossible", "Enabled")),
        Check(f"{mounts}[]", "recursiveReadOnly goes with readOnly: true; set readOnly: true or remove it",
              sub_field="recursiveReadOnly",
              cel="!has(self.recursiveReadOnly) || self.recursiveReadOnly == 'Disabled' || "
                  "(has(self.readOnly) && self.readOnly)",
              ok=lambda m: m.get("recursiveReadOnly") in (None, "Disabled") or m.get("readOnly") is True),
        UniqueBy(mounts, "mount paths must be unique within a container; mount each volume elsewhere",
                 keys=("mountPath",)),
        Check(path, "Bidirectional mount propagation needs a privileged container "
                    "(securityContext.privileged: true); use HostToContainer", sub_field="volumeMounts",
              cel=f"!has(self.volumeMounts) || !self.volumeMounts.exists(m, {bidirectional}) || ({privileged})",
              ok=lambda c: not any(m.get("mountPropagation") == "Bidirectional" for m in items(c, "volumeMounts"))
              or mapping(c, "securityContext").get("privileged") is True),
    ]


def _probe_rules(path: str) -> list[Rule]:
    out: list[Rule] = []
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        where = f"{path}.{probe}"
        out += [
            Check(where, f"must set exactly one handler: {', '.join(PROBE_HANDLERS)}",
                  cel=f"{one_of(PROBE_HANDLERS)} == 1", ok=lambda p: set_count(p, PROBE_HANDLERS) == 1),
            IntOrText(f"{where}.httpGet.port", f"must be a port number from 1 to 65535 or a port name that "
                      f"{PORT_NAME.message.removeprefix('must be ')}", syntax=PORT_NAME, low=1, high=65535),
            IntOrText(f"{where}.tcpSocket.port", f"must be a port number from 1 to 65535 or a port name that "
                      f"{PORT_NAME.message.removeprefix('must be ')}", syntax=PORT_NAME, low=1, high=65535),
            Range(f"{where}.grpc.port", "must be a port number from 1 to 65535", low=1, high=65535),
            *(Range(f"{where}.{f}", "must not be negative", low=0)
              for f in ("initialDelaySeconds", "timeoutSeconds", "periodSeconds", "failureThreshold")),
            Range(f"{where}.terminationGracePeriodSeconds", "must be at least 1", low=1),
            Range(f"{where}.successThreshold", "must be 1 for liveness and startup probes"
                  if probe != "readinessProbe" else "must not be negative",
                  low=0, high=1 if probe != "readinessProbe" else None),
        ]
    for hook in ("postStart", "preStop"):
        out.append(Range(f"{path}.lifecycle.{hook}.sleep.seconds", "must not be negative", low=0))
        out.append(Check(f"{path}.lifecycle.{hook}", f"must set exactly one handler: {', '.join(LIFECYCLE_HANDLERS)}",
                         cel=f"{one_of(LIFECYCLE_HANDLERS)} == 1", ok=lambda h: set_count(h, LIFECYCLE_HANDLERS) == 1))
    return out


def container_rules(path: str, init: bool) -> list[Rule]:
    """Every rule of one container at `path` (a `containers[]` or `initContainers[]` item)."""
    restart: Rule = (
        Enum(f"{path}.restartPolicy", "must be Always (a sidecar), OnFailure or Never",
             values=("Always", "OnFailure", "Never")) if init else
        Check(path, "a container's own restartPolicy is not for worker pods (the operator decides restarts); remove "
                    "it, and run helpers as initContainers with restartPolicy: Always", sub_field="restartPolicy",
              cel="!has(self.restartPolicy)", ok=lambda c: not has(c, "restartPolicy")))
    return [
        Text(f"{path}.name", DNS_LABEL.message, syntax=DNS_LABEL, required=True),
        Text(f"{path}.image", IMAGE.message, syntax=IMAGE),
        Enum(f"{path}.imagePullPolicy", "must be Always, IfNotPresent or Never",
             values=("", "Always", "IfNotPresent", "Never")),
        Enum(f"{path}.terminationMessagePolicy", "must be File or FallbackToLogsOnError",
             values=("", "File", "FallbackToLogsOnError")),
        restart,
        *_port_rules(path), *_env_rules(path), *_mount_rules(path), *resource_rules(f"{path}.resources"),
        limit_rule(ResourcesAt(f"{path}.resources")),
        *_probe_rules(path),
        Range(f"{path}.securityContext.runAsUser", "must be a user id from 0 to 2147483647", low=0, high=MAX_ID),
        Range(f"{path}.securityContext.runAsGroup", "must be a group id from 0 to 2147483647", low=0, high=MAX_ID),
        *profile_rules(f"{path}.securityContext.seccompProfile"),
        *profile_rules(f"{path}.securityContext.appArmorProfile", "AppArmor"),
        Enum(f"{path}.securityContext.procMount", "must be Default or Unmasked", values=("Default", "Unmasked")),
        Check(f"{path}.securityContext", "a privileged container escalates privileges; remove "
                                         "allowPrivilegeEscalation: false or privileged: true",
              sub_field="allowPrivilegeEscalation",
              cel="!(has(self.privileged) && self.privileged && has(self.allowPrivilegeEscalation) && "
                  "!self.allowPrivilegeEscalation)",
              ok=lambda c: not (c.get("privileged") is True and c.get("allowPrivilegeEscalation") is False)),
        Bound(f"{path}.resizePolicy", "must list at most 2 policies (cpu, memory)", most=2),
        Enum(f"{path}.resizePolicy[].resourceName", "must be cpu or memory", values=("cpu", "memory")),
        Enum(f"{path}.resizePolicy[].restartPolicy", "must be NotRequired: the operator's pods never restart a "
             "container (restartPolicy Never)", values=("NotRequired",)),
    ]
