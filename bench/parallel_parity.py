"""Parity grid: each parallel layout against the 1-process reference (gpt-tiny, SGD, fp32, gloo, 20 steps).

Pipeline rows: GPipe, 1F1B and interleaved 1F1B (2 stages per rank: a 4-layer model against its own reference),
and pp composed with dp, tp and both (8 ranks). MoE rows: gpt-tiny with 4 experts, top-2, in every block, against
the 1-process MoE reference, under FSDP alone and with expert parallel (ep alone, with more dp ranks than ep, with
tp, and all three on 8 ranks); their loss difference also covers the load-balancing loss. Prints per layout the
largest relative loss difference over the steps (the goal: < 1e-5, issue 7) and, for information, the largest
relative parameter difference at the end (max |diff| / max |param| per tensor). Llama rows: llama-tiny (RoPE,
RMSNorm, SwiGLU, GQA with 2 kv heads, tied embeddings) under DDP, FSDP2, tp, pp, dp x tp and tp x pp, against its own
1-process reference. `--quick` runs one GPT row and one Llama row (tp2), 3 steps.

    python -m bench.parallel_parity [--steps N] [--only moe]

`--only PREFIX` runs the layouts whose name starts with PREFIX and merges their rows into the committed result
(rows of the same name replaced), so new rows need not rerun the whole grid.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from bench.common import RESULTS, write_result
from tests.parallel.harness import loss_relative_difference, max_relative_difference, run_layout

GOAL = 1e-5
LAYOUTS: list[tuple[str, int, dict]] = [
    ("ddp dp2", 2, {"fsdp": False}),
    ("fsdp dp2 (zero3)", 2, {"fsdp": True}),
    ("fsdp dp2 zero2", 2, {"fsdp": True, "zero": 2}),
    ("tp2+sp", 2, {"tp": 2}),
    ("dp2 x tp2", 4, {"tp": 2}),
    ("tp4+sp", 4, {"tp": 4}),
    ("pp2 gpipe", 2, {"pp": 2, "schedule": "gpipe"}),
    ("pp2 1f1b", 2, {"pp": 2, "schedule": "1f1b"}),
    ("pp2 interleaved-1f1b", 2, {"pp": 2, "schedule": "interleaved-1f1b", "stagesPerRank": 2}),
    ("dp2 x pp2", 4, {"pp": 2}),
    ("tp2 x pp2", 4, {"pp": 2, "tp": 2, "fsdp": True}),
    ("dp2 x tp2 x pp2", 8, {"pp": 2, "tp": 2}),
    ("moe ddp dp2", 2, {"fsdp": False}),
    ("moe fsdp dp2", 2, {}),
    ("moe ep2", 2, {"ep": 2}),
    ("moe dp2 x ep2", 4, {"ep": 2}),
    ("moe ep4", 4, {"ep": 4}),
    ("moe ep2 x tp2", 4, {"ep": 2, "tp": 2}),
    ("moe dp2 x ep2 x tp2", 8, {"ep": 2, "tp": 2}),
    ("llama ddp dp2", 2, {"fsdp": False}),
    ("llama fsdp dp2", 2, {"fsdp": True}),
    ("llama tp2+sp", 2, {"tp": 2}),
    ("llama pp2 1f1b", 2, {"pp": 2, "schedule": "1f1b"}),
    ("llama dp2 x tp2", 4, {"tp": 2}),
    ("llama tp2 x pp2", 4, {"pp": 2, "tp": 2, "fsdp": True}),
]
QUICK = ("tp2+sp", "llama tp2+sp")
MOE = {"preset": "gpt-tiny", "moe": {"experts": 4, "topK": 2}}
# Layouts that need another model than gpt-tiny (2 layers): 2 ranks x 2 stages need 4 blocks; the MoE rows. They
# are compared with a 1-process reference of the same model.
MODELS: dict[str, dict] = {"pp2 interleaved-1f1b": {"preset": "gpt-tiny", "layers": 4},
                           **{name: MOE for name, _, _ in LAYOUTS if name.startswith("moe ")},
                           **{name: {"preset": "llama-tiny"} for name, _, _ in LAYOUTS if name.startswith("llama ")}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="two layouts (GPT and Llama tp2+sp), 3 steps (CI smoke)")
    parser.add_argument("--only", metavar="PREFIX", help="the layouts whose name starts with PREFIX, merged into "
                                                         "the committed result")
    args = parser.parse_args()
    steps = 3 if args.quick else args.steps
    layouts = ([x for x in LAYOUTS if x[0] in QUICK] if args.quick else
               [x for x in LAYOUTS if x[0].startswith(args.only or "")])
    options = {"steps": steps, "lr": 1.0, "gradClip": 0.5}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        refs: dict[str, dict] = {}
        for i, (name, world, layout) in enumerate(layouts):
            model = MODELS.get(name, {"preset": "gpt-tiny"})
            key = str(sorted(model.items()))
            if key not in refs:
                refs[key] = run_layout(1, Path(tmp) / f"ref{len(refs)}", model=model, **options)
            ref = refs[key]
            got = run_layout(world, Path(tmp) / str(i), parallelism=layout, model=model, **options)
            loss_rel = loss_relative_difference(got["losses"], ref["losses"])
            if "moe" in model:
                loss_rel = max(loss_rel, loss_relative_difference(got["aux_losses"], ref["aux_losses"]))
            rows.append({"layout": name, "world": world, "loss_rel": loss_rel,
                         "param_rel": max_relative_difference(got["params"], ref["params"])})
    print(f"{'layout':<22} {'ranks':>5} {'max loss rel diff':>18} {'max param rel diff':>19}")
    for row in rows:
        print(f"{row['layout']:<22} {row['world']:>5} {row['loss_rel']:>18.2e} {row['param_rel']:>19.2e}")
    if args.only and not args.quick:
        committed = json.loads((RESULTS / "parallel_parity.json").read_text())["runs"]
        new = {row["layout"]: row for row in rows}
        rows = [new.pop(row["layout"], row) for row in committed] + list(new.values())
        order = [name for name, _, _ in LAYOUTS]
        rows.sort(key=lambda row: order.index(row["layout"]) if row["layout"] in order else len(order))
    worst = max(r["loss_rel"] for r in rows)
    write_result("parallel_parity", metric="worst relative loss difference to the 1-process reference", value=worst,
                 unit="relative", peer="goal", peer_value=GOAL, goal=f"< {GOAL}", passed=worst < GOAL,
                 runs=rows, steps=steps, quick=args.quick)


if __name__ == "__main__":
    main()
