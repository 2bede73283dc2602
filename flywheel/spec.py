"""The TrainingJob schema: defaults, validation, and the one source of the CRD schema.

Every error names the field (camelCase path, as written in YAML) and how to fix it. Cross-field rules that a
Kubernetes API server can also check are mirrored as CEL rules in `crd.py`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

API_VERSION = "flywheel.dev/v1alpha1"
KIND = "TrainingJob"

# Model presets: gpt-tiny is for CPU tests; the others are the usual GPT-2/3-style sizes.
PRESETS: dict[str, dict[str, int]] = {
    "gpt-tiny": {"layers": 2, "dim": 64, "heads": 4, "vocab": 256, "seqLen": 64},
    "gpt-125m": {"layers": 12, "dim": 768, "heads": 12, "vocab": 50304, "seqLen": 1024},
    "gpt-350m": {"layers": 24, "dim": 1024, "heads": 16, "vocab": 50304, "seqLen": 1024},
    "gpt-1.3b": {"layers": 24, "dim": 2048, "heads": 16, "vocab": 50304, "seqLen": 2048},
}

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_LENGTH = 48  # leaves room for "-worker-NNN" inside the 63-character DNS label limit


class SpecError(ValueError):
    """A TrainingJob that cannot run. `problems` holds one message per bad field."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid TrainingJob:\n" + "\n".join(f"  - {p}" for p in problems))


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              validate_default=True)


class Replicas(_Model):
    """Workers (pods). Elastic when min < max; `target` is what `kubectl scale` sets (defaults to max)."""

    min: int = Field(1, ge=1, description="Fewest workers the job runs with.")
    max: int = Field(1, ge=1, description="Most workers the job runs with.")
    target: int | None = Field(None, ge=1, description="Desired workers within [min, max]; set by kubectl scale.")

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


class MoESpec(_Model):
    """A mixture-of-experts feed-forward (top-k routed expert MLPs with a load-balancing loss) in place of the
    dense MLP of every `every`-th block."""

    experts: int = Field(8, ge=2, description="Expert MLPs per MoE layer (each as wide as the dense MLP).")
    top_k: int = Field(2, ge=1, description="Experts each token is routed to (top-k of the router's softmax; the "
                                            "k gates are renormalised to sum to 1 when topK > 1).")
    every: int = Field(1, ge=1, description="MoE in every N-th block (0-based blocks N-1, 2N-1, ...): 1 all blocks, "
                                            "2 every other block as in Switch/GShard; the others keep the dense MLP.")
    aux_loss_weight: float = Field(0.01, ge=0, description="Weight of the load-balancing loss (Switch Transformer: "
                                                           "experts x sum_i f_i P_i, summed over MoE layers) added "
                                                           "to the training loss; 0 disables it.")
    capacity_factor: float | None = Field(None, gt=0, description="Caps each expert at ceil(capacityFactor x tokens "
                                          "x topK / experts) routed tokens per micro batch; later tokens (second "
                                          "choices after all first choices) skip the layer. null: no cap, no token "
                                          "is dropped.")

    @model_validator(mode="after")
    def _k_fits(self) -> MoESpec:
        if self.top_k > self.experts:
            raise ValueError(f"topK ({self.top_k}) is more than experts ({self.experts}); route to at most every "
                             "expert")
        return self


