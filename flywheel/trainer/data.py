"""The deterministic sample stream. Sample `i` (seq_len + 1 tokens) is a pure function of (source, seed, i), and the
only position is `consumed_samples`; so a resume, at any data-parallel size, continues at the exact next sample.

Sources:
- synthetic: a fixed random Markov chain (each token has `SYNTHETIC_BRANCHING` possible successors, seeded by
  `seed`) with a little uniform noise; learnable, so the loss visibly falls towards ~log(branching).
- `.txt`: the file's bytes are the tokens (vocab 256).
- `.npy` / `.bin`: uint16 tokens, memory-mapped.
- a directory written by `flywheel prepare-data`: its shards (uint16 or uint32), memory-mapped and read as one
  stream in index order, so a window may span two shards.
File samples are windows at offsets `k * seq_len`, visited in a seeded permutation per epoch.

Validation (evaluation) data: `data.validation` (any of the above, read from sample 0 on), or
`data.validationFraction` of the source's windows held out: the last ones of the token stream, which the training
permutation then never visits, read in order; a synthetic source's held-out data is a disjoint sample stream.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from flywheel.data.shards import IndexError_, read_index
from flywheel.data.tokenizers import TokenizerError, file_sha256, load_tokenizer
from flywheel.layout.rules import tokenizer_vocab_problem

SYNTHETIC_BRANCHING = 4  # successors per token in the synthetic chain: the loss floor is about log(4)
SYNTHETIC_NOISE = 0.05  # fraction of tokens replaced by uniform noise


class DataError(ValueError):
    """Data that cannot feed this model (missing file, too short, tokens outside the vocabulary): a user error."""


class SampleSource(Protocol):
    seq_len: int

    def sample(self, index: int) -> np.ndarray:
        """Tokens `[seq_len + 1]` (int64) of sample `index`."""
        ...


class SyntheticSource:
    """x[t+1] = perm[(perm_inv[x[t]] + offset[k]) % vocab] with k uniform in [0, branching): a random bigram table
    in which every token has `branching` successors. Computed without a Python loop (a cumulative sum)."""

    def __init__(self, vocab: int, seq_len: int, seed: int, stream: int = 1):
        self.vocab, self.seq_len, self.seed, self.stream = vocab, seq_len, seed, stream
        table_rng = np.random.default_rng([seed, 0x5EED])
        self.perm = table_rng.permutation(vocab)
        self.offsets = table_rng.choice(np.arange(1, vocab), size=min(SYNTHETIC_BRANCHING, vocab - 1),
                                        replace=False)

    def sample(self, index: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, self.stream, index])
        n = self.seq_len + 1
        steps = self.offsets[rng.integers(0, len(self.offsets), size=n)]
        steps[0] = rng.integers(0, self.vocab)  # the start state
        tokens: np.ndarray = self.perm[np.cumsum(steps) % self.vocab]
        noisy = rng.random(n) < SYNTHETIC_NOISE
        tokens[noisy] = rng.integers(0, self.vocab, size=int(noisy.sum()))
        return tokens.astype(np.int64)


class TokenArray(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, window: slice, /) -> np.ndarray: ...


class ShardedTokens:
    """A prepare-data directory's shards as one token stream (each shard memory-mapped; nothing read up front)."""

    def __init__(self, directory: str, vocab: int):
        try:
            index = read_index(directory)
        except IndexError_ as err:
            raise DataError(f"data.source: {err}") from None
        if index.vocab > vocab:
            raise DataError(f"data.source {directory!r} was tokenized with a vocab of {index.vocab} but the model's "
                            f"vocab is {vocab}; set trainer.model.vocab to at least {index.vocab}")
        self.index = index
        self.shards = [np.memmap(Path(directory) / name, dtype=np.dtype(index.dtype).newbyteorder("<"), mode="r")
                       for name, count in zip(index.shards, index.tokens, strict=True) if count]
        self.starts = np.cumsum([0] + [len(s) for s in self.shards])  # stream offset of each shard, then the end

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, window: slice, /) -> np.ndarray:
        start, stop = int(window.start), min(int(window.stop), len(self))
        parts = []
        shard = int(np.searchsorted(self.starts, start, side="right")) - 1
        while start < stop:
            offset = start - int(self.starts[shard])
            take = min(stop - start, len(self.shards[shard]) - offset)
            parts.append(self.shards[shard][offset:offset + take])
            start, shard = start + take, shard + 1
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)


