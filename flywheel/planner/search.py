"""The layout search: every (dp, tp, pp, ep, micro batch, FSDP/ZeRO stage, activation checkpointing) the model and
the world size allow, estimated with cost.py. ep (MoE models) ranges over the divisors of dp that divide the
experts, with FSDP and pp = 1, as the trainer runs it. Among the layouts that fit, those within NEAR_TIE of the fastest estimate
count as equally fast (the cost model is not finer than that); of those the one closest to the spec's own layout
wins, then the least memory. So a job keeps its layout unless another is clearly faster.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from flywheel.planner.cost import Batch, Estimate, Layout, ModelShape, estimate
from flywheel.planner.devices import GIB, Device
from flywheel.spec import PRESETS, TrainingJobSpec


NEAR_TIE = 0.02  # estimated step times this close are a tie (bench/planner_accuracy.py: time errors of 1-20%)


class PlanError(ValueError):
    """No layout fits or the job cannot be split; the message says what to change."""


@dataclass(frozen=True)
class PlanResult:
    device: Device
    world_size: int
    ranks_per_worker: int
    chosen: Estimate
    candidates: list[Estimate]  # all that fit, fastest first
    rejected_for_memory: int

    def to_json(self, top: int) -> dict[str, object]:
        return {"device": self.device.name, "worldSize": self.world_size, "ranksPerWorker": self.ranks_per_worker,
                "chosen": estimate_json(self.chosen),
                "candidates": [estimate_json(e) for e in self.candidates[:top]],
                "rejectedForMemory": self.rejected_for_memory}


def estimate_json(e: Estimate) -> dict[str, object]:
    lay = e.layout
    return {"dp": lay.dp, "tp": lay.tp, "pp": lay.pp, "ep": lay.ep, "microBatch": lay.micro_batch,
            "microbatches": e.microbatches,
            "fsdp": lay.fsdp, "zero": lay.zero if lay.fsdp else None,
            "activationCheckpointing": lay.activation_checkpointing, "est_step_seconds": round(e.step_seconds, 6),
            "est_memory_bytes": int(e.memory_bytes), "est_compute_seconds": round(e.compute_seconds, 6),
            "est_communication_seconds": round(e.communication_seconds, 6),
            "bubble_fraction": round(e.bubble_fraction, 4)}


def shape_of(spec: TrainingJobSpec) -> ModelShape:
    m = spec.trainer.model
    preset = PRESETS.get(m.preset or "", {})

    def pick(value: int | None, key: str) -> int:
        chosen = value if value is not None else preset.get(key)
        if chosen is None:
            raise PlanError(f"trainer.model.{key}: not set and no preset gives it")
        return chosen

    moe = {"experts": m.moe.experts, "top_k": m.moe.top_k, "moe_every": m.moe.every} if m.moe else {}
    return ModelShape(layers=pick(m.layers, "layers"), dim=pick(m.dim, "dim"), heads=pick(m.heads, "heads"),
                      vocab=pick(m.vocab, "vocab"), seq_len=pick(m.seq_len, "seqLen"), **moe)


def layouts(shape: ModelShape, global_batch: int, world_size: int, *, runnable_only: bool = False,
            micro_batches: tuple[int, ...] | None = None, ep_limit: int | None = None) -> Iterator[Layout]:
    """Every layout the model allows: tp divides the heads, pp the layers, dp x microBatch the global batch; tp
    needs FSDP (DDP cannot replicate tensor-parallel parameters). An MoE model runs with pp = 1 and ep a divisor
    of dp and of the experts (and of `ep_limit` when given), with FSDP above 1. `runnable_only` keeps what the
    `auto` resolution hands the worker loop (tp = pp = 1)."""
    for tp in _divisors(world_size):
        if shape.heads % tp or (runnable_only and tp > 1):
            continue
        for pp in _divisors(world_size // tp):
            if shape.layers % pp or ((runnable_only or shape.experts) and pp > 1):
                continue
            dp = world_size // (tp * pp)
            if global_batch % dp:
                continue
            eps = [ep for ep in _divisors(dp) if shape.experts % ep == 0 and (ep_limit or ep) % ep == 0]
            for ep in eps if shape.experts else [1]:
                for mb in micro_batches or _divisors(global_batch // dp):
                    if (global_batch // dp) % mb:
                        continue
                    for fsdp, zero in ((False, 3), (True, 3), (True, 2)):
                        if (tp > 1 or ep > 1) and not fsdp:
                            continue
                        for ac in (False, True):
                            yield Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, fsdp=fsdp, zero=zero,
                                         activation_checkpointing=ac, ep=ep)


def plan_layout(shape: ModelShape, batch: Batch, world_size: int, ranks_per_worker: int, device: Device, *,
                runnable_only: bool = False, micro_batches: tuple[int, ...] | None = None,
                preferred: Layout | None = None, ep_limit: int | None = None) -> PlanResult:
    if world_size < 1 or ranks_per_worker < 1:
        raise PlanError(f"world size {world_size} / ranks per worker {ranks_per_worker}: both must be >= 1")
    estimates = [estimate(shape, batch, lay, device, ranks_per_worker)
                 for lay in layouts(shape, batch.global_batch, world_size, runnable_only=runnable_only,
                                    micro_batches=micro_batches, ep_limit=ep_limit)]
    if not estimates:
        raise PlanError(f"trainer.training.globalBatch: {batch.global_batch} cannot be split over any data-parallel"
                        f" degree of world size {world_size} (with microBatch {micro_batches}); use a multiple of "
                        "the world size")
    fitting = sorted((e for e in estimates if e.fits), key=lambda e: (e.step_seconds, e.memory_bytes))
    if not fitting:
        smallest = min(estimates, key=lambda e: e.memory_bytes)
        raise PlanError(f"no layout fits in {device.memory_bytes / GIB:.1f} GiB per rank on {device.name}: the "
                        f"smallest, {smallest.layout.describe()}, needs {smallest.memory_bytes / GIB:.1f} GiB; use "
                        "more ranks, a smaller model or seqLen, or a device with more memory (--device/--devices)")
    near = [e for e in fitting if e.step_seconds <= fitting[0].step_seconds * (1 + NEAR_TIE)]
    chosen = min(near, key=lambda e: (_distance(e.layout, preferred), e.memory_bytes, e.step_seconds))
    return PlanResult(device=device, world_size=world_size, ranks_per_worker=ranks_per_worker, chosen=chosen,
                      candidates=[chosen, *(e for e in fitting if e is not chosen)],
                      rejected_for_memory=len(estimates) - len(fitting))


def _distance(layout: Layout, preferred: Layout | None) -> int:
    """How many of the layout's choices differ from the preferred (the spec's) layout."""
    if preferred is None:
        return 0
    return sum((layout.dp != preferred.dp, layout.tp != preferred.tp, layout.pp != preferred.pp,
                layout.ep != preferred.ep, layout.micro_batch != preferred.micro_batch, layout.fsdp != preferred.fsdp,
                layout.fsdp and layout.zero != preferred.zero,
                layout.activation_checkpointing != preferred.activation_checkpointing))


def plan_for_spec(spec: TrainingJobSpec, world_size: int, device: Device, *,
                  runnable_only: bool = False) -> PlanResult:
    """The layout for a job at `world_size` ranks. With `parallelism.auto: false` the micro batch is the spec's;
    with auto the planner chooses it too."""
    training = spec.trainer.training
    micro = None if spec.trainer.parallelism.auto else (training.micro_batch,)
    return plan_layout(shape_of(spec), Batch(training.global_batch, training.precision), world_size,
                       spec.procs_per_replica, device, runnable_only=runnable_only, micro_batches=micro,
                       preferred=spec_layout(spec, world_size))


def spec_layout(spec: TrainingJobSpec, world_size: int) -> Layout:
    """The layout the spec asks for at this world size (its tp/pp/ep; dp the rest)."""
    par, training = spec.trainer.parallelism, spec.trainer.training
    return Layout(dp=max(1, world_size // (par.tp * par.pp)), tp=par.tp, pp=par.pp, micro_batch=training.micro_batch,
                  fsdp=par.fsdp, zero=par.zero, activation_checkpointing=training.activation_checkpointing,
                  ep=par.ep)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def resolve_auto(spec: TrainingJobSpec, device: Device) -> TrainingJobSpec:
    """`parallelism.auto: true` made concrete for the worker loop: the planner's pick among the layouts it runs
    (data parallel with DDP or FSDP/ZeRO, micro batch, activation checkpointing; ep for an MoE model). Elastic jobs
    change dp, so the pick is made at the largest world, and its micro batch must divide the batch, and its ep
    the dp, at every world in range."""
    if not spec.trainer.parallelism.auto or spec.command:
        return spec
    training = spec.trainer.training
    worlds = [n * spec.procs_per_replica for n in range(spec.replicas.min, spec.replicas.max + 1)]
    if any(training.global_batch % w for w in worlds):
        bad = next(w for w in worlds if training.global_batch % w)
        raise PlanError(f"trainer.training.globalBatch: {training.global_batch} is not divisible by the world size "
                        f"{bad} that replicas [{spec.replicas.min}, {spec.replicas.max}] allow; use a multiple of "
                        f"every world size")
    micro = tuple(mb for mb in _divisors(training.global_batch // max(worlds))
                  if all((training.global_batch // w) % mb == 0 for w in worlds))
    result = plan_layout(shape_of(spec), Batch(training.global_batch, training.precision), max(worlds),
                         spec.procs_per_replica, device, runnable_only=True, micro_batches=micro,
                         preferred=spec_layout(spec, max(worlds)), ep_limit=math.gcd(*worlds))
    chosen = result.chosen.layout
    parallelism = spec.trainer.parallelism.model_copy(update={"auto": False, "tp": 1, "pp": 1, "fsdp": chosen.fsdp,
                                                               "zero": chosen.zero, "ep": chosen.ep})
    training = training.model_copy(update={"micro_batch": chosen.micro_batch,
                                           "activation_checkpointing": chosen.activation_checkpointing})
    trainer = spec.trainer.model_copy(update={"parallelism": parallelism, "training": training})
    return spec.model_copy(update={"trainer": trainer})
