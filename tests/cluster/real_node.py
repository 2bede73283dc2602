"""Real nodes for the test cluster: the kubelet of the control-plane binary (tests/k8s/controlplane) on containerd
(tests/k8s/containerd) with Debian's runc, each node with its own containerd, state and ports, registered the way a
kubelet registers: a client certificate `system:node:<name>` from the cluster's CA (pki.py), judged by the Node
authorizer and NodeRestriction, and the cluster's kubelet serving certificate, so the API server's `kubectl logs`
and `exec` reach it (`--kubelet-certificate-authority`).

What these machines need beside a kubelet's defaults (docs/test-cluster.md has the why of each): cgroup v1 in hybrid
mode (`failCgroupV1: false`, the cgroupfs driver, no QoS cgroups or node-allocatable enforcement), no CNI but
Debian's loopback plugin (pods use the host network), a sandbox image built here (tests/k8s/pause, oci.py) since no
registry answers, and where root lacks CAP_SYS_RESOURCE a runc wrapper that raises the negative oom_score_adj the
kubelet gives sandboxes and Guaranteed containers to 0 (the kernel refuses to lower it otherwise).

Nodes carry the label and taint REAL_NODE_LABEL, so only pods that ask for a real node land there; their images
(a podman image by name) are imported once into a template containerd root (images.py) whose files each node's
root hard-links.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from tests.cluster.pki import Pki
from tests.etcd_process import free_port

REAL_NODE_LABEL = "flywheel.dev/real-node"
CNI_DIR = Path("/usr/lib/cni")
RUNC = Path("/usr/sbin/runc")
START_TIMEOUT_S = 60.0
_CAP_SYS_RESOURCE = 24

# Raises a negative process.oomScoreAdj in the bundle's config.json to 0, then runs runc as called.
_RUNC_WRAPPER = """#!/bin/sh
for arg; do
  if [ "$prev" = "--bundle" ] || [ "$prev" = "-b" ]; then
    python3 -S -c '
import json, sys
path = sys.argv[1] + "/config.json"
config = json.load(open(path))
if config.get("process", {}).get("oomScoreAdj", 0) < 0:
    config["process"]["oomScoreAdj"] = 0
    json.dump(config, open(path, "w"))
' "$arg"
  fi
  prev="$arg"
done
exec {runc} "$@"
"""


def host_ip() -> str:
    """The address of the interface of the default route: a node's InternalIP may not be a loopback address, and
    the API server reaches the kubelet there."""
    routes = subprocess.run(["ip", "-4", "-o", "route", "get", "1.1.1.1"], capture_output=True, text=True,
                            check=True).stdout.split()
    return routes[routes.index("src") + 1]


def lowers_oom_score() -> bool:
    """Whether this process may lower oom_score_adj (CAP_SYS_RESOURCE), as runc must for the kubelet's values."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> _CAP_SYS_RESOURCE & 1)
    return False


@dataclass(frozen=True)
class RealNodeSettings:
    api_url: str  # the API server itself (a client certificate cannot pass the fault proxy)
    pki: Pki
    control_plane: Path  # the binary that is also the kubelet
    containerd_dir: Path  # containerd, containerd-shim-runc-v2, ctr
    sandbox_image: str
    lease_seconds: int = 4  # renewed every quarter of it: a lost node is noticed within the cluster's grace


