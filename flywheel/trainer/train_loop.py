"""The worker's training loop, run by entry.py (`python -m flywheel.trainer`) once the process group is up.

Set-up order: env -> process group -> mesh -> model (seeded, on CPU) -> parallelize -> DDP bucket settling ->
optimizer/scheduler -> data -> Checkpointer.restore. Each step: injected faults, gradient accumulation over micro
batches (gradient sync only on the last), an async all-reduce carrying the loss and the SIGTERM flag (so every rank
stops at the same step), clip, `wait_staged` (an async save may still be copying the weights), optimizer step,
waiting for that all-reduce, the previous memory copy when this step is due for one, metrics, watchdog beat,
`step` event, periodic save. The same seeds and world size give bitwise the same losses and weights, and a resume
from step k reproduces steps k+1.. bitwise: nothing here depends on time or on global RNG state.
"""

from __future__ import annotations

import logging
import os
import resource
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from flywheel.agent import first_step
from flywheel.agent.worker_env import StopRequest, WorkerEnv
from flywheel.contracts import exitcodes
from flywheel.data.tokenizers import resolve_tokenizer
from flywheel.etcd.progress import PHASE_EVALUATING, PHASE_SAVING
from flywheel.eventlog import EventLog, EventName
from flywheel.layout.rules import dp_wrapper
from flywheel.spec.timeouts import CollectiveTimeouts
from flywheel.trainer.checkpoint import store
from flywheel.trainer.checkpoint.failure import FinalSaveFailed
from flywheel.trainer.checkpoint.manager import AppState, Checkpointer
from flywheel.trainer.checkpoint.request import CheckpointRequests, stop_for_request
from flywheel.trainer.checkpoint.tiers.memory import memory_root
from flywheel.trainer.data import (
    SampleLoader,
    SampleSource,
    build_source,
    build_validation_source,
)
from flywheel.trainer.distributed.collective_env import shorten_timeouts
from flywheel.trainer.distributed.parallelize import (
    DP,
    build_mesh,
    check_layout,
    clip_grad_norm,
    fsdp_mixed_precision,
    parallelize,
    settle_ddp_buckets,
)
from flywheel.trainer.evaluate import EvalContext, EvalPlan, evaluate
from flywheel.trainer.ft.fault_injector import FaultInjector
from flywheel.trainer.ft.watchdog import ProgressWatchdog
from flywheel.trainer.metrics import TrainerMetrics
from flywheel.trainer.models.hf_export import record_model
from flywheel.trainer.models.hf_weights import load_pretrained
from flywheel.trainer.models.materialize import META
from flywheel.trainer.models.registry import build_model, model_shape
from flywheel.trainer.optim import build_optimizer, build_scheduler
from flywheel.trainer.progress_publisher import publish_activity
from flywheel.trainer.startup import CLOCK, freeze_startup_objects
from flywheel.trainer.step import autocast_for, forward_backward, params_sha256, pick_device

log = logging.getLogger("flywheel.trainer")


@dataclass(frozen=True)
class DataSources:
    train: SampleSource
    validation: SampleSource | None  # None: evaluation is off (training.evalEverySteps 0)


def preflight(env: WorkerEnv) -> DataSources:
    """Checks what the spec alone decides (the layout at this world size, the data against the model) and opens
    the data (and the validation data when evaluation is on); raises a user error. Runs before the rendezvous: a
    rank that failed after it could take the store its peers are still joining through (rank 0 hosts it under
    env://), and they would exit COLLECTIVE_TIMEOUT."""
    trainer = env.spec.trainer
    cfg = model_shape(trainer.model)
    check_layout(env.world_size, trainer.parallelism, trainer.training, cfg, trainer.data.source)
    tokenizer = resolve_tokenizer(trainer.data.tokenizer, trainer.model.pretrained)
    data, seed = trainer.data, trainer.training.seed
    train = build_source(data.source, cfg.vocab, cfg.seq_len, seed, tokenizer, data.validation_fraction)
    if not trainer.training.eval_every_steps:
        return DataSources(train, None)
    return DataSources(train, build_validation_source(data.validation, train, cfg.vocab, seed, tokenizer))


