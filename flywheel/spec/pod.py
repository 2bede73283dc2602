"""The worker pod's side of the TrainingJob spec: `accelerator`, and the rules between the pod template
(`spec.template`, checked by flywheel/spec/pod_template.py) and the shorthands that say the same things (`image`,
`resources`, `scheduling.*`, `faultTolerance.terminationGraceSeconds`, `procsPerReplica` of the accelerator).
Re-exported by `flywheel.spec.job`; pure. The rules read a `PodView` of the spec (built by
`TrainingJobSpec.pod_view`), so this module, imported by the schema, never names it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from flywheel.spec.base import _Model
from flywheel.spec.parallel import DeviceKind
from flywheel.spec.pod_merge import overlay
from flywheel.spec.pod_rules.rules import merged_resource_problems, spec_rule_problems
from flywheel.spec.pod_template import resource_quantity, template_problems, worker_container, worker_index

if TYPE_CHECKING:
    from flywheel.spec.sections import Scheduling


class Accelerator(_Model):
    """The device each local rank drives: every worker requests and limits procsPerReplica of `resource`."""

    # Its syntax is an extended resource name (flywheel/spec/pod_rules/rules.py, also the CRD's CEL rule).
    resource: str = Field(..., description="The extended resource of one device, e.g. nvidia.com/gpu or amd.com/gpu.")
    device: DeviceKind | None = Field(None, description="The planner's device profile for this accelerator (a100, "
                                                        "h100, h200): what parallelism.auto sizes layouts for.")


# A shorthand at its default yields to the template (and parallelism.device to the accelerator): the API server
# writes every default into the stored object, so "left at the default" is all the operator can tell from "unset".
DEFAULT_DEVICE = "cpu"


def is_default(model: Any, field: str) -> bool:
    return bool(getattr(model, field) == type(model).model_fields[field].default)


@dataclass(frozen=True)
class PodView:
    """What the pod rules read of a TrainingJobSpec. A shorthand at its default is None here: it yields."""

    image: str | None
    resources: dict[str, Any]
    template: dict[str, Any]
    checkpoint_dir: str
    scheduling: Scheduling
    grace_seconds: int | None  # faultTolerance.terminationGraceSeconds
    accelerator: Accelerator | None
    procs_per_replica: int
    auto: bool  # trainer.parallelism.auto
    device: str  # trainer.parallelism.device
    document: Callable[[], dict[str, Any]]  # the spec as written (camelCase JSON); only once its resources are sound


def planner_device(spec: PodView) -> str:
    """The device profile the planner uses: trainer.parallelism.device when set (not cpu), else the accelerator's,
    else cpu (a job without an accelerator runs on CPUs)."""
    if spec.device != DEFAULT_DEVICE or spec.accelerator is None or spec.accelerator.device is None:
        return spec.device
    return spec.accelerator.device


# spec.resources in the CRD: requests and limits, each a map of quantities (an int or a string: 2, "500m"); the
# rules on names and amounts are flywheel/spec/pod_rules/rules.py's.
RESOURCE_KINDS = ("requests", "limits")
RESOURCES_SCHEMA: dict[str, Any] = {"properties": {kind: {
    "type": "object", "description": f"Per-worker {kind} by resource name (cpu, memory, nvidia.com/gpu, ...).",
    "additionalProperties": {"x-kubernetes-int-or-string": True}} for kind in RESOURCE_KINDS}}


def pod_problems(spec: PodView) -> list[str]:
    """What would make the worker pods invalid: the Pod API's rules on every field the pods copy
    (flywheel/spec/pod_rules/rules.py), the template's own problems and its conflicts with the shorthands, each
    "field: what; fix"."""
    problems = _resource_shape_problems(spec.resources)
    if problems:
        return problems
    problems = template_problems(spec.template, spec.checkpoint_dir) + spec_rule_problems(spec.document())
    if problems:
        return problems
    return (_shorthand_conflicts(spec) + _accelerator_problems(spec) + _device_problems(spec)
            + _merged_resource_problems(spec))


def _resource_shape_problems(resources: dict[str, Any]) -> list[str]:
    out = [f"resources.{kind}: only requests and limits go here (claims and the rest: in the template's worker "
           "container); remove it" for kind in resources if kind not in RESOURCE_KINDS]
    for kind in RESOURCE_KINDS:
        amounts = resources.get(kind)
        if amounts is None:
            continue
        if not isinstance(amounts, dict):
            out.append(f"resources.{kind}: expected a mapping of resource names to quantities")
            continue
        out += [f"resources.{kind}.{name}: must be an integer or a quantity string such as \"500m\" or \"0.5\" "
                "(quote a decimal number)" for name, value in amounts.items()
                if isinstance(value, bool) or not isinstance(value, (int, str))]
    return out


def _merged_resource_problems(spec: PodView) -> list[str]:
    """The worker's resources as the operator merges them: the shorthands' (spec.resources and the accelerator's)
    under the template worker's. Each source may be fine alone and the two wrong together (a request in one above
    the limit in the other)."""
    theirs = worker_container(spec.template).get("resources")
    if not isinstance(theirs, dict) or not theirs:
        return []
    merged = overlay(template_resources(spec), theirs)
    return merged_resource_problems(merged, f"{_worker_path(spec)}.resources (with spec.resources and the "
                                            "accelerator's)")


def _worker_path(spec: PodView) -> str:
    index = worker_index((spec.template.get("spec") or {}).get("containers") or [])
    return f"template.spec.containers[{index}]"


def _shorthand_conflicts(spec: PodView) -> list[str]:
    pod, worker, where = spec.template.get("spec") or {}, worker_container(spec.template), _worker_path(spec)
    out = []
    if spec.image is not None and worker.get("image") not in (None, spec.image):
        out.append(f"image: {spec.image!r} differs from {where}.image {worker['image']!r}; set the image in one place")
    for kind in ("requests", "limits"):
        for name, value in (spec.resources.get(kind) or {}).items():
            theirs = resource_quantity(worker.get("resources") or {}, kind, name)
            if theirs is not None and str(theirs) != str(value):
                out.append(f"resources.{kind}.{name}: {value!r} differs from {where}.resources.{kind}.{name} "
                           f"{theirs!r}; set it in one place")
    sched = spec.scheduling
    for ours, value, field in (("scheduling.schedulerName", sched.scheduler_name, "schedulerName"),
                               ("scheduling.priorityClassName", sched.priority_class_name, "priorityClassName")):
        if value and pod.get(field) not in (None, value):
            out.append(f"{ours}: {value!r} differs from template.spec.{field} {pod[field]!r}; set it in one place")
    if sched.gang and not sched.scheduler_name and pod.get("schedulerName"):
        # The gang scheduler's name is the operator's (--gang-scheduler), unknown here: the template cannot agree.
        out.append(f"scheduling.gang: true (the default) gives the pods the gang scheduler's schedulerName (where the "
                   f"operator creates PodGroups), which template.spec.schedulerName {pod['schedulerName']!r} would "
                   "replace; set the scheduler in scheduling.schedulerName instead, or scheduling.gang: false")
    grace, theirs_grace = spec.grace_seconds, pod.get("terminationGracePeriodSeconds")
    if grace is not None and theirs_grace not in (None, grace):
        out.append(f"faultTolerance.terminationGraceSeconds: {grace} differs from template.spec."
                   f"terminationGracePeriodSeconds {theirs_grace}; set it in one place")
    return out


def _accelerator_problems(spec: PodView) -> list[str]:
    if spec.accelerator is None:
        return []
    name, want = spec.accelerator.resource, spec.procs_per_replica
    asked: list[tuple[str, Any]] = []
    for kind in ("requests", "limits"):
        asked.append((f"resources.{kind}.{name}", resource_quantity(spec.resources, kind, name)))
        asked.append((f"{_worker_path(spec)}.resources.{kind}.{name}",
                      resource_quantity(worker_container(spec.template).get("resources") or {}, kind, name)))
    wrong = [(field, value) for field, value in asked if value is not None and str(value) != str(want)]
    return [f"{field}: asks {value} but accelerator: {name} gives each worker procsPerReplica ({want}); remove it "
            f"or set procsPerReplica: {value}" for field, value in wrong]


def _device_problems(spec: PodView) -> list[str]:
    acc = spec.accelerator
    if acc is not None and acc.device is None and spec.auto and spec.device == DEFAULT_DEVICE:
        return ["accelerator.device: trainer.parallelism.auto sizes layouts for the accelerator's device profile; "
                "set accelerator.device (a100, h100, h200)"]
    if acc is None or acc.device is None or spec.device in (DEFAULT_DEVICE, acc.device):
        return []
    return [f"trainer.parallelism.device: {spec.device!r} differs from accelerator.device {acc.device!r}; set the "
            "device in one place (accelerator.device)"]


def template_resources(spec: PodView) -> dict[str, Any]:
    """The worker's resources from the shorthands: spec.resources with the accelerator's count (and nothing of
    the template's, which the merge lays over these)."""
    out: dict[str, Any] = {kind: dict(values) for kind, values in spec.resources.items()}
    if spec.accelerator is not None:
        for kind in ("requests", "limits"):
            out.setdefault(kind, {})[spec.accelerator.resource] = str(spec.procs_per_replica)
    return out
