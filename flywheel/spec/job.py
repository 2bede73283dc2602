"""The TrainingJob schema: defaults, validation, and the one source of the CRD schema.

Every error names the field (camelCase path, as written in YAML) and how to fix it. The cross-field layout rules
are `layout/rules.py`'s (one definition, also used by the planner and the trainer), checked here at every replica
count; the CRD's CEL rules (`spec/crd/generate.py`) mirror the ones a Kubernetes API server can check. The parallel
layout and MoE models live in `spec/parallel.py`, the status subresource in `spec/status.py`; both are re-exported here,
so the rest of Flywheel imports the schema from `flywheel.spec.job` alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from flywheel.data.tokenizers import tokenizer_vocab
from flywheel.layout.rules import (
    BYTE_VOCAB,
    JobLayout,
    Problem,
    data_problems,
    job_problems,
    model_problems,
)
from flywheel.layout.shape import PRESETS as MODEL_PRESETS
from flywheel.layout.shape import ModelShape, MoEConfig
from flywheel.planner.devices import DEVICES
from flywheel.planner.search import PlanError
from flywheel.spec.auto_view import AutoView, auto_layout, pretrained_model_shape, sized_rules
from flywheel.spec.base import _Model
from flywheel.spec.k8s_syntax import DNS_LABEL
from flywheel.spec.object_names import MAX_NAME_LENGTH as MAX_NAME_LENGTH  # re-exported: the CRD states it
from flywheel.spec.object_names import MAX_REPLICAS
from flywheel.spec.parallel import MoESpec, Parallelism
from flywheel.spec.pod import RESOURCES_SCHEMA, PodView, is_default, planner_device, pod_problems
from flywheel.spec.pod import Accelerator as Accelerator
from flywheel.spec.pod_rules.rules import JOB_NAME
from flywheel.spec.sections import CheckpointSpec as CheckpointSpec
from flywheel.spec.sections import Data as Data
from flywheel.spec.sections import FaultTolerance as FaultTolerance
from flywheel.spec.sections import RunPolicy as RunPolicy
from flywheel.spec.sections import Scheduling as Scheduling
from flywheel.spec.sections import Training as Training
from flywheel.spec.sections import eval_data_problem
from flywheel.spec.status import (  # noqa: F401 (re-exported: flywheel.spec.job is the schema's one import)
    CheckpointStatus,
    Condition,
    GoodputStatus,
    ReplicaStatus,
    RestartBudgetStatus,
    TrainingJobStatus,
)

API_VERSION = "flywheel.dev/v1alpha1"
KIND = "TrainingJob"

# The presets' sizes by their spec names (layers, dim, heads, vocab, seqLen); the full shapes, llama settings
# included, are flywheel.layout.shape.PRESETS.
PRESETS: dict[str, dict[str, int]] = {
    name: {"layers": s.layers, "dim": s.dim, "heads": s.heads, "vocab": s.vocab, "seqLen": s.seq_len}
    for name, s in MODEL_PRESETS.items()}



class SpecError(ValueError):
    """A TrainingJob that cannot run. `problems` holds one message per bad field."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid TrainingJob:\n" + "\n".join(f"  - {p}" for p in problems))


class Replicas(_Model):
    """Workers (pods). Elastic when min < max; `target` is what `kubectl scale` sets (defaults to max)."""

    min: int = Field(1, ge=1, le=MAX_REPLICAS, description="Fewest workers the job runs with.")
    max: int = Field(1, ge=1, le=MAX_REPLICAS, description="Most workers the job runs with.")
    target: int | None = Field(None, ge=1, le=MAX_REPLICAS,
                               description="Desired workers within [min, max]; set by kubectl scale.")
    spares: int = Field(0, ge=0, le=MAX_REPLICAS, description="Warm spare workers kept beside the workers (started, "
                        "trainer imported, "
                        "out of the rendezvous): a lost worker is replaced by promoting one to its replica index "
                        "instead of starting a cold pod. Their resources count in gang and Kueue requests.")

    @model_validator(mode="after")
    def _ordered(self) -> Replicas:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max}); set min <= max")
        if self.target is not None and not self.min <= self.target <= self.max:
            raise ValueError(f"target ({self.target}) is outside [min, max] = [{self.min}, {self.max}]; "
                             "scale within the bounds or widen them")
        return self

    @property
    def desired(self) -> int:
        return self.max if self.target is None else self.target


