"""Pipeline parallel over the "pp" mesh dimension, TorchTitan-style, with torch.distributed.pipelining.

The GPT or Llama is cut into pp x stagesPerRank stages of equal numbers of blocks; stage s runs on pp rank s mod pp
(the loop layout that interleaved 1F1B expects). A stage is a `StageModule` holding the model's own children under
its attribute names (`tok_emb` and `pos_emb`, None for a Llama, on the first stage, `blocks` as a ModuleDict keyed by
the original block index, `ln_f` and `head` on the last), so parameter FQNs are those of the whole model and DCP
checkpoints reshard between layouts by name. Each stage gets TP, activation checkpointing and FSDP2/DDP like a whole
model (`parallelize.py`); a rank's stages are then gathered in one `PipelinedModel` (the same children, the same FQNs),
which is what the optimizer, clipping and checkpoints see.

When the LM head is tied to the token embedding, across stages the tie becomes two copies (first and last stage)
whose gradients are summed after backward, so both take identical updates. The global gradient norm counts the copy
once.
Loss: each micro batch's mean cross entropy divided by the number of micro batches per step, exactly as the
non-pipelined loop backpropagates it; the logged loss is broadcast from the last stage over the pp group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from flywheel.layout.rules import JobLayout, pipeline_problem, static_problems
from flywheel.layout.shape import ModelShape
from flywheel.spec.parallel import Parallelism
from flywheel.trainer.models.gpt.model import GPT
from flywheel.trainer.models.llama.model import Llama

if TYPE_CHECKING:
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle
    from torch.distributed.pipelining.stage import _PipelineStageBase

TIED = "head.weight"  # on the last stage, a copy of the first stage's tok_emb.weight
TIED_SOURCE = "tok_emb.weight"


class PipelineError(ValueError):
    """A pipeline layout that cannot run (layers, micro batches, schedule): a user error."""


class StageModule(nn.Module):
    """One pipeline stage; its attribute names are the GPT's, absent parts are None."""

    def __init__(self, model: GPT | Llama, layer_ids: Sequence[int], *, first: bool, last: bool) -> None:
        super().__init__()
        self.cfg: ModelShape = model.cfg
        self.init_seed: int = model.init_seed
        self.tok_emb: nn.Embedding | None = model.tok_emb if first else None
        self.pos_emb: nn.Embedding | None = model.pos_emb if first else None
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layer_ids})
        self.ln_f: nn.Module | None = model.ln_f if last else None
        self.head: nn.Linear | None = model.head if last else None
        if self.head is not None and not first and model.cfg.tied_embeddings:
            # Untie: this stage's copy of the embedding, kept equal through the gradient sum.
            self.head.weight = nn.Parameter(model.tok_emb.weight.detach().clone())
        self.autocast: AbstractContextManager[object] = nullcontext()  # set per step by the loop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The same operations, in the same order, as GPT.forward and Llama.forward (no learned positions).
        with self.autocast:
            if self.tok_emb is not None:
                x = self.tok_emb(x)
                if self.pos_emb is not None:
                    x = x + self.pos_emb(torch.arange(x.shape[1], device=x.device))
            for block in self.blocks.values():
                x = block(x)
            if self.head is not None and self.ln_f is not None:  # the last stage has both
                x = self.head(self.ln_f(x))
        return x


Decoder: TypeAlias = GPT | Llama | StageModule  # what tensor parallel, checkpointing and FSDP/DDP apply to


