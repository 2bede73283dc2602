"""`flywheel run`'s own process starts its workers before it imports what only the end-of-run report needs."""

from __future__ import annotations

import subprocess
import sys


def test_the_local_runner_imports_neither_matplotlib_nor_torch() -> None:
    code = ("import sys, flywheel.cli, flywheel.local.runner; "
            "print(sorted(m for m in ('matplotlib', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout
