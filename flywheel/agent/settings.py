"""`flywheel launch`'s settings, read from the worker contract env (PET_*, FLYWHEEL_*; docs/contracts.md), and the
command each rank runs. Pure: no torch."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

DEFAULT_JOIN_TIMEOUT_S = 900  # generous: a replacement worker may take minutes to be scheduled and start
DEFAULT_MONITOR_INTERVAL_S = 0.1
DEFAULT_SHUTDOWN_TIMEOUT_S = 20  # grace for the ranks' emergency checkpoint after SIGTERM


class LaunchConfigError(ValueError):
    """The PET_* environment does not describe a runnable worker."""


@dataclass(frozen=True)
class LaunchSettings:
    """Everything `flywheel launch` needs, parsed from the environment (pure; see `settings_from_env`)."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    rdzv_backend: str
    rdzv_endpoint: str
    run_id: str
    max_restarts: int
    command: tuple[str, ...]
    rdzv_configs: dict[str, Any] = field(default_factory=dict)
    local_addr: str | None = None
    monitor_interval: float = DEFAULT_MONITOR_INTERVAL_S
    shutdown_timeout: int = DEFAULT_SHUTDOWN_TIMEOUT_S
    warm_start: bool = True  # fork ranks from a pre-imported zygote (warm.py; a user command: warm_entry.py)

    @property
    def runs_embedded_trainer(self) -> bool:
        return self.command == trainer_command()


def _int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        if default is None:
            raise LaunchConfigError(f"{key} is not set; the executor must give every worker the contract env")
        return default
    try:
        return int(raw)
    except ValueError:
        raise LaunchConfigError(f"{key}={raw!r} is not an integer") from None


def _parse_nnodes(raw: str) -> tuple[int, int]:
    lo, _, hi = raw.partition(":")
    try:
        low, high = int(lo), int(hi or lo)
    except ValueError:
        raise LaunchConfigError(f"PET_NNODES={raw!r} is not N or MIN:MAX") from None
    if not 1 <= low <= high:
        raise LaunchConfigError(f"PET_NNODES={raw!r} needs 1 <= min <= max")
    return low, high


def _parse_rdzv_conf(raw: str) -> dict[str, str]:
    """torchrun's --rdzv-conf syntax: key=value,key=value."""
    out = {}
    for item in filter(None, (p.strip() for p in raw.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise LaunchConfigError(f"PET_RDZV_CONF item {item!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def _is_loopback(endpoint: str) -> bool:
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


TRAINER_MODULE = "flywheel.trainer"
# All a rank imports: torch, the model, parallelize, DCP (flywheel.trainer.entry); torch._dynamo, which DDP and
# FSDP import when they wrap the model; the pipeline schedules, which only pp jobs import (pipeline_parallel.py).
WARM_PRELOAD = ("flywheel.trainer.entry", "torch._dynamo", "torch.distributed.pipelining")


def trainer_command() -> tuple[str, ...]:
    return (sys.executable, "-m", TRAINER_MODULE)


# A command starting with one of these runs under this agent's own interpreter, not whatever PATH finds first.
_THIS_PYTHON = ("python", "python3")


def rank_command(user_command: Sequence[str]) -> tuple[str, ...]:
    """What each rank runs: the embedded trainer, or the user command. A bare script.py runs under this Python, as
    with `torchrun script.py`; so does a leading `python`/`python3`: under `flywheel run` that is the interpreter
    `flywheel run` runs under (its virtualenv, activated or not), the one Flywheel and its deps are installed in."""
    if not user_command:
        return trainer_command()
    if user_command[0].endswith(".py"):
        return (sys.executable, "-u", *user_command)
    if user_command[0] in _THIS_PYTHON:
        return (sys.executable, *user_command[1:])
    return tuple(user_command)


def settings_from_env(env: Mapping[str, str], user_command: Sequence[str] = ()) -> LaunchSettings:
    """Read the worker contract env. `user_command` replaces the embedded trainer when given."""
    min_nodes, max_nodes = _parse_nnodes(env.get("PET_NNODES", "1"))
    backend = env.get("PET_RDZV_BACKEND", "c10d")
    endpoint = env.get("PET_RDZV_ENDPOINT", "")
    if backend != "static" and not endpoint:
        raise LaunchConfigError(f"PET_RDZV_ENDPOINT is not set for rendezvous backend {backend!r}")
    configs: dict[str, Any] = {
        "join_timeout": DEFAULT_JOIN_TIMEOUT_S,
        "last_call_timeout": 1,  # the default 30 s is paid on every restart
        "keep_alive_max_attempt": 3,
        # A worker lost whole stays a participant until its heartbeats expire (interval x attempts): 6 s, not 15.
        "keep_alive_interval": 2,
    }
    if backend == "c10d":
        # The store lives with the executor (the local supervisor hosts it), so it survives the loss of any worker.
        configs["is_host"] = False
    configs.update(_parse_rdzv_conf(env.get("PET_RDZV_CONF", "")))
    if int(configs["keep_alive_max_attempt"]) < 3:
        raise LaunchConfigError("keep_alive_max_attempt below 3 lets two groups form under one run id; use >= 3")
    local_addr = env.get("PET_LOCAL_ADDR") or ("127.0.0.1" if _is_loopback(endpoint) else None)
    return LaunchSettings(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=_int(env, "PET_NPROC_PER_NODE", 1),
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        run_id=env.get("PET_RDZV_ID", "flywheel"),
        max_restarts=_int(env, "PET_MAX_RESTARTS", 0),
        command=rank_command(user_command),
        rdzv_configs=configs,
        local_addr=local_addr,
        monitor_interval=float(env.get("PET_MONITOR_INTERVAL", DEFAULT_MONITOR_INTERVAL_S)),
        shutdown_timeout=_int(env, "FLYWHEEL_SHUTDOWN_TIMEOUT", DEFAULT_SHUTDOWN_TIMEOUT_S),
        warm_start=env.get("FLYWHEEL_WARM_START", "1").strip().lower() not in ("0", "false", "no", "off"),
    )
