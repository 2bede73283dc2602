"""Warm rank starts: a pre-imported interpreter (the "zygote") forks each rank of the embedded trainer, or of a
user's Python script or module (its own import statements run in the zygote first: warm_entry.py).

A cold rank start imports torch and the trainer again: seconds per rank (3-10 s on the 2-core CI machine with four
ranks starting at once; CUDA libraries add more on a GPU node), paid again on every restart. `flywheel launch` starts
one zygote per worker before its first rendezvous; the zygote imports the trainer once and forks a rank per request
in milliseconds. torch's elastic agent still starts, watches, signals and restarts each rank as a plain subprocess:
that subprocess is a small client (`python -m flywheel.agent.warm run MODULE`) that hands its environment,
working directory and standard streams to the zygote, forwards signals to the forked rank and exits with the rank's
status. Exit codes, the agent's grace and kill paths, and the policy's classification are therefore unchanged.

Lifetimes: the zygote dies with its agent (PR_SET_PDEATHSIG) and every forked rank with the zygote; a rank whose
client is gone (the agent SIGKILLed it after its grace) is SIGKILLed by the zygote. A client that finds no live
zygote execs the module cold, as `python -m MODULE` would run it.

Fork safety: the zygote only imports (no threads, no CUDA context: importing torch initialises neither) and forks
from its single thread. The forked rank gets the client's environment through os.environ (putenv), so settings
read when a collective or the process group is created apply; anything a module reads from the environment at
import time is read in the zygote, which has the agent's environment.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import json
import logging
import os
import runpy
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

SOCKET_ENV = "FLYWHEEL_WARM_SOCKET"
PID_ENV = "FLYWHEEL_WARM_PID"
READY_TIMEOUT_S = 300.0  # a zygote still importing is waited for: it finishes sooner than a cold start would
ANSWER_TIMEOUT_S = 30.0  # a ready zygote answers a request in milliseconds (a fork)
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
_PR_SET_NAME, _PR_SET_PDEATHSIG = 15, 1
_HEADER = struct.Struct("!I")


def _prctl(option: int, value: int | bytes) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when `parent` exits (and at once if it already has)."""
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            raise ConnectionError("client closed the connection mid-request")
        data += chunk
    return data


def _run_main(request: dict[str, Any]) -> None:
    """Run the request's module (`python -m`) or script (`python script.py`) as __main__, with the argv and import
    path that interpreter start would give it."""
    if "script" in request:
        script = os.path.abspath(request["script"])  # __file__ is absolute, as python gives its __main__
        sys.argv = [script, *request["args"]]
        sys.path[0] = os.path.dirname(script)  # the script's folder, not the cwd
        runpy.run_path(script, run_name="__main__")
    else:
        sys.argv = [request["module"], *request["args"]]
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


