"""A GPT-style decoder. It knows nothing of parallelism: `parallelize.py` shards, replicates and checkpoints it.

Token + learned position embeddings, pre-LN blocks with causal self-attention (`scaled_dot_product_attention`)
and a GELU MLP, a final LayerNorm and an LM head tied to the token embedding. `model.blocks` is the unit that
FSDP and activation checkpointing wrap. With `cfg.moe` the MLP of every `moe.every`-th block is a mixture of
experts (`moe.py`, still under the name `mlp`); a dense model is unchanged, parameter for parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from flywheel.layout.shape import ModelShape
from flywheel.trainer.models.lm_loss import head_output, lm_loss
from flywheel.trainer.models.moe import Experts, MoE

INIT_STD = 0.02


GPTConfig = ModelShape  # architecture "gpt"; the one declaration of a model's shape is flywheel.layout.shape


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.head_dim = cfg.head_dim
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # [q | k | v] along the last dimension. The number of heads is read from the projection's output, so a
        # head-sharded projection (tensor parallel: [q_r | k_r | v_r]) runs through the same code.
        q, k, v = self.qkv(x).unflatten(-1, (3, -1)).unbind(2)
        # (batch, heads, seq, head_dim) for SDPA
        q, k, v = (t.view(batch, seq, -1, self.head_dim).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.proj(y.transpose(1, 2).reshape(batch, seq, -1))
        return out


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.dim, cfg.ffn)
        self.proj = nn.Linear(cfg.ffn, cfg.dim)
        self.approximate = "tanh" if cfg.activation == "gelu_tanh" else "none"  # GPT-2's own "gelu_new" is tanh

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(F.gelu(self.fc(x), approximate=self.approximate))
        return out


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, moe: bool = False):
        super().__init__()
        self.ln_attn = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = CausalSelfAttention(cfg)
        self.ln_mlp = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp: nn.Module = MoE(cfg.dim, cfg.moe, cfg.ffn) if moe and cfg.moe else MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        out: torch.Tensor = x + self.mlp(self.ln_mlp(x))
        return out


class GPT(nn.Module):
    """`forward(tokens[batch, seq]) -> logits[batch, seq, vocab]`. Weights are a pure function of `seed`."""

    def __init__(self, cfg: GPTConfig, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.init_seed = seed  # materialize.py replays the init after sharding a meta-device model
        self.loss_fn: Callable[..., torch.Tensor] = lm_loss  # parallelize.py may chunk or compile it
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.pos_emb = nn.Embedding(cfg.max_positions, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg, moe=cfg.moe is not None and cfg.moe.is_moe_block(i))
                                    for i in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.dim, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        self.head.weight = self.tok_emb.weight  # tied: one parameter, seen once by parameters()
        self.init_weights(seed)

    def init_weights(self, seed: int) -> None:
        """GPT-2 init from a private generator, so the global RNG and construction order do not matter."""
        apply_init(self, self.init_plan(), seed)

    def init_plan(self) -> list[InitStep]:
        """Every parameter's initial value, in generator order (meta-device init replays it: materialize.py)."""
        # Residual-branch outputs are scaled down so the residual stream's variance does not grow with depth.
        residual_std = INIT_STD / math.sqrt(2 * self.cfg.layers)
        plan: list[InitStep] = []
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                std = residual_std if name.endswith(".proj") else INIT_STD
                if module is not self.head:  # the head's weight is the token embedding, initialised below
                    plan.append((f"{name}.weight", "normal", std))
                if module.bias is not None:
                    plan.append((f"{name}.bias", "zeros", 0.0))
            elif isinstance(module, nn.Embedding):
                plan.append((f"{name}.weight", "normal", INIT_STD))
            elif isinstance(module, nn.LayerNorm):
                plan += [(f"{name}.weight", "ones", 0.0), (f"{name}.bias", "zeros", 0.0)]
            elif isinstance(module, Experts):  # like the dense MLP: the output projection is a residual branch
                plan += [(f"{name}.w1", "normal", INIT_STD), (f"{name}.w2", "normal", residual_std)]
        return plan

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """The logits; with `targets`, the mean language-model loss instead (`loss_fn`: lm_loss.py)."""
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return head_output(self.ln_f(x), self.head, self.loss_fn, targets)

    def num_params(self, include_embeddings: bool = True) -> int:
        """Distinct parameters (the tied head counts once); position embeddings optional, as in the FLOP count."""
        total = sum(p.numel() for p in self.parameters())
        return total if include_embeddings else total - self.pos_emb.weight.numel()

    def flops_per_token(self) -> int:
        """Training FLOPs per token: 6N for the matmuls (forward + backward) plus attention's 12 * L * dim * seq. For
        an MoE model N counts the parameters one token passes through: the router and k of the E experts."""
        cfg = self.cfg
        active = self.num_params(include_embeddings=False) - sum(m.idle_params() for m in self.modules()
                                                                   if isinstance(m, MoE))
        return 6 * active + 12 * cfg.layers * cfg.dim * cfg.seq_len


InitStep = tuple[str, str, float]  # (parameter name, "normal" | "zeros" | "ones", std)


def initial_value(kind: str, std: float, shape: torch.Size, gen: torch.Generator) -> torch.Tensor:
    """One parameter's full fp32 initial value on CPU ("normal" draws from `gen`), so the values do not depend on
    the device the model lives on or on how it is sharded."""
    if kind == "normal":
        return torch.empty(shape, dtype=torch.float32, device="cpu").normal_(0.0, std, generator=gen)
    return (torch.ones if kind == "ones" else torch.zeros)(shape, dtype=torch.float32, device="cpu")


@torch.no_grad()
def apply_init(model: nn.Module, plan: list[InitStep], seed: int) -> None:
    """Fills an unsharded model's parameters from `plan`. Meta tensors (sizing a model, or building it on the
    meta device to materialise it after sharding: materialize.py) have no values to fill; the draws are the same."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    params = dict(model.named_parameters())
    for name, kind, std in plan:
        param = params[name]
        if param.is_meta:
            continue
        param.copy_(initial_value(kind, std, param.shape, gen))
