"""The planner's hardware table: one entry per device kind, with the links between ranks of one worker and between
workers. Users override or add entries from a YAML/JSON mapping (`flywheel plan --devices FILE`), e.g.

    h100: {memoryBytes: 85899345920, interNode: {bandwidthBytesPerSecond: 25.0e9}}
    mygpu: {base: a100, peakFlops: {bf16: 400.0e12}}

Figures are per rank: a GPU, or one CPU core running one rank (the trainer runs one intra-op thread per rank).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class Link:
    """A link tier as collectives see it: bus bandwidth per rank and per-collective latency."""

    bandwidth_bytes_per_second: float
    latency_seconds: float


@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: Mapping[str, float]  # per precision ("fp32", "bf16") for dense matmuls
    memory_bytes: float  # what one rank may use
    efficiency: float  # achievable fraction of peak on large matmuls (the model FLOPs utilisation ceiling)
    runtime_bytes: float  # framework/runtime memory a rank holds besides tensors (CUDA context, allocator, libs)
    comm_overlap: float  # fraction of data-parallel traffic hidden behind backward compute
    half_efficiency_tokens: float  # tokens per micro batch at which matmuls reach half the achievable rate
    sharding_overhead: float  # FSDP2's extra compute-side time (copy-in/out, DTensor dispatch) as a fraction
    intra_node: Link  # between ranks of one worker (NVLink, shared memory)
    inter_node: Link  # between workers (InfiniBand, Ethernet)
    source: str = field(default="built-in", compare=False)

    def flops(self, precision: str) -> float:
        return self.peak_flops.get(precision) or self.peak_flops["fp32"]


# Peak dense figures from the vendors' data sheets (A100/H100/H200 SXM, no sparsity; fp32 without TF32 since the
# trainer leaves TF32 off). CPU: one core of this project's 2-core test VM, where a 6-layer GPT trains under DDP at
# ~117 GFLOP/s on one thread, larger micro batches gain nothing past ~1k tokens and FSDP2 over gloo costs ~15% more
# than DDP besides its traffic (bench/planner_accuracy.py); gloo over loopback moves ~1-2 GB/s. GPUs: FSDP2's
# copy-in/out is a few percent. Inter-node GPU links:
# 8x400 Gb/s InfiniBand per 8-GPU H100/H200 node (50 GB/s per GPU), 8x200 Gb/s for A100. GPU memory is what
# torch.cuda.get_device_properties().total_memory reports (the driver keeps the rest of the data sheet's 80 / 141 GB):
# H100 80GB HBM3 81,089 MiB and H200 143,156 MiB in public logs (nvidia-smi showed 143,771 MiB on the H200 lent to
# this project, which includes the driver's share), A100 80GB ~79.2 GiB; the CUDA context is inside it (runtime).
DEVICES: dict[str, Device] = {
    "cpu": Device("cpu", {"fp32": 150e9, "bf16": 75e9}, 8 * GIB, 0.78, 0.35 * GIB, 0.0, 8, 0.15,
                  Link(1.5e9, 100e-6), Link(1.0e9, 200e-6)),
    "a100": Device("a100", {"fp32": 19.5e12, "bf16": 312e12}, 79.2 * GIB, 0.55, 2 * GIB, 0.6, 512, 0.03,
                   Link(240e9, 10e-6), Link(25e9, 20e-6)),
    "h100": Device("h100", {"fp32": 67e12, "bf16": 989e12}, 81089 * MIB, 0.5, 2 * GIB, 0.6, 512, 0.03,
                   Link(360e9, 8e-6), Link(50e9, 15e-6)),
    "h200": Device("h200", {"fp32": 67e12, "bf16": 989e12}, 143156 * MIB, 0.5, 2 * GIB, 0.6, 512, 0.03,
                   Link(360e9, 8e-6), Link(50e9, 15e-6)),
}

_SCALARS = {"memoryBytes": "memory_bytes", "efficiency": "efficiency", "runtimeBytes": "runtime_bytes",
            "commOverlap": "comm_overlap", "halfEfficiencyTokens": "half_efficiency_tokens",
            "shardingOverhead": "sharding_overhead"}
_LINKS = {"intraNode": "intra_node", "interNode": "inter_node"}
_LINK_FIELDS = {"bandwidthBytesPerSecond": "bandwidth_bytes_per_second", "latencySeconds": "latency_seconds"}


class DeviceTableError(ValueError):
    """A device override that cannot be used; the message names the entry and field."""


def device_table(overrides: Mapping[str, Any] | None = None, source: str = "overrides") -> dict[str, Device]:
    """The built-in table with `overrides` applied: a known name changes only the fields given; a new name must say
    `base: <known device>` to inherit the rest."""
    table = dict(DEVICES)
    for name, entry in (overrides or {}).items():
        if not isinstance(entry, Mapping):
            raise DeviceTableError(f"devices.{name}: expected a mapping of fields, got {type(entry).__name__}")
        base_name = entry.get("base", name)
        if base_name not in table:
            raise DeviceTableError(f"devices.{name}: unknown device; add `base: <one of {', '.join(table)}>` to "
                                   "inherit the fields you do not give")
        table[name] = _apply(table[base_name], name, entry, source)
    return table


def _apply(base: Device, name: str, entry: Mapping[str, Any], source: str) -> Device:
    changes: dict[str, Any] = {"name": name, "source": source}
    known = {"base", "peakFlops", *_SCALARS, *_LINKS}
    unknown = sorted(set(entry) - known)
    if unknown:
        raise DeviceTableError(f"devices.{name}.{unknown[0]}: unknown field; use {', '.join(sorted(known))}")
    if "peakFlops" in entry:
        flops = entry["peakFlops"]
        if not isinstance(flops, Mapping):
            raise DeviceTableError(f"devices.{name}.peakFlops: expected {{fp32: FLOP/s, bf16: FLOP/s}}")
        changes["peak_flops"] = {**base.peak_flops, **{k: _positive(v, f"devices.{name}.peakFlops.{k}")
                                                      for k, v in flops.items()}}
    for key, attr in _SCALARS.items():
        if key in entry:
            value = _positive(entry[key], f"devices.{name}.{key}")
            if attr in ("efficiency", "comm_overlap") and value > 1:
                raise DeviceTableError(f"devices.{name}.{key}: {value} is a fraction; give a value in (0, 1]")
            changes[attr] = value
    for key, attr in _LINKS.items():
        if key in entry:
            link_entry = entry[key]
            if not isinstance(link_entry, Mapping):
                raise DeviceTableError(f"devices.{name}.{key}: expected {{bandwidthBytesPerSecond, latencySeconds}}")
            link = getattr(base, attr)
            link_changes = {}
            for lk, la in _LINK_FIELDS.items():
                if lk in link_entry:
                    link_changes[la] = _positive(link_entry[lk], f"devices.{name}.{key}.{lk}", zero_ok=True)
            changes[attr] = replace(link, **link_changes)
    return replace(base, **changes)


def _positive(value: Any, where: str, zero_ok: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DeviceTableError(f"{where}: expected a number, got {value!r}")
    if value < 0 or (value == 0 and not zero_ok):
        raise DeviceTableError(f"{where}: must be {'>= 0' if zero_ok else '> 0'}, got {value}")
    return float(value)
