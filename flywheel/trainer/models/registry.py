"""The model architectures, one entry each (as TorchTitan registers its models): the module, its tensor-parallel plan
and its Hugging Face weight names, each in the architecture's own folder (models/<architecture>/). Adding an
architecture is a folder, an entry here, its shape rules in flywheel/layout/ and its class in `Decoder`
(distributed/pipeline_parallel.py). Also which shape to build: the spec's (a preset with overrides) or a Hugging
Face config.json's."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ParallelStyle

from flywheel.layout.hf_config import HFConfigError, shape_from_config
from flywheel.layout.shape import ModelShape
from flywheel.spec.job import ModelSpec
from flywheel.trainer.models.gpt import hf_names as gpt_names
from flywheel.trainer.models.gpt import tp_plan as gpt_tp
from flywheel.trainer.models.gpt.model import GPT
from flywheel.trainer.models.llama import hf_names as llama_names
from flywheel.trainer.models.llama import tp_plan as llama_tp
from flywheel.trainer.models.llama.model import Llama


@dataclass(frozen=True)
class Architecture:
    """What the trainer needs of one architecture; the model itself knows nothing of parallelism."""

    name: str  # ModelShape.architecture
    model: Callable[..., GPT | Llama]  # (shape, seed=...) -> the plain model
    tp_block_plan: Callable[[nn.Module], dict[str, ParallelStyle]]  # a block's attention and MLP over tp
    tp_after_block: Callable[[nn.Module, DeviceMesh], None]  # hooks a block needs once sharded
    hf_names: tuple[tuple[str, str, bool], ...]  # (ours, Hugging Face's, transposed), `{i}` the block index
    hf_tied: str  # the embedding a tied LM head reads when the file has no lm_head.weight
    # (our name, shape, the model's weights layouts) -> our rows as indices of HF's rows, None when in their order
    hf_row_order: Callable[[str, ModelShape, Mapping[str, str]], torch.Tensor | None]


MODELS: dict[str, Architecture] = {
    "gpt": Architecture("gpt", GPT, gpt_tp.block_plan, gpt_tp.after_block, tuple(gpt_names.HF_NAMES),
                        gpt_names.HF_TIED, gpt_names.hf_row_order),
    "llama": Architecture("llama", Llama, llama_tp.block_plan, llama_tp.after_block, tuple(llama_names.HF_NAMES),
                          llama_names.HF_TIED, llama_names.hf_row_order),
}


def read_hf_config(directory: str | Path) -> dict[str, object]:
    path = Path(directory) / "config.json"
    try:
        config = json.loads(path.read_text())
    except OSError as err:
        raise HFConfigError(f"trainer.model.pretrained: cannot read {path}: {err.strerror}; give a Hugging Face "
                            "model directory (config.json + safetensors)") from None
    except json.JSONDecodeError as err:
        raise HFConfigError(f"trainer.model.pretrained: {path} is not JSON: {err}") from None
    if not isinstance(config, dict):
        raise HFConfigError(f"trainer.model.pretrained: {path} is not a JSON object")
    return config


def model_shape(spec: ModelSpec) -> ModelShape:
    """The shape `spec` describes; a pretrained model's from its config.json (raises HFConfigError)."""
    if spec.pretrained:
        return shape_from_config(read_hf_config(spec.pretrained), spec.seq_len)
    return spec.shape()


def build_model(shape: ModelShape, seed: int = 0, device: torch.device | None = None) -> GPT | Llama:
    """The plain model, weights a pure function of `seed`; parallelize.py shards it. On the default device; on the
    meta device (`materialize.META`) it takes no memory and `parallelize` materialises this rank's parameters after
    sharding them, with the same values (`materialize.py`)."""
    with torch.device(device) if device is not None else nullcontext():  # else the caller's default device
        return MODELS[shape.architecture].model(shape, seed=seed)
