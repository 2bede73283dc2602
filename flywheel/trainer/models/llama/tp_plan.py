"""The Llama block's tensor-parallel plan: q, k, v, gate and up column-wise (each rank its query heads, its
key/value heads, its MLP columns: kvHeads must divide by tp too), o and down row-wise with a reduce-scatter onto
the sequence shard. Separate projections: no head regrouping needed."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from flywheel.trainer.distributed.tp_styles import to_full_sequence


def block_plan(block: nn.Module) -> dict[str, ParallelStyle]:
    return {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(output_layouts=Shard(1)), "mlp": to_full_sequence(),
            "mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(),
            "mlp.down": RowwiseParallel(output_layouts=Shard(1))}


def after_block(block: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Nothing to regroup."""
