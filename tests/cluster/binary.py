"""The test cluster's Go binaries, each built once from the Go module proxy into a cache outside the work tree, keyed
by its main module's files (go.mod, go.sum, main.go), so a warm cache rebuilds nothing and a new release builds anew:
the control plane (tests/k8s/controlplane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
kubectl, one Kubernetes release), the real nodes' container runtime (tests/k8s/containerd: containerd, its runc
shim and ctr) and their sandbox process (tests/k8s/pause). Standard library only: `make controlplane` runs it
before any venv exists.

    python3 -m tests.cluster build      # prints the control plane's path (and builds the others)
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

K8S_DIR = Path(__file__).resolve().parents[1] / "k8s"
MODULE_DIR = K8S_DIR / "controlplane"
KEYED_FILES = ("go.mod", "go.sum", "main.go")
BINARY_ENV = "FLYWHEEL_CONTROLPLANE"  # a binary to use as is (built elsewhere)


def cache_root() -> Path:
    base = os.environ.get("FLYWHEEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "flywheel")
    return Path(base) / "controlplane"


def kubernetes_version() -> str:
    """The k8s.io/kubernetes release the main module requires (what `kubectl version` shows)."""
    return _required(MODULE_DIR, "k8s.io/kubernetes", r"v1\.\d+\.\d+")


def containerd_version() -> str:
    return _required(K8S_DIR / "containerd", "github.com/containerd/containerd/v2", r"v2\.\d+\.\d+")


def _required(module_dir: Path, module: str, version: str) -> str:
    text = (module_dir / "go.mod").read_text()
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} ({version})\s*$", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{module_dir / 'go.mod'} requires no {module} release")
    return match.group(1)


@dataclass(frozen=True)
class GoMain:
    """One main module of tests/k8s and the names its binary answers to (hard links in the cache beside it)."""

    name: str
    module_dir: Path
    links: tuple[str, ...] = ()
    static: bool = False  # built without cgo: a binary an image can hold alone
    others: tuple[tuple[str, str], ...] = ()  # (binary, main package of a required module) built beside it

    def cache_key(self) -> str:
        digest = hashlib.sha256()
        for name in KEYED_FILES + (("tools.go",) if (self.module_dir / "tools.go").exists() else ()):
            digest.update(name.encode() + b"\0" + (self.module_dir / name).read_bytes() + b"\0")
        return digest.hexdigest()[:16]

    def path(self) -> Path:
        root = cache_root() if self.name == "controlplane" else cache_root().parent / self.name
        return root / self.cache_key() / self.name

    def ldflags(self) -> str:
        if self.name == "controlplane":
            return kubernetes_ldflags(kubernetes_version())
        if self.name == "containerd":
            return f"-s -w -X github.com/containerd/containerd/v2/version.Version={containerd_version()}"
        return "-s -w"


CONTROL_PLANE = GoMain("controlplane", MODULE_DIR)
# containerd starts its shim by name, from the PATH real_node.py gives it: this folder.
SHIM = ("containerd-shim-runc-v2", "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2")
CONTAINERD = GoMain("containerd", K8S_DIR / "containerd", links=("ctr",), others=(SHIM,))
PAUSE = GoMain("pause", K8S_DIR / "pause", static=True)  # the real nodes' sandbox image holds it alone


def cache_key() -> str:
    return CONTROL_PLANE.cache_key()


def binary_path() -> Path:
    return CONTROL_PLANE.path()


def kubernetes_ldflags(version: str) -> str:
    """Version stamps, so /version (and `kubectl version`, a node's kubeletVersion) say the release, not v0.0.0."""
    major, minor = version.removeprefix("v").split(".")[:2]
    built = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stamps = {"gitVersion": version, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean",
              "gitCommit": f"k8s.io/kubernetes@{version}", "buildDate": built}
    variables = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")  # servers', kubectl's
    return "-s -w " + " ".join(f"-X {var}.{k}={v}" for var in variables for k, v in stamps.items())


def ensure_binary(quiet: bool = False) -> Path:
    """The control plane's path, building it first when the cache lacks it."""
    if os.environ.get(BINARY_ENV):
        return Path(os.environ[BINARY_ENV])
    return ensure(CONTROL_PLANE, quiet)


def ensure_containerd(quiet: bool = False) -> Path:
    """The folder holding containerd, containerd-shim-runc-v2 and ctr, building them first when missing."""
    return ensure(CONTAINERD, quiet).parent


def ensure_pause(quiet: bool = False) -> Path:
    return ensure(PAUSE, quiet)


def ensure(main: GoMain, quiet: bool = False) -> Path:
    """`main`'s binary, built first when the cache lacks it (one build at a time, across processes)."""
    target = main.path()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be building it
        if target.exists():
            return target
        _build(main, target, quiet)
    return target


def _build(main: GoMain, target: Path, quiet: bool) -> None:
    partial = target.with_suffix(".partial")
    started = time.monotonic()
    if not quiet:
        print(f"building {main.module_dir.name} into {target}; a cold Go cache takes minutes",
              file=sys.stderr, flush=True)
    env = {**os.environ, "GOFLAGS": os.environ.get("GOFLAGS", "") + " -mod=readonly"}
    if main.static:
        env["CGO_ENABLED"] = "0"
    for output, package in ((partial, "."), *((target.parent / name, pkg) for name, pkg in main.others)):
        command = ["go", "build", "-trimpath", "-ldflags", main.ldflags(), "-o", str(output), package]
        result = subprocess.run(command, cwd=main.module_dir, capture_output=True, text=True, env=env)
        if result.returncode != 0:
            raise RuntimeError(f"go build of {package} in {main.module_dir} failed ({result.returncode}):\n"
                               f"{result.stderr[-4000:]}")
    for link in main.links:
        (target.parent / link).unlink(missing_ok=True)
        os.link(partial, target.parent / link)
    partial.replace(target)  # whole or not at all: a killed build leaves no half binary behind
    if not quiet:
        print(f"built {target} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
