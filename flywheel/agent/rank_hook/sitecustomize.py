"""On a user command's PYTHONPATH (put there by `flywheel launch`): an uncaught exception's type and last message
line go to the worker's termination message (flywheel/contracts/termination_log.py) before Python prints the
traceback, so that a script failing on an import says so in the job's status. Then the image's own sitecustomize,
if there is one, runs as it would have."""

import importlib.machinery
import importlib.util
import os
import sys
from types import TracebackType

_previous_hook = sys.excepthook


def _write_reason(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    try:
        from flywheel.contracts import termination_log

        termination_log.write_reason(termination_log.exception_reason(value))
    except Exception:  # noqa: BLE001 - reporting must never change how the script fails
        pass
    _previous_hook(kind, value, tb)


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


sys.excepthook = _write_reason
_chain()