class PipelinedModel(nn.Module):
    """This rank's stages as one module with the whole model's FQNs (forward is the schedule's: `train_step`)."""

    # The first and last stage's parts, set from the stages in __init__ (None where this rank has no such stage).
    tok_emb: nn.Embedding | None
    pos_emb: nn.Embedding | None
    ln_f: nn.LayerNorm | None
    head: nn.Linear | None

    def __init__(self, stages: list[StageModule], wrapped: list[nn.Module], stage_ids: list[int],
                 pp_mesh: DeviceMesh, tie_group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.cfg = stages[0].cfg
        for name in ("tok_emb", "pos_emb", "ln_f", "head"):
            part = next((getattr(s, name) for s in stages if getattr(s, name) is not None), None)
            setattr(self, name, part)
        self.blocks = nn.ModuleDict({k: b for s in stages for k, b in s.blocks.items()})
        self.stage_modules, self.wrapped, self.stage_ids = stages, wrapped, stage_ids
        self.pp_group = pp_mesh.get_group()
        self.pp_rank, self.pp_size = pp_mesh.get_local_rank(), pp_mesh.size()
        self.tie_group = tie_group
        self.in_rank0_pp_group = False  # the pp group holding global rank 0 (set by pipeline())
        self.has_first = any(s == 0 for s in stage_ids)
        self.has_last = self.pp_rank == self.pp_size - 1
        # Checkpoint key of the head copy's optimizer state: the one name the non-pipelined model uses for it.
        tied = self.cfg.tied_embeddings and self.has_last and not self.has_first
        self.state_dict_aliases = {TIED: TIED_SOURCE} if tied else {}
        self.schedule: PipelineScheduleSingle | PipelineScheduleMulti | None = None  # set by pipeline()
        self.runs = 1
        self.last_losses: list[torch.Tensor] = []

    def forward(self, *_: object) -> torch.Tensor:
        raise RuntimeError("a pipelined model runs through its schedule: use PipelinedModel.train_step")

    def norm_excluded(self) -> set[int]:
        """Parameters whose gradients another stage already counts in the global norm (the head copy)."""
        return {id(self.head.weight)} if self.state_dict_aliases and self.head is not None else set()

    def train_step(self, batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device,
                   autocast: AbstractContextManager[object]) -> torch.Tensor:
        """Forward and backward over this dp rank's micro batches; returns their mean loss on every pp rank."""
        return self.run_schedule(batches, device, autocast, train=True)

    def run_schedule(self, batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device,
                     autocast: AbstractContextManager[object], *, train: bool) -> torch.Tensor:
        """The schedule over this dp rank's micro batches: forward and backward (`train`), else forward only (its
        `eval`, for evaluation). Returns their mean loss on every pp rank."""
        if self.schedule is None:
            raise RuntimeError("PipelinedModel.run_schedule before pipeline() built its schedule")
        for stage in self.stage_modules:
            stage.autocast = autocast
        self.last_losses = []
        per_run = len(batches) // self.runs
        for run in range(self.runs):
            chunk = batches[run * per_run:(run + 1) * per_run]
            inputs = torch.cat([b[0] for b in chunk]).to(device, non_blocking=True)
            targets = torch.cat([b[1] for b in chunk]).to(device, non_blocking=True)
            args = (inputs,) if self.has_first else ()
            if train:
                self.schedule.step(*args, target=targets if self.has_last else None, return_outputs=False)
            else:
                self.schedule.eval(*args, target=targets if self.has_last else None)
        if train:
            self._sum_tied_grads()
        loss = torch.zeros((), device=device)
        if self.has_last:
            for value in self.last_losses:  # the same accumulation as the non-pipelined loop
                loss += value
            loss /= len(batches)
        self.last_losses = []
        dist.broadcast(loss, group=self.pp_group, group_src=self.pp_size - 1)
        return loss

    def make_loss_fn(self, local_microbatches: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
            self.last_losses.append(loss.detach())
            return loss / local_microbatches  # scale_grads=False: the same scaling as the non-pipelined loop
        return loss_fn

    def _sum_tied_grads(self) -> None:
        if self.tie_group is None:
            return
        part = self.tok_emb if self.has_first else self.head if self.has_last else None
        if part is None:
            return
        grad = part.weight.grad
        assert grad is not None, "the tied weight has a gradient after backward"
        local = grad.to_local() if isinstance(grad, DTensor) else grad
        dist.all_reduce(local, group=self.tie_group)


def stage_layer_ids(layers: int, num_stages: int) -> list[list[int]]:
    per = layers // num_stages
    return [list(range(s * per, (s + 1) * per)) for s in range(num_stages)]


def _tie_group(mesh: DeviceMesh, pp_mesh: DeviceMesh) -> dist.ProcessGroup | None:
    """The group of first and last pp rank for this rank's (dp, tp) coordinates: where the tied gradient is summed.
    At pp = 2 it is the pp group; above, pairs made with new_group (a collective over all ranks)."""
    if pp_mesh.size() == 2:
        return pp_mesh.get_group()
    names = list(mesh.mesh_dim_names or ())
    grid = mesh.mesh.movedim(names.index("pp"), -1).reshape(-1, pp_mesh.size())
    me, mine = dist.get_rank(), None
    for row in grid.tolist():
        group = dist.new_group([row[0], row[-1]])
        if me in (row[0], row[-1]):
            mine = group
    return mine


def pipeline(model: GPT | Llama, mesh: DeviceMesh, parallelism: Parallelism, *, micro_batch: int,
             local_microbatches: int, wrap: Callable[[StageModule], nn.Module]) -> PipelinedModel:
    """Cuts `model` into this rank's stages, applies `wrap` (TP, checkpointing, FSDP2/DDP) to each and builds the
    schedule. `local_microbatches`: micro batches per dp rank and step."""
    cfg = model.cfg
    job = JobLayout(layers=cfg.layers, dim=cfg.dim, heads=cfg.heads, vocab=cfg.vocab, seq_len=cfg.seq_len,
                    pp=parallelism.pp, schedule=parallelism.schedule, stages_per_rank=parallelism.stages_per_rank,
                    microbatches=parallelism.microbatches)
    problems = [p for p in static_problems(job) if p.rule == "pp-layers"] + [pipeline_problem(job, local_microbatches)]
    if any(problems):  # the pipeline rules of layout/rules.py, the one definition
        raise PipelineError("; ".join(f"spec.{p}" for p in problems if p))
    pp_mesh = mesh["pp"]
    pp, pp_rank = pp_mesh.size(), pp_mesh.get_local_rank()
    num_stages = pp * parallelism.stages_per_rank
    layer_ids = stage_layer_ids(cfg.layers, num_stages)
    stage_ids = list(range(pp_rank, num_stages, pp))
    stages = [StageModule(model, layer_ids[s], first=s == 0, last=s == num_stages - 1) for s in stage_ids]
    tie_group = _tie_group(mesh, pp_mesh) if cfg.tied_embeddings else None
    wrapped = [wrap(stage) for stage in stages]
    pipe = PipelinedModel(stages, wrapped, stage_ids, pp_mesh, tie_group if pp_rank in (0, pp - 1) else None)
    coordinate = dict(zip(mesh.mesh_dim_names or (), mesh.get_coordinate() or ()))
    pipe.in_rank0_pp_group = all(c == 0 for name, c in coordinate.items() if name != "pp")

    per_run = parallelism.microbatches or local_microbatches
    pipe.runs = local_microbatches // per_run
    device = next(pipe.parameters()).device
    tp = mesh["tp"].size() if "tp" in (mesh.mesh_dim_names or ()) else 1
    # Static shapes: no dynamic shape inference (it runs a forward/backward that DDP would count as a step).
    # requires_grad marks the activations whose gradients flow back between stages.
    hidden = torch.empty(micro_batch, cfg.seq_len // tp, cfg.dim, device="meta", requires_grad=True)
    tokens = torch.empty(micro_batch, cfg.seq_len, dtype=torch.long, device="meta")
    logits = torch.empty(micro_batch, cfg.seq_len, cfg.vocab, device="meta", requires_grad=True)
    # Imported here, not at the top: jobs without pp then skip it at every cold rank start (~0.3 s of CPU; the
    # torch._dynamo it pulls in, DDP and FSDP import anyway).
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    pipeline_stages: list[_PipelineStageBase] = [
        PipelineStage(module, s, num_stages, device, input_args=tokens if s == 0 else hidden,
                      output_args=logits if s == num_stages - 1 else hidden, group=pipe.pp_group)
        for module, s in zip(wrapped, stage_ids)]
    loss_fn = pipe.make_loss_fn(local_microbatches)
    if parallelism.schedule == "interleaved-1f1b":
        pipe.schedule = ScheduleInterleaved1F1B(pipeline_stages, n_microbatches=per_run, loss_fn=loss_fn,
                                                scale_grads=False)
    else:
        single_stage = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[parallelism.schedule]
        pipe.schedule = single_stage(pipeline_stages[0], n_microbatches=per_run, loss_fn=loss_fn, scale_grads=False)
    return pipe


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor] | None:
    """The whole model's unsharded state dict on CPU, on global rank 0 (None elsewhere); a collective. Under
    pipeline parallel the stages are gathered from the pp group of rank 0."""
    if not isinstance(model, PipelinedModel):
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = _tensors(get_model_state_dict(model, options=options))
        return state if dist.get_rank() == 0 else None
    # Without cpu_offload every rank gets its stages' full tensors (with it, only global rank 0 would).
    stages = _tensors(get_model_state_dict(model, options=StateDictOptions(full_state_dict=True)))
    state = {k: v.detach().cpu() for k, v in stages.items()}
    if not model.in_rank0_pp_group:
        return None
    parts: list[Any] = [None] * model.pp_size  # each rank's `state`, on global rank 0
    dist.gather_object(state, parts if dist.get_rank() == 0 else None, group=model.pp_group, group_dst=0)
    if dist.get_rank() != 0:
        return None
    merged: dict[str, torch.Tensor] = {}
    for part in parts:
        merged.update(part)
    return merged


def _tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    # A full model state dict (full_state_dict=True) holds plain tensors only: no DTensors, no other values.
    return cast(dict[str, torch.Tensor], state)
