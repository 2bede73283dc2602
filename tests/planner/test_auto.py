"""`parallelism: {auto: true}` chooses tensor and pipeline parallel layouts too, valid at every world size of the
replica range (checked here against the spec's and the trainer's own rules, not the planner's), topology-aware
(tp inside one worker), fitting at the smallest world, and keeping the spec's layout on near-ties."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from flywheel.layout.rules import pipeline_problem
from flywheel.planner import DEVICES, Batch, PlanError, device_table, estimate
from flywheel.planner.search import NEAR_TIE
from flywheel.spec import SpecError, TrainingJob, TrainingJobSpec, parse_spec
from flywheel.spec.auto import auto_layout, plan_for_spec, resolve_auto, shape_of
from flywheel.spec.job import PRESETS
from flywheel.trainer.distributed.tensor_parallel import check_tp_sizes
from flywheel.worker_plan import Placement, plan_workers

GIB = 1 << 30
SMALL = device_table({"small": {"base": "h100", "memoryBytes": 10 * GIB}})["small"]


def spec(preset: str = "gpt-1.3b", replicas: tuple[int, int] = (2, 2), procs: int = 4, global_batch: int = 64,
         micro_batch: int = 1, **parallelism: object) -> TrainingJobSpec:
    return parse_spec({"replicas": {"min": replicas[0], "max": replicas[1]}, "procsPerReplica": procs,
                       "trainer": {"model": {"preset": preset}, "parallelism": {"auto": True, "device": "h100",
                                                                   **parallelism},
                                   "training": {"globalBatch": global_batch, "microBatch": micro_batch,
                                                "precision": "bf16"}}})


def runs_everywhere(s: TrainingJobSpec, tp: int, pp: int, micro_batch: int) -> None:
    """The spec's and the trainer's rules at every world size of the range, written out here (not the planner's)."""
    model = {**PRESETS[s.trainer.model.preset or ""]}
    check_tp_sizes(model["dim"], model["heads"], model["seqLen"], tp)  # raises what the trainer would
    assert s.procs_per_replica % tp == 0  # a tp group is consecutive ranks of one worker
    for world in s.world_sizes():
        assert world % (tp * pp) == 0
        dp = world // (tp * pp)
        assert s.trainer.training.global_batch % (dp * micro_batch) == 0
        concrete = replace(s.trainer.layout(), tp=tp, pp=pp, micro_batch=micro_batch, microbatches=None)
        assert pipeline_problem(concrete, s.trainer.training.global_batch // (dp * micro_batch)) is None


def test_auto_picks_tp_and_pp_when_clearly_faster_than_data_parallel():
    s = spec()  # 1.3B in bf16 on 2 x 4 ranks of 10 GiB: data parallel fits only with recompute
    shape, batch = shape_of(s), Batch(64, "bf16")
    result = plan_for_spec(s, 8, SMALL)
    plain = [e for e in result.candidates if e.layout.tp == e.layout.pp == 1]
    assert plain and all(e.layout.activation_checkpointing for e in plain)
    assert result.chosen.step_seconds * (1 + NEAR_TIE) < min(e.step_seconds for e in plain)
    resolved = resolve_auto(s, SMALL)
    par, training = resolved.trainer.parallelism, resolved.trainer.training
    assert not par.auto and par.tp * par.pp > 1
    runs_everywhere(s, par.tp, par.pp, training.micro_batch)
    assert (par.tp, par.pp) == (result.chosen.layout.tp, result.chosen.layout.pp)
    assert estimate(shape, batch, result.chosen.layout, SMALL, 4).fits
    # What the workers get is the same concrete spec, and it validates as any spec does.
    job = TrainingJob.model_validate({"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob",
                                      "metadata": {"name": "big"}, "spec": s.model_dump(by_alias=True)})
    placement = Placement(replicas=2, rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:1", master_addr="127.0.0.1",
                          master_port=1, checkpoint_dir="/tmp/ckpt", launcher=("flywheel", "launch"))
    env_spec = parse_spec(json.loads(plan_workers(job, placement)[0].env["FLYWHEEL_SPEC"]))
    assert not env_spec.trainer.parallelism.auto  # h100's 80 GiB: a layout valid at every size, maybe plain DP
    runs_everywhere(s, env_spec.trainer.parallelism.tp, env_spec.trainer.parallelism.pp,
                    env_spec.trainer.training.micro_batch)


@pytest.mark.parametrize("case", [
    dict(replicas=(2, 3), procs=4, global_batch=48),  # elastic: worlds 8 and 12
    dict(replicas=(1, 2), procs=8, global_batch=64),
    dict(replicas=(2, 2), procs=4, global_batch=8),  # 1F1B needs >= pp micro batches per dp rank
    dict(replicas=(2, 2), procs=4, global_batch=64, schedule="interleaved-1f1b", stagesPerRank=2),
    dict(replicas=(2, 2), procs=4, global_batch=64, schedule="interleaved-1f1b", stagesPerRank=3),
    dict(replicas=(1, 3), procs=2, global_batch=48, micro_batch=2, preset="gpt-125m"),
])
def test_every_auto_candidate_runs_at_every_world_size(case):
    s = spec(**case)
    device = DEVICES["h100"] if case.get("preset") else SMALL
    result = plan_for_spec(s, max(s.world_sizes()), device)
    assert result.candidates
    for e in result.candidates:
        runs_everywhere(s, e.layout.tp, e.layout.pp, e.layout.micro_batch)
        low = min(s.world_sizes())
        at_low = e.layout.__class__(**{**e.layout.__dict__, "dp": low // (e.layout.tp * e.layout.pp)})
        assert estimate(shape_of(s), Batch(s.trainer.training.global_batch, "bf16"), at_low, device,
                        s.procs_per_replica).fits  # fits where each rank holds the most
    chosen = resolve_auto(s, device).trainer.parallelism
    assert (chosen.schedule, chosen.stages_per_rank) == (s.trainer.parallelism.schedule,
                                                         s.trainer.parallelism.stages_per_rank)


def test_auto_layouts_include_model_parallel_ones():
    result = plan_for_spec(spec(replicas=(2, 3), procs=4, global_batch=48), 12, SMALL)
    found = {(e.layout.tp, e.layout.pp) for e in result.candidates}
    assert {(2, 2), (4, 1), (1, 4)} <= found  # tp x pp must divide 8 and 12: at most 4


def test_tensor_parallel_stays_inside_a_worker():
    for procs in (1, 2):
        s = spec(preset="gpt-350m", replicas=(4, 4), procs=procs, global_batch=32)
        tight = device_table({"t": {"base": "h100", "memoryBytes": 5 * GIB}})["t"]
        result = plan_for_spec(s, 4 * procs, tight)
        assert {e.layout.tp for e in result.candidates} == set(range(1, procs + 1)) & {1, 2}
        assert any(e.layout.pp > 1 for e in result.candidates)  # pipeline stages may span workers


def test_gpipe_keeps_auto_off_pipelines():
    s = spec(schedule="gpipe")  # cost.py estimates 1F1B's in-flight activations, not GPipe's
    assert {e.layout.pp for e in plan_for_spec(s, 8, SMALL).candidates} == {1}
    assert resolve_auto(s, SMALL).trainer.parallelism.pp == 1


def test_a_chunked_loss_keeps_auto_off_pipelines():
    doc = spec().model_dump(by_alias=True, exclude_unset=True)
    doc["trainer"]["training"]["chunkedLoss"] = True  # the pipeline schedule's loss takes whole logits
    s = parse_spec(doc)
    assert any(e.layout.pp > 1 for e in plan_for_spec(spec(), 8, SMALL).candidates)
    assert {e.layout.pp for e in plan_for_spec(s, 8, SMALL).candidates} == {1}
    assert resolve_auto(s, SMALL).trainer.parallelism.pp == 1


def test_near_ties_keep_the_spec_layout():
    s = spec()
    result = plan_for_spec(s, 8, SMALL)
    best = min(e.step_seconds for e in result.candidates)
    near = [e.layout for e in result.candidates if e.step_seconds <= best * (1 + NEAR_TIE)]
    assert len(near) > 1
    for lay in near:  # whichever near-tie the spec asks for, auto keeps it
        mine = spec(tp=lay.tp, pp=lay.pp, fsdp=lay.fsdp, zero=lay.zero, micro_batch=lay.micro_batch)
        assert auto_layout(mine, SMALL) == lay
    # A spec layout that is clearly slower is not kept.
    slow = spec(tp=4, pp=2)
    assert (auto_layout(slow, SMALL).tp, auto_layout(slow, SMALL).pp) != (4, 2)


def test_auto_fits_at_the_smallest_world_or_says_so():
    with pytest.raises(PlanError, match=r"no layout fits in 10\.0 GiB per rank on small at world size 4"):
        resolve_auto(spec(replicas=(1, 2), global_batch=64), SMALL)
    # No layout at all: the job is refused when it is validated (auto is resolved there), naming the field.
    with pytest.raises(SpecError, match=r"spec\.trainer\.training\.globalBatch: 64 cannot be split .* \(8, 12, 16\)"):
        spec(replicas=(2, 4), global_batch=64)
