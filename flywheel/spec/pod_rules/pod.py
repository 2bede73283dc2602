"""The Pod API's rules on the pod-level fields of the pod template (`spec.template.spec`): volumes, tolerations,
scheduling (selectors, affinity, spread, gates), security context and the other pod fields, as field rules
(flywheel/spec/field_rules.py). flywheel/spec/pod_rules/rules.py gathers them with the containers' and the spec's own;
each mirrors what the API server refuses in a pod (k8s.io/kubernetes pkg/apis/core/validation), in our words. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flywheel.spec.field_rules import Bound, Check, Enum, IntOrText, Keys, Range, Rule, Text, UniqueBy, cel_in, one_of
from flywheel.spec.k8s_syntax import (
    CONFIG_KEY,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    EMPTY_DIR_MEDIUM,
    IP,
    ITEM_PATH,
    LABEL_VALUE,
    POD_RESOURCE,
    QUALIFIED_NAME,
    QUANTITY,
    SYSCTL,
    Syntax,
)
from flywheel.spec.pod_rules.container import MAX_ID, has, profile_rules, set_count
from flywheel.spec.pod_template import OPERATOR_VOLUMES

POD = "template.spec"
MAX_VOLUMES, MAX_TOLERATIONS, MAX_METADATA, MAX_GATES, MAX_TERMS, MAX_ITEMS = 64, 64, 64, 16, 16, 32
VOLUME_SOURCES = (
    "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "configMap", "csi", "downwardAPI",
    "emptyDir", "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo", "glusterfs", "hostPath",
    "image", "iscsi", "nfs", "persistentVolumeClaim", "photonPersistentDisk", "portworxVolume", "projected",
    "quobyte", "rbd", "scaleIO", "secret", "storageos", "vsphereVolume")
HOST_PATH_TYPES = ("", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice",
                   "BlockDevice")
LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
NODE_OPERATORS = (*LABEL_OPERATORS, "Gt", "Lt")


def label_rules(path: str, keys: Syntax = QUALIFIED_NAME, values: Syntax | None = LABEL_VALUE) -> list[Rule]:
    out: list[Rule] = [Bound(path, f"must have at most {MAX_METADATA} entries", most=MAX_METADATA,
                             keyword="maxProperties"),
                       Keys(path, f"keys {keys.message}", syntax=keys)]
    if values is not None:
        out.append(Text(f"{path}.{{}}", values.message, syntax=values))
    return out


def _given(key: str) -> Callable[[Any], bool]:
    return lambda source: bool(source.get(key))


def volume_rules() -> list[Rule]:
    vols = f"{POD}.volumes"
    mode = "must be a file mode from 0 to 0777 (511)"
    nonempty = [("persistentVolumeClaim", "claimName"), ("configMap", "name"), ("secret", "secretName"),
                ("hostPath", "path"), ("csi", "driver"), ("nfs", "server"), ("nfs", "path"), ("image", "reference")]
    return [
        Bound(vols, f"must list at most {MAX_VOLUMES} volumes", most=MAX_VOLUMES),
        Text(f"{vols}[].name", DNS_LABEL.message, syntax=DNS_LABEL, required=True),
        UniqueBy(vols, "volume names must be unique; rename one"),
        Check(f"{vols}[]", f"{', '.join(OPERATOR_VOLUMES)} are volumes the operator creates; rename yours",
              sub_field="name", cel=f"!({cel_in('self.name', OPERATOR_VOLUMES)})",
              ok=lambda v: v.get("name") not in OPERATOR_VOLUMES),
        Check(f"{vols}[]", "a volume has one source (emptyDir, persistentVolumeClaim, configMap, ...); split it "
                           "into one volume per source", cel=f"{one_of(VOLUME_SOURCES)} <= 1",
              ok=lambda v: set_count(v, VOLUME_SOURCES) <= 1),
        IntOrText(f"{vols}[].emptyDir.sizeLimit", QUANTITY.message, syntax=QUANTITY),
        *(Range(f"{vols}[].{source}.defaultMode", mode, low=0, high=0o777)
          for source in ("configMap", "secret", "projected", "downwardAPI")),
        *(Check(f"{vols}[].{source}", f"{key} must not be empty; name the {source}", sub_field=key,
                cel=f"has(self.{key}) && size(self.{key}) > 0", ok=_given(key))
          for source, key in nonempty),
        Text(f"{vols}[].emptyDir.medium", EMPTY_DIR_MEDIUM.message, syntax=EMPTY_DIR_MEDIUM),
        Enum(f"{vols}[].hostPath.type", f"must be one of {', '.join(t for t in HOST_PATH_TYPES if t)}",
             values=HOST_PATH_TYPES),
        Check(f"{vols}[]", "an ephemeral volume needs a volumeClaimTemplate; add one", sub_field="ephemeral",
              cel="!has(self.ephemeral) || has(self.ephemeral.volumeClaimTemplate)",
              ok=lambda v: not has(v, "ephemeral") or has(v["ephemeral"], "volumeClaimTemplate")),
        *(Bound(f"{vols}[].{source}.items", f"must list at most {MAX_ITEMS} items", most=MAX_ITEMS)
          for source in ("configMap", "secret", "downwardAPI")),
        *(Text(f"{vols}[].{source}.items[].path", ITEM_PATH.message, syntax=ITEM_PATH, required=True)
          for source in ("configMap", "secret", "downwardAPI")),
        *(Text(f"{vols}[].{source}.items[].key", CONFIG_KEY.message, syntax=CONFIG_KEY, required=True)
          for source in ("configMap", "secret")),
    ]


def toleration_rules() -> list[Rule]:
    tol = f"{POD}.tolerations"
    return [
        Bound(tol, f"must list at most {MAX_TOLERATIONS} tolerations", most=MAX_TOLERATIONS),
        Text(f"{tol}[].key", QUALIFIED_NAME.message, syntax=QUALIFIED_NAME),
        Enum(f"{tol}[].operator", "must be Equal or Exists", values=("", "Equal", "Exists")),
        Enum(f"{tol}[].effect", "must be NoSchedule, PreferNoSchedule or NoExecute (or empty: every effect)",
             values=("", "NoSchedule", "PreferNoSchedule", "NoExecute")),
        Text(f"{tol}[].value", LABEL_VALUE.message, syntax=LABEL_VALUE),
        Check(f"{tol}[]", "without a key, the operator must be Exists (tolerate every taint); set a key or "
                          "operator: Exists", sub_field="operator",
              cel="(has(self.key) && size(self.key) > 0) || (has(self.operator) && self.operator == 'Exists')",
              ok=lambda t: bool(t.get("key")) or t.get("operator") == "Exists"),
        Check(f"{tol}[]", "operator Exists matches any value; remove value", sub_field="value",
              cel="!has(self.operator) || self.operator != 'Exists' || !has(self.value) || size(self.value) == 0",
              ok=lambda t: t.get("operator") != "Exists" or not t.get("value")),
        Check(f"{tol}[]", "tolerationSeconds goes with effect NoExecute; set effect: NoExecute or remove it",
              sub_field="effect",
              cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
              ok=lambda t: not has(t, "tolerationSeconds") or t.get("effect") == "NoExecute"),
    ]


def selector_rules(path: str) -> list[Rule]:
    """A label selector: matchLabels as labels, matchExpressions with a known operator and values exactly for
    In and NotIn."""
    exprs = f"{path}.matchExpressions"
    return [
        *label_rules(f"{path}.matchLabels"),
        Bound(exprs, f"must list at most {MAX_TERMS} expressions", most=MAX_TERMS),
        Enum(f"{exprs}[].operator", f"must be one of {', '.join(LABEL_OPERATORS)}", values=LABEL_OPERATORS),
        Text(f"{exprs}[].key", QUALIFIED_NAME.message, syntax=QUALIFIED_NAME, required=True),
        Check(f"{exprs}[]", "In and NotIn need values, Exists and DoesNotExist take none; fix values",
              sub_field="values",
              cel="(has(self.values) && size(self.values) > 0) == (self.operator in ['In', 'NotIn'])",
              ok=lambda e: bool(e.get("values")) == (e.get("operator") in ("In", "NotIn"))),
    ]


def node_term_rules(path: str) -> list[Rule]:
    """A node selector term: expressions with a known operator and the values it takes."""
    out: list[Rule] = []
    for field, operators in (("matchExpressions", NODE_OPERATORS), ("matchFields", ("In", "NotIn"))):
        exprs = f"{path}.{field}"
        out += [
            Bound(exprs, f"must list at most {MAX_TERMS} expressions", most=MAX_TERMS),
            Enum(f"{exprs}[].operator", f"must be one of {', '.join(operators)}", values=operators),
            Check(f"{exprs}[]", "In and NotIn need values, Exists and DoesNotExist take none, Gt and Lt one; fix "
                                "values", sub_field="values",
                  cel="self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : "
                      "self.operator in ['Exists', 'DoesNotExist'] ? !has(self.values) || size(self.values) == 0 : "
                      "has(self.values) && size(self.values) == 1", ok=_node_values_fit),
        ]
    return out


def _node_values_fit(expr: Any) -> bool:
    values, operator = expr.get("values") or [], expr.get("operator")
    if operator in ("In", "NotIn"):
        return bool(values)
    return not values if operator in ("Exists", "DoesNotExist") else len(values) == 1


def scheduling_rules() -> list[Rule]:
    spread, aff = f"{POD}.topologySpreadConstraints", f"{POD}.affinity"
    node = f"{aff}.nodeAffinity"
    out: list[Rule] = [
        *label_rules(f"{POD}.nodeSelector"),
        Bound(f"{POD}.schedulingGates", f"must list at most {MAX_GATES} gates", most=MAX_GATES),
        Text(f"{POD}.schedulingGates[].name", QUALIFIED_NAME.message, syntax=QUALIFIED_NAME, required=True),
        UniqueBy(f"{POD}.schedulingGates", "scheduling gate names must be unique; remove the repeated one"),
        Bound(f"{POD}.readinessGates", f"must list at most {MAX_GATES} gates", most=MAX_GATES),
        Text(f"{POD}.readinessGates[].conditionType", QUALIFIED_NAME.message, syntax=QUALIFIED_NAME, required=True),
        Bound(spread, f"must list at most {MAX_TERMS} constraints", most=MAX_TERMS),
        UniqueBy(spread, "each topologyKey and whenUnsatisfiable pair goes once; merge the constraints",
                 keys=("topologyKey", "whenUnsatisfiable")),
        Range(f"{spread}[].maxSkew", "must be at least 1", low=1),
        Range(f"{spread}[].minDomains", "must be at least 1", low=1),
        Check(f"{spread}[]", "minDomains goes with whenUnsatisfiable: DoNotSchedule; remove it or set that",
              sub_field="minDomains", cel="!has(self.minDomains) || self.whenUnsatisfiable == 'DoNotSchedule'",
              ok=lambda c: not has(c, "minDomains") or c.get("whenUnsatisfiable") == "DoNotSchedule"),
        Text(f"{spread}[].topologyKey", QUALIFIED_NAME.message, syntax=QUALIFIED_NAME, required=True),
        Enum(f"{spread}[].whenUnsatisfiable", "must be DoNotSchedule or ScheduleAnyway",
             values=("DoNotSchedule", "ScheduleAnyway")),
        *(Enum(f"{spread}[].{p}", "must be Honor or Ignore", values=("Honor", "Ignore"))
          for p in ("nodeAffinityPolicy", "nodeTaintsPolicy")),
        *selector_rules(f"{spread}[].labelSelector"),
        Bound(f"{node}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
              f"must list at most {MAX_TERMS} terms", most=MAX_TERMS),
        Check(f"{node}.requiredDuringSchedulingIgnoredDuringExecution", "needs at least one node selector term",
              sub_field="nodeSelectorTerms", cel="size(self.nodeSelectorTerms) > 0",
              ok=lambda r: bool(r.get("nodeSelectorTerms"))),
        *node_term_rules(f"{node}.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[]"),
        Bound(f"{node}.preferredDuringSchedulingIgnoredDuringExecution", f"must list at most {MAX_TERMS} terms",
              most=MAX_TERMS),
        *node_term_rules(f"{node}.preferredDuringSchedulingIgnoredDuringExecution[].preference"),
        Range(f"{node}.preferredDuringSchedulingIgnoredDuringExecution[].weight", "must be from 1 to 100", low=1,
              high=100),
    ]
    for kind in ("podAffinity", "podAntiAffinity"):
        required = f"{aff}.{kind}.requiredDuringSchedulingIgnoredDuringExecution"
        preferred = f"{aff}.{kind}.preferredDuringSchedulingIgnoredDuringExecution"
        out += [Bound(required, f"must list at most {MAX_TERMS} terms", most=MAX_TERMS),
                Bound(preferred, f"must list at most {MAX_TERMS} terms", most=MAX_TERMS),
                Text(f"{required}[].topologyKey", QUALIFIED_NAME.message, syntax=QUALIFIED_NAME, required=True),
                Text(f"{preferred}[].podAffinityTerm.topologyKey", QUALIFIED_NAME.message, syntax=QUALIFIED_NAME,
                     required=True),
                Range(f"{preferred}[].weight", "must be from 1 to 100", low=1, high=100),
                *selector_rules(f"{required}[].labelSelector"),
                *selector_rules(f"{preferred}[].podAffinityTerm.labelSelector")]
    return out


def pod_field_rules() -> list[Rule]:
    # Not schedulerName: the Pod API takes any.
    names = ("priorityClassName", "serviceAccountName", "serviceAccount", "runtimeClassName", "nodeName")
    sec = f"{POD}.securityContext"
    return [
        *(Text(f"{POD}.{name}", DNS_SUBDOMAIN.message, syntax=DNS_SUBDOMAIN) for name in names),
        Enum(f"{POD}.dnsPolicy", "must be ClusterFirst, ClusterFirstWithHostNet, Default or None",
             values=("", "ClusterFirst", "ClusterFirstWithHostNet", "Default", "None")),
        Enum(f"{POD}.preemptionPolicy", "must be PreemptLowerPriority or Never",
             values=("PreemptLowerPriority", "Never")),
        Range(f"{POD}.activeDeadlineSeconds", "must be at least 1", low=1),
        Enum(f"{POD}.os.name", "must be linux: the operator's security profile sets fields a Windows pod may not "
             "have", values=("linux",)),
        *(Range(f"{sec}.{f}", "must be an id from 0 to 2147483647", low=0, high=MAX_ID)
          for f in ("runAsUser", "runAsGroup", "fsGroup")),
        Range(f"{sec}.supplementalGroups[]", "must be an id from 0 to 2147483647", low=0, high=MAX_ID),
        Enum(f"{sec}.fsGroupChangePolicy", "must be OnRootMismatch or Always", values=("OnRootMismatch", "Always")),
        *profile_rules(f"{sec}.seccompProfile"), *profile_rules(f"{sec}.appArmorProfile", "AppArmor"),
        Enum(f"{sec}.supplementalGroupsPolicy", "must be Merge or Strict", values=("Merge", "Strict")),
        Enum(f"{sec}.seLinuxChangePolicy", "must be MountOption or Recursive", values=("MountOption", "Recursive")),
        Bound(f"{sec}.sysctls", "must list at most 32 sysctls", most=32),
        Text(f"{sec}.sysctls[].name", SYSCTL.message, syntax=SYSCTL, required=True),
        Check(POD, "hostUsers: false (a user namespace) excludes hostNetwork, hostPID and hostIPC; drop one",
              sub_field="hostUsers",
              cel="!has(self.hostUsers) || self.hostUsers || !((has(self.hostNetwork) && self.hostNetwork) || "
                  "(has(self.hostPID) && self.hostPID) || (has(self.hostIPC) && self.hostIPC))",
              ok=lambda pod: pod.get("hostUsers") is not False or not any(
                  pod.get(k) is True for k in ("hostNetwork", "hostPID", "hostIPC"))),
        Check(POD, "shareProcessNamespace and hostPID exclude each other; drop one", sub_field="shareProcessNamespace",
              cel="!(has(self.shareProcessNamespace) && self.shareProcessNamespace && has(self.hostPID) && "
                  "self.hostPID)",
              ok=lambda pod: not (pod.get("shareProcessNamespace") is True and pod.get("hostPID") is True)),
        Bound(f"{POD}.hostAliases", f"must list at most {MAX_TERMS} host aliases", most=MAX_TERMS),
        Text(f"{POD}.hostAliases[].ip", IP.message, syntax=IP, required=True),
        Bound(f"{POD}.dnsConfig.nameservers", "must list at most 3 nameservers", most=3),
        Text(f"{POD}.dnsConfig.nameservers[]", IP.message, syntax=IP, required=True),
        Bound(f"{POD}.resources.requests", "must name at most 8 resources", most=8, keyword="maxProperties"),
        Bound(f"{POD}.resources.limits", "must name at most 8 resources", most=8, keyword="maxProperties"),
        Keys(f"{POD}.resources.requests", f"resource names {POD_RESOURCE.message}", syntax=POD_RESOURCE),
        Keys(f"{POD}.resources.limits", f"resource names {POD_RESOURCE.message}", syntax=POD_RESOURCE),
    ]


