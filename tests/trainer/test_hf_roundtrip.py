"""Hugging Face in and out across processes: a HF model imported under tp 2 (and FSDP over dp 2) gives
transformers' logits (<= 1e-5, each rank reading only its slices), trains, is checkpointed, and `flywheel export`
turns the checkpoint into a directory transformers loads, whose loss on a batch equals Flywheel's (<= 1e-5)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from flywheel.cli import main
from flywheel.trainer.models.hf_export import ExportError, export_hf
from tests.parallel.harness import REPO, _free_port
from tests.warm_ranks import start_rank

from .hf_models import hf_logits, save_hf_model

pytest.importorskip("transformers")
TOLERANCE = 1e-5


def run_workers(world: int, workdir: Path, run: dict, timeout: float = 240) -> dict:
    port, procs = _free_port(), []
    for rank in range(world):
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), HF_RUN=json.dumps(run))
        with open(workdir / f"rank{rank}.log", "ab") as log:
            procs.append(start_rank("tests.trainer.hf_worker", env, log))
    codes = [p.wait(timeout=timeout) for p in procs]
    if codes != [0] * world:
        logs = "\n".join(p.read_text()[-3000:] for p in sorted(workdir.glob("rank*.log")))
        raise AssertionError(f"exit codes {codes}\n{logs}")
    return torch.load(run["out"])


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "parallelism"), [("llama", {"tp": 2}), ("qwen2", {"fsdp": True}),
                                                   ("gpt2", {"tp": 2})], ids=["llama-tp2", "qwen2-fsdp2", "gpt2-tp2"])
def test_import_train_export_round_trip(tmp_path, kind, parallelism):
    import transformers

    source = save_hf_model(kind, tmp_path / "hf", max_shard_size="20KB")
    (source / "tokenizer_config.json").write_text("{}\n")  # a tokenizer file to carry over
    run = {"pretrained": str(source), "parallelism": parallelism, "steps": 3,
           "checkpointDir": str(tmp_path / "ckpt"), "out": str(tmp_path / "result.pt")}
    result = run_workers(2, tmp_path, run)
    assert relative(result["logits"], hf_logits(source, result["tokens"])) <= TOLERANCE

    out = tmp_path / "exported"
    export_hf(tmp_path / "ckpt", out, max_shard_bytes=20_000)  # what `flywheel export` runs, with small shards
    assert (out / "model.safetensors.index.json").exists() and (out / "tokenizer_config.json").exists()
    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokens = result["tokens"]
    with torch.no_grad():
        logits = model(tokens).logits
    loss = F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())
    assert abs(float(loss) - float(result["loss"])) <= TOLERANCE * float(result["loss"])
    assert relative(hf_logits(source, tokens), logits) > 1e-3  # training moved the weights
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "cli")]) == 0  # one file at this size
    assert (tmp_path / "cli" / "model.safetensors").exists() and (tmp_path / "cli" / "config.json").exists()


def test_export_without_a_checkpoint_says_what_it_needs(tmp_path, capsys):
    with pytest.raises(ExportError, match="no committed checkpoint here"):
        export_hf(tmp_path, tmp_path / "out")
    assert main(["export", str(tmp_path), "--format", "hf", "--out", str(tmp_path / "out")]) == 2
    assert "no committed checkpoint here" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "world", "parallelism"), [
    ("llama", 2, {"pp": 2, "fsdp": False}),  # the tied head on the last stage reads the embedding
    ("llama-untied", 2, {"pp": 2, "fsdp": False}),
    ("llama-untied", 4, {"tp": 2}),  # FSDP2 over dp 2 on top of tp 2: 2-D shards
], ids=["pp2-tied", "pp2-untied", "dp2xtp2"])
def test_sharded_layouts_load_the_same_weights(tmp_path, kind, world, parallelism):
    """Each rank reads only its slices; gathered, they are the one-process import, whose logits match
    transformers' (test_hf_import.py)."""
    from flywheel.spec.job import ModelSpec
    from flywheel.trainer.models.hf_weights import load_pretrained
    from flywheel.trainer.models.registry import build_model, model_shape

    source = save_hf_model(kind, tmp_path / "hf", max_shard_size="20KB")
    run = {"pretrained": str(source), "parallelism": parallelism, "steps": 1, "stateOnly": True,
           "checkpointDir": str(tmp_path / "ckpt"), "out": str(tmp_path / "state.pt")}
    gathered = run_workers(world, tmp_path, run)
    shape = model_shape(ModelSpec(pretrained=str(source), seqLen=16))
    reference = build_model(shape, seed=1)
    load_pretrained(reference, source, shape)
    expected = reference.state_dict()
    assert sorted(gathered) == sorted(expected)
    assert all(torch.equal(gathered[k], expected[k]) for k in expected)
