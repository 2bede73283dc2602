"""`python -m tests.cluster up|down|status|serve|build|images|fault` -- the test cluster in the background for
kubectl, the operator and people.

  up     --kubeconfig PATH [--nodes N] [--no-etcd] [--work-dir DIR] [--node-grace SECONDS] [--gpus N]
         [--real-nodes N [--real-node-image IMAGE ...]]
         (the control plane, the process kubelet and an etcd for rendezvous; the binary is built first if missing;
         --real-nodes: real-1..real-N beside them, the kubelet on containerd holding podman's IMAGEs: real_node.py)
  down   --kubeconfig PATH
  status --kubeconfig PATH
  fault  --kubeconfig PATH ACTION [key=value ...]   restart component=kube-apiserver, stop|start component=etcd,
         lose-node node=node-1, restore-node node=node-1 (a real node: its kubelet, containers and runtime
         killed, then started again)
  build  (the control-plane binary, printing its path, and the real nodes' containerd)
  images IMAGE ...   (podman's IMAGEs imported for the real nodes ahead of their first start: `make test-image`)
  serve  (what `up` starts: the cluster in the foreground until SIGTERM)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from tests.rank_processes import alive

REPO_ROOT = Path(__file__).resolve().parents[2]
GPU = "nvidia.com/gpu"
UP_TIMEOUT_S = 600  # the first `up` on a machine builds the control plane (minutes on a cold Go cache)


def state_path(kubeconfig: Path) -> Path:
    return kubeconfig.with_name(kubeconfig.name + ".state.json")


def _read_state(kubeconfig: Path) -> dict[str, Any] | None:
    path = state_path(kubeconfig)
    return json.loads(path.read_text()) if path.exists() else None


def _serve(args: argparse.Namespace) -> None:
    from tests.cluster.cluster import ClusterOptions, TestCluster
    from tests.kubelet.nodes import NodeSetup

    kubeconfig = Path(args.kubeconfig).resolve()
    gpu = NodeSetup(resources={GPU: str(args.gpus)}, taints=[{"key": GPU, "effect": "NoSchedule"}])
    options = ClusterOptions(nodes=args.nodes, rendezvous_etcd=args.etcd, node_monitor_grace_seconds=args.node_grace,
                             node_setup={f"node-{i}": gpu for i in range(1, args.nodes + 1)} if args.gpus else {},
                             real_nodes=args.real_nodes, real_node_images=tuple(args.real_node_image))
    cluster = TestCluster(Path(args.work_dir), options)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    cluster.start()
    faults = _FaultInbox(cluster, kubeconfig)
    try:
        kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        kubeconfig.write_text(cluster.kubeconfig.read_text())
        state = {"pid": os.getpid(), "api_url": cluster.api_url, "etcd_url": cluster.etcd_url,
                 "kubeconfig": str(kubeconfig), "work_dir": str(cluster.work_dir),
                 "pod_logs": str(cluster.log_dir), "component_logs": str(cluster.control_plane.log_dir),
                 "owns_work_dir": args.owns_work_dir, "start_seconds": round(cluster.start_seconds, 1),
                 "version": cluster.control_plane.version,
                 "nodes": cluster.kubelet.node_names if cluster.kubelet else []}
        temp = state_path(kubeconfig).with_suffix(".tmp")
        temp.write_text(json.dumps(state, indent=2))
        temp.replace(state_path(kubeconfig))  # `up` waits for this file: write it whole
        print(f"test cluster serving {cluster.api_url} (started in {cluster.start_seconds:.1f} s)", flush=True)
        while not stop.wait(0.2):
            faults.poll()
    finally:
        cluster.stop()
        state_path(kubeconfig).unlink(missing_ok=True)


class _FaultInbox:
    """`fault` asks the serving process through a file beside the kubeconfig (<kubeconfig>.fault.json), answered in
    <kubeconfig>.fault.reply.json: the control plane's processes and the kubelet belong to the serving process."""

    def __init__(self, cluster: Any, kubeconfig: Path) -> None:
        self.cluster, self.ask, self.reply = cluster, kubeconfig.with_name(kubeconfig.name + ".fault.json"), \
            kubeconfig.with_name(kubeconfig.name + ".fault.reply.json")

    def poll(self) -> None:
        if not self.ask.exists():
            return
        request = json.loads(self.ask.read_text())
        self.ask.unlink()
        try:
            answer = {"ok": True, "result": self._do(request["action"], request["params"])}
        except Exception as err:  # noqa: BLE001 - the asking command prints it
            answer = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        temp = self.reply.with_suffix(".tmp")
        temp.write_text(json.dumps(answer))
        temp.replace(self.reply)

    def _real_or_process(self, node: str, lose: bool) -> None:
        real, kubelet = self.cluster.real_nodes.get(node), self.cluster.kubelet
        if real is not None:
            real.lose() if lose else real.start()
        elif kubelet is not None:
            kubelet.lose_node(node) if lose else kubelet.restore_node(node)

    def _do(self, action: str, params: dict[str, str]) -> Any:
        plane, kubelet = self.cluster.control_plane, self.cluster.kubelet
        actions = {
            "restart": lambda: plane.restart(params["component"], float(params.get("down_seconds", 0))),
            "stop": lambda: plane.stop_component(params["component"]),
            "start": lambda: plane.start_component(params["component"]),
            "lose-node": lambda: self._real_or_process(params["node"], lose=True),
            "restore-node": lambda: self._real_or_process(params["node"], lose=False),
            "pod-pid": lambda: kubelet.pid_of(params.get("namespace", "default"), params["name"]),
            "oom-kill": lambda: kubelet.oom_kill(params.get("namespace", "default"), params["name"]),
        }
        if action not in actions:
            raise ValueError(f"unknown fault {action!r}: one of {', '.join(sorted(actions))}")
        return actions[action]()