class RealNode:
    """One node: `start()`, `lose()` (kubelet, containerd and every container of the node killed, as by a power
    loss), `start()` again to bring it back, `stop()` to end it and remove its mounts."""

    def __init__(self, name: str, folder: Path, settings: RealNodeSettings, template_root: Path | None) -> None:
        self.name, self.folder, self.settings = name, folder, settings
        self.template_root = template_root
        # Unix socket paths are limited to 107 bytes: the runtime's live in a short folder of their own, and so does
        # the kubelet's root (its pod-resources and plugin sockets), which a test's folder under pytest's xdist
        # workers makes too long.
        self.run_dir = Path(f"/run/flywheel-{os.getpid()}-{name}")
        self.kubelet_dir = Path(f"/tmp/flywheel-kubelet-{os.getpid()}-{name}")
        self.socket = self.run_dir / "containerd.sock"
        self.kubelet_port, self.healthz_port = free_port(), free_port()
        self.ip = host_ip()
        self._containerd: subprocess.Popen[bytes] | None = None
        self._kubelet: subprocess.Popen[bytes] | None = None

    @property
    def root(self) -> Path:
        return self.folder / "containerd"

    def ctr(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.settings.containerd_dir / "ctr"), "--address", str(self.socket),
                               "--namespace", "k8s.io", *args], capture_output=True, text=True, timeout=timeout)

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if not self.root.exists():
            self._seed_root()
        self._start_containerd()
        self._start_kubelet()

    def _seed_root(self) -> None:
        """The node's containerd root from the template's files (hard links: the images are not copied)."""
        if self.template_root is None:
            self.root.mkdir(parents=True)
            return
        subprocess.run(["cp", "-al", str(self.template_root), str(self.root)], check=True)
        for db in self.root.rglob("*.db"):  # containerd and its snapshotter write their bolt databases: copies
            db.unlink()
            shutil.copy2(self.template_root / db.relative_to(self.root), db)

    def _start_containerd(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        config = self.folder / "containerd.toml"
        config.write_text(containerd_config(self.root, self.run_dir, self.socket, self.settings.sandbox_image,
                                            self._runc(), self._cni_dir()))
        env = {**os.environ, "PATH": f"{self.settings.containerd_dir}:{os.environ.get('PATH', '')}"}
        self._containerd = self._spawn([str(self.settings.containerd_dir / "containerd"), "--config", str(config)],
                                       "containerd.log", env)
        deadline = time.monotonic() + START_TIMEOUT_S
        while self.ctr("version", timeout=10).returncode != 0:
            if self._containerd.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd of {self.name} did not start: {self._tail('containerd.log')}")
            time.sleep(0.2)

    def _start_kubelet(self) -> None:
        s = self.settings
        cert, key = s.pki.node_credentials(self.name)
        kubeconfig = self.folder / "kubelet.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump(_kubeconfig(s.api_url, s.pki.ca_cert, cert, key)))
        config = self.folder / "kubelet.yaml"
        config.write_text(yaml.safe_dump(kubelet_config(self, s)))
        self._kubelet = self._spawn([
            str(s.control_plane), "kubelet", f"--config={config}", f"--kubeconfig={kubeconfig}",
            f"--root-dir={self.kubelet_dir}", f"--hostname-override={self.name}", f"--node-ip={self.ip}",
            f"--node-labels={REAL_NODE_LABEL}=true", f"--register-with-taints={REAL_NODE_LABEL}=true:NoSchedule",
            "--v=1"], "kubelet.log", dict(os.environ))

    def _runc(self) -> Path:
        if lowers_oom_score():
            return RUNC
        wrapper = self.folder / "runc"
        wrapper.write_text(_RUNC_WRAPPER.replace("{runc}", str(RUNC)))
        wrapper.chmod(0o755)
        return wrapper

    def _cni_dir(self) -> Path:
        """A network config that makes the runtime report its network ready: loopback alone (host-network pods)."""
        folder = self.folder / "cni"
        folder.mkdir(exist_ok=True)
        (folder / "10-loopback.conflist").write_text(
            '{"cniVersion": "1.0.0", "name": "loopback-only", "plugins": [{"type": "loopback"}]}\n')
        return folder

    def _spawn(self, argv: list[str], log: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(self.folder / log, "ab") as out:
            return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def _tail(self, log: str, size: int = 3000) -> str:
        try:
            return (self.folder / log).read_text(errors="replace")[-size:]
        except OSError:
            return ""

    def diagnosis(self) -> str:
        """Why the node may not be Ready, for a test's failure message: its processes and the ends of their logs."""
        state = {name: "not started" if proc is None else "running" if proc.poll() is None else f"exited {proc.poll()}"
                 for name, proc in (("containerd", self._containerd), ("kubelet", self._kubelet))}
        errors = [line for line in self._tail("kubelet.log", 200_000).splitlines() if line.startswith("E")][-15:]
        return (f"{self.name}: containerd {state['containerd']}, kubelet {state['kubelet']}; "
                "the kubelet's last errors:\n" + "\n".join(errors)
                + f"\nthe end of kubelet.log:\n{self._tail('kubelet.log', 2500)}"
                + f"\nthe end of containerd.log:\n{self._tail('containerd.log', 1500)}")

    def lose(self) -> None:
        """The node goes dark: its kubelet stops reporting, then its containers and runtime are killed."""
        _kill(self._kubelet)
        self._kubelet = None
        self._kill_containers()
        _kill(self._containerd)
        self._containerd = None
        self._kill_shims()
        _unmount_under(self.run_dir)

    def stop(self) -> None:
        self.lose()
        for folder in (self.folder, self.kubelet_dir):
            _unmount_under(folder)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        shutil.rmtree(self.kubelet_dir, ignore_errors=True)

    def _kill_containers(self) -> None:
        if self._containerd is None or self._containerd.poll() is not None:
            return
        tasks = self.ctr("tasks", "ls", "--quiet", timeout=30)
        for task in tasks.stdout.split():
            self.ctr("tasks", "kill", "--all", "--signal", "SIGKILL", task, timeout=30)

    def _kill_shims(self) -> None:
        """The runc shims of this node's containerd (they outlive it by design) and their children."""
        address = str(self.socket)
        for proc in Path("/proc").iterdir():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and address.encode() in argv:
                try:
                    os.killpg(int(proc.name), signal.SIGKILL)
                except (ProcessLookupError, PermissionError, ValueError):
                    pass


def _kill(process: subprocess.Popen[bytes] | None) -> None:
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def _unmount_under(folder: Path) -> None:
    """Unmount everything mounted under `folder` (containers' root file systems, the kubelet's volumes), deepest
    first; lazily, as a container killed a moment ago may still hold one."""
    prefix = str(folder.resolve()) + "/"
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for target in sorted({m for m in mounts if m.startswith(prefix)}, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True)


def _kubeconfig(server: str, ca: Path, cert: Path, key: Path) -> dict[str, object]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "node",
            "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
            "users": [{"name": "node", "user": {"client-certificate": str(cert), "client-key": str(key)}}],
            "contexts": [{"name": "node", "context": {"cluster": "test", "user": "node"}}]}


def kubelet_config(node: RealNode, s: RealNodeSettings) -> dict[str, object]:
    serving = s.pki.kubelet_serving(node.name, node.ip)
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
        "failSwapOn": False, "containerRuntimeEndpoint": f"unix://{node.socket}",
        "address": node.ip, "port": node.kubelet_port, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": node.healthz_port,
        "tlsCertFile": str(serving[0]), "tlsPrivateKeyFile": str(serving[1]),
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                           "x509": {"clientCAFile": str(s.pki.ca_cert)}},
        "authorization": {"mode": "AlwaysAllow"},  # only clients with the cluster CA's certificates get in
        "podLogsDir": str(node.folder / "pod-logs"), "resolvConf": "/etc/resolv.conf",
        "nodeLeaseDurationSeconds": s.lease_seconds, "nodeStatusUpdateFrequency": "2s",
        # One machine's disk holds every node's images: no image garbage collection or disk-pressure eviction.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "serializeImagePulls": False, "volumePluginDir": str(node.folder / "volume-plugins"),
    }


def containerd_config(root: Path, state: Path, socket: Path, sandbox_image: str, runc: Path, cni: Path) -> str:
    return f"""version = 3
root = "{root}"
state = "{state}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
                    "io.containerd.snapshotter.v1.erofs", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{socket}"

[plugins."io.containerd.internal.v1.opt"]
  path = "{root}/opt"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{sandbox_image}"

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{CNI_DIR}"]
  conf_dir = "{cni}"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{runc}"
"""
