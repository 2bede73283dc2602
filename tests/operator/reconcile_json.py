"""`reconcile` at the JSON boundary the executor uses: a status dict in, the status dict it would write out. The
behaviour tests of the reconcile pass run through it, so they pin the status JSON written to Kubernetes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flywheel.policy import reconcile as policy
from flywheel.policy.decisions import Event, JobAction
from flywheel.policy.observed import HealthFindings, ObservedProgress, PodView
from flywheel.spec import TrainingJobSpec
from flywheel.spec.status import TrainingJobStatus

NO_FINDINGS = HealthFindings()


@dataclass
class JsonPass:
    status: dict[str, Any]
    actions: list[JobAction] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


def reconcile(spec: TrainingJobSpec | None, invalid: str | None, status: dict[str, Any], pods: list[PodView],
              progress: ObservedProgress, now: float, generation: int = 0, restart_requested_at: str | None = None,
              findings: HealthFindings = NO_FINDINGS) -> JsonPass:
    observed = policy.Observed(pods, progress, generation, restart_requested_at, findings)
    out = policy.reconcile(spec, invalid, TrainingJobStatus.model_validate(status), observed, now)
    return JsonPass(out.status.to_json(), out.actions, out.events)


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions", []) if c.get("type") == ctype), None)