class ModelSpec(_Model):
    """A decoder (architecture gpt or llama): a preset, optionally with explicit sizes that override it, or a
    Hugging Face model directory (`pretrained`)."""

    preset: str | None = Field("gpt-tiny", description=f"One of {', '.join(PRESETS)} (gpt-*: GPT-2 style, llama*: "
                                                       "Llama style; docs/models.md).")
    layers: int | None = Field(None, ge=1, description="Transformer blocks; overrides the preset.")
    dim: int | None = Field(None, ge=8, description="Model width; overrides the preset.")
    heads: int | None = Field(None, ge=1, description="Attention heads; must divide dim.")
    kv_heads: int | None = Field(None, ge=1, description="Key/value heads (grouped-query attention, llama "
                                                         "presets); must divide heads. Default: the preset's.")
    ffn: int | None = Field(None, ge=1, description="MLP width; default: the preset's (gpt: 4 x dim).")
    vocab: int | None = Field(None, ge=2, description="Vocabulary size (>= 256 for byte-level text).")
    seq_len: int | None = Field(None, ge=2, description="Tokens per sample (with pretrained: default the model's "
                                                        "positions, at most 2048).")
    moe: MoESpec | None = Field(None, description="Mixture of experts (e.g. {experts: 8, topK: 2}); null: dense.")
    pretrained: str | None = Field(None, min_length=1, description="A local Hugging Face model directory "
                                   "(config.json + safetensors): architecture, sizes and initial weights come "
                                   "from it (Llama, Mistral, Qwen2, GPT-2). Only seqLen may be set beside it.")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str | None) -> str | None:
        if v is not None and v not in PRESETS:
            raise ValueError(f"unknown preset {v!r}; use one of {', '.join(PRESETS)} or give layers/dim/heads/"
                             "vocab/seqLen explicitly with preset: null")
        return v

    @model_validator(mode="after")
    def _complete(self) -> ModelSpec:
        if self.pretrained is not None:
            sizes = {"layers": self.layers, "dim": self.dim, "heads": self.heads, "kvHeads": self.kv_heads,
                     "ffn": self.ffn, "vocab": self.vocab, "moe": self.moe}
            clash = [k for k, v in sizes.items() if v is not None]
            if "preset" in self.model_fields_set and self.preset is not None:
                clash.insert(0, "preset")
            if clash:
                raise ValueError(f"pretrained: the architecture and sizes come from {self.pretrained}/config.json; "
                                 f"remove {', '.join(clash)} (only seqLen may be set beside pretrained)")
            self.preset = None  # not the default gpt-tiny: nothing of a preset applies
            return self
        dims = self.resolved()
        missing = [k for k, v in dims.items() if v is None]
        if missing:
            raise ValueError(f"no preset and missing {', '.join(missing)}; set a preset or give every size")
        return self

    def resolved(self) -> dict[str, Any]:
        """Sizes with explicit fields overriding the preset: layers, dim, heads, vocab, seqLen (None where neither
        gives one). Not for a pretrained model, whose sizes are in its config.json."""
        base: dict[str, Any] = dict(PRESETS[self.preset]) if self.preset else {}
        for key in ("layers", "dim", "heads", "vocab"):
            if getattr(self, key) is not None:
                base[key] = getattr(self, key)
        if self.seq_len is not None:
            base["seqLen"] = self.seq_len
        return {k: base.get(k) for k in ("layers", "dim", "heads", "vocab", "seqLen")}

    def shape(self) -> ModelShape:
        """The model to build: the preset's shape with the explicit sizes applied (a gpt's MLP width and positions
        follow dim and seqLen unless given). A pretrained model's shape comes from its config.json instead
        (`flywheel.layout.hf_config`)."""
        if self.pretrained is not None:
            raise ValueError("trainer.model.pretrained: the shape is read from config.json, not the spec")
        sizes = self.resolved()
        given = {"layers": self.layers, "dim": self.dim, "heads": self.heads, "kv_heads": self.kv_heads,
                 "ffn": self.ffn, "vocab": self.vocab, "seq_len": self.seq_len}
        overrides: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        moe = (MoEConfig(experts=self.moe.experts, top_k=self.moe.top_k, every=self.moe.every,
                         aux_loss_weight=self.moe.aux_loss_weight, capacity_factor=self.moe.capacity_factor)
               if self.moe else None)
        if not self.preset:
            return ModelShape(layers=sizes["layers"], dim=sizes["dim"], heads=sizes["heads"], vocab=sizes["vocab"],
                              seq_len=sizes["seqLen"], kv_heads=self.kv_heads or 0, ffn=self.ffn or 0, moe=moe)
        base = MODEL_PRESETS[self.preset]
        if base.architecture == "gpt":  # 0: derived again from the new sizes
            overrides = {"ffn": 0, "max_positions": 0, "kv_heads": 0, **overrides}
        return dataclasses.replace(base, moe=moe, **overrides)


