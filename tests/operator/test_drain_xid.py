"""A fatal GPU XID on a Running job's worker node is drained ahead (health_executor.py -> the findings inbox ->
policy/drain.py) instead of the monitor deleting the pods at once; other jobs keep the old path."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flywheel.monitor.findings import FindingsInbox
from flywheel.operator.health_executor import KubeHealthActions
from flywheel.policy.xid import NodeFault, WatchedPod


class FakeKube:
    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.events: list[tuple[Any, ...]] = []

    async def merge_patch(self, path: str, body: Any) -> dict[str, Any]:
        return {}

    async def delete(self, path: str, *args: Any) -> None:
        self.deleted.append(path.rsplit("/", 1)[1])

    async def post_event(self, obj: Any, *args: Any) -> None:
        self.events.append(args)


class Reads:
    async def job(self, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": namespace}}


class Inventory:
    def __init__(self, phase: str) -> None:
        self.phases, self.reads = {("ml", "j"): phase}, Reads()


POD = WatchedPod("j-worker-1", "ml", "j", "1", "gpu-3", "Running", 0.0)
FAULT = NodeFault("gpu-3", (79,), (POD,), cordon=True)


@pytest.mark.parametrize("phase, drained", [("Running", True), ("Restarting", False)])
def test_a_running_jobs_fatal_xid_goes_to_its_inbox_not_to_a_delete(phase: str, drained: bool) -> None:
    kube, inbox = FakeKube(), FindingsInbox()
    actions = KubeHealthActions(kube, Inventory(phase), lambda ns, name: inbox)  # type: ignore[arg-type]
    seen: list[tuple[tuple[str, str], ...]] = []

    async def runner_pass() -> None:  # what the job's pass does: read the inbox, write its status, consume
        while not inbox.snapshot().node_faults:
            await asyncio.sleep(0.01)
        findings = inbox.snapshot()
        seen.append(findings.node_faults)
        inbox.consumed(findings)

    async def both() -> None:
        runner = asyncio.create_task(runner_pass())
        await actions.replace_pods([POD], FAULT)
        if not drained:
            runner.cancel()

    asyncio.run(both())
    if drained:
        assert kube.deleted == [] and seen == [(("gpu-3", FAULT.message),)]
    else:
        assert kube.deleted == ["j-worker-1"] and seen == []
    assert [e[1] for e in kube.events] == ["GPUFatalXid"]


def test_a_drain_no_pass_takes_in_is_not_handed_over() -> None:
    """The runner never wrote the drain (it died, or is stuck): replace_pods raises, so the monitor does not
    remember the fault as handled and raises it again (health_loop.py)."""
    kube, inbox = FakeKube(), FindingsInbox()
    actions = KubeHealthActions(kube, Inventory("Running"), lambda ns, name: inbox)  # type: ignore[arg-type]
    actions.handover_timeout = 0.2
    with pytest.raises(TimeoutError, match="not taken in"):
        asyncio.run(actions.replace_pods([POD], FAULT))


def test_a_node_fault_is_consumed_by_the_pass_that_read_it() -> None:
    inbox = FindingsInbox()
    inbox.report_node_fault("gpu-3", "XID 79")
    seen = inbox.snapshot()
    inbox.report_hang("stuck", 0)  # a later finding survives the consumption
    inbox.consumed(seen)
    after = inbox.snapshot()
    assert after.node_faults == () and after.hang is not None and after.hang.message == "stuck"
