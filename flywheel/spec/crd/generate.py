"""The TrainingJob CustomResourceDefinition, generated from `spec/job.py` (the one source of the schema).

pydantic's JSON Schema is turned into a Kubernetes structural OpenAPI v3 schema: refs inlined, nullable instead of
anyOf-null, numeric exclusive bounds rewritten, nested objects defaulted to {} so the API server applies their field
defaults. Cross-field checks that `spec/job.py` does in Python are mirrored as CEL rules.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from flywheel.spec.field_rules import attach
from flywheel.spec.job import API_VERSION, MAX_NAME_LENGTH, TrainingJobSpec
from flywheel.spec.pod_rules.rules import JOB_NAME, SPEC_RULES
from flywheel.spec.pod_template import (
    KUEUE_KEYS,
    METADATA_MAPS,
    OWNED_POD_FIELDS,
    kueue_key_problem,
    owned_field_problem,
)
from flywheel.spec.status import TrainingJobStatus
from flywheel.spec.storage import LOCAL_DISK_URL, OBJECT_STORE_URL, CheckpointStorage, cluster_storage_problems

GROUP, VERSION = API_VERSION.split("/")
PLURAL, SINGULAR, SHORT_NAME = "trainingjobs", "trainingjob", "tj"
CRD_NAME = f"{PLURAL}.{GROUP}"
DEFAULT_PATH = Path("crds") / f"{CRD_NAME}.yaml"

_DROP = {"title", "discriminator"}

# CEL rules (x-kubernetes-validations) by the JSON path of the object they sit on. The layout rules mirror
# layout/rules.py's (COVERED_RULES names which; tests/spec/test_crd_rules.py checks the verdicts agree on random
# specs). World-size rules hold at every replica count r in [min, max], world = r x procsPerReplica: for "k divides
# every world", min == max needs k | min x p, and min < max needs k | p (k divides r p and (r+1) p, so their
# difference p; and k | p gives every r p). The batch rule is checked at each of the first MAX_CEL_REPLICA_COUNTS
# counts of the range (CEL has no loops; the operator's validation covers wider ranges).
MAX_CEL_REPLICA_COUNTS = 64
_TRAINER = "(has(self.command) && size(self.command) > 0) || self.trainer.parallelism.auto || "
_P, _T = "self.procsPerReplica", "self.trainer.parallelism"
_MIN, _MAX, _G, _MB = "self.replicas.min", "self.replicas.max", "self.trainer.training.globalBatch", \
    "self.trainer.training.microBatch"


def _every_world_divisible_by(k: str) -> str:
    return f"({_MIN} == {_MAX} ? ({_MIN} * {_P}) % ({k}) == 0 : {_P} % ({k}) == 0)"


_COUNTS = "[" + ", ".join(str(i) for i in range(MAX_CEL_REPLICA_COUNTS)) + "]"
_SPEC_RULES = [
    {"rule": _TRAINER + f"{_G} % {_MB} == 0",
     "message": "trainer.training.globalBatch is not divisible by microBatch; make globalBatch a multiple of "
                "microBatch",
     "fieldPath": ".trainer.training.globalBatch"},
    {"rule": _TRAINER + _every_world_divisible_by(f"{_T}.tp * {_T}.pp"),
     "message": "trainer.parallelism.tp: tp x pp does not divide every world size (replicas x procsPerReplica); "
                "choose tp and pp whose product divides every world size in replicas [min, max] x procsPerReplica",
     "fieldPath": ".trainer.parallelism.tp"},
    {"rule": _TRAINER + f"!{_every_world_divisible_by(f'{_T}.tp * {_T}.pp')} || "
             + _every_world_divisible_by(f"{_T}.tp * {_T}.pp * {_T}.ep"),
     "message": "trainer.parallelism.ep: ep does not divide dp = world / (tp x pp) at every replica count; expert "
                "parallelism borrows from the data-parallel ranks, so choose an ep that divides dp at every world "
                "size",
     "fieldPath": ".trainer.parallelism.ep"},
    {"rule": _TRAINER + f"{_COUNTS}.all(i, {_MIN} + i > {_MAX} || (({_MIN} + i) * {_P}) % ({_T}.tp * {_T}.pp) != 0"
             f" || {_G} % ({_MB} * (({_MIN} + i) * {_P} / ({_T}.tp * {_T}.pp))) == 0)",
     "message": "trainer.training.globalBatch is not divisible by microBatch x dp at some replica count in [min, "
                "max]; make globalBatch a multiple of microBatch x dp at every replica count",
     "fieldPath": ".trainer.training.globalBatch"},
    {"rule": _TRAINER + f"{_T}.tp == 1 || {_T}.fsdp",
     "message": "trainer.parallelism.fsdp: tp > 1 needs fsdp: true (DDP cannot replicate tensor-parallel "
                "parameters); set fsdp: true or tp: 1",
     "fieldPath": ".trainer.parallelism.fsdp"},
    {"rule": _TRAINER + f"{_T}.ep == 1 || !has(self.trainer.model.moe) || {_T}.fsdp",
     "message": "trainer.parallelism.fsdp: ep > 1 needs fsdp: true; set fsdp: true or ep: 1",
     "fieldPath": ".trainer.parallelism.fsdp"},
]
# spec_layout.cluster_storage_problems as CEL (a cluster-only rule: the local runner does not ask it). Its message
# is the rule's own, taken from a job that breaks it.
_STORAGE = cluster_storage_problems(CheckpointStorage(replicas_max=2, claim_name="", directory="/ckpt",
                                                      ephemeral=False))[0]
_SPEC_RULES.append(
    {"rule": "self.replicas.max <= 1 || size(self.checkpoint.claimName) > 0 || self.checkpoint.ephemeral || "
             f"(self.checkpoint.dir.matches('{OBJECT_STORE_URL}') && !self.checkpoint.dir.matches('{LOCAL_DISK_URL}'))",
     "message": f"{_STORAGE.field}: more than one worker (replicas.max) without a claim would each write their "
                f"checkpoint shards to their own emptyDir, lost with the pod; {_STORAGE.fix}",
     "fieldPath": "." + _STORAGE.field})
# layout/rules.py's rule ids that the rules above decide for every job in their reach.
COVERED_RULES = frozenset({"batch-micro", "mesh", "ep-dp", "batch-dp", "tp-fsdp", "ep-fsdp", "ckpt-shared"})
_RULES: dict[str, list[dict[str, str]]] = {
    "spec": _SPEC_RULES,
    "spec.replicas": [
        {"rule": "self.min <= self.max", "message": "replicas: min is greater than max; set min <= max"},
        {"rule": "!has(self.target) || (self.target >= self.min && self.target <= self.max)",
         "message": "replicas: target is outside [min, max]; scale within the bounds or widen them"},
    ],
    "spec.trainer.parallelism": [
        {"rule": "(self.stagesPerRank == 1) == (self.schedule != 'interleaved-1f1b')",
         "message": "trainer.parallelism.stagesPerRank above 1 goes with schedule interleaved-1f1b, and only with it; "
                    "set stagesPerRank: 1 or schedule: interleaved-1f1b",
         "fieldPath": ".stagesPerRank"},
    ],
    "spec.trainer.model": [
        {"rule": "!has(self.dim) || !has(self.heads) || self.dim % self.heads == 0",
         "message": "trainer.model.heads does not divide dim; pick heads that divide dim", "fieldPath": ".heads"},
    ],
    "spec.trainer.data": [
        {"rule": "!has(self.validation) || !has(self.validationFraction) || self.validationFraction == 0.0",
         "message": "trainer.data.validation and validationFraction are both set; give held-out data or a "
                    "fraction of the source, not both", "fieldPath": ".validationFraction"},
    ],
}

# The template rules CEL can decide (spec/pod_template.py defines them and words their refusals): the pod fields the
# operator owns (each worker's restart, hostname and headless-Service subdomain) and Kueue's pod-group metadata,
# refused at apply time with the fix; the operator refuses them again for a job that reaches it another way.
TEMPLATE_RULES = [
    *({"rule": f"!has(self.spec) || !has(self.spec.{name})", "message": owned_field_problem(name),
       "fieldPath": f".spec.{name}"} for name in OWNED_POD_FIELDS),
    *({"rule": f"!has(self.metadata) || !has(self.metadata.{where}) || !('{key}' in self.metadata.{where})",
       "message": kueue_key_problem(where, key), "fieldPath": f".metadata.{where}"}
      for where in METADATA_MAPS for key in KUEUE_KEYS),
]


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return {k: _resolve(v, defs) for k, v in node.items() if k != "$defs"}


def _structural(node: dict[str, Any], path: str) -> dict[str, Any]:
    """Rewrite one resolved JSON Schema node into Kubernetes' structural OpenAPI v3 dialect."""
    node = {k: v for k, v in node.items() if k not in _DROP}
    if isinstance(node.get("description"), str):  # class docstrings keep their line breaks
        node["description"] = " ".join(node["description"].split())
    if "anyOf" in node:
        variants = [v for v in node.pop("anyOf") if v.get("type") != "null"]
        if len(variants) != 1:
            raise ValueError(f"{path}: unions other than X|None have no structural form")
        node = {**{k: v for k, v in variants[0].items() if k not in _DROP}, **node, "nullable": True}
        node.pop("default", None) if node.get("default") is None else None
    if "const" in node:
        node["enum"] = [node.pop("const")]
    for bound, flag in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if bound in node and not isinstance(node[bound], bool):
            node[flag] = node.pop(bound)
            node[bound] = True
    if node.get("type") == "object":
        props = node.get("properties")
        if props is not None:
            node["properties"] = {k: _structural(v, f"{path}.{k}") for k, v in props.items()}
            for key, sub in node["properties"].items():
                # A nullable object (an optional section such as model.moe) stays absent unless given. The default
                # is spelled out: the API server checks a default against the CEL rules as it is, unfilled.
                if sub.get("type") == "object" and "properties" in sub and "default" not in sub \
                        and not sub.get("nullable"):
                    sub["default"] = {k: v["default"] for k, v in sub["properties"].items() if "default" in v}
            node.pop("additionalProperties", None)
        elif isinstance(node.get("additionalProperties"), dict):  # a map of typed values (spec.resources.limits)
            node["additionalProperties"] = _structural(node["additionalProperties"], f"{path}{{}}")
        else:
            node.pop("additionalProperties", None)
            node["x-kubernetes-preserve-unknown-fields"] = True
        node.pop("required", None) if not node.get("required") else None
    if node.get("type") == "array" and "items" in node:
        node["items"] = _structural(node["items"], f"{path}[]")
    if path in _RULES:
        node["x-kubernetes-validations"] = list(_RULES[path])
    return node


