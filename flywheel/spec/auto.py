"""The planner applied to a TrainingJob: the spec's model shape, its view for the layout rules, the layout it asks
for, and `parallelism: {auto: true}` (`auto_layout`, run when the job is validated, and `resolve_auto`). The search
itself is spec/auto_view.py's, on the spec's `AutoView` (the schema validates `auto` with it, so this module, which
names the schema, is never imported by it). The planner searches over shapes, batches and devices and never names
the spec.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from flywheel.layout.rules import JobLayout
from flywheel.layout.shape import ModelShape
from flywheel.planner.cost import Batch, Layout, estimate
from flywheel.planner.devices import Device
from flywheel.planner.search import PlanResult, at_world, plan_layout
from flywheel.spec import auto_view
from flywheel.spec.auto_view import pretrained_model_shape

if TYPE_CHECKING:
    from flywheel.spec.job import TrainingJobSpec


def shape_of(spec: TrainingJobSpec) -> ModelShape:
    """The model the job trains: its preset or sizes, or a pretrained directory's config.json (read here)."""
    m = spec.trainer.model
    return pretrained_model_shape(m.pretrained, m.seq_len) if m.pretrained else m.shape()


def spec_rules_view(spec: TrainingJobSpec) -> JobLayout:
    """The spec's view for the layout rules; a pretrained model's with its config.json's sizes, so every rule on
    them (tp dividing heads and kv heads, layers per stage, ...) holds for the layouts the planner offers."""
    view = spec.trainer.layout()
    return auto_view.sized_rules(view, shape_of(spec)) if spec.trainer.model.pretrained else view


def plan_for_spec(spec: TrainingJobSpec, world_size: int, device: Device) -> PlanResult:
    """The layouts for a job at `world_size` ranks. With `parallelism.auto: false` the micro batch is the spec's
    and the choice is the planner's advice. With auto the search is `resolve_auto`'s (layouts valid at every world
    size of the replica range) and the chosen layout is the one the workers get, at this world size."""
    view = spec.auto_view()
    training = view.training
    shape, batch = view.shape, Batch(training.global_batch, training.precision)
    if not spec.trainer.parallelism.auto or spec.command:
        return plan_layout(shape, batch, world_size, spec.procs_per_replica, device,
                           micro_batches=(training.micro_batch,), preferred=auto_view.spec_layout(view, world_size),
                           base=view.rules)
    pick = at_world(auto_view.auto_layout(view, device), world_size)
    worlds = list(view.world_sizes)
    result = plan_layout(shape, batch, world_size, spec.procs_per_replica, device, preferred=pick,
                         ep_limit=math.gcd(*worlds), accept=auto_view.auto_rules(view), memory_world=min(worlds),
                         base=auto_view.auto_base(view))
    chosen = next((e for e in result.candidates if e.layout == pick), None)
    if chosen is None:  # world_size outside the replica range: show the pick's estimate there anyway
        chosen = estimate(shape, batch, pick, device, spec.procs_per_replica)
    return replace(result, chosen=chosen, candidates=[chosen, *(e for e in result.candidates if e is not chosen)])


def concrete_spec(spec: TrainingJobSpec, layout: Layout) -> TrainingJobSpec:
    """`spec` with `parallelism.auto` replaced by `layout` (dp follows the world size), validated as any spec is.
    A pipeline runs all of a dp rank's micro batches in one schedule run (`microbatches` unset), the smallest bubble
    and what cost.py estimates; the spec's schedule and stagesPerRank are kept."""
    doc = spec.model_dump(by_alias=True, mode="json")
    doc["trainer"]["parallelism"].update({"auto": False, "tp": layout.tp, "pp": layout.pp, "fsdp": layout.fsdp,
                                          "zero": layout.zero, "ep": layout.ep, "microbatches": None})
    doc["trainer"]["training"].update({"microBatch": layout.micro_batch,
                                       "activationCheckpointing": layout.activation_checkpointing})
    return type(spec).model_validate(doc)


def auto_layout(spec: TrainingJobSpec, device: Device) -> Layout:
    """The planner's pick for `parallelism.auto` (spec/auto_view.py's `auto_layout`); PlanError if there is none."""
    return auto_view.auto_layout(spec.auto_view(), device)


def resolve_auto(spec: TrainingJobSpec, device: Device) -> TrainingJobSpec:
    """`parallelism.auto: true` made concrete for the worker loop: the planner's pick of tp, pp, ep (MoE models),
    DDP or FSDP/ZeRO-2/3, micro batch and activation checkpointing (`auto_layout`). Elastic jobs change dp, so the
    pick is valid at, and fits at, every world size in range."""
    if not spec.trainer.parallelism.auto or spec.command:
        return spec
    return concrete_spec(spec, auto_layout(spec, device))
