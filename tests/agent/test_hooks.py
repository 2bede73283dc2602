"""The agent's hook sets (agent/hooks.py): called in the order added, a removed one no more, one that raises
logged and skipped so the rest still run, but a signal's exception propagates."""

from __future__ import annotations

import logging

import pytest

from flywheel.agent.hooks import AgentHooks


def test_hooks_run_in_order_and_a_failing_one_is_skipped(caplog: pytest.LogCaptureFixture) -> None:
    hooks: AgentHooks[object] = AgentHooks("test hook")

    def broken() -> int:
        raise RuntimeError("etcd unreachable")

    def first() -> int:
        return 1

    def last() -> int:
        return 3

    for hook in (first, broken, last):
        hooks.add(hook)
    with caplog.at_level(logging.WARNING):
        assert list(hooks.each(lambda hook: hook())) == [1, 3]  # type: ignore[operator]
    assert "test hook failed: etcd unreachable" in caplog.text
    hooks.remove(first)
    hooks.remove(first)  # removing twice (a handler released twice) is no error
    assert list(hooks.each(lambda hook: hook())) == [3]  # type: ignore[operator]


def test_a_signal_in_a_hook_stops_the_agent_instead_of_being_skipped() -> None:
    """torch's agent turns SIGTERM into SignalException wherever it lands: in a hook (a drain-request read), it must
    reach the agent, which then stops (the moved worker's pod is being deleted)."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    hooks: AgentHooks[object] = AgentHooks("drain request reader")

    def interrupted() -> int:
        raise SignalException("Process 1 got signal: 15", sigval=signal.SIGTERM)

    hooks.add(interrupted)
    with pytest.raises(SignalException):
        list(hooks.each(lambda hook: hook()))  # type: ignore[operator]
