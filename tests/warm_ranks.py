"""Rank processes of the tests' own rank programs (`python -m tests.parallel.layout_worker` and the like), forked by
one pre-imported interpreter per program and test process: flywheel's zygote (flywheel/agent/warm.py), as the
agent uses it. A cold start imports torch again, ~2 s of CPU per rank, and the parallel-layout tests start ~80."""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
from pathlib import Path
from typing import IO

from flywheel.agent import warm

REPO = Path(__file__).resolve().parents[1]
_zygotes: dict[tuple[str, ...], dict[str, str]] = {}
_stack = contextlib.ExitStack()
atexit.register(_stack.close)


def _zygote_env(preload: tuple[str, ...]) -> dict[str, str]:
    if preload not in _zygotes:
        # What the preloaded modules read at import time: one thread per rank, the repository importable.
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
        _zygotes[preload] = _stack.enter_context(warm.zygote(preload, env=env))
    return _zygotes[preload]


def start_rank(module: str, env: dict[str, str], log: IO[bytes], *,
               preload: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    """`python -m module` with `env`, output to `log`, forked by a zygote that imported `preload` (the module itself
    by default; one zygote per preload, started on first use). Signals reach the rank and its exit status is the
    client's, as for a cold start."""
    zygote_env = _zygote_env(preload or (module,))
    return subprocess.Popen(warm.client_command(module), cwd=REPO, env={**env, **zygote_env}, stdout=log,
                            stderr=log)