class TrainerSpec(_Model):
    """The built-in trainer: the model, its parallel layout, the training hyperparameters and the data (ignored
    with `command`, except by a user entrypoint that reads them)."""

    model: ModelSpec = Field(default_factory=ModelSpec)
    parallelism: Parallelism = Field(default_factory=Parallelism)
    training: Training = Field(default_factory=Training)
    data: Data = Field(default_factory=Data)

    @model_validator(mode="after")
    def _evaluation_has_data(self) -> TrainerSpec:
        problem = eval_data_problem(self.training.eval_every_steps, self.data)
        if problem:
            raise ValueError(problem)
        return self

    def layout(self) -> JobLayout:
        """What the layout rules (layout/rules.py) read: the model's shape, degrees, batch, data source. A
        pretrained model's sizes are in its config.json: the rules on them wait for the trainer's preflight."""
        moe, par, tr = self.model.moe, self.parallelism, self.training
        common = dict(experts=moe.experts if moe else 0, top_k=moe.top_k if moe else 0,
                      moe_every=moe.every if moe else 1, tp=par.tp, pp=par.pp, ep=par.ep, fsdp=par.fsdp,
                      schedule=par.schedule, stages_per_rank=par.stages_per_rank, microbatches=par.microbatches,
                      global_batch=tr.global_batch, micro_batch=tr.micro_batch, data_source=self.data.source,
                      tokenizer_vocab=tokenizer_vocab(self.data.tokenizer), chunked_loss=tr.chunked_loss)
        if self.model.pretrained is not None:
            return JobLayout(layers=1, dim=1, heads=1, vocab=BYTE_VOCAB, seq_len=self.model.seq_len or 2,
                             pretrained=True, **common)  # type: ignore[arg-type]
        shape = self.model.shape()
        return JobLayout(layers=shape.layers, dim=shape.dim, heads=shape.heads, vocab=shape.vocab,
                         seq_len=shape.seq_len, architecture=shape.architecture, kv_heads=shape.kv_heads,
                         ffn=shape.ffn, max_positions=shape.max_positions, **common)  # type: ignore[arg-type]


