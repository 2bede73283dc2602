"""A Llama-family decoder (Llama 2/3, Mistral, Qwen2). Like model.py it knows nothing of parallelism.

Token embedding, pre-norm blocks of RMSNorm, grouped-query causal self-attention with rotary position embeddings
(`scaled_dot_product_attention`, `enable_gqa`) and a SwiGLU MLP (down(silu(gate(x)) * up(x))), a final RMSNorm and
an LM head, tied to the token embedding or not. No biases, except on q, k and v with `attention_bias` (Qwen2).

The parts are named as in the GPT (`tok_emb`, `blocks`, each with `ln_attn`, `attn`, `ln_mlp`, `mlp`, then `ln_f`
and `head`; the norms are RMSNorms here), so pipeline stages, FSDP and activation checkpointing treat both alike.
RoPE uses Hugging Face's layout (the two halves of a head rotated together: rotate_half), so HF Llama weights load
without the q/k permutation that Meta's interleaved layout would need. Its cos/sin tables are computed in fp32 from
the sequence length at first use (not parameters, not in the state dict).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from flywheel.layout.shape import ModelShape, RopeScaling
from flywheel.trainer.models.gpt.model import INIT_STD, InitStep, apply_init
from flywheel.trainer.models.lm_loss import head_output, lm_loss


def rope_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """Inverse frequencies (head_dim / 2,), fp32, with Llama 3's scaling when given (as transformers computes them)."""
    # On CPU even while the model is built on the meta device: these are no parameters, materialising skips them.
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim))
    if scaling is None:
        return inv_freq
    low_freq_wavelen = scaling.original_max_positions / scaling.low_freq_factor
    high_freq_wavelen = scaling.original_max_positions / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = ((scaling.original_max_positions / wavelen - scaling.low_freq_factor)
              / (scaling.high_freq_factor - scaling.low_freq_factor))
    blended = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Rotary(nn.Module):
    """cos/sin tables for positions 0..seq-1, cached per (sequence length, device)."""

    def __init__(self, cfg: ModelShape):
        super().__init__()
        self.inv_freq = rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self._cache: tuple[int, torch.device, torch.Tensor, torch.Tensor] | None = None

    def tables(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.compiler.is_compiling():
            # Traced into the compiled block, not cached: filling the cache inside it made the second call
            # recompile the block (a guard on the cache's state).
            return self._angles(seq, device)
        if self._cache is None or self._cache[:2] != (seq, device):
            self._cache = (seq, device, *self._angles(seq, device))
        return self._cache[2], self._cache[3]

    def _angles(self, seq: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = torch.outer(torch.arange(seq, dtype=torch.float32), self.inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos().to(device), angles.sin().to(device)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k: (batch, heads, seq, head_dim)."""
        cos, sin = self.tables(q.shape[-2], q.device)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


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
        q, k, v = (proj(x).view(batch, seq, -1, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        q, k = self.rotary(q, k)
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
