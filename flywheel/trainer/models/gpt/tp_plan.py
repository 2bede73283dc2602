"""The GPT block's tensor-parallel plan: `attn.qkv` and `mlp.fc` column-wise, `attn.proj` and `mlp.proj` row-wise
with a reduce-scatter back onto the sequence shard; an MoE layer runs whole on every tp rank.

The fused `qkv` projection's weight is sharded in contiguous rows (a plain Shard(0), so DCP reshards it like any
other parameter), which gives rank r the r-th slice of [q | k | v]; attention needs rank r's heads of each of q, k
and v. A forward hook regroups the output: all-gather over tp, keep [q_r | k_r | v_r] (backward: reduce-scatter of
the partial gradients). That costs one extra activation all-gather per block over a split q/k/v projection, which
the model does not have (it would change the data-parallel numerics).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from flywheel.trainer.distributed.tp_styles import moe_on_full_sequence, to_full_sequence
from flywheel.trainer.models.moe import MoE


def block_plan(block: nn.Module) -> dict[str, ParallelStyle]:
    mlp_plan: dict[str, ParallelStyle] = (
        {"mlp": moe_on_full_sequence()} if isinstance(block.mlp, MoE) else
        {"mlp": to_full_sequence(), "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel(output_layouts=Shard(1))})
    return {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(output_layouts=Shard(1)), **mlp_plan}


def after_block(block: nn.Module, tp_mesh: DeviceMesh) -> None:
    block.attn.qkv.register_forward_hook(HeadRegroup(tp_mesh))  # type: ignore[union-attr]


class HeadRegroup:
    """Forward hook on a column-wise fused qkv projection: rank r's contiguous slice of [q | k | v] becomes
    [q_r | k_r | v_r], the slices of q, k and v belonging to rank r's heads."""

    def __init__(self, tp_mesh: DeviceMesh) -> None:
        self.mesh = tp_mesh

    def __call__(self, _module: nn.Module, _inputs: object, output: torch.Tensor) -> torch.Tensor:
        tp, rank = self.mesh.size(), self.mesh.get_local_rank()
        # Each rank keeps a different part of the gathered tensor, so its gradient is a partial sum: declaring it
        # Partial makes backward reduce-scatter it onto the column shards.
        gathered = DTensor.from_local(output, self.mesh, [Shard(-1)]).redistribute(placements=[Replicate()])
        full = gathered.to_local(grad_placements=[Partial()])
        return torch.unflatten(full, -1, (3, tp, -1))[..., rank, :].flatten(-2)
