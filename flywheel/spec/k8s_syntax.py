"""The string syntaxes of the Kubernetes API (k8s.io/apimachinery/pkg/util/validation and the Pod API's own),
each defined once as regular expressions that mean the same in Python's `re` and in RE2 (CEL's `matches`), so the
CRD's CEL rules and `flywheel plan` decide alike (flywheel/spec/pod_rules/rules.py uses them on both sides). Pure.

Each expression is matched against the whole value (Python's fullmatch; `^(...)$` in CEL, where RE2's `$` is the
end of the text); `cel_string` escapes it into a CEL string literal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation, localcontext
from typing import Any


@dataclass(frozen=True)
class Syntax:
    """A value is valid when it is at most `max_length` characters, matches every one of `patterns` and none of
    `forbidden`. `message` says what it must be and how to fix it ("must be ...; ...")."""

    patterns: tuple[str, ...]
    max_length: int
    message: str
    forbidden: tuple[str, ...] = ()

    def ok(self, value: Any) -> bool:
        return (isinstance(value, str) and len(value) <= self.max_length
                and all(re.fullmatch(p, value) for p in self.patterns)
                and not any(re.fullmatch(p, value) for p in self.forbidden))

    def cel(self, var: str) -> str:
        """A CEL expression true when the string `var` is valid."""
        parts = [f"size({var}) <= {self.max_length}"]
        parts += [f"{var}.matches({cel_string('^(' + p + ')$')})" for p in self.patterns]
        parts += [f"!{var}.matches({cel_string('^(' + p + ')$')})" for p in self.forbidden]
        return " && ".join(parts)


def cel_string(text: str) -> str:
    """`text` as a CEL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = f"{_LABEL}([.]{_LABEL})*"
_NAME_PART = "[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
_CASELESS_LABEL = "[a-zA-Z0-9]([-a-zA-Z0-9]*[a-zA-Z0-9])?"
_LOWER = "lowercase letters, digits and '-', starting and ending with a letter or digit"

DNS_LABEL = Syntax((_LABEL,), 63, f"must be a DNS-1123 label: at most 63 {_LOWER}; rename it")
DNS_SUBDOMAIN = Syntax((_SUBDOMAIN,), 253, "must be a DNS-1123 subdomain: at most 253 characters of "
                                           f"dot-separated {_LOWER}; use the object's name as Kubernetes spells it")
LABEL_VALUE = Syntax(("(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?",), 63,
                     "must be a label value: at most 63 letters, digits, '-', '_' and '.', starting and ending with "
                     "a letter or digit (or empty)")
# prefix/name: the prefix a DNS subdomain of at most 253 characters, the name at most 63.
_QUALIFIED_LENGTHS = "([^/]{1,253}/)?[^/]{1,63}"
QUALIFIED_NAME = Syntax((f"({_SUBDOMAIN}/)?{_NAME_PART}", _QUALIFIED_LENGTHS), 317,
                        "must be a qualified name: an optional DNS subdomain prefix and '/', then at most 63 "
                        "letters, digits, '-', '_' and '.', starting and ending with a letter or digit "
                        "(e.g. example.com/my-key)")
# The API server checks annotation keys lowercased: their prefix may have capitals.
ANNOTATION_KEY = Syntax((f"({_CASELESS_LABEL}([.]{_CASELESS_LABEL})*/)?{_NAME_PART}", _QUALIFIED_LENGTHS), 317,
                        QUALIFIED_NAME.message)
# IANA_SVC_NAME: at most 15 characters, a letter among them, no '--': '-'-separated runs of letters and digits,
# one with a letter (one expression, so that it is also a schema pattern).
PORT_NAME = Syntax(("([a-z0-9]+-)*[a-z0-9]*[a-z][a-z0-9]*(-[a-z0-9]+)*",), 15,
                   "must be an IANA service name: at most 15 lowercase letters, digits and '-', with at least one "
                   "letter, starting and ending with a letter or digit, without '--'; rename the port")