def _unsafe_to_fork() -> str:
    """Why a preload left this process unfit to fork ranks from, or "": a CUDA context made here is unusable in a
    forked child (a user entry's import that initialised CUDA)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "an import initialised CUDA in the zygote"
    return ""


def _preload(modules: list[str], code: str) -> None:
    """Import `modules` (the trainer's: they must import) and run `code`, a user entry's import statements one by
    one, best effort: one that fails here fails again in the rank, with the rank's own report."""
    for module in modules:
        importlib.import_module(module)
    # torch.cuda.is_available() from an import asks NVML rather than creating a CUDA context (unusable after fork).
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    for statement in filter(None, code.split("\n")):
        try:
            exec(compile(statement, "<flywheel warm preload>", "exec"), {})  # the entry's own import statements
        except Exception:  # noqa: BLE001 - see above
            continue


# --- the zygote ------------------------------------------------------------------------------------------------------

class Zygote:
    """Accepts requests on a Unix socket and forks one child per request (single-threaded: selectors + WNOHANG)."""

    def __init__(self, path: Path, parent: int, refuse: str = "") -> None:
        self.path, self.parent, self.pid = path, parent, os.getpid()
        self.refuse = refuse  # why no rank can be forked from here: each client is told to start cold
        self.children: dict[int, socket.socket] = {}  # pid -> its client's connection
        self.selector = selectors.DefaultSelector()

    def serve(self) -> int:
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(tmp))
        self.listener.listen(64)
        os.replace(tmp, self.path)  # clients wait for the path: it appears only once the zygote is ready
        self.selector.register(self.listener, selectors.EVENT_READ)
        while os.getppid() == self.parent:
            for key, _ in self.selector.select(timeout=0.05):
                if key.fileobj is self.listener:
                    self._accept()
                elif isinstance(key.fileobj, socket.socket):  # a rank's connection
                    self._client_readable(key.fileobj, key.data)
            self._reap()
        return 0

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(10)
        try:
            _, fds, _, _ = socket.recv_fds(conn, 1, 3)
            request = json.loads(_recv_exact(conn, _HEADER.unpack(_recv_exact(conn, _HEADER.size))[0]))
        except (OSError, ValueError) as err:
            print(f"flywheel warm: bad request: {err}", file=sys.stderr, flush=True)
            conn.close()
            return
        if self.refuse:
            for fd in fds:
                os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(f"cold {self.refuse}\n".encode())
            conn.close()
            return
        pid = os.fork()
        if pid == 0:
            self._become_rank(conn, fds, request)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        conn.sendall(f"pid {pid}\n".encode())
        conn.setblocking(False)
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def _become_rank(self, conn: socket.socket, fds: list[int], request: dict[str, Any]) -> NoReturn:
        code = 1
        try:
            self.selector.close()
            self.listener.close()
            for other in self.children.values():
                other.close()
            conn.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            for sig in (*FORWARDED_SIGNALS, signal.SIGCHLD):
                signal.signal(sig, signal.SIG_DFL)
            die_with_parent(self.pid)
            os.environ.clear()
            os.environ.update(request["env"])
            os.chdir(request["cwd"])
            _prctl(_PR_SET_NAME, f"fw-rank-{request['env'].get('RANK', '?')}".encode()[:15])
            _run_main(request)
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        except BaseException:  # noqa: BLE001 - the rank's own crash: report it as python would
            # The interpreter's hook, as an uncaught exception meets it (a user command's: rank_hook writes the
            # termination message first).
            sys.excepthook(*sys.exc_info())
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)

    def _client_readable(self, conn: socket.socket, pid: int) -> None:
        try:
            data = conn.recv(64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the client is gone (SIGKILLed by its agent): its rank must not outlive it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.selector.unregister(conn)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(conn)
            verdict = (f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status)
                       else f"exit {os.waitstatus_to_exitcode(status)}")
            with contextlib.suppress(OSError):
                conn.setblocking(True)
                conn.sendall(f"{verdict}\n".encode())
            conn.close()


def serve(path: Path, preload: list[str], parent: int, preload_code: str = "") -> int:
    # The agent's pid comes from the agent: read here, an agent that died during our start-up would already
    # have been replaced by init, and the zygote would outlive it.
    die_with_parent(parent)
    # Signals are for the ranks (their clients forward them); the zygote ends with its agent or its socket.
    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    _preload(preload, preload_code)
    try:
        return Zygote(path, parent, _unsafe_to_fork()).serve()
    finally:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def zygote(preload: tuple[str, ...], env: dict[str, str] | None = None, folder: Path | None = None,
           preload_code: str = "") -> Iterator[dict[str, str]]:
    """Start a zygote for this agent (in `env`, this process's by default: what the preloaded modules read at import
    time); yields the env its rank clients need. Killed on exit (its forked ranks die with it). Its socket is in
    `folder` (the agent's own, workdir.py), else in a temporary folder of its own.

    In this process's env and with this process single-threaded (the agent: torch imported, nothing started yet),
    the zygote is forked from it and keeps what it imported (torch: ~1 s of CPU and its memory per pod, shared
    copy-on-write); else it is a new interpreter."""
    with contextlib.ExitStack() as stack:
        tmp = folder or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="flywheel-warm-")))
        path = tmp / "zygote.sock"
        if env is None and _single_threaded():
            pid, spawned = _fork_zygote(path, preload, preload_code), None
        else:
            spawned = _spawn_zygote(path, preload, env, preload_code)
            pid = spawned.pid
        try:
            yield {SOCKET_ENV: str(path), PID_ENV: str(pid)}
        finally:
            if spawned is not None:
                spawned.kill()
                spawned.wait()
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)


