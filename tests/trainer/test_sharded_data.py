"""`data.source` as a prepare-data directory: windows read across shards, the same samples as one array, the
vocab and tokenizer checks of the worker's preflight, and an exact position at another data-parallel size."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from flywheel.contracts import exitcodes
from flywheel.data.shards import ShardIndex, write_index
from flywheel.eventlog import Failure, read_records
from flywheel.spec import parse_spec
from flywheel.spec.parse import spec_to_env_json
from flywheel.trainer.data import DataError, SampleLoader, ShardedTokens, TokenFileSource, build_source
from flywheel.trainer.entry import main
from flywheel.trainer.ft import watchdog
from tests.data_prep.corpus import train_tokenizer

SEQ = 8


def write_shards(root, tokens: np.ndarray, sizes: list[int], vocab: int = 70000, sha: str = "0" * 64) -> None:
    root.mkdir(parents=True, exist_ok=True)
    names, start = [], 0
    for i, n in enumerate(sizes):
        names.append(f"shard-{i:05d}.bin")
        tokens[start:start + n].astype("<u4").tofile(root / names[-1])
        start += n
    write_index(root, ShardIndex("uint32", vocab, tuple(names), tuple(sizes), sha))


@pytest.fixture
def shards(tmp_path):
    tokens = np.random.default_rng(0).integers(0, 70000, size=1000, dtype=np.int64)
    write_shards(tmp_path / "d", tokens, [7, 300, 0, 1, 450, 242])
    return tmp_path / "d", tokens


def test_windows_span_shards_like_one_array(shards):
    directory, tokens = shards
    stream = ShardedTokens(str(directory), 70000)
    assert len(stream) == 1000
    for start in (0, 5, 6, 7, 300, 306, 307, 308, 990):
        assert np.array_equal(stream[start:start + SEQ + 1], tokens[start:start + SEQ + 1])


def test_a_shard_directory_samples_like_the_same_tokens_in_one_file(shards, tmp_path):
    directory, tokens = shards
    sharded = TokenFileSource(str(directory), 70000, SEQ, seed=3)
    assert sharded.windows == (1000 - 1) // SEQ
    order = np.random.default_rng([3, 2, 1]).permutation(sharded.windows)  # epoch 1's seeded order
    for i in (0, 1, 77, sharded.windows + 5):
        epoch, k = divmod(i, sharded.windows)
        start = int((order if epoch else np.random.default_rng([3, 2, 0]).permutation(sharded.windows))[k]) * SEQ
        assert np.array_equal(sharded.sample(i), tokens[start:start + SEQ + 1])
        assert sharded.sample(i).dtype == np.int64


def global_batch(loader: SampleLoader, dp_size: int) -> torch.Tensor:
    """One global batch of 12 as every dp rank reads it, in rank order (inputs + the last target)."""
    position, rows = loader.consumed_samples, []
    for rank in range(dp_size):
        loader.consumed_samples = position
        rows += [torch.cat([x, y[:, -1:]], 1) for x, y in loader.next_microbatches(rank, dp_size, 12, 2)]
    return torch.cat(rows)


def test_resume_at_another_dp_size_continues_at_the_next_sample(shards):
    directory, _ = shards
    source = build_source(str(directory), 70000, SEQ, seed=1)
    straight = SampleLoader(source)
    expected = [global_batch(straight, 1) for _ in range(3)]
    before = SampleLoader(source)
    seen = [global_batch(before, 2)]
    after = SampleLoader(source)
    after.load_state_dict(before.state_dict())  # the checkpointed position, resumed at dp 3
    seen += [global_batch(after, 3), global_batch(after, 3)]
    assert all(torch.equal(a, b) for a, b in zip(expected, seen, strict=True))


def test_model_vocab_and_tokenizer_are_checked_by_the_preflight(shards, tmp_path):
    directory, _ = shards
    with pytest.raises(DataError, match="set trainer.model.vocab to at least 70000"):
        build_source(str(directory), 65536, SEQ, seed=0)
    with pytest.raises(DataError, match=r"data.source: .*index.json: cannot read"):
        build_source(str(tmp_path), 70000, SEQ, seed=0)
    tokenizer = train_tokenizer(tmp_path / "tok" / "tokenizer.json")
    with pytest.raises(DataError, match=r"spec.trainer.model.vocab: the tokenizer .* 300 tokens"):
        build_source("synthetic", 256, SEQ, seed=0, tokenizer=str(tokenizer))
    with pytest.raises(DataError, match="data.tokenizer: tokenizer .* does not exist"):
        build_source("synthetic", 256, SEQ, seed=0, tokenizer=str(tmp_path / "gone.json"))
    with pytest.raises(DataError, match="is not the tokenizer data.source"):
        build_source(str(directory), 70000, SEQ, seed=0, tokenizer=str(tokenizer))


@pytest.mark.parametrize("where", ["empty-dir", "missing"])
def test_the_worker_refuses_an_unreadable_source_as_a_user_error(tmp_path, where):
    source = tmp_path / "data"
    if where == "empty-dir":
        source.mkdir()
    spec = parse_spec({"trainer": {"data": {"source": str(source)}}, "checkpoint": {"dir": str(tmp_path / "c")}})
    events = tmp_path / "events.jsonl"
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "FLYWHEEL_EVENTS_FILE": str(events),
           "FLYWHEEL_SPEC": spec_to_env_json(spec)}
    assert main(env) == exitcodes.USER_ERROR  # never retried
    # Its progress watchdog stopped with it: left running, it would end this process at the first-step allowance.
    assert not [t for t in threading.enumerate() if t.name == watchdog.THREAD_NAME]
    [record] = read_records(events)
    assert isinstance(record, Failure) and record.kind == "user-error" and "data.source" in record.reason