class ModelSpec(_Model):
    """A GPT-style decoder: a preset, optionally with explicit sizes that override it."""

    preset: str | None = Field("gpt-tiny", description=f"One of {', '.join(PRESETS)}.")
    layers: int | None = Field(None, ge=1, description="Transformer blocks; overrides the preset.")
    dim: int | None = Field(None, ge=8, description="Model width; overrides the preset.")
    heads: int | None = Field(None, ge=1, description="Attention heads; must divide dim.")
    vocab: int | None = Field(None, ge=2, description="Vocabulary size (>= 256 for byte-level text).")
    seq_len: int | None = Field(None, ge=2, description="Tokens per sample.")
    moe: MoESpec | None = Field(None, description="Mixture of experts (e.g. {experts: 8, topK: 2}); null: dense.")

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, v: str | None) -> str | None:
        if v is not None and v not in PRESETS:
            raise ValueError(f"unknown preset {v!r}; use one of {', '.join(PRESETS)} or give layers/dim/heads/"
                             "vocab/seqLen explicitly with preset: null")
        return v

    @model_validator(mode="after")
    def _complete(self) -> ModelSpec:
        dims = self.resolved()
        missing = [k for k, v in dims.items() if v is None]
        if missing:
            raise ValueError(f"no preset and missing {', '.join(missing)}; set a preset or give every size")
        if dims["dim"] % dims["heads"]:
            raise ValueError(f"dim ({dims['dim']}) is not divisible by heads ({dims['heads']}); "
                             "pick heads that divide dim")
        if self.moe is not None and self.moe.every > dims["layers"]:
            raise ValueError(f"moe.every: {self.moe.every} is more than layers ({dims['layers']}), so no block "
                             "would get experts; lower every")
        return self

    def resolved(self) -> dict[str, Any]:
        """Sizes with explicit fields overriding the preset: layers, dim, heads, vocab, seqLen."""
        base: dict[str, Any] = dict(PRESETS[self.preset]) if self.preset else {}
        for key in ("layers", "dim", "heads", "vocab"):
            if getattr(self, key) is not None:
                base[key] = getattr(self, key)
        if self.seq_len is not None:
            base["seqLen"] = self.seq_len
        return {k: base.get(k) for k in ("layers", "dim", "heads", "vocab", "seqLen")}


