"""Tensor parallel with sequence parallel (Megatron-style) on the GPT and Llama blocks, through DTensor's
parallelize_module.

Per block, on the "tp" mesh dimension:
- the residual stream between blocks is sharded on the sequence (Shard(1)); LayerNorms run sequence-parallel;
- attention and MLP inputs are all-gathered (PrepareModuleInput Shard(1) -> Replicate);
- `attn.qkv` and `mlp.fc` are column-wise (output features sharded), `attn.proj` and `mlp.proj` row-wise with a
  reduce-scatter back onto the sequence shard.

Llama blocks (`llama.py`) have separate q, k, v (column-wise: rank r gets its query heads and its key/value heads,
so kvHeads must divide by tp too), o row-wise, and a SwiGLU MLP with gate and up column-wise, down row-wise.

The GPT's fused `qkv` projection's weight is sharded in contiguous rows (a plain Shard(0), so DCP reshards it like any
other parameter), which gives rank r the r-th slice of [q | k | v]; attention needs rank r's heads of each of q, k
and v. A forward hook regroups the output: all-gather over tp, keep [q_r | k_r | v_r] (backward: reduce-scatter of
the partial gradients). That costs one extra activation all-gather per block over a split q/k/v projection, which
the model does not have (it would change the data-parallel numerics).

Embeddings, the final LayerNorm and the tied LM head stay replicated over tp: they see the full sequence (the
first block slices it, the final LayerNorm all-gathers it), so their gradients agree on all tp ranks without a
reduction.

An MoE layer (`moe.py`) is not split over tp: its input is all-gathered like the dense MLP's, every tp rank routes
the whole sequence and runs its experts (with expert parallel, each tp rank has its own ep group), and its output
is sliced back onto the sequence shard. Routing, the load-balancing loss and the capacity cap then see the same
tokens as without tp, and its gradients agree on the tp ranks like the embeddings'. The cost: the MoE compute is
repeated on every tp rank (expert tensor parallel would split it).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from flywheel.spec_layout import tp_size_problems
from flywheel.spec_model import ModelShape
from flywheel.trainer.moe import MoE
from flywheel.trainer.parallel_pp import Decoder


class TensorParallelError(ValueError):
    """The model's sizes do not split over the tp degree."""


def check_tp_sizes(dim: int, heads: int, seq_len: int, tp: int) -> None:
    """The GPT's rules from its sizes alone (heads, seqLen, the 4 x dim MLP); `check_model_tp` for any shape."""
    check_model_tp(ModelShape(layers=1, dim=dim, heads=heads, vocab=2, seq_len=seq_len), tp)


def check_model_tp(shape: ModelShape, tp: int) -> None:
    """The tensor-parallel rules of `spec_layout.py` (the one definition) on a built model's shape."""
    problems = tp_size_problems(shape.heads, shape.kv_heads, shape.seq_len, shape.ffn, tp)
    if problems:
        raise TensorParallelError("; ".join(f"spec.{p}" for p in problems))


def apply_tp(model: Decoder, tp_mesh: DeviceMesh) -> None:
    """Shards `model.blocks` over `tp_mesh` in place (before activation checkpointing and FSDP/DDP). `model` may
    be a pipeline stage: the sequence is sliced only where the embeddings are, gathered only where `ln_f` is, and
    the stages in between pass the sequence shard on."""
    cfg: ModelShape = model.cfg
    check_model_tp(cfg, tp_mesh.size())
    llama = cfg.architecture == "llama"
    named_blocks = list(model.blocks.named_children())
    to_sequence_shard = PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),),
                                           use_local_output=True)
    to_full_sequence = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                          use_local_output=True)
    plan: dict[str, ParallelStyle] = {}
    if getattr(model, "tok_emb", None) is not None:
        plan[f"blocks.{named_blocks[0][0]}"] = to_sequence_shard
    if getattr(model, "ln_f", None) is not None:
        plan["ln_f"] = to_full_sequence
    parallelize_module(model, tp_mesh, plan)
    # Replicated over tp: the whole sequence in, this rank's sequence shard out (backward: all-gather the gradient).
    moe_on_full_sequence = PrepareModuleInputOutput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
        output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=True)
    for _, block in named_blocks:
        block_plan = (_llama_block_plan() if llama else
                      _gpt_block_plan(isinstance(block.mlp, MoE), moe_on_full_sequence))
        parallelize_module(block, tp_mesh, {"ln_attn": SequenceParallel(), "attn": to_full_sequence,
                                            "ln_mlp": SequenceParallel(), **block_plan})
        if not llama:
            block.attn.qkv.register_forward_hook(_HeadRegroup(tp_mesh))  # type: ignore[union-attr]


def _to_full_sequence() -> PrepareModuleInput:
    return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True)


def _gpt_block_plan(moe: bool, moe_on_full_sequence: PrepareModuleInputOutput) -> dict[str, ParallelStyle]:
    mlp_plan: dict[str, ParallelStyle] = (
        {"mlp": moe_on_full_sequence} if moe else
        {"mlp": _to_full_sequence(), "mlp.fc": ColwiseParallel(), "mlp.proj": RowwiseParallel(output_layouts=Shard(1))})
    return {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(output_layouts=Shard(1)), **mlp_plan}


def _llama_block_plan() -> dict[str, ParallelStyle]:
    """q, k, v, gate and up column-wise (each rank its heads, its kv heads, its MLP columns), o and down row-wise
    with a reduce-scatter onto the sequence shard. Separate projections: no head regrouping needed."""
    return {"attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.o": RowwiseParallel(output_layouts=Shard(1)), "mlp": _to_full_sequence(),
            "mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(),
            "mlp.down": RowwiseParallel(output_layouts=Shard(1))}


class _HeadRegroup:
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
