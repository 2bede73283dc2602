"""A rank ends through exit_rank: its code kept, what it printed not lost (a piped stdout is block-buffered, and
os._exit alone would drop it), and no interpreter shutdown (atexit handlers do not run)."""

from __future__ import annotations

import subprocess
import sys

from tests.parallel.harness import REPO


def test_exit_rank_keeps_the_code_and_the_buffered_output_and_skips_shutdown():
    script = ("import atexit, sys\n"
              "from flywheel.trainer.ft.process_exit import exit_rank\n"
              "atexit.register(lambda: print('shutdown ran'))\n"
              "print('step 10 done')\n"
              "print('a warning', file=sys.stderr)\n"
              "exit_rank(3)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert done.stdout == "step 10 done\n"
    assert done.stderr == "a warning\n"
