"""Every condition/event Reason and Message the operator writes, in one place (as JobSet keeps its constants).

Reasons are CamelCase (Kubernetes convention). Failure reasons that come from `policy.failures.FailureKind` or
`policy.restart` ("OOMKilled", "RestartBudgetExhausted", ...) are used as they are.
"""

CREATED = "Created"
MSG_CREATED = "TrainingJob accepted; creating the workers"

INVALID = "InvalidSpec"

RUNNING = "WorkersRunning"
MSG_RUNNING = "{ready} workers running"

DEGRADED = "FewerWorkers"
MSG_DEGRADED = "running with {ready} of {desired} workers (elastic)"

RESTARTING = "Restarting"
MSG_WORKER_FAILED = "worker {pod} failed: {kind} (exit code {code}, reason {reason})"

FORCE_DELETED = "ForceDeleted"
MSG_FORCE_DELETED = "pod {pod} was stuck terminating on a lost node; force-deleted"

UNSCHEDULABLE = "Unschedulable"
MSG_UNSCHEDULABLE = "a worker pod could not be scheduled within nodeFailureGraceSeconds"

SUSPENDED = "Suspended"
MSG_SUSPENDED = "spec.suspend is true: workers stopped, checkpoints kept"
RESUMED = "Resumed"
MSG_RESUMED = "spec.suspend is false: recreating the workers from the last checkpoint"

DEADLINE = "DeadlineExceeded"
MSG_DEADLINE = "the job ran longer than runPolicy.activeDeadlineSeconds ({seconds} s)"

SUCCEEDED = "TrainingSucceeded"
MSG_SUCCEEDED = "training finished at step {step}"

CREATE_FAILED = "CreateFailed"
MSG_CREATE_FAILED = "could not create {kind} {name}: {error}"
