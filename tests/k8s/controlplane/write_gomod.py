"""Writes this folder's go.mod for one Kubernetes release, then lets `go mod tidy` write go.sum.

k8s.io/kubernetes requires each of its staging modules (k8s.io/api, k8s.io/client-go, ...) at v0.0.0 and replaces
them with `./staging/...` folders, which do not exist for a module that requires it. A main module that uses it
replaces each with the published staging module of the same release (v1.X.Y -> v0.X.Y). The list is read from the
release's own go.mod, never written by hand:

    python tests/k8s/controlplane/write_gomod.py v1.37.2
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODULE = "flywheel/tests/k8s/controlplane"
STAGING = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/")


def staging_modules(version: str) -> list[str]:
    info = subprocess.run(["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
                          check=True, capture_output=True, text=True, cwd=HERE)
    gomod = Path(json.loads(info.stdout)["GoMod"]).read_text()
    return sorted({m.group(1) for line in gomod.splitlines() if (m := STAGING.match(line))})


def go_version(version: str) -> str:
    info = subprocess.run(["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
                          check=True, capture_output=True, text=True, cwd=HERE)
    gomod = Path(json.loads(info.stdout)["GoMod"]).read_text()
    return re.search(r"^go (\S+)$", gomod, re.MULTILINE).group(1)


def gomod_text(version: str) -> str:
    staging_version = "v0." + version.removeprefix("v1.")
    replaces = "\n".join(f"\t{m} => {m} {staging_version}" for m in staging_modules(version))
    return (f"module {MODULE}\n\n// Written by write_gomod.py {version}; go.sum by `go mod tidy`.\n\n"
            f"go {go_version(version)}\n\nrequire k8s.io/kubernetes {version}\n\nreplace (\n{replaces}\n)\n")


def main() -> None:
    if len(sys.argv) != 2 or not re.fullmatch(r"v1\.\d+\.\d+", sys.argv[1]):
        sys.exit("usage: write_gomod.py v1.X.Y (a k8s.io/kubernetes release)")
    (HERE / "go.mod").write_text(gomod_text(sys.argv[1]))
    subprocess.run(["go", "mod", "tidy"], check=True, cwd=HERE)


if __name__ == "__main__":
    main()