def _up(args: argparse.Namespace) -> int:
    from tests.cluster.binary import ensure_binary

    kubeconfig = Path(args.kubeconfig).resolve()
    existing = _read_state(kubeconfig)
    if existing and alive(existing["pid"]):
        print(f"already up: {existing['api_url']} (pid {existing['pid']})")
        return 0
    ensure_binary()  # here, so its progress reaches the terminal
    owns = args.work_dir is None
    work_dir = Path(args.work_dir or tempfile.mkdtemp(prefix="flywheel-cluster-")).resolve()
    work_dir.mkdir(parents=True, exist_ok=True)
    log_path = work_dir / "cluster.log"
    command = [sys.executable, "-m", "tests.cluster", "serve", "--kubeconfig", str(kubeconfig), "--nodes",
               str(args.nodes), "--work-dir", str(work_dir), "--node-grace", str(args.node_grace),
               "--gpus", str(args.gpus), "--etcd" if args.etcd else "--no-etcd", "--real-nodes", str(args.real_nodes),
               *(a for image in args.real_node_image for a in ("--real-node-image", image))] + \
        (["--owns-work-dir"] if owns else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        state = _read_state(kubeconfig)
        if state and state["pid"] == process.pid:
            _print_state(state)
            return 0
        if process.poll() is not None:
            print(f"test cluster failed to start (exit {process.returncode}):\n{log_path.read_text()[-4000:]}",
                  file=sys.stderr)
            return 1
        time.sleep(0.2)
    process.kill()
    print(f"test cluster did not come up within {UP_TIMEOUT_S} s; see {log_path}", file=sys.stderr)
    return 1


def _print_state(state: dict[str, Any]) -> None:
    print(f"API:        {state['api_url']} (Kubernetes {state['version']}, started in {state['start_seconds']} s)\n"
          f"kubeconfig: {state['kubeconfig']}\nnodes:      {', '.join(state['nodes'])}")
    if state["etcd_url"]:
        print(f"etcd:       {state['etcd_url']} (for rendezvous)")
    print(f"pod logs:   {state['pod_logs']}\ncomponents: {state['component_logs']}\npid:        {state['pid']}")


def _status(args: argparse.Namespace) -> int:
    state = _read_state(Path(args.kubeconfig).resolve())
    if not state or not alive(state["pid"]):
        print("down")
        return 1
    _print_state(state)
    return 0


def _down(args: argparse.Namespace) -> int:
    kubeconfig = Path(args.kubeconfig).resolve()
    state = _read_state(kubeconfig)
    if not state or not alive(state["pid"]):
        print("already down")
        state_path(kubeconfig).unlink(missing_ok=True)
        return 0
    os.kill(state["pid"], signal.SIGTERM)
    deadline = time.monotonic() + 60
    while alive(state["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(state["pid"]):
        os.killpg(state["pid"], signal.SIGKILL)
    if state.get("owns_work_dir"):
        import shutil
        shutil.rmtree(state["work_dir"], ignore_errors=True)
    state_path(kubeconfig).unlink(missing_ok=True)
    kubeconfig.unlink(missing_ok=True)
    print("down")
    return 0


def _fault(args: argparse.Namespace) -> int:
    kubeconfig = Path(args.kubeconfig).resolve()
    state = _read_state(kubeconfig)
    if not state or not alive(state["pid"]):
        print("the test cluster is down", file=sys.stderr)
        return 1
    params = dict(item.split("=", 1) for item in args.params)
    ask, reply = (kubeconfig.with_name(kubeconfig.name + suffix) for suffix in (".fault.json", ".fault.reply.json"))
    reply.unlink(missing_ok=True)
    ask.write_text(json.dumps({"action": args.action, "params": params}))
    deadline = time.monotonic() + 180
    while not reply.exists():
        if time.monotonic() > deadline:
            print("no answer from the test cluster in 180 s", file=sys.stderr)
            return 1
        time.sleep(0.1)
    answer = json.loads(reply.read_text())
    reply.unlink()
    print(json.dumps(answer))
    return 0 if answer["ok"] else 1


def _build(args: argparse.Namespace) -> int:
    from tests.cluster.binary import ensure_binary, ensure_containerd, ensure_pause
    print(ensure_binary())
    ensure_containerd()  # the real nodes' runtime and sandbox (`up --real-nodes N`)
    ensure_pause()
    return 0


def _images(args: argparse.Namespace) -> int:
    """Import podman's images into the real nodes' containerd template root now (images.py), so that no test
    waits minutes for it; nothing when they are there already."""
    from tests.cluster import images  # builds containerd and the sandbox image only when it has to import
    log = Path(tempfile.gettempdir()) / "flywheel-image-import.log"
    try:
        print(images.template_root(tuple(args.image), log))
    except (RuntimeError, subprocess.SubprocessError, OSError) as err:
        print(f"importing {', '.join(args.image)} for the real nodes failed: {err}; see {log}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "serve"):
        sub = commands.add_parser(name)
        sub.add_argument("--kubeconfig", required=True)
        sub.add_argument("--nodes", type=int, default=2)
        sub.add_argument("--work-dir")
        sub.add_argument("--node-grace", type=float, default=40.0)
        sub.add_argument("--gpus", type=int, default=0)
        sub.add_argument("--real-nodes", type=int, default=0)
        sub.add_argument("--real-node-image", action="append", default=[])
        sub.add_argument("--etcd", dest="etcd", action="store_true", default=True)
        sub.add_argument("--no-etcd", dest="etcd", action="store_false")
        if name == "serve":
            sub.add_argument("--owns-work-dir", action="store_true")
    for name in ("down", "status"):
        commands.add_parser(name).add_argument("--kubeconfig", required=True)
    fault = commands.add_parser("fault")
    fault.add_argument("--kubeconfig", required=True)
    fault.add_argument("action")
    fault.add_argument("params", nargs="*")
    commands.add_parser("build")
    commands.add_parser("images", help="import podman images for the real nodes").add_argument("image", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "serve":
        _serve(args)
        return 0
    return {"up": _up, "down": _down, "status": _status, "fault": _fault, "build": _build,
            "images": _images}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