@dataclass(frozen=True)
class _Run:
    """What set-up built, for the steps."""

    env: WorkerEnv
    device: torch.device
    dp_rank: int
    dp_size: int
    loss_weight: float  # 1 on the one rank of each dp index that contributes the logged loss, else 0
    tokens_per_step: int
    moe: bool
    model: nn.Module
    autocast: AbstractContextManager[object]
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    loader: SampleLoader
    ckpt: Checkpointer
    app: AppState
    eval_plan: EvalPlan
    eval_ctx: EvalContext | None  # None: evaluation is off


@dataclass(frozen=True)
class _StepResult:
    loss: float  # mean over all ranks
    aux: dict[str, float]  # the MoE load-balancing loss, when the model has one
    seconds: float
    stop: bool  # some rank got SIGTERM
    drain: bool = False  # some rank saw the operator's checkpoint request (trainer/checkpoint/request.py)


def train(env: WorkerEnv, sources: DataSources, events: EventLog, metrics: TrainerMetrics,
          watchdog: ProgressWatchdog, stop: StopRequest, timeouts: CollectiveTimeouts) -> int:
    """Runs set-up and training in an initialised process group, reading `sources` (from `preflight`); returns
    the exit code."""
    run = _set_up(env, sources, events, metrics)
    start = _restore(run, events)
    steps = env.spec.trainer.training.steps
    injector = FaultInjector(env.faults, rank=env.rank, fault_dir=env.fault_dir, events=events,
                             step_delay_s=env.step_delay_s)
    requests = CheckpointRequests.from_environ(env.rank)  # drain ahead: the operator's checkpoint request
    for step in range(start + 1, steps + 1):
        injector.maybe_fire(step)
        # Start-up and the first step are done with its update: from then on a stuck collective fails fast.
        result = _step(run, stop, shorten=timeouts if step == start + 1 else None,
                       drain=requests is not None and requests.pending())
        run.ckpt.catch_up(step)  # the memory copy before a reported step is done: a loss replays <= memoryEverySteps
        _report_step(run, step, result, metrics, watchdog, events)
        if step == start + 1:
            freeze_startup_objects()  # counted in the start-up's first step
            _report_startup(env)
        if result.drain and requests is not None and step < steps:  # the last step's save is the final one
            return stop_for_request(run.ckpt, run.app, requests, step, replica=run.env.replica)
        if run.eval_ctx is not None and not result.stop and run.eval_plan.due(step):
            # Before the save: a checkpoint of a step that was due for evaluation implies its eval record.
            _evaluate(run, run.eval_ctx, step, metrics, watchdog, events)
        if result.stop and step < steps:  # at the last step, finishing is the quickest way to stop
            log.info("SIGTERM: emergency checkpoint at step %d, then exit %d", step, exitcodes.STOPPED)
            run.ckpt.save(step, run.app, blocking=True)  # returns at once if this step's save was already taken
            run.ckpt.close()
            return exitcodes.STOPPED
        if run.ckpt.due(step):
            run.ckpt.save(step, run.app)
    _finish(run, start, events, metrics, watchdog)
    return exitcodes.SUCCESS


