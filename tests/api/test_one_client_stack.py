"""The served API runs on the product's one client (flywheel/kube): every module `flywheel api` loads imports, and
its cache, auth and actions are built, with the official sync `kubernetes` package made unimportable, as in the
image, whose `cluster` extra leaves it out."""

from __future__ import annotations

import subprocess
import sys

from tests.api.conftest import REPO

MODULES = ["flywheel.cli", "flywheel.api.app", "flywheel.api.server", "flywheel.api.cache", "flywheel.api.auth",
           "flywheel.api.job_actions", "flywheel.kube.client", "flywheel.kube.auth", "flywheel.operator.main"]


def test_the_api_and_operator_import_without_the_sync_kubernetes_package() -> None:
    code = ("import importlib, sys\n"
            "sys.modules['kubernetes'] = None  # any `import kubernetes...` now raises ImportError\n"
            f"for name in {MODULES!r}:\n"
            "    importlib.import_module(name)\n"
            "from flywheel.api.auth import KubeAuth\n"
            "from flywheel.api.cache import KubeCache\n"
            "from flywheel.api.job_actions import KubeActions\n"
            "from flywheel.kube.client import Connection, Kube\n"
            "kube = Kube(Connection('https://127.0.0.1:1'))  # the cluster wiring's parts, built (no request sent)\n"
            "KubeCache(kube, 'ml'), KubeAuth(kube), KubeActions(kube)\n"
            "assert not any(m == 'kubernetes' or m.startswith('kubernetes.') for m in sys.modules if sys.modules[m])\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
