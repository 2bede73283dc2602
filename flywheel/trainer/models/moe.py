"""A mixture-of-experts feed-forward for the GPT blocks. Like model.py it knows nothing of parallelism:
`expert_parallel.py` replaces `MoE.experts` to spread the experts over ranks.

Per token, a linear router (no bias) gives a softmax over E experts; the token goes to its top-k experts and
their outputs are summed, weighted by the k probabilities (renormalised to sum to 1 when k > 1, as GShard; with
k = 1 that would make every gate 1 and cut the router off from the language-model loss, so Switch's raw
probability is kept). Each expert is a GELU MLP as wide as the dense one (no biases, as Switch and Mixtral). The
load-balancing loss is Switch Transformer's E * sum_i f_i * P_i over the micro batch's tokens (f_i: the fraction
of routed assignments that chose expert i, P_i: the mean router probability of expert i), which is 1 when
routing is uniform; each MoE layer keeps its weighted value in `aux_loss` for the loop to add (`aux_loss_of`).

With a capacity factor, each expert takes at most ceil(factor * tokens * k / E) assignments per forward; all
first choices are served before any second choice, each in token order, and a dropped assignment contributes
nothing (the token keeps its residual). Routing is decided on the tokens of one forward, so it is the same
whatever the parallel layout, as long as a forward sees the same tokens.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from flywheel.layout.shape import MoEConfig


def load_balancing_loss(probs: torch.Tensor, chosen: torch.Tensor, experts: int) -> torch.Tensor:
    """Switch Transformer's auxiliary loss: experts * sum_i f_i * P_i. `probs` (tokens, experts) is the router's
    softmax, `chosen` (tokens, k) the experts picked. f (counts) carries no gradient; P does."""
    fraction = expert_counts(chosen.flatten(), experts).to(probs.dtype) / chosen.numel()
    return experts * (fraction * probs.mean(0)).sum()


def expert_mlps(x: torch.Tensor, counts: list[int], w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Runs expert e on the e-th block of `counts[e]` rows of `x` (rows grouped by expert); the outputs in the same
    order. `w1` is (experts, dim, hidden), `w2` (experts, hidden, dim): whichever experts the caller holds."""
    blocks = [F.gelu(chunk @ w1[e]) @ w2[e] for e, chunk in enumerate(torch.split(x, counts))]
    return torch.cat(blocks) if blocks else x.new_zeros(0, w2.shape[-1])


class Experts(nn.Module):
    """E expert MLPs as stacked weights, expert-major, so expert parallel shards dim 0."""

    def __init__(self, experts: int, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, dim, hidden))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, dim))

    def forward(self, routed: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """`routed`: token rows grouped by expert, `counts` (experts,): rows per expert."""
        return expert_mlps(routed, counts.tolist(), self.w1, self.w2)


class MoE(nn.Module):
    """`forward(x[batch, seq, dim]) -> [batch, seq, dim]`; sets `aux_loss` (weighted) for the loop to add."""

    def __init__(self, dim: int, cfg: MoEConfig, hidden: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(dim, cfg.experts, bias=False)
        # expert_parallel.py may swap in a sharded form
        self.experts: nn.Module = Experts(cfg.experts, dim, hidden or 4 * dim)
        self.aux_loss: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        num_experts, k = self.cfg.experts, self.cfg.top_k
        tokens = x.reshape(-1, x.shape[-1])
        count = tokens.shape[0]
        probs: torch.Tensor = self.router(tokens).float().softmax(-1)
        gates, chosen = probs.topk(k, dim=-1)
        if k > 1:
            gates = gates / gates.sum(-1, keepdim=True)
        self.aux_loss = self.cfg.aux_loss_weight * load_balancing_loss(probs, chosen, num_experts)

        # Assignments slot-major (all first choices, then all second choices, ...): slot s is token s mod count.
        expert = chosen.t().reshape(-1)
        if self.cfg.capacity_factor is not None:
            capacity = math.ceil(self.cfg.capacity_factor * count * k / num_experts)
            expert = expert.masked_fill(_position_in_expert(expert, num_experts) >= capacity, num_experts)
        # Grouped by expert, in slot order within an expert (a stable sort); dropped slots (expert id E) last.
        order = torch.argsort(expert, stable=True)
        counts = expert_counts(expert, num_experts)
        routed_slots = order[:int(counts.sum())]
        out: torch.Tensor = self.experts(tokens[routed_slots % count], counts)
        out = torch.cat([out, out.new_zeros(order.numel() - out.shape[0], out.shape[1])])
        # Back to slot order (a gather, so deterministic), weighted, summed over the k slots of each token.
        slot_out = out[torch.argsort(order)] * gates.t().reshape(-1, 1).to(out.dtype)
        return slot_out.view(k, count, -1).sum(0).view_as(x)

    def idle_params(self) -> int:
        """Expert parameters a token does not use (E - k of E experts): left out of the FLOP count."""
        per_expert = sum(p.numel() for p in self.experts.parameters()) // self.cfg.experts
        return per_expert * (self.cfg.experts - self.cfg.top_k)


def expert_counts(expert: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Assignments per expert id 0..E-1 (ids >= E are not counted). A comparison, not bincount, which has no
    deterministic CUDA kernel."""
    return (expert.unsqueeze(1) == torch.arange(num_experts, device=expert.device)).sum(0)


def _position_in_expert(expert: torch.Tensor, num_experts: int) -> torch.Tensor:
    """For each assignment, how many earlier assignments chose the same expert."""
    onehot = F.one_hot(expert, num_experts)
    return (onehot.cumsum(0) * onehot).sum(-1) - 1


def aux_loss_of(model: nn.Module) -> torch.Tensor | None:
    """The sum of the MoE layers' weighted load-balancing losses from the last forward (None for a dense model).
    Works through wrappers (DDP, FSDP, activation checkpointing): it walks the modules."""
    losses = [m.aux_loss for m in model.modules() if isinstance(m, MoE) and m.aux_loss is not None]
    return torch.stack(losses).sum() if losses else None
