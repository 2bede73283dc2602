"""Progress watchdog: a rank that makes no step for too long dumps every thread's stack and exits HANG (4), so the
executor restarts it instead of waiting on a silent collective. It also exits when its parent (the elastic
agent) dies, so no orphaned ranks are left holding ports and GPUs. Starting it also installs the stack dumps on
request (stackdump.py: the checkpoint volume's .debug/dump-request file, and SIGUSR1).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import sys
import threading
import time
from collections.abc import Callable

from flywheel.contracts import exitcodes
from flywheel.trainer.ft import stackdump

log = logging.getLogger(__name__)

PARENT_POLL_SECONDS = 1.0
THREAD_NAME = "flywheel-watchdog"  # what a check for a watchdog left running looks for


class ProgressWatchdog:
    """`beat()` after every step. Until the first beat the allowance is `first_step_timeout_s` (start-up, restore,
    compilation); afterwards `timeout_s`. `timeout_s == 0` disables the hang check (the parent check stays).
    `on_hang(seconds_since_step)` runs just before the exit, e.g. to write a `hang` event."""

    def __init__(self, timeout_s: float, first_step_timeout_s: float, on_hang: Callable[[float], None],
                 *, watch_parent: bool = True):
        self.timeout_s = timeout_s
        self.first_step_timeout_s = first_step_timeout_s
        self.on_hang = on_hang
        self.watch_parent = watch_parent
        self._parent_pid = os.getppid()
        self._last_beat = time.monotonic()
        self._beaten = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)

    def start(self) -> ProgressWatchdog:
        self._last_beat = time.monotonic()
        self._thread.start()
        stackdump.install()  # once per process; outlives stop(): a dump may be wanted after the last step too
        return self

    def beat(self) -> None:
        self._last_beat = time.monotonic()
        self._beaten = True

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _allowance(self) -> float:
        return self.timeout_s if self._beaten else self.first_step_timeout_s

    def _run(self) -> None:
        poll = PARENT_POLL_SECONDS
        if self.timeout_s > 0:
            poll = min(poll, self.timeout_s / 4, self.first_step_timeout_s / 4)
        while not self._stopped.wait(poll):
            if self.watch_parent and os.getppid() != self._parent_pid:
                log.error("parent process %d is gone; exiting so no orphaned rank is left", self._parent_pid)
                _exit(exitcodes.CRASH)
            idle = time.monotonic() - self._last_beat
            if self.timeout_s > 0 and idle > self._allowance():
                self._fire(idle)

    def _fire(self, idle: float) -> None:
        phase = "the next step" if self._beaten else "the first step"
        print(f"flywheel watchdog: no progress for {idle:.1f}s waiting for {phase} (allowance "
              f"{self._allowance():.1f}s); dumping all stacks and exiting with code {exitcodes.HANG}",
              file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        try:
            self.on_hang(idle)
        except Exception:  # the exit must happen even if reporting fails
            log.exception("watchdog on_hang callback failed")
        _exit(exitcodes.HANG)


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # the main thread may be stuck in C code (a collective); skip interpreter shutdown
