"""The auto-parallel planner (flywheel/planner): cost-model properties, the search's choice and its errors, and the
device table's overrides. Pure: no torch."""

from __future__ import annotations

import pytest

from flywheel.planner import (
    DEVICES,
    Batch,
    DeviceTableError,
    Layout,
    ModelShape,
    PlanError,
    device_table,
    estimate,
    plan_layout,
)
from flywheel.planner.cost import memory_breakdown
from flywheel.planner.search import NEAR_TIE, layouts
from flywheel.spec import parse_spec
from flywheel.spec.auto import plan_for_spec
from flywheel.spec.job import PRESETS

GIB = 1 << 30


def shape(preset: str) -> ModelShape:
    p = PRESETS[preset]
    return ModelShape(p["layers"], p["dim"], p["heads"], p["vocab"], p["seqLen"])


def layout(**kw: object) -> Layout:
    base = dict(dp=1, tp=1, pp=1, micro_batch=4, fsdp=False, zero=3, activation_checkpointing=False)
    return Layout(**{**base, **kw})  # type: ignore[arg-type]


def test_preset_sizes_are_the_published_ones():
    assert shape("gpt-125m").params == pytest.approx(124e6, rel=0.01)
    assert shape("gpt-350m").params == pytest.approx(355e6, rel=0.01)
    assert shape("gpt-1.3b").params == pytest.approx(1.31e9, rel=0.01)


def test_memory_falls_with_sharding_recompute_and_tensor_parallel():
    s, batch, dev = shape("gpt-1.3b"), Batch(64, "bf16"), DEVICES["h100"]

    def total(**kw: object) -> float:
        return sum(memory_breakdown(s, batch, layout(**kw), dev).values())

    assert total(dp=8, fsdp=True, zero=3) < total(dp=8, fsdp=True, zero=2) < total(dp=8, fsdp=False)
    assert total(dp=8, activation_checkpointing=True) < total(dp=8)
    assert total(dp=4, tp=2, fsdp=True) < total(dp=8, fsdp=True)
    assert total(micro_batch=1) < total(micro_batch=8)
    # DDP keeps 20 bytes per parameter (params, grads, buckets, two AdamW moments) on every rank.
    states = memory_breakdown(s, batch, layout(dp=8), dev)
    assert states["parameters"] + states["gradients"] + states["optimizer"] == pytest.approx(20 * s.params, rel=0.01)


def test_time_reflects_recompute_bubble_and_links():
    s, batch, dev = shape("gpt-1.3b"), Batch(64, "bf16"), DEVICES["h100"]

    def est(rpw: int = 8, **kw: object):
        return estimate(s, batch, layout(**kw), dev, ranks_per_worker=rpw)

    assert est(dp=8, activation_checkpointing=True).compute_seconds == pytest.approx(
        est(dp=8).compute_seconds * 4 / 3)
    # 1F1B bubble: (pp - 1) / (m + pp - 1); more micro batches shrink it.
    assert est(dp=2, pp=4, fsdp=True, micro_batch=8).bubble_fraction == pytest.approx(3 / (4 + 3))
    assert est(dp=2, pp=4, fsdp=True, micro_batch=1).bubble_fraction < 0.1
    # Tensor parallel across workers pays the slow link.
    assert est(rpw=2, dp=2, tp=4, fsdp=True).communication_seconds > 5 * est(rpw=8, dp=2, tp=4,
                                                                               fsdp=True).communication_seconds


