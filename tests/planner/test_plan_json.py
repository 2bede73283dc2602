"""`flywheel plan -o json`: top-level `chosen` and `candidates` with the keys the issue names, and for an `auto` job
the chosen layout is the one the workers get."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flywheel.cli import main
from flywheel.planner import DEVICES
from flywheel.spec import load_job
from flywheel.spec.auto import resolve_auto
from tests.builders import example, job_file

REPO = Path(__file__).resolve().parents[2]
REQUIRED = {"dp", "tp", "pp", "microbatches", "fsdp", "activationCheckpointing", "est_step_seconds",
            "est_memory_bytes"}


def plan_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["plan", *args, "-o", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_chosen_and_candidates_are_top_level_with_every_key(capsys):
    out = plan_json(capsys, str(REPO / "examples" / "tiny.yaml"), "--top", "3")
    assert REQUIRED <= set(out["chosen"])
    assert len(out["candidates"]) == 3 and all(REQUIRED <= set(c) for c in out["candidates"])
    assert out["candidates"][0] == out["chosen"]
    chosen = out["chosen"]
    assert chosen["dp"] * chosen["tp"] * chosen["pp"] == 4
    assert chosen["microbatches"] == 16 // (chosen["dp"] * chosen["microBatch"])
    assert out["layout"]["chosen"] == chosen and out["layout"]["candidates"] == out["candidates"]
    assert [w["ranks"] for w in out["workers"]] == [[0, 1], [2, 3]]


def test_an_auto_job_shows_what_its_workers_get(capsys, tmp_path):
    path = job_file(tmp_path, example(**{"spec.trainer.parallelism": {"auto": True}}), "auto.yaml")
    out = plan_json(capsys, str(path), "--device", "h100")
    resolved = resolve_auto(load_job(path).spec, DEVICES["h100"])
    par, training = resolved.trainer.parallelism, resolved.trainer.training
    chosen = out["chosen"]
    assert (chosen["tp"], chosen["pp"], chosen["fsdp"], chosen["microBatch"], chosen["activationCheckpointing"]) == (
        par.tp, par.pp, par.fsdp, training.micro_batch, training.activation_checkpointing)
    assert all(REQUIRED <= set(c) for c in out["candidates"])


def test_a_user_command_has_no_layout(capsys):
    out = plan_json(capsys, str(REPO / "examples" / "user-script.yaml"))
    assert out["chosen"] is None and out["candidates"] == [] and out["layout"] is None
    assert out["workers"]
