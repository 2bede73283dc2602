"""`parallelism: {auto: true}` on a view of the job (`AutoView`, built by `TrainingJobSpec.auto_view`): the search
keeps the planner's layouts the job can run at every world size its replica range allows: tp divides
procsPerReplica (a tp group stays inside one worker), the rules hold at every replica count, and it fits in memory
at the smallest world, where each rank holds the most. The schema validates `auto` with `auto_layout`, so this
module never names the schema; spec/auto.py applies it to a TrainingJobSpec.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from flywheel.layout.rules import JobLayout, Problem, elastic_problems, static_problems
from flywheel.layout.shape import ModelShape
from flywheel.planner.cost import Batch, Layout
from flywheel.planner.devices import Device
from flywheel.planner.pretrained import PretrainedShapeError, pretrained_shape
from flywheel.planner.search import PlanError, as_job_layout, layouts, plan_layout

if TYPE_CHECKING:
    from flywheel.spec.parallel import Parallelism
    from flywheel.spec.sections import Training


@dataclass(frozen=True)
class AutoView:
    """What the planner reads of a TrainingJob."""

    shape: ModelShape  # the model the job trains (a pretrained model's from its config.json)
    rules: JobLayout  # the spec's view for the layout rules, with those sizes (sized_rules)
    parallelism: Parallelism
    training: Training
    replicas_min: int
    replicas_max: int
    procs_per_replica: int
    world_sizes: range  # every world size the job may run at


def pretrained_model_shape(path: str, seq_len: int | None) -> ModelShape:
    """A pretrained directory's model (its config.json, read here); PlanError naming the field if it cannot be."""
    try:
        return pretrained_shape(path, seq_len)
    except PretrainedShapeError as err:
        raise PlanError(err.problem) from None


def sized_rules(view: JobLayout, shape: ModelShape) -> JobLayout:
    """The rules view of a pretrained model with its config.json's sizes, so every rule on them (tp dividing heads
    and kv heads, layers per stage, ...) holds for the layouts the planner offers; any other view as it is."""
    if not view.pretrained:
        return view
    return replace(view, layers=shape.layers, dim=shape.dim, heads=shape.heads, vocab=shape.vocab,
                   seq_len=shape.seq_len, architecture=shape.architecture, kv_heads=shape.kv_heads, ffn=shape.ffn,
                   max_positions=shape.max_positions, pretrained=False)


def spec_layout(view: AutoView, world_size: int) -> Layout:
    """The layout the spec asks for at this world size (its tp/pp/ep; dp the rest)."""
    par, training = view.parallelism, view.training
    return Layout(dp=max(1, world_size // (par.tp * par.pp)), tp=par.tp, pp=par.pp, micro_batch=training.micro_batch,
                  fsdp=par.fsdp, zero=par.zero, activation_checkpointing=training.activation_checkpointing,
                  ep=par.ep)


def auto_base(view: AutoView) -> JobLayout:
    """The spec's rules view for auto: its model, batch, schedule and data; degrees and micro batches the pick's."""
    return replace(view.rules, microbatches=None)


def auto_rules(view: AutoView) -> Callable[[Layout], bool]:
    """What `auto` may hand the workers, whatever the world size in the replica range: tp inside one worker (tp
    divides procsPerReplica: the fastest links, and the rank order keeps a tp group on one worker), no pipeline
    under gpipe (it keeps every micro batch's activations, which cost.py, estimating 1F1B, does not count), and the
    layout rules (`layout/rules.py`) at every replica count."""
    valid: dict[tuple[object, ...], bool] = {}
    gpipe = view.parallelism.schedule == "gpipe"
    base, counts, procs = auto_base(view), range(view.replicas_min, view.replicas_max + 1), view.procs_per_replica

    def accept(layout: Layout) -> bool:
        if procs % layout.tp or (gpipe and layout.pp > 1):
            return False
        key = (layout.tp, layout.pp, layout.ep, layout.micro_batch, layout.fsdp)
        if key not in valid:
            job = as_job_layout(base, layout)
            valid[key] = not static_problems(job) and not elastic_problems(job, counts, procs)
        return valid[key]

    return accept


def auto_layout(view: AutoView, device: Device) -> Layout:
    """The planner's pick for `parallelism.auto`, at the largest world size (its dp; smaller worlds run the same
    layout with a smaller dp): among the layouts `auto_rules` allows that fit at the smallest world size, the
    fastest, near-ties going to the spec's own layout. Raises PlanError (naming the field) if there is none."""
    training = view.training
    worlds = list(view.world_sizes)
    shape, batch = view.shape, Batch(training.global_batch, training.precision)
    rules, base = auto_rules(view), auto_base(view)
    if not any(rules(lay) for lay in layouts(shape, batch.global_batch, max(worlds), ep_limit=math.gcd(*worlds),
                                             base=base)):
        raise PlanError(Problem("plan-batch", "trainer.training.globalBatch", f"{training.global_batch} cannot be "
                                "split over the data-parallel ranks at every world size "
                                f"({', '.join(map(str, worlds))}) that replicas [{view.replicas_min}, "
                                f"{view.replicas_max}] allow, with tp dividing procsPerReplica "
                                f"({view.procs_per_replica}) and tp x pp every world size",
                                "use a multiple of every world size"))
    result = plan_layout(shape, batch, max(worlds), view.procs_per_replica, device,
                         preferred=spec_layout(view, max(worlds)), ep_limit=math.gcd(*worlds), accept=rules,
                         memory_world=min(worlds), base=base)
    return result.chosen.layout
