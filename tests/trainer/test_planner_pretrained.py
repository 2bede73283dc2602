"""`parallelism.auto` with `trainer.model.pretrained`: the planner sizes the model from the directory's config.json
(a small random Llama saved by transformers) with the trainer's own mapping, offers only layouts the real shape
allows, and names the field when the config cannot be read or represented."""

from __future__ import annotations

import json

import pytest

from flywheel.planner import DEVICES
from flywheel.planner.search import layouts
from flywheel.spec import SpecError, parse_spec
from flywheel.spec.auto import plan_for_spec, resolve_auto, shape_of, spec_rules_view
from flywheel.trainer.models.registry import model_shape
from tests.trainer.hf_models import save_hf_model


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_hf_model("llama", tmp_path_factory.mktemp("hf-llama"))  # 4 heads, 2 kv heads, 2 layers


def job(pretrained, auto: bool = True, replicas: int = 2, procs: int = 4) -> dict:
    return {"replicas": {"min": replicas, "max": replicas}, "procsPerReplica": procs,
            "trainer": {"model": {"pretrained": str(pretrained), "seqLen": 32},
                        "parallelism": {"auto": auto, "device": "cpu"},
                        "training": {"globalBatch": 16, "microBatch": 1}}}


def test_auto_plans_a_pretrained_model_from_its_config(llama_dir):
    spec = parse_spec(job(llama_dir))  # validation runs the planner: no longer refused
    shape = shape_of(spec)
    assert shape == model_shape(spec.trainer.model)  # exactly what the workers build
    assert (shape.layers, shape.heads, shape.kv_heads, shape.seq_len) == (2, 4, 2, 32)
    resolved = resolve_auto(spec, DEVICES["cpu"])
    par = resolved.trainer.parallelism
    assert not par.auto and resolved.trainer.model.pretrained == str(llama_dir)
    assert shape.kv_heads % par.tp == 0 and shape.layers % par.pp == 0
    result = plan_for_spec(spec, 8, DEVICES["cpu"])
    assert result.chosen.layout.tp == par.tp and result.candidates


def test_only_layouts_the_real_shape_allows(llama_dir):
    spec = parse_spec(job(llama_dir))
    shape = shape_of(spec)
    offered = list(layouts(shape, 16, 8, base=spec_rules_view(spec)))
    assert {lay.tp for lay in offered} == {1, 2}  # tp 4 and 8 would split the 2 kv heads
    assert {lay.pp for lay in offered} <= {1, 2}  # 2 layers


def test_flywheel_plan_without_auto_reads_the_config_too(llama_dir):
    spec = parse_spec(job(llama_dir, auto=False))
    result = plan_for_spec(spec, 8, DEVICES["cpu"])
    assert result.candidates and result.chosen.layout.micro_batch == 1


def test_unreadable_or_unsupported_config_names_the_field(tmp_path, llama_dir):
    with pytest.raises(SpecError, match=r"trainer.model.pretrained: parallelism.auto sizes the model from .*"
                                        r"config.json, which cannot be read"):
        parse_spec(job(tmp_path / "missing"))
    bad = tmp_path / "relu"
    bad.mkdir()
    config = json.loads((llama_dir / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    with pytest.raises(SpecError, match=r"trainer.model.pretrained: config.json: hidden_act \"relu\" is not "
                                        r"supported"):
        parse_spec(job(bad))
