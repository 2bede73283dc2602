"""Tensor parallel with sequence parallel (Megatron-style) on the GPT and Llama blocks, through DTensor's
parallelize_module.

Per block, on the "tp" mesh dimension:
- the residual stream between blocks is sharded on the sequence (Shard(1)); LayerNorms run sequence-parallel;
- attention and MLP inputs are all-gathered (PrepareModuleInput Shard(1) -> Replicate);
- the projections into attention and the MLP are column-wise (output features sharded), those out of them
  row-wise with a reduce-scatter back onto the sequence shard.

What each block's attention and MLP split into is the architecture's own plan (models/gpt/tp_plan.py: a fused
qkv with a head-regrouping hook; models/llama/tp_plan.py: separate q, k, v and a SwiGLU MLP).

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

from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ParallelStyle, SequenceParallel, parallelize_module

from flywheel.layout.rules import tp_size_problems
from flywheel.layout.shape import ModelShape
from flywheel.trainer.distributed.pipeline_parallel import Decoder
from flywheel.trainer.distributed.tp_styles import to_full_sequence, to_sequence_shard
from flywheel.trainer.models.registry import MODELS


class TensorParallelError(ValueError):
    """The model's sizes do not split over the tp degree."""


def check_tp_sizes(dim: int, heads: int, seq_len: int, tp: int) -> None:
    """The GPT's rules from its sizes alone (heads, seqLen, the 4 x dim MLP); `check_model_tp` for any shape."""
    check_model_tp(ModelShape(layers=1, dim=dim, heads=heads, vocab=2, seq_len=seq_len), tp)


def check_model_tp(shape: ModelShape, tp: int) -> None:
    """The tensor-parallel rules of `layout/rules.py` (the one definition) on a built model's shape."""
    problems = tp_size_problems(shape.heads, shape.kv_heads, shape.seq_len, shape.ffn, tp)
    if problems:
        raise TensorParallelError("; ".join(f"spec.{p}" for p in problems))


def apply_tp(model: Decoder, tp_mesh: DeviceMesh) -> None:
    """Shards `model.blocks` over `tp_mesh` in place (before activation checkpointing and FSDP/DDP), each block by
    its architecture's plan (models/<architecture>/tp_plan.py). `model` may be a pipeline stage: the sequence is
    sliced only where the embeddings are, gathered only where `ln_f` is, and the stages in between pass the
    sequence shard on."""
    cfg: ModelShape = model.cfg
    check_model_tp(cfg, tp_mesh.size())
    architecture = MODELS[cfg.architecture]
    named_blocks = list(model.blocks.named_children())
    plan: dict[str, ParallelStyle] = {}
    if getattr(model, "tok_emb", None) is not None:
        plan[f"blocks.{named_blocks[0][0]}"] = to_sequence_shard()
    if getattr(model, "ln_f", None) is not None:
        plan["ln_f"] = to_full_sequence()
    parallelize_module(model, tp_mesh, plan)
    for _, block in named_blocks:
        parallelize_module(block, tp_mesh, {"ln_attn": SequenceParallel(), "attn": to_full_sequence(),
                                            "ln_mlp": SequenceParallel(), **architecture.tp_block_plan(block)})
        architecture.tp_after_block(block, tp_mesh)
