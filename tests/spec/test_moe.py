"""The MoE and expert-parallel fields of the spec: defaults that leave a dense job unchanged, and each bad
combination rejected naming the field and the fix."""

from __future__ import annotations

import copy

import pytest

from flywheel.spec import API_VERSION, SpecError, parse_job
from tests.builders import job_doc

BASE = job_doc({"replicas": {"min": 2, "max": 2}, "procsPerReplica": 2,
                "trainer": {"model": {"preset": "gpt-tiny", "moe": {"experts": 4, "topK": 2}},
                            "parallelism": {"ep": 2},
                            "training": {"steps": 10, "globalBatch": 16, "microBatch": 2}}}, name="moe")


def job(**changes: dict) -> dict:
    doc = copy.deepcopy(BASE)
    trainer = doc["spec"]["trainer"]
    for section, values in changes.items():
        if values is None:
            trainer.pop(section, None)
        else:
            trainer[section] = {**trainer.get(section, {}), **values}
    return doc


def test_defaults_keep_the_model_dense_and_ep_off():
    spec = parse_job({"apiVersion": API_VERSION, "kind": "TrainingJob", "metadata": {"name": "x"}}).spec
    assert spec.trainer.model.moe is None and spec.trainer.parallelism.ep == 1


def test_moe_fields_and_their_defaults():
    spec = parse_job(job(model={"moe": {}})).spec  # moe: {} takes every default
    moe = spec.trainer.model.moe
    assert (moe.experts, moe.top_k, moe.every, moe.aux_loss_weight, moe.capacity_factor) == (8, 2, 1, 0.01, None)
    spec = parse_job(job(model={"moe": {"experts": 4, "topK": 1, "every": 2, "auxLossWeight": 0.0,
                                        "capacityFactor": 1.25}})).spec
    assert spec.trainer.model.moe.capacity_factor == 1.25 and spec.trainer.parallelism.ep == 2


def test_an_elastic_job_needs_ep_to_divide_dp_at_every_size():
    doc = job(parallelism={"ep": 4}, training={"globalBatch": 48})
    doc["spec"]["replicas"] = {"min": 2, "max": 3}  # dp 4 and 6
    with pytest.raises(SpecError, match=r"spec\.trainer\.parallelism\.ep: ep = 4 does not divide dp = 6 .* at 3 "
                                        "replicas"):
        parse_job(doc)


# (changes to the trainer section, substring of the message: the field and the fix)
INVALID = [
    ({"model": {"moe": None}}, "spec.trainer.parallelism.ep: ep = 2 splits experts, but the model has none; set "
                               "model.moe"),
    ({"model": {"moe": {"experts": 6}}, "parallelism": {"ep": 4}},
     "spec.trainer.parallelism.ep: ep = 4 does not divide model.moe.experts (6)"),
    ({"parallelism": {"ep": 8}, "model": {"moe": {"experts": 8}}},
     "spec.trainer.parallelism.ep: ep = 8 does not divide dp = 4"),
    ({"parallelism": {"ep": 2, "tp": 4}}, "spec.trainer.parallelism.ep: ep = 2 does not divide dp = 1"),
    ({"parallelism": {"fsdp": False}}, "spec.trainer.parallelism.fsdp: ep = 2 needs fsdp: true"),
    ({"parallelism": {"ep": 1, "pp": 2}}, "spec.trainer.parallelism.pp: an MoE model runs with pp: 1"),
    ({"model": {"moe": {"experts": 4, "topK": 5}}}, "spec.trainer.model.moe.topK: topK (5) is more than experts (4)"),
    ({"model": {"moe": {"every": 3}}}, "spec.trainer.model.moe.every: 3 is more than layers (2)"),
    ({"model": {"moe": {"experts": 1}}}, "spec.trainer.model.moe.experts"),
    ({"model": {"moe": {"auxLossWeight": -0.1}}}, "spec.trainer.model.moe.auxLossWeight"),
    ({"model": {"moe": {"capacityFactor": 0}}}, "spec.trainer.model.moe.capacityFactor"),
    ({"model": {"moe": {"topk": 2}}}, "spec.trainer.model.moe.topk: unknown field"),
    ({"parallelism": {"ep": 0}}, "spec.trainer.parallelism.ep"),
]


@pytest.mark.parametrize("changes, expected", INVALID, ids=[e.split(":")[0] + f"-{i}" for i, (_, e) in
                                                             enumerate(INVALID)])
def test_invalid_moe_layouts_are_rejected_naming_the_field(changes, expected):
    with pytest.raises(SpecError) as err:
        parse_job(job(**changes))
    assert expected in str(err.value), str(err.value)


def test_the_moe_example_is_valid():
    from pathlib import Path

    from flywheel.spec import load_job

    spec = load_job(Path(__file__).resolve().parents[2] / "examples" / "moe-ep.yaml").spec
    assert spec.trainer.model.moe is not None and spec.trainer.parallelism.ep == 2
