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
# detail: ": " + the worker's own reason for exiting (its termination message), when it gave one.
MSG_WORKER_FAILED = "worker {pod} failed: {kind} (exit code {code}, reason {reason}){detail}"
# Pending with a container that cannot start (policy.failures.classify_waiting).
MSG_WORKER_NOT_STARTING = "worker {pod} failed: {kind} (container waiting {seconds:.0f}s: {reason}{detail})"
# A True DisruptionTarget pod condition: preempted or evicted, from outside the job.
MSG_WORKER_DISRUPTED = "worker {pod} failed: {kind} (DisruptionTarget: {reason}{detail})"
# Decisions to fail at once (policy.restart), by FailureKind value.
MSG_PERMANENT_DEFAULT = "{reason}: a restart cannot fix this; see the worker log"
MSG_PERMANENT = {
    "UserError": "{reason}: a restart cannot fix this; fix what the worker's reason names (the spec, the script or "
                 "its files) and apply the job again",
    "ImagePullError": "{reason}: the worker image cannot be pulled; fix spec.image (or the registry, or the "
                      "pull secret) and apply the job again; kubectl describe pod shows the kubelet's attempts",
    "ContainerConfigError": "{reason}: a Secret or ConfigMap the worker needs is missing; create it and apply the "
                            "job again; kubectl describe pod names it",
}

# policy/startup_failure.py: the same crash before the first step, attempt after attempt.
STARTUP_FAILURE = "StartupFailure"
MSG_STARTUP_FAILURE = ("{reason}: the same failure before the first step on {attempts} attempts in a row; a restart "
                       "cannot fix this: fix the script, its files or the spec and apply the job again")
# The same rule's failure when it is the final save that fails each time (the trainer's FinalSaveFailed, whose name
# its reason starts with): no step to train, only the last state to save, where there is no room or no access.
FINAL_SAVE_FAILED = "FinalSaveFailed"
MSG_FINAL_SAVE_FAILED = ("{reason}: the same failure on {attempts} attempts in a row; make room where the checkpoints "
                         "are kept (or fix access to it) and apply the job again: it resumes from its newest saved "
                         "checkpoint")

# status.lastRestartReason for the interruptions that are not the job's own failure kind (policy/failure_decision.py
# restart_reason); the others are the FailureKind's value (Crash, OOMKilled, NodeLost, Evicted, Killed, ...).
RESTART_POD_DELETED = "PodDeleted"  # a worker pod deleted by someone else, replaced
RESTART_HUNG = "Hung"  # no step progress (the health monitor, or the worker's own watchdog)
RESTART_XID = "XID"  # the health monitor deleted the pod for a GPU XID (pod annotation flywheel.dev/deleted-for)
RESTART_RANK = "RankRestarted"  # a worker's elastic agent restarted its crashed ranks in place (its pod kept running)
MSG_RANK_RESTARTED = "worker {pod} restarted its ranks in place ({count} time(s) so far): {reason}"
# policy/vanished.py: a pod gone before any pass saw it Terminating.
MSG_POD_VANISHED = "deleted without a grace period (e.g. kubectl delete pod --grace-period=0 --force)"

WAITING = "WaitingForWorkers"
MSG_WAITING = "{ready} of {desired} workers ready; at least {min} needed to train"

FORCE_DELETED = "ForceDeleted"
MSG_FORCE_DELETED = "pod {pod} was stuck terminating on a lost node; force-deleted"

SPEC_CHANGED = "SpecChanged"  # policy/spec_change.py: workers run a spec older than the job's
MSG_SPEC_CHANGED = ("the spec changed after {pods} started: they keep the spec they were created with (trainer, "
                    "checkpoint, image, template, procsPerReplica, replicas.min/max ...) until they are created "
                    "again; the next time a worker would join them (a replacement, a scale up, a spare) every "
                    "worker is created again with the new spec from the last checkpoint instead; suspend and resume "
                    "the job to apply it now")
SPEC_REGROUP = "RecreatingWithNewSpec"  # policy/spec_change.py: a worker would have joined workers on an older spec
MSG_SPEC_REGROUP = ("recreating every worker with the job's current spec from the last checkpoint: replica(s) "
                    "{joining} would have joined {pods}, which run an older one")
