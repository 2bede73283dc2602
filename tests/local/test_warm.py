"""Warm rank starts (flywheel/agent/warm.py): a rank forked by the zygote behaves like `python -m MODULE` run cold
for the agent: its env, cwd, args and streams, its exit status (codes and signal deaths), SIGTERM, and death with
its client or its agent."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import PYTHON, SCRIPTS, alive

from flywheel.agent import warm, warm_entry
from flywheel.agent.launch import RANK_HOOK_DIR

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork + /proc")


# An agent with one thread (as `flywheel launch` is when it starts its zygote): the zygote is forked from it.
FORKING_AGENT = ("import json, sys\nfrom flywheel.agent import warm\n"
                 "with warm.zygote(preload=('json',)) as env:\n    print(json.dumps(env), flush=True)\n"
                 "    sys.stdin.read()\n")


@pytest.fixture(params=["forked", "spawned"])
def zygote(request, monkeypatch):
    """Both ways a zygote starts: forked from a single-threaded agent, or a new interpreter (in a given env, or
    from a process with other threads)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SCRIPTS), os.environ.get("PYTHONPATH", "")]))
    if request.param == "spawned":
        with warm.zygote(preload=("json",), env=dict(os.environ)) as env:
            assert Path(f"/proc/{env[warm.PID_ENV]}/comm").read_text().strip() != "fw-zygote"
            yield env
        return
    agent = subprocess.Popen([PYTHON, "-c", FORKING_AGENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        env = json.loads(agent.stdout.readline())
        deadline = time.monotonic() + 30
        while not Path(env[warm.SOCKET_ENV]).exists() and time.monotonic() < deadline:  # the zygote is ready
            time.sleep(0.01)
        assert Path(f"/proc/{env[warm.PID_ENV]}/comm").read_text().strip() == "fw-zygote"  # forked, and named
        yield env
    finally:
        agent.stdin.close()
        agent.wait(10)


def client(env: dict[str, str], cwd: Path, *args: str, **extra: str) -> subprocess.Popen:
    full = {**os.environ, **env, "RANK": "3", **extra}
    return subprocess.Popen([*warm.client_command("warm_target"), *args], env=full, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def target_pid(proc: subprocess.Popen) -> int:
    line = proc.stdout.readline()
    assert line.startswith("target pid="), line
    return int(line.split()[1].split("=")[1])


def test_the_rank_gets_the_clients_env_cwd_args_and_stdout(zygote, tmp_path):
    proc = client(zygote, tmp_path, "--lr", "1", CODE="0")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert f"rank=3 cwd={tmp_path} argv=['--lr', '1']" in out


@pytest.mark.parametrize("extra, expected", [
    ({"CODE": "5"}, 5),
    ({"CODE": "3"}, 3),
    ({"MODE": "kill"}, -signal.SIGKILL),  # the agent sees the same signal death as for a cold rank
    ({"MODE": "raise"}, 1),
])
def test_exit_status_is_the_ranks(zygote, tmp_path, extra, expected):
    proc = client(zygote, tmp_path, **extra)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == expected, out
    if extra.get("MODE") == "raise":
        assert "RuntimeError: boom" in out


def test_sigterm_reaches_the_rank(zygote, tmp_path):
    proc = client(zygote, tmp_path, MODE="term")
    pid = target_pid(proc)
    assert pid != proc.pid
    time.sleep(0.3)  # the target installs its handler after printing
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 6
    assert "got SIGTERM" in proc.stdout.read()


def test_the_rank_dies_with_its_client(zygote, tmp_path):
    proc = client(zygote, tmp_path, MODE="sleep")
    pid = target_pid(proc)
    proc.kill()  # what the agent does once the grace is over
    proc.wait()
    deadline = time.monotonic() + 5
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)


def test_ranks_die_with_the_zygote_and_the_zygote_with_its_agent(tmp_path):
    """The agent (here a middle process) is SIGKILLed: its zygote and the rank forked by it go too."""
    script = (
        "import os, subprocess, sys, time\n"
        "from flywheel.agent import warm\n"
        "with warm.zygote(preload=()) as env:\n"
        "    p = subprocess.Popen([*warm.client_command('warm_target')], env={**os.environ, **env, 'MODE': 'sleep'})\n"
        "    time.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPTS), os.environ.get("PYTHONPATH", "")])}
    agent = subprocess.Popen([PYTHON, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    pid = target_pid(agent)
    from flywheel.local.procs import descendants

    below = descendants(agent.pid)
    assert pid in below
    agent.kill()
    agent.wait()
    deadline = time.monotonic() + 5
    while [p for p in below if alive(p)] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in below if alive(p)] == []


def test_without_a_zygote_the_module_runs_cold(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(SCRIPTS), os.environ.get("PYTHONPATH", "")]))
    gone = {warm.SOCKET_ENV: str(tmp_path / "none.sock"), warm.PID_ENV: "999999999"}
    proc = client(gone, tmp_path, CODE="7")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 7 and "target pid=" in out
    assert f"pid={proc.pid}" in out  # exec'd in place: the client itself is the rank


def test_a_zygote_whose_agent_is_already_gone_exits_at_once(tmp_path):
    """The agent died before the zygote started (the zygote was re-parented): it must not serve on as an orphan."""
    gone = subprocess.Popen([PYTHON, "-c", "pass"])
    gone.wait()
    zygote = subprocess.Popen([PYTHON, "-m", "flywheel.agent.warm", "serve", "--socket", str(tmp_path / "z.sock"),
                               "--parent", str(gone.pid)])
    assert zygote.wait(timeout=30) == 128 + signal.SIGKILL
    assert not (tmp_path / "z.sock").exists()


def test_a_users_script_runs_in_a_forked_rank_as_python_script_py_would_run_it(tmp_path):
    """Its imports of other packages ran once in the zygote (the rank finds them imported, by the zygote's pid);
    its argv (its first item absolute), __file__ and import path are a script's; an uncaught exception goes through
    the interpreter's hook (a user command's writes the termination message) and exits 1; without a zygote the
    client execs the script cold."""
    lib, work = tmp_path / "lib", tmp_path / "work"
    lib.mkdir(), work.mkdir()
    (lib / "heavy_dep.py").write_text("import os\nIMPORTED_IN = os.getpid()\n")
    (work / "own_helper.py").write_text("")
    (work / "train.py").write_text(
        "import os, sys\nimport heavy_dep\nimport own_helper\n"
        "print(f'script pid={os.getpid()} dep_pid={heavy_dep.IMPORTED_IN} file={__file__} path0={sys.path[0]} '\n"
        "      f'argv={sys.argv} main={__name__}', flush=True)\n"
        "if os.environ.get('MODE') == 'raise':\n    raise ValueError('bad batch')\n")
    entry = warm_entry.PythonEntry("train.py", None, ())
    code = warm_entry.preload_code(entry, str(work))
    assert code.splitlines() == ["import os, sys", "import heavy_dep"]
    # As flywheel launch gives a user command's zygote: the exception hook (rank_hook) on the path.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([RANK_HOOK_DIR, str(lib), os.environ.get("PYTHONPATH", "")])}
    with warm.zygote(preload=(), env=env, preload_code=code) as zygote_env:
        def run(**extra: str) -> tuple[int, str]:
            proc = subprocess.Popen([*warm.client_command_for(entry.target), "--lr", "1"], cwd=work,
                                    env={**env, **zygote_env, "RANK": "1", **extra}, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
            out, _ = proc.communicate(timeout=60)
            return proc.returncode, out

        code_, out = run()
        assert code_ == 0, out
        assert f"dep_pid={zygote_env[warm.PID_ENV]} " in out  # imported before the fork, once
        assert f"file={work}/train.py path0={work} argv=['{work}/train.py', '--lr', '1'] main=__main__" in out, out
        code_, out = run(MODE="raise", FLYWHEEL_TERMINATION_LOG=str(tmp_path / "termination"))
        assert code_ == 1 and "ValueError: bad batch" in out, out
        assert "ValueError: bad batch" in (tmp_path / "termination").read_text()
    # Cold (no zygote): the same script, exec'd by the client.
    gone = {warm.SOCKET_ENV: str(tmp_path / "none.sock"), warm.PID_ENV: "999999999"}
    proc = subprocess.run([*warm.client_command_for(entry.target)], cwd=work, env={**env, **gone},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and f"file={work}/train.py path0={work} argv=['train.py']" in proc.stdout, \
        proc.stdout + proc.stderr


def test_a_zygote_an_import_left_with_cuda_initialised_sends_every_rank_cold(tmp_path, monkeypatch):
    """A CUDA context made before fork is unusable in the child: such a zygote forks nothing."""
    monkeypatch.setattr(warm, "_unsafe_to_fork", lambda: "an import initialised CUDA in the zygote")
    zygote = warm.Zygote(tmp_path / "z.sock", os.getpid(), warm._unsafe_to_fork())
    assert zygote.refuse


def test_a_zygote_that_does_not_answer_leaves_the_rank_to_start_cold(tmp_path):
    """A zygote stopped (or stuck) after accepting: the client stops waiting for its answer and execs the rank."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "z.sock"))
    listener.listen(4)  # accepts at the kernel's level; nobody answers
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SCRIPTS), os.environ.get("PYTHONPATH", "")]),
           warm.SOCKET_ENV: str(tmp_path / "z.sock"), warm.PID_ENV: str(os.getpid()), "CODE": "4"}
    code = "from flywheel.agent import warm\nwarm.ANSWER_TIMEOUT_S = 1\nwarm.run({'module': 'warm_target'}, [])\n"
    proc = subprocess.Popen([PYTHON, "-c", code], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.wait(timeout=60) == 4
    listener.close()  # its queued connection holds the streams the client passed (until then no EOF)
    out, err = proc.communicate(timeout=10)
    assert "the zygote did not start the rank (no answer); starting it cold" in err
    assert f"target pid={proc.pid} " in out  # the rank ran, exec'd in the client
