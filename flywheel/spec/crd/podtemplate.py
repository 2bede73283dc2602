"""The core/v1 PodTemplateSpec schema for the CRD's `spec.template`, generated from the Kubernetes OpenAPI
definitions that the `kubernetes-validate` package ships (JSON Schema per Kubernetes version), not typed by hand.

The definitions are JSON Schema 2020-12 with `$ref`s, `["string", "null"]` types and `oneOf` for int-or-string
and quantities; a CRD needs a structural schema (kubernetes.io "Specifying a structural schema"): refs inlined,
one type per node, no `oneOf` between types (int-or-string and quantities become `x-kubernetes-int-or-string`),
and only the keywords a CRD accepts (no patch-strategy markers). List-map markers are dropped too: a CRD requires
every list-map key to be required or defaulted, which the Pod API does not (`ports[].protocol`); without them the
lists merge atomically under server-side apply. The template's metadata keeps labels and annotations only, as
controller-gen's embedded ObjectMeta does. Descriptions are cut to their first sentence to keep the CRD under the
annotation limit of client-side `kubectl apply` (spec/crd/generate.py measures it).

Generating needs the dev extra (`kubernetes-validate`); the generated CRD is committed, so nothing here runs in
the operator or the API.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

# The Kubernetes version whose Pod API the CRD mirrors: the kubernetes-validate release pinned in pyproject.toml.
KUBERNETES_VERSION = "1.37.0"
_DEFS_FILE = f"kubernetes-json-schema/v{KUBERNETES_VERSION}-local/_definitions.json"
_POD_TEMPLATE = "io.k8s.api.core.v1.PodTemplateSpec"
_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_INT_OR_STRING = {"io.k8s.apimachinery.pkg.util.intstr.IntOrString", "io.k8s.apimachinery.pkg.api.resource.Quantity"}
# Keywords of the definitions that a CRD schema takes as they are (JSONSchemaProps fields).
_KEPT = {"description", "type", "format", "required", "enum", "default", "minimum", "maximum", "pattern",
         "minLength", "maxLength", "minItems", "maxItems"}
# Fields a pod may not be created with (the API server refuses ephemeral containers on create).
_NOT_ON_CREATE = {"ephemeralContainers"}
# Required fields the template may leave out: the operator generates the worker container, so a template may give
# pod-level fields only.
_OPTIONAL = {"template.spec": {"containers"}}
_FIRST_SENTENCE = re.compile(r"^(.*?[.!?])(\s|$)", re.S)


def _load_definitions() -> dict[str, Any]:
    try:
        text = resources.files("kubernetes_validate").joinpath(_DEFS_FILE).read_text()
    except (ModuleNotFoundError, FileNotFoundError) as err:
        raise RuntimeError(f"generating the CRD needs kubernetes-validate=={KUBERNETES_VERSION} (the dev extra: pip "
                           "install -e '.[dev]'); the committed crds/ needs nothing") from err
    defs: dict[str, Any] = json.loads(text)["$defs"]
    return defs


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _short(text: str) -> str:
    """The first sentence of a Kubernetes field description (the rest is in the Pod API reference)."""
    text = " ".join(text.split())
    match = _FIRST_SENTENCE.match(text)
    return match.group(1) if match else text


def _single_type(node: dict[str, Any]) -> str | None:
    kind = node.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        return kinds[0] if len(kinds) == 1 else None
    return kind if isinstance(kind, str) else None


class _Converter:
    def __init__(self, defs: dict[str, Any]):
        self.defs = defs

    def node(self, raw: dict[str, Any], path: str, seen: tuple[str, ...] = ()) -> dict[str, Any]:
        """One JSON Schema node, refs inlined, as a structural CRD schema node."""
        description = raw.get("description")
        if "$ref" in raw:
            name = _ref_name(raw["$ref"])
            if name in seen:
                raise ValueError(f"{path}: recursive definition {name} has no structural form")
            out = self.definition(name, path, (*seen, name))
            if description:  # the field's own words beat the type's
                out["description"] = _short(description)
            return out
        if "oneOf" in raw or "anyOf" in raw:
            raise ValueError(f"{path}: a union other than int-or-string has no structural form")
        out = {k: v for k, v in raw.items() if k in _KEPT}
        if description:
            out["description"] = _short(description)
        kind = _single_type(raw)
        if kind is None:
            out.pop("type", None)
        else:
            out["type"] = kind
        if "properties" in raw:
            out["properties"] = {k: self.node(v, f"{path}.{k}", seen) for k, v in raw["properties"].items()
                                 if k not in _NOT_ON_CREATE}
        if isinstance(raw.get("additionalProperties"), dict):
            out["additionalProperties"] = self.node(raw["additionalProperties"], f"{path}.*", seen)
        if isinstance(raw.get("items"), dict):
            out["items"] = self.node(raw["items"], f"{path}[]", seen)
        if kind == "object" and "properties" not in out and "additionalProperties" not in out:
            out["x-kubernetes-preserve-unknown-fields"] = True
        if "required" in out:
            out["required"] = [k for k in out["required"] if k not in _OPTIONAL.get(path, set())]
        if not out.get("required"):
            out.pop("required", None)
        return out

    def definition(self, name: str, path: str, seen: tuple[str, ...]) -> dict[str, Any]:
        if name in _INT_OR_STRING:
            return {"x-kubernetes-int-or-string": True}
        if name == _OBJECT_META:
            return self._template_metadata(path, seen)
        return self.node(self.defs[name], path, seen)

    def _template_metadata(self, path: str, seen: tuple[str, ...]) -> dict[str, Any]:
        props = self.defs[_OBJECT_META]["properties"]
        return {"type": "object", "description": "Labels and annotations added to every worker pod.",
                "properties": {k: self.node(props[k], f"{path}.{k}", seen) for k in ("labels", "annotations")}}


def pod_template_schema() -> dict[str, Any]:
    """The structural schema of a core/v1 PodTemplateSpec, for `spec.template`."""
    out = _Converter(_load_definitions()).definition(_POD_TEMPLATE, "template", (_POD_TEMPLATE,))
    out["description"] = ("A core/v1 PodTemplateSpec applied to every worker pod: labels, annotations and pod spec "
                          "fields pass through; the container named worker (else the first) is merged with what "
                          "the operator generates. restartPolicy, hostname, subdomain and the worker's command "
                          "and args are the operator's.")
    return out
