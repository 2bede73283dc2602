"""Warm starts for a user's Python command: which rank commands a zygote (warm.py) can start, and what it imports for
them before the first fork. Pure: reads the entry's source, imports nothing.

A rank command `python [-u] script.py ARGS` or `python [-u] -m package.module ARGS` (launch_settings.rank_command:
a bare `script.py` runs under this interpreter with -u) runs in a rank forked by the zygote as that interpreter
would run it. The zygote first runs the entry file's own top-level import statements (those naming third-party
packages: `import torch`, `from transformers import Trainer`, ...), so a restarted rank skips those seconds; imports
of the script's own folder or package are left to the rank (user code may read the rank's environment at import
time, which the zygote does not have). Any other command starts cold.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PythonEntry:
    """What a rank command runs under this interpreter: a script file or a module, with its arguments."""

    script: str | None
    module: str | None
    args: tuple[str, ...]
    unbuffered: bool = False  # `-u`: the ranks get PYTHONUNBUFFERED instead, warm or cold

    @property
    def target(self) -> dict[str, str]:
        """The warm client's request key (warm.run)."""
        return {"script": self.script} if self.script is not None else {"module": str(self.module)}


def python_entry(command: Sequence[str], interpreter: str = sys.executable) -> PythonEntry | None:
    """The entry of `interpreter [-u] script.py ...` or `interpreter [-u] -m module ...`; None for anything else
    (another program, other interpreter options, `-c`)."""
    if not command or command[0] != interpreter:
        return None
    rest = list(command[1:])
    unbuffered = False
    while rest and rest[0] == "-u":
        rest.pop(0)
        unbuffered = True
    if len(rest) >= 2 and rest[0] == "-m" and not rest[1].startswith("-"):
        return PythonEntry(None, rest[1], tuple(rest[2:]), unbuffered)
    if rest and rest[0].endswith(".py") and not rest[0].startswith("-"):
        return PythonEntry(rest[0], None, tuple(rest[1:]), unbuffered)
    return None


def entry_source(entry: PythonEntry, cwd: str) -> tuple[str, str] | None:
    """(path of the entry's file, the folder its own code lives in), or None when it cannot be found without
    running anything (a package or a module inside one: finding it would import the package)."""
    if entry.script is not None:
        path = os.path.join(cwd, entry.script)
        return (path, os.path.dirname(os.path.abspath(path))) if os.path.isfile(path) else None
    name = str(entry.module)
    if "." in name:
        return None
    spec = importlib.machinery.PathFinder.find_spec(name, [cwd, *sys.path[1:]])
    if spec is None or spec.submodule_search_locations or not (spec.origin or "").endswith(".py"):
        return None  # a package runs its __main__, which is found only by importing the package
    return str(spec.origin), os.path.dirname(str(spec.origin))


def preload_code(entry: PythonEntry, cwd: str) -> str:
    """The entry's top-level import statements of packages outside its own folder, one a line, for the zygote."""
    found = entry_source(entry, cwd)
    if found is None:
        return ""
    path, own_folder = found
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return ""  # the rank reports what is wrong with it
    return "\n".join(ast.unparse(node) for node in _top_level_imports(tree.body)
                     if not any(_is_own(name, own_folder) for name in _imported_modules(node)))


def _top_level_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements run when the module runs: at top level, or in a top-level try block (`try: import x`)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.Try):
            yield from (n for n in node.body if isinstance(n, (ast.Import, ast.ImportFrom)))


def _imported_modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level or node.module is None or node.module == "__future__":
        return [""]  # relative (the entry's own package) or a compiler directive: never preloaded
    return [node.module]


def _is_own(module: str, own_folder: str) -> bool:
    """Whether `module` is the user's own code: found in the entry's folder (or relative)."""
    if not module:
        return True
    top = module.split(".")[0]
    spec = importlib.machinery.PathFinder.find_spec(top, [own_folder])
    return spec is not None
