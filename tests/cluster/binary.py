"""The control-plane binary (tests/k8s/controlplane): built once from the Go module proxy into a cache outside the
work tree, keyed by the main module's files (go.mod, go.sum, main.go), so a warm cache rebuilds nothing and a new
Kubernetes release builds anew. Standard library only: `make controlplane` runs it before any venv exists.

    python3 -m tests.cluster build      # prints the binary's path
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

MODULE_DIR = Path(__file__).resolve().parents[1] / "k8s" / "controlplane"
KEYED_FILES = ("go.mod", "go.sum", "main.go")
BINARY_ENV = "FLYWHEEL_CONTROLPLANE"  # a binary to use as is (built elsewhere)


def cache_root() -> Path:
    base = os.environ.get("FLYWHEEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "flywheel")
    return Path(base) / "controlplane"


def kubernetes_version() -> str:
    """The k8s.io/kubernetes release the main module requires (what `kubectl version` shows)."""
    text = (MODULE_DIR / "go.mod").read_text()
    match = re.search(r"^\s*k8s\.io/kubernetes (v1\.\d+\.\d+)\s*$", text, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"{MODULE_DIR / 'go.mod'} requires no k8s.io/kubernetes release")
    return match.group(1)


def cache_key() -> str:
    digest = hashlib.sha256()
    for name in KEYED_FILES:
        digest.update(name.encode() + b"\0" + (MODULE_DIR / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def binary_path() -> Path:
    return cache_root() / cache_key() / "controlplane"


def ldflags(version: str) -> str:
    """Version stamps, so /version (and `kubectl version`) say the release rather than v0.0.0."""
    major, minor = version.removeprefix("v").split(".")[:2]
    built = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    stamps = {"gitVersion": version, "gitMajor": major, "gitMinor": minor, "gitTreeState": "clean",
              "gitCommit": f"k8s.io/kubernetes@{version}", "buildDate": built}
    variables = ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version")  # servers', kubectl's
    return "-s -w " + " ".join(f"-X {var}.{k}={v}" for var in variables for k, v in stamps.items())


def ensure_binary(quiet: bool = False) -> Path:
    """The binary's path, building it first when the cache lacks it (one build at a time, across processes)."""
    if os.environ.get(BINARY_ENV):
        return Path(os.environ[BINARY_ENV])
    target = binary_path()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be building it
        if target.exists():
            return target
        _build(target, quiet)
    return target


def _build(target: Path, quiet: bool) -> None:
    version = kubernetes_version()
    partial = target.with_suffix(".partial")
    command = ["go", "build", "-trimpath", "-ldflags", ldflags(version), "-o", str(partial), "."]
    started = time.monotonic()
    if not quiet:
        print(f"building the control plane (Kubernetes {version}) into {target}; a cold Go cache takes minutes",
              file=sys.stderr, flush=True)
    result = subprocess.run(command, cwd=MODULE_DIR, capture_output=True, text=True,
                            env={**os.environ, "GOFLAGS": os.environ.get("GOFLAGS", "") + " -mod=readonly"})
    if result.returncode != 0:
        raise RuntimeError(f"go build of {MODULE_DIR} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    partial.replace(target)  # whole or not at all: a killed build leaves no half binary behind
    if not quiet:
        print(f"built {target} in {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
