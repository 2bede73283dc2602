"""`flywheel export RUN_OR_CHECKPOINT --format hf --out DIR`: a committed checkpoint to a Hugging Face directory.

The trainer records the model it trains (`model.json`: its shape, and the `pretrained` directory it started from)
in the checkpoint directory. Export finds the checkpoint (a run directory: the newest checkpoint its events name;
a checkpoint directory: its newest committed step; or one `step-NNNNNNNN` folder), loads only the model's tensors
from the DCP files in this one process (whatever layout and world size wrote them: DCP stores global tensors by
name), renames them to transformers' names (in their rows' order: a checkpoint records its weights layouts,
`weights_layout.py`) and writes config.json, safetensors (sharded with an index above
`max_shard_bytes`) and the tokenizer files of the pretrained directory, if it had any.
"""

from __future__ import annotations

import json
import logging
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from flywheel.data.tokenizers import resolve_tokenizer
from flywheel.layout.hf_config import config_from_shape
from flywheel.layout.shape import ModelShape, shape_from_dict, shape_to_dict
from flywheel.trainer.checkpoint import store
from flywheel.trainer.models.hf_weights import hf_name
from flywheel.trainer.models.registry import MODELS
from flywheel.trainer.models.weights_layout import LAYOUTS_KEY

if TYPE_CHECKING:
    from flywheel.spec.job import Data

log = logging.getLogger("flywheel.trainer")

MODEL_RECORD = "model.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "generation_config.json")
MAX_SHARD_BYTES = 2 << 30


class ExportError(ValueError):
    """Nothing exportable where the user pointed; the message says what was expected."""


def write_model_record(checkpoint_dir: str | Path, shape: ModelShape, pretrained: str | None,
                       data: Data | None = None) -> None:
    """`model.json`: the shape, the pretrained directory, the data source and the job's tokenizer file (generate
    decodes with it, export copies it)."""
    root = Path(checkpoint_dir)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = resolve_tokenizer(data.tokenizer if data else None, pretrained, data.source if data else None)
    record = {"shape": shape_to_dict(shape), "pretrained": _absolute(pretrained),
              "data_source": _absolute(data.source if data and not data.is_synthetic else None),
              "tokenizer": _absolute(tokenizer)}
    (root / MODEL_RECORD).write_text(json.dumps(record, indent=2) + "\n")


def record_model(checkpoint_dir: str | Path, shape: ModelShape, pretrained: str | None,
                 data: Data | None = None) -> None:
    """write_model_record for the training worker (rank 0, at start). An unwritable directory is not its to report:
    training goes on and the checkpointer says what it cannot write (event, status) without spending a restart."""
    try:
        write_model_record(checkpoint_dir, shape, pretrained, data)
    except OSError as err:
        log.warning("could not write %s under %s (%s); `flywheel export` and `generate` need it; checkpoint saves "
                    "report their own failures", MODEL_RECORD, checkpoint_dir, err)


def _absolute(path: str | None) -> str | None:
    return str(Path(path).resolve()) if path else None


def find_checkpoint(source: str | Path) -> Path:
    """The step folder to export from a run directory, a checkpoint directory or a step folder."""
    path = Path(source)
    events = path / "events.jsonl"
    if events.exists():
        saved = [json.loads(line) for line in events.read_text().splitlines() if '"checkpoint"' in line]
        paths = [e["path"] for e in saved if e.get("event") == "checkpoint" and "path" in e]
        if not paths:
            raise ExportError(f"{path}: the run saved no checkpoint; give a checkpoint directory instead")
        path = Path(paths[-1]).parent
    if store.read_commit(path) is not None:
        return path
    committed = store.committed(path)
    if not committed:
        raise ExportError(f"{path}: no committed checkpoint here; give a run directory, a checkpoint directory "
                          "(spec.checkpoint.dir) or one of its step-NNNNNNNN folders")
    return Path(committed[-1].path)


def load_model_state(step_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The model's full tensors from a DCP checkpoint, in this process (no process group), and the weights layouts
    it recorded (none before layouts were recorded: `weights_layout.set_layouts` takes that as the legacy ones)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        state = _load_state_dict_from_keys(keys={"model", LAYOUTS_KEY}, checkpoint_id=str(step_dir))
    model = state["model"]
    tensors = {name: tensor for name, tensor in model.items() if isinstance(tensor, torch.Tensor)}
    return tensors, dict(state.get(LAYOUTS_KEY, {}))


def to_hf_state(state: dict[str, torch.Tensor], shape: ModelShape, layouts: dict[str, str]) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in state.items():
        if name == "head.weight" and shape.tied_embeddings:
            continue  # transformers ties lm_head to the embedding from config.json
        theirs, transposed = hf_name(name, shape.architecture)
        order = MODELS[shape.architecture].hf_row_order(name, shape, layouts)
        if order is not None:
            tensor = tensor[order.argsort()]
        out[theirs] = (tensor.t() if transposed else tensor).contiguous()
    return out


def _shards(tensors: dict[str, torch.Tensor], max_bytes: int) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    return shards


def save_hf(tensors: dict[str, torch.Tensor], config: dict[str, Any], out: Path, max_shard_bytes: int) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shards = _shards(tensors, max_shard_bytes)
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


@dataclass(frozen=True)
class CheckpointModel:
    """A committed checkpoint's model: the step folder, the recorded shape and job files, the full tensors and their
    weights layouts."""

    step_dir: Path
    shape: ModelShape
    record: dict[str, Any]
    state: dict[str, torch.Tensor]
    layouts: dict[str, str]


def load_checkpoint_model(source: str | Path) -> CheckpointModel:
    """The model of the checkpoint `source` names (a run, a checkpoint directory or a step folder), in this process:
    what `flywheel export` writes out and `flywheel generate` samples from."""
    step_dir = find_checkpoint(source)
    record_path = step_dir.parent / MODEL_RECORD
    if not record_path.exists():
        raise ExportError(f"{record_path} is missing: the checkpoint was written by a trainer that did not record "
                          "its model; retrain with this version or export from a newer checkpoint")
    record = json.loads(record_path.read_text())
    return CheckpointModel(step_dir, shape_from_dict(record["shape"]), record, *load_model_state(step_dir))


def export_hf(source: str | Path, out: str | Path, *, max_shard_bytes: int = MAX_SHARD_BYTES) -> Path:
    """Writes the HF directory `out` from the checkpoint `source` names; returns the step folder used."""
    loaded = load_checkpoint_model(source)
    hf_state = to_hf_state(loaded.state, loaded.shape, loaded.layouts)
    save_hf(hf_state, config_from_shape(loaded.shape), Path(out), max_shard_bytes)
    pretrained, tokenizer = loaded.record.get("pretrained"), loaded.record.get("tokenizer")
    for name in TOKENIZER_FILES if pretrained else ():
        if (Path(str(pretrained)) / name).exists():
            shutil.copy2(Path(str(pretrained)) / name, Path(out) / name)
    if tokenizer and Path(tokenizer).name == "tokenizer.json" and Path(tokenizer).is_file():
        shutil.copy2(tokenizer, Path(out) / "tokenizer.json")  # the job's own (data.tokenizer) wins
    return loaded.step_dir
