import numpy as np
import pytest
import torch

from flywheel.trainer.data import DataError, SampleLoader, SyntheticSource, TokenFileSource, build_source

SEQ = 16


def take(loader: SampleLoader, dp_size: int, global_batch: int = 12, micro_batch: int = 2) -> list[torch.Tensor]:
    """One global batch as the concatenation of every dp rank's micro batches (inputs + last target)."""
    rows = []
    position = loader.consumed_samples
    for dp_rank in range(dp_size):
        loader.consumed_samples = position
        for inputs, targets in loader.next_microbatches(dp_rank, dp_size, global_batch, micro_batch):
            assert inputs.shape == targets.shape == (micro_batch, SEQ)
            assert torch.equal(inputs[:, 1:], targets[:, :-1])
            rows.extend(torch.cat([inputs, targets[:, -1:]], dim=1))
    return rows


def test_samples_are_pure_functions_of_seed_and_index():
    a, b, c = SyntheticSource(256, SEQ, seed=0), SyntheticSource(256, SEQ, seed=0), SyntheticSource(256, SEQ, seed=1)
    assert a.sample(7).shape == (SEQ + 1,) and a.sample(7).dtype == np.int64
    assert np.array_equal(a.sample(7), b.sample(7))
    assert not np.array_equal(a.sample(7), a.sample(8))
    assert not np.array_equal(a.sample(7), c.sample(7))
    assert a.sample(3).max() < 256


def test_synthetic_stream_is_learnable():
    """Almost every transition follows the seeded table (4 successors per token), so a model can learn it."""
    source = SyntheticSource(64, 256, seed=3)
    counts = np.zeros((64, 64), dtype=np.int64)
    for i in range(40):
        tokens = source.sample(i)
        np.add.at(counts, (tokens[:-1], tokens[1:]), 1)
    top4 = np.sort(counts, axis=1)[:, -4:].sum()
    assert top4 / counts.sum() > 0.85  # random tokens would give 4/64


@pytest.mark.parametrize("dp_size", [1, 2, 3, 6])
def test_dp_slices_cover_the_global_batch_exactly_once(dp_size):
    source = SyntheticSource(256, SEQ, seed=0)
    loader = SampleLoader(source)
    rows = take(loader, dp_size)
    assert loader.consumed_samples == 12
    expected = [torch.from_numpy(source.sample(i)) for i in range(12)]
    assert all(torch.equal(r, e) for r, e in zip(rows, expected, strict=True))


def test_resume_at_another_dp_size_continues_at_the_next_sample():
    source = SyntheticSource(256, SEQ, seed=0)
    straight = SampleLoader(source)
    reference = take(straight, 2) + take(straight, 2) + take(straight, 2)

    first = SampleLoader(source)
    before = take(first, 2)
    state = first.state_dict()
    resumed = SampleLoader(source)
    resumed.load_state_dict(state)
    after = take(resumed, 3) + take(resumed, 6)
    assert all(torch.equal(r, e) for r, e in zip(before + after, reference, strict=True))


def test_bad_batch_layout_is_rejected():
    with pytest.raises(DataError, match="not divisible"):
        SampleLoader(SyntheticSource(256, SEQ, 0)).next_microbatches(0, 4, 12, 2)


def test_text_file_bytes_are_tokens_in_a_seeded_order_per_epoch(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(bytes(range(256)) * 3)
    source = build_source(str(path), vocab=256, seq_len=SEQ, seed=0)
    windows = (768 - 1) // SEQ
    first_epoch = [source.sample(i) for i in range(windows)]
    assert all(np.array_equal(s, (np.arange(SEQ + 1) + s[0]) % 256) for s in first_epoch)  # contiguous windows
    starts = [int(s[0]) for s in first_epoch]
    assert starts != sorted(starts)  # shuffled
    second_epoch = [int(source.sample(windows + i)[0]) for i in range(windows)]
    assert sorted(second_epoch) == sorted(starts) and second_epoch != starts  # every window, another order
    assert np.array_equal(source.sample(windows), build_source(str(path), 256, SEQ, 0).sample(windows))


def test_text_file_needs_a_byte_vocabulary(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("hello world " * 100)
    with pytest.raises(DataError, match="vocab is 128"):
        build_source(str(path), vocab=128, seq_len=SEQ, seed=0)


@pytest.mark.parametrize("suffix", [".npy", ".bin"])
def test_uint16_token_files(tmp_path, suffix):
    tokens = (np.arange(1000) * 7 % 5000).astype(np.uint16)
    path = tmp_path / f"tokens{suffix}"
    np.save(path, tokens) if suffix == ".npy" else tokens.tofile(path)
    source = TokenFileSource(str(path), vocab=5000, seq_len=SEQ, seed=0)
    sample = source.sample(5)
    start = int(np.nonzero(tokens == sample[0])[0][0])
    assert np.array_equal(sample, tokens[start:start + SEQ + 1]) and start % SEQ == 0
    with pytest.raises(DataError, match="token id 4998"):
        TokenFileSource(str(path), vocab=4000, seq_len=SEQ, seed=0)


def test_missing_or_short_files_are_user_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        build_source(str(tmp_path / "nope.bin"), 256, SEQ, 0)
    (tmp_path / "short.txt").write_text("abc")
    with pytest.raises(DataError, match="fewer than seqLen"):
        build_source(str(tmp_path / "short.txt"), 256, SEQ, 0)
