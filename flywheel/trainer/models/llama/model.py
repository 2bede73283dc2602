"""A Llama-family decoder (Llama 2/3, Mistral, Qwen2). Like model.py it knows nothing of parallelism.

Token embedding, pre-norm blocks of RMSNorm, grouped-query causal self-attention with rotary position embeddings
(`scaled_dot_product_attention`, `enable_gqa`) and a SwiGLU MLP (down(silu(gate(x)) * up(x))), a final RMSNorm and
an LM head, tied to the token embedding or not. No biases, except on q, k and v with `attention_bias` (Qwen2).

The parts are named as in the GPT (`tok_emb`, `blocks`, each with `ln_attn`, `attn`, `ln_mlp`, `mlp`, then `ln_f`
and `head`; the norms are RMSNorms here), so pipeline stages, FSDP and activation checkpointing treat both alike.
RoPE rotates a head's features in pairs (rope.py: Meta's interleaved layout, one complex multiply; Hugging Face
weights are reordered on import and export; checkpoints of the half layout resume in it).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from flywheel.layout.shape import ModelShape
from flywheel.trainer.models.gpt.model import INIT_STD, InitStep, apply_init
from flywheel.trainer.models.llama.rope import Rotary
from flywheel.trainer.models.lm_loss import head_output, lm_loss


class GroupedQueryAttention(nn.Module):
    def __init__(self, cfg: ModelShape):
        super().__init__()
        self.head_dim = cfg.head_dim
        kv_width = cfg.kv_heads * cfg.head_dim
        self.q = nn.Linear(cfg.dim, cfg.heads * cfg.head_dim, bias=cfg.attention_bias)
        self.k = nn.Linear(cfg.dim, kv_width, bias=cfg.attention_bias)
        self.v = nn.Linear(cfg.dim, kv_width, bias=cfg.attention_bias)
        self.o = nn.Linear(cfg.heads * cfg.head_dim, cfg.dim, bias=False)
        self.rotary = Rotary(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # Head counts come from the projections' outputs, so head-sharded projections (tensor parallel) run here too.
        q, k, v = (proj(x).view(batch, seq, -1, self.head_dim) for proj in (self.q, self.k, self.v))
        q, k = self.rotary(q, k)  # on (batch, seq, heads, head_dim): contiguous, as the projections write them
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])
        out: torch.Tensor = self.o(y.transpose(1, 2).reshape(batch, seq, -1))
        return out


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelShape):
        super().__init__()
        self.gate = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.up = nn.Linear(cfg.dim, cfg.ffn, bias=False)
        self.down = nn.Linear(cfg.ffn, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(F.silu(self.gate(x)) * self.up(x))
        return out


class LlamaBlock(nn.Module):
    def __init__(self, cfg: ModelShape):
        super().__init__()
        self.ln_attn = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.attn = GroupedQueryAttention(cfg)
        self.ln_mlp = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x))
        out: torch.Tensor = x + self.mlp(self.ln_mlp(x))
        return out


class Llama(nn.Module):
    """`forward(tokens[batch, seq]) -> logits[batch, seq, vocab]`. Weights are a pure function of `seed`."""

    pos_emb = None  # rotary positions: no learned position embedding (pipeline stages look for one)

    def __init__(self, cfg: ModelShape, seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.init_seed = seed  # materialize.py replays the init after sharding a meta-device model
        self.loss_fn: Callable[..., torch.Tensor] = lm_loss  # parallelize.py may chunk or compile it
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(LlamaBlock(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)
        if cfg.tied_embeddings:
            self.head.weight = self.tok_emb.weight
        self.init_weights(seed)

    def init_weights(self, seed: int) -> None:
        apply_init(self, self.init_plan(), seed)

    def init_plan(self) -> list[InitStep]:
        """Normal(0, 0.02) weights from a private generator, residual outputs (attn.o, mlp.down) scaled by
        1 / sqrt(2 x layers) like the GPT's, zero biases, unit norms; in generator order."""
        residual_std = INIT_STD / math.sqrt(2 * self.cfg.layers)
        plan: list[InitStep] = []
        for name, module in self.named_modules():
            if isinstance(module, nn.Linear):
                if module is not self.head or not self.cfg.tied_embeddings:
                    std = residual_std if name.endswith((".o", ".down")) else INIT_STD
                    plan.append((f"{name}.weight", "normal", std))
                if module.bias is not None:
                    plan.append((f"{name}.bias", "zeros", 0.0))
            elif isinstance(module, nn.Embedding):
                plan.append((f"{name}.weight", "normal", INIT_STD))
            elif isinstance(module, nn.RMSNorm) and module.weight is not None:
                plan.append((f"{name}.weight", "ones", 0.0))
        return plan

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """The logits; with `targets`, the mean language-model loss instead (`loss_fn`: lm_loss.py)."""
        x = self.tok_emb(tokens)
        for block in self.blocks:
            x = block(x)
        return head_output(self.ln_f(x), self.head, self.loss_fn, targets)

    def num_params(self, include_embeddings: bool = True) -> int:
        """Distinct parameters (a tied head counts once); without embeddings: without the input embedding lookup
        when the head is untied (a tied one is the head's matmul), as in the FLOP count."""
        total = sum(p.numel() for p in self.parameters())
        lookup = 0 if self.cfg.tied_embeddings else self.tok_emb.weight.numel()
        return total if include_embeddings else total - lookup

    def flops_per_token(self) -> int:
        """6N for the matmuls (forward + backward) plus attention's 12 * L * dim * seq (spec_model's count)."""
        cfg = self.cfg
        return 6 * self.num_params(include_embeddings=False) + 12 * cfg.layers * cfg.dim * cfg.seq_len
