"""The collective watchdog's settings, in one place: NCCL environment, dump locations and process-group timeouts.

A collective that hangs should end the rank with `exitcodes.COLLECTIVE_TIMEOUT` (so `policy/` can tell it from a
crash) and leave a flight-recorder trace next to the checkpoints. Call, in this order:

    timeouts = collective_timeouts(spec.fault_tolerance)                # flywheel/spec/timeouts.py
    apply_collective_env(collective_env(checkpoint_dir, timeouts))    # before init_process_group
    dist.init_process_group(backend, timeout=timeouts.startup)        # long: rendezvous, restore, first step
    ... first optimizer step ...
    shorten_timeouts(timeouts)                                        # short from now on

NCCL reads its variables when a communicator is created, so they must be in the environment first. On gloo only
the timeouts apply; a gloo timeout raises in the main thread like an aborted NCCL collective does with
TORCH_NCCL_ASYNC_ERROR_HANDLING=2, and the training loop turns both into COLLECTIVE_TIMEOUT.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import TYPE_CHECKING

from flywheel.spec.timeouts import CollectiveTimeouts

if TYPE_CHECKING:  # the module itself imports no torch
    from torch.distributed import ProcessGroup

log = logging.getLogger(__name__)

DEBUG_SUBDIR = ".debug"  # under the checkpoint dir: shared by all workers and kept across restarts
TRACE_BUFFER_ENTRIES = 2000  # flight-recorder entries per rank: the last collectives before a hang
def debug_dir(checkpoint_dir: str | os.PathLike[str]) -> Path:
    return Path(checkpoint_dir) / DEBUG_SUBDIR


def collective_env(checkpoint_dir: str | os.PathLike[str], timeouts: CollectiveTimeouts) -> dict[str, str]:
    """The environment the collective watchdog needs (pure)."""
    debug = debug_dir(checkpoint_dir)
    return {
        # 2 = CleanUpOnly: abort the communicators and raise in the main thread, so the loop exits with
        # COLLECTIVE_TIMEOUT. 1 and 3 (the default) kill the process from the watchdog thread (SIGABRT), which
        # policy/ could not tell from any other crash.
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2",
        "TORCH_NCCL_ENABLE_MONITORING": "1",
        # The heartbeat monitor kills a rank whose NCCL watchdog thread itself is stuck; give it room beyond the
        # collective timeout so the normal timeout path reports first.
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(int(max(60.0, 2 * timeouts.steady.total_seconds()))),
        # The flight recorder's size under its current name; the old one (TORCH_NCCL_TRACE_BUFFER_SIZE) makes torch
        # warn that it is deprecated, and ProcessGroupNCCL's own reading of it defaults to the same 2000.
        "TORCH_FR_BUFFER_SIZE": str(TRACE_BUFFER_ENTRIES),
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(debug / "nccl_trace_rank_"),  # torch appends the rank
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(debug / "nccl_pipe_rank_"),  # torch appends "<rank>.pipe"
    }


def apply_collective_env(desired: Mapping[str, str], environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Put `desired` into the environment and log each variable. A value the user (or pod spec) already set is
    kept and logged as kept: explicit configuration wins. Creates the dump directory. Returns what is in effect."""
    environ = os.environ if environ is None else environ
    effective = {}
    for key, value in desired.items():
        current = environ.get(key)
        if current is None:
            environ[key] = value
            log.info("collective watchdog: %s=%s", key, value)
        elif current != value:
            log.warning("collective watchdog: %s=%s kept from the environment (flywheel would set %s)", key, current,
                        value)
        else:
            log.info("collective watchdog: %s=%s (already set)", key, value)
        effective[key] = environ[key]
    for key in ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"):
        if key in effective:
            Path(effective[key]).parent.mkdir(parents=True, exist_ok=True)
    return effective


def shorten_timeouts(timeouts: CollectiveTimeouts, group: ProcessGroup | None = None) -> None:
    """After the first step: from now on a collective waits `timeouts.steady` at most (gloo and NCCL)."""
    import torch.distributed as dist

    from flywheel.torch_compat import set_pg_timeout  # the public API has no way to change it later

    if not dist.is_initialized():
        return
    set_pg_timeout(timeouts.steady, group)
    log.info("collective timeout %.0fs -> %.0fs after the first step", timeouts.startup.total_seconds(),
             timeouts.steady.total_seconds())
