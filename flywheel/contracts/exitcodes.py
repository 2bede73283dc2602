"""What a worker's exit code means. One table, shared by the trainer (which exits with these), `flywheel launch`
(which passes the first failing rank's code up), and `policy/` (which classifies on them).

| code | name               | meaning                                                        | retried |
|------|--------------------|----------------------------------------------------------------|---------|
| 0    | SUCCESS            | training finished                                              | -       |
| 1    | CRASH              | uncaught exception (Python's default)                          | yes     |
| 3    | USER_ERROR         | bad configuration or data that a restart cannot fix            | no      |
| 4    | HANG               | progress watchdog fired: no step within the timeout; stacks dumped | yes |
| 5    | COLLECTIVE_TIMEOUT | a collective timed out or was aborted (NCCL/gloo watchdog)     | yes     |
| 6    | STOPPED            | SIGTERM: emergency checkpoint taken (when possible), then exit | yes, no budget cost |
| 128+N / -N | SIGNAL       | killed by signal N (9: SIGKILL, e.g. OOM or injected fault)    | yes     |
"""

SUCCESS = 0
CRASH = 1
USER_ERROR = 3
HANG = 4
COLLECTIVE_TIMEOUT = 5
STOPPED = 6

NAMES = {SUCCESS: "success", CRASH: "crash", USER_ERROR: "user-error", HANG: "hang",
         COLLECTIVE_TIMEOUT: "collective-timeout", STOPPED: "stopped"}

# Failures that follow a peer's: a rank whose collective failed because another rank died. Its report names the
# consequence, not the cause, and waits briefly for the cause's (policy/rank_restarts.py).
FOLLOWS_A_PEER = (COLLECTIVE_TIMEOUT,)


def signal_number(code: int) -> int:
    """The signal a process died by, from its exit code (Popen's negative code or a shell's 128+N); 0: none."""
    return -code if code < 0 else code - 128 if code > 128 else 0


def shell_code(code: int) -> int:
    """An exit code as a shell reports it: Popen's negative code for a signal death N becomes 128+N."""
    return 128 - code if code < 0 else code


def is_crash(code: int) -> bool:
    """An uncaught exception or an unknown non-zero exit: no named code, no signal death."""
    return code != SUCCESS and (code == CRASH or code not in NAMES) and not signal_number(code)


def describe(code: int) -> str:
    """A short name for an exit code, including signal deaths (negative or 128+N)."""
    import signal

    if code in NAMES:
        return NAMES[code]
    signum = signal_number(code)
    if signum:
        try:
            return f"signal-{signal.Signals(signum).name}"
        except ValueError:
            return f"signal-{signum}"
    return f"exit-{code}"