SPEC_APPLIED = "SpecApplied"
MSG_SPEC_APPLIED = "every worker runs the job's current spec"
UNSCHEDULABLE = "Unschedulable"
MSG_UNSCHEDULABLE = "a worker pod could not be scheduled within nodeFailureGraceSeconds"
MSG_UNSCHEDULABLE_POD = "worker {pod} cannot be scheduled: {message}"  # the scheduler's PodScheduled message
MSG_PENDING_TIMEOUT = ("worker {pod} unschedulable for {seconds:.0f}s (faultTolerance.pendingTimeoutSeconds="
                       "{limit:g}): {message}; free capacity, lower replicas or resources, or raise "
                       "pendingTimeoutSeconds")

SUSPENDED = "Suspended"
MSG_SUSPENDED = "spec.suspend is true: workers stopped, checkpoints kept"
RESUMED = "Resumed"
MSG_RESUMED = "spec.suspend is false: recreating the workers from the last checkpoint"

DEADLINE = "DeadlineExceeded"
MSG_DEADLINE = "the job ran longer than runPolicy.activeDeadlineSeconds ({seconds} s)"

SUCCEEDED = "TrainingSucceeded"
MSG_SUCCEEDED = "training finished at step {step}"
# Appended to the success message: workers still running finishGraceSeconds after the done report were stopped.
MSG_LINGERING_STOPPED = "; worker(s) {workers} still running {grace} s after training finished were stopped"
MSG_ALREADY_COMPLETE = "already complete at step {step} (checkpoint {path})"  # resumed at or past the last step

CHECKPOINT_COMMITTED = "CheckpointCommitted"  # one event per committed checkpoint (policy/checkpoint_events.py)
MSG_CHECKPOINT_COMMITTED = "checkpoint at step {step} committed to {path}"
MSG_CHECKPOINTS_COALESCED = "; {count} checkpoints since the last event, at steps {steps}"
# Warning events in the trainer's words (policy/checkpoint_events.py notice_events): one per cause of failing
# saves, one per damaged checkpoint a restore skipped.
CHECKPOINT_FAILED = "CheckpointFailed"
CHECKPOINT_DAMAGED = "CheckpointDamaged"

CREATE_FAILED = "CreateFailed"
MSG_CREATE_FAILED = "could not create {kind} {name}: {error}"
# The ReplicaFailure condition turned False (policy/create_failures.py): the refused creates went through.
CREATED_AFTER_FAILURE = "Created"
MSG_CREATED_AFTER_FAILURE = "every pod and Service the job needs was created"

# Health monitor findings (flywheel/monitor/findings.py), decided by the reconcile pass: a hang report restarts the job
# (FailureKind.HANG; Hung is recorded True, then False once restarted); a straggler verdict sets Degraded.
HUNG = "ProgressStalled"  # message: HangFinding.message
RESTART_REQUESTED = "RestartRequested"
MSG_RESTART_REQUESTED = ("restart requested at {at} (annotation flywheel.dev/restart-requested-at): restarting every "
                         "worker from the last checkpoint; no restart budget spent")
HANG_RESTARTED = "RestartedAfterHang"
MSG_HANG_RESTARTED = "the workers were restarted after: {finding}"
MSG_HANG_DECIDED = "hung: {finding}"
MSG_HANG_RESTART_ALL = "{reason}: restarting every worker from the last checkpoint"
RESTART_IN_PLACE = "RestartRanksInPlace"  # how a hang's restart is carried out when every worker's agent is alive
MSG_HANG_RESTART_IN_PLACE = ("{reason}: restarting every worker's ranks in place from the last checkpoint (every "
                             "agent is alive: no pod is recreated)")
MSG_HANG_AGAIN = ("{reason}: hung again before a step since its ranks were restarted in place: restarting every "
                  "worker from the last checkpoint")

STRAGGLER = "Straggler"  # Degraded; message: Degradation.message
STRAGGLER_RECOVERED = "StragglerRecovered"
MSG_STRAGGLER_RESTART = "the workers were restarted; stragglers are judged afresh"

GPU_FATAL_XID = "GPUFatalXid"
MSG_GPU_FATAL_XID = "{fault} ({node_state})"
NODE_STATE_CORDONED = "node cordoned"
NODE_STATE_KEPT = "node left schedulable: --no-cordon"
NODE_CORDONED = "NodeCordoned"
MSG_NODE_CORDONED = "cordoned by the Flywheel health monitor: {fault}"
GPU_APP_XID = "GPUAppXid"  # message: RankRestart.message

