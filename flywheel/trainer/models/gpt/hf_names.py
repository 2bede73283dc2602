"""The GPT's parameter names in a Hugging Face GPT-2 model; its projections are Conv1D weights, stored transposed."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from flywheel.layout.shape import ModelShape

# (Flywheel name, HF name, transposed), `{i}` the block index.
HF_NAMES = [
    ("tok_emb.weight", "transformer.wte.weight", False),
    ("pos_emb.weight", "transformer.wpe.weight", False),
    *[(f"blocks.{{i}}.{ours}.{kind}", f"transformer.h.{{i}}.{theirs}.{kind}", False)
      for ours, theirs in (("ln_attn", "ln_1"), ("ln_mlp", "ln_2")) for kind in ("weight", "bias")],
    *[(f"blocks.{{i}}.{ours}.weight", f"transformer.h.{{i}}.{theirs}.weight", True)
      for ours, theirs in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"),
                           ("mlp.proj", "mlp.c_proj"))],
    *[(f"blocks.{{i}}.{ours}.bias", f"transformer.h.{{i}}.{theirs}.bias", False)
      for ours, theirs in (("attn.qkv", "attn.c_attn"), ("attn.proj", "attn.c_proj"), ("mlp.fc", "mlp.c_fc"),
                           ("mlp.proj", "mlp.c_proj"))],
    ("ln_f.weight", "transformer.ln_f.weight", False),
    ("ln_f.bias", "transformer.ln_f.bias", False),
    ("head.weight", "lm_head.weight", False),
]
# The embedding a tied LM head reads when the file has no lm_head.weight.
HF_TIED = "transformer.wte.weight"


def hf_row_order(name: str, shape: ModelShape, layouts: Mapping[str, str]) -> torch.Tensor | None:
    """Rows in the same order as HF's for every tensor (the GPT has no choice of layout)."""
    return None
