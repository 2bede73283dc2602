"""`check_layout`: every layout problem the spec alone decides is raised before the rendezvous (pure, no process
group), naming the field to change."""

from __future__ import annotations

import pytest

from flywheel.spec.job import Parallelism, Training
from flywheel.trainer.distributed.parallelize import ParallelismError, check_layout
from flywheel.trainer.models.gpt.model import GPTConfig
from flywheel.trainer.models.moe import MoEConfig

TINY = GPTConfig(layers=2, dim=64, heads=4, vocab=256, seq_len=64)
MOE = GPTConfig(layers=2, dim=64, heads=4, vocab=256, seq_len=64, moe=MoEConfig(experts=4, top_k=2))
BATCH = Training(global_batch=8, micro_batch=2)


@pytest.mark.parametrize("world, parallelism, training, cfg", [
    (2, Parallelism(fsdp=False), BATCH, TINY),
    (4, Parallelism(fsdp=True, tp=2), BATCH, TINY),
    (2, Parallelism(pp=2, schedule="gpipe"), BATCH, TINY),
    (4, Parallelism(fsdp=True, ep=4), BATCH, MOE),
], ids=["ddp", "fsdp-tp2", "pp2", "ep4"])
def test_layouts_that_run_pass(world, parallelism, training, cfg):
    check_layout(world, parallelism, training, cfg)


@pytest.mark.parametrize("world, parallelism, training, cfg, message", [
    (6, Parallelism(fsdp=True, tp=4), BATCH, TINY, "tp x pp = 4 x 1 does not divide the world size 6"),
    (2, Parallelism(tp=2, fsdp=False), BATCH, TINY, "trainer.parallelism.fsdp: tp = 2 needs fsdp: true"),
    (2, Parallelism(fsdp=True, ep=2), BATCH, TINY, "ep = 2 splits experts, but the model has none"),
    (4, Parallelism(fsdp=True, ep=4),
     BATCH, GPTConfig(layers=2, dim=64, heads=4, vocab=256, seq_len=64, moe=MoEConfig(experts=6, top_k=2)),
     r"ep = 4 does not divide model.moe.experts \(6\)"),
    (8, Parallelism(fsdp=True, tp=8), BATCH, TINY, r"tp: seqLen \(64\)|tp: heads \(4\) is not divisible by tp \(8\)"),
    (3, Parallelism(), BATCH, TINY,
     r"at world size 3: spec.trainer.training.globalBatch: 8 is not divisible by microBatch x dp = 2 x 3"),
    (2, Parallelism(pp=2, schedule="gpipe"), BATCH,
     GPTConfig(layers=3, dim=64, heads=4, vocab=256, seq_len=64), "3 layers do not split evenly"),
], ids=["tp-world", "tp-ddp", "ep-dense", "ep-experts", "tp-heads", "batch", "pp-layers"])
def test_layouts_that_cannot_run_name_the_field(world, parallelism, training, cfg, message):
    with pytest.raises(ParallelismError, match=message) as raised:
        check_layout(world, parallelism, training, cfg)
    assert "trainer." in str(raised.value)