# Printable ASCII but '=' (the API server's relaxed environment variable names). The length bound is Flywheel's,
# for the CRD's CEL cost budget.
ENV_NAME = Syntax(("[ -<>-~]+",), 256, "must be at most 256 printable ASCII characters other than '=' "
                                       "(e.g. MY_VAR); rename it")
# An image reference has no whitespace (the API server refuses it at either end; the kubelet anywhere).
IMAGE = Syntax(("[!-~]+",), 1024, "must be an image reference without spaces, e.g. "
                                  "registry.example.com/team/flywheel:1.0; fix the reference")
# Paths: the length bounds are Flywheel's, for the CRD's CEL cost budget.
MOUNT_PATH = Syntax((".+",), 1024, "must be a path of at most 1024 characters (where the volume appears); set it")
SUB_PATH = Syntax((".*",), 1024, "must be a relative path (no leading '/') of at most 1024 characters without '..' "
                                 "elements; use a path inside the volume", forbidden=("/.*", "(.*/)?[.][.](/.*)?"))
# A sysctl: dot- or slash-separated segments of lowercase letters, digits, '-' and '_'.
SYSCTL = Syntax(("([a-z0-9]([-_a-z0-9]*[a-z0-9])?[./])*[a-z0-9]([-_a-z0-9]*[a-z0-9])?",), 253,
                "must be a sysctl name such as net.ipv4.ip_local_port_range; fix the name")
# The pod fields an env var may read (the API server's supported field paths; the length bound is Flywheel's, for
# the CRD's CEL cost budget).
FIELD_PATH = Syntax(("metadata[.](name|namespace|uid)|metadata[.](labels|annotations)(\\[.+\\])?|"
                     "spec[.](nodeName|serviceAccountName)|status[.](hostIP|hostIPs|podIP|podIPs)",), 128,
                    "must be a supported field path: metadata.name, metadata.namespace, metadata.uid, "
                    "metadata.labels['key'], metadata.annotations['key'], spec.nodeName, spec.serviceAccountName, "
                    "status.hostIP(s) or status.podIP(s)")
RESOURCE_FIELD = Syntax(("(limits|requests)[.](cpu|memory|ephemeral-storage|hugepages-.+)",), 253,
                        "must be limits.<r> or requests.<r> for cpu, memory, ephemeral-storage or hugepages-<size>")
# A ConfigMap's or Secret's key.
CONFIG_KEY = Syntax(("[-._a-zA-Z0-9]+",), 253, "must be a key of at most 253 letters, digits, '-', '_' and '.' "
                                               "(not '.' or '..', not starting with '..'); fix the key",
                    forbidden=("[.]", "[.][.].*"))
# A file a volume projects: relative, without '..' elements.
ITEM_PATH = Syntax((".+",), 256, "must be a relative path (no leading '/') of at most 256 characters without "
                                 "'..' elements", forbidden=("/.*", "(.*/)?[.][.](/.*)?"))
EMPTY_DIR_MEDIUM = Syntax(("Memory|HugePages(-.+)?",), 64, "must be Memory, HugePages or HugePages-<size> (or "
                                                           "empty: the node's disk)")
# An IP address as the API server parses it: IPv4 (leading zeros tolerated) or IPv6 (only its alphabet is checked).
_OCTET = "0*(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
IP = Syntax((f"({_OCTET}[.]){{3}}{_OCTET}|[0-9a-fA-F:.]*:[0-9a-fA-F:.]*",), 64,
            "must be an IP address such as 10.9.8.7 or 2001:db8::ffff")
# Pod-level resources (spec.resources of the pod): cpu, memory and huge pages only.
POD_RESOURCE = Syntax(("cpu|memory|hugepages-[0-9]+([.][0-9]+)?([KMGTPE]i|[kMGTPE])?",), 63,
                      "must be cpu, memory or hugepages-<size> (pod-level resources); put others in a container")
DNS1035_LABEL_PATTERN = "[a-z]([-a-z0-9]*[a-z0-9])?"
# A Kueue LocalQueue's name, also the value of the pods' queue label.
LOCAL_QUEUE = Syntax((_SUBDOMAIN,), 63, f"must name a Kueue LocalQueue in a label value: at most 63 dot-separated "
                                        f"{_LOWER}; use the LocalQueue's name")

