"""The Llama-family decoder: shapes, GQA, RoPE, tied/untied heads, presets with the published sizes, and the
planner's counts matching the model's."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from flywheel.layout.rules import tp_size_problems
from flywheel.layout.shape import PRESETS, RopeScaling
from flywheel.spec import SpecError, parse_spec
from flywheel.spec.job import ModelSpec
from flywheel.trainer.models.llama.model import Llama
from flywheel.trainer.models.llama.rope import rope_frequencies
from flywheel.trainer.models.registry import build_model

TINY = dataclasses.replace(PRESETS["llama-tiny"], seq_len=16)


def test_logits_shape_gqa_projections_and_tied_head():
    model = Llama(TINY)
    assert model(torch.randint(0, TINY.vocab, (3, 10))).shape == (3, 10, TINY.vocab)
    attn = model.blocks[0].attn
    assert attn.q.weight.shape == (64, 64) and attn.k.weight.shape == (32, 64)  # 2 of 4 heads' width for k, v
    assert model.head.weight is model.tok_emb.weight
    assert all(m.bias is None for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert isinstance(build_model(TINY), Llama)


def test_untied_head_and_qkv_biases():
    model = Llama(dataclasses.replace(TINY, tied_embeddings=False, attention_bias=True))
    assert model.head.weight is not model.tok_emb.weight
    attn = model.blocks[0].attn
    assert attn.q.bias is not None and attn.v.bias is not None and attn.o.bias is None


def test_attention_is_causal():
    model = Llama(TINY).eval()
    tokens = torch.randint(0, TINY.vocab, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % TINY.vocab
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.equal(before[0, :8], after[0, :8])
    assert not torch.allclose(before[0, 8:], after[0, 8:])


def test_init_is_a_function_of_the_seed():
    torch.manual_seed(7)
    a, b, c = Llama(TINY, seed=1).state_dict(), Llama(TINY, seed=1).state_dict(), Llama(TINY, seed=2).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.attn.q.weight"], c["blocks.0.attn.q.weight"])
    assert a["blocks.0.mlp.down.weight"].std() < a["blocks.0.mlp.up.weight"].std()


def test_llama3_rope_scaling_keeps_high_and_divides_low_frequencies():
    plain = rope_frequencies(64, 500000.0, None)
    scaled = rope_frequencies(64, 500000.0, RopeScaling(8.0, 1.0, 4.0, 8192))
    assert torch.equal(scaled[0], plain[0])  # short wavelengths untouched
    assert torch.allclose(scaled[-1], plain[-1] / 8.0)  # long ones divided by the factor


@pytest.mark.parametrize(("preset", "params"), [("llama3-1b", 1_235_814_400), ("llama3-8b", 8_030_261_248)])
def test_presets_have_the_published_sizes(preset, params):
    with torch.device("meta"):
        model = build_model(ModelSpec(preset=preset).shape())
    assert model.num_params() == params
    assert model.cfg.tied_embeddings == (preset == "llama3-1b")


@pytest.mark.parametrize("preset", ["llama-tiny", "llama3-1b", "llama3-8b"])
def test_the_planner_counts_parameters_and_flops_like_the_model(preset):
    from flywheel.spec.auto import shape_of

    spec = parse_spec({"trainer": {"model": {"preset": preset}}})
    with torch.device("meta"):
        model = build_model(spec.trainer.model.shape())
    shape = shape_of(spec)
    assert shape.params == model.num_params()
    assert shape.flops_per_token() == model.flops_per_token()


def test_spec_overrides_and_checks_kv_heads():
    shape = ModelSpec(preset="llama-tiny", kvHeads=1, ffn=96).shape()
    assert (shape.architecture, shape.kv_heads, shape.ffn) == ("llama", 1, 96)
    with pytest.raises(SpecError, match="kvHeads \\(3\\) does not divide heads \\(4\\)"):
        parse_spec({"trainer": {"model": {"preset": "llama-tiny", "kvHeads": 3}}})
    with pytest.raises(SpecError, match="grouped-query attention needs a llama architecture"):
        parse_spec({"trainer": {"model": {"preset": "gpt-tiny", "kvHeads": 2}}})
    with pytest.raises(SpecError, match="for the gpt architecture only"):
        parse_spec({"trainer": {"model": {"preset": "llama-tiny", "moe": {"experts": 2, "topK": 1}}}})


def test_tensor_parallel_needs_kv_heads_to_divide():
    tiny = PRESETS["llama-tiny"]
    assert tp_size_problems(tiny.heads, tiny.kv_heads, tiny.seq_len, tiny.ffn, 2) == []
    assert [p.detail for p in tp_size_problems(tiny.heads, tiny.kv_heads, tiny.seq_len, tiny.ffn, 4)] == [
        "kvHeads (2) is not divisible by tp (4)"]
