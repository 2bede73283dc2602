"""Whether a disk checkpoint holds the model being trained: its model tensors' names and global shapes against the
model's, before anything is loaded.

DCP loads only the keys the state dict asks for, so a checkpoint of a deeper model loads into a shallower one
without a word (its extra blocks dropped and training goes on), and one of another width fails on its first tensor
with a message about that tensor alone. Either way trainer.model (or checkpoint.dir) changed, and no restart and no
older checkpoint of the same directory fixes it: the start fails at once with what differs and what to do. A change
that keeps every tensor (e.g. a llama's seqLen, rope or norm settings) resumes as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

ModelTensors = dict[str, tuple[int, ...]]

PREFIX = "model."  # DCP flattens the app state's "model" entry into "model.<fqn>"
_BLOCK = re.compile(r"^model\.blocks\.(\d+)\.")
_EXAMPLES = 2


def model_tensors(model_state: Mapping[str, Any]) -> ModelTensors:
    """The checkpoint keys and global shapes of a model state dict's tensors (a DTensor's shape is its global
    one; a pipeline rank holds only its stages' entries)."""
    return {PREFIX + name: tuple(value.shape) for name, value in model_state.items() if hasattr(value, "shape")}


def saved_model_tensors(state_dict_metadata: Mapping[str, Any]) -> ModelTensors:
    """The same from a checkpoint's DCP metadata (`.metadata`'s state_dict_metadata)."""
    return {key: tuple(meta.size) for key, meta in state_dict_metadata.items()
            if key.startswith(PREFIX) and hasattr(meta, "size")}


def mismatch(saved: ModelTensors, expected: ModelTensors) -> str | None:
    """What differs between the checkpoint's model tensors and the model's (every rank's together), in words;
    None when they are the same. Tensors of blocks only one side has are said as the number of blocks."""
    if saved == expected:
        return None
    saved_blocks, blocks = _blocks(saved), _blocks(expected)
    parts = [f"{saved_blocks} blocks saved, {blocks} in this model"] if saved_blocks != blocks else []
    common = min(saved_blocks, blocks)

    def said(key: str) -> bool:  # a tensor of a block beyond the common ones: said by the count
        found = _BLOCK.match(key)
        return saved_blocks != blocks and found is not None and int(found.group(1)) >= common

    missing = [k for k in expected if k not in saved and not said(k)]
    extra = [k for k in saved if k not in expected and not said(k)]
    resized = [k for k in expected if k in saved and saved[k] != expected[k]]
    if missing:
        parts.append(f"the checkpoint lacks {len(missing)} of the model's tensors ({_names(missing)})")
    if extra:
        parts.append(f"it holds {len(extra)} the model lacks ({_names(extra)})")
    if resized:
        shapes = ", ".join(f"{k} {list(saved[k])} saved, {list(expected[k])} here" for k in resized[:_EXAMPLES])
        parts.append(f"{len(resized)} tensors differ in shape ({shapes}{_more(resized)})")
    return "; ".join(parts)


def _blocks(tensors: ModelTensors) -> int:
    return len({m.group(1) for m in map(_BLOCK.match, tensors) if m})


def _names(keys: list[str]) -> str:
    return ", ".join(keys[:_EXAMPLES]) + _more(keys)


def _more(keys: list[str]) -> str:
    return f", ... {len(keys) - _EXAMPLES} more" if len(keys) > _EXAMPLES else ""


def advice(step: int, path: str, directory: str, what: str) -> str:
    """The start's failure, short enough for a condition: which checkpoint, what differs, the user's ways on."""
    return (f"checkpoint.dir {directory} holds another model than trainer.model (newest checkpoint: step {step}): "
            f"{what}. Set trainer.model back to resume, or give a new checkpoint.dir to start afresh; the "
            f"checkpoints are kept (`flywheel export {path} --format hf --out DIR` makes them a "
            "trainer.model.pretrained)")
