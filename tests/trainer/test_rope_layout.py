"""RoPE's two layouts (trainer/models/llama/rope.py): the same model with q and k rows reordered within each head,
Hugging Face's rows on import and export, and weights layouts as checkpoints record them (weights_layout.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flywheel.layout.shape import PRESETS, RopeScaling
from flywheel.trainer.models.hf_export import to_hf_state
from flywheel.trainer.models.llama.model import Llama
from flywheel.trainer.models.llama.rope import HALF, INTERLEAVED, Rotary, hf_rows
from flywheel.trainer.models.weights_layout import layouts_of, set_layouts

SHAPE = dataclasses.replace(PRESETS["llama-tiny"], seq_len=16, tied_embeddings=False, attention_bias=True,
                            rope_scaling=RopeScaling(8.0, 1.0, 4.0, 8))
ROTATED = (".attn.q.weight", ".attn.q.bias", ".attn.k.weight", ".attn.k.bias")


def test_hf_rows_pair_each_head_feature_with_its_rotation_partner():
    order = hf_rows(rows=3 * 8, head_dim=8)
    assert sorted(order.tolist()) == list(range(24))  # a permutation
    assert order[:8].tolist() == [0, 4, 1, 5, 2, 6, 3, 7]  # pair i: their features i and i + head_dim / 2
    assert order[8:16].tolist() == [8, 12, 9, 13, 10, 14, 11, 15]  # within its own head
    theirs = torch.randn(24, 5)
    assert torch.equal(theirs[order][order.argsort()], theirs)


def _reordered(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A half-layout model's weights for the interleaved layout (what the HF import does)."""
    out = {}
    for name, tensor in state.items():
        if name.endswith(ROTATED):
            out[name] = tensor[hf_rows(tensor.shape[0], SHAPE.head_dim)]
        else:
            out[name] = tensor
    return out


def test_both_layouts_are_the_same_model_with_q_and_k_rows_reordered():
    half = Llama(SHAPE, seed=3)
    set_layouts(half, {"rope": HALF})
    interleaved = Llama(SHAPE, seed=0)
    assert layouts_of(interleaved) == {"rope": INTERLEAVED}  # every new model
    interleaved.load_state_dict(_reordered(half.state_dict()))
    tokens = torch.randint(0, SHAPE.vocab, (2, SHAPE.seq_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = half(tokens), interleaved(tokens)
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
    set_layouts(interleaved, {"rope": HALF})  # the wrong layout for these weights: another model
    with torch.no_grad():
        assert (interleaved(tokens) - expected).abs().max() > 1e-3


def test_rotation_keeps_norms_and_position_zero():
    rotary = Rotary(SHAPE)
    q = torch.randn(2, 5, 4, SHAPE.head_dim)
    for layout in (INTERLEAVED, HALF):
        rotary.layout = layout
        rq, _ = rotary(q, q)
        assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1), atol=1e-5)
        assert torch.equal(rq[:, 0], q[:, 0])


def test_bf16_inputs_come_back_in_bf16():
    q = torch.randn(1, 4, 2, SHAPE.head_dim, dtype=torch.bfloat16)
    rq, rk = Rotary(SHAPE)(q, q)
    assert rq.dtype == rk.dtype == torch.bfloat16


def test_a_checkpoint_without_layouts_holds_the_legacy_layout_and_an_unknown_one_is_refused():
    model = Llama(SHAPE)
    set_layouts(model, {})
    assert layouts_of(model) == {"rope": HALF}
    set_layouts(model, {"rope": INTERLEAVED, "other": "x"})  # keys of modules it does not have: not its business
    assert layouts_of(model) == {"rope": INTERLEAVED}
    with pytest.raises(ValueError, match="rope layout is 'spiral'.*runs interleaved, half"):
        set_layouts(model, {"rope": "spiral"})


def test_export_gives_hugging_face_rows_in_either_layout():
    half = Llama(SHAPE, seed=3)
    theirs = to_hf_state(half.state_dict(), SHAPE, {})  # a legacy checkpoint: rows as they are
    assert torch.equal(theirs["model.layers.0.self_attn.q_proj.weight"], half.state_dict()["blocks.0.attn.q.weight"])
    interleaved = to_hf_state(_reordered(half.state_dict()), SHAPE, {"rope": INTERLEAVED})
    assert theirs.keys() == interleaved.keys()
    assert all(torch.equal(theirs[k], interleaved[k]) for k in theirs)
