"""Fatal-XID actions remembered on the node (pure): an operator restarted while the exporter still shows the XID it
acted on must not cordon the node or replace pods again.

dcgm-exporter's gauge holds each GPU's *last* XID and no time, so the identity of a fatal XID event is its GPU and
code: the same code still showing on the same GPU is the event already handled. When the monitor acts on a
NodeFault it writes the node annotation `flywheel.dev/xid-handled` ("<gpu>=<code>,..."); a fatal code that this
monitor process has no memory of for that GPU (its first answer, or a series back after an exporter restart) is
checked against it. A code the running process saw change is a new event whatever the annotation says.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from flywheel.policy.xid import GpuKey, NodeFault, WatchedPod, XidClass, XidEvent, XidSample, classify_xid, same_node

HandledXids = Mapping[str, Mapping[str, int]]  # node name -> gpu -> the fatal code acted on


def parse_handled(value: str | None) -> dict[str, int]:
    """The annotation's value as gpu -> code; malformed entries are skipped (a hand-edited annotation)."""
    handled: dict[str, int] = {}
    for entry in (value or "").split(","):
        gpu, sep, code = entry.strip().rpartition("=")
        if sep and gpu and code.isdigit():
            handled[gpu] = int(code)
    return handled


def format_handled(handled: Mapping[str, int]) -> str:
    return ",".join(f"{gpu}={code}" for gpu, code in sorted(handled.items()))


def after_fault(handled: Mapping[str, int], fault: NodeFault) -> dict[str, int]:
    """The node's memory once `fault` was acted on."""
    return {**handled, **dict(fault.gpus)}


def _unknown_fatal(previous: Mapping[GpuKey, int] | None, samples: Iterable[XidSample]) -> list[XidSample]:
    return [s for s in samples if classify_xid(s.code) is XidClass.FATAL
            and (previous is None or (s.node, s.gpu) not in previous)]


def nodes_to_check(previous: Mapping[GpuKey, int] | None, samples: Iterable[XidSample],
                   pods: Sequence[WatchedPod]) -> list[str]:
    """The nodes whose memory the evaluation needs: those with a fatal code this process has no memory of, by
    their Kubernetes name when a pod runs there (the exporter may report the FQDN)."""
    names = {next((p.node for p in pods if p.node and same_node(p.node, s.node)), s.node)
             for s in _unknown_fatal(previous, samples)}
    return sorted(names)


def already_handled(event: XidEvent, previous: Mapping[GpuKey, int] | None, handled: HandledXids) -> bool:
    """Whether `event` is a fatal XID some monitor already acted on (see the module docstring)."""
    sample = event.sample
    if not _unknown_fatal(previous, [sample]):
        return False
    return any(same_node(node, sample.node) and gpus.get(sample.gpu) == sample.code for node, gpus in handled.items())
