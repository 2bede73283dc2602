"""Stack dumps on request (flywheel/trainer/ft/stackdump.py) and the operator's side of it (request_dumps in
flywheel/operator/health_executor.py): the request file and the NCCL pipes, a stale request, SIGUSR1, and a real
two-rank gloo run whose rank 0 is stuck in a collective (its peer SIGSTOPped) dumping its stacks when asked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest

from flywheel.operator import health_executor
from flywheel.spec.timeouts import CollectiveTimeouts
from flywheel.trainer.distributed import collective_env
from flywheel.trainer.ft import stackdump

from . import workers


def wait_for(check, timeout: float, what: str, procs: list[subprocess.Popen[bytes]] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        assert not procs or all(p.poll() is None for p in procs), f"a process exited waiting for {what}"
        time.sleep(0.05)


def test_operator_and_trainer_agree_on_the_names(tmp_path: Path):
    assert health_executor.DEBUG_SUBDIR == stackdump.DEBUG_SUBDIR == collective_env.DEBUG_SUBDIR
    assert health_executor.STACK_REQUEST == stackdump.REQUEST_FILE
    timeouts = CollectiveTimeouts(timedelta(seconds=60), timedelta(seconds=10))
    pipe_prefix = collective_env.collective_env(tmp_path, timeouts)["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"]
    assert Path(pipe_prefix + "3.pipe").match(health_executor.NCCL_PIPES)  # torch appends "<rank>.pipe"


def test_request_dumps_writes_the_request_file_and_each_read_nccl_pipe(tmp_path: Path):
    assert health_executor.request_dumps(tmp_path / "missing") == health_executor.DumpRequest(0, None)
    assert not (tmp_path / "missing").exists()  # no rank ever ran there: nothing is created
    debug = tmp_path / ".debug"
    debug.mkdir()
    for rank in (0, 1):
        os.mkfifo(debug / f"nccl_pipe_rank_{rank}.pipe")
    (debug / "nccl_pipe_rank_2.pipe").write_text("not a pipe")
    reader = os.open(debug / "nccl_pipe_rank_0.pipe", os.O_RDONLY | os.O_NONBLOCK)  # rank 1's has no reader
    try:
        first = health_executor.request_dumps(debug, token="t1")
        assert first == health_executor.DumpRequest(1, debug / "dump-request")
        assert os.read(reader, 16) == b"1\n"
        assert (debug / "dump-request").read_text() == "t1\n"
        second = health_executor.request_dumps(debug)  # every request is a new token
        assert second.stack_request is not None and (debug / "dump-request").read_text().strip() not in ("", "t1")
    finally:
        os.close(reader)
    assert sorted(p.name for p in debug.iterdir()) == ["dump-request", "nccl_pipe_rank_0.pipe",
                                                        "nccl_pipe_rank_1.pipe", "nccl_pipe_rank_2.pipe"]


def test_a_new_request_dumps_every_thread_and_a_stale_one_does_not(tmp_path: Path):
    debug = tmp_path / ".debug"
    debug.mkdir()
    (debug / "dump-request").write_text("old\n")  # left by an earlier incarnation
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from flywheel.trainer.ft.stackdump import StackDumper
        dumper = StackDumper(Path({str(debug)!r}), "3", poll_seconds=0.05).start()
        def waiting_in_main():
            time.sleep(0.5)
            assert dumper.dumps == 0  # the stale token was not acted on
            Path({str(debug)!r}, "dump-request").write_text("new\\n")
            time.sleep(30)
        waiting_in_main()
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    try:
        stacks = debug / "stacks_rank_3.txt"
        wait_for(lambda: stacks.exists() and "waiting_in_main" in stacks.read_text(), 20, "the stacks file", [proc])
    finally:
        proc.kill()
        _, stderr = proc.communicate(10)
    text = stacks.read_text()
    assert text.startswith("flywheel stack dump requested (new): rank 3 pid ")
    assert text.count("flywheel stack dump") == 1 and "Thread 0x" in text
    assert "flywheel stack dump requested (new)" in stderr and "waiting_in_main" in stderr  # the log has it too


@pytest.mark.slow
def test_a_rank_stuck_in_a_gloo_collective_dumps_its_stacks_on_request(tmp_path: Path):
    """Rank 1 SIGSTOPs itself at step 3, so rank 0 waits in a gloo collective: what the health monitor calls a
    hang. request_dumps (the operator's call) makes rank 0 write its stacks; SIGUSR1 also dumps to its log."""
    doc = workers.job_spec(2, steps=400, progress_timeout=120)
    procs = workers.launch(2, doc, tmp_path, faults=[{"id": "h0", "kind": "hang", "rank": 1, "step": 3}])
    debug = tmp_path / "ckpt" / ".debug"
    try:
        wait_for(lambda: any(e["event"] == "fault" for e in workers.events(tmp_path)), 90, "the hang", procs[:1])
        time.sleep(0.5)  # rank 0 is in step 3's collective by now
        done = health_executor.request_dumps(debug)
        assert done.stack_request == debug / "dump-request" and done.nccl_pipes == 0  # gloo: no NCCL pipes
        stacks = debug / "stacks_rank_0.txt"
        wait_for(lambda: stacks.exists() and "most recent call first" in stacks.read_text(), 20, "rank 0's stacks",
                 procs[:1])
        log0 = tmp_path / "rank0.log"
        before = log0.read_text().count("most recent call first")
        procs[0].send_signal(signal.SIGUSR1)
        wait_for(lambda: log0.read_text().count("most recent call first") > before, 20, "the SIGUSR1 dump",
                 procs[:1])
        assert procs[0].poll() is None  # dumping does not end the rank
    finally:
        for p in procs:
            p.kill()
            p.wait(10)
    text = stacks.read_text()
    assert "flywheel stack dump requested" in text and "rank 0 pid" in text
    assert 'loop.py", line' in text and "in train" in text  # the main thread, inside the training loop
    assert not (debug / "stacks_rank_1.txt").exists()  # a stopped process cannot answer
    assert "flywheel stack dump requested" in (tmp_path / "rank0.log").read_text()
