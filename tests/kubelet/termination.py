"""The container termination message, as the kubelet keeps it: the file at the container's
`terminationMessagePath` (at most 4096 bytes), or with `terminationMessagePolicy: FallbackToLogsOnError` the tail of
the container log (the last 80 lines, at most 2048 bytes) when the file is empty and the container failed.

The process kubelet has no mount namespace: the host file it would bind-mount at the path is named to the process
instead, by rewriting every environment value equal to the path (the operator names it in FLYWHEEL_TERMINATION_LOG).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEFAULT_PATH = "/dev/termination-log"
MAX_FILE_BYTES = 4096
FALLBACK_LINES = 80
FALLBACK_BYTES = 2048


def mount(container: dict[str, Any], env: dict[str, str], host: Path) -> None:
    """Create the empty file for this start of the container and point the environment's mentions of the
    container path at it."""
    host.write_bytes(b"")
    path = container.get("terminationMessagePath") or DEFAULT_PATH
    for key, value in env.items():
        if value == path:
            env[key] = str(host)


def message(container: dict[str, Any], host: Path, log_path: Path, exit_code: int) -> str:
    """`state.terminated.message` for a container that exited with `exit_code`."""
    try:
        with open(host, "rb") as f:
            text = f.read(MAX_FILE_BYTES)
    except OSError:
        text = b""
    if (not text.strip() and exit_code != 0
            and container.get("terminationMessagePolicy") == "FallbackToLogsOnError"):
        try:
            tail = log_path.read_bytes()[-64 * 1024:]
        except OSError:
            tail = b""
        text = b"\n".join(tail.splitlines()[-FALLBACK_LINES:])[-FALLBACK_BYTES:]
    return text.decode(errors="replace")
