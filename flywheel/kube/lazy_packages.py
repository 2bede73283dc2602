"""kubernetes_asyncio's packages, imported lazily: a name is imported when it is first used.

The library's package `__init__` files import everything they export: ~830 generated model and API modules, ~39 MB
of the operator's memory (its RSS goal is 200 MB at 500 jobs), of which the product uses the ApiClient, its
Configuration and kubeconfig loader, and kopf two model classes (V1ObjectMeta, V1OwnerReference, for its
isinstance checks). `install()` registers, before anything imports the library, a module for each of those packages
that reads its real `__init__`'s `from X import Y` / `import X as Y` lines without running them and imports Y from X
on first access; submodules import from the package's folder as usual. Every exported name stays reachable
(tests/unit/test_kube_lazy_packages.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from pathlib import Path
from typing import Any

# The packages whose __init__ imports what the product does not use, parents first.
PACKAGES = ("kubernetes_asyncio", "kubernetes_asyncio.client", "kubernetes_asyncio.client.models",
            "kubernetes_asyncio.client.api")
_FROM_IMPORT = re.compile(r"^from\s+([\w.]+)\s+import\s+(\w+)(?:\s+as\s+(\w+))?\s*$", re.MULTILINE)
_IMPORT_AS = re.compile(r"^import\s+([\w.]+)\s+as\s+(\w+)\s*$", re.MULTILINE)
_CONSTANT = re.compile(r"^(__\w+__)\s*=\s*\"([^\"]*)\"\s*$", re.MULTILINE)


class LazyPackage(types.ModuleType):
    """A package whose exported names are imported on first access (from its real __init__'s import lines)."""

    def __init__(self, name: str, spec: Any, init_source: str) -> None:
        super().__init__(name)
        self.__spec__, self.__path__ = spec, list(spec.submodule_search_locations or [])
        self.__file__, self.__package__ = spec.origin, name
        self.__lazy_sources__: dict[str, tuple[str, str | None]] = {}  # name -> (module, attribute; None: module)
        for module, attribute, alias in _FROM_IMPORT.findall(init_source):
            if module != "__future__":
                self.__lazy_sources__[alias or attribute] = (module, attribute)
        for module, alias in _IMPORT_AS.findall(init_source):
            self.__lazy_sources__[alias] = (module, None)
        for constant, value in _CONSTANT.findall(init_source):
            setattr(self, constant, value)

    def __getattr__(self, name: str) -> Any:
        source = self.__lazy_sources__.get(name)
        if source is None:
            if name.startswith("__"):
                raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
            try:  # a submodule (e.g. client.rest), an attribute of the real package once its __init__ ran
                return importlib.import_module(f"{self.__name__}.{name}")
            except ModuleNotFoundError as err:
                raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}") from err
        module, attribute = source
        value = importlib.import_module(module)
        if attribute is not None:
            value = getattr(value, attribute)
        setattr(self, name, value)
        return value

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self.__lazy_sources__))


def install() -> bool:
    """Register the lazy packages unless the library is missing or already imported; whether they are in place."""
    if PACKAGES[0] in sys.modules:
        return isinstance(sys.modules[PACKAGES[0]], LazyPackage)
    for name in PACKAGES:
        spec = importlib.util.find_spec(name)  # a parent is already registered: nothing runs
        if spec is None or spec.origin is None:
            for registered in PACKAGES[:PACKAGES.index(name)]:
                sys.modules.pop(registered, None)
            return False
        package = LazyPackage(name, spec, Path(spec.origin).read_text(encoding="utf-8"))
        sys.modules[name] = package
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, package)
    return True
