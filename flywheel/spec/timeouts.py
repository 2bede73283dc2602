"""The collective timeouts a job's faultTolerance implies: long until the first step (rendezvous, restore,
compilation), short after it. One definition for the trainer, which sets them on its process groups
(trainer/distributed/collective_env.py), and for the policy, which counts a rank restart's recovery from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from flywheel.spec.sections import FaultTolerance

DEFAULT_STEADY_SECONDS = 600.0  # when progressTimeoutSeconds is 0 (hang checks off)
MIN_STEADY_SECONDS = 5.0
# The collective timeout fires a little before the progress watchdog: its report names the stuck collective and
# dumps the flight recorder, which the watchdog's generic "no step" cannot.
STEADY_FRACTION = 0.8


@dataclass(frozen=True)
class CollectiveTimeouts:
    startup: timedelta  # init_process_group until the first step: rendezvous, restore, compilation
    steady: timedelta  # every collective after the first step


def collective_timeouts(ft: FaultTolerance) -> CollectiveTimeouts:
    if ft.progress_timeout_seconds > 0:
        steady = max(MIN_STEADY_SECONDS, STEADY_FRACTION * ft.progress_timeout_seconds)
    else:
        steady = DEFAULT_STEADY_SECONDS
    startup = max(ft.first_step_timeout_seconds, steady)
    return CollectiveTimeouts(timedelta(seconds=startup), timedelta(seconds=steady))
