"""GPU XID errors -> what to do (pure). Codes and classes below; the table with the actions is in docs/monitoring.md.

dcgm-exporter's `DCGM_FI_DEV_XID_ERRORS` is a per-GPU gauge holding the *last* XID seen, named again in its
`err_code` label. A series that stays put is an old event, not a new one: decisions are taken on changes between
evaluations (a GPU whose code is new or different), never on the level, so a GPU that keeps reporting the same
non-fatal XID -- or a hundred different non-fatal ones -- never drains a node.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

FATAL_XIDS = frozenset({46, 48, 62, 64, 74, 79, 95, 119, 120, 140})  # hardware/driver state lost: drain the node
APP_XIDS = frozenset({13, 31, 43, 45, 94})  # the application's context failed: restarting its ranks is enough
IGNORED_XIDS = frozenset({63, 92})  # ECC page retirement / high single-bit ECC rate: informational

TERMINAL_POD_PHASES = frozenset({"Succeeded", "Failed"})


class XidClass(str, Enum):
    FATAL = "Fatal"
    APP = "AppLevel"
    IGNORED = "Ignored"
    UNKNOWN = "Unknown"


def classify_xid(code: int) -> XidClass:
    if code in FATAL_XIDS:
        return XidClass.FATAL
    if code in APP_XIDS:
        return XidClass.APP
    if code in IGNORED_XIDS:
        return XidClass.IGNORED
    return XidClass.UNKNOWN


@dataclass(frozen=True)
class WatchedPod:
    """A job's pod as the executor sees it. `started_at` is when it began Running (unix seconds), if it has;
    `ranks_restarted_at` when its agent last restarted its ranks in place (its etcd liveness key; 0: never or not
    known): a new process of each rank, in its start-up and restore, in the same pod."""

    name: str
    namespace: str
    job: str
    replica: str
    node: str
    phase: str
    started_at: float | None = None
    ranks_restarted_at: float = 0.0


@dataclass(frozen=True)
class XidSample:
    """One `DCGM_FI_DEV_XID_ERRORS` series: the last XID `code` of one GPU; `pod`/`namespace` use the GPU."""

    node: str
    gpu: str  # the GPU's UUID when exported, else its index
    code: int
    pod: str | None = None
    namespace: str | None = None


@dataclass(frozen=True)
class XidEvent:
    """A GPU whose last XID is new since the previous evaluation."""

    sample: XidSample
    xid_class: XidClass


@dataclass(frozen=True)
class NodeFault:
    """Fatal XIDs on `node`: cordon it (when allowed) and replace the job pods it hosts."""

    node: str
    codes: tuple[int, ...]
    pods: tuple[WatchedPod, ...]
    cordon: bool
    gpus: tuple[tuple[str, int], ...] = ()  # (gpu, code) of each fatal XID: remembered on the node (xid_memory.py)

    @property
    def message(self) -> str:
        names = ", ".join(f"{p.namespace}/{p.name}" for p in self.pods)
        return f"fatal GPU XID {'/'.join(map(str, self.codes))} on node {self.node}; replacing {names}"


@dataclass(frozen=True)
class RankRestart:
    """App-level XIDs on the GPUs of `pods` (one job): restart those ranks, the node stays in service."""

    namespace: str
    job: str
    pods: tuple[str, ...]
    codes: tuple[int, ...]

    @property
    def message(self) -> str:
        return (f"app-level GPU XID {'/'.join(map(str, self.codes))} on {', '.join(self.pods)}; "
                "restarting the affected ranks")


@dataclass(frozen=True)
class XidDecisions:
    node_faults: tuple[NodeFault, ...] = ()
    rank_restarts: tuple[RankRestart, ...] = ()
    notices: tuple[XidEvent, ...] = ()  # ignored and unknown codes, and events on nodes without job pods: log only
    # (namespace, pod) -> time of its last app-XID restart, for the cooldown; carried to the next evaluation
    restarted_at: Mapping[tuple[str, str], float] = field(default_factory=dict)


GpuKey = tuple[str, str]  # (node, gpu)


def xid_events(previous: Mapping[GpuKey, int] | None,
               samples: Iterable[XidSample]) -> tuple[list[XidEvent], dict[GpuKey, int]]:
    """The GPUs whose last XID changed since `previous`, and the memory for the next evaluation.

    `previous is None` is the first evaluation (e.g. after an operator restart): the codes already present are old
    news, except fatal ones -- a node with a fatal XID must not keep hosting job pods whoever saw it first.
    Code 0 ("No Error") is never an event.
    """
    memory: dict[GpuKey, int] = {}
    events = []
    for sample in samples:
        key = (sample.node, sample.gpu)
        memory[key] = sample.code
        if sample.code == 0:
            continue
        xid_class = classify_xid(sample.code)
        if previous is None:
            if xid_class is XidClass.FATAL:
                events.append(XidEvent(sample, xid_class))
        elif previous.get(key) != sample.code:
            events.append(XidEvent(sample, xid_class))
    return events, memory


def same_node(a: str, b: str) -> bool:
    """dcgm-exporter reports the host name, which may be the node name or its FQDN."""
    return a == b or a.split(".", 1)[0] == b.split(".", 1)[0]


def _live_pods_on(node: str, pods: Sequence[WatchedPod]) -> list[WatchedPod]:
    return [p for p in pods if p.node and same_node(p.node, node) and p.phase not in TERMINAL_POD_PHASES]


def decide_xids(events: Sequence[XidEvent], pods: Sequence[WatchedPod], *, cordon: bool, now: float,
                restart_cooldown_seconds: float,
                restarted_at: Mapping[tuple[str, str], float]) -> XidDecisions:
    """Turn XID events into actions on job pods.

    Fatal: one NodeFault per node that hosts job pods. App-level: restart the pod using the GPU (the exporter's
    pod label) when it is a job pod, else the job pods on that node; a pod is restarted at most once per
    `restart_cooldown_seconds` (bursts of app XIDs are one failure, not many). Everything else is a notice.
    """
    fatal: dict[str, tuple[set[int], list[WatchedPod], dict[str, int]]] = {}
    app: dict[tuple[str, str], tuple[set[int], dict[str, WatchedPod]]] = {}
    notices: list[XidEvent] = []
    cooled = {key: t for key, t in restarted_at.items() if now - t < restart_cooldown_seconds}
    for event in events:
        sample = event.sample
        on_node = _live_pods_on(sample.node, pods)
        if event.xid_class is XidClass.FATAL and on_node:
            codes, _, gpus = fatal.setdefault(on_node[0].node, (set(), on_node, {}))
            codes.add(sample.code)
            gpus[sample.gpu] = sample.code
        elif event.xid_class is XidClass.APP and on_node:
            users = [p for p in on_node if p.name == sample.pod and sample.namespace in (p.namespace, None)]
            for pod in users or on_node:
                if now - cooled.get((pod.namespace, pod.name), float("-inf")) < restart_cooldown_seconds:
                    continue
                codes, chosen = app.setdefault((pod.namespace, pod.job), (set(), {}))
                codes.add(sample.code)
                chosen[pod.name] = pod
        else:
            notices.append(event)
    faults = tuple(NodeFault(node, tuple(sorted(codes)), tuple(sorted(on_node, key=lambda p: (p.namespace, p.name))),
                             cordon, tuple(sorted(gpus.items())))
                   for node, (codes, on_node, gpus) in sorted(fatal.items()))
    # A pod being replaced for a fatal XID is not also restarted for an app-level one.
    replaced = {(p.namespace, p.name) for f in faults for p in f.pods}
    restarts = []
    for (namespace, job), (codes, chosen) in sorted(app.items()):
        names = tuple(sorted(n for n in chosen if (namespace, n) not in replaced))
        if names:
            cooled.update({(namespace, n): now for n in names})
            restarts.append(RankRestart(namespace, job, names, tuple(sorted(codes))))
    return XidDecisions(faults, tuple(restarts), tuple(notices), cooled)
