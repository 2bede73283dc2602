"""Test rank: appends "RANK RESTART" to $EXIT_RANK_LOG, then rank $EXIT_RANK_WHICH exits $EXIT_RANK_CODE while the
others wait to be stopped (a negative code: die by that signal); with EXIT_RANK_ONCE=1 only the first attempt
fails (later attempts exit 0). EXIT_RANK_RAISE: raise RuntimeError(it) instead (exit 1, its reason in the
termination log); EXIT_RANK_STEP=1: report a first step before failing."""

import os
import sys
import time

rank = int(os.environ["RANK"])
restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
with open(os.environ["EXIT_RANK_LOG"], "a") as log:
    log.write(f"{rank} {restart}\n")
if os.environ.get("EXIT_RANK_ONCE") == "1" and restart > 0:
    sys.exit(0)
if rank == int(os.environ.get("EXIT_RANK_WHICH", "0")):
    time.sleep(0.5)
    if os.environ.get("EXIT_RANK_STEP") == "1":
        from flywheel.agent import first_step

        first_step.mark()
    if os.environ.get("EXIT_RANK_RAISE"):
        raise RuntimeError(os.environ["EXIT_RANK_RAISE"])
    code = int(os.environ["EXIT_RANK_CODE"])
    if code < 0:
        os.kill(os.getpid(), -code)  # die by that signal, like an OOM kill or an injected fault
    sys.exit(code)
time.sleep(60)
