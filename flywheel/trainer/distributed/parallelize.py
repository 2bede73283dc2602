"""Applies parallelism to a plain model, TorchTitan-style: `parallelize(model, mesh, parallelism, training)`.

The mesh has named dimensions, outermost first: "dp", then "pp" and "tp" when their degree is above 1. Row-major
rank order puts a tp group on consecutive ranks (inside one worker when procsPerReplica >= tp: the fastest
links), pipeline stages next, data parallel outermost (across workers). Expert parallel borrows from dp: with
ep > 1 the dp dimension is also viewed as ("edp", "ep"), ep inner (`expert_parallel.py`). Order of application:
tensor parallel (`tensor_parallel.py`), expert parallel, activation checkpointing, then FSDP2 `fully_shard` per block
(first its experts over edp) and the root (ZeRO-3, or ZeRO-2 with `zero: 2`: parameters stay unsharded from
forward to backward) or DDP over "dp"; over a dp group of one rank without tp, neither. The model stays unaware.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from functools import partial

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from flywheel.layout.rules import JobLayout, dp_wrapper, layout_problems
from flywheel.layout.shape import ModelShape
from flywheel.spec.job import Training
from flywheel.spec.parallel import Parallelism
from flywheel.torch_compat import checkpoint_wrapper
from flywheel.trainer.distributed.expert_parallel import ExpertParallelError, apply_ep, expert_mesh, fully_shard_experts
from flywheel.trainer.distributed.pipeline_parallel import Decoder, PipelinedModel, PipelineError, pipeline
from flywheel.trainer.distributed.tensor_parallel import TensorParallelError, apply_tp
from flywheel.trainer.models.gpt.model import GPT
from flywheel.trainer.models.llama.model import Llama
from flywheel.trainer.models.lm_loss import lm_loss
from flywheel.trainer.models.materialize import is_meta, materialize

DP, PP, TP = "dp", "pp", "tp"


class ParallelismError(ValueError):
    """A layout this trainer cannot run: a user error."""


def mesh_shape(world_size: int, parallelism: Parallelism) -> dict[str, int]:
    """Named mesh dimensions, outermost first: dp always, pp and tp when above 1. ep is no dimension of its own:
    it divides dp (`check_layout`), which `parallelize` then views as (edp, ep)."""
    model_parallel = parallelism.tp * parallelism.pp
    shape = {DP: max(1, world_size // model_parallel)}
    if parallelism.pp > 1:
        shape[PP] = parallelism.pp
    if parallelism.tp > 1:
        shape[TP] = parallelism.tp
    return shape


def build_mesh(world_size: int, parallelism: Parallelism, device_type: str = "cpu") -> DeviceMesh:
    """The device mesh over all ranks (the default process group must be initialised)."""
    shape = mesh_shape(world_size, parallelism)
    return init_device_mesh(device_type, tuple(shape.values()), mesh_dim_names=tuple(shape))


def job_layout(parallelism: Parallelism, training: Training, cfg: ModelShape,
               data_source: str = "synthetic") -> JobLayout:
    """The layout rules' view (layout/rules.py) of this model, layout and batch."""
    moe = cfg.moe
    return JobLayout(layers=cfg.layers, dim=cfg.dim, heads=cfg.heads, vocab=cfg.vocab, seq_len=cfg.seq_len,
                     experts=moe.experts if moe else 0, top_k=moe.top_k if moe else 0,
                     moe_every=moe.every if moe else 1, tp=parallelism.tp, pp=parallelism.pp, ep=parallelism.ep,
                     fsdp=parallelism.fsdp, schedule=parallelism.schedule,
                     stages_per_rank=parallelism.stages_per_rank, microbatches=parallelism.microbatches,
                     global_batch=training.global_batch, micro_batch=training.micro_batch, data_source=data_source,
                     architecture=cfg.architecture, kv_heads=cfg.kv_heads, ffn=cfg.ffn,
                     max_positions=cfg.max_positions, chunked_loss=training.chunked_loss)


def check_layout(world_size: int, parallelism: Parallelism, training: Training, cfg: ModelShape,
                 data_source: str = "synthetic") -> None:
    """Raises ParallelismError for a layout that cannot run on `world_size` ranks: everything decidable from the
    spec alone, by the one definition of those rules (`spec_layout.layout_problems`, which the schema also checks
    at every replica count). Run before the rendezvous, so every rank fails alike without waiting on (or
    breaking) its peers."""
    problems = layout_problems(job_layout(parallelism, training, cfg, data_source), world_size)
    if problems:
        # One line (a failed worker's reason is its exception's last line), the world size first.
        raise ParallelismError(f"at world size {world_size}: " + " | ".join(f"spec.{p}" for p in problems))


