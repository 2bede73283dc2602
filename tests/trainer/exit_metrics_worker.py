"""One rank of the embedded trainer, run as `python -m flywheel.trainer` runs it, that also writes the rank's
Prometheus metrics as they stand at exit to $FLYWHEEL_TEST_METRICS_OUT (text exposition format).

The trainer counts a collective timeout (flywheel_collective_failures_total) right before it returns
COLLECTIVE_TIMEOUT, so no scrape can see it; this wrapper keeps the real code path and reads the same registry."""

from __future__ import annotations

import os

from prometheus_client import generate_latest

from flywheel.trainer import entry
from flywheel.trainer.ft.process_exit import exit_rank
from flywheel.trainer.metrics import TrainerMetrics

made: list[TrainerMetrics] = []


class RecordedMetrics(TrainerMetrics):
    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        made.append(self)


if __name__ == "__main__":
    entry.TrainerMetrics = RecordedMetrics  # type: ignore[misc]
    code = entry.main()
    if made:
        with open(os.environ["FLYWHEEL_TEST_METRICS_OUT"], "wb") as out:
            out.write(generate_latest(made[-1].registry))
    exit_rank(code)  # as flywheel/trainer/__main__.py
