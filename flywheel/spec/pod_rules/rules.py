"""The Pod API's rules on everything a TrainingJob copies into its worker pods, defined once as field rules
(flywheel/spec/field_rules.py): the job's name (pod names, hostnames, the Service, label values), `image`, `resources`,
`accelerator.resource`, `scheduling.*` and the pod template (`spec.template`: its metadata, what relates its
containers to each other and to the operator's, and, in flywheel/spec/pod_rules/pod.py and spec/pod_rules/container.py,
its pod fields and every container). `flywheel run/plan` and the operator check them in Python
(spec/job.py), the API server at `kubectl apply` as the CRD's schema and CEL rules (spec/crd/generate.py attaches them),
so a job the Pod API would refuse in every pod is refused before it is stored, naming the field and the fix. Pure.

Each rule mirrors what the API server refuses in a pod (k8s.io/kubernetes pkg/apis/core/validation and the
admission plugins that run by default), sometimes a little more strictly where the exact rule is not worth its CEL
cost (a whole-number extended resource must be written as one; an image has no whitespace anywhere). The rules
that compare amounts (a request within its limit) are CEL rules on `spec.resources` only: under the list of
containers CEL would price every quantity as a whole request long; Python checks them everywhere, the worker's
merged resources included (`merged_resource_problems`).
"""

from __future__ import annotations

from typing import Any

from flywheel.spec.field_rules import Bound, Check, Rule, Text, UniqueBy, cel_in, nodes, problems
from flywheel.spec.k8s_syntax import (
    ANNOTATION_KEY,
    DNS1035_LABEL_PATTERN,
    DNS_SUBDOMAIN,
    EXTENDED_RESOURCE,
    IMAGE,
    LOCAL_QUEUE,
    QUALIFIED_NAME,
    WHOLE_QUANTITY,
    Syntax,
    cel_is_extended,
    cel_overcommits,
    is_extended,
    overcommits,
    quantity_value,
)
from flywheel.spec.object_names import MAX_NAME_LENGTH
from flywheel.spec.pod_rules.container import (
    ResourcesAt,
    container_rules,
    has,
    items,
    limit_rule,
    mapping,
    resource_rules,
)
from flywheel.spec.pod_rules.pod import (
    POD,
    label_rules,
    pod_field_rules,
    scheduling_rules,
    toleration_rules,
    volume_rules,
)
from flywheel.spec.pod_template import METRICS_PORT, OPERATOR_VOLUMES, WORKER_CONTAINER, worker_index

JOB_NAME = Syntax((DNS1035_LABEL_PATTERN,), MAX_NAME_LENGTH,
                  f"must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters: lowercase letters, digits and "
                  "'-', starting with a letter and ending with a letter or digit (the worker pods, their hostnames "
                  "and the Service are named after it: <name>-worker-<index>, <name>-workers); rename the job")
MAX_CONTAINERS = 16
_POD = POD
_KINDS = ("containers", "initContainers")


def _cel_worker(var: str) -> str:
    """CEL: whether container `var` of the pod spec (`self`) is the worker: named worker, else the first."""
    return (f"({var}.name == '{WORKER_CONTAINER}' || (!self.containers.exists(d, d.name == '{WORKER_CONTAINER}') "
            f"&& {var}.name == self.containers[0].name))")


def _init_names_taken(pod: Any) -> list[str]:
    taken = {WORKER_CONTAINER, *(c.get("name") for c in items(pod, "containers"))}
    return [f".initContainers[{i}].name" for i, c in enumerate(items(pod, "initContainers")) if c.get("name") in taken]


def _missing_images(pod: Any, kind: str) -> list[str]:
    containers = items(pod, kind)
    worker = worker_index(containers) if kind == "containers" else None
    return [f".{kind}[{i}].image" for i, c in enumerate(containers) if not c.get("image") and i != worker]


def _worker_metrics_ports(pod: Any) -> list[str]:
    containers = items(pod, "containers")
    index = worker_index(containers)
    if index is None:
        return []
    return [f".containers[{index}].ports[{i}].name" for i, p in enumerate(items(containers[index], "ports"))
            if p.get("name") == METRICS_PORT]


def _unknown_mounts(pod: Any) -> list[str]:
    volumes = {v.get("name") for v in items(pod, "volumes")} | set(OPERATOR_VOLUMES)
    return [f".{kind}[{i}].volumeMounts[{j}].name" for kind in _KINDS for i, c in enumerate(items(pod, kind))
            for j, m in enumerate(items(c, "volumeMounts")) if m.get("name") not in volumes]


def _privileged_worker_escalates(pod: Any) -> bool:
    containers = items(pod, "containers")
    index = worker_index(containers)
    context = mapping(containers[index], "securityContext") if index is not None else {}
    return context.get("privileged") is not True or context.get("allowPrivilegeEscalation") is True


