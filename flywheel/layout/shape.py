"""The shape of a model, declared once: the trainer builds it (`trainer/models/gpt/model.py`,
`trainer/models/llama/model.py`), the planner costs it (`planner/cost.py`) and the spec names it through presets
(`trainer.model.preset`). Plain data, no torch.

Two architectures:
- "gpt": GPT-2 style: learned position embeddings (`max_positions` rows), LayerNorm, a GELU MLP of width `ffn`,
  biases everywhere, fused q/k/v, the LM head tied to the token embedding; optionally mixture-of-experts MLPs.
- "llama": Llama style: rotary position embeddings (`rope_theta`, optional Llama 3 `rope_scaling`), RMSNorm, a
  SwiGLU MLP of width `ffn` (gate, up and down matrices), grouped-query attention (`kv_heads` key/value heads), no
  biases (Qwen2-style q/k/v biases with `attention_bias`), the LM head tied to the embedding or not.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

Architecture = Literal["gpt", "llama"]
ARCHITECTURES: tuple[str, ...] = ("gpt", "llama")


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's frequency-dependent RoPE scaling: wavelengths longer than original_max_positions / low_freq_factor
    are divided by `factor`, shorter than original_max_positions / high_freq_factor kept, those between blended."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_positions: int


@dataclass(frozen=True)
class MoEConfig:
    """Mixture-of-experts MLPs (gpt only; `trainer/models/moe.py`)."""

    experts: int
    top_k: int
    every: int = 1
    aux_loss_weight: float = 0.01
    capacity_factor: float | None = None

    def is_moe_block(self, index: int) -> bool:
        """Blocks every-1, 2*every-1, ... (0-based) get experts: every block at 1, every other at 2."""
        return (index + 1) % self.every == 0


@dataclass(frozen=True)
class ModelShape:
    """A decoder's architecture and sizes. `kv_heads` 0 means as many as `heads`, `ffn` 0 four times `dim`,
    `max_positions` 0 `seq_len` (normalised on construction, so equal shapes compare equal)."""

    layers: int
    dim: int
    heads: int
    vocab: int
    seq_len: int
    architecture: Architecture = "gpt"
    kv_heads: int = 0
    ffn: int = 0
    max_positions: int = 0  # gpt: rows of the position embedding; llama: informational (exported to config.json)
    norm_eps: float = 1e-5
    activation: Literal["gelu", "gelu_tanh", "silu"] = "gelu"  # gpt: exact or tanh GELU; llama: silu
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tied_embeddings: bool = True
    attention_bias: bool = False  # llama: biases on q, k and v (Qwen2)
    moe: MoEConfig | None = field(default=None)

    def __post_init__(self) -> None:
        defaults = {"kv_heads": self.heads, "ffn": 4 * self.dim, "max_positions": self.seq_len}
        for name, value in defaults.items():
            if not getattr(self, name):
                object.__setattr__(self, name, value)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    # The planner's view of the experts (0 for a dense model).
    @property
    def experts(self) -> int:
        return self.moe.experts if self.moe else 0

    @property
    def top_k(self) -> int:
        return self.moe.top_k if self.moe else 0

    @property
    def moe_every(self) -> int:
        return self.moe.every if self.moe else 1

    # Parameter counts (the trainer's models have exactly these: tests/trainer/test_llama.py checks them).
    @property
    def moe_layers(self) -> int:
        return self.layers // self.moe_every if self.moe else 0

    @property
    def expert_params(self) -> int:
        return 2 * self.dim * self.ffn  # one expert: dim x ffn in and back, no biases

    @property
    def attention_params(self) -> int:
        d, kv_width = self.dim, self.kv_heads * self.head_dim
        if self.architecture == "gpt":
            return 4 * d * d + 4 * d  # fused qkv and the output projection, with biases
        return 2 * d * d + 2 * d * kv_width + (d + 2 * kv_width if self.attention_bias else 0)

    @property
    def norm_params(self) -> int:
        return 2 * self.dim if self.architecture == "gpt" else self.dim  # LayerNorm weight and bias; RMSNorm weight

    @property
    def moe_shared_params(self) -> int:
        """An MoE block's parameters besides router and experts: attention and the two norms."""
        return self.attention_params + 2 * self.norm_params

    @property
    def all_expert_params(self) -> int:
        return self.moe_layers * self.experts * self.expert_params

    @property
    def mlp_params(self) -> int:
        if self.architecture == "gpt":
            return 2 * self.dim * self.ffn + self.ffn + self.dim
        return 3 * self.dim * self.ffn  # gate, up, down

    @property
    def block_params(self) -> int:
        return self.attention_params + self.mlp_params + 2 * self.norm_params

    @property
    def position_params(self) -> int:
        return self.max_positions * self.dim if self.architecture == "gpt" else 0

    @property
    def embedding_params(self) -> int:
        """Token (and learned position) embeddings, and the LM head when it is not tied to the token embedding."""
        head = 0 if self.tied_embeddings else self.vocab * self.dim
        return self.vocab * self.dim + head + self.position_params

    @property
    def params(self) -> int:
        moe = self.moe_layers * (self.moe_shared_params + self.dim * self.experts) + self.all_expert_params
        return (self.layers - self.moe_layers) * self.block_params + moe + self.embedding_params + self.norm_params

    def flops_per_token(self) -> float:
        """Training FLOPs per token: 6N over the parameters a token multiplies with (not the position embedding,
        not an untied input embedding, not the E - k experts it skips), plus attention's 12 * layers * dim * seq."""
        idle = self.moe_layers * (self.experts - self.top_k) * self.expert_params
        lookups = self.position_params + (0 if self.tied_embeddings else self.vocab * self.dim)
        return 6 * (self.params - lookups - idle) + 12 * self.layers * self.dim * self.seq_len

    def moe_flops_per_token(self) -> float:
        """The part of those FLOPs in router and experts."""
        return 6 * self.moe_layers * (self.dim * self.experts + self.top_k * self.expert_params)