class TokenFileSource:
    """Windows of a token array (bytes of a .txt, uint16 .npy/.bin, or a shard directory), in a seeded permutation
    per epoch."""

    def __init__(self, path: str, vocab: int, seq_len: int, seed: int, held_out_fraction: float = 0.0):
        self.path, self.seq_len, self.seed = path, seq_len, seed
        self.tokens: TokenArray = ShardedTokens(path, vocab) if Path(path).is_dir() else _open_tokens(path, vocab)
        total = (len(self.tokens) - 1) // seq_len
        if total < 1:
            raise DataError(f"data source {path!r} has {len(self.tokens)} tokens, fewer than seqLen + 1 = "
                            f"{seq_len + 1}; use a longer file or a shorter seqLen")
        self.held_out = held_out_windows(total, held_out_fraction, path)
        self.windows = total - self.held_out  # the training windows: the held-out ones are the last
        self._order_epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:  # one permutation cached: samples are read in order
            self._order = np.random.default_rng([self.seed, 2, epoch]).permutation(self.windows)
            self._order_epoch = epoch
        return self._order

    def sample(self, index: int) -> np.ndarray:
        epoch, k = divmod(index, self.windows)
        start = int(self._epoch_order(epoch)[k]) * self.seq_len
        return np.asarray(self.tokens[start:start + self.seq_len + 1], dtype=np.int64)


def held_out_windows(total: int, fraction: float, path: str = "data.source") -> int:
    """Windows held out of `total` for validation: round(total x fraction), at least one when fraction > 0, and
    leaving at least one to train on."""
    if fraction <= 0:
        return 0
    held = max(1, round(total * fraction))
    if held >= total:
        raise DataError(f"data.validationFraction {fraction} of {path!r} ({total} windows of seqLen + 1 tokens) "
                        "leaves nothing to train on; use a smaller fraction, a longer source or data.validation")
    return held


class HeldOutWindows:
    """A TokenFileSource's held-out windows in stream order (sample i: held-out window i mod their number)."""

    def __init__(self, train: TokenFileSource):
        self.train, self.seq_len = train, train.seq_len

    def sample(self, index: int) -> np.ndarray:
        start = (self.train.windows + index % self.train.held_out) * self.seq_len
        return np.asarray(self.train.tokens[start:start + self.seq_len + 1], dtype=np.int64)


def _open_tokens(path: str, vocab: int) -> np.ndarray:
    file = Path(path)
    if not file.is_file():
        raise DataError(f"data.source {path!r} does not exist; give an existing file, a shard directory "
                        "(`flywheel prepare-data`) or 'synthetic'")
    suffix = file.suffix
    if suffix == ".txt":
        if vocab < 256:
            raise DataError(f"text data {path!r} uses byte tokens (vocab 256) but the model's vocab is {vocab}; "
                            "set trainer.model.vocab to at least 256")
        return np.memmap(file, dtype=np.uint8, mode="r")
    if suffix == ".npy":
        tokens: np.ndarray = np.load(file, mmap_mode="r")
        if tokens.dtype != np.uint16 or tokens.ndim != 1:
            raise DataError(f"token file {path!r} holds {tokens.dtype} of shape {tokens.shape}; expected a 1-D "
                            "uint16 array")
    elif suffix == ".bin":
        if file.stat().st_size % 2:
            raise DataError(f"token file {path!r} has an odd size; .bin files hold uint16 tokens")
        tokens = np.memmap(file, dtype=np.uint16, mode="r")
    else:
        raise DataError(f"data source {path!r} is not .txt, .npy or .bin")
    if len(tokens) and int(tokens.max()) >= vocab:
        raise DataError(f"token file {path!r} has token id {int(tokens.max())} but the model's vocab is {vocab}; "
                        f"set trainer.model.vocab to at least {int(tokens.max()) + 1}")
    return tokens