# Quantities (k8s.io/apimachinery/pkg/api/resource): a non-negative decimal with a binary-SI, decimal-SI or
# exponent suffix. A minus sign is refused outright (the API server accepts only -0).
_NUMBER = "([0-9]+([.][0-9]*)?|[.][0-9]+)"
QUANTITY_PATTERN = f"[+]?{_NUMBER}([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?"
QUANTITY = Syntax((QUANTITY_PATTERN,), 64, "must be a quantity such as 500m, 2 or 4Gi (not negative); fix the amount")
# Extended resources are counted in whole units.
WHOLE_QUANTITY = Syntax(("[+]?[0-9]+([KMGTPE]i|[kMGTPE]|[eE][+]?[0-9]+)?",), 64,
                        "must be a whole number such as 1 or 8 (an extended resource is counted in whole devices)")

# Resource names a container may request: the standard ones (cpu, memory, ephemeral-storage, hugepages-<size>) or
# a domain-qualified one; one with a domain other than kubernetes.io's is an extended resource ("requests." + its
# name a qualified name, so the domain is at most 244 characters and does not start with "requests.").
_RESOURCE_DOMAIN = f"{_SUBDOMAIN}/{_NAME_PART}"
_HUGEPAGES = "hugepages-[0-9]+([.][0-9]+)?([KMGTPE]i|[kMGTPE])?"
CONTAINER_RESOURCE = Syntax((f"cpu|memory|ephemeral-storage|{_HUGEPAGES}|{_RESOURCE_DOMAIN}",
                             "[^/]{1,63}|[^/]{1,244}/[^/]{1,63}"), 308,
                            "must be cpu, memory, ephemeral-storage, hugepages-<size> or a domain-qualified resource "
                            "name such as nvidia.com/gpu; fix the name", forbidden=("requests[.].*",))
EXTENDED_RESOURCE = Syntax((_RESOURCE_DOMAIN, "[^/]{1,244}/[^/]{1,63}"), 308,
                           "must be an extended resource name, <domain>/<name> with a domain other than "
                           "kubernetes.io's, such as nvidia.com/gpu or amd.com/gpu",
                           forbidden=("requests[.].*", ".*kubernetes[.]io/.*"))


def is_extended(name: str) -> bool:
    """An extended resource: counted in whole units, its request equal to its limit."""
    return "/" in name and "kubernetes.io/" not in name


def cel_is_extended(var: str) -> str:
    return f"({var}.contains('/') && !{var}.contains('kubernetes.io/'))"


def overcommits(name: str) -> bool:
    """Whether a request may be below its limit: native resources but huge pages (the API server's
    IsOvercommitAllowed)."""
    return not name.startswith("hugepages-") and not is_extended(name)


def cel_overcommits(var: str) -> str:
    return f"(!{var}.startsWith('hugepages-') && !{cel_is_extended(var)})"


_SUFFIXES = {"": 1, "n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": 10**3, "M": 10**6,
             "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
             **{f"{p}i": 2 ** (10 * (i + 1)) for i, p in enumerate("KMGTPE")}}
_PARTS = re.compile(r"[+]?(?P<number>[0-9.]+)(?P<suffix>[KMGTPE]i|[numkMGTPE])?(?:[eE](?P<exp>[+-]?[0-9]+))?")


def quantity_value(value: Any) -> Decimal | None:
    """The amount of a quantity (an int or a QUANTITY string), or None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    if isinstance(value, int):
        return Decimal(value) if value >= 0 else None
    if not QUANTITY.ok(value):
        return None
    parts = _PARTS.fullmatch(value)
    if parts is None:
        return None
    with localcontext() as ctx:
        ctx.prec, ctx.Emax, ctx.Emin = 100, 10**9, -(10**9)
        try:
            amount = Decimal(parts["number"]) * _SUFFIXES[parts["suffix"] or ""]
            return amount.scaleb(int(parts["exp"] or 0))
        except (InvalidOperation, ArithmeticError):
            return None