# policy/spares.py: a warm spare took a lost worker's replica index.
SPARE_PROMOTED = "SparePromoted"
MSG_SPARE_PROMOTED = "spare {spare} took replica {index} (worker {pod} lost: {reason})"
# The lost worker's pod was gone before this pass (force-deleted with grace 0, or a pass in between saw it go).
MSG_SPARE_PROMOTED_GONE = "spare {spare} took replica {index} (its worker lost: {reason})"
MSG_NO_REASON = "missing"  # no restart was decided: the index was just missing

# policy/spare_placement.py: a ready spare beside a worker is replaced by one on a node without the job's pods.
SPARE_MOVED = "SpareMoved"
MSG_SPARE_MOVED = ("spare {new} is warm on node {node}, away from the workers; spare {old} goes (it shared node "
                   "{old_node} with a worker, so a loss of that node would take both)")
SPARE_NOT_MOVED = "SpareNotMoved"
MSG_SPARE_NOT_MOVED = ("spare {new} was not warm on any of nodes {nodes} within {seconds:g}s (no room for it there?); "
                       "spare {old} stays beside a worker on node {old_node}; those nodes are not tried again while "
                       "they stay usable")

# policy/drain.py: a worker's node is cordoned, tainted for maintenance or has a fatal XID: checkpoint, then move.
NODE_DRAINING = "NodeDraining"  # also status.lastRestartReason of the move
MSG_DRAIN_PREPARING = ("node {node} {cause}: waiting for {count} warm pod(s) off it to take worker(s) {pods} "
                       "({new} new spare(s) started for the drain); the job trains on meanwhile (up to {seconds:g}s)")
MSG_DRAIN_UNPREPARED = ("node {node} {cause}: {count} replacement pod(s) not warm after {seconds:g}s; moving "
                        "worker(s) {pods} after the checkpoint all the same (to new pods where no spare is ready)")
MSG_DRAIN_REQUESTED = ("node {node} {cause}: asking every rank for a memory checkpoint at the next step boundary "
                       "(request {request}) before moving worker(s) {pods}")
MSG_DRAIN_MOVED = ("node {node} {cause}: every rank holds the checkpoint of step {step}; moving worker(s) {pods} off "
                   "it (no restart budget spent)")
MSG_DRAIN_TIMED_OUT = ("node {node} {cause}: the checkpoint did not come within {seconds:g}s; moving worker(s) "
                       "{pods} off it from the last checkpoint")
MSG_DRAIN_ABANDONED = "node {node} {cause}: drain ahead given up ({why}); the failure is handled as usual"

RECOVERED = "Recovered"
MSG_RECOVERED = ("trained again {total:.1f} s after the fault ({cause}): detect {detect:.1f} s, decide {decide:.1f} s, "
                 "pod ready {ready:.1f} s, rendezvous {rendezvous:.1f} s, restore {restore:.1f} s, first step "
                 "{first:.1f} s; {restored}; {replayed} steps replayed")
MSG_RESTORED_FROM = "restored step {step} from {source}"
MSG_RESTORED_NOTHING = "no checkpoint restored"

# policy/checkpoint_sharing.py: an older unfinished job's checkpoints land where this job's would (or a deleted
# job's pods still write there).
CHECKPOINT_DIR_IN_USE = "CheckpointDirInUse"
MSG_CHECKPOINT_DIR_IN_USE = ("checkpoint location {location} is in use by TrainingJob {holder} (created earlier, not "
                             "finished): this job creates no worker until that job finishes or is deleted, then "
                             "resumes from what it left there; give this job its own checkpoint.dir to run now")
MSG_CHECKPOINT_DIR_STOPPING = ("checkpoint location {location} is still written by pods of deleted TrainingJob "
                               "{holder} ({pods}): this job creates no worker until they are gone (a deleted job's "
                               "pods stop within their grace period; delete any left orphaned), then resumes from "
                               "what they left there")
CHECKPOINT_DIR_FREE = "CheckpointDirFree"
MSG_CHECKPOINT_DIR_FREE = "the checkpoint location is this job's alone now"