def test_the_choice_is_the_fastest_layout_that_fits():
    s, batch, dev = shape("gpt-1.3b"), Batch(64, "bf16"), DEVICES["a100"]
    result = plan_layout(s, batch, world_size=16, ranks_per_worker=8, device=dev)
    assert all(e.fits for e in result.candidates) and result.candidates[0] == result.chosen
    assert result.chosen.memory_bytes <= dev.memory_bytes
    every = [estimate(s, batch, lay, dev, 8) for lay in layouts(s, batch.global_batch, 16)]
    assert result.rejected_for_memory == sum(not e.fits for e in every)
    fastest = min(e.step_seconds for e in every if e.fits)
    # Near-ties (within NEAR_TIE of the fastest) go to the least memory.
    assert result.chosen.step_seconds <= fastest * (1 + NEAR_TIE)
    near = [e for e in every if e.fits and e.step_seconds <= fastest * (1 + NEAR_TIE)]
    assert result.chosen.memory_bytes == min(e.memory_bytes for e in near)


def test_the_spec_layout_is_kept_unless_another_is_clearly_faster():
    s, batch, dev = shape("gpt-125m"), Batch(32, "fp32"), DEVICES["cpu"]
    fastest = plan_layout(s, batch, 2, 2, dev).candidates
    best = min(e.step_seconds for e in fastest)
    mine = layout(dp=2, micro_batch=4)
    assert estimate(s, batch, mine, dev, 2).step_seconds <= best * (1 + NEAR_TIE)  # a near-tie on CPU
    assert plan_layout(s, batch, 2, 2, dev, preferred=mine).chosen.layout == mine
    slow = layout(dp=2, micro_batch=4, activation_checkpointing=True)  # 4/3 of the compute: clearly slower
    assert plan_layout(s, batch, 2, 2, dev, preferred=slow).chosen.layout != slow
    # A preferred layout that does not fit is never chosen.
    need = estimate(s, batch, mine, dev, 2).memory_bytes
    tight = device_table({"tight": {"base": "cpu", "memoryBytes": need - 1}})["tight"]
    chosen = plan_layout(s, batch, 2, 2, tight, preferred=mine).chosen
    assert chosen.fits and chosen.layout != mine


def test_layouts_respect_the_model_and_the_batch():
    s = ModelShape(layers=6, dim=96, heads=6, vocab=256, seq_len=36)
    found = list(layouts(s, global_batch=12, world_size=12))
    assert found
    for lay in found:
        assert lay.dp * lay.tp * lay.pp == 12
        assert s.heads % lay.tp == 0 and s.layers % lay.pp == 0
        assert s.seq_len % lay.tp == 0 and (4 * s.dim) % lay.tp == 0  # the trainer's tensor-parallel rules
        assert 12 % (lay.dp * lay.micro_batch) == 0
        assert lay.fsdp or lay.tp == 1  # DDP cannot replicate tensor-parallel parameters
    assert {(lay.tp, lay.pp) for lay in found} >= {(1, 1), (2, 1), (3, 2), (6, 1), (1, 6)}
    # seqLen 32 does not split over tp 3 or 6 (sequence parallel shards it), so those are not offered.
    odd = ModelShape(layers=6, dim=96, heads=6, vocab=256, seq_len=32)
    assert {lay.tp for lay in layouts(odd, 12, 12)} == {1, 2}


def test_nothing_fits_names_the_memory_and_the_fix():
    tiny_device = device_table({"small": {"base": "cpu", "memoryBytes": 0.5 * GIB}})["small"]
    with pytest.raises(PlanError, match=r"no layout fits in 0\.5 GiB per rank on small.*more ranks"):
        plan_layout(shape("gpt-350m"), Batch(8, "fp32"), 2, 2, tiny_device)


def test_an_unsplittable_batch_names_the_field():
    with pytest.raises(PlanError, match="globalBatch: 3 cannot be split"):
        plan_layout(shape("gpt-125m"), Batch(3, "fp32"), 2, 2, DEVICES["cpu"], micro_batches=(2,))