def _set_up(env: WorkerEnv, sources: DataSources, events: EventLog, metrics: TrainerMetrics) -> _Run:
    """Mesh, model (seeded), parallelism, optimizer, scheduler, data loader and checkpointer; restores nothing."""
    spec = env.spec
    training, parallelism = spec.trainer.training, spec.trainer.parallelism
    device = pick_device(env.local_rank)
    mesh = build_mesh(env.world_size, parallelism, device.type)
    CLOCK.mark("mesh")
    # The data follows the dp coordinate: every tp and pp rank of one dp index reads the same batch.
    dp_rank, dp_size = mesh[DP].get_local_rank(), mesh[DP].size()
    # The logged loss: tp ranks and (after the pipeline's broadcast) pp ranks of one dp index hold the same value,
    # so one of them contributes it to the all-reduce and the sum is divided by dp.
    coordinate = dict(zip(mesh.mesh_dim_names or (), mesh.get_coordinate() or ()))
    loss_weight = float(all(c == 0 for name, c in coordinate.items() if name != DP))

    torch.manual_seed(training.seed)
    cfg = model_shape(spec.trainer.model)
    loader = SampleLoader(sources.train)
    plain = build_model(cfg, seed=training.seed, device=META)  # parallelize allocates this rank's part only
    CLOCK.mark("meta_build")
    if env.rank == 0:
        log.info("model: %s, %.2fM parameters, %.3g FLOPs/token; world %d, dp %d, tp %d, pp %d%s%s, %s", cfg,
                 plain.num_params() / 1e6, plain.flops_per_token(), env.world_size, dp_size, parallelism.tp,
                 parallelism.pp, f" ({parallelism.schedule})" if parallelism.pp > 1 else "",
                 f", ep {parallelism.ep}" if cfg.moe else "",
                 dp_wrapper(parallelism.fsdp, dp_size, parallelism.tp) or "no dp wrapper")
    model = parallelize(plain, mesh, parallelism, training)
    CLOCK.mark("parallelize")  # materialize is a part of its own
    if spec.trainer.model.pretrained:  # a checkpoint, when there is one, replaces these weights below
        load_pretrained(model, spec.trainer.model.pretrained, cfg)
        CLOCK.mark("weights")
    # bf16 under FSDP2 is its MixedPrecisionPolicy (parallelize.py), not autocast.
    autocast = nullcontext() if fsdp_mixed_precision(parallelism, training, dp_size) else autocast_for(
        device, training.precision)
    with autocast:
        settle_ddp_buckets(model, torch.zeros(training.micro_batch, cfg.seq_len, dtype=torch.long, device=device))
    CLOCK.mark("ddp_settle")
    optimizer = build_optimizer(model, training)
    scheduler = build_scheduler(optimizer, training)
    CLOCK.mark("optimizer")

    ckpt = Checkpointer(spec.checkpoint, env.checkpoint_dir, events=events, metrics=metrics,
                        memory_dir=memory_root(env.job, env.replica, env.checkpoint_dir),
                        ranks_per_worker=int(os.environ.get("LOCAL_WORLD_SIZE") or 1))
    app = AppState(model, optimizer, scheduler, loader, rank=env.rank, world_size=env.world_size)
    eval_ctx = None if sources.validation is None else EvalContext(
        model=model, source=sources.validation, device=device, autocast=autocast, dp_rank=dp_rank, dp_size=dp_size,
        loss_weight=loss_weight, global_batch=training.global_batch, micro_batch=training.micro_batch)
    CLOCK.mark("checkpointer")
    return _Run(env=env, device=device, dp_rank=dp_rank, dp_size=dp_size, loss_weight=loss_weight,
                tokens_per_step=training.global_batch * cfg.seq_len, moe=cfg.moe is not None, model=model,
                autocast=autocast, optimizer=optimizer, scheduler=scheduler, loader=loader, ckpt=ckpt, app=app,
                eval_plan=EvalPlan(training.eval_every_steps, training.eval_steps, training.steps),
                eval_ctx=eval_ctx)


