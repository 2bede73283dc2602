"""`flywheel run` with trainer.model.pretrained, then `flywheel export` of the run: training starts from the HF
weights (the first step's logged loss is transformers' loss on that batch) and the export loads in transformers."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from flywheel.cli import main
from flywheel.trainer.data import SampleLoader, build_source
from tests.parallel.harness import REPO

from .hf_models import save_hf_model

pytest.importorskip("transformers")
SEQ, GLOBAL_BATCH = 16, 4


@pytest.mark.slow
def test_run_from_pretrained_then_export(tmp_path):
    import transformers

    source = save_hf_model("llama", tmp_path / "hf", max_shard_size="20KB")
    job = tmp_path / "job.yaml"
    job.write_text(f"""apiVersion: flywheel.dev/v1alpha1
kind: TrainingJob
metadata: {{name: llama-import}}
spec:
  procsPerReplica: 2
  trainer:
    model: {{pretrained: {source}, seqLen: {SEQ}}}
    parallelism: {{tp: 2}}
    training: {{steps: 3, globalBatch: {GLOBAL_BATCH}, microBatch: 2, warmupSteps: 0, lr: 0.001}}
  checkpoint: {{dir: {tmp_path / 'ckpt'}, everySteps: 3, async: false}}
""")
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "flywheel.cli", "run", str(job), "--out", str(out), "--no-progress"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    first_loss = json.loads((out / "summary.json").read_text())["losses"][0]

    hf = transformers.AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    batches = SampleLoader(build_source("synthetic", 96, SEQ, 0)).next_microbatches(0, 1, GLOBAL_BATCH, 2)
    with torch.no_grad():
        losses = [F.cross_entropy(hf(x).logits.flatten(0, 1), y.flatten()) for x, y in batches]
    assert abs(float(torch.stack(losses).mean()) - first_loss) <= 1e-5 * first_loss

    assert main(["export", str(out), "--format", "hf", "--out", str(tmp_path / "exported")]) == 0
    exported = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "exported", dtype=torch.float32)
    assert exported.config.num_key_value_heads == 2 and exported.config.tie_word_embeddings
