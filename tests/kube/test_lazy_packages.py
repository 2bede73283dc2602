"""kubernetes_asyncio's packages imported lazily (flywheel/kube/lazy_packages.py): the operator's process loads
only what it uses, and every name the real packages export is still there."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

from flywheel.kube.lazy_packages import PACKAGES


def _run(code: str) -> Any:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          check=True)
    return json.loads(done.stdout.splitlines()[-1])


def test_the_operator_loads_only_the_library_modules_it_uses() -> None:
    got = _run("""
        import json, sys
        sys.modules["kubernetes"] = None  # as in the image: no sync client
        from flywheel.kube import lazy_packages
        assert lazy_packages.install()
        import kopf
        import flywheel.operator.handlers
        from flywheel.kube.client import Kube
        loaded = [m for m in sys.modules if m.startswith("kubernetes_asyncio.client.models.")]
        print(json.dumps({"models": loaded}))
    """)
    # kopf's two isinstance classes (and what they import), never the ~700 generated ones
    assert 0 < len(got["models"]) < 10, got["models"]


def test_every_name_the_real_packages_export_resolves_the_same() -> None:
    """Each name in the real packages' namespaces (what their __init__ imported, submodules included) is, in the
    lazy ones, the same class, function, module or constant."""
    code = """
        import importlib, json, sys, types
        if {lazy}:
            from flywheel.kube import lazy_packages
            assert lazy_packages.install()

        def signature(value):
            if isinstance(value, types.ModuleType):
                return "module " + value.__name__
            if isinstance(value, str):
                return "str " + value
            if hasattr(value, "__qualname__"):
                return value.__module__ + "." + value.__qualname__
            return None  # e.g. absolute_import, a __future__ feature (not exported lazily)

        wanted = {wanted}
        names = {{}}
        for name in {packages!r}:
            package = importlib.import_module(name)
            listed = wanted[name] if wanted else [
                n for n in vars(package) if not n.startswith("_") or n == "__version__"]
            names[name] = {{n: signature(getattr(package, n)) for n in listed}}
        print(json.dumps(names))
    """
    real = _run(code.format(lazy=False, wanted=None, packages=PACKAGES))
    wanted = {package: [n for n, sig in names.items() if sig is not None] for package, names in real.items()}
    lazy = _run(code.format(lazy=True, wanted=wanted, packages=PACKAGES))
    for package in PACKAGES:
        assert len(wanted[package]) > 3
        assert lazy[package] == {n: real[package][n] for n in wanted[package]}, package


def test_a_star_import_gets_what_the_real_package_exports() -> None:
    """kubernetes_asyncio.client lists `__all__`: the lazy package has it too, so `import *` imports the same names
    (a package without `__all__` gives the names used so far)."""
    code = """
        import json
        if {lazy}:
            from flywheel.kube import lazy_packages
            assert lazy_packages.install()
        names = {{}}
        exec("from kubernetes_asyncio.client import *", names)
        print(json.dumps(sorted(n for n in names if n != "__builtins__")))
    """
    real = _run(code.format(lazy=False))
    assert len(real) > 100 and _run(code.format(lazy=True)) == real