def _single_threaded() -> bool:
    """Safe to fork: no other thread (Python's or a native library's) whose locks the child would inherit held."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:  # not Linux
        return False


def _spawn_zygote(path: Path, preload: tuple[str, ...], env: dict[str, str] | None,
                  preload_code: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", __name__, "serve", "--socket", str(path), "--parent", str(os.getpid()),
            "--preload-code", preload_code]
    for module in preload:
        argv += ["--preload", module]
    # Its own session: a SIGTERM to the worker's process group is the agent's to pass on, not the zygote's.
    return subprocess.Popen(argv, start_new_session=True, env=env)


def _fork_zygote(path: Path, preload: tuple[str, ...], preload_code: str) -> int:
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):  # buffered now: the agent's to write
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()  # as the spawned zygote: its own session
        _prctl(_PR_SET_NAME, b"fw-zygote")
        # The agent's logging set-up is not the ranks': each configures its own, as in a new interpreter.
        root = logging.getLogger()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.setLevel(logging.WARNING)
        # The interpreter's own streams on fds 0-2 (a rank dup2s its client's onto them), not a replacement the
        # parent installed (pytest's capture, a redirect).
        sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
        # The import path `python -m` would start with in this env: the cwd, PYTHONPATH, then the rest (site).
        front = [os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        sys.path[:] = front + [entry for entry in sys.path[1:] if entry not in front]
        code = serve(path, list(preload), parent, preload_code)
    except BaseException:  # noqa: BLE001 - report it as the spawned zygote would, never return into the agent
        import traceback

        traceback.print_exc()
    finally:
        os._exit(code)


def client_command(module: str) -> tuple[str, ...]:
    """What the agent starts per rank instead of `python -m module`."""
    return (sys.executable, "-m", __name__, "run", module)


def client_command_for(target: dict[str, str]) -> tuple[str, ...]:
    """What the agent starts per rank instead of `python -m module` ({"module": ...}) or `python script.py`
    ({"script": ...}); the entry's arguments follow."""
    if "script" in target:
        return (sys.executable, "-m", __name__, "run-script", target["script"])
    return client_command(target["module"])


# --- the client (what torch's agent starts as a rank) ----------------------------------------------------------------

def _connect(path: str, zygote_pid: int) -> socket.socket | None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            os.kill(zygote_pid, 0)
        except (ProcessLookupError, PermissionError):
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            time.sleep(0.02)
    return None


def _run_cold(target: dict[str, str], args: list[str]) -> NoReturn:
    head = ["-m", target["module"]] if "module" in target else [target["script"]]
    os.execv(sys.executable, [sys.executable, *head, *args])


def run(target: dict[str, str], args: list[str]) -> None:
    """Run `python -m module args` ({"module": ...}) or `python script.py args` ({"script": ...}) in a rank forked
    by this worker's zygote; never returns."""
    path, zygote_pid = os.environ.get(SOCKET_ENV), int(os.environ.get(PID_ENV) or 0)
    sock = _connect(path, zygote_pid) if path and zygote_pid else None
    if sock is None:
        _run_cold(target, args)
    body = json.dumps({**target, "args": args, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(sock, [b"R"], [0, 1, 2])
    sock.sendall(_HEADER.pack(len(body)) + body)
    reader = sock.makefile("r")
    # A zygote that accepted but does not answer (stopped, or stuck) must not hold the rank's start: it goes cold.
    # Should that zygote go on later, it sees this client gone and kills what it forked for it.
    sock.settimeout(ANSWER_TIMEOUT_S)
    try:
        first = reader.readline().split()
    except OSError:
        first = []
    sock.settimeout(None)
    if len(first) < 2 or first[0] != "pid":
        why = " ".join(first[1:]) if first[:1] == ["cold"] else "no answer"
        print(f"flywheel warm: the zygote did not start the rank ({why}); starting it cold", file=sys.stderr,
              flush=True)
        _run_cold(target, args)
    child = int(first[1])

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signum)

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    verdict = reader.readline().split()
    if len(verdict) == 2 and verdict[0] == "exit":
        os._exit(int(verdict[1]))
    signum = int(verdict[1]) if len(verdict) == 2 and verdict[0] == "signal" else int(signal.SIGKILL)
    # Die the way the rank died, so the agent sees the same (negative) status as for a cold rank.
    with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
        signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flywheel.agent.warm", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    serve_p = sub.add_parser("serve", help="run a zygote (started by flywheel launch)")
    serve_p.add_argument("--socket", type=Path, required=True)
    serve_p.add_argument("--preload", action="append", default=[])
    serve_p.add_argument("--preload-code", default="", help="import statements to run first, one a line")
    serve_p.add_argument("--parent", type=int, required=True, help="the agent's pid: the zygote dies with it")
    run_p = sub.add_parser("run", help="run MODULE in a forked rank (what the agent starts)")
    run_p.add_argument("module")
    run_p.add_argument("args", nargs=argparse.REMAINDER)
    script_p = sub.add_parser("run-script", help="run SCRIPT in a forked rank")
    script_p.add_argument("script")
    script_p.add_argument("args", nargs=argparse.REMAINDER)
    ns = parser.parse_args(argv)
    if ns.cmd == "serve":
        return serve(ns.socket, ns.preload, ns.parent, ns.preload_code)
    run({"script": ns.script} if ns.cmd == "run-script" else {"module": ns.module}, ns.args)
    return 1  # unreachable: run() execs or exits


if __name__ == "__main__":
    sys.exit(main())
