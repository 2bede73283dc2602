"""A stand-in trainer rank for hang tests: the trainer's own metrics (flywheel.trainer.metrics), a step every
`--step-seconds`, served on `--port` (0 = pick one). Prints `listening on <port>`. SIGSTOP it to make it hang the
way a wedged rank does: its step timestamp stops and its /metrics stops answering.

    python -m tests.monitoring.progress_exporter --job train --namespace ml --replica 1 --rank 1
"""

from __future__ import annotations

import argparse
import socket
import time

from flywheel.trainer.metrics import TrainerMetrics


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("job", "namespace", "replica", "rank"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--step-seconds", type=float, default=0.2)
    args = parser.parse_args()
    port = args.port or _free_port()
    metrics = TrainerMetrics(port, {"job": args.job, "namespace": args.namespace, "replica": args.replica,
                                    "rank": args.rank})
    print(f"listening on {port}", flush=True)
    while True:
        began = time.monotonic()
        time.sleep(args.step_seconds)
        metrics.record_step(loss=2.0, step_seconds=time.monotonic() - began, tokens_per_second=1000.0,
                            timestamp=time.time())


if __name__ == "__main__":
    main()
