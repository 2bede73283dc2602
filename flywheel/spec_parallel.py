"""The parallel layout and mixture-of-experts parts of the TrainingJob schema (`trainer.parallelism`,
`trainer.model.moe`), with the checks that tie them together. `spec.py` builds the job from these and re-exports them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from flywheel.spec_base import _Model


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


def check_experts_fit(moe: MoESpec | None, par: Parallelism) -> None:
    """Raises ValueError (naming the field, relative to `trainer`) if the expert layout cannot run this model."""
    if moe is None:
        if par.ep > 1:
            raise ValueError(f"parallelism.ep: ep = {par.ep} splits experts, but the model has none; set "
                             "model.moe (e.g. {experts: 8, topK: 2}) or ep: 1")
        return
    if moe.experts % par.ep:
        raise ValueError(f"parallelism.ep: ep = {par.ep} does not divide model.moe.experts ({moe.experts}); pick "
                         "an ep that divides the number of experts")
    if par.ep > 1 and not par.fsdp:
        raise ValueError(f"parallelism.fsdp: ep = {par.ep} needs fsdp: true (DDP cannot replicate the "
                         "expert-parallel DTensor parameters); set fsdp: true or ep: 1")
    if par.pp > 1:
        raise ValueError(f"parallelism.pp: an MoE model runs with pp: 1 (got {par.pp}); its load-balancing loss "
                         "is not carried between pipeline stages. Use dp, tp and ep, or a dense model")
