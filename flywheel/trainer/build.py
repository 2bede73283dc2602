"""Which model to build: the shape from the spec (a preset with overrides, or a Hugging Face config.json), and the
module for its architecture."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import torch

from flywheel.spec import ModelSpec
from flywheel.spec_model import ModelShape
from flywheel.trainer.hf_config import HFConfigError, shape_from_config
from flywheel.trainer.llama import Llama
from flywheel.trainer.model import GPT


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
        return Llama(shape, seed=seed) if shape.architecture == "llama" else GPT(shape, seed=seed)