def _host_ports_differ(pod: Any) -> list[str]:
    if pod.get("hostNetwork") is not True:
        return []
    return [f".{kind}[{i}].ports[{j}].hostPort" for kind in _KINDS for i, c in enumerate(items(pod, kind))
            for j, p in enumerate(items(c, "ports")) if p.get("hostPort") not in (None, 0, p.get("containerPort"))]


def _pod_checks() -> list[Rule]:
    has_image = "(has(c.image) && size(c.image) > 0)"
    no_metrics = "(!has({0}.ports) || !{0}.ports.exists(p, has(p.name) && p.name == '" + METRICS_PORT + "'))"
    mounted = (f"({cel_in('m.name', OPERATOR_VOLUMES)} || "
               "(has(self.volumes) && self.volumes.exists(v, v.name == m.name)))")
    same_port = "(!has(p.hostPort) || p.hostPort == 0 || p.hostPort == p.containerPort)"
    return [
        Check(_POD, f"an init container may not share a container's name, nor be named {WORKER_CONTAINER} (the "
                    "operator's); rename it", sub_field="initContainers",
              cel=f"!has(self.initContainers) || self.initContainers.all(c, c.name != '{WORKER_CONTAINER}' && "
                  "(!has(self.containers) || !self.containers.exists(d, d.name == c.name)))",
              ok=lambda pod: not _init_names_taken(pod), find=_init_names_taken),
        Check(_POD, "every container but the worker needs an image; set image", sub_field="containers",
              cel=f"!has(self.containers) || self.containers.all(c, {has_image} || {_cel_worker('c')})",
              ok=lambda pod: not _missing_images(pod, "containers"),
              find=lambda pod: _missing_images(pod, "containers")),
        Check(_POD, "every init container needs an image; set image", sub_field="initContainers",
              cel=f"!has(self.initContainers) || self.initContainers.all(c, {has_image})",
              ok=lambda pod: not _missing_images(pod, "initContainers"),
              find=lambda pod: _missing_images(pod, "initContainers")),
        Check(_POD, f"the operator gives the worker container a port named {METRICS_PORT}; rename yours",
              sub_field="containers",
              cel="!has(self.containers) || size(self.containers) == 0 || (self.containers.exists(c, c.name == "
                  f"'{WORKER_CONTAINER}') ? self.containers.all(c, c.name != '{WORKER_CONTAINER}' || "
                  f"{no_metrics.format('c')}) : {no_metrics.format('self.containers[0]')})",
              ok=lambda pod: not _worker_metrics_ports(pod), find=_worker_metrics_ports),
        Check(_POD, f"every volumeMounts[].name must name a volume of template.spec.volumes (or one of the operator's: "
                    f"{', '.join(OPERATOR_VOLUMES)}); add the volume or fix the name", sub_field="volumes",
              cel=" && ".join(f"(!has(self.{k}) || self.{k}.all(c, !has(c.volumeMounts) || "
                              f"c.volumeMounts.all(m, {mounted})))" for k in _KINDS),
              ok=lambda pod: not _unknown_mounts(pod), find=_unknown_mounts),
        Check(_POD, "with hostNetwork, a container's hostPort must equal its containerPort; drop hostPort or set it "
                    "to containerPort", sub_field="hostNetwork",
              cel="!has(self.hostNetwork) || !self.hostNetwork || (" + " && ".join(
                  f"(!has(self.{k}) || self.{k}.all(c, !has(c.ports) || c.ports.all(p, {same_port})))"
                  for k in _KINDS) + ")",
              ok=lambda pod: not _host_ports_differ(pod), find=_host_ports_differ),
        Check(_POD, "the operator's security profiles set allowPrivilegeEscalation: false on the worker; a "
                    "privileged worker needs allowPrivilegeEscalation: true beside privileged: true",
              sub_field="containers",
              cel="!has(self.containers) || self.containers.all(c, !" + _cel_worker("c") + " || "
                  "!has(c.securityContext) || !has(c.securityContext.privileged) || !c.securityContext.privileged || "
                  "(has(c.securityContext.allowPrivilegeEscalation) && c.securityContext.allowPrivilegeEscalation))",
              ok=_privileged_worker_escalates),
        Check(_POD, "the Priority admission plugin sets it from the priority class; remove it and set "
                    "spec.scheduling.priorityClassName", sub_field="priority",
              cel="!has(self.priority)", ok=lambda pod: not has(pod, "priority")),
        Check(_POD, "the RuntimeClass admission plugin sets it from the runtime class; remove it", sub_field="overhead",
              cel="!has(self.overhead)", ok=lambda pod: not has(pod, "overhead")),
        Check(_POD, "dnsPolicy None needs dnsConfig.nameservers; add them or choose another dnsPolicy",
              sub_field="dnsConfig",
              cel="!has(self.dnsPolicy) || self.dnsPolicy != 'None' || (has(self.dnsConfig) && "
                  "has(self.dnsConfig.nameservers) && size(self.dnsConfig.nameservers) > 0)",
              ok=lambda pod: pod.get("dnsPolicy") != "None" or bool(mapping(pod, "dnsConfig").get("nameservers"))),
    ]


