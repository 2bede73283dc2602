"""The failure taxonomy: what went wrong, from an exit code or a Kubernetes pod status (pure)."""

from __future__ import annotations

import signal
from enum import Enum

from flywheel import exitcodes


class FailureKind(str, Enum):
    CRASH = "Crash"  # uncaught exception or unknown non-zero exit
    USER_ERROR = "UserError"  # bad config or data: a restart cannot fix it
    HANG = "Hang"  # progress watchdog fired
    COLLECTIVE_TIMEOUT = "CollectiveTimeout"
    STOPPED = "Stopped"  # SIGTERM (preemption, deletion): emergency checkpoint taken
    KILLED = "Killed"  # died by a signal (SIGKILL, SIGSEGV, ...)
    OOM = "OOMKilled"
    EVICTED = "Evicted"
    NODE_LOST = "NodeLost"
    IMAGE_PULL = "ImagePullError"
    UNSCHEDULABLE = "Unschedulable"


# Failures that are the job's own fault and would only fail again.
PERMANENT = frozenset({FailureKind.USER_ERROR, FailureKind.IMAGE_PULL})
# Failures caused from outside the job: they do not spend the restart budget.
EXTERNAL = frozenset({FailureKind.STOPPED, FailureKind.EVICTED, FailureKind.NODE_LOST})


def classify_exit(exit_code: int) -> FailureKind | None:
    """Classify a process exit code (Popen style: negative for signals, or a shell's 128+N). None = success."""
    if exit_code == exitcodes.SUCCESS:
        return None
    known = {
        exitcodes.USER_ERROR: FailureKind.USER_ERROR,
        exitcodes.HANG: FailureKind.HANG,
        exitcodes.COLLECTIVE_TIMEOUT: FailureKind.COLLECTIVE_TIMEOUT,
        exitcodes.STOPPED: FailureKind.STOPPED,
    }
    if exit_code in known:
        return known[exit_code]
    signum = -exit_code if exit_code < 0 else exit_code - 128 if exit_code > 128 else 0
    if signum == signal.SIGTERM:
        return FailureKind.STOPPED
    if signum:
        return FailureKind.KILLED
    return FailureKind.CRASH


_IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})


def classify_pod(phase: str, reason: str | None, exit_code: int | None, *, node_lost: bool = False,
                 disruption: bool = False) -> FailureKind | None:
    """Classify a pod from its status fields (phase, container waiting/terminated reason, exit code)."""
    if node_lost:
        return FailureKind.NODE_LOST
    if reason in _IMAGE_PULL_REASONS:
        return FailureKind.IMAGE_PULL
    if reason == "OOMKilled":
        return FailureKind.OOM
    if reason == "Evicted" or disruption:
        return FailureKind.EVICTED
    if reason == "Unschedulable":
        return FailureKind.UNSCHEDULABLE
    if exit_code is not None:
        return classify_exit(exit_code)
    if phase == "Failed":
        return FailureKind.CRASH
    return None