def build_source(source: str, vocab: int, seq_len: int, seed: int, tokenizer: str | None = None,
                 held_out_fraction: float = 0.0) -> SampleSource:
    """The job's sample stream (less `held_out_fraction` of a file source's windows); `tokenizer` (the job's,
    data.tokenizer or the pretrained one) is checked against the model's vocab and a shard directory's recorded
    tokenizer. Raises DataError."""
    if tokenizer:
        check_tokenizer(tokenizer, vocab)
    if source == "synthetic":
        return SyntheticSource(vocab, seq_len, seed)
    built = TokenFileSource(source, vocab, seq_len, seed, held_out_fraction)
    if tokenizer and isinstance(built.tokens, ShardedTokens) and \
            file_sha256(load_tokenizer(tokenizer).path) != built.tokens.index.tokenizer_sha256:
        raise DataError(f"data.tokenizer {tokenizer!r} is not the tokenizer data.source {source!r} was prepared "
                        "with (its sha256 differs from index.json's); use that tokenizer or prepare the data again")
    return built


SYNTHETIC_VALIDATION_STREAM = 3  # the synthetic chain's held-out samples: a stream training never draws from


def build_validation_source(validation: str | None, train: SampleSource, vocab: int, seed: int,
                            tokenizer: str | None = None) -> SampleSource:
    """The evaluation stream: `validation` (data.validation) when given, else the training source's held-out
    windows (data.validationFraction) or, for a synthetic source, its held-out stream. Raises DataError."""
    if validation is not None:
        try:
            return build_source(validation, vocab, train.seq_len, seed, tokenizer)
        except DataError as err:
            raise DataError(f"data.validation: {err}") from None
    if isinstance(train, SyntheticSource):
        return SyntheticSource(vocab, train.seq_len, seed, stream=SYNTHETIC_VALIDATION_STREAM)
    if isinstance(train, TokenFileSource) and train.held_out:
        return HeldOutWindows(train)
    raise DataError("training.evalEverySteps is set but there is no validation data: set data.validation (held-out "
                    "data) or data.validationFraction (a fraction of data.source held out)")


def check_tokenizer(tokenizer: str, vocab: int) -> None:
    """The spec_layout rule on the tokenizer's vocab, with the tokenizer read where the job runs."""
    try:
        tokenizer_vocab = load_tokenizer(tokenizer).vocab
    except TokenizerError as err:
        raise DataError(f"data.tokenizer: {err}") from None
    problem = tokenizer_vocab_problem(vocab, tokenizer_vocab)
    if problem:
        raise DataError(f"spec.{problem}")


MicroBatch = tuple[torch.Tensor, torch.Tensor]  # (inputs[micro, seq], targets[micro, seq])


class SampleLoader:
    """Hands each data-parallel rank its contiguous slice of the next global batch. `consumed_samples` is the
    position in the stream and the whole checkpointed state."""

    def __init__(self, source: SampleSource, consumed_samples: int = 0):
        self.source = source
        self.consumed_samples = consumed_samples

    def next_microbatches(self, dp_rank: int, dp_size: int, global_batch: int, micro_batch: int) -> list[MicroBatch]:
        if global_batch % (dp_size * micro_batch):
            raise DataError(f"globalBatch {global_batch} is not divisible by microBatch x dp = "
                            f"{micro_batch} x {dp_size}")
        per_rank = global_batch // dp_size
        first = self.consumed_samples + dp_rank * per_rank
        samples = np.stack([self.source.sample(i) for i in range(first, first + per_rank)])
        self.consumed_samples += global_batch
        batches = torch.split(torch.from_numpy(samples), micro_batch)
        return [(b[:, :-1].contiguous(), b[:, 1:].contiguous()) for b in batches]

    def state_dict(self) -> dict[str, Any]:
        return {"consumed_samples": self.consumed_samples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.consumed_samples = int(state["consumed_samples"])
