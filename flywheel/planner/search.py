"""The layout search: every (dp, tp, pp, ep, micro batch, FSDP/ZeRO stage, activation checkpointing) the model and
the world size allow, estimated with cost.py. ep (MoE models) ranges over the divisors of dp that divide the
experts, with FSDP and pp = 1, as the trainer runs it. Among the layouts that fit, those within NEAR_TIE of the
fastest estimate count as equally fast (the cost model is not finer than that); of those the one closest to the
spec's own layout wins, then the least memory. So a job keeps its layout unless another is clearly faster.

Every candidate passes the spec's own layout rules (`layout/rules.py`, the one definition the schema and the
trainer use). `parallelism: {auto: true}` (`auto_layout`, run when the job is validated, and `resolve_auto`)
searches the same layouts (flywheel/spec/auto.py applies them to a job: the planner never names the spec).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from flywheel.layout.rules import JobLayout, Problem, layout_problems
from flywheel.layout.shape import ModelShape
from flywheel.planner.cost import Batch, Estimate, Layout, estimate
from flywheel.planner.devices import GIB, Device

NEAR_TIE = 0.02  # estimated step times this close are a tie (bench/planner_accuracy.py: time errors of 1-20%)


class PlanError(ValueError):
    """No layout fits or the job cannot be split; the problem names the field and what to change."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        super().__init__(str(problem))


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


def rules_base(shape: ModelShape, global_batch: int) -> JobLayout:
    """The layout rules' view of a model and batch, before the planner picks degrees (the default schedule)."""
    return JobLayout(layers=shape.layers, dim=shape.dim, heads=shape.heads, vocab=shape.vocab,
                     seq_len=shape.seq_len, experts=shape.experts, top_k=shape.top_k, moe_every=shape.moe_every,
                     global_batch=global_batch, architecture=shape.architecture, kv_heads=shape.kv_heads,
                     ffn=shape.ffn, max_positions=shape.max_positions)


def as_job_layout(base: JobLayout, layout: Layout) -> JobLayout:
    """`base` with the planner's degrees and micro batch (and the spec's microbatches unless a pipeline's)."""
    return replace(base, tp=layout.tp, pp=layout.pp, ep=layout.ep, fsdp=layout.fsdp, micro_batch=layout.micro_batch)


def layouts(shape: ModelShape, global_batch: int, world_size: int, *,
            micro_batches: tuple[int, ...] | None = None, ep_limit: int | None = None,
            base: JobLayout | None = None) -> Iterator[Layout]:
    """Every layout the spec's layout rules (`spec_layout.layout_problems`, on `base`: the spec's schedule and
    data, or the defaults) allow at this world size: tp x pp x dp the world, ep a divisor of dp (and of `ep_limit`
    when given), micro batches dividing the per-rank batch; DDP or FSDP (ZeRO-3/2), recompute or not."""
    rules = base or rules_base(shape, global_batch)
    verdicts: dict[Layout, bool] = {}
    for tp in _divisors(world_size):
        for pp in _divisors(world_size // tp):
            dp = world_size // (tp * pp)
            if global_batch % dp:
                continue
            for ep in [ep for ep in _divisors(dp) if (ep_limit or ep) % ep == 0]:
                for mb in micro_batches or _divisors(global_batch // dp):
                    for fsdp, zero in ((False, 3), (True, 3), (True, 2)):
                        key = Layout(dp=dp, tp=tp, pp=pp, micro_batch=mb, fsdp=fsdp, zero=3,
                                     activation_checkpointing=False, ep=ep)
                        if key not in verdicts:
                            verdicts[key] = not layout_problems(as_job_layout(rules, key), world_size)
                        if verdicts[key]:
                            for ac in (False, True):
                                yield replace(key, zero=zero, activation_checkpointing=ac)


def plan_layout(shape: ModelShape, batch: Batch, world_size: int, ranks_per_worker: int, device: Device, *,
                micro_batches: tuple[int, ...] | None = None, preferred: Layout | None = None,
                ep_limit: int | None = None, accept: Callable[[Layout], bool] | None = None,
                memory_world: int | None = None, base: JobLayout | None = None) -> PlanResult:
    """The layouts at `world_size`, fastest first, and the choice among them. `accept` narrows the search (e.g. to
    what an elastic job runs at every size); a layout must fit in memory at `memory_world` too (an elastic job's
    smallest world size: dp is lowest there, so each rank holds the most)."""
    if world_size < 1 or ranks_per_worker < 1:
        raise PlanError(Problem("world", "replicas", f"world size {world_size} / ranks per worker "
                                f"{ranks_per_worker}", "both must be >= 1"))
    estimates = [estimate(shape, batch, lay, device, ranks_per_worker)
                 for lay in layouts(shape, batch.global_batch, world_size, micro_batches=micro_batches,
                                    ep_limit=ep_limit, base=base)
                 if accept is None or accept(lay)]
    if not estimates:
        raise PlanError(Problem("plan-batch", "trainer.training.globalBatch", f"{batch.global_batch} cannot be "
                                f"split over any layout of world size {world_size} (with microBatch "
                                f"{micro_batches}) that the layout rules allow", "use a multiple of the world size"))
    low = {e.layout: e if memory_world in (None, world_size)
           else estimate(shape, batch, at_world(e.layout, memory_world), device, ranks_per_worker)
           for e in estimates}
    fitting = sorted((e for e in estimates if e.fits and low[e.layout].fits),
                     key=lambda e: (e.step_seconds, e.memory_bytes))
    if not fitting:
        smallest = min(low.values(), key=lambda e: e.memory_bytes)
        where = f" at world size {memory_world}" if memory_world not in (None, world_size) else ""
        raise PlanError(Problem("plan-memory", "trainer.parallelism.device", f"no layout fits in "
                                f"{device.memory_bytes / GIB:.1f} GiB per rank on {device.name}{where}: the smallest, "
                                f"{smallest.layout.describe()}, needs {smallest.memory_bytes / GIB:.1f} GiB",
                                "use more ranks, a smaller model or seqLen, or a device with more memory "
                                "(parallelism.device, or --device/--devices for flywheel plan)"))
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


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def at_world(layout: Layout, world_size: int) -> Layout:
    """The same layout at another world size: tp, pp, ep and the rest fixed, dp the remainder."""
    return replace(layout, dp=max(1, world_size // (layout.tp * layout.pp)))
