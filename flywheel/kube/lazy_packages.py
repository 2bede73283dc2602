"""kubernetes_asyncio's packages, imported lazily: a name is imported when it is first used.

The library's package `__init__` files import everything they export: ~830 generated model and API modules, ~39 MB
of the operator's memory (its RSS goal is 200 MB at 500 jobs), of which the product uses the ApiClient, its
Configuration and kubeconfig loader, and kopf two model classes (V1ObjectMeta, V1OwnerReference, for its
isinstance checks). `install()` registers, before anything imports the library, a module for each of those packages
that reads its real `__init__` (parsed, not run: its `from X import Y`, `import X as Y`, `__version__`, `__all__`)
and imports Y from X on first access; submodules import from the package's folder as usual. Every exported name
stays reachable, and `import *` gets what the real package's `__all__` lists (tests/kube/test_lazy_packages.py;
a package without `__all__` gives the names used so far).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

# The packages whose __init__ imports what the product does not use, parents first.
PACKAGES = ("kubernetes_asyncio", "kubernetes_asyncio.client", "kubernetes_asyncio.client.models",
            "kubernetes_asyncio.client.api")


class LazyPackage(types.ModuleType):
    """A package whose exported names are imported on first access (from its real __init__'s import lines)."""

    def __init__(self, name: str, spec: Any, init_source: str) -> None:
        super().__init__(name)
        self.__spec__, self.__path__ = spec, list(spec.submodule_search_locations or [])
        self.__file__, self.__package__ = spec.origin, name
        self.__lazy_sources__: dict[str, tuple[str, str | None]] = {}  # name -> (module, attribute; None: module)
        for node in ast.parse(init_source).body:  # the top-level statements, read and not run
            if isinstance(node, ast.ImportFrom) and node.module and node.module != "__future__":
                module = importlib.util.resolve_name("." * node.level + node.module, name) if node.level else \
                    node.module
                for alias in node.names:
                    self.__lazy_sources__[alias.asname or alias.name] = (module, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.__lazy_sources__[alias.asname] = (alias.name, None)
            elif isinstance(node, ast.Assign) and isinstance(node.value, (ast.Constant, ast.List, ast.Tuple)):
                for target in node.targets:  # __version__, __all__ (a star import gets what the real one gets)
                    if isinstance(target, ast.Name) and target.id.startswith("__"):
                        try:
                            setattr(self, target.id, ast.literal_eval(node.value))
                        except ValueError:  # not a literal (e.g. a list of names): left out
                            pass

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
