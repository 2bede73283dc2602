"""Hugging Face weight names <-> Flywheel's, and loading a HF model directory into a parallelized model.

`load_pretrained` runs after `parallelize` (TP, FSDP2/DDP, pipeline stages): for every parameter this rank holds it
reads, with `safetensors.safe_open`, only the slice of the file tensor that its local shard covers (a DTensor's
shard offsets; the whole tensor for a replicated one), so no rank materialises the full model. Sharded
checkpoints (`model.safetensors.index.json`) are read file by file as the index says.

GPT-2 stores its projections as Conv1D weights (in, out): they are transposed, and a shard's slice is read from
the transposed region. A tied LM head without its own tensor in the file (the usual case) reads the embedding.
Tensors whose rows the model's weights layout orders otherwise (the Llama's q and k in the interleaved RoPE layout:
`Architecture.hf_row_order`) read the rows their shard's rows come from.
"""

from __future__ import annotations

import json
import re
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from flywheel.layout.hf_config import HFConfigError
from flywheel.layout.shape import ModelShape
from flywheel.trainer.models.registry import MODELS
from flywheel.trainer.models.weights_layout import layouts_of

# Wrappers that parallelize.py puts around modules (activation checkpointing, DDP) add these to parameter names.
_WRAPPER_PARTS = re.compile(r"(^module\.|_checkpoint_wrapped_module\.)")


def _compile(table: list[tuple[str, str, bool]]) -> list[tuple[re.Pattern[str], str, bool]]:
    return [(re.compile("^" + re.escape(ours).replace(r"\{i\}", r"(?P<i>\d+)") + "$"), theirs, transposed)
            for ours, theirs, transposed in table]


_TABLES = {name: _compile(list(model.hf_names)) for name, model in MODELS.items()}


def hf_name(name: str, architecture: str) -> tuple[str, bool]:
    """The HF tensor name of Flywheel parameter `name` and whether it is stored transposed."""
    for pattern, theirs, transposed in _TABLES[architecture]:
        match = pattern.match(name)
        if match:
            return theirs.replace("{i}", match.groupdict().get("i") or ""), transposed
    raise KeyError(f"{name}: no Hugging Face counterpart")


def clean_name(name: str) -> str:
    return _WRAPPER_PARTS.sub("", name)


class _Files:
    """The tensors of a HF model directory: name -> file, files opened lazily."""

    def __init__(self, directory: Path, stack: ExitStack) -> None:
        from safetensors import safe_open  # imported when used: jobs without `pretrained` never need it

        self._open, self._stack, self._handles = safe_open, stack, dict[Path, Any]()
        index = directory / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.where = {name: directory / file for name, file in weight_map.items()}
        elif (directory / "model.safetensors").exists():
            single = directory / "model.safetensors"
            with safe_open(str(single), framework="pt") as f:
                self.where = dict.fromkeys(f.keys(), single)
        else:
            raise HFConfigError(f"trainer.model.pretrained: {directory} has neither model.safetensors nor "
                                "model.safetensors.index.json; save the model with safetensors")

    def find(self, name: str) -> str | None:
        """`name`, or its form without the `transformer.`/`model.` prefix (original GPT-2 files lack it)."""
        for candidate in (name, name.split(".", 1)[1]):
            if candidate in self.where:
                return candidate
        return None

    def slice(self, name: str) -> Any:
        path = self.where[name]
        if path not in self._handles:
            self._handles[path] = self._stack.enter_context(self._open(str(path), framework="pt"))
        return self._handles[path].get_slice(name)


def _local_region(param: torch.Tensor) -> tuple[torch.Tensor, tuple[slice, ...], torch.Size]:
    """This rank's tensor to fill, the region of the global tensor it holds, and the global shape."""
    if isinstance(param, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        region = tuple(slice(o, o + s) for o, s in zip(offset, shape))
        return param.to_local(), region, param.shape
    return param, tuple(slice(0, s) for s in param.shape), param.shape


@torch.no_grad()
def load_pretrained(model: nn.Module, directory: str | Path, shape: ModelShape) -> None:
    """Fills every parameter this rank holds from the HF model in `directory` (reading only its slices)."""
    directory = Path(directory)
    architecture, layouts = MODELS[shape.architecture], layouts_of(model)
    with ExitStack() as stack:
        files = _Files(directory, stack)
        for raw_name, param in model.named_parameters():
            name = clean_name(raw_name)
            theirs, transposed = hf_name(name, shape.architecture)
            found = files.find(theirs)
            if found is None and name == "head.weight" and shape.tied_embeddings:
                found = files.find(architecture.hf_tied)
            if found is None:
                raise HFConfigError(f"trainer.model.pretrained: {directory} has no tensor {theirs} (for {name}); "
                                    "the weights do not match config.json")
            local, region, global_shape = _local_region(param)
            stored = files.slice(found)
            expected = list(reversed(global_shape)) if transposed else list(global_shape)
            if list(stored.get_shape()) != expected:
                raise HFConfigError(f"trainer.model.pretrained: {found} has shape {stored.get_shape()}, "
                                    f"config.json implies {expected}")
            order = architecture.hf_row_order(name, shape, layouts)
            local.copy_(_read(stored, region, transposed, order).to(local.dtype))


def _read(stored: Any, region: tuple[slice, ...], transposed: bool, order: torch.Tensor | None) -> torch.Tensor:
    """Our `region` of a file tensor (a safetensors slice): theirs transposed, or with our rows taken from their
    rows `order` (only the range those rows span is read; no architecture orders a transposed tensor)."""
    if transposed:
        data: torch.Tensor = stored[tuple(reversed(region))].t()
        return data
    rows = order[region[0]] if order is not None else None
    if rows is None or rows.numel() == 0:  # an empty shard (FSDP's last ranks of a small tensor) reads nothing
        data = stored[region]
        return data
    low, high = int(rows.min()), int(rows.max()) + 1
    span: torch.Tensor = stored[(slice(low, high), *region[1:])]
    return span[rows - low]
