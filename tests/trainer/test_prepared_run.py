"""End to end: a tokenizer trained here, `flywheel prepare-data` into several uint32 shards, then a 2 workers x 2
ranks `flywheel run` on them with a rank killed mid-run that ends bitwise equal to the run without the kill; then
`flywheel generate` from the run (greedy: the same text every time) and `flywheel export` with the tokenizer."""

from __future__ import annotations

import pytest

from flywheel.cli import main
from flywheel.data.shards import read_index
from flywheel.trainer.generate import GenerateOptions, generate_text
from tests.data_prep.corpus import train_tokenizer, write_corpus
from tests.integration.test_exact_recovery import _logs, flywheel_run, job_doc

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepared")
    tokenizer = train_tokenizer(root / "tok" / "tokenizer.json")
    inputs = write_corpus(root / "in", lines=600)
    assert main(["prepare-data", *map(str, inputs), "--tokenizer", str(tokenizer), "--out", str(root / "shards"),
                 "--shard-tokens", "3000", "--dtype", "uint32", "--workers", "1"]) == 0
    index = read_index(root / "shards")
    assert index.dtype == "uint32" and len(index.shards) >= 3
    return root / "shards", tokenizer


def shard_job(name: str, tmp, shards, tokenizer) -> dict:
    doc = job_doc(name, tmp / "ckpt", fsdp=True, steps=16)
    doc["spec"]["trainer"]["model"] = {"preset": "llama-tiny", "vocab": 320}
    # The shared job evaluates every few steps: a tenth of the shards is held out for it.
    doc["spec"]["trainer"]["data"] = {"source": str(shards), "tokenizer": str(tokenizer), "validationFraction": 0.1}
    return doc


@pytest.mark.heavy
def test_sharded_run_resumes_bitwise_exact_and_generates(prepared, tmp_path):
    shards, tokenizer = prepared
    ref, result = flywheel_run(tmp_path / "ref", shard_job("ref", tmp_path / "ref", shards, tokenizer))
    assert result.returncode == 0 and ref["status"] == "Succeeded", _logs(tmp_path / "ref")
    faulty, result = flywheel_run(tmp_path / "kill", shard_job("kill", tmp_path / "kill", shards, tokenizer),
                                  "kill:rank=1:step=9")
    assert result.returncode == 0 and faulty["status"] == "Succeeded", _logs(tmp_path / "kill")
    assert faulty["restarts"] >= 1 and any(f["kind"] == "kill" for f in faulty["failures"])
    assert faulty["losses"] == ref["losses"] and len(ref["losses"]) == 16
    assert faulty["final_params_sha256"] == ref["final_params_sha256"] is not None
    assert ref["losses"][-1] < ref["losses"][0]

    run = tmp_path / "ref" / "out"
    greedy = GenerateOptions(max_new_tokens=12)
    first = generate_text(run, "the cat", greedy)
    assert first.startswith("the cat") and len(first) > len("the cat")
    assert generate_text(run, "the cat", greedy) == first
    sampled = GenerateOptions(max_new_tokens=12, temperature=0.8, top_p=0.9, seed=5)
    assert generate_text(run, "the cat", sampled) == generate_text(run, "the cat", sampled)
    assert main(["generate", str(run), "--prompt", "the dog", "--max-new-tokens", "4"]) == 0
    assert main(["export", str(run), "--out", str(tmp_path / "hf")]) == 0
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
