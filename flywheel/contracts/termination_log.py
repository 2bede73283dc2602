"""A worker's reason for a non-zero exit, written to its container's termination message file (the pod's
`terminationMessagePath`, named to the process in env FLYWHEEL_TERMINATION_LOG by the operator): the kubelet puts it
in the pod's `state.terminated.message`, and the operator in the failure condition and the event.

The first reason written wins: the first rank to fail writes its exception; ranks stopped after it, and the agent
(which only knows an exit code or a signal), write only while the file is still empty. The agent empties it
(`clear`) once it has stopped its ranks to restart them in place: that failure is recovered from, and the message
must name the one the pod fails with later, if it does."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Mapping

from flywheel.contracts import exitcodes
from flywheel.contracts.text import one_line

ENV = "FLYWHEEL_TERMINATION_LOG"
MAX_BYTES = 4096  # what the kubelet keeps of the file
log = logging.getLogger(__name__)
# Told every reason this process writes, first: rank 0's progress publisher puts it in the etcd progress key
# (progress_publisher.py), where the operator reads it when the pod's terminated message is empty.
_listeners: list[Callable[[str], None]] = []


def add_listener(listener: Callable[[str], None]) -> None:
    _listeners.append(listener)


def remove_listener(listener: Callable[[str], None]) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


def exception_reason(err: BaseException) -> str:
    """The exception's type and the last line of its message, e.g. "ModuleNotFoundError: No module named 'x'"."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    return one_line(f"{type(err).__name__}: {lines[-1]}" if lines else type(err).__name__)


def exit_reason(code: int) -> str:
    """An exit code as a reason: the signal's name for a signal death (negative, or a shell's 128+N)."""
    signum = exitcodes.signal_number(code)
    if signum:
        try:
            return f"killed by {signal.Signals(signum).name}"
        except ValueError:
            return f"killed by signal {signum}"
    return f"exit code {code} ({exitcodes.describe(code)})"


def write_reason(reason: str, environ: Mapping[str, str] | None = None) -> bool:
    """Write `reason` unless the file already holds one. No path, or an unwritable one: skipped silently (a local
    run without the variable, a read-only file system). True when written."""
    for listener in list(_listeners):
        try:
            listener(reason)
        except Exception as err:  # noqa: BLE001 - best effort: the file below is the contract
            log.debug("termination reason listener: %s", err)
    path = (os.environ if environ is None else environ).get(ENV)
    if not path or not reason:
        return False
    try:
        with open(path, "a+b") as f:
            if f.tell() > 0:  # "a+" opens at the end: a reason is there already
                return False
            f.write(reason.encode()[:MAX_BYTES])
        return True
    except OSError:
        return False


def read(environ: Mapping[str, str] | None = None) -> str:
    """The reason the file holds now ("" when none, or no file)."""
    path = (os.environ if environ is None else environ).get(ENV)
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            return f.read(MAX_BYTES).decode(errors="replace").strip()
    except OSError:
        return ""


def clear(environ: Mapping[str, str] | None = None) -> None:
    """Empty the file (it exists and is writable; else nothing to do), so the next reason written wins."""
    path = (os.environ if environ is None else environ).get(ENV)
    if not path:
        return
    try:
        os.truncate(path, 0)
    except OSError:
        pass
