"""`flywheel prepare-data INPUT... --tokenizer PATH --out DIR`: text, JSONL (a `text` field per line) and Parquet (a
`text` column, with pyarrow) files to a directory of memory-mapped token shards and its `index.json`
(data/shards.py), which `data.source` then reads.

The inputs are cut into chunks (line-aligned byte ranges; Parquet row groups) that worker processes tokenize in
parallel; the chunks come back in input order, so the shards are the same whatever the number of workers. Documents
(a JSONL line, a Parquet row, a whole .txt file) are followed by the tokenizer's end-of-text token when it has one.
Torch-free.
"""

from __future__ import annotations

import json
import multiprocessing
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from flywheel.data.shards import ShardIndex, dtype_for, write_index
from flywheel.data.tokenizers import Tokenizer, file_sha256, load_tokenizer

CHUNK_BYTES = 4 << 20  # a unit of work: big enough to amortise the hand-off, small enough to spread over workers
DEFAULT_SHARD_TOKENS = 1 << 28
EOS_CANDIDATES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
SUFFIXES = (".txt", ".jsonl", ".parquet")


class PrepareError(ValueError):
    """Inputs or options prepare-data cannot use; the message names the input or option and the fix."""


@dataclass(frozen=True)
class Chunk:
    path: str
    kind: str  # "txt", "jsonl" or "parquet"
    start: int  # byte offset (txt, jsonl) or row group (parquet)
    end: int
    last: bool  # the chunk that ends a .txt document
    size: int  # bytes, for the progress bar


def plan_chunks(inputs: list[str], chunk_bytes: int = CHUNK_BYTES) -> list[Chunk]:
    """The units of work, in stream order (raises PrepareError for a missing or unknown input)."""
    chunks: list[Chunk] = []
    for name in inputs:
        path = Path(name)
        if not path.is_file():
            raise PrepareError(f"input {name!r} does not exist; give .txt, .jsonl or .parquet files")
        if path.suffix not in SUFFIXES:
            raise PrepareError(f"input {name!r} is not .txt, .jsonl or .parquet; convert it to one of those")
        if path.suffix == ".parquet":
            chunks += _parquet_chunks(path)
        else:
            chunks += _line_chunks(path, path.suffix[1:], chunk_bytes)
    return chunks


def _line_chunks(path: Path, kind: str, chunk_bytes: int) -> list[Chunk]:
    size = path.stat().st_size
    bounds = [0]
    with open(path, "rb") as f:
        while bounds[-1] + chunk_bytes < size:
            f.seek(bounds[-1] + chunk_bytes)
            f.readline()  # to the next line start: a chunk never cuts a line (or a UTF-8 character)
            if f.tell() >= size:
                break
            bounds.append(f.tell())
    bounds.append(size)
    pairs = list(zip(bounds, bounds[1:]))
    return [Chunk(str(path), kind, a, b, i == len(pairs) - 1, b - a) for i, (a, b) in enumerate(pairs)]


def _parquet_chunks(path: Path) -> list[Chunk]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise PrepareError(f"input {str(path)!r} is Parquet, which needs the `pyarrow` package (not installed "
                           "here); pip install pyarrow, or convert it to .jsonl") from None
    meta = pq.ParquetFile(path).metadata
    return [Chunk(str(path), "parquet", g, g + 1, True, meta.row_group(g).total_byte_size)
            for g in range(meta.num_row_groups)]


def _documents(chunk: Chunk) -> list[str]:
    if chunk.kind == "parquet":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(chunk.path).read_row_group(chunk.start, columns=["text"])
        return [str(t) for t in table.column("text").to_pylist() if t]
    with open(chunk.path, "rb") as f:
        f.seek(chunk.start)
        raw = f.read(chunk.end - chunk.start).decode("utf-8", errors="replace")
    if chunk.kind == "txt":
        return [raw] if raw else []
    docs = []
    for n, line in enumerate(raw.splitlines()):
        if line.strip():
            try:
                docs.append(str(json.loads(line)["text"]))
            except (ValueError, KeyError, TypeError):
                raise PrepareError(f"{chunk.path}: a line near byte {chunk.start} (+{n} lines) is not a JSON "
                                   "object with a `text` field") from None
    return docs


_TOKENIZER: Tokenizer | None = None


def _init_worker(tokenizer_path: str) -> None:
    global _TOKENIZER
    _TOKENIZER = load_tokenizer(tokenizer_path)


def eos_id(tokenizer: Tokenizer) -> int | None:
    if not hasattr(tokenizer.impl, "token_to_id"):  # a tiktoken file carries no special tokens
        return None
    for token in EOS_CANDIDATES:
        found = tokenizer.impl.token_to_id(token)
        if found is not None:
            return int(found)
    return None


