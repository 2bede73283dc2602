"""`flywheel generate RUN_OR_CHECKPOINT --prompt TEXT`: samples a continuation from a trained model.

The model comes from the checkpoint exactly as `flywheel export` reads it (hf_export.load_checkpoint_model), is
built plain on CPU and decodes token by token over the last `seq_len` tokens (no KV cache: this is for looking at
a model, not serving it). Greedy at temperature 0, else temperature and top-p (nucleus) sampling from a generator
seeded by `seed`. Text goes through the job's tokenizer, or bytes for a job without one (.txt data).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from flywheel.data.tokenizers import Tokenizer, load_tokenizer
from flywheel.layout.rules import BYTE_VOCAB
from flywheel.trainer.models.hf_export import CheckpointModel, load_checkpoint_model
from flywheel.trainer.models.registry import build_model
from flywheel.trainer.models.weights_layout import set_layouts


@dataclass(frozen=True)
class GenerateOptions:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_new_tokens < 0 or self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("--max-new-tokens >= 0, --temperature >= 0 and 0 < --top-p <= 1")


class ByteTokenizer:
    """The byte-level tokens of .txt jobs."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if i < BYTE_VOCAB).decode("utf-8", errors="replace")


def job_tokenizer(loaded: CheckpointModel, override: str | None) -> Tokenizer | ByteTokenizer:
    path = override or loaded.record.get("tokenizer")
    if path:
        return load_tokenizer(path)
    if loaded.shape.vocab < BYTE_VOCAB:
        raise ValueError(f"{loaded.step_dir}: the job had no tokenizer and its vocab ({loaded.shape.vocab}) is "
                         "smaller than bytes; give --tokenizer")
    return ByteTokenizer()


def load_model(loaded: CheckpointModel) -> torch.nn.Module:
    model = build_model(loaded.shape)
    set_layouts(model, loaded.layouts)  # the layout the weights were trained in
    missing, unexpected = model.load_state_dict(loaded.state, strict=False)
    params = {name for name, _ in model.named_parameters()}
    if unexpected or params & set(missing):
        raise ValueError(f"{loaded.step_dir}: the checkpoint does not match its recorded model (missing "
                         f"{sorted(params & set(missing))[:3]}, unexpected {sorted(unexpected)[:3]})")
    return model.eval()


def next_token(logits: torch.Tensor, options: GenerateOptions, generator: torch.Generator) -> int:
    """One token from the last position's logits `[vocab]`."""
    if options.temperature == 0:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.double() / options.temperature, dim=-1)
    ordered, ids = torch.sort(probs, descending=True)
    # Keep the smallest prefix whose mass reaches top_p (the first token always).
    keep = (torch.cumsum(ordered, 0) - ordered) < options.top_p
    ordered = ordered * keep
    return int(ids[torch.multinomial(ordered / ordered.sum(), 1, generator=generator)])


@torch.no_grad()
def generate_ids(model: torch.nn.Module, prompt: list[int], context: int, options: GenerateOptions) -> list[int]:
    generator = torch.Generator().manual_seed(options.seed)
    tokens = list(prompt)
    for _ in range(options.max_new_tokens):
        window = torch.tensor([tokens[-context:]], dtype=torch.long)
        tokens.append(next_token(model(window)[0, -1].float(), options, generator))
    return tokens[len(prompt):]


def generate_text(source: str | Path, prompt: str, options: GenerateOptions, tokenizer: str | None = None) -> str:
    """The prompt followed by the sampled continuation."""
    loaded = load_checkpoint_model(source)
    codec = job_tokenizer(loaded, tokenizer)
    ids = codec.encode(prompt)
    if not ids:
        raise ValueError("--prompt encodes to no tokens; give some text")
    # The window the model was trained on (a gpt model has no positions past max_positions >= seq_len anyway).
    return prompt + codec.decode(generate_ids(load_model(loaded), ids, loaded.shape.seq_len, options))
