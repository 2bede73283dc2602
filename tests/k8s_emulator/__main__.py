"""`python -m tests.k8s_emulator up|down|status|fault|serve` — run the test cluster in the background for kubectl,
the operator and people.

  up     --kubeconfig PATH [--nodes N] [--no-etcd] [--port P] [--work-dir DIR] [--node-grace SECONDS] [--gpus N]
         (the API, the kubelet and a real etcd; --no-etcd leaves etcd out; --gpus N: N fake GPUs per node,
         tainted nvidia.com/gpu:NoSchedule)
  down   --kubeconfig PATH
  status --kubeconfig PATH
  fault  --kubeconfig PATH ACTION [key=value ...]   e.g. lose-node node=node-1, drop-watches, pause seconds=2
  serve  (what `up` starts: the cluster in the foreground until SIGTERM)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from tests.k8s_emulator.nodes import NodeSetup
from tests.k8s_emulator.runtime import ETCD_BINARY, EmulatedCluster, write_kubeconfig

GPU = "nvidia.com/gpu"

REPO_ROOT = Path(__file__).resolve().parents[2]


def state_path(kubeconfig: Path) -> Path:
    return kubeconfig.with_name(kubeconfig.name + ".state.json")


def _read_state(kubeconfig: Path) -> dict[str, Any] | None:
    path = state_path(kubeconfig)
    return json.loads(path.read_text()) if path.exists() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _serve(args: argparse.Namespace) -> None:
    kubeconfig = Path(args.kubeconfig).resolve()
    gpu = NodeSetup(resources={GPU: str(args.gpus)}, taints=[{"key": GPU, "effect": "NoSchedule"}])
    cluster = EmulatedCluster(Path(args.work_dir), nodes=args.nodes, port=args.port, etcd=args.etcd,
                              node_monitor_grace_seconds=args.node_grace,
                              node_setup={f"node-{i}": gpu for i in range(1, args.nodes + 1)} if args.gpus else None)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await cluster.start()
    try:
        write_kubeconfig(kubeconfig, cluster.api_url)
        state = {"pid": os.getpid(), "api_url": cluster.api_url, "etcd_url": cluster.etcd_url,
                 "kubeconfig": str(kubeconfig), "work_dir": str(cluster.work_dir),
                 "pod_logs": str(cluster.log_dir), "owns_work_dir": args.owns_work_dir,
                 "nodes": [f"node-{i}" for i in range(1, args.nodes + 1)]}
        temp = state_path(kubeconfig).with_suffix(".tmp")
        temp.write_text(json.dumps(state, indent=2))
        temp.replace(state_path(kubeconfig))  # `up` waits for this file: write it whole
        print(f"test cluster serving {cluster.api_url}", flush=True)
        await stop.wait()
    finally:
        await cluster.stop()
        state_path(kubeconfig).unlink(missing_ok=True)


def _up(args: argparse.Namespace) -> int:
    kubeconfig = Path(args.kubeconfig).resolve()
    existing = _read_state(kubeconfig)
    if existing and _alive(existing["pid"]):
        print(f"already up: {existing['api_url']} (pid {existing['pid']})")
        return 0
    if args.etcd and not Path(ETCD_BINARY).exists():
        print(f"{ETCD_BINARY} is missing: install it (scripts/install-tools.sh) or pass --no-etcd", file=sys.stderr)
        return 1
    owns = args.work_dir is None
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="flywheel-cluster-")).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    log_path = work_dir / "cluster.log"
    command = [sys.executable, "-m", "tests.k8s_emulator", "serve", "--kubeconfig", str(kubeconfig), "--nodes",
               str(args.nodes), "--port", str(args.port), "--work-dir", str(work_dir),
               "--node-grace", str(args.node_grace), "--gpus", str(args.gpus),
               "--etcd" if args.etcd else "--no-etcd"] + (
               ["--owns-work-dir"] if owns else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        state = _read_state(kubeconfig)
        if state and state["pid"] == process.pid:
            print(f"API:        {state['api_url']}\nkubeconfig: {kubeconfig}\nnodes:      {', '.join(state['nodes'])}")
            if state["etcd_url"]:
                print(f"etcd:       {state['etcd_url']}")
            print(f"pod logs:   {state['pod_logs']}\nserver log: {log_path}")
            return 0
        if process.poll() is not None:
            print(f"test cluster failed to start (exit {process.returncode}):\n{log_path.read_text()[-4000:]}",
                  file=sys.stderr)
            return 1
        time.sleep(0.1)
    process.kill()
    print(f"test cluster did not come up within 60 s; see {log_path}", file=sys.stderr)
    return 1


def _down(args: argparse.Namespace) -> int:
    kubeconfig = Path(args.kubeconfig).resolve()
    state = _read_state(kubeconfig)
    if state is None:
        print("not up (no state file)")
        return 0
    pid = state["pid"]
    if _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    state_path(kubeconfig).unlink(missing_ok=True)
    kubeconfig.unlink(missing_ok=True)
    if state.get("owns_work_dir"):
        shutil.rmtree(state["work_dir"], ignore_errors=True)
    print(f"test cluster at {state['api_url']} stopped")
    return 0


def _status(args: argparse.Namespace) -> int:
    state = _read_state(Path(args.kubeconfig).resolve())
    if state is None or not _alive(state["pid"]):
        print("down")
        return 1
    print(json.dumps(state, indent=2))
    return 0


def _fault(args: argparse.Namespace) -> int:
    state = _read_state(Path(args.kubeconfig).resolve())
    if state is None:
        print("not up", file=sys.stderr)
        return 1
    params = dict(item.split("=", 1) for item in args.params)
    url = f"{state['api_url']}/_flywheel/{args.action}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30) as response:
        print(response.read().decode())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.k8s_emulator", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "serve"):
        sub = commands.add_parser(name)
        sub.add_argument("--kubeconfig", required=True)
        sub.add_argument("--nodes", type=int, default=2)
        sub.add_argument("--etcd", action=argparse.BooleanOptionalAction, default=True,
                         help=f"start a real etcd ({ETCD_BINARY}) for the workers' rendezvous (default); --no-etcd: "
                              "only the API and the kubelet")
        sub.add_argument("--port", type=int, default=0, help="API port (default: a free one)")
        sub.add_argument("--work-dir", default=None, help="pod logs, etcd data, server log (default: a temp dir)")
        sub.add_argument("--node-grace", type=float, default=40.0,
                         help="seconds without a node heartbeat before the node turns Ready=Unknown")
        sub.add_argument("--gpus", type=int, default=0,
                         help=f"a fake {GPU} count on every node, which then carries the {GPU}:NoSchedule taint "
                              "as GPU node pools do (default 0: CPU nodes, no taint)")
        if name == "serve":
            sub.add_argument("--owns-work-dir", action="store_true")
    for name in ("down", "status"):
        commands.add_parser(name).add_argument("--kubeconfig", required=True)
    fault = commands.add_parser("fault")
    fault.add_argument("--kubeconfig", required=True)
    fault.add_argument("action", help="drop-watches | compact | conflict | pause | resume | lose-node | restore-node | "
                                      "pod-pid | oom-kill")
    fault.add_argument("params", nargs="*", help="key=value, e.g. node=node-1 or resource=pods name=x")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        asyncio.run(_serve(args))
        return 0
    return {"up": _up, "down": _down, "status": _status, "fault": _fault}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
