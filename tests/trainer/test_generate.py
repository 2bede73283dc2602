"""`flywheel generate`'s sampling rules without a checkpoint: greedy, top-p, seeded, bytes, option checks."""

from __future__ import annotations

import pytest
import torch

from flywheel.trainer.generate import ByteTokenizer, GenerateOptions, next_token


def test_greedy_takes_the_most_likely_token():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0])
    assert next_token(logits, GenerateOptions(), torch.Generator()) == 1


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([0.05, 0.6, 0.3, 0.05]))
    nucleus = GenerateOptions(temperature=1.0, top_p=0.7)
    drawn = {next_token(logits, nucleus, torch.Generator().manual_seed(s)) for s in range(200)}
    assert drawn == {1, 2}
    first = GenerateOptions(temperature=1.0, top_p=0.5)
    assert {next_token(logits, first, torch.Generator().manual_seed(s)) for s in range(50)} == {1}


def test_sampling_is_a_function_of_the_seed():
    logits = torch.zeros(50)
    options = GenerateOptions(temperature=1.0)
    draw = [next_token(logits, options, torch.Generator().manual_seed(7)) for _ in range(3)]
    assert len(set(draw)) == 1


def test_bytes_round_trip_and_options_are_checked():
    codec = ByteTokenizer()
    assert codec.decode(codec.encode("héllo")) == "héllo"
    assert codec.decode([104, 300, 105]) == "hi"  # ids past a byte are dropped
    with pytest.raises(ValueError, match="top-p"):
        GenerateOptions(top_p=0)
