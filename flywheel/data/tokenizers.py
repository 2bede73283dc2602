"""Tokenizers for `spec.trainer.data.tokenizer`, `flywheel prepare-data` and `flywheel generate`: a Hugging Face
`tokenizer.json` (through the `tokenizers` package) or a tiktoken BPE file (`.tiktoken`, through `tiktoken`, split
with the cl100k / Llama 3 pattern). Torch-free: the spec's validation reads a tokenizer's vocabulary size here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HF_TOKENIZER = "tokenizer.json"
TIKTOKEN_SUFFIX = ".tiktoken"
# The pre-tokenizer split of cl100k_base and Llama 3 (a .tiktoken file holds only the merges).
TIKTOKEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+")


class TokenizerError(ValueError):
    """A tokenizer file that cannot be used; the message names the file and the fix."""


@dataclass(frozen=True)
class Tokenizer:
    """One loaded tokenizer: `vocab` is the number of ids it may produce (every id is below it)."""

    path: str
    vocab: int
    impl: Any  # tokenizers.Tokenizer or tiktoken.Encoding

    def encode(self, text: str) -> list[int]:
        if hasattr(self.impl, "encode_ordinary"):  # tiktoken: special tokens are not read from data
            return list(self.impl.encode_ordinary(text))
        return list(self.impl.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if hasattr(self.impl, "encode_ordinary_batch"):
            return [list(ids) for ids in self.impl.encode_ordinary_batch(texts)]
        return [list(e.ids) for e in self.impl.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return str(self.impl.decode(ids))


def resolve_tokenizer(tokenizer: str | None, pretrained: str | None, source: str | None = None) -> str | None:
    """The tokenizer file a job uses: `data.tokenizer`, else its pretrained directory's tokenizer.json, else (when
    `source` is given) the copy a prepare-data directory keeps beside its shards; None if there is none."""
    if tokenizer:
        return tokenizer
    if pretrained and (Path(pretrained) / HF_TOKENIZER).is_file():
        return str(Path(pretrained) / HF_TOKENIZER)
    index = Path(source) / "index.json" if source else None
    if index is not None and index.is_file():
        try:
            kept = json.loads(index.read_text()).get("tokenizer")
        except (OSError, ValueError):
            return None
        if kept and (index.parent / kept).is_file():
            return str(index.parent / kept)
    return None


def load_tokenizer(path: str | Path) -> Tokenizer:
    """Raises TokenizerError for a missing, unreadable or unknown file."""
    file = Path(path)
    if file.is_dir() and (file / HF_TOKENIZER).is_file():
        file = file / HF_TOKENIZER
    if not file.is_file():
        raise TokenizerError(f"tokenizer {str(path)!r} does not exist; give a tokenizer.json or a .tiktoken file")
    if file.suffix == TIKTOKEN_SUFFIX:
        return _load_tiktoken(file)
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise TokenizerError("reading tokenizer.json needs the `tokenizers` package; pip install "
                             "'flywheel[hf]'") from None
    try:
        impl = HFTokenizer.from_file(str(file))
    except Exception as err:  # noqa: BLE001 (the Rust library raises plain Exceptions)
        raise TokenizerError(f"tokenizer {str(file)!r} is not a Hugging Face tokenizer.json ({err}); give a "
                             "tokenizer.json or a .tiktoken file") from None
    return Tokenizer(str(file), int(impl.get_vocab_size(with_added_tokens=True)), impl)


def _load_tiktoken(file: Path) -> Tokenizer:
    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
    except ImportError:
        raise TokenizerError(f"{file}: reading .tiktoken files needs the `tiktoken` package; pip install "
                             "'flywheel[hf]'") from None
    try:
        ranks = load_tiktoken_bpe(str(file))
    except (ValueError, OSError) as err:  # base64 or format errors
        raise TokenizerError(f"tokenizer {str(file)!r} is not a tiktoken BPE file ({err})") from None
    impl = tiktoken.Encoding(name=file.stem, pat_str=TIKTOKEN_PATTERN, mergeable_ranks=ranks, special_tokens={})
    return Tokenizer(str(file), int(impl.n_vocab), impl)


def tokenizer_vocab(path: str | None) -> int:
    """The tokenizer's vocabulary size, or 0 when there is none or it cannot be read here (the worker's preflight
    reads it again where the job runs)."""
    if not path:
        return 0
    try:
        return load_tokenizer(path).vocab
    except TokenizerError:
        return 0


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
