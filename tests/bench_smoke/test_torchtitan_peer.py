"""bench/torchtitan_peer.py: the shapes both sides build agree, the steady-state arithmetic, and (with TorchTitan
installed: the `bench` extra, not `dev`) a quick run end to end, TorchTitan on this machine's CPU through the glue."""

from __future__ import annotations

import json

import pytest

from bench.torchtitan_peer import CKPT_EVERY, FULL, GPU, QUICK, Config, flywheel_job, steady
from tests.bench_smoke.test_bench_smoke import check_record, run_bench


def test_steady_state_skips_the_warmup_steps_and_start_up_counts_to_the_first_step_end():
    cfg = Config(layers=1, dim=8, heads=1, kv_heads=1, ffn=8, vocab=8, seq_len=4, global_batch=2, steps=5, warmup=2)
    ends = [10.0, 12.0, 13.0, 14.0, 15.5]  # steps 3..5 end 1, 1 and 1.5 s after the step before
    result = steady(ends, began=4.0, cfg=cfg)
    assert result["tokens_per_s"] == pytest.approx(8 * 3 / 3.5)
    assert result["startup_s"] == 6.0 and result["median_step_s"] == 1.0


@pytest.mark.parametrize("cfg", [QUICK, FULL, GPU], ids=["quick", "full", "gpu"])
def test_torchtitan_builds_the_shape_flywheel_builds(cfg, tmp_path):
    pytest.importorskip("torchtitan")
    import torch

    from bench.torchtitan_entry import model_args
    from flywheel.spec import parse_spec
    from flywheel.trainer.models.registry import build_model, model_shape

    args = model_args(cfg.shape())
    with torch.device("meta"):
        from torchtitan.models.llama3 import Transformer

        titan = Transformer(args)
    spec = parse_spec(flywheel_job(cfg, 1, tmp_path, gpu=False)["spec"])
    ours = build_model(model_shape(spec.trainer.model), device=torch.device("meta"))
    assert titan.layers["0"].feed_forward.w1.out_features == cfg.ffn
    assert sum(p.numel() for p in titan.parameters()) == sum(p.numel() for p in ours.parameters())


@pytest.mark.slow
def test_torchtitan_peer_quick_runs_both_sides(tmp_path):
    pytest.importorskip("torchtitan")
    run_bench(tmp_path, "bench.torchtitan_peer", "--quick")
    record = check_record(tmp_path / "torchtitan_peer.json")
    [row] = record["runs"]
    for side in ("flywheel", "torchtitan", "torchtitan_ckpt"):
        [run] = row["runs"][side]
        assert run["steps"] == QUICK.steps and run["startup_s"] > 0 and run["peak_rss_bytes"] > 0
        assert run["phases"]["first_step"] > 0
    # TorchTitan's own checkpoints, at our cadence and retention: step 10 and its final save at step 12.
    assert row["runs"]["torchtitan"][0]["checkpoint_steps"] == []
    assert row["runs"]["torchtitan_ckpt"][0]["checkpoint_steps"] == [CKPT_EVERY, QUICK.steps]
    assert row["checkpointing_peer_tokens_per_s_ratio"] > 0
    phases = row["runs"]["flywheel"][0]["phases"]
    assert {"imports", "rendezvous", "parallelize", "materialize", "restore"} <= set(phases)
    assert "torchtitan" in json.dumps(record["peer"]).lower() and record["torchtitan_on_cpu"]
