"""The mixture-of-experts layer (flywheel/trainer/models/moe.py), single process: top-k routing and gating against a
per-token computation, the load-balancing loss on known cases, the capacity cap, which blocks get experts, and a
dense model left exactly as it was."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from flywheel.spec.job import ModelSpec
from flywheel.trainer.models.gpt.model import GPT, MLP, GPTConfig
from flywheel.trainer.models.moe import MoE, MoEConfig, aux_loss_of, load_balancing_loss

DIM = 8


def layer(experts: int = 4, top_k: int = 2, **kw: object) -> MoE:
    torch.manual_seed(0)
    moe = MoE(DIM, MoEConfig(experts=experts, top_k=top_k, **kw))  # type: ignore[arg-type]
    with torch.no_grad():
        for p in moe.parameters():
            p.normal_(0, 0.5)
    return moe


def per_token(moe: MoE, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """The layer's output computed one token at a time from its definition."""
    tokens = x.reshape(-1, DIM)
    probs = (tokens @ moe.router.weight.t()).softmax(-1)
    out = torch.zeros_like(tokens)
    for t in range(tokens.shape[0]):
        gates, chosen = probs[t].topk(moe.cfg.top_k)
        if moe.cfg.top_k > 1:
            gates = gates / gates.sum()
        for slot, (g, e) in enumerate(zip(gates, chosen)):
            if keep is None or keep[slot, t]:
                w1, w2 = moe.experts.w1[e], moe.experts.w2[e]
                out[t] += g * (F.gelu(tokens[t] @ w1) @ w2)
    return out.view_as(x)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_output_is_the_gated_sum_of_the_top_k_experts(top_k):
    moe = layer(top_k=top_k)
    x = torch.randn(2, 5, DIM)
    assert torch.allclose(moe(x), per_token(moe, x), atol=1e-5)


def test_top_1_keeps_the_raw_probability_so_the_router_learns_from_the_loss():
    moe = layer(top_k=1, aux_loss_weight=0.0)
    moe(torch.randn(2, 5, DIM)).sum().backward()
    assert moe.router.weight.grad is not None and moe.router.weight.grad.abs().sum() > 0


def test_load_balancing_loss_on_known_cases():
    experts = 4
    uniform = torch.full((6, experts), 1 / experts)
    # Uniform probabilities: E x sum_i f_i / E = 1 whatever the choices.
    assert load_balancing_loss(uniform, torch.zeros(6, 1, dtype=torch.long), experts).item() == pytest.approx(1.0)
    # Every token sure of expert 0 and sent there: f = P = (1, 0, 0, 0), loss = E.
    sure = torch.tensor([[1.0, 0, 0, 0]]).repeat(6, 1)
    assert load_balancing_loss(sure, torch.zeros(6, 1, dtype=torch.long), experts).item() == pytest.approx(4.0)
    # Two tokens, top-2: f = (2, 1, 1, 0) / 4 and P the mean row: 4 x (0.5*0.4 + 0.25*0.35 + 0.25*0.2 + 0) = 1.35.
    probs = torch.tensor([[0.5, 0.3, 0.1, 0.1], [0.3, 0.4, 0.3, 0.0]])
    chosen = torch.tensor([[0, 1], [0, 2]])
    assert load_balancing_loss(probs, chosen, experts).item() == pytest.approx(4 * (0.5 * 0.4 + 0.25 * 0.35
                                                                                    + 0.25 * 0.2))


def test_the_layer_reports_its_weighted_balancing_loss_and_the_model_sums_them():
    cfg = GPTConfig(layers=3, dim=16, heads=2, vocab=32, seq_len=8, moe=MoEConfig(experts=4, top_k=2,
                                                                                  aux_loss_weight=0.5))
    model = GPT(cfg)
    model(torch.randint(0, 32, (2, 8)))
    layers = [b.mlp for b in model.blocks]
    assert all(isinstance(m, MoE) for m in layers)
    assert all(m.aux_loss.item() > 0 and m.aux_loss.requires_grad for m in layers)
    assert aux_loss_of(model).item() == pytest.approx(sum(m.aux_loss.item() for m in layers))
    assert aux_loss_of(GPT(GPTConfig(1, 16, 2, 32, 8))) is None


def test_capacity_serves_first_choices_before_second_choices_in_token_order():
    moe = layer(experts=2, top_k=2, capacity_factor=0.5)  # ceil(0.5 x 6 x 2 / 2) = 3 slots per expert
    x = torch.randn(1, 6, DIM)
    tokens = x.reshape(-1, DIM)
    chosen = (tokens @ moe.router.weight.t()).softmax(-1).topk(2).indices  # (6, 2)
    keep = torch.zeros(2, 6, dtype=torch.bool)
    used = [0, 0]
    for slot in range(2):
        for t in range(6):
            e = int(chosen[t, slot])
            keep[slot, t] = used[e] < 3
            used[e] += 1
    assert not keep.all()  # the case drops something
    assert torch.allclose(moe(x), per_token(moe, x, keep), atol=1e-5)


def test_every_picks_the_moe_blocks_and_dense_blocks_keep_their_mlp():
    cfg = ModelSpec.model_validate({"preset": "gpt-tiny", "layers": 4,
                                    "moe": {"experts": 4, "topK": 1, "every": 2}}).shape()
    model = GPT(cfg)
    assert [type(b.mlp) for b in model.blocks] == [MLP, MoE, MLP, MoE]
    assert model.blocks[1].mlp.experts.w1.shape == (4, 64, 256)


def test_a_dense_model_is_unchanged():
    # The keys and values of a model without moe are those of the dense GPT (checkpoints from before still load).
    dense = GPT(GPTConfig(2, 16, 2, 32, 8), seed=3).state_dict()
    assert ModelSpec().shape().moe is None
    assert sorted(k.split(".", 2)[-1] for k in dense if k.startswith("blocks.0.")) == [
        "attn.proj.bias", "attn.proj.weight", "attn.qkv.bias", "attn.qkv.weight", "ln_attn.bias", "ln_attn.weight",
        "ln_mlp.bias", "ln_mlp.weight", "mlp.fc.bias", "mlp.fc.weight", "mlp.proj.bias", "mlp.proj.weight"]
    moe_model = GPT(GPTConfig(2, 16, 2, 32, 8, moe=MoEConfig(experts=2, top_k=1, every=2)), seed=3).state_dict()
    for key in ("tok_emb.weight", "blocks.0.mlp.fc.weight", "blocks.0.attn.qkv.weight"):
        assert torch.equal(dense[key], moe_model[key])  # parameters drawn before the first expert are the same


def test_flops_count_the_active_experts_only():
    cfg = GPTConfig(2, 16, 2, 32, 8, moe=MoEConfig(experts=4, top_k=1))
    model = GPT(cfg)
    expert_params = 2 * 16 * 64  # w1 and w2 of one expert
    idle = 2 * 3 * expert_params  # 3 of 4 experts unused per token, in 2 layers
    dense_equivalent = model.num_params(include_embeddings=False) - idle
    assert model.flops_per_token() == 6 * dense_equivalent + 12 * 2 * 16 * 8
    assert math.isclose(model.num_params() - GPT(GPTConfig(2, 16, 2, 32, 8)).num_params(),
                        2 * (4 * expert_params + 16 * 4 - (8 * 16 * 16 + 5 * 16)))
