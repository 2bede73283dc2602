"""llama-tiny under DDP, FSDP2, tensor and pipeline parallel matches its 1-process reference (SGD, fp32, gloo) within
the tolerance of the GPT parity tests (tests/parallel/test_layouts.py): losses and final parameters within 1e-5
relative."""

from __future__ import annotations

import pytest

from tests.parallel.harness import loss_relative_difference, max_relative_difference, run_layout

TOLERANCE = 1e-5
LLAMA = {"preset": "llama-tiny", "seqLen": 32}
OPTIONS = {"steps": 4, "lr": 1.0, "gradClip": 0.5, "model": LLAMA}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_layout(1, tmp_path_factory.mktemp("llama-reference"), **OPTIONS)


def assert_matches(result: dict, reference: dict) -> None:
    assert len(set(reference["losses"].values())) == len(reference["losses"])  # it trains
    assert loss_relative_difference(result["losses"], reference["losses"]) < TOLERANCE
    assert max_relative_difference(result["params"], reference["params"]) < TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("layout", [
    {"fsdp": False},  # DDP over dp = 2
    {"fsdp": True},  # FSDP2 (ZeRO-3) over dp = 2
    {"tp": 2},  # q/k/v/gate/up column-wise, o/down row-wise, sequence parallel norms
    {"pp": 2, "schedule": "1f1b"},  # one block per stage; the tied head split across stages
], ids=["ddp-dp2", "fsdp-dp2", "tp2", "pp2"])
def test_two_rank_layout_matches_reference(tmp_path, reference, layout):
    assert_matches(run_layout(2, tmp_path, parallelism=layout, **OPTIONS), reference)
