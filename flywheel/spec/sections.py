"""The TrainingJob spec's plain sections: training hyperparameters, data, checkpoints, fault tolerance,
scheduling and run policy (fields, defaults and single-field checks; the cross-field rules are layout/rules.py's).
Re-exported by `flywheel.spec.job`, the schema's one import."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from flywheel.spec.base import _Model


class Training(_Model):
    """Training hyperparameters: steps, batch sizes, learning-rate schedule, precision and seed."""

    steps: int = Field(200, ge=1, description="Optimizer steps to train.")
    global_batch: int = Field(32, ge=1, description="Samples per optimizer step across all data-parallel ranks.")
    micro_batch: int = Field(4, ge=1, description="Samples per forward/backward on one rank.")
    lr: float = Field(3e-4, gt=0, le=10, description="Peak learning rate (AdamW).")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine floor as a fraction of lr.")
    warmup_steps: int = Field(10, ge=0, description="Linear warmup steps before the cosine decay.")
    weight_decay: float = Field(0.1, ge=0, description="AdamW weight decay on 2-D weights.")
    grad_clip: float = Field(1.0, ge=0, description="Max gradient norm; 0 disables clipping.")
    precision: Literal["fp32", "bf16"] = Field("fp32", description=(
        "bf16: with FSDP (no pipeline) bf16 parameters and compute over fp32 master weights, gradients reduced in "
        "fp32 (FSDP2 MixedPrecisionPolicy); otherwise autocast where the device supports it."))
    compile: bool = Field(False, description=(
        "torch.compile each transformer block (inductor; on CPU it needs a C compiler, else the run is refused)."))
    chunked_loss: bool = Field(False, description=(
        "Compute the LM head and cross-entropy over chunks of tokens (torch's linear_cross_entropy), never holding "
        "the logits of a whole micro batch: far less memory for large vocabularies (a 128k vocab's logits are the "
        "largest tensors of a step). Equal to the full loss within float rounding, not bitwise; resume stays "
        "exact. Not under pipeline parallel (the schedule's loss takes the last stage's logits)."))
    seed: int = Field(0, ge=0, description="Seeds model init and data order.")
    activation_checkpointing: bool = Field(False, description="Recompute block activations in backward.")
    deterministic: bool = Field(True, description="Deterministic kernels only (needed for bitwise-exact resume); a "
                                "kernel that has no deterministic version fails the run naming this field.")
    eval_every_steps: int = Field(0, ge=0, description="Evaluate on the validation data (trainer.data.validation "
                                  "or validationFraction; a synthetic source has its own held-out stream) after "
                                  "every N optimizer steps and after the last one; 0 disables evaluation.")
    eval_steps: int = Field(4, ge=1, description="Batches of globalBatch samples per evaluation: always the first "
                            "evalSteps x globalBatch validation samples, so evaluations compare across steps, "
                            "layouts and resumes.")


class Data(_Model):
    """The training data: its source and tokenizer."""

    source: str = Field("synthetic", description="'synthetic', a text file (.txt, byte tokens), a token file "
                                                 "(.npy / .bin of uint16), or a directory of token shards written "
                                                 "by `flywheel prepare-data` (its index.json).")
    tokenizer: str | None = Field(None, min_length=1, description="A Hugging Face tokenizer.json or a .tiktoken "
                                  "BPE file: the model's vocab must cover it; `flywheel generate` decodes with it "
                                  "and `flywheel export` copies it. Unset: the pretrained directory's, if any.")

    validation: str | None = Field(None, min_length=1, description="Held-out data for evaluation "
                                   "(training.evalEverySteps), in any format `source` accepts (a prepare-data "
                                   "directory, .txt, .npy/.bin or 'synthetic'). Excludes validationFraction.")
    validation_fraction: float = Field(0.0, ge=0, le=0.5, description="Hold out this fraction of the source's "
                                       "windows for evaluation instead: the last ones of the token stream, never "
                                       "trained on (a synthetic source: a disjoint sample stream). 0: none. "
                                       "Excludes validation.")

    @property
    def is_synthetic(self) -> bool:
        return self.source == "synthetic"

    @field_validator("source")
    @classmethod
    def _known_format(cls, v: str) -> str:
        # No suffix: a directory of shards (prepare-data's output); its index is read where the job runs.
        if v != "synthetic" and Path(v).suffix not in (".txt", ".npy", ".bin", ""):
            raise ValueError(f"{v!r} is neither 'synthetic', a .txt/.npy/.bin file nor a shard directory; convert "
                             "the data with `flywheel prepare-data` or use source: synthetic")
        return v

    @field_validator("validation")
    @classmethod
    def _known_validation_format(cls, v: str | None) -> str | None:
        if v is not None and v != "synthetic" and Path(v).suffix not in (".txt", ".npy", ".bin", ""):
            raise ValueError(f"data.validation {v!r} is neither 'synthetic', a .txt/.npy/.bin file nor a shard "
                             "directory; convert it with `flywheel prepare-data`")
        return v

    @model_validator(mode="after")
    def _one_validation_kind(self) -> Data:
        if self.validation is not None and self.validation_fraction > 0:
            raise ValueError("data.validation and data.validationFraction are both set; give held-out data or a "
                             "fraction of the source, not both")
        return self


class CheckpointSpec(_Model):
    """Where and how often checkpoints are saved, and how many are kept (a restarted job resumes from the last)."""

    dir: str = Field("/ckpt", min_length=1, description="Shared by all workers; one subfolder per checkpoint. An "
                                                      "object-store URL (s3://bucket/prefix, gs://..., any fsspec "
                                                      "protocol) is written through localDir, uploaded in the "
                                                      "background.")
    local_dir: str = Field("", description="With an object-store dir: where saves are committed first and restores "
                                           "read from (a missing or older local copy is downloaded). Empty: "
                                           "/tmp/flywheel-checkpoints/<scheme>/<bucket>/<prefix> (the pod's emptyDir "
                                           "on a cluster).")
    every_steps: int = Field(50, ge=0, description="Save every N steps; 0 disables step-based saves.")
    every_seconds: float = Field(0, ge=0, description="Save when this many seconds passed since the last save.")
    memory_every_steps: int = Field(
        0, ge=0, description="Also keep a copy in the workers' host shared memory (/dev/shm) every N steps, with a "
                             "replica on the next worker, and restore from it when it is the newest: a restart "
                             "replays at most N steps without reading `dir` (a copy slower than N steps slows "
                             "training to its pace rather than fall behind). Separate from everySteps (which writes "
                             "`dir`); 0 turns the memory tier off. Needs /dev/shm room for about four times a "
                             "worker's share of the training state (during a save: the previous and the new copy, "
                             "of its own state and of its peer's replica; twice with one worker).")
    keep: int = Field(3, ge=1, description="Committed checkpoints kept; older ones are deleted.")
    async_: bool = Field(True, alias="async", description="Write in the background; training blocks only to stage. "
                                                        "`false`: each disk save blocks until committed (memory-tier "
                                                        "copies stay in the background).")
    claim_name: str = Field("", description="Cluster only: a ReadWriteMany PersistentVolumeClaim whose folder "
                                            "`dir` (without its leading /) is mounted at `dir` in every worker, so "
                                            "jobs sharing a claim keep their checkpoints apart and a job naming "
                                            "another's dir resumes from it. Empty: a per-pod emptyDir, which is lost "
                                            "with the pod (a cluster job with replicas.max > 1 needs one, or "
                                            "ephemeral).")
    ephemeral: bool = Field(False, description="Cluster only: accept per-pod checkpoints without a claim (lost with "
                                               "their pod); without it a job with replicas.max > 1 needs claimName.")


class FaultTolerance(_Model):
    """How failures are handled: the restart budget, hang and start-up timeouts, and what a restart recreates."""

    max_restarts: int = Field(10, ge=0, description="Restarts allowed before the job fails.")
    budget_reset_after_steps: int = Field(100, ge=0, description="Committed steps after which restarts reset.")
    progress_timeout_seconds: float = Field(60, ge=0, description="No step for this long means hung; 0 disables.")
    first_step_timeout_seconds: float = Field(600, ge=1, description="Allowance for start-up and the first step.")
    restart_scope: Literal["job", "worker"] = Field("job", description="Recreate every worker or only the failed one.")
    node_failure_grace_seconds: float = Field(30, ge=0,
                                              description="Pods stuck on a dead node are force-deleted after this.")
    start_failure_grace_seconds: float = Field(
        60, ge=0, description="How long a worker may wait on an image pull error or a missing Secret/ConfigMap before "
                              "the job fails (an unparseable image name fails at once).")
    termination_grace_seconds: int = Field(
        120, ge=1, description="Cluster only: the worker pods' terminationGracePeriodSeconds, the time between SIGTERM "
                               "and SIGKILL in which the trainer writes its emergency checkpoint; size it for the "
                               "model's save.")
    finish_grace_seconds: float = Field(
        60, ge=0, description="Once the trainer reports training done (its final checkpoint committed), workers "
                              "still running this long after are stopped and the job Succeeds: a rank stuck or "
                              "restarted in its teardown no longer holds the job. Jobs without the done report (user "
                              "scripts) wait for every worker to exit.")
    warm_start: bool = Field(
        True, description="Fork each rank (and each restarted rank) from an interpreter that has already run its "
                          "imports: the trainer's, or a Python command's own top-level imports of other packages. "
                          "false starts every rank cold, e.g. for a package that reads RANK or LOCAL_RANK when "
                          "imported.")
    pending_timeout_seconds: float | None = Field(
        None, ge=1, description="A worker pod unschedulable this long fails the job, unless it is elastic and runs at "
                                "least replicas.min workers (it goes on with fewer until the pod is scheduled). "
                                "Unset: wait for capacity for ever.")


class Scheduling(_Model):
    """How the worker pods are scheduled: gang scheduling, the scheduler, the Kueue queue, priority and
    topology."""

    gang: bool = Field(True, description="Schedule all workers together (PodGroup).")
    scheduler_name: str = Field("", description="The pods' schedulerName (e.g. volcano). Empty: the gang "
                                                "scheduler's when the operator creates PodGroups, else the default.")
    queue: str = Field("", description="A Kueue LocalQueue: the pods carry Kueue's pod-group labels and scheduling "
                                       "gate, so Kueue admits the job's workers as one workload (Volcano: the "
                                       "PodGroup's queue).")
    priority_class_name: str = Field("", description="The pods' priorityClassName. Empty: the cluster default.")
    topology_key: str = Field("", description="A node label (e.g. topology.kubernetes.io/zone): every worker in "
                                              "one domain of it (required with gang, preferred without).")


class RunPolicy(_Model):
    """Time limits of the whole job."""

    ttl_seconds_after_finished: int | None = Field(None, ge=0, description="Delete the finished job this many "
                                                   "seconds after it succeeded or failed. Unset: keep it.")
    active_deadline_seconds: int | None = Field(None, ge=1, description="Fail the job when it has existed this "
                                                "long (seconds since it was created). Unset: no limit.")


def eval_data_problem(eval_every_steps: int, data: Data) -> str | None:
    """Evaluation needs held-out data: a synthetic source has its own held-out stream; a file source needs
    data.validation or data.validationFraction (the trainer's preflight says the same, trainer/data.py)."""
    if eval_every_steps and not data.is_synthetic and data.validation is None and not data.validation_fraction:
        return ("training.evalEverySteps: evaluation needs validation data beside a file data.source; set "
                "data.validation (held-out data) or data.validationFraction (a fraction of data.source held out)")
    return None
