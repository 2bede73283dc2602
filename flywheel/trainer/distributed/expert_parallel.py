"""Expert parallel: each MoE layer's experts spread over the "ep" ranks, tokens dispatched by all-to-all.

The mesh. ep borrows from data parallel, as in TorchTitan: the dp dimension (world / (tp x pp) ranks, each with
its own data) is viewed as (edp, ep), ep inner, so an ep group is ep consecutive dp ranks (the nearest ones) of
one tp/pp coordinate. Rank j of an ep group holds experts [j E/ep, (j+1) E/ep) of every MoE layer; ranks with
the same ep index (an "edp" group of dp / ep ranks) hold the same experts.

Dispatch (`ExpertParallelExperts.forward`, in place of `Experts.forward`). The MoE layer hands over its routed
token rows grouped by expert, with the count per expert. Per layer and micro batch:
1. the counts are exchanged (an all-to-all of E integers), so each rank knows how many rows every peer sends;
2. the rows are sent with `all_to_all_single` (the autograd-aware functional collective: its backward is the
   reverse all-to-all of the gradients), which lands them grouped by source rank, then by local expert;
3. they are regrouped expert-major, the local experts run (`moe.expert_mlps`, the same code as without ep), the
   outputs are put back in source-major order and returned by the reverse all-to-all.
The caller gets its rows back in the order it sent them, so routing, gating and the combine stay in the model.
gloo implements all_to_all on CPU (checked on torch 2.13), so this runs in the CPU tests as on NCCL.

Parameters. `w1` and `w2` keep their names and global shapes (experts, ...), as DTensors sharded Shard(0) over
ep: DCP reshards them between any two layouts, with or without ep. FSDP2 shards them further over edp
(`fully_shard_experts`) and averages their gradients over edp. Scaling: each rank's loss is the mean over its own
tokens and data parallel averages over dp, but an expert's gradient already sums the contributions of all ep
ranks' tokens, so the average must divide by dp = edp x ep, not edp. The expert side of the dispatch therefore
sees its output gradient divided by ep (and the gradient it returns to the tokens multiplied back by ep): the
experts' gradients come out divided by ep, and the tokens' are untouched. (FSDP2's `set_gradient_divide_factor`
would do it too, but at edp = 1 torch 2.13 divides twice, and above 1 it needs PREMUL_SUM, which gloo lacks.)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from flywheel.layout.rules import JobLayout, static_problems
from flywheel.torch_compat import all_to_all_single_autograd, unflatten_mesh
from flywheel.trainer.models.moe import Experts, MoE, expert_mlps

EDP, EP = "edp", "ep"


class ExpertParallelError(ValueError):
    """The model or degrees do not allow this expert-parallel layout."""


def expert_mesh(dp_mesh: DeviceMesh, ep: int) -> DeviceMesh:
    """The dp dimension viewed as (edp, ep), ep inner. Creates process groups: call once, on every rank."""
    if dp_mesh.size() % ep:
        raise ExpertParallelError(f"trainer.parallelism.ep: ep = {ep} does not divide dp = {dp_mesh.size()}; "
                                  "expert parallelism borrows from the data-parallel ranks")
    return unflatten_mesh(dp_mesh, 0, (dp_mesh.size() // ep, ep), (EDP, EP))


def check_ep_sizes(experts: list[int], ep: int) -> None:
    """`experts`: the expert count of each MoE layer (none for a dense model); the expert-parallel rules of
    `layout/rules.py` (the one definition) on them."""
    for count in experts or [0]:
        job = JobLayout(layers=1, dim=8, heads=1, vocab=2, seq_len=2, experts=count, top_k=min(1, count), ep=ep)
        problems = [p for p in static_problems(job) if p.rule.startswith("ep-")]
        if problems:
            raise ExpertParallelError("; ".join(f"spec.{p}" for p in problems))


def apply_ep(model: nn.Module, mesh: DeviceMesh) -> None:
    """Replaces every MoE layer's `experts` with its expert-parallel form on `mesh` (edp, ep), in place."""
    layers = [m for m in model.modules() if isinstance(m, MoE)]
    check_ep_sizes([layer.cfg.experts for layer in layers], mesh[EP].size())
    for layer in layers:
        dense = layer.experts
        assert isinstance(dense, Experts), "expert parallel applies once, to the dense experts"
        layer.experts = ExpertParallelExperts(dense, mesh)


class ExpertParallelExperts(nn.Module):
    """An `Experts` module whose weights are sharded over ep (same names, same global shapes)."""

    w1: nn.Parameter  # DTensors, set in __init__
    w2: nn.Parameter

    def __init__(self, experts: Experts, mesh: DeviceMesh) -> None:
        super().__init__()
        self.mesh = mesh
        ep_mesh = mesh[EP]
        self.group = ep_mesh.get_group()
        self.ep, rank = ep_mesh.size(), ep_mesh.get_local_rank()
        self.local_experts = experts.w1.shape[0] // self.ep
        # Every rank built the same full model from the seed: each keeps its slice, no communication.
        for name in ("w1", "w2"):
            shard = getattr(experts, name).detach().chunk(self.ep)[rank].clone()
            setattr(self, name, nn.Parameter(DTensor.from_local(shard, ep_mesh, [Shard(0)], run_check=False)))

    def forward(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        ep, local = self.ep, self.local_experts
        # received[src, e]: rows that rank src sends to this rank's local expert e
        received_counts = torch.empty_like(counts)
        dist.all_to_all_single(received_counts, counts, group=self.group)
        sent = counts.view(ep, local).sum(1).tolist()
        received = received_counts.view(ep, local)
        from_each, per_chunk = received.sum(1).tolist(), received.flatten().tolist()
        arrived = all_to_all_single_autograd(routed, from_each, sent, self.group)
        # Source-major -> expert-major (chunk src * local + e), run the local experts, and back.
        chunks = torch.split(_scale_grad(arrived, float(ep)), per_chunk)
        expert_major = [src * local + e for e in range(local) for src in range(ep)]
        out = expert_mlps(torch.cat([chunks[i] for i in expert_major]), received.sum(0).tolist(),
                          _local(self.w1), _local(self.w2))
        out_chunks = dict(zip(expert_major, torch.split(_scale_grad(out, 1.0 / ep), [per_chunk[i] for i in
                                                                                      expert_major])))
        source_major = torch.cat([out_chunks[i] for i in range(ep * local)])
        return all_to_all_single_autograd(source_major, sent, from_each, self.group)


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the gradient by `scale` in backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:  # ctx: Any, as in torch's signature
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def _scale_grad(x: torch.Tensor, scale: float) -> torch.Tensor:
    apply: Callable[[torch.Tensor, float], torch.Tensor] = _ScaleGrad.apply  # unannotated in torch
    return apply(x, scale)


def _local(param: torch.Tensor) -> torch.Tensor:
    return param.to_local() if isinstance(param, DTensor) else param


def fully_shard_experts(module: nn.Module, *, reshard_after_forward: bool,
                        mp_policy: MixedPrecisionPolicy | None = None) -> None:
    """FSDP2 over edp for the expert-parallel experts inside `module`; call before fully_shard(module), which then
    leaves them out of its own group."""
    for experts in [m for m in module.modules() if isinstance(m, ExpertParallelExperts)]:
        fully_shard(experts, mesh=experts.mesh[EDP], reshard_after_forward=reshard_after_forward,
                    mp_policy=mp_policy or MixedPrecisionPolicy())
