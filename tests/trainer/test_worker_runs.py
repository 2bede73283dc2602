"""Two-rank gloo runs of `python -m flywheel.trainer` with the worker contract's env: training converges and is
bitwise reproducible for DDP and FSDP2; configuration errors exit USER_ERROR."""

from pathlib import Path

import pytest

from flywheel.contracts import exitcodes

from . import workers

STEPS = 16


def finished(workdir: Path) -> tuple[dict[int, float], str]:
    done = [e for e in workers.events(workdir) if e["event"] == "done"]
    assert len(done) == 1, workers.logs(workdir)
    return workers.losses(workdir), done[0]["params_sha256"]


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True], ids=["ddp", "fsdp"])
def test_two_identical_runs_are_bitwise_equal_and_learn(tmp_path, fsdp):
    spec = workers.job_spec(2, steps=STEPS, fsdp=fsdp, lr=1e-2)
    for run in ("a", "b"):
        assert workers.run(2, spec, tmp_path / run) == [0, 0], workers.logs(tmp_path / run)
    losses_a, digest_a = finished(tmp_path / "a")
    losses_b, digest_b = finished(tmp_path / "b")
    assert sorted(losses_a) == list(range(1, STEPS + 1))
    assert losses_a == losses_b and digest_a == digest_b  # exact float equality, not approx
    assert len(digest_a) == 64
    first, last = sum(losses_a[s] for s in (1, 2, 3)) / 3, sum(losses_a[s] for s in (14, 15, 16)) / 3
    assert last < first - 0.2, losses_a
    start = [e for e in workers.events(tmp_path / "a") if e["event"] == "start"]
    assert start[0]["world_size"] == 2 and start[0]["dp"] == 2 and start[0]["resumed_from"] is None
    # The final checkpoint is committed.
    assert [e["step"] for e in workers.events(tmp_path / "a") if e["event"] == "checkpoint"] == [STEPS]


@pytest.mark.slow
def test_bf16_with_activation_checkpointing_trains(tmp_path):
    spec = workers.job_spec(2, steps=6, fsdp=True, lr=1e-2, precision="bf16", activationCheckpointing=True)
    assert workers.run(2, spec, tmp_path) == [0, 0], workers.logs(tmp_path)
    losses, _ = finished(tmp_path)
    assert losses[6] < losses[1]


def test_unsupported_layout_is_a_user_error(tmp_path):
    spec = workers.job_spec(2, steps=2)  # DDP
    spec["trainer"]["parallelism"]["tp"] = 2
    assert workers.run(2, spec, tmp_path) == [exitcodes.USER_ERROR] * 2
    assert "tp = 2 needs fsdp: true" in workers.logs(tmp_path)


@pytest.mark.slow
def test_pipeline_run_resumes_under_data_parallel(tmp_path):
    # pp=2 (AdamW, the loop's loss logging and final digest) for 4 steps, then the same job continues at dp=2 from
    # its checkpoint: the losses follow an uninterrupted dp=2 run. A constant lr after warmup, so the shorter first
    # run has the same schedule.
    def spec(steps: int, parallelism: dict) -> dict:
        job = workers.job_spec(2, steps=steps, lr=1e-2, minLrRatio=1.0)
        job["trainer"]["parallelism"] = parallelism
        return job

    assert workers.run(2, spec(8, {"fsdp": True}), tmp_path / "ref") == [0, 0], workers.logs(tmp_path / "ref")
    run = tmp_path / "run"
    assert workers.run(2, spec(4, {"pp": 2, "schedule": "gpipe"}), run) == [0, 0], workers.logs(run)
    assert len(finished(run)[1]) == 64  # the digest covers both stages
    assert workers.run(2, spec(8, {"fsdp": True}), run) == [0, 0], workers.logs(run)
    reference, resumed = workers.losses(tmp_path / "ref"), workers.losses(run)
    assert sorted(resumed) == list(range(1, 9))
    assert max(abs(resumed[s] - reference[s]) / reference[s] for s in reference) < 1e-5, (resumed, reference)
    assert [e["step"] for e in workers.events(run) if e["event"] == "restore"] == [4]


def test_text_data_with_a_small_vocabulary_is_a_user_error(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox " * 200)
    spec = workers.job_spec(2, steps=2)
    spec["trainer"]["model"]["vocab"] = 128
    spec["trainer"]["data"] = {"source": str(corpus)}
    assert workers.run(2, spec, tmp_path) == [exitcodes.USER_ERROR] * 2
    assert "set trainer.model.vocab to at least 256" in workers.logs(tmp_path)


def test_missing_spec_is_a_user_error(tmp_path):
    spec = workers.job_spec(1, steps=2)
    assert workers.run(1, spec, tmp_path, extra_env={"FLYWHEEL_SPEC": ""}) == [exitcodes.USER_ERROR]
    assert "FLYWHEEL_SPEC is not set" in workers.logs(tmp_path)
