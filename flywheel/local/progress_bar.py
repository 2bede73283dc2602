"""Live progress of a local run: a rich progress bar on a terminal, plain periodic lines otherwise."""

from __future__ import annotations

import time
from typing import Any, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from flywheel.local.run_record import RunRecord

PLAIN_INTERVAL_S = 5.0


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def status_fields(record: RunRecord) -> dict[str, str]:
    ckpt = record.last_checkpoint_step
    return {
        "loss": _fmt(record.last_loss, ".4f"),
        "tps": _fmt(record.tokens_per_second, ",.0f"),
        "restarts": str(record.restarts),
        "ckpt": "-" if ckpt is None else f"step {ckpt}",
    }


class ProgressView(Protocol):
    def __enter__(self) -> ProgressView: ...
    def __exit__(self, *exc: object) -> None: ...
    def update(self, record: RunRecord) -> None: ...
    def notice(self, message: str) -> None: ...


class RichProgress:
    """A live bar: step/steps, loss, tokens/s, restarts, last checkpoint; notices print above it."""

    def __init__(self, console: Console, job: str, total_steps: int):
        self.console = console
        self._progress = Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tps]} tok/s"),
            TextColumn("restarts {task.fields[restarts]}"), TextColumn("ckpt {task.fields[ckpt]}"),
            TimeElapsedColumn(), console=console, transient=False, refresh_per_second=4)
        self._task = self._progress.add_task(job, total=total_steps, loss="-", tps="-", restarts="0", ckpt="-")

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def update(self, record: RunRecord) -> None:
        fields: dict[str, Any] = dict(status_fields(record))  # the task's own columns, passed through **fields
        self._progress.update(self._task, completed=record.last_step, **fields)

    def notice(self, message: str) -> None:
        self._progress.console.print(message)


class PlainProgress:
    """One line every few seconds while something changed, for logs and non-TTY output."""

    def __init__(self, console: Console, job: str, total_steps: int, interval: float = PLAIN_INTERVAL_S):
        self.console, self.job, self.total, self.interval = console, job, total_steps, interval
        self._last_print = 0.0
        self._last_line = ""

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, record: RunRecord) -> None:
        f = status_fields(record)
        steps = (f"step {record.last_step}/{self.total or '?'}" if record.log.steps_reported
                 else "steps not reported (yet)")
        line = f"{self.job}: {steps} loss {f['loss']} {f['tps']} tok/s restarts {f['restarts']} ckpt {f['ckpt']}"
        now = time.monotonic()
        if line != self._last_line and now - self._last_print >= self.interval:
            self.console.print(line, highlight=False)
            self._last_print, self._last_line = now, line

    def notice(self, message: str) -> None:
        self.console.print(message, highlight=False)


def make_progress(console: Console, job: str, total_steps: int, enabled: bool) -> ProgressView:
    if enabled and console.is_terminal:
        return RichProgress(console, job, total_steps)
    return PlainProgress(console, job, total_steps)
