"""The MoE GPT under expert parallel (gpt-tiny, 4 experts, top-2, every block): parity with the 1-process MoE
reference over 20 SGD steps (fp32, gloo), alone, with more dp ranks than ep and with tensor parallel; the worker
loop moving an ep job to plain data parallel and back through checkpoints. Losses (language-model and
load-balancing) and, with SGD, final parameters must agree within 1e-5 relative.

Routing is discrete: float noise that flips a near-tie between a token's k-th and (k+1)-th expert changes that
token's path, after which the runs part by more than noise. These runs (seeded, deterministic) have no such flip
within their steps; a failure here after an unrelated numerics change may be one (docs/parallelism.md)."""

from __future__ import annotations

import pytest

from flywheel.layout.rules import JobLayout, world_problems
from flywheel.spec.job import Parallelism
from flywheel.trainer.distributed.parallelize import mesh_shape
from tests.trainer import workers

from .harness import loss_relative_difference, max_relative_difference, run_layout

TOLERANCE = 1e-5
MOE = {"preset": "gpt-tiny", "moe": {"experts": 4, "topK": 2}}
OPTIONS = {"steps": 20, "lr": 1.0, "gradClip": 0.5, "model": MOE}


def test_ep_borrows_from_dp():
    # No mesh dimension of its own: parallelize views dp as (edp, ep); ep must divide dp.
    assert mesh_shape(4, Parallelism(ep=2, tp=2)) == {"dp": 2, "tp": 2}
    moe = JobLayout(layers=2, dim=32, heads=4, vocab=256, seq_len=32, experts=4, top_k=1, tp=2, ep=4,
                    global_batch=8, micro_batch=1)
    assert [p.detail for p in world_problems(moe, 4)] == ["ep = 4 does not divide dp = 2 (world 4 / tp x pp = 2)"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run_layout(1, tmp_path_factory.mktemp("moe-reference"), **OPTIONS)


def assert_matches(result: dict, reference: dict) -> None:
    assert loss_relative_difference(result["losses"], reference["losses"]) < TOLERANCE
    assert loss_relative_difference(result["aux_losses"], reference["aux_losses"]) < TOLERANCE
    assert max_relative_difference(result["params"], reference["params"]) < TOLERANCE


@pytest.mark.slow
def test_reference_trains_experts_and_router(reference):
    # Parity would be vacuous if the experts or the router did not move, or the balancing loss were absent.
    assert len(set(reference["losses"].values())) == 20
    assert all(0 < v < 0.1 for v in reference["aux_losses"].values())  # 0.01 x about 1 (uniform routing) x 2 layers
    assert {"blocks.0.mlp.router.weight", "blocks.1.mlp.experts.w2"} <= set(reference["params"])


@pytest.mark.slow
@pytest.mark.parametrize("world, layout", [
    (2, {"ep": 2}),  # 2 experts per rank, edp = 1
    (4, {"ep": 2}),  # dp 4 = edp 2 x ep 2: expert gradients also averaged over edp
    (4, {"ep": 2, "tp": 2}),  # dp 2 = ep 2, each tp rank with its own ep group; TP+SP on attention
], ids=["ep2", "dp2xep2", "ep2xtp2"])
def test_expert_parallel_matches_reference(tmp_path, reference, world, layout):
    assert_matches(run_layout(world, tmp_path, parallelism=layout, **OPTIONS), reference)


@pytest.mark.slow
def test_worker_loop_moves_an_ep_job_to_dp_and_back(tmp_path):
    # The real worker (`python -m flywheel.trainer`: AdamW, warmup, clipping, async checkpoints, the logged losses)
    # runs 3 steps under ep 2, continues to step 6 under dp 2 (FSDP, whole experts) and to step 8 under ep 2 again,
    # each time from the last checkpoint: expert shards, AdamW moments and the data position resharded both ways.
    # It must follow an uninterrupted dp 2 run. (Zeroing the restored experts' moments instead moves the losses by
    # up to 4e-2.)
    def spec(steps: int, parallelism: dict) -> dict:
        job = workers.job_spec(2, steps=steps, lr=1e-2, minLrRatio=1.0)  # constant lr after warmup
        job["trainer"]["model"] = MOE
        job["trainer"]["parallelism"] = parallelism
        return job

    assert workers.run(2, spec(8, {"fsdp": True}), tmp_path / "ref") == [0, 0], workers.logs(tmp_path / "ref")
    run = tmp_path / "run"
    for steps, parallelism in ((3, {"ep": 2}), (6, {"fsdp": True}), (8, {"ep": 2})):
        assert workers.run(2, spec(steps, parallelism), run) == [0, 0], workers.logs(run)
    assert [e["resumed_from"] for e in workers.events(run) if e["event"] == "start"] == [None, 3, 6]
    steps = [e for e in workers.events(run) if e["event"] == "step"]
    assert [e["step"] for e in steps] == list(range(1, 9))
    assert all(0 < e["aux_loss"] < 0.1 for e in steps)  # logged beside the language-model loss
    reference, resumed = workers.losses(tmp_path / "ref"), workers.losses(run)
    assert loss_relative_difference(resumed, reference) < TOLERANCE
