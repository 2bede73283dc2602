"""The parallel layout and mixture-of-experts parts of the TrainingJob schema (`trainer.parallelism`,
`trainer.model.moe`). The rules that tie them to the model, the batch and the world size are in `layout/rules.py`;
`spec/job.py` builds the job from these and re-exports them.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from flywheel.spec.base import _Model


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


# The planner's built-in device profiles (planner/devices.py; a unit test keeps the two lists equal).
DEVICE_KINDS = ("cpu", "a100", "h100", "h200")
DeviceKind = Literal["cpu", "a100", "h100", "h200"]


class Parallelism(_Model):
    """The parallel layout: tensor, pipeline, expert and data parallelism (FSDP or DDP), or `auto` to let the
    planner choose."""

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
    auto: bool = Field(False, description="Let the planner choose the layout, when the job is validated; a job no "
                                          "layout can serve is invalid.")
    device: DeviceKind = Field("cpu", description="With auto: the device profile the planner sizes layouts for "
                                                  "(memory, speed and links per rank).")
