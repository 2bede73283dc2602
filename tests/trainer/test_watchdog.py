import os
import signal
import subprocess
import sys
import textwrap
import time

from flywheel.contracts import exitcodes
from tests.rank_processes import alive


def run_snippet(code: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


def test_stalled_loop_dumps_stacks_reports_and_exits_hang(tmp_path):
    marker = tmp_path / "hang.txt"
    result = run_snippet(f"""
        import time
        from flywheel.trainer.ft.watchdog import ProgressWatchdog
        def on_hang(seconds):
            open({str(marker)!r}, "w").write(str(seconds))
        dog = ProgressWatchdog(timeout_s=0.4, first_step_timeout_s=5, on_hang=on_hang).start()
        for _ in range(5):  # steady progress keeps it quiet
            time.sleep(0.1)
            dog.beat()
        def stuck_in_a_collective():
            time.sleep(30)
        stuck_in_a_collective()
    """)
    assert result.returncode == exitcodes.HANG
    assert float(marker.read_text()) >= 0.4
    assert "stuck_in_a_collective" in result.stderr  # the main thread's stack was dumped
    assert "no progress" in result.stderr


def test_first_step_gets_its_own_allowance():
    started = time.monotonic()
    result = run_snippet("""
        import time
        from flywheel.trainer.ft.watchdog import ProgressWatchdog
        dog = ProgressWatchdog(timeout_s=0.2, first_step_timeout_s=1.5, on_hang=lambda s: print("hang", s)).start()
        time.sleep(30)
    """)
    assert result.returncode == exitcodes.HANG and "first step" in result.stderr
    assert time.monotonic() - started >= 1.5


def test_disabled_watchdog_never_fires():
    result = run_snippet("""
        import time
        from flywheel.trainer.ft.watchdog import ProgressWatchdog
        ProgressWatchdog(timeout_s=0, first_step_timeout_s=1, on_hang=lambda s: None).start()
        time.sleep(1.5)
    """)
    assert result.returncode == 0


def test_orphaned_rank_exits_when_its_parent_dies(tmp_path):
    pid_file = tmp_path / "child.pid"
    child_script = tmp_path / "child.py"
    child_script.write_text(textwrap.dedent(f"""
        import os, time
        from flywheel.trainer.ft.watchdog import ProgressWatchdog
        ProgressWatchdog(timeout_s=0, first_step_timeout_s=1, on_hang=lambda s: None).start()
        open({str(pid_file)!r} + ".tmp", "w").write(str(os.getpid()))
        os.replace({str(pid_file)!r} + ".tmp", {str(pid_file)!r})  # seen only when complete
        time.sleep(60)
    """))
    # The middle process (the "agent") starts a rank, then dies without waiting for it.
    middle = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, subprocess, sys, time
        subprocess.Popen([sys.executable, {str(child_script)!r}], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
        while not os.path.exists({str(pid_file)!r}):
            time.sleep(0.05)
    """)], timeout=30)
    assert middle.returncode == 0
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(child):
        time.sleep(0.1)
    left = alive(child)
    if left:
        os.kill(child, signal.SIGKILL)
    assert not left
