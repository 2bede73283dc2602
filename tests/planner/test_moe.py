"""The planner on mixture-of-experts models: sizes and FLOPs as the trainer counts them, expert parallel in the
memory and time estimates, and the layouts (and `auto` picks) the trainer can run."""

from __future__ import annotations

import json

import pytest
import torch

from flywheel.layout.shape import MoEConfig
from flywheel.planner import DEVICES, Batch, Layout, ModelShape, estimate
from flywheel.planner.cost import _all_to_all_seconds, memory_breakdown
from flywheel.planner.search import layouts
from flywheel.spec import parse_spec
from flywheel.spec.auto import plan_for_spec, resolve_auto, shape_of
from flywheel.trainer.models.gpt.model import GPT

MOE = ModelShape(layers=12, dim=768, heads=12, vocab=50304, seq_len=1024, moe=MoEConfig(experts=8, top_k=2))


def lay(**kw: object) -> Layout:
    base = dict(dp=8, tp=1, pp=1, micro_batch=4, fsdp=True, zero=3, activation_checkpointing=False, ep=1)
    return Layout(**{**base, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize("moe", [{"experts": 4, "topK": 2}, {"experts": 8, "topK": 1, "every": 2}])
def test_the_planner_counts_moe_parameters_and_flops_like_the_model(moe):
    spec = parse_spec({"trainer": {"model": {"preset": "gpt-125m", "moe": moe}}})
    with torch.device("meta"):
        model = GPT(spec.trainer.model.shape())
    shape = shape_of(spec)
    assert shape.params == model.num_params()
    assert shape.flops_per_token() == model.flops_per_token()
    dense = shape_of(parse_spec({"trainer": {"model": {"preset": "gpt-125m"}}}))
    assert shape.params > dense.params  # more parameters ...
    assert shape.flops_per_token() < 2 * dense.flops_per_token()  # ... but only k experts' compute per token


def test_expert_parallel_shrinks_what_zero2_keeps_whole_and_the_gathered_block():
    batch, dev = Batch(64, "bf16"), DEVICES["h100"]
    for zero, part in ((2, "parameters"), (3, "gradients")):
        one = memory_breakdown(MOE, batch, lay(zero=zero), dev)[part]
        four = memory_breakdown(MOE, batch, lay(zero=zero, ep=4), dev)[part]
        assert four < one
    # ZeRO-3 at rest: experts are sharded over edp = dp / ep after ep: 1/dp of them per rank either way.
    z3 = [memory_breakdown(MOE, batch, lay(ep=ep), dev)["optimizer"] for ep in (1, 2, 8)]
    assert z3[0] == pytest.approx(z3[1]) == pytest.approx(z3[2])


def test_all_to_all_costs_time_and_more_across_workers():
    batch, dev = Batch(64, "bf16"), DEVICES["h100"]
    assert _all_to_all_seconds(MOE, batch, lay(), dev, 8) == 0.0
    inside, across = (_all_to_all_seconds(MOE, batch, lay(ep=2), dev, rpw) for rpw in (8, 1))
    assert 0 < inside < across / 3  # the ep group across workers pays the slow link
    recompute = _all_to_all_seconds(MOE, batch, lay(ep=2, activation_checkpointing=True), dev, 8)
    assert recompute > inside  # the forward's all-to-alls run again
    # Smaller expert shards over a smaller edp group: the experts' gradient traffic falls with ep.
    comm = [estimate(MOE, batch, lay(ep=ep), dev, 8).communication_seconds - _all_to_all_seconds(
        MOE, batch, lay(ep=ep), dev, 8) for ep in (1, 4)]
    assert comm[1] < comm[0]


def test_moe_layouts_are_those_the_trainer_runs():
    found = list(layouts(MOE, global_batch=16, world_size=8))
    assert {x.ep for x in found} == {1, 2, 4, 8}
    assert all(x.pp == 1 for x in found)  # the MoE model has no pipeline stages
    assert all(x.fsdp for x in found if x.ep > 1)  # expert parallel needs FSDP
    assert all(x.dp % x.ep == 0 and MOE.experts % x.ep == 0 for x in found)
    assert {x.ep for x in layouts(MOE, 16, 8, ep_limit=2)} == {1, 2}
    dense = ModelShape(12, 768, 12, 50304, 1024)
    assert {x.ep for x in layouts(dense, 16, 8)} == {1}


def test_plan_reports_ep_and_auto_keeps_it_valid_at_every_world_size():
    doc = {"replicas": {"min": 2, "max": 3}, "procsPerReplica": 2,
           "trainer": {"model": {"preset": "gpt-125m", "moe": {"experts": 8, "topK": 2}},
                       "parallelism": {"auto": True}, "training": {"globalBatch": 48, "microBatch": 1}}}
    spec = parse_spec(doc)
    out = plan_for_spec(spec, 6, DEVICES["h100"]).to_json(top=2)
    assert "ep" in out["chosen"]
    resolved = resolve_auto(spec, DEVICES["h100"])
    par = resolved.trainer.parallelism
    assert not par.auto and par.pp == 1 and 8 % par.ep == 0
    assert all((w // (par.tp * par.pp)) % par.ep == 0 for w in (4, 6))  # dp at 2 and 3 replicas
    parse_spec(json.loads(resolved.model_dump_json(by_alias=True)))  # what the workers get validates