def openapi_schema(model: type[BaseModel], path: str) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(_resolve(raw, raw.get("$defs", {})), path)


def spec_schema_with_template(spec_schema: dict[str, Any]) -> dict[str, Any]:
    """The spec schema with the generated PodTemplateSpec at `spec.properties.template`, whether or not the model
    declares `template` yet (the model's own description of the field, if any, is kept)."""
    from flywheel.spec.crd.podtemplate import pod_template_schema  # dev extra: only `flywheel crd` generates

    template = pod_template_schema()
    declared = spec_schema.get("properties", {}).get("template", {})
    if declared.get("description"):
        template["description"] = declared["description"]
    template["x-kubernetes-validations"] = list(TEMPLATE_RULES)
    return {**spec_schema, "properties": {**spec_schema.get("properties", {}), "template": template}}


def rules_spec_schema() -> dict[str, Any]:
    """The spec's schema with the pod template and the Pod API's rules on every field the pods copy
    (flywheel/spec/pod_rules/rules.py: CEL rules and schema keywords, the same definitions `flywheel plan` checks)."""
    return attach(spec_schema_with_template(openapi_schema(TrainingJobSpec, "spec")), SPEC_RULES)


# The job's name goes into every pod's name and hostname, the Service's name and the pods' labels.
NAME_RULE = {"rule": JOB_NAME.cel("self.metadata.name"), "message": f"metadata.name {JOB_NAME.message}"}


