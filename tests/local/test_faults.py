"""`--fault` flags: parsing, validation against the planned world, and what reaches the trainer."""

from __future__ import annotations

import json

import pytest

from flywheel.local.fault_flags import (
    FaultFlagError,
    LoseWorker,
    RankFault,
    check_targets,
    next_due,
    parse_faults,
    worker_faults,
)
from flywheel.worker_plan import faults_env


def test_parses_each_kind_with_ids_in_order():
    faults = parse_faults(["kill:rank=1:step=5", "hang:step=9:rank=0", "lose-worker:replica=1:step=12"])
    assert faults == [{"id": "f0", "kind": "kill", "rank": 1, "step": 5},
                      {"id": "f1", "kind": "hang", "rank": 0, "step": 9},
                      {"id": "f2", "kind": "lose-worker", "replica": 1, "step": 12}]
    assert worker_faults(faults) == [LoseWorker(id="f2", replica=1, step=12)]


def test_only_rank_faults_reach_the_trainer_env():
    faults = parse_faults(["kill:rank=1:step=5", "lose-worker:replica=0:step=3"])
    env = faults_env(faults, "/tmp/faults")
    assert json.loads(env["FLYWHEEL_FAULTS"]) == [{"id": "f0", "kind": "kill", "rank": 1, "step": 5}]
    assert env["FLYWHEEL_FAULT_DIR"] == "/tmp/faults"


@pytest.mark.parametrize("flag, problem", [
    ("explode:rank=1:step=5", "unknown kind"),
    ("kill:rank=1", "step= is missing"),
    ("kill:replica=1:step=2", "needs an integer rank"),
    ("lose-worker:rank=1:step=2", "needs an integer replica"),
    ("kill:rank=x:step=2", "not an integer"),
    ("kill:rank=1:step=0", "step >= 1, got 0"),
    ("kill:rank=-1:step=3", "rank >= 0, got -1"),
    ("kill:rank=1:rank=2:step=3", "bad or repeated field"),
])
def test_bad_flags_name_the_problem(flag, problem):
    with pytest.raises(FaultFlagError, match=problem):
        parse_faults([flag])


def test_targets_must_exist_in_the_planned_world():
    check_targets(parse_faults(["kill:rank=3:step=1", "lose-worker:replica=1:step=1"]), replicas=2, world_size=4)
    with pytest.raises(FaultFlagError, match="rank=4 does not exist"):
        check_targets(parse_faults(["kill:rank=4:step=1"]), replicas=2, world_size=4)
    with pytest.raises(FaultFlagError, match="replica=2 does not exist"):
        check_targets(parse_faults(["lose-worker:replica=2:step=1"]), replicas=2, world_size=4)


def test_due_faults_fire_in_step_order_one_failure_at_a_time():
    kill, lose = RankFault("f0", "kill", 1, 13), LoseWorker("f1", 1, 24)
    pending = [lose, kill]
    assert next_due(pending, 12, None, 100.0, True) is None  # nothing due yet
    # Both due in one poll (the steps jumped past both): the lower step's first.
    assert next_due(pending, 30, None, 100.0, True) is kill
    # Fired at 110: nothing more until a start after it trained a step.
    assert next_due([lose], 30, 110.0, 100.0, True) is None
    assert next_due([lose], 30, 110.0, 120.0, False) is None
    assert next_due([lose], 30, 110.0, 120.0, True) is lose
