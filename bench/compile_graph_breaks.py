"""Graph breaks of the compiled forward/backward (`training.compile: true`), per model preset, on the CPU.

Each preset is built as the trainer builds it and compiled as `parallelize` compiles it (every block, and the head +
loss), then runs two forward/backward passes (the second catches recompiles) under inductor. Reported per preset:
dynamo's graph breaks (goal: 0 for every preset), the graphs compiled, and their reasons when there are breaks.

Graph breaks depend on the code a preset runs (GPT or Llama blocks, grouped-query attention, RoPE scaling, a tied or
untied head, the 128k-vocabulary loss), not on its depth or width: each preset runs with 2 layers, seqLen 128, and
a width of at most 512 (heads and MLP scaled alike, the head dimension and vocabulary kept), so the 8B preset fits
beside the others in a CPU's memory. `gpt-tiny+moe` adds a mixture-of-experts GPT (not a preset; MoE routing has
data-dependent shapes). `--chunked-loss` runs the head + loss through torch's chunked linear_cross_entropy.

    python -m bench.compile_graph_breaks [--quick] [--chunked-loss] [--preset NAME ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from torch._dynamo.utils import counters

from bench.common import write_result
from flywheel.layout.shape import PRESETS, ModelShape, MoEConfig
from flywheel.spec.job import Training
from flywheel.trainer.distributed.parallelize import apply_compile, apply_loss
from flywheel.trainer.models.registry import build_model

MOE = "gpt-tiny+moe"
QUICK = ("gpt-tiny", "llama-tiny")
WIDTH = 512


def bench_shape(name: str) -> ModelShape:
    """The preset's code path at 2 layers, seqLen 128 and a width of at most WIDTH."""
    base = PRESETS[name.removesuffix("+moe")]
    moe = MoEConfig(experts=4, top_k=2) if name == MOE else None
    scale = min(1.0, WIDTH / base.dim)
    dim = int(base.dim * scale)
    heads = max(1, dim // base.head_dim)
    kv_heads = max(1, base.kv_heads * heads // base.heads) if base.kv_heads else 0
    ffn = int(base.ffn * scale) if base.architecture == "llama" else 0  # a GPT's MLP follows dim
    positions = base.max_positions if base.architecture == "llama" else 0
    return dataclasses.replace(base, layers=2, dim=dim, heads=heads, kv_heads=kv_heads, ffn=ffn,
                               seq_len=min(base.seq_len, 128), max_positions=positions, moe=moe)


def count(name: str, chunked_loss: bool) -> dict[str, Any]:
    """Compile one preset as the trainer does and run two forward/backward passes; dynamo's counts."""
    torch._dynamo.reset()
    counters.clear()
    shape = bench_shape(name)
    torch.manual_seed(0)
    model = build_model(shape)
    training = Training(compile=True, chunked_loss=chunked_loss)
    apply_compile(model)
    apply_loss(model, training)
    tokens = torch.randint(0, shape.vocab, (1, shape.seq_len + 1))
    began = time.monotonic()
    for _ in range(2):
        model(tokens[:, :-1], tokens[:, 1:]).backward()
    breaks = counters["graph_break"]
    return {"preset": name, "graph_breaks": sum(breaks.values()), "graphs": counters["stats"]["unique_graphs"],
            "reasons": sorted({reason.splitlines()[0] for reason in breaks}), "seconds": time.monotonic() - began,
            "shape": {"layers": shape.layers, "dim": shape.dim, "heads": shape.heads, "kv_heads": shape.kv_heads,
                      "vocab": shape.vocab, "seq_len": shape.seq_len}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--chunked-loss", action="store_true", help="training.chunkedLoss: true")
    parser.add_argument("--preset", action="append", choices=[*PRESETS, MOE])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = args.preset or (QUICK if args.quick else [*PRESETS, MOE])
    rows = []
    for name in names:
        row = count(name, args.chunked_loss)
        rows.append(row)
        print(f"{name:<14} graph breaks {row['graph_breaks']:>2}  graphs {row['graphs']:>2}  "
              f"{row['seconds']:6.1f} s  {'; '.join(row['reasons'])}", flush=True)
    presets = [r for r in rows if r["preset"] in PRESETS]
    total = sum(r["graph_breaks"] for r in presets)
    write_result("compile_graph_breaks", metric="graph_breaks_per_preset", value=total, unit="breaks",
                 peer="none (goal: 0 per preset)", peer_value=None, goal="0 graph breaks for every preset",
                 passed=total == 0, runs=rows, quick=args.quick, chunked_loss=args.chunked_loss,
                 setup=f"torch {torch.__version__}, inductor on CPU, 2 layers, seqLen 128, width <= {WIDTH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
