"""Checks that hold for every test, whichever process runs it (`make test` runs two, pytest-xdist), what the
run prints as it goes, and the cost markers no test has to remember: `cluster` on every test that starts the test
cluster, `gpu` on every test that skips without CUDA or a GPU."""

from __future__ import annotations

import inspect
import re
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from flywheel.trainer.ft import watchdog


@pytest.fixture(autouse=True)
def _no_progress_watchdog_left_running() -> Iterator[None]:
    """A trainer's progress watchdog still running after its test ends os._exit()s the test process once its
    allowance (600 s by default) runs out, in the middle of some later test."""
    yield
    left = [t for t in threading.enumerate() if t.name == watchdog.THREAD_NAME and t.is_alive()]
    assert not left, "a ProgressWatchdog was left running (stop it on every way out of what started it)"


# A test this slow is named as it ends, so that a run cut short by CI's time limit still says where the time went.
SLOW_TEST_SECONDS = 90.0
_config: list[pytest.Config] = []


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the process that prints (xdist's controller, or the only one)
        _config.append(config)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Failures and slow tests, named when they happen: `-q` prints one character per test until the end."""
    reporter = _config[0].pluginmanager.get_plugin("terminalreporter") if _config else None
    if reporter is None:
        return
    if report.failed:
        reporter.write_line(f"\nFAILED ({report.when}, {report.duration:.0f} s) {report.nodeid}")
    elif report.when == "call" and report.duration >= SLOW_TEST_SECONDS:
        reporter.write_line(f"\nslow ({report.duration:.0f} s) {report.nodeid}")


# What starts the test cluster (the control plane, its etcd and the process kubelet; docs/test-cluster.md), by the
# qualified name of the function or class called: a test that reaches one of these from its own body or from one of
# its fixtures (at most _DEPTH calls down through the tests' own helpers), or runs `python -m tests.cluster`, gets the
# `cluster` marker. A test whose subprocess starts one some other way (a bench on the test cluster) says so itself.
CLUSTER_STARTERS = frozenset({"tests.cluster.fixtures.start_cluster", "tests.cluster.cluster.TestCluster",
                              "tests.e2e_real.local_cluster.bring_up"})
CLUSTER_MODULE = "tests.cluster"  # `python -m tests.cluster up` in a subprocess
_DEPTH = 3
_GPU_REASON = re.compile(r"\b(CUDA|GPUs?)\b")
_starts: dict[Any, bool] = {}


def _names(code: types.CodeType) -> Iterator[str]:
    """The global and attribute names a function's code uses, its nested functions' included."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _strings(code: types.CodeType) -> Iterator[str]:
    for const in code.co_consts:
        if isinstance(const, str):
            yield const
        elif isinstance(const, types.CodeType):
            yield from _strings(const)


def _called(func: Callable[..., Any]) -> list[Any]:
    """What of the tests' own `func` can call by name: its globals, the attributes it takes of modules
    (`local_cluster.bring_up`), and what it imports inside its body."""
    names = set(_names(func.__code__))
    found: list[Any] = []
    for name in names:
        obj = func.__globals__.get(name, sys.modules.get(name))
        if isinstance(obj, types.ModuleType) and obj.__name__.startswith("tests."):
            found += [getattr(obj, attr) for attr in names if hasattr(obj, attr)]
        else:
            found.append(obj)
    return [obj for obj in found if (inspect.isfunction(obj) or inspect.isclass(obj))
            and obj.__module__.startswith("tests.")]


def _starts_cluster(func: Any, depth: int = _DEPTH) -> bool:
    func = inspect.unwrap(func)
    if not inspect.isfunction(func):
        return False
    if func not in _starts:
        _starts[func] = False  # a helper that calls itself back
        called = _called(func)
        _starts[func] = (CLUSTER_MODULE in _strings(func.__code__)
                         or any(f"{obj.__module__}.{obj.__qualname__}" in CLUSTER_STARTERS for obj in called)
                         or (depth > 0 and any(_starts_cluster(obj, depth - 1) for obj in called)))
    return _starts[func]


@pytest.hookimpl(tryfirst=True)  # before `-m` selects on the markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
        funcs = [getattr(item, "function", None)] + [defs[-1].func for defs in fixtures.values() if defs]
        if "cluster" not in item.keywords and any(_starts_cluster(f) for f in funcs if f is not None):
            item.add_marker(pytest.mark.cluster)
        if "gpu" not in item.keywords and any(
                _GPU_REASON.search(str(mark.kwargs.get("reason", ""))) for mark in item.iter_markers("skipif")):
            item.add_marker(pytest.mark.gpu)
    _costly_files_first(items)


def _costly_files_first(items: list[pytest.Item]) -> None:
    """Files with a test-cluster test first, then those with a slow test, then the rest, each in collection order:
    xdist's --dist loadfile hands out files in this order, so the last minutes go to short files on both processes
    rather than to one long file on one of them while the other waits."""
    cost: dict[str, int] = {}
    for item in items:
        rank = 0 if "cluster" in item.keywords else 1 if "slow" in item.keywords else 2
        cost[item.path.as_posix()] = min(cost.get(item.path.as_posix(), 2), rank)
    items.sort(key=lambda item: cost[item.path.as_posix()])  # stable: a file's tests keep their order
