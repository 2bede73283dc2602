"""The project's image for the tests that run it (tests/image, tests/real_nodes): scripts/image/test-image.sh builds
the Dockerfile as `make image` does, kept under a key of what decides its dependencies, with this checkout's
package copied in (seconds when the key's image exists, minutes when not). Skips the calling test where podman
cannot run a container at all."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEST_IMAGE = REPO / "scripts" / "image" / "test-image.sh"
ENV = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF")
       or str(REPO / "scripts" / "image" / "containers.conf")}


def podman_unusable() -> str | None:
    """Why podman cannot run a container here, or None."""
    if shutil.which("podman") is None:
        return "podman is not installed (scripts/install-tools.sh installs it)"
    try:
        result = subprocess.run(["podman", "info"], capture_output=True, text=True, timeout=60, env=ENV)
    except subprocess.TimeoutExpired:
        return "`podman info` did not answer in 60 s"
    if result.returncode != 0:
        return f"`podman info` failed: {result.stderr.strip()[-500:]}"
    return None


def project_image() -> str:
    """The image's name (localhost/flywheel-test:latest), built or brought up to date with the checkout first."""
    reason = podman_unusable()
    if reason:
        pytest.skip(f"podman cannot run containers here: {reason}")
    began = time.monotonic()
    lock_path = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flywheel" / "test-image.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the other test process may be building the same image
        result = subprocess.run(["bash", str(TEST_IMAGE)], capture_output=True, text=True, timeout=2400, env=ENV)
    assert result.returncode == 0, f"{TEST_IMAGE} failed\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    name = result.stdout.strip().splitlines()[-1]
    print(f"image {name} ready in {time.monotonic() - began:.0f} s\n{result.stderr[-1500:]}")
    return name


