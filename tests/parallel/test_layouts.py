"""Parity of parallel layouts with a 1-process reference (gpt-tiny, SGD, fp32, gloo), and checkpoints that move
between layouts. Each run trains 6 steps with gradient clipping; losses and final parameters must agree within
1e-5 relative (float reordering only). The full grid, with every pipeline schedule and 8 ranks, is
bench/parallel_parity.py."""

from __future__ import annotations

import pytest

from flywheel.layout.rules import JobLayout, pipeline_problem, static_problems, world_problems
from flywheel.spec.job import Parallelism
from flywheel.trainer.distributed.parallelize import mesh_shape

from .harness import loss_relative_difference, max_relative_difference, run_layout

TOLERANCE = 1e-5
OPTIONS = {"steps": 6, "lr": 1.0, "gradClip": 0.5}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_layout(1, tmp_path_factory.mktemp("reference"), **OPTIONS)


def assert_matches(result: dict, reference: dict) -> None:
    assert loss_relative_difference(result["losses"], reference["losses"]) < TOLERANCE
    assert max_relative_difference(result["params"], reference["params"]) < TOLERANCE


def test_mesh_puts_tp_innermost_and_dp_outermost():
    assert mesh_shape(8, Parallelism(tp=2, pp=2)) == {"dp": 2, "pp": 2, "tp": 2}
    assert mesh_shape(4, Parallelism(tp=2)) == {"dp": 2, "tp": 2}
    assert mesh_shape(3, Parallelism()) == {"dp": 3}
    # mesh_shape trusts check_layout (spec_layout's rules), which refuses this before any mesh is built:
    assert "does not divide the world size 6" in str(world_problems(JobLayout(4, 64, 4, 256, 64, tp=4), 6)[0])


@pytest.mark.slow
def test_reference_learns_something(reference):
    # The parity tests would be vacuous if training did not change the parameters.
    assert sorted(reference["losses"]) == [1, 2, 3, 4, 5, 6]
    assert len(set(reference["losses"].values())) == 6


@pytest.mark.slow
@pytest.mark.parametrize("layout", [
    {"tp": 2},  # tensor + sequence parallel, FSDP2 over dp = 1
    {"fsdp": True, "zero": 2},  # ZeRO-2 over dp = 2
    {"fsdp": False},  # DDP over dp = 2
    {"pp": 2, "schedule": "1f1b"},  # two pipeline stages, FSDP2 over dp = 1; the tied head split across stages
], ids=["tp2", "zero2-dp2", "ddp-dp2", "pp2-1f1b"])
def test_two_rank_layout_matches_reference(tmp_path, reference, layout):
    assert_matches(run_layout(2, tmp_path, parallelism=layout, **OPTIONS), reference)


@pytest.mark.slow
def test_dp2_x_tp2_on_four_ranks_matches_reference(tmp_path, reference):
    assert_matches(run_layout(4, tmp_path, parallelism={"tp": 2}, **OPTIONS), reference)


@pytest.mark.slow
def test_dp2_x_pp2_on_four_ranks_matches_reference(tmp_path, reference):
    # DDP per stage over dp, pipeline micro batches = this dp rank's 2 micro batches
    assert_matches(run_layout(4, tmp_path, parallelism={"pp": 2, "fsdp": False}, **OPTIONS), reference)


@pytest.mark.slow
def test_interleaved_1f1b_with_two_stages_per_rank_matches_reference(tmp_path):
    model = {"preset": "gpt-tiny", "layers": 4}  # 4 stages of one block
    four_layers = run_layout(1, tmp_path / "ref", model=model, **OPTIONS)
    got = run_layout(2, tmp_path / "pp", model=model, parallelism={"pp": 2, "schedule": "interleaved-1f1b",
                                                                  "stagesPerRank": 2}, **OPTIONS)
    assert_matches(got, four_layers)


def test_pipeline_layouts_that_cannot_run_name_the_field():
    def job(layers: int, **par: object) -> JobLayout:
        return JobLayout(layers=layers, dim=64, heads=4, vocab=256, seq_len=64, **par)  # type: ignore[arg-type]

    assert pipeline_problem(job(2, pp=2), 4) is None and not static_problems(job(2, pp=2))
    assert "trainer.parallelism.pp: 3 layers" in str(static_problems(job(3, pp=2))[0])
    assert "microbatches: 3 does not divide" in str(pipeline_problem(job(2, pp=2, microbatches=3), 4))
    assert "1f1b needs at least pp = 2" in str(pipeline_problem(job(2, pp=2), 1))
    assert pipeline_problem(job(2, pp=2, schedule="gpipe"), 1) is None


@pytest.mark.slow
@pytest.mark.parametrize("before, after", [({"tp": 2}, {"fsdp": True}), ({"fsdp": True}, {"tp": 2}),
                                           ({"pp": 2}, {"fsdp": True})],
                         ids=["tp2-to-dp2", "dp2-to-tp2", "pp2-to-dp2"])
def test_checkpoint_moves_between_layouts(tmp_path, reference, before, after):
    ckpt = str(tmp_path / "ckpt")
    run_layout(2, tmp_path / "before", parallelism=before, checkpointDir=ckpt, saveAt=3, **OPTIONS)
    resumed = run_layout(2, tmp_path / "after", parallelism=after, checkpointDir=ckpt, restore=True, **OPTIONS)
    assert resumed["start"] == 3 and sorted(resumed["losses"]) == [4, 5, 6]
    assert resumed["consumed"] == 6 * 8  # the data position moved with the checkpoint
    tail = {s: reference["losses"][s] for s in (4, 5, 6)}
    assert loss_relative_difference(resumed["losses"], tail) < TOLERANCE
    assert max_relative_difference(resumed["params"], reference["params"]) < TOLERANCE


@pytest.mark.slow
def test_adamw_state_moves_from_dp2_into_pipeline_stages(tmp_path):
    # The last stage's copy of the tied embedding reads its moments under the single model's name
    # (tok_emb.weight). A wrong or missing state shows at once in the losses after resume.
    adamw = {**OPTIONS, "lr": 1e-2, "optimizer": "adamw"}
    reference = run_layout(1, tmp_path / "ref", **adamw)
    ckpt = str(tmp_path / "ckpt")
    run_layout(2, tmp_path / "before", parallelism={"fsdp": True}, checkpointDir=ckpt, saveAt=3, **adamw)
    resumed = run_layout(2, tmp_path / "after", parallelism={"pp": 2}, checkpointDir=ckpt, restore=True, **adamw)
    assert resumed["start"] == 3 and resumed["consumed"] == 6 * 8
    tail = {s: reference["losses"][s] for s in (4, 5, 6)}
    assert loss_relative_difference(resumed["losses"], tail) < TOLERANCE
