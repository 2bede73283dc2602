"""The Llama's parameter names in a Hugging Face model (LlamaForCausalLM and its family), and the rows that RoPE's
layout reorders."""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

from flywheel.layout.shape import ModelShape
from flywheel.trainer.models.llama.rope import INTERLEAVED, Rotary, hf_rows

# (Flywheel name, HF name, transposed), `{i}` the block index.
HF_NAMES = [
    ("tok_emb.weight", "model.embed_tokens.weight", False),
    ("blocks.{i}.ln_attn.weight", "model.layers.{i}.input_layernorm.weight", False),
    *[(f"blocks.{{i}}.attn.{p}.{kind}", f"model.layers.{{i}}.self_attn.{p}_proj.{kind}", False)
      for p in "qkv" for kind in ("weight", "bias")],
    ("blocks.{i}.attn.o.weight", "model.layers.{i}.self_attn.o_proj.weight", False),
    ("blocks.{i}.ln_mlp.weight", "model.layers.{i}.post_attention_layernorm.weight", False),
    *[(f"blocks.{{i}}.mlp.{p}.weight", f"model.layers.{{i}}.mlp.{p}_proj.weight", False)
      for p in ("gate", "up", "down")],
    ("ln_f.weight", "model.norm.weight", False),
    ("head.weight", "lm_head.weight", False),
]
# The embedding a tied LM head reads when the file has no lm_head.weight.
HF_TIED = "model.embed_tokens.weight"


def hf_row_order(name: str, shape: ModelShape, layouts: Mapping[str, str]) -> torch.Tensor | None:
    """The rows of our tensor `name` as indices of the HF tensor's rows (`ours = theirs[order]`); None where they
    are the same. Only q and k (weights and biases) differ, and only in the interleaved RoPE layout (rope.py)."""
    if layouts.get(Rotary.layout_key, Rotary.legacy_layout) != INTERLEAVED:
        return None
    found = _ROTATED.match(name)
    if found is None:
        return None
    heads = shape.heads if found.group(1) == "q" else shape.kv_heads
    return hf_rows(heads * shape.head_dim, shape.head_dim)


_ROTATED = re.compile(r"^blocks\.\d+\.attn\.([qk])\.(weight|bias)$")
