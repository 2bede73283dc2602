"""The trainer's name for the Hugging Face config mapping, which lives torch-free in `flywheel/hf_config.py` so the
planner (below the spec, which the API imports) can size a pretrained model without importing the trainer."""

from flywheel.hf_config import (
    DEFAULT_SEQ_LEN,
    GPT2,
    LLAMA_FAMILY,
    HFConfigError,
    architecture_of,
    config_from_shape,
    shape_from_config,
)

__all__ = ["DEFAULT_SEQ_LEN", "GPT2", "LLAMA_FAMILY", "HFConfigError", "architecture_of", "config_from_shape",
           "shape_from_config"]
