"""Meta-device initialisation: built on the meta device, sharded, then materialised, every layout starts from
bitwise the parameters of the plain model built on CPU from the same seed (materialize.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from flywheel.spec.job import ModelSpec
from flywheel.trainer.models.materialize import META, is_meta
from flywheel.trainer.models.registry import build_model

from .harness import run_layout

SEED = 5
MOE = {"preset": "gpt-tiny", "moe": {"experts": 4, "topK": 2}}


def initial_params(world: int, workdir: Path, model: dict[str, Any], parallelism: dict[str, Any]) -> dict[str, Any]:
    result = run_layout(world, workdir, parallelism=parallelism, model=model, metaInit=True, seed=SEED, initOnly=True,
                        initChunkElements=64)
    return result["params"]


def plain_params(model: dict[str, Any]) -> dict[str, torch.Tensor]:
    return build_model(ModelSpec.model_validate(model).shape(), seed=SEED).state_dict()


def assert_bitwise_equal(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_meta_build_allocates_nothing_and_draws_the_same_plan():
    shape = ModelSpec(preset="llama-tiny").shape()
    meta = build_model(shape, seed=SEED, device=META)
    assert is_meta(meta) and all(p.is_meta for p in meta.parameters())
    assert meta.init_plan() == build_model(shape, seed=SEED).init_plan()


@pytest.mark.parametrize("model,world,parallelism", [
    ({"preset": "gpt-tiny"}, 2, {"fsdp": True}),
    ({"preset": "llama-tiny"}, 2, {"fsdp": False}),
    ({"preset": "llama-tiny"}, 4, {"tp": 2, "fsdp": True}),
    ({"preset": "gpt-tiny"}, 4, {"pp": 2, "fsdp": True}),
    (MOE, 2, {"ep": 2, "fsdp": True}),
], ids=["gpt-fsdp2", "llama-ddp2", "llama-dp2xtp2", "gpt-dp2xpp2", "moe-ep2"])
def test_meta_init_matches_the_plain_model_bitwise(tmp_path, model, world, parallelism):
    assert_bitwise_equal(initial_params(world, tmp_path, model, parallelism), plain_params(model))


def test_a_meta_initialised_run_trains_bitwise_like_a_plain_one(tmp_path):
    """The tied head stays tied through materialising (to_empty unties it): training, not only the start, agrees."""
    layout = {"fsdp": True}
    plain = run_layout(2, tmp_path / "plain", parallelism=layout, steps=3, seed=SEED)
    meta = run_layout(2, tmp_path / "meta", parallelism=layout, steps=3, seed=SEED, metaInit=True)
    assert meta["losses"] == plain["losses"]
    assert_bitwise_equal(meta["params"], plain["params"])


@pytest.mark.parametrize("shape", [(3, 5), (40, 7), (1000, 48), (257, 3, 5), (20000,)])
def test_drawing_row_blocks_in_turn_gives_the_whole_draw_bitwise(monkeypatch, shape):
    """CPU normal_ drawn piecewise (materialize.row_blocks) equals one draw of the whole tensor, and the
    generator ends in the same state: what keeps meta-device init bitwise without holding a full tensor."""
    from flywheel.trainer.models import materialize

    monkeypatch.setattr(materialize, "CHUNK_ELEMENTS", 64)
    whole_gen, piece_gen = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    whole = torch.empty(shape).normal_(0.0, 0.02, generator=whole_gen)
    pieces = [torch.empty((end - start, *shape[1:])).normal_(0.0, 0.02, generator=piece_gen)
              for start, end in materialize.row_blocks(torch.Size(shape))]
    assert len(pieces) > 1 or whole.numel() < 128
    assert torch.equal(torch.cat(pieces), whole)
    assert torch.equal(torch.randn(5, generator=whole_gen), torch.randn(5, generator=piece_gen))