def parallelize(model: GPT | Llama, mesh: DeviceMesh, parallelism: Parallelism, training: Training) -> nn.Module:
    """Returns the module to train: the same object for FSDP2 (it is modified in place) and with no wrapper
    (`dp_wrapper`: dp 1 without tp), a DDP wrapper for DDP, and with pp > 1 a `PipelinedModel` (this rank's
    stages; train it with `forward_backward` in step.py). The model must already be on the mesh's device, or on
    the meta device: then this rank's parameters are materialised after sharding, with the values the plain model
    would have had (`materialize.py`). Build the optimizer after this."""
    check_layout(mesh.size(), parallelism, training, model.cfg)
    if PP not in (mesh.mesh_dim_names or ()):
        return _parallelize_dense(model, mesh, parallelism, training)
    dp = mesh[DP].size()
    try:
        return pipeline(model, mesh, parallelism, micro_batch=training.micro_batch,
                        local_microbatches=training.global_batch // (dp * training.micro_batch),
                        wrap=lambda stage: _parallelize_dense(stage, mesh, parallelism, training))
    except PipelineError as err:
        raise ParallelismError(str(err)) from None


def _parallelize_dense(model: Decoder, mesh: DeviceMesh, parallelism: Parallelism, training: Training) -> nn.Module:
    """TP, activation checkpointing and FSDP2/DDP on a whole model or one pipeline stage."""
    if TP in (mesh.mesh_dim_names or ()):
        try:
            apply_tp(model, mesh[TP])
        except TensorParallelError as err:
            raise ParallelismError(str(err)) from None
    if parallelism.ep > 1:
        try:
            apply_ep(model, expert_mesh(mesh[DP], parallelism.ep))
        except ExpertParallelError as err:
            raise ParallelismError(str(err)) from None
    if training.activation_checkpointing:
        apply_activation_checkpointing(model)
    if training.compile:
        apply_compile(model)
    apply_loss(model, training)
    meta = is_meta(model)
    wrapper = dp_wrapper(parallelism.fsdp, mesh[DP].size(), parallelism.tp)
    if wrapper == "fsdp":
        mp_policy = BF16_POLICY if fsdp_mixed_precision(parallelism, training, mesh[DP].size()) else None
        sharded = apply_fsdp(model, mesh[DP], reshard_after_forward=parallelism.zero == 3, mp_policy=mp_policy)
        if meta:  # sharded first: this rank allocates only its shards
            materialize(model, model.cfg, model.init_seed, mesh_device(mesh))
        return sharded
    if meta:  # DDP replicates (and broadcasts) real tensors
        materialize(model, model.cfg, model.init_seed, mesh_device(mesh))
    return apply_ddp(model, mesh[DP]) if wrapper == "ddp" else model


def mesh_device(mesh: DeviceMesh) -> torch.device:
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def apply_activation_checkpointing(model: Decoder) -> None:
    """Recompute each block's activations in backward. The wrapper's state-dict hooks strip its prefix, so
    checkpoints are interchangeable with and without it. Models have no dropout, so RNG state is not needed."""
    blocks = model.blocks  # a ModuleList, or a stage's ModuleDict
    for name, block in list(blocks.named_children()):
        setattr(blocks, name, checkpoint_wrapper(block, preserve_rng_state=False))


def fsdp_mixed_precision(parallelism: Parallelism, training: Training, dp_size: int) -> bool:
    """bf16 through FSDP2's MixedPrecisionPolicy (`BF16_POLICY`), with no autocast: FSDP2 without pipeline
    stages. DDP, no wrapper (dp 1 without tp) and pipelined models (whose stage boundaries carry fp32
    activations) autocast."""
    return (training.precision == "bf16" and dp_wrapper(parallelism.fsdp, dp_size, parallelism.tp) == "fsdp"
            and parallelism.pp == 1)


# As TorchTitan: the sharded parameters (what the optimizer updates) stay fp32 master weights; each block's
# all-gathered parameters, and so its compute, are bf16; gradients are reduce-scattered in fp32.
BF16_POLICY = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def apply_loss(model: Decoder, training: Training) -> None:
    """The model's head + loss (models/lm_loss.py): chunked with `chunkedLoss`, compiled with `compile`. A pipeline
    stage has none of its own (the schedule's loss function takes the last stage's logits)."""
    if not isinstance(model, GPT | Llama):
        return
    loss = partial(lm_loss, chunked=True) if training.chunked_loss else lm_loss
    model.loss_fn = torch.compile(loss) if training.compile else loss


