"""Flywheel for a framework's training loop, one callback each: add it, and the job's steps, loss, throughput and
checkpoints reach the event log, the metrics and the job's status (hang detection, goodput, lost steps), as the
embedded trainer's do (docs/user-scripts.md).

    from flywheel.integrations.huggingface import FlywheelCallback   # transformers.Trainer(callbacks=[...])
    from flywheel.integrations.lightning import FlywheelCallback     # lightning.Trainer(callbacks=[...])

Each module imports its framework only when imported itself (the `hf-trainer` and `lightning` extras); this package
imports neither. Both report through `flywheel.progress`, the plain-script API, and do nothing outside Flywheel.
"""

from flywheel.integrations.steps import StepClock, checkpoint_dir

__all__ = ["StepClock", "checkpoint_dir"]