def test_plan_for_spec_keeps_the_micro_batch_unless_auto():
    job = {"replicas": {"min": 2, "max": 2}, "procsPerReplica": 2,
           "trainer": {"model": {"preset": "gpt-125m"}, "training": {"globalBatch": 32, "microBatch": 2}}}
    fixed = plan_for_spec(parse_spec(job), 4, DEVICES["h100"])
    assert {e.layout.micro_batch for e in fixed.candidates} == {2}
    job["trainer"]["parallelism"] = {"auto": True}
    free = plan_for_spec(parse_spec(job), 4, DEVICES["h100"])
    assert len({e.layout.micro_batch for e in free.candidates}) > 1
    out = free.to_json(top=3)
    assert set(out["chosen"]) >= {"dp", "tp", "pp", "microbatches", "fsdp", "activationCheckpointing",
                                  "est_step_seconds", "est_memory_bytes"}
    assert len(out["candidates"]) == 3


def test_device_overrides_change_only_what_they_name():
    table = device_table({"h100": {"memoryBytes": 40 * GIB, "interNode": {"bandwidthBytesPerSecond": 1e9}},
                          "mygpu": {"base": "a100", "peakFlops": {"bf16": 400e12}}})
    assert table["h100"].memory_bytes == 40 * GIB
    assert table["h100"].inter_node.bandwidth_bytes_per_second == 1e9
    assert table["h100"].inter_node.latency_seconds == DEVICES["h100"].inter_node.latency_seconds
    assert table["h100"].peak_flops == DEVICES["h100"].peak_flops
    assert table["mygpu"].flops("bf16") == 400e12 and table["mygpu"].flops("fp32") == DEVICES["a100"].flops("fp32")
    assert DEVICES["h100"].memory_bytes == 81089 * (1 << 20)  # the built-in table is untouched


@pytest.mark.parametrize("overrides, message", [
    ({"tpu": {"memoryBytes": 1}}, r"devices\.tpu: unknown device; add `base: "),
    ({"h100": {"memory": 1}}, r"devices\.h100\.memory: unknown field"),
    ({"h100": {"memoryBytes": -1}}, r"devices\.h100\.memoryBytes: must be > 0"),
    ({"h100": {"efficiency": 1.5}}, r"devices\.h100\.efficiency: 1\.5 is a fraction"),
    ({"h100": {"peakFlops": {"bf16": "fast"}}}, r"devices\.h100\.peakFlops\.bf16: expected a number"),
    ({"h100": 3}, r"devices\.h100: expected a mapping"),
])
def test_bad_device_overrides_name_the_field(overrides, message):
    with pytest.raises(DeviceTableError, match=message):
        device_table(overrides)


def test_auto_becomes_a_concrete_layout_valid_at_every_world_size():
    from flywheel.spec import TrainingJob
    from flywheel.worker_plan import Placement, plan_workers

    job = TrainingJob.model_validate({
        "apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "auto"},
        "spec": {"replicas": {"min": 1, "max": 3}, "procsPerReplica": 2,
                 "trainer": {"model": {"preset": "gpt-125m"}, "parallelism": {"auto": True},
                             "training": {"globalBatch": 48, "microBatch": 1}}}})
    placement = Placement(replicas=2, rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:1", master_addr="127.0.0.1",
                          master_port=1, checkpoint_dir="/tmp/ckpt", launcher=("flywheel", "launch"))
    env_spec = parse_spec(__import__("json").loads(plan_workers(job, placement)[0].env["FLYWHEEL_SPEC"]))
    par, training = env_spec.trainer.parallelism, env_spec.trainer.training
    assert not par.auto and 2 % par.tp == 0  # tp stays inside a worker of 2 ranks
    for world in (2, 4, 6):  # elastic: tp x pp divides every size, the micro batch the per-rank batch
        assert world % (par.tp * par.pp) == 0
        assert (48 // (world // (par.tp * par.pp))) % training.micro_batch == 0
    with pytest.raises(PlanError, match=r"globalBatch: 50 cannot be split over the data-parallel ranks at every "
                                        r"world size \(2, 4, 6\)"):
        job.spec.trainer.training.global_batch = 50
        plan_workers(job, placement)