def amount_rules(at: ResourcesAt) -> list[Rule]:
    """The rules of a resources mapping that compare amounts: a request within its limit (equal to it for an
    extended resource or huge pages), extended resources in whole units."""
    res = at.cel
    cmp = f"quantity(string({res}.requests[k])).compareTo(quantity(string({res}.limits[k])))"

    def ok(node: Any) -> bool:
        resources, exempt = at.of(node)
        return _within_limits(resources, exempt)

    return [
        Check(at.path, "a request must not exceed its limit, and must equal it for an extended resource or huge "
                       "pages; fix the amounts", sub_field="resources.requests" if at.on_spec else "requests",
              cel=at.cel_guard(f"!has({res}.requests) || !has({res}.limits) || {res}.requests.all(k, !(k in "
                               f"{res}.limits) || {at.cel_exempt('k')}({cel_overcommits('k')} ? {cmp} <= 0 : "
                               f"{cmp} == 0))"), ok=ok),
        *(Check(at.kind_path(kind), WHOLE_QUANTITY.message + "; fix the amount",
                cel=f"self.all(k, !{cel_is_extended('k')} || quantity(string(self[k])).isInteger())",
                ok=_whole_extended, find=_fractional_extended) for kind in ("requests", "limits")),
    ]


def _within_limits(resources: dict[str, Any], exempt: str | None = None) -> bool:
    limits = mapping(resources, "limits")
    for name, request in mapping(resources, "requests").items():
        want, most = quantity_value(request), quantity_value(limits.get(name))
        if name == exempt or want is None or most is None:
            continue
        if want > most if overcommits(str(name)) else want != most:
            return False
    return True


def _fractional_extended(amounts: Any) -> list[str]:
    return [f".{name}" for name, value in amounts.items() if is_extended(str(name)) and not (
        (isinstance(value, int) and not isinstance(value, bool)) or WHOLE_QUANTITY.ok(value))]


def _whole_extended(amounts: Any) -> bool:
    return not _fractional_extended(amounts)


# Room for the annotations the operator adds to every pod (spec hash, checkpoint location, autoscaler opt-outs,
# Kueue's and the gang scheduler's) within the API server's 256 KiB of annotations per object.
MAX_TEMPLATE_ANNOTATIONS = 256 * 1024 - 8 * 1024

SPEC_RULES: list[Rule] = [
    Text("image", IMAGE.message, syntax=IMAGE, required=True),
    *resource_rules("resources"), limit_rule(ResourcesAt("", on_spec=True)),
    *amount_rules(ResourcesAt("", on_spec=True)),
    Text("accelerator.resource", EXTENDED_RESOURCE.message, syntax=EXTENDED_RESOURCE, required=True),
    Text("scheduling.priorityClassName", DNS_SUBDOMAIN.message, syntax=DNS_SUBDOMAIN),
    Text("scheduling.queue", LOCAL_QUEUE.message, syntax=LOCAL_QUEUE),
    Text("scheduling.topologyKey", QUALIFIED_NAME.message, syntax=QUALIFIED_NAME),
    *label_rules("template.metadata.labels"), *label_rules("template.metadata.annotations", ANNOTATION_KEY, None),
    Check("template.metadata.annotations", f"may hold at most {MAX_TEMPLATE_ANNOTATIONS} characters of keys and "
                                           "values (the API server's 256 KiB, less the operator's annotations); "
                                           "move large data to a ConfigMap",
          cel=f"self.map(k, size(k) + size(self[k])).sum() <= {MAX_TEMPLATE_ANNOTATIONS}",
          ok=lambda a: sum(len(str(k)) + len(str(v)) for k, v in a.items()) <= MAX_TEMPLATE_ANNOTATIONS),
    *_pod_checks(), *pod_field_rules(), *volume_rules(), *toleration_rules(), *scheduling_rules(),
    *(Bound(f"{_POD}.{kind}", f"must list at most {MAX_CONTAINERS} containers", most=MAX_CONTAINERS)
      for kind in _KINDS),
    *(UniqueBy(f"{_POD}.{kind}", f"{kind} names must be unique; rename one") for kind in _KINDS),
    *container_rules(f"{_POD}.containers[]", init=False), *container_rules(f"{_POD}.initContainers[]", init=True),
]


def merged_resource_problems(resources: dict[str, Any], where: str) -> list[str]:
    """The resource rules on the worker's resources as the operator merges them (spec.resources, the accelerator's
    and the template worker's), which no single field of the spec shows; each "where: message"."""
    at = ResourcesAt("resources")
    rules = [r for r in [*resource_rules(at.path), limit_rule(at), *amount_rules(at)] if isinstance(r, Check)]
    return [f"{where}: {r.message}" for r in rules for _, value in nodes({"resources": resources}, r.path)
            if r.violated(value)]


def spec_rule_problems(spec: dict[str, Any]) -> list[str]:
    """Every SPEC_RULES problem of a spec (as written, camelCase), each "field: message"."""
    return problems(spec, SPEC_RULES)
