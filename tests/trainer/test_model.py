import pytest
import torch

from flywheel.spec.job import ModelSpec
from flywheel.trainer.models.gpt.model import GPT, GPTConfig

TINY = GPTConfig(layers=2, dim=32, heads=4, vocab=97, seq_len=16)


def test_config_from_spec_uses_preset_and_overrides():
    assert ModelSpec(preset="gpt-125m").shape() == GPTConfig(12, 768, 12, 50304, 1024)
    cfg = ModelSpec(preset="gpt-tiny", layers=3, seqLen=32).shape()
    assert (cfg.layers, cfg.dim, cfg.heads, cfg.vocab, cfg.seq_len) == (3, 64, 4, 256, 32)


def test_logits_shape_and_tied_head():
    model = GPT(TINY)
    tokens = torch.randint(0, TINY.vocab, (3, 10))
    assert model(tokens).shape == (3, 10, TINY.vocab)
    assert model.head.weight is model.tok_emb.weight
    assert isinstance(model.blocks, torch.nn.ModuleList) and len(model.blocks) == TINY.layers
    # The tied matrix is counted once.
    per_block = 4 * 32 * 32 + 4 * 32 + 8 * 32 * 32 + 5 * 32 + 4 * 32
    assert model.num_params() == 97 * 32 + 16 * 32 + 2 * per_block + 2 * 32
    assert model.flops_per_token() == 6 * (model.num_params() - 16 * 32) + 12 * 2 * 32 * 16


def test_init_is_a_function_of_the_seed():
    torch.manual_seed(123)  # the global RNG must not matter
    a, b, c = GPT(TINY, seed=1).state_dict(), GPT(TINY, seed=1).state_dict(), GPT(TINY, seed=2).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["blocks.0.attn.qkv.weight"], c["blocks.0.attn.qkv.weight"])
    # Residual projections start smaller than the other matrices.
    assert a["blocks.0.mlp.proj.weight"].std() < a["blocks.0.mlp.fc.weight"].std()


def test_attention_is_causal():
    model = GPT(TINY).eval()
    tokens = torch.randint(0, TINY.vocab, (1, 12))
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % TINY.vocab
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.equal(before[0, :8], after[0, :8])
    assert not torch.allclose(before[0, 8:], after[0, 8:])


@pytest.mark.parametrize(("preset", "millions"), [("gpt-125m", 124), ("gpt-350m", 355), ("gpt-1.3b", 1316)])
def test_presets_have_the_usual_sizes(preset, millions):
    with torch.device("meta"):  # sizes without allocating gigabytes
        model = GPT(ModelSpec(preset=preset).shape())
    assert round(model.num_params() / 1e6) == millions


@pytest.mark.parametrize("preset", ["gpt-tiny", "gpt-125m", "gpt-350m", "gpt-1.3b"])
def test_the_planner_counts_parameters_and_flops_like_the_model(preset):
    from flywheel.spec import parse_spec
    from flywheel.spec.auto import shape_of

    spec = parse_spec({"trainer": {"model": {"preset": preset}}})
    with torch.device("meta"):  # sized without memory
        model = GPT(spec.trainer.model.shape())
    shape = shape_of(spec)
    assert shape.params == model.num_params()
    assert shape.flops_per_token() == model.flops_per_token()