class TrainingJobSpec(_Model):
    """The desired state of a TrainingJob: its workers, the trainer, checkpoints, fault tolerance and
    scheduling."""

    image: str = Field("flywheel:latest", description="Worker image (cluster only).")
    replicas: Replicas = Field(default_factory=Replicas)
    procs_per_replica: int = Field(1, ge=1, description="Local ranks per worker (GPUs per pod).")
    resources: dict[str, Any] = Field(default_factory=dict, json_schema_extra=RESOURCES_SCHEMA,
                                      description="Per-worker requests/limits (cluster only).")
    shm_size: str = Field("1Gi", pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$",
                          description="Cluster only: size of the in-memory /dev/shm of each worker (dataloaders).")
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    command: list[str] = Field(default_factory=list, description="A user entrypoint instead of the trainer.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    fault_tolerance: FaultTolerance = Field(default_factory=FaultTolerance)
    scheduling: Scheduling = Field(default_factory=Scheduling)
    suspend: bool = Field(False, description="Stop the workers, keeping checkpoints; false resumes.")
    run_policy: RunPolicy = Field(default_factory=RunPolicy)
    template: dict[str, Any] = Field(
        default_factory=dict, description="Cluster only: a core/v1 PodTemplateSpec (metadata labels/annotations and "
        "a pod spec) applied to every worker pod: tolerations, nodeSelector, affinity, volumes, imagePullSecrets, "
        "serviceAccountName, securityContext, init containers and sidecars pass through; the container named worker "
        "(else the first) is merged with the operator's (env, envFrom, volumeMounts, resources, securityContext "
        "field by field, ports, lifecycle). The operator's restartPolicy, hostname, subdomain, the worker's "
        "command/args and contract env are refused, as are Kueue's pod-group labels (use scheduling.queue) and a "
        "schedulerName under scheduling.gang (use scheduling.schedulerName) (docs/operator.md).")
    accelerator: Accelerator | None = Field(
        None, description="Cluster only: the device of each local rank, e.g. {resource: nvidia.com/gpu, device: "
        "h100}: every worker requests and limits procsPerReplica of it, and the planner sizes layouts for the "
        "device. Unset: CPUs.")
    network: Literal["tcp", "rdma"] = Field(
        "tcp", description="Cluster only: rdma adds IPC_LOCK and the cluster's RDMA device resource (the operator's "
                           "--rdma-resource) to every worker, for NCCL over InfiniBand/RoCE.")

    @model_validator(mode="after")
    def _layout_fits(self) -> TrainingJobSpec:
        problems = [str(p) for p in layout_problems_of(self)] + pod_problems(self.pod_view())
        if problems:  # one line per problem, each "field: what; fix" (split again by _problems)
            raise ValueError("\n".join(problems))
        return self

    def pod_view(self) -> PodView:
        """What the pod rules (spec/pod.py) read of this spec."""
        par, grace = self.trainer.parallelism, self.fault_tolerance.termination_grace_seconds
        return PodView(
            image=None if is_default(self, "image") else self.image, resources=self.resources,
            template=self.template, checkpoint_dir=self.checkpoint.dir, scheduling=self.scheduling,
            grace_seconds=None if is_default(self.fault_tolerance, "termination_grace_seconds") else grace,
            accelerator=self.accelerator, procs_per_replica=self.procs_per_replica, auto=par.auto,
            device=par.device, document=lambda: self.model_dump(by_alias=True, mode="json"))

    def auto_view(self) -> AutoView:
        """What the planner reads of this spec (spec/auto_view.py). A pretrained model's config.json is read here:
        PlanError, naming the field, if it cannot be."""
        model, trainer = self.trainer.model, self.trainer
        shape = pretrained_model_shape(model.pretrained, model.seq_len) if model.pretrained else model.shape()
        return AutoView(shape=shape, rules=sized_rules(trainer.layout(), shape), parallelism=trainer.parallelism,
                        training=trainer.training, replicas_min=self.replicas.min, replicas_max=self.replicas.max,
                        procs_per_replica=self.procs_per_replica, world_sizes=self.world_sizes())

    def world_sizes(self) -> range:
        """Every world size the job may run at (elastic jobs resize between these)."""
        return range(self.replicas.min * self.procs_per_replica,
                     self.replicas.max * self.procs_per_replica + 1, self.procs_per_replica)


def layout_problems_of(spec: TrainingJobSpec) -> list[Problem]:
    """The layout rules (layout/rules.py) for this job at every replica count in [min, max]. A user command owns
    its parallelism: only the model's shape is checked. `parallelism.auto` runs the planner on the job's device
    profile now, so a job no layout can serve is refused here, not retried where it runs."""
    layout = spec.trainer.layout()
    problems = model_problems(layout)
    if spec.command or problems:
        return problems
    problems = data_problems(layout)
    if spec.trainer.parallelism.auto:
        if not problems:
            try:
                auto_layout(spec.auto_view(), DEVICES[planner_device(spec.pod_view())])
            except PlanError as err:
                problems.append(err.problem)
        return problems
    return problems + job_problems(layout, range(spec.replicas.min, spec.replicas.max + 1), spec.procs_per_replica)


class Metadata(_Model):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str
    namespace: str = "default"

    @field_validator("name")
    @classmethod
    def _dns_name(cls, v: str) -> str:
        if not JOB_NAME.ok(v):
            raise ValueError(f"{v!r} {JOB_NAME.message}")
        return v

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str) -> str:
        if not DNS_LABEL.ok(v):
            raise ValueError(f"{v!r} {DNS_LABEL.message}")
        return v


class TrainingJob(_Model):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")
    api_version: str = API_VERSION
    kind: str = KIND
    metadata: Metadata
    spec: TrainingJobSpec = Field(default_factory=TrainingJobSpec)

    @field_validator("api_version")
    @classmethod
    def _api_version(cls, v: str) -> str:
        if v != API_VERSION:
            raise ValueError(f"{v!r} is not supported; use apiVersion: {API_VERSION}")
        return v

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v != KIND:
            raise ValueError(f"{v!r} is not a {KIND}; use kind: {KIND}")
        return v

    @property
    def name(self) -> str:
        return self.metadata.name