def _restore(run: _Run, events: EventLog) -> int:
    """Loads the newest committed checkpoint, if any; returns its step (0 without one)."""
    env, training = run.env, run.env.spec.trainer.training
    began = time.monotonic()
    start = run.ckpt.restore(run.app) or 0
    restore_seconds = round(time.monotonic() - began, 3)
    if env.rank == 0:  # what `flywheel export` needs; after the restore: a refused model keeps its checkpoints'
        model = env.spec.trainer.model
        record_model(env.local_checkpoint_dir, model_shape(model), model.pretrained, env.spec.trainer.data)
    if run.loader.consumed_samples != start * training.global_batch:
        log.warning("restored data position is %d samples, not step %d x globalBatch %d (globalBatch changed?); "
                    "continuing from the restored position", run.loader.consumed_samples, start,
                    training.global_batch)
    CLOCK.mark("restore")
    if env.rank == 0:
        events.emit("start", rank=env.rank, world_size=env.world_size, dp=run.dp_size,
                    restart_count=env.restart_count, resumed_from=start or None,
                    restore_seconds=restore_seconds if start else None, startup_seconds=dict(CLOCK.phases))
        log.info("training steps %d..%d%s", start + 1, training.steps, f" (resumed from {start})" if start else "")
    return start


def peak_memory_bytes(device: torch.device) -> int:
    """Rank 0's peak memory for the `done` event: the CUDA caching allocator's peak on a GPU, the peak RSS else."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _report_startup(env: WorkerEnv) -> None:
    """Rank 0 logs where its start-up went once its first step is done (the `start` event has the phases before)."""
    CLOCK.mark("first_step")
    if env.rank == 0:
        log.info("start-up to the first step: %.2f s (%s)", CLOCK.total(), CLOCK.summary())


def _step(run: _Run, stop: StopRequest, shorten: CollectiveTimeouts | None, drain: bool = False) -> _StepResult:
    """One optimizer step over the next global batch; `shorten`: the timeouts to shorten after the update;
    `drain`: this rank saw a checkpoint request."""
    training = run.env.spec.trainer.training
    began = time.perf_counter()
    batches = run.loader.next_microbatches(run.dp_rank, run.dp_size, training.global_batch, training.micro_batch)
    # One collective for the logged losses and the stop flags (SIGTERM, a checkpoint request): every rank sees the
    # same sums, so all stop after the same step. Started as soon as the losses are known (before the last
    # backward) and awaited after the optimizer step, so its round trip overlaps the backward and the update.
    reduction: list[tuple[torch.Tensor, dist.Work]] = []

    def reduce_totals(rank_loss: torch.Tensor, rank_aux: torch.Tensor) -> None:
        totals = torch.stack([rank_loss * run.loss_weight, rank_aux * run.loss_weight,
                              torch.tensor(float(stop.requested), device=run.device),
                              torch.tensor(float(drain), device=run.device)])
        work = dist.all_reduce(totals, async_op=True)
        assert work is not None
        reduction.append((totals, work))

    forward_backward(run.model, batches, run.device, run.autocast, losses_ready=reduce_totals)
    totals, totals_reduced = reduction[0]
    if training.grad_clip > 0:
        clip_grad_norm(run.model, training.grad_clip)
    run.ckpt.wait_staged()
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    if shorten is not None:
        shorten_timeouts(shorten)

    totals_reduced.wait()
    mean_loss, stop_now = totals[0].item() / run.dp_size, totals[2].item() > 0
    # The language-model loss is what `loss` reports (comparable with a dense model); an MoE model's weighted
    # load-balancing loss, also in the gradient, is reported beside it.
    aux = {"aux_loss": totals[1].item() / run.dp_size} if run.moe else {}
    return _StepResult(loss=mean_loss, aux=aux, seconds=time.perf_counter() - began, stop=stop_now,
                       drain=totals[3].item() > 0)


def _report_step(run: _Run, step: int, result: _StepResult, metrics: TrainerMetrics, watchdog: ProgressWatchdog,
                 events: EventLog) -> None:
    env, training = run.env, run.env.spec.trainer.training
    tokens_per_second = run.tokens_per_step / result.seconds
    metrics.record_step(loss=result.loss, step_seconds=result.seconds, tokens_per_second=tokens_per_second,
                        timestamp=time.time())
    watchdog.beat()
    first_step.mark()
    if env.rank == 0:
        events.emit("step", step=step, loss=result.loss, step_seconds=result.seconds,
                    tokens_per_second=tokens_per_second, world_size=env.world_size, **result.aux)
        log.info("step %d/%d loss %.4f%s lr %.3g %.3fs %.0f tok/s", step, training.steps, result.loss,
                 "".join(f" aux {v:.4f}" for v in result.aux.values()), run.scheduler.get_last_lr()[0],
                 result.seconds, tokens_per_second)


def _evaluate(run: _Run, ctx: EvalContext, step: int, metrics: TrainerMetrics, watchdog: ProgressWatchdog,
              events: EventLog) -> None:
    # An evaluation is progress: a long one must not look like a hang, so each batch beats the watchdog, and tells
    # the operator's two hang checks (the progress record's heartbeat, the progress gauge) the same.
    def on_batch() -> None:
        watchdog.beat()
        metrics.record_eval_batch(timestamp=time.time())
        publish_activity(events, PHASE_EVALUATING)

    result = evaluate(ctx, run.eval_plan.batches, on_batch=on_batch)
    metrics.record_eval(loss=result.loss, perplexity=result.perplexity, step=step)
    if run.env.rank == 0:
        events.emit(EventName.EVAL, step=step, loss=result.loss, perplexity=result.perplexity,
                    eval_seconds=result.seconds, samples=run.eval_plan.batches * ctx.global_batch)
        log.info("eval at step %d: loss %.4f perplexity %.4g (%.3fs)", step, result.loss, result.perplexity,
                 result.seconds)


def _finish(run: _Run, start: int, events: EventLog, metrics: TrainerMetrics, watchdog: ProgressWatchdog) -> None:
    """The final save and the parameters' digest. No step: a slow disk must not look like a hang (the operator is
    told the save began: its hang check pauses too, bounded). A peer failing here still raises from its
    collective. A final state that could not be saved fails the run (FinalSaveFailed: retried, never a success
    without its checkpoint)."""
    env, training = run.env, run.env.spec.trainer.training
    watchdog.stop()
    # The state held now: that of the last step, or of a later one a run resumed past its last step restored.
    final = max(training.steps, start)
    publish_activity(events, PHASE_SAVING)  # also while the last step's own save is waited for
    metrics.record_final_save(timestamp=time.time())
    run.ckpt.close()  # the last step's own save, if still in flight, commits (or fails) first
    # Saved unless already held: a final step restored from memory only is written here, and a last step whose
    # own save or upload failed is tried again.
    held = run.ckpt.holds(final)  # with an object store: one listing of the bucket (rank 0)
    if not held:
        run.ckpt.save_final(final, run.app)
    unsaved = None if held else run.ckpt.unsaved_reason(final)
    if unsaved is not None:
        kept = f"; its memory copy under {run.ckpt.memory.root} is kept" if run.ckpt.memory is not None else ""
        raise FinalSaveFailed(f"the final checkpoint (step {final}) was not saved: {unsaved}{kept}; the run is "
                              "retried to save it")
    if run.ckpt.memory is not None:
        run.ckpt.memory.release()  # the final checkpoint is saved: the host memory is given back
    digest = params_sha256(run.model)
    if env.rank == 0:
        complete = None
        if start >= final:
            complete = str(store.step_dir(run.ckpt.directory, final))
        events.emit("done", step=training.steps, params_sha256=digest, already_complete_checkpoint=complete,
                    checkpoint_memory_bytes=run.ckpt.memory_bytes, peak_memory_bytes=peak_memory_bytes(run.device))
        log.info("done: step %d, params sha256 %s%s", training.steps, digest,
                 f" (already complete: checkpoint {complete})" if complete else "")


def watchdog_for(env: WorkerEnv, events: EventLog, metrics: TrainerMetrics) -> ProgressWatchdog:
    ft = env.spec.fault_tolerance

    def on_hang(seconds_since_step: float) -> None:
        metrics.watchdog_fired_total.inc()
        events.emit("hang", rank=env.rank, seconds_since_step=seconds_since_step)

    return ProgressWatchdog(ft.progress_timeout_seconds, ft.first_step_timeout_seconds, on_hang)