def apply_compile(model: Decoder) -> None:
    """torch.compile each block in place (TorchTitan's unit: repeated blocks reuse one compiled graph; parameter
    names are unchanged, so checkpoints are interchangeable). Before FSDP, after activation checkpointing."""
    if not (shutil.which("cc") or shutil.which("gcc")):  # inductor builds C++ on CPU, Triton's launchers on GPU
        raise ParallelismError("spec.trainer.training.compile: torch.compile on CPU needs a C compiler (cc or "
                               "gcc) in the image; install one or set compile: false")
    for block in model.blocks.children():
        block.compile()


def apply_fsdp(model: Decoder, dp_mesh: DeviceMesh, *, reshard_after_forward: bool = True,
               mp_policy: MixedPrecisionPolicy | None = None) -> nn.Module:
    """ZeRO-3 (reshard_after_forward: parameters all-gathered again in backward) or ZeRO-2 (kept from forward to
    backward; gradients and optimizer state stay sharded). `mp_policy`: mixed precision (None: fp32)."""
    policy = mp_policy or MixedPrecisionPolicy()  # the default policy changes nothing
    blocks = list(model.blocks.children())
    for i, block in enumerate(blocks):
        # The last block's parameters are needed again at once by backward: keep them unsharded after forward.
        reshard = reshard_after_forward and i < len(blocks) - 1
        fully_shard_experts(block, reshard_after_forward=reshard, mp_policy=policy)  # expert parallel only
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard_after_forward, mp_policy=policy)
    return model


def apply_ddp(model: nn.Module, dp_mesh: DeviceMesh) -> nn.Module:
    device = next(model.parameters()).device
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, process_group=dp_mesh.get_group(), device_ids=device_ids)


def settle_ddp_buckets(model: nn.Module, sample_inputs: torch.Tensor) -> None:
    """Bitwise-exact resume under DDP. DDP reduces its first iteration in buckets in parameter order, then rebuilds
    them in the order gradients became ready; from 3 ranks on the bucket layout changes how each element is summed.
    A run resumed at step k would otherwise reduce step k in the first-iteration layout while the uninterrupted run
    used the rebuilt one. So every process start runs one throw-away forward/backward (same graph, so the same
    ready order) before its first step, and all steps use the rebuilt buckets. Keeping the initial buckets with
    find_unused_parameters=True costs ~3% per step instead (bench/trainer_overhead.py); this costs one micro
    batch at start-up. Parameters, optimizer, RNG and data position are untouched. A no-op for FSDP."""
    if not isinstance(model, DistributedDataParallel):
        return
    model(sample_inputs).float().sum().backward()  # a collective: every dp rank runs it at start-up
    model.zero_grad(set_to_none=True)


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
    """Clips gradients to `max_norm` (when > 0) and returns the total norm before clipping, over all ranks. Under
    pipeline parallel a rank's norm covers its stages: squares are summed over the pp group, and the last stage's
    copy of the tied embedding (`norm_excluded`) is counted once."""
    with_grads = [(p, p.grad) for p in model.parameters() if p.grad is not None]
    params = [p for p, _ in with_grads]
    excluded = model.norm_excluded() if isinstance(model, PipelinedModel) else set()
    grads = [grad for _, grad in with_grads]
    counted = [grad for p, grad in with_grads if id(p) not in excluded]
    meshes = {g.device_mesh if isinstance(g, DTensor) else None for g in grads}
    if len(meshes) == 1:
        total_norm = torch.nn.utils.get_total_norm(counted, norm_type=2.0)
        if isinstance(total_norm, DTensor):
            total_norm = total_norm.full_tensor()  # FSDP2: a partial norm per shard; reduce it across dp
    else:  # tensor parallel: gradients on (dp, tp), on tp alone, on dp alone or plain cannot be stacked
        total_norm = _mixed_mesh_norm(counted)
    pp_group = getattr(model, "pp_group", None)
    if pp_group is not None:
        squared = total_norm.double() ** 2
        dist.all_reduce(squared, group=pp_group)
        total_norm = squared.sqrt().to(total_norm.dtype)
    if max_norm > 0:
        if len(meshes) == 1:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total_norm)
        else:
            coef = min(1.0, max_norm / (float(total_norm) + 1e-6))
            for grad in grads:
                grad.mul_(coef)
    return float(total_norm)


def _mixed_mesh_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    squares = []
    for grad in grads:
        norm = torch.linalg.vector_norm(grad, 2.0)
        squares.append((norm.full_tensor() if isinstance(norm, DTensor) else norm) ** 2)
    return torch.stack(squares).sum().sqrt()
