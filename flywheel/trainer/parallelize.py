"""Applies parallelism to a plain model, TorchTitan-style: `parallelize(model, mesh, parallelism, training)`.

Today the mesh has one "dp" dimension and the model is either FSDP2-sharded (`fully_shard` per block, then the
root, which holds the tied embedding/head) or DDP-replicated, optionally with activation checkpointing per block.
Tensor and pipeline parallelism will add mesh dimensions and steps here; the model stays unaware of them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from flywheel.spec import Parallelism, Training

DP = "dp"


class ParallelismError(ValueError):
    """A layout this trainer cannot run: a user error."""


def build_mesh(world_size: int, parallelism: Parallelism, device_type: str = "cpu") -> DeviceMesh:
    """The device mesh over all ranks (the default process group must be initialised)."""
    if parallelism.tp > 1 or parallelism.pp > 1:
        raise ParallelismError(f"trainer.parallelism: tp={parallelism.tp}, pp={parallelism.pp} is not supported by "
                               "this trainer yet; use tp: 1 and pp: 1 (data parallel with fsdp: true or false)")
    return init_device_mesh(device_type, (world_size,), mesh_dim_names=(DP,))


def parallelize(model: nn.Module, mesh: DeviceMesh, parallelism: Parallelism, training: Training) -> nn.Module:
    """Returns the module to train: the same object for FSDP2 (it is modified in place), a DDP wrapper otherwise.
    The model must already be on the mesh's device. Build the optimizer after this."""
    if training.activation_checkpointing:
        apply_activation_checkpointing(model)
    if parallelism.fsdp:
        return apply_fsdp(model, mesh[DP])
    return apply_ddp(model, mesh[DP])


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in backward. The wrapper's state-dict hooks strip its prefix, so
    checkpoints are interchangeable with and without it. Models have no dropout, so RNG state is not needed."""
    blocks: nn.ModuleList = model.blocks  # type: ignore[assignment]
    for i, block in enumerate(blocks):
        blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def apply_fsdp(model: nn.Module, dp_mesh: DeviceMesh) -> nn.Module:
    blocks: nn.ModuleList = model.blocks  # type: ignore[assignment]
    for i, block in enumerate(blocks):
        # The last block's parameters are needed again at once by backward: keep them unsharded after forward.
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=i < len(blocks) - 1)
    fully_shard(model, mesh=dp_mesh)
    return model


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh) -> nn.Module:
    device = next(model.parameters()).device
    device_ids = [device.index] if device.type == "cuda" else None
    # Bitwise-exact resume: by default DDP reduces the first iteration in one bucket and then rebuilds buckets in
    # backward order, so a resumed run's first step would sum gradients in another chunk layout than the
    # uninterrupted run did at that step (visible from 3 ranks on). With find_unused_parameters DDP keeps its
    # initial buckets for good; the price is one autograd-graph walk per step (bench/trainer_overhead.py).
    return DistributedDataParallel(model, process_group=dp_mesh.get_group(), device_ids=device_ids,
                                   find_unused_parameters=True)


@contextlib.contextmanager
def gradient_sync(model: nn.Module, enabled: bool) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter for all but the last micro batch of a step."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(enabled)
        yield
    elif isinstance(model, DistributedDataParallel) and not enabled:
        with model.no_sync():
            yield
    else:
        yield


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clips gradients to `max_norm` (when > 0) and returns the total norm before clipping, over all ranks."""
    params = [p for p in model.parameters() if p.grad is not None]
    total_norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type=2.0)
    if isinstance(total_norm, DTensor):
        total_norm = total_norm.full_tensor()  # FSDP2: a partial norm per shard; reduce it across dp
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm)
    return float(total_norm)