def tokenize_chunk(chunk: Chunk) -> np.ndarray:
    """The chunk's tokens (uint32), each document followed by the end-of-text token if the tokenizer has one."""
    assert _TOKENIZER is not None, "_init_worker first"
    eos = eos_id(_TOKENIZER)
    out: list[int] = []
    for ids in _TOKENIZER.encode_batch(_documents(chunk)):
        out += ids
        if eos is not None and (chunk.kind != "txt" or chunk.last):
            out.append(eos)
    return np.asarray(out, dtype=np.uint32)


class ShardWriter:
    """Appends tokens to `shard-NNNNN.bin` files of at most `shard_tokens` tokens each."""

    def __init__(self, out: Path, dtype: str, shard_tokens: int):
        self.out, self.dtype, self.shard_tokens = out, np.dtype(dtype), shard_tokens
        self.names: list[str] = []
        self.counts: list[int] = []

    def write(self, tokens: np.ndarray) -> None:
        while len(tokens):
            if not self.names or self.counts[-1] == self.shard_tokens:
                self.names.append(f"shard-{len(self.names):05d}.bin")
                self.counts.append(0)
                (self.out / self.names[-1]).write_bytes(b"")
            room = self.shard_tokens - self.counts[-1]
            with open(self.out / self.names[-1], "ab") as f:
                f.write(tokens[:room].astype(self.dtype.newbyteorder("<")).tobytes())
            self.counts[-1] += min(room, len(tokens))
            tokens = tokens[room:]


def _tokenized(chunks: list[Chunk], tokenizer_path: str, workers: int) -> Iterator[np.ndarray]:
    if workers <= 1:
        _init_worker(tokenizer_path)
        yield from map(tokenize_chunk, chunks)
        return
    # spawn, not fork: the tokenizers library's thread pool does not survive a fork
    with multiprocessing.get_context("spawn").Pool(workers, _init_worker, (tokenizer_path,)) as pool:
        yield from pool.imap(tokenize_chunk, chunks)


def prepare_data(inputs: list[str], tokenizer_path: str, out: str | Path, *, shard_tokens: int = DEFAULT_SHARD_TOKENS,
                 workers: int = 1, dtype: str = "auto", progress: Callable[[int, int], None] | None = None,
                 chunk_bytes: int = CHUNK_BYTES) -> ShardIndex:
    """Writes the shard directory `out` (created; must not hold an index already) and returns its index."""
    if shard_tokens < 1 or workers < 1:
        raise PrepareError("--shard-tokens and --workers must be at least 1")
    tokenizer = load_tokenizer(tokenizer_path)
    dtype = dtype_for(tokenizer.vocab) if dtype == "auto" else dtype
    if dtype == "uint16" and tokenizer.vocab > 1 << 16:
        raise PrepareError(f"--dtype uint16 cannot hold the tokenizer's {tokenizer.vocab} ids; use uint32 or auto")
    chunks = plan_chunks(inputs, chunk_bytes)
    root = Path(out)
    if (root / "index.json").exists():
        raise PrepareError(f"--out {root} already holds prepared data; remove it or choose another directory")
    root.mkdir(parents=True, exist_ok=True)
    writer = ShardWriter(root, dtype, shard_tokens)
    total, done = sum(c.size for c in chunks), 0
    for chunk, tokens in zip(chunks, _tokenized(chunks, tokenizer.path, workers), strict=True):
        writer.write(tokens)
        done += chunk.size
        if progress:
            progress(done, total)
    kept = Path(tokenizer.path)
    shutil.copy2(kept, root / kept.name)  # generate and export find the job's tokenizer beside the data
    index = ShardIndex(dtype=dtype, vocab=tokenizer.vocab, shards=tuple(writer.names), tokens=tuple(writer.counts),
                       tokenizer_sha256=file_sha256(kept), tokenizer=kept.name)
    write_index(root, index)
    return index


def progress_reporter(label: str) -> tuple[Callable[[int, int], None], Callable[[], None]]:
    """A rich progress bar on a terminal, else a plain line about every 10%: (update, close)."""
    if not sys.stdout.isatty():
        shown = [-1]

        def line(done: int, total: int) -> None:
            tenth = done * 10 // max(total, 1)
            if tenth != shown[0]:
                shown[0] = tenth
                print(f"{label}: {done * 100 // max(total, 1)}% ({done} of {total} bytes)", flush=True)
        return line, lambda: None
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(), TimeRemainingColumn())
    task = bar.add_task(label, total=None)
    bar.start()
    started = time.monotonic()

    def update(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    def close() -> None:
        bar.stop()
        print(f"{label}: done in {time.monotonic() - started:.1f}s", flush=True)
    return update, close
