"""Peak memory of the LM head + loss, forward and backward, for a 128k vocabulary on the CPU: the full loss
(fp32 logits for every token) against `training.chunkedLoss` (torch's chunked linear_cross_entropy).

Each variant runs in a process of its own; its peak is the process's resident high-water mark (ru_maxrss) above
its level once the inputs exist (torch's CPU allocator keeps no statistics of its own); it includes the head's
weight gradient (dim x vocab fp32: 1 GiB), which both variants produce. Shape: Llama 3.2-1B's head
(dim 2048, vocab 128256, fp32) over one 2048-token sequence (`--quick`: 512 tokens).

    python -m bench.loss_memory [--quick] [--tokens N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

DIM, VOCAB = 2048, 128256


def _maxrss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure(tokens: int, chunked: bool, dim: int = DIM) -> dict[str, float]:
    """In this process: the peak above the inputs' level, the seconds and the loss of one forward/backward."""
    import torch
    from torch import nn

    from flywheel.trainer.models.lm_loss import lm_loss

    torch.manual_seed(0)
    head = nn.Linear(dim, VOCAB, bias=False)
    hidden = torch.randn(1, tokens, dim, requires_grad=True)
    targets = torch.randint(0, VOCAB, (1, tokens))
    base = _maxrss_bytes()
    began = time.perf_counter()
    loss = lm_loss(hidden, head, targets, chunked=chunked)
    loss.backward()
    return {"peak_bytes": _maxrss_bytes() - base, "seconds": time.perf_counter() - began, "loss": loss.item()}


def run_variant(tokens: int, chunked: bool, dim: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "bench.loss_memory", "--child", str(tokens), str(int(chunked)),
                          str(dim)],
                         check=True, capture_output=True, text=True)
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="512 tokens")
    parser.add_argument("--tokens", type=int)
    parser.add_argument("--dim", type=int, default=DIM, help="the head's input width (the logits do not depend on it)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(int(args.child[0]), bool(int(args.child[1])), int(args.child[2]))))
        return 0
    from bench.common import write_result

    tokens = args.tokens or (512 if args.quick else 2048)
    full, chunked = run_variant(tokens, False, args.dim), run_variant(tokens, True, args.dim)
    logits = tokens * VOCAB * 4
    print(f"{tokens} tokens x vocab {VOCAB}, dim {args.dim}: fp32 logits {logits / 2**30:.2f} GiB")
    for name, row in (("full", full), ("chunked", chunked)):
        print(f"{name:<8} peak {row['peak_bytes'] / 2**30:6.2f} GiB  {row['seconds']:6.2f} s  loss {row['loss']:.6f}")
    ratio = chunked["peak_bytes"] / full["peak_bytes"]
    write_result("loss_memory", metric="loss_peak_bytes", value=chunked["peak_bytes"], unit="B",
                 peer="the full loss (fp32 logits of every token)", peer_value=full["peak_bytes"], ratio=ratio,
                 goal="chunked peak <= 0.25 x the full loss's", passed=ratio <= 0.25,
                 runs={"full": full, "chunked": chunked}, tokens=tokens, dim=args.dim, vocab=VOCAB,
                 logits_bytes=logits, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