def build_crd() -> dict[str, Any]:
    spec_schema = rules_spec_schema()
    status_schema = openapi_schema(TrainingJobStatus, "status")
    root = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": f"{API_VERSION}"},
            "kind": {"type": "string", "description": "TrainingJob"},
            # The API server takes nothing else here (NAME_RULE checks the name).
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
        "x-kubernetes-validations": [NAME_RULE],
    }
    columns = [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Ready", "type": "integer", "jsonPath": ".status.replicas.ready"},
        {"name": "Desired", "type": "integer", "jsonPath": ".status.replicas.desired"},
        {"name": "Spares", "type": "integer", "jsonPath": ".status.spares"},
        {"name": "Step", "type": "integer", "jsonPath": ".status.step"},
        {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": SINGULAR, "kind": "TrainingJob", "listKind": "TrainingJobList",
                      "shortNames": [SHORT_NAME], "categories": ["all", "flywheel"]},
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "schema": {"openAPIV3Schema": root},
                "subresources": {
                    "status": {},
                    "scale": {"specReplicasPath": ".spec.replicas.target",
                              "statusReplicasPath": ".status.replicas.current",
                              "labelSelectorPath": ".status.selector"},
                },
                "additionalPrinterColumns": columns,
            }],
        },
    }


# The API server stores objects of at most 1 MiB (etcd's request limit, 1.5 MiB, less room); client-side
# `kubectl apply` copies the whole object into the last-applied-configuration annotation, and all annotations
# together may hold 256 KiB.
MAX_OBJECT_BYTES = 1024 * 1024
MAX_ANNOTATION_BYTES = 256 * 1024