# Presets. gpt-tiny and llama-tiny are for CPU tests; the others are the usual GPT-2/3 sizes and the published Meta
# Llama 3.2-1B and 3.1-8B configurations (trained here at a shorter seqLen than their 131072 positions).
_LLAMA3_1B_SCALING = RopeScaling(factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192)
_LLAMA3_8B_SCALING = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_positions=8192)
PRESETS: dict[str, ModelShape] = {
    "gpt-tiny": ModelShape(layers=2, dim=64, heads=4, vocab=256, seq_len=64),
    "gpt-125m": ModelShape(layers=12, dim=768, heads=12, vocab=50304, seq_len=1024),
    "gpt-350m": ModelShape(layers=24, dim=1024, heads=16, vocab=50304, seq_len=1024),
    "gpt-1.3b": ModelShape(layers=24, dim=2048, heads=16, vocab=50304, seq_len=2048),
    "llama-tiny": ModelShape(layers=2, dim=64, heads=4, vocab=256, seq_len=64, architecture="llama", kv_heads=2,
                             ffn=128, max_positions=64, norm_eps=1e-5, activation="silu", rope_theta=10000.0),
    "llama3-1b": ModelShape(layers=16, dim=2048, heads=32, vocab=128256, seq_len=2048, architecture="llama",
                            kv_heads=8, ffn=8192, max_positions=131072, norm_eps=1e-5, activation="silu",
                            rope_theta=500000.0, rope_scaling=_LLAMA3_1B_SCALING, tied_embeddings=True),
    "llama3-8b": ModelShape(layers=32, dim=4096, heads=32, vocab=128256, seq_len=2048, architecture="llama",
                            kv_heads=8, ffn=14336, max_positions=131072, norm_eps=1e-5, activation="silu",
                            rope_theta=500000.0, rope_scaling=_LLAMA3_8B_SCALING, tied_embeddings=False),
}


def shape_to_dict(shape: ModelShape) -> dict[str, Any]:
    """Plain JSON-able data (the trainer records it beside its checkpoints; `flywheel export` reads it back)."""
    return dataclasses.asdict(shape)


def shape_from_dict(data: dict[str, Any]) -> ModelShape:
    scaling, moe = data.get("rope_scaling"), data.get("moe")
    return ModelShape(**{**data, "rope_scaling": RopeScaling(**scaling) if scaling else None,
                         "moe": MoEConfig(**moe) if moe else None})