class Parallelism(_Model):
    tp: int = Field(1, ge=1, description="Tensor-parallel degree.")
    pp: int = Field(1, ge=1, description="Pipeline-parallel degree.")
    fsdp: bool = Field(True, description="Shard parameters/grads/optimizer with FSDP2; false means DDP.")
    zero: int = Field(3, ge=2, le=3, description="With fsdp: ZeRO stage 3 reshards parameters after forward; 2 "
                                                 "keeps them unsharded until backward (grads/optimizer sharded).")
    microbatches: int | None = Field(None, ge=1, description="With pp > 1: micro batches (of microBatch samples) in "
                                     "one pipeline schedule run. Default: all of a dp rank's micro batches in one run "
                                     "(globalBatch / (dp x microBatch)), the smallest bubble; a divisor of that count "
                                     "splits each step into several runs with gradient accumulation.")
    schedule: Literal["gpipe", "1f1b", "interleaved-1f1b"] = Field(
        "1f1b", description="Pipeline schedule with pp > 1. interleaved-1f1b needs stagesPerRank >= 2.")
    stages_per_rank: int = Field(1, ge=1, description="Pipeline stages (virtual stages) per pp rank, looped: stage s "
                                                      "runs on pp rank s mod pp. Above 1 only with interleaved-1f1b.")
    ep: int = Field(1, ge=1, description="Expert-parallel degree (MoE models): each MoE layer's experts are split "
                                         "over ep ranks taken from the data-parallel ranks (ep divides dp = world / "
                                         "(tp x pp)); tokens reach their experts by all-to-all. Needs fsdp.")
    auto: bool = Field(False, description="Let the planner choose the layout.")

    @model_validator(mode="after")
    def _schedule_fits(self) -> Parallelism:
        if self.stages_per_rank > 1 and self.schedule != "interleaved-1f1b":
            raise ValueError(f"stagesPerRank: {self.stages_per_rank} stages per rank need schedule: "
                             f"interleaved-1f1b (not {self.schedule}); set stagesPerRank: 1 or change the schedule")
        if self.schedule == "interleaved-1f1b" and self.stages_per_rank < 2:
            raise ValueError("stagesPerRank: interleaved-1f1b needs stagesPerRank >= 2; set stagesPerRank: 2 or use "
                             "schedule: 1f1b")
        return self

    def pipeline_problem(self, layers: int, local_microbatches: int) -> str | None:
        """What keeps this pipeline layout from running (None if nothing), given the model's layers and the micro
        batches each dp rank runs per step (globalBatch / (dp x microBatch)). Names the field and the fix."""
        if self.pp == 1:
            return None
        stages = self.pp * self.stages_per_rank
        if layers % stages:
            return (f"trainer.parallelism.pp: {layers} layers do not split evenly into pp x stagesPerRank = {stages} "
                    "stages; choose pp and stagesPerRank whose product divides trainer.model.layers")
        per_run = self.microbatches or local_microbatches
        if local_microbatches % per_run:
            return (f"trainer.parallelism.microbatches: {per_run} does not divide the {local_microbatches} micro "
                    "batches per dp rank and step (globalBatch / (dp x microBatch)); pick a divisor or leave it unset")
        if self.schedule == "1f1b" and per_run < self.pp:
            return (f"trainer.parallelism.microbatches: 1f1b needs at least pp = {self.pp} micro batches per run, "
                    f"got {per_run}; raise globalBatch or microbatches, or lower microBatch")
        if self.schedule == "interleaved-1f1b" and per_run % max(1, per_run // self.pp):
            return (f"trainer.parallelism.microbatches: interleaved-1f1b runs {per_run} micro batches in rounds of "
                    f"pp = {self.pp}; make the count a multiple of pp or smaller than it")
        return None


class Training(_Model):
    steps: int = Field(200, ge=1, description="Optimizer steps to train.")
    global_batch: int = Field(32, ge=1, description="Samples per optimizer step across all data-parallel ranks.")
    micro_batch: int = Field(4, ge=1, description="Samples per forward/backward on one rank.")
    lr: float = Field(3e-4, gt=0, le=10, description="Peak learning rate (AdamW).")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine floor as a fraction of lr.")
    warmup_steps: int = Field(10, ge=0, description="Linear warmup steps before the cosine decay.")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay on 2-D weights.")
    grad_clip: float = Field(1.0, ge=0, description="Max gradient norm; 0 disables clipping.")
    precision: Literal["fp32", "bf16"] = Field("fp32", description="bf16 autocasts where the device supports it.")
    seed: int = Field(0, ge=0, description="Seeds model init and data order.")
    activation_checkpointing: bool = Field(False, description="Recompute block activations in backward.")
    deterministic: bool = Field(True, description="Deterministic algorithms (needed for bitwise-exact resume).")


class Data(_Model):
    source: str = Field("synthetic", description="'synthetic', or a path to a text file (.txt, byte tokens) "
                                                 "or a token file (.npy / .bin of uint16).")

    @property
    def is_synthetic(self) -> bool:
        return self.source == "synthetic"

    @field_validator("source")
    @classmethod
    def _known_format(cls, v: str) -> str:
        if v != "synthetic" and Path(v).suffix not in (".txt", ".npy", ".bin"):
            raise ValueError(f"{v!r} is neither 'synthetic' nor a .txt/.npy/.bin file; convert the data or use "
                             "source: synthetic")
        return v


class TrainerSpec(_Model):
    model: ModelSpec = Field(default_factory=ModelSpec)
    parallelism: Parallelism = Field(default_factory=Parallelism)
    training: Training = Field(default_factory=Training)
    data: Data = Field(default_factory=Data)

    @model_validator(mode="after")
    def _experts_fit(self) -> TrainerSpec:
        moe, par = self.model.moe, self.parallelism
        if moe is None:
            if par.ep > 1:
                raise ValueError(f"parallelism.ep: ep = {par.ep} splits experts, but the model has none; set "
                                 "model.moe (e.g. {experts: 8, topK: 2}) or ep: 1")
            return self
        if moe.experts % par.ep:
            raise ValueError(f"parallelism.ep: ep = {par.ep} does not divide model.moe.experts ({moe.experts}); pick "
                             "an ep that divides the number of experts")
        if par.ep > 1 and not par.fsdp:
            raise ValueError(f"parallelism.fsdp: ep = {par.ep} needs fsdp: true (DDP cannot replicate the "
                             "expert-parallel DTensor parameters); set fsdp: true or ep: 1")
        if par.pp > 1:
            raise ValueError(f"parallelism.pp: an MoE model runs with pp: 1 (got {par.pp}); its load-balancing loss "
                             "is not carried between pipeline stages. Use dp, tp and ep, or a dense model")
        return self


class CheckpointSpec(_Model):
    dir: str = Field("/ckpt", min_length=1, description="Shared by all workers; one subfolder per checkpoint.")
    every_steps: int = Field(50, ge=0, description="Save every N steps; 0 disables step-based saves.")
    every_seconds: float = Field(0, ge=0, description="Save when this many seconds passed since the last save.")
    keep: int = Field(3, ge=1, description="Committed checkpoints kept; older ones are deleted.")
    async_: bool = Field(True, alias="async", description="Write in the background; training blocks only to stage.")
    claim_name: str = Field("", description="Cluster only: a ReadWriteMany PersistentVolumeClaim mounted at `dir` "
                                            "in every worker. Empty: a per-pod emptyDir, which is lost with the pod.")


class FaultTolerance(_Model):
    max_restarts: int = Field(10, ge=0, description="Restarts allowed before the job fails.")
    budget_reset_after_steps: int = Field(100, ge=0, description="Committed steps after which restarts reset.")
    progress_timeout_seconds: float = Field(60, ge=0, description="No step for this long means hung; 0 disables.")
    first_step_timeout_seconds: float = Field(600, ge=1, description="Allowance for start-up and the first step.")
    restart_scope: Literal["job", "worker"] = Field("job", description="Recreate every worker or only the failed one.")
    node_failure_grace_seconds: float = Field(30, ge=0, description="Pods stuck on a dead node are force-deleted after this.")


class Scheduling(_Model):
    gang: bool = Field(True, description="Schedule all workers together (PodGroup).")
    scheduler_name: str = ""
    queue: str = ""
    priority_class_name: str = ""
    topology_key: str = ""


class RunPolicy(_Model):
    ttl_seconds_after_finished: int | None = Field(None, ge=0)
    active_deadline_seconds: int | None = Field(None, ge=1)


class TrainingJobSpec(_Model):
    image: str = Field("flywheel:latest", description="Worker image (cluster only).")
    replicas: Replicas = Field(default_factory=Replicas)
    procs_per_replica: int = Field(1, ge=1, description="Local ranks per worker (GPUs per pod).")
    resources: dict[str, Any] = Field(default_factory=dict, description="Per-worker requests/limits (cluster only).")
    shm_size: str = Field("1Gi", pattern=r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$",
                          description="Cluster only: size of the in-memory /dev/shm of each worker (dataloaders).")
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    command: list[str] = Field(default_factory=list, description="A user entrypoint instead of the trainer.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    fault_tolerance: FaultTolerance = Field(default_factory=FaultTolerance)
    scheduling: Scheduling = Field(default_factory=Scheduling)
    suspend: bool = Field(False, description="Stop the workers, keeping checkpoints; false resumes.")
    run_policy: RunPolicy = Field(default_factory=RunPolicy)

    @model_validator(mode="after")
    def _layout_fits(self) -> TrainingJobSpec:
        if self.command:
            return self
        par, tr = self.trainer.parallelism, self.trainer.training
        if par.auto:
            return self
        if tr.global_batch % tr.micro_batch:
            raise ValueError(f"trainer.training.globalBatch: {tr.global_batch} is not divisible by microBatch "
                             f"({tr.micro_batch}); make globalBatch a multiple of microBatch")
        model_parallel = par.tp * par.pp
        for n in range(self.replicas.min, self.replicas.max + 1):
            world = n * self.procs_per_replica
            if world % model_parallel:
                raise ValueError(f"trainer.parallelism.tp: tp*pp = {model_parallel} does not divide the world size "
                                 f"{world} ({n} replicas x {self.procs_per_replica} procsPerReplica); choose tp and "
                                 "pp whose product divides every world size in replicas [min, max]")
            dp = world // model_parallel
            if dp % par.ep:
                raise ValueError(f"trainer.parallelism.ep: ep = {par.ep} does not divide dp = {dp} (world {world} / "
                                 f"tp x pp = {model_parallel}) at {n} replicas; expert parallelism borrows from the "
                                 "data-parallel ranks, so choose an ep that divides dp at every world size")
            if tr.global_batch % (tr.micro_batch * dp):
                raise ValueError(f"trainer.training.globalBatch: {tr.global_batch} is not divisible by microBatch "
                                 f"x dp = {tr.micro_batch} x {dp} at {n} replicas; make globalBatch a multiple of "
                                 f"{tr.micro_batch * dp}")
            problem = par.pipeline_problem(self.trainer.model.resolved()["layers"],
                                           tr.global_batch // (tr.micro_batch * dp))
            if problem:
                raise ValueError(f"{problem} (at {n} replicas)")
        return self

    def world_sizes(self) -> range:
        """Every world size the job may run at (elastic jobs resize between these)."""
        return range(self.replicas.min * self.procs_per_replica,
                     self.replicas.max * self.procs_per_replica + 1, self.procs_per_replica)


class Metadata(_Model):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str
    namespace: str = "default"

    @field_validator("name")
    @classmethod
    def _dns_name(cls, v: str) -> str:
        if len(v) > MAX_NAME_LENGTH or not _DNS_LABEL.match(v):
            raise ValueError(f"{v!r} is not a DNS label of at most {MAX_NAME_LENGTH} characters; use lowercase "
                             "letters, digits and '-', starting and ending with a letter or digit")
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


_NESTED_FIELD = re.compile(r"^([a-zA-Z]+(?:\.[a-zA-Z]+)+): (.*)$", re.S)


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
        nested = _NESTED_FIELD.match(msg)
        if nested:  # a cross-field validator names the sub-field itself: "trainer.training.globalBatch: ..."
            path, msg = f"{path}.{nested.group(1)}", nested.group(2)
        out.append(f"{path}: {msg}")
    return out


def parse_job(doc: Any) -> TrainingJob:
    """Validate a TrainingJob document (a dict as loaded from YAML). Raises SpecError naming each bad field."""
    if not isinstance(doc, dict):
        raise SpecError(["(document): expected a mapping with apiVersion, kind, metadata and spec"])
    try:
        return TrainingJob.model_validate(doc)
    except ValidationError as err:
        raise SpecError(_problems(err)) from None


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
    source = job.spec.trainer.data.source
    if not job.spec.command and source != "synthetic" and not Path(source).is_file():
        problems.append(f"spec.trainer.data.source: {source!r} does not exist; give an existing file or 'synthetic'")
    ckpt = Path(checkpoint_dir or job.spec.checkpoint.dir)
    probe = ckpt
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not os.access(probe, os.W_OK) or not probe.is_dir():
        problems.append(f"spec.checkpoint.dir: {str(ckpt)!r} is not writable (checked {probe}); point it at a "
                        "writable directory")
    if problems:
        raise SpecError(problems)


def spec_to_env_json(spec: TrainingJobSpec) -> str:
    """The FLYWHEEL_SPEC value: the whole spec (the trainer reads trainer, checkpoint and faultTolerance)."""
    return json.dumps(spec.model_dump(by_alias=True, mode="json"), sort_keys=True, separators=(",", ":"))


class Condition(_Model):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str | None = None


class ReplicaStatus(_Model):
    desired: int = 0
    current: int = 0
    ready: int = 0


class CheckpointStatus(_Model):
    step: int = 0
    time: str | None = None
    path: str = ""


class GoodputStatus(_Model):
    ratio: float = 0.0
    productive_seconds: float = 0.0
    lost_steps: int = 0
    mean_time_to_recover_seconds: float = 0.0


class RestartBudgetStatus(_Model):
    used: int = 0
    window_start_step: int = 0


class TrainingJobStatus(_Model):
    """What the operator writes (status subresource). Also the shape the REST API serves."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")
    phase: Literal["Pending", "Running", "Restarting", "Succeeded", "Failed", "Suspended"] = "Pending"
    conditions: list[Condition] = Field(default_factory=list)
    replicas: ReplicaStatus = Field(default_factory=ReplicaStatus)
    selector: str = ""
    world_size: int = 0
    step: int = 0
    restarts: int = 0
    last_restart_reason: str = ""
    last_checkpoint: CheckpointStatus = Field(default_factory=CheckpointStatus)
    goodput: GoodputStatus = Field(default_factory=GoodputStatus)
    restart_budget: RestartBudgetStatus = Field(default_factory=RestartBudgetStatus)
    # The flywheel.dev/restart-requested-at value already acted on, so each request restarts the job once.
    restart_request_handled: str = ""
    observed_generation: int = 0
