"""How a rank process ends: what it printed flushed, then os._exit, with no interpreter shutdown.

Interpreter shutdown is unsafe for a rank. Background threads (checkpoint writers, the metrics server) would keep a
finished or failed rank alive, a broken process group can hang it, and it races gloo: a finished barrier's work
object, which holds the collectives issued before it, is freed on a gloo worker thread after `dist.barrier()` has
returned; when that drops the last reference to a tensor Python still tracks, the thread takes the GIL, finds the
interpreter finalizing and unwinds through a C++ destructor, and the rank aborts ("terminate called without an active
exception", exit -6) after all its work is done. Releasing a model whose group is still alive deadlocked too:
~ProcessGroupGloo joins its worker thread holding the GIL while that thread waits for the GIL to free a finished
work item."""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def exit_rank(code: int) -> NoReturn:
    """Flush stdout and stderr and end the process now with `code`."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
