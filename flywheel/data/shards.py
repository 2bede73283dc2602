"""The token-shard directory `flywheel prepare-data` writes and `data.source` reads: raw little-endian token files
(`shard-NNNNN.bin`, uint16 when the vocab fits, else uint32) and an `index.json` naming them in order with their
token counts, the dtype, the vocab and the tokenizer's sha256. Torch-free: `flywheel run`/`plan` check a source here.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

INDEX = "index.json"
FORMAT = "flywheel-token-shards/1"
UINT16_VOCAB = 1 << 16


class IndexError_(ValueError):
    """A shard directory that cannot be read; the message names the file and the fix."""


@dataclass(frozen=True)
class ShardIndex:
    dtype: str  # "uint16" or "uint32"
    vocab: int  # the tokenizer's vocab: every id is below it
    shards: tuple[str, ...]  # file names in the directory, in stream order
    tokens: tuple[int, ...]  # tokens per shard
    tokenizer_sha256: str
    tokenizer: str = ""  # the tokenizer file copied into the directory (its name), "" if none
    format: str = FORMAT

    @property
    def total_tokens(self) -> int:
        return sum(self.tokens)


TOKEN_BYTES = {"uint16": 2, "uint32": 4}  # the token dtypes a shard may hold (no numpy here: the operator imports this)


def dtype_for(vocab: int) -> str:
    return "uint16" if vocab <= UINT16_VOCAB else "uint32"


def write_index(directory: Path, index: ShardIndex) -> None:
    doc = asdict(index) | {"total_tokens": index.total_tokens}
    (directory / INDEX).write_text(json.dumps(doc, indent=2) + "\n")


def read_index(directory: str | Path) -> ShardIndex:
    """The directory's index, its shards checked to exist with the sizes it records (raises IndexError_)."""
    root = Path(directory)
    path = root / INDEX
    try:
        doc = json.loads(path.read_text())
        index = ShardIndex(dtype=doc["dtype"], vocab=int(doc["vocab"]), shards=tuple(doc["shards"]),
                           tokens=tuple(int(n) for n in doc["tokens"]), tokenizer_sha256=doc["tokenizer_sha256"],
                           tokenizer=doc.get("tokenizer", ""), format=doc.get("format", FORMAT))
    except OSError as err:
        raise IndexError_(f"{path}: cannot read ({err.strerror}); a shard directory is written by `flywheel "
                          "prepare-data`") from None
    except (ValueError, KeyError, TypeError) as err:
        raise IndexError_(f"{path}: not a prepare-data index ({err!r}); write it again with `flywheel "
                          "prepare-data`") from None
    if index.dtype not in TOKEN_BYTES or len(index.shards) != len(index.tokens):
        raise IndexError_(f"{path}: dtype {index.dtype!r} or shard list is malformed; write it again with "
                          "`flywheel prepare-data`")
    width = TOKEN_BYTES[index.dtype]
    for name, count in zip(index.shards, index.tokens, strict=True):
        shard = root / name
        if not shard.is_file() or shard.stat().st_size != count * width:
            raise IndexError_(f"{shard}: missing or not {count} {index.dtype} tokens as {INDEX} says; write the "
                              "directory again with `flywheel prepare-data`")
    return index


def source_problem(source: str, field: str = "source") -> str | None:
    """Why `data.<field>` (the training source, or the validation data) cannot be read on this machine (a message
    naming the field), or None when it can."""
    if source == "synthetic":
        return None
    name, path = f"spec.trainer.data.{field}", Path(source)
    if path.is_dir():
        try:
            read_index(path)
        except IndexError_ as err:
            return f"{name}: {err}"
        return None
    if not path.is_file():
        return (f"{name}: {source!r} does not exist; give an existing file, a shard directory "
                "(`flywheel prepare-data`) or 'synthetic'")
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as err:
        return f"{name}: {source!r} is not readable ({err.strerror}); fix its permissions"
    return None
