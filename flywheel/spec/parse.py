"""A TrainingJob from YAML or a mapping, checked: pydantic's errors as one line each naming the field, the rules only
a cluster applies (`parse_cluster_job`), the local paths a run on this machine reads and writes, and the spec as the
workers receive it (`FLYWHEEL_SPEC`)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from flywheel.data.shards import source_problem
from flywheel.layout.rules import Problem
from flywheel.spec import storage as object_store
from flywheel.spec.job import SpecError, TrainingJob, TrainingJobSpec
from flywheel.spec.storage import CheckpointStorage, cluster_storage_problems

_NESTED_FIELD = re.compile(r"^([a-zA-Z]+(?:\.[a-zA-Z]+)+): (.*)$", re.S)
# A spec-level rule that names a field with indices or resource names ("template.spec.containers[0].env[1].name",
# "resources.limits.nvidia.com/gpu") or a top-level one ("image").
_SPEC_FIELD = re.compile(r"^((?:image|resources|template|accelerator|network|scheduling|faultTolerance|trainer)"
                         r"(?:[.\[].*?)?): (.*)$", re.S)


def _field_path(loc: tuple[Any, ...]) -> str:
    # pydantic reports model-level validators under the model's own location; drop validator tags.
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))]
    return ".".join(parts) or "(document)"


def _problems(err: ValidationError) -> list[str]:
    out = []
    for e in err.errors():
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field; check its spelling against `flywheel crd` or docs/spec.md"
        elif e["type"] == "missing":
            msg = "required field is missing; add it"
        path = _field_path(e["loc"])
        for line in msg.split("\n"):
            nested = _NESTED_FIELD.match(line) or _SPEC_FIELD.match(line)
            if nested:  # a cross-field validator names the sub-field itself: "trainer.training.globalBatch: ..."
                out.append(f"{path}.{nested.group(1)}: {nested.group(2)}".removeprefix("(document)."))
            else:
                out.append(f"{path}: {line}")
    return out


def parse_job(doc: Any) -> TrainingJob:
    """Validate a TrainingJob document (a dict as loaded from YAML). Raises SpecError naming each bad field."""
    if not isinstance(doc, dict):
        raise SpecError(["(document): expected a mapping with apiVersion, kind, metadata and spec"])
    try:
        return TrainingJob.model_validate(doc)
    except ValidationError as err:
        raise SpecError(_problems(err)) from None


def cluster_problems(spec: TrainingJobSpec) -> list[Problem]:
    """The rules of the cluster executor only (the local runner's workers share one disk): checkpoint storage."""
    ckpt = spec.checkpoint
    return cluster_storage_problems(CheckpointStorage(replicas_max=spec.replicas.max, claim_name=ckpt.claim_name,
                                                      directory=ckpt.dir, ephemeral=ckpt.ephemeral))


def parse_cluster_job(doc: Any) -> TrainingJob:
    """parse_job, plus the rules that hold on a cluster only (the operator's validation, before any pod)."""
    job = parse_job(doc)
    problems = cluster_problems(job.spec)
    if problems:
        raise SpecError([f"spec.{p}" for p in problems])
    return job


def parse_spec(doc: Any) -> TrainingJobSpec:
    """Validate just a `spec` mapping (as handed to workers in FLYWHEEL_SPEC)."""
    try:
        return TrainingJobSpec.model_validate(doc)
    except ValidationError as err:
        raise SpecError([f"spec.{p}" for p in _problems(err)]) from None


def load_job(path: str | os.PathLike[str]) -> TrainingJob:
    """Read and validate one TrainingJob YAML file."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise SpecError([f"(file): cannot read {path}: {err.strerror}"]) from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SpecError([f"(file): {path} is not valid YAML: {err}"]) from None
    return parse_job(doc)


def check_local_paths(job: TrainingJob, checkpoint_dir: str | None = None) -> None:
    """Checks that only make sense on the machine that runs the job: data exists, checkpoint dir is writable."""
    problems = []
    data = job.spec.trainer.data
    if not job.spec.command:
        problems += [p for p in (source_problem(data.source),
                                 data.validation and source_problem(data.validation, "validation")) if p]
    directory = checkpoint_dir or job.spec.checkpoint.dir
    store_problem = object_store.storage_problem(directory)
    if store_problem:
        problems.append(store_problem)
    ckpt = Path(object_store.local_dir(directory, job.spec.checkpoint.local_dir))
    probe = ckpt
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK) or not probe.is_dir():
        field = "localDir" if object_store.is_url(directory) else "dir"
        problems.append(f"spec.checkpoint.{field}: {str(ckpt)!r} is not writable (checked {probe}); point it at a "
                        "writable directory")
    if problems:
        raise SpecError(problems)


def spec_to_env_json(spec: TrainingJobSpec) -> str:
    """The FLYWHEEL_SPEC value: the spec (the trainer reads trainer, checkpoint and faultTolerance) without the pod
    template, which the pod itself carries out (and which may be large)."""
    return json.dumps(spec.model_dump(by_alias=True, mode="json", exclude={"template"}), sort_keys=True,
                      separators=(",", ":"))
