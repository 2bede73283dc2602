"""Every TrainingJob YAML in examples/ parses, validates, plans its workers and (without a user command) gets a
layout from the planner; the hybrid-parallel and elastic examples are what their names say."""

from __future__ import annotations

from pathlib import Path

import pytest

from flywheel.planner import DEVICES
from flywheel.spec import load_job
from flywheel.spec.auto import plan_for_spec
from flywheel.spec.job import PRESETS
from flywheel.spec.pod import planner_device
from flywheel.trainer.distributed.tensor_parallel import check_tp_sizes
from flywheel.worker_plan import Placement, plan_workers

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
YAMLS = sorted(EXAMPLES.glob("*.yaml"))


def placement(replicas: int) -> Placement:
    return Placement(replicas=replicas, rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:29400",
                     master_addr="127.0.0.1", master_port=29400, checkpoint_dir="/tmp/ckpt",
                     launcher=("flywheel", "launch"))


def test_the_examples_are_all_here():
    assert {p.name for p in YAMLS} >= {"tiny.yaml", "hybrid-parallel.yaml", "elastic.yaml", "user-script.yaml"}


@pytest.mark.parametrize("path", YAMLS, ids=[p.name for p in YAMLS])
def test_every_example_parses_validates_and_plans(path):
    job = load_job(path)  # parse + validate (SpecError otherwise)
    spec = job.spec
    for replicas in range(spec.replicas.min, spec.replicas.max + 1):
        workers = plan_workers(job, placement(replicas))
        assert [w.first_rank for w in workers] == [i * spec.procs_per_replica for i in range(replicas)]
        if not spec.command:
            result = plan_for_spec(spec, replicas * spec.procs_per_replica, DEVICES[planner_device(spec.pod_view())])
            assert result.chosen.fits and result.candidates[0] is result.chosen


def test_hybrid_parallel_uses_dp_tp_and_pp_with_tp_inside_a_worker():
    spec = load_job(EXAMPLES / "hybrid-parallel.yaml").spec
    par = spec.trainer.parallelism
    dp = spec.replicas.max * spec.procs_per_replica // (par.tp * par.pp)
    assert min(dp, par.tp, par.pp) > 1
    assert spec.procs_per_replica % par.tp == 0
    model = PRESETS[spec.trainer.model.preset or ""]
    check_tp_sizes(model["dim"], model["heads"], model["seqLen"], par.tp)  # the trainer's own tp rule
    assert spec.replicas.max * spec.procs_per_replica <= 8  # runs on this 2-core machine


def test_elastic_has_a_replica_range():
    spec = load_job(EXAMPLES / "elastic.yaml").spec
    assert spec.replicas.min < spec.replicas.max
    assert len(spec.world_sizes()) > 1
