"""What a checkpoint holds: model, optimizer, scheduler, data position, per-rank RNG states and the model's weights
layouts."""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.tensor import DTensor

from flywheel.torch_compat import dtensor_local
from flywheel.trainer.models.weights_layout import LAYOUTS_KEY, layouts_of, set_layouts


class DataPosition(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def rng_key(rank: int) -> str:
    # DCP de-duplicates equal keys across ranks (one rank writes them), so per-rank state needs per-rank keys.
    return f"rng_rank{rank}"


def capture_rng(cuda: bool) -> dict[str, Any]:
    """The RNG states; the CUDA generators' with `cuda` (the model is on a GPU). Decided by the job, not by whether
    CUDA happens to be initialised yet: pinned staging buffers initialise it after the first save's capture, and a
    restore whose template then asked for CUDA states that save never wrote would fail."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if cuda:
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def drop_not_saved(state: dict[str, Any], rank: int, saved_keys: Mapping[str, Any]) -> None:
    """Leave out of a load template the parts a checkpoint may lack (DCP's flattened keys, e.g. `rng_rank0.cuda.0`):
    RNG parts (one written by a CPU job restored on a GPU keeps the CUDA generators as they are) and weights layouts
    (one written before a layout was recorded holds the legacy layout: `weights_layout.py`)."""
    for entry in (rng_key(rank), LAYOUTS_KEY):
        parts = state.get(entry)
        if not isinstance(parts, dict):
            continue
        prefix = f"{entry}."
        saved = {key[len(prefix):].split(".", 1)[0] for key in saved_keys if key.startswith(prefix)}
        for part in [k for k in parts if k not in saved]:
            del parts[part]


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class AppState(Stateful):
    """The training state as one Stateful. Model and optimizer go through DCP's get/set_state_dict, so they are
    saved as shards (DTensor under FSDP2) and resharded on load at another world size."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler.LRScheduler, data: DataPosition, *,
                 rank: int, world_size: int) -> None:
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.data = data
        self.rank = rank
        self.world_size = world_size
        self.cuda_rng = any(p.device.type == "cuda" for p in model.parameters())
        # Pipeline parallel: each rank holds some stages. Checkpoint keys stay the whole model's FQNs; the last
        # stage's copy of a tied weight is saved under the tied source's name, and the optimizer's param_groups
        # (one object in the checkpoint, written by one rank) list every stage's parameters, so any layout finds
        # its own in them.
        self.aliases: dict[str, str] = dict(getattr(model, "state_dict_aliases", {}))
        self.group_params: list[list[str]] | None = None
        pp_group = getattr(model, "pp_group", None)
        if pp_group is not None:
            # From named_parameters, not get_state_dict: that would initialise the optimizer state (a zero step).
            fqns = {id(p): name for name, p in model.named_parameters()}
            self.local_params = [[fqns[id(p)] for p in g["params"]] for g in optimizer.param_groups]
            local = [[self.aliases.get(f, f) for f in params] for params in self.local_params]
            gathered: list[Any] = [None] * dist.get_world_size(pp_group)
            dist.all_gather_object(gathered, local, group=pp_group)
            self.group_params = [list(dict.fromkeys(f for part in gathered for f in part[i]))
                                 for i in range(len(local))]

    def state_dict(self, *, include_rng: bool = True) -> dict[str, Any]:
        """Live references to model and optimizer tensors (copy before they change); the rest is a copy.

        Leave RNG out (include_rng=False) when loading a checkpoint saved at another world size: its ranks'
        streams do not map onto ours, and DCP would fail on keys the checkpoint does not have."""
        optim_sd: dict[str, Any]  # renamed below: a plain dict, not torch's OptimizerStateType
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        if self.group_params is not None:
            optim_sd = _rename_optim(optim_sd, self.aliases)
            for group, params in zip(optim_sd["param_groups"], self.group_params):
                group["params"] = list(params)
        state: dict[str, Any] = {
            "model": model_sd,
            "optim": optim_sd,
            "scheduler": copy.deepcopy(self.scheduler.state_dict()),
            "data": copy.deepcopy(self.data.state_dict()),
            "world_size": self.world_size,
            LAYOUTS_KEY: layouts_of(self.model),
        }
        if include_rng:
            state[rng_key(self.rank)] = capture_rng(self.cuda_rng)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        optim_sd = state_dict["optim"]
        if self.group_params is not None:
            optim_sd = _rename_optim(optim_sd, {v: k for k, v in self.aliases.items()})
            # Back to this rank's own parameters (torch splits a superset by name only when some state exists).
            optim_sd["param_groups"] = [{**g, "params": list(params)}
                                        for g, params in zip(optim_sd["param_groups"], self.local_params)]
        set_layouts(self.model, state_dict.get(LAYOUTS_KEY, {}))
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"], optim_state_dict=optim_sd)
        self.scheduler.load_state_dict(state_dict["scheduler"])
        self.data.load_state_dict(state_dict["data"])
        rng = state_dict.get(rng_key(self.rank))
        if rng is not None:
            restore_rng(rng)

    def staging_template(self) -> list[torch.Tensor]:
        """Tensors shaped as the local tensors a save stages (for the checkpointer to reserve its buffers before the
        first save). Before the first optimizer step there is no optimizer state yet, and reading it through DCP
        would take a zero step that changes the run; AdamW's moments are then those it will create."""
        tensors = [_local(t) for t in get_model_state_dict(self.model).values() if isinstance(t, torch.Tensor)]
        if self.optimizer.state:
            tensors += [_local(t) for s in self.optimizer.state.values() for t in s.values()
                        if isinstance(t, torch.Tensor)]
        elif isinstance(self.optimizer, torch.optim.Adam):  # AdamW too
            for group in self.optimizer.param_groups:
                for param in group["params"]:
                    local = _local(param)
                    tensors += [local, local, torch.zeros((), dtype=torch.float32)]  # exp_avg, exp_avg_sq, step
        return tensors

    def parameter_storages(self) -> set[int]:
        """Data pointers of the parameters' (local) storages. Only optimizer.step() changes these, so they may be
        copied while the next forward/backward runs; anything else in the model state (buffers such as running
        statistics, which a forward updates) must be copied at once."""
        ptrs = set()
        for param in self.model.parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            ptrs.add(local.untyped_storage().data_ptr())
        return ptrs


def _local(t: torch.Tensor) -> torch.Tensor:
    return dtensor_local(t) if isinstance(t, DTensor) else t


def _rename_optim(optim_sd: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """A copy of the optimizer state dict with parameter FQNs renamed (state keys and param_groups' params)."""
    return {"state": {names.get(k, k): v for k, v in optim_sd["state"].items()},
            "param_groups": [{**g, "params": [names.get(f, f) for f in g["params"]]}
                             for g in optim_sd["param_groups"]]}
