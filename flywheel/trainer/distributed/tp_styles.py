"""The sequence-parallel layouts every architecture's tensor-parallel plan uses between its modules: the residual
stream sharded on the sequence (Shard(1)) between blocks, gathered whole (Replicate) where attention, a dense MLP or
an MoE layer reads it (tensor_parallel.py says why)."""

from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleInputOutput


def to_sequence_shard() -> PrepareModuleInput:
    return PrepareModuleInput(input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True)


def to_full_sequence() -> PrepareModuleInput:
    return PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True)


def moe_on_full_sequence() -> PrepareModuleInputOutput:
    """Replicated over tp: the whole sequence in, this rank's sequence shard out (backward: all-gather the
    gradient)."""
    return PrepareModuleInputOutput(
        input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
        output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=True)
