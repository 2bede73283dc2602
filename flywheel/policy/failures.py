"""The failure taxonomy: what went wrong, from an exit code or a Kubernetes pod status (pure)."""

from __future__ import annotations

import signal
from enum import Enum

from flywheel.contracts import exitcodes


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
    CONFIG_ERROR = "ContainerConfigError"  # a Secret or ConfigMap the container needs is missing
    UNSCHEDULABLE = "Unschedulable"
    POD_DELETED = "PodDeleted"  # a current worker pod deleted by someone else (kubectl delete, a controller)


# Failures that are the job's own fault and would only fail again.
PERMANENT = frozenset({FailureKind.USER_ERROR, FailureKind.IMAGE_PULL, FailureKind.CONFIG_ERROR})
# Failures caused from outside the job: they do not spend the restart budget.
EXTERNAL = frozenset({FailureKind.STOPPED, FailureKind.EVICTED, FailureKind.NODE_LOST, FailureKind.POD_DELETED})


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
    if exitcodes.is_crash(exit_code):
        return FailureKind.CRASH
    return FailureKind.STOPPED if exitcodes.signal_number(exit_code) == signal.SIGTERM else FailureKind.KILLED


_IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})

# A container that cannot start leaves its pod Pending for ever (restartPolicy Never), so these container waiting
# reasons are failures of their own. An image name that does not parse, or an image that may never be pulled, fails
# on every retry: at once. A pull error may be a registry or network blip (the kubelet retries with a back-off of
# 10 s, 20 s, 40 s, ...), and a missing Secret or ConfigMap may be created yet: they fail once the container has
# waited a grace: the job's `faultTolerance.startFailureGraceSeconds`, by default START_FAILURE_GRACE_SECONDS
# (three pull attempts; the spec's default is the same 60 s).
START_FAILURE_GRACE_SECONDS = 60.0
START_FAILURES_AT_ONCE = {"InvalidImageName": FailureKind.IMAGE_PULL, "ErrImageNeverPull": FailureKind.IMAGE_PULL}
START_FAILURES_AFTER_GRACE = {"ErrImagePull": FailureKind.IMAGE_PULL, "ImagePullBackOff": FailureKind.IMAGE_PULL,
                              "CreateContainerConfigError": FailureKind.CONFIG_ERROR}


def classify_waiting(reason: str | None, waiting_seconds: float,
                     grace_seconds: float = START_FAILURE_GRACE_SECONDS) -> FailureKind | None:
    """A container that has been waiting `waiting_seconds` with this waiting reason: a failure, or None while it
    may still start (any other reason, e.g. ContainerCreating, or a retryable one within `grace_seconds`)."""
    if reason in START_FAILURES_AT_ONCE:
        return START_FAILURES_AT_ONCE[reason]
    if reason in START_FAILURES_AFTER_GRACE and waiting_seconds >= grace_seconds:
        return START_FAILURES_AFTER_GRACE[reason]
    return None


def classify_pod(phase: str, reason: str | None, exit_code: int | None, *, node_lost: bool = False,
                 disruption: bool = False, init_container: bool = False) -> FailureKind | None:
    """Classify a pod from its status fields (phase, container waiting/terminated reason, exit code). `disruption`:
    the pod has a True `DisruptionTarget` condition (preempted, evicted through the API or by the kubelet, deleted
    by the taint manager or the pod GC): an external failure, whatever the exit code its SIGTERM or SIGKILL left.
    `init_container`: the code is an init container's (the template's), its program's own, not the trainer's
    exit codes (3 user error, 4 hang...): any exit but a signal's is a crash."""
    if node_lost:
        return FailureKind.NODE_LOST
    if reason in _IMAGE_PULL_REASONS:
        return FailureKind.IMAGE_PULL
    if reason == "CreateContainerConfigError":
        return FailureKind.CONFIG_ERROR
    if reason == "OOMKilled":
        return FailureKind.OOM
    if reason == "Evicted" or disruption:
        return FailureKind.EVICTED
    if reason == "Unschedulable":
        return FailureKind.UNSCHEDULABLE
    if exit_code is not None and init_container and not exitcodes.signal_number(exit_code):
        return FailureKind.CRASH
    if exit_code is not None:
        return classify_exit(exit_code)
    if phase == "Failed":
        return FailureKind.CRASH
    return None
