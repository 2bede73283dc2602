"""Rotary position embeddings, in either of the two layouts of a head's features that the field uses.

- interleaved (Meta's original Llama, TorchTitan): features 2i and 2i+1 of a head rotate together by frequency i, so
  a head is head_dim / 2 complex numbers and the rotation is one complex multiply. Flywheel's layout for every new
  model: on a CPU its forward and backward take a quarter of the half layout's time (the half layout's chunk, neg,
  cat, two multiplies and an add, each a pass over q and k, and as many in backward, were ~10% of a Llama forward).
- half (Hugging Face's `rotate_half`): features i and i + head_dim / 2 rotate together. Checkpoints written before
  the interleaved layout existed hold q and k in it, and resume in it (`weights_layout.py`).

The two are the same model with the rows of the q and k projections reordered within each head (`hf_rows`):
attention scores are dot products of q and k, which a permutation applied to both leaves as they are. Hugging Face
weights are reordered on import and back on export. The cos/sin (complex) tables are computed in fp32 from the
sequence length at first use (no parameters, not in the state dict).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from flywheel.layout.shape import ModelShape, RopeScaling

INTERLEAVED = "interleaved"
HALF = "half"
LAYOUTS = (INTERLEAVED, HALF)


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
    """Rotates q and k (batch, seq, heads, head_dim) by their positions 0..seq-1 in `layout`. The tables are cached
    per (sequence length, device, layout).

    `layout` is a weights layout (`weights_layout.py`): checkpoints record it under `layout_key`, and one without
    it holds `legacy_layout`."""

    layout_key = "rope"
    layouts = LAYOUTS
    legacy_layout = HALF

    def __init__(self, cfg: ModelShape, layout: str = INTERLEAVED):
        super().__init__()
        self.inv_freq = rope_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        self.layout = layout
        self._cache: tuple[tuple[int, torch.device, str], tuple[torch.Tensor, ...]] | None = None

    def tables(self, seq: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        """interleaved: (cis,) complex (seq, 1, head_dim / 2); half: (cos, sin), each (seq, 1, head_dim)."""
        if torch.compiler.is_compiling():
            # Traced into the compiled block, not cached: filling the cache inside it made the second call
            # recompile the block (a guard on the cache's state).
            return self._tables(seq, device)
        key = (seq, device, self.layout)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, self._tables(seq, device))
        return self._cache[1]

    def _tables(self, seq: int, device: torch.device) -> tuple[torch.Tensor, ...]:
        freqs = torch.outer(torch.arange(seq, dtype=torch.float32), self.inv_freq)
        if self.layout == INTERLEAVED:
            return (torch.polar(torch.ones_like(freqs), freqs)[:, None, :].to(device),)
        angles = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return angles.cos().to(device), angles.sin().to(device)

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tables = self.tables(q.shape[1], q.device)
        if self.layout == INTERLEAVED:
            return _rotate_pairs(q, tables[0]), _rotate_pairs(k, tables[0])
        cos, sin = (t.to(q.dtype) for t in tables)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _rotate_pairs(x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
    """x's feature pairs as complex numbers times cis, in fp32 (x may be bf16), back in x's dtype."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * cis).flatten(-2).type_as(x)


def hf_rows(rows: int, head_dim: int) -> torch.Tensor:
    """The interleaved layout's rows of a q or k projection (`rows` = heads x head_dim) as indices of Hugging
    Face's half-layout rows: `ours = theirs[hf_rows(...)]`, `theirs = ours[hf_rows(...).argsort()]`."""
    within = torch.arange(head_dim)
    half_row = within // 2 + (within % 2) * (head_dim // 2)  # feature 2i is their i, 2i+1 their i + head_dim / 2
    heads = torch.arange(0, rows, head_dim)
    return (heads[:, None] + half_row[None, :]).flatten()
