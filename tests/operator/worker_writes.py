"""What the security-context tests run as a job's `spec.command` (tests/operator/test_interruptions_cluster.py and
its real-cluster twin tests/e2e_real/test_real_pod_security.py): a worker that writes every path the hardened
context leaves writable, one that writes outside them, and the root-image override as docs/install.md prints it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

INSTALL_DOC = Path(__file__).resolve().parents[2] / "docs" / "install.md"

# Writes, reads back and removes a file in /tmp, /dev/shm, the checkpoint dir and the cache home as the pod's env
# names it ($HOME/.cache, $XDG_CACHE_HOME, $TRITON_CACHE_DIR, $TORCHINDUCTOR_CACHE_DIR), removing the directories it
# had to create (the test cluster's emptyDirs are host paths shared by every pod). Any failure fails the rank.
WRITE_EVERY_WRITABLE_PATH = """
import os, pathlib
env = os.environ
where = {"/tmp": "/tmp", "/dev/shm": "/dev/shm", "checkpoint dir": env["FLYWHEEL_CHECKPOINT_DIR"],
         "$HOME/.cache": env["HOME"] + "/.cache"}
where.update((f"${name}", env[name]) for name in ("XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"))
for what, path in where.items():
    directory = pathlib.Path(path)
    assert directory.is_absolute(), (what, path)
    made = [d for d in (directory, *directory.parents) if not d.exists()]
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f"flywheel-write-probe-{env['HOSTNAME']}-{env['RANK']}"
    probe.write_text("written")
    assert probe.read_text() == "written"
    probe.unlink()
    for d in made:
        d.rmdir()
    print(f"wrote {what}: {path}", flush=True)
print(f"wrote all {len(where)} writable paths as uid {os.getuid()}", flush=True)
"""
WRITABLE_WHAT = ("/tmp", "/dev/shm", "checkpoint dir", "$HOME/.cache", "$XDG_CACHE_HOME", "$TRITON_CACHE_DIR",
                 "$TORCHINDUCTOR_CACHE_DIR")


def write_outside(path: str) -> list[str]:
    """The command of a worker that writes `path`, outside its volumes."""
    return ["python", "-c", f"open({path!r}, 'w').write('written')"]


def documented_root_override() -> dict[str, Any]:
    """`spec.template` of docs/install.md's NGC override (root, a writable root filesystem), as printed there."""
    after = INSTALL_DOC.read_text().split("The NGC override", 1)[1]
    block = after.split("```yaml\n", 1)[1].split("```", 1)[0]
    template = yaml.safe_load(block)["spec"]["template"]
    assert template["spec"]["securityContext"]["runAsUser"] == 0, template
    return dict(template)