def crd_sizes() -> dict[str, int]:
    """The CRD's size as stored (compact JSON) and as the last-applied annotation of client-side `kubectl apply`
    (the same JSON plus its own metadata)."""
    crd = build_crd()
    stored = len(json.dumps(crd, separators=(",", ":")).encode())
    return {"object": stored, "lastApplied": stored + len(b'"metadata":{"annotations":{}},')}


def render_crd() -> str:
    header = "# Generated by `flywheel crd` from flywheel/spec/job.py. Do not edit by hand.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)


def write_crd(path: str | Path = DEFAULT_PATH) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_crd())
    return path


SPEC_DOC_PATH = Path("docs") / "spec.md"
# Described as one row each: the pod template's fields are the Pod API's (`kubectl explain`).
_REFERENCE_LEAVES = {"spec.template"}


def _reference_rows(node: dict[str, Any], path: str) -> list[str]:
    rows = []
    for key, sub in node.get("properties", {}).items():
        field = f"{path}.{key}"
        if "properties" in sub and field not in _REFERENCE_LEAVES:
            rows.extend(_reference_rows(sub, field))
            continue
        kind = sub.get("type", "object") + ("[]" if sub.get("type") == "array" else "")
        if "enum" in sub:
            kind = " \\| ".join(str(v) for v in sub["enum"])
        default = f"`{yaml.safe_dump(sub['default']).strip().removesuffix('...').strip()}`" if "default" in sub else ""
        text = sub.get("description", "").replace("|", "\\|")
        rows.append(f"| `{field}` | {kind} | {default} | {text} |")
    return rows


def render_spec_reference() -> str:
    """docs/spec.md: every spec field with its type, default and meaning (generated, like crds/)."""
    lines = ["<!-- Generated by `flywheel crd` from flywheel/spec/job.py. Do not edit by hand. -->",
             "# TrainingJob spec reference", "",
             f"`apiVersion: {API_VERSION}`, `kind: TrainingJob`, short name `{SHORT_NAME}`. Cross-field rules (also "
             "CEL rules in the CRD where CEL can decide them, see flywheel/layout/rules.py): replicas.min <= max; "
             "tp x pp and tp x pp x ep divide every world size; globalBatch is a multiple of microBatch x dp at "
             "every replica count; tp and ep need fsdp; model.dim is divisible by model.heads. On a cluster only "
             "(`flywheel run` on one machine does not ask it): replicas.max > 1 needs checkpoint.claimName, an "
             "object-store checkpoint.dir (scheme://...) or checkpoint.ephemeral: true. What the worker pods copy "
             f"(metadata.name, a DNS-1035 label of at most {MAX_NAME_LENGTH} characters; image, resources, "
             "accelerator.resource, scheduling.*, template) is held to the Pod API's rules at `kubectl apply` and by "
             "`flywheel run/plan` (flywheel/spec/pod_rules/rules.py; docs/operator.md).", "",
             "| field | type | default | meaning |", "|---|---|---|---|"]
    lines += _reference_rows(spec_schema_with_template(openapi_schema(TrainingJobSpec, "spec")), "spec")
    return "\n".join(lines) + "\n"


def write_spec_reference(path: str | Path = SPEC_DOC_PATH) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_spec_reference())
    return path
