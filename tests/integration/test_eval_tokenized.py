"""A tokenizer trained here, `flywheel prepare-data` into several uint32 shards, then llama-tiny at dp 2 x tp 2 with
evaluation on a held-out fraction of the shards: a run with a rank killed resumes bitwise-exact (train losses,
eval losses and final parameters equal to the uninterrupted run's), with the eval loss in summary.json."""

from __future__ import annotations

import math

import pytest

from flywheel import cli
from flywheel.data.shards import read_index
from tests.data_prep.corpus import train_tokenizer, write_corpus
from tests.integration.test_exact_recovery import _logs, flywheel_run

pytestmark = pytest.mark.slow

STEPS, EVAL_EVERY = 10, 4


def job_doc(ckpt, shards, tokenizer) -> dict:
    return {
        "apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "tok-eval"},
        "spec": {
            "replicas": {"min": 2, "max": 2}, "procsPerReplica": 2,
            "trainer": {"model": {"preset": "llama-tiny", "vocab": 320, "seqLen": 32},
                        "parallelism": {"tp": 2, "fsdp": True},
                        "training": {"steps": STEPS, "globalBatch": 8, "microBatch": 2, "lr": 3e-3,
                                     "warmupSteps": 2, "evalEverySteps": EVAL_EVERY, "evalSteps": 2},
                        "data": {"source": str(shards), "tokenizer": str(tokenizer), "validationFraction": 0.1}},
            "checkpoint": {"dir": str(ckpt), "everySteps": 3, "keep": 2},
            "faultTolerance": {"maxRestarts": 3, "progressTimeoutSeconds": 10, "firstStepTimeoutSeconds": 120},
        },
    }


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    tokenizer = train_tokenizer(root / "tok" / "tokenizer.json")
    out = root / "shards"
    code = cli.main(["prepare-data", *map(str, write_corpus(root / "in", lines=200)), "--tokenizer", str(tokenizer),
                     "--out", str(out), "--shard-tokens", "1500", "--workers", "1", "--dtype", "uint32"])
    assert code == 0
    index = read_index(out)
    assert index.dtype == "uint32" and len(index.shards) >= 3
    return out, tokenizer


@pytest.mark.heavy
def test_tokenized_shards_with_eval_resume_bitwise_exact_at_dp2_tp2(shards, tmp_path):
    data, tokenizer = shards
    ref, result = flywheel_run(tmp_path / "ref", job_doc(tmp_path / "ref" / "ckpt", data, tokenizer))
    assert result.returncode == 0 and ref["status"] == "Succeeded", _logs(tmp_path / "ref")
    assert [e["step"] for e in ref["evals"]] == [4, 8, 10]  # every 4 steps and after the last
    assert ref["final_eval_step"] == STEPS and ref["final_eval_loss"] == ref["evals"][-1]["loss"]
    assert all(math.isfinite(e["loss"]) and e["perplexity"] == pytest.approx(math.exp(e["loss"]))
               for e in ref["evals"])

    faulty, result = flywheel_run(tmp_path / "kill", job_doc(tmp_path / "kill" / "ckpt", data, tokenizer),
                                  "kill:rank=1:step=7")
    assert result.returncode == 0 and faulty["status"] == "Succeeded", _logs(tmp_path / "kill")
    assert faulty["restarts"] >= 1 and any(f["kind"] == "kill" for f in faulty["failures"])
    assert faulty["losses"] == ref["losses"]
    assert faulty["evals"] == ref["evals"]
    assert faulty["final_params_sha256"] == ref["final_params_sha256"] is not None
