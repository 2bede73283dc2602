"""`flywheel prepare-data`: tokenizers (tokenizer.json and .tiktoken), shards and their index, the spec's vocab
rule and the local check of a shard directory."""

from __future__ import annotations

import base64
import copy
import json

import numpy as np
import pytest

from flywheel import cli
from flywheel.data.prepare import PrepareError, plan_chunks, prepare_data
from flywheel.data.shards import read_index, source_problem
from flywheel.data.tokenizers import TokenizerError, load_tokenizer, resolve_tokenizer
from flywheel.spec import SpecError, parse_job
from flywheel.spec.parse import check_local_paths
from tests.data_prep.corpus import EOS, sentences, train_tokenizer, write_corpus


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def stream(directory) -> np.ndarray:
    index = read_index(directory)
    return np.concatenate([np.fromfile(directory / name, dtype=index.dtype) for name in index.shards])


def test_tokenizer_json_loads_with_its_vocab(tokenizer):
    loaded = load_tokenizer(tokenizer)
    assert loaded.vocab == 300
    text = "the quick dog runs."
    assert loaded.decode(loaded.encode(text)) == text
    with pytest.raises(TokenizerError, match="does not exist"):
        load_tokenizer(tokenizer.parent / "nope.json")


def test_tiktoken_bpe_file_loads(tmp_path):
    ranks = [bytes([b]) for b in range(256)] + [b"th", b"the"]
    path = tmp_path / "tiny.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    loaded = load_tokenizer(path)
    assert loaded.vocab == 258
    assert 257 in loaded.encode("the cat") and loaded.decode(loaded.encode("the cat")) == "the cat"


def test_prepare_data_writes_uint32_shards_and_index(tokenizer, tmp_path):
    inputs = write_corpus(tmp_path / "in")
    out = tmp_path / "shards"
    code = cli.main(["prepare-data", *map(str, inputs), "--tokenizer", str(tokenizer), "--out", str(out),
                     "--shard-tokens", "1000", "--workers", "1", "--dtype", "uint32"])
    assert code == 0
    index = read_index(out)
    assert index.dtype == "uint32" and index.vocab == 300 and len(index.shards) > 2
    assert all(n == 1000 for n in index.tokens[:-1]) and 0 < index.tokens[-1] <= 1000
    assert (out / index.tokenizer).is_file() and len(index.tokenizer_sha256) == 64
    tokens = stream(out)
    loaded = load_tokenizer(tokenizer)
    eos = loaded.impl.token_to_id(EOS)
    # The .txt file is one document, each JSONL line another: one end-of-text each.
    assert int((tokens == eos).sum()) == 1 + 300
    first = loaded.decode([int(t) for t in tokens[:50]])
    assert first.startswith(sentences(1, seed=1)[0])
    assert tokens.max() < 300


def test_auto_dtype_is_uint16_and_chunks_do_not_change_the_stream(tokenizer, tmp_path):
    inputs = [str(p) for p in write_corpus(tmp_path / "in")]
    whole = prepare_data(inputs, str(tokenizer), tmp_path / "whole")
    assert whole.dtype == "uint16" and len(whole.shards) == 1
    assert len(plan_chunks(inputs, chunk_bytes=2000)) > 4
    chunked = prepare_data(inputs, str(tokenizer), tmp_path / "chunked", chunk_bytes=2000)
    assert np.array_equal(stream(tmp_path / "whole"), stream(tmp_path / "chunked"))
    assert chunked.tokenizer_sha256 == whole.tokenizer_sha256


@pytest.mark.slow
def test_workers_give_the_same_shards(tokenizer, tmp_path):
    inputs = [str(p) for p in write_corpus(tmp_path / "in")]
    prepare_data(inputs, str(tokenizer), tmp_path / "one", chunk_bytes=2000, shard_tokens=700)
    prepare_data(inputs, str(tokenizer), tmp_path / "two", chunk_bytes=2000, shard_tokens=700, workers=2)
    assert read_index(tmp_path / "one") == read_index(tmp_path / "two")
    assert np.array_equal(stream(tmp_path / "one"), stream(tmp_path / "two"))


def test_a_vocab_past_uint16_gets_uint32_shards(tmp_path):
    """A .tiktoken tokenizer of 65,792 tokens (every byte pair, then every byte: odd words end in ids past
    65,535), wider than uint16 like Llama 3's 128k."""
    pairs = [bytes([a, b]) for a in range(256) for b in range(256)]
    ranks = pairs + [bytes([b]) for b in range(256)]
    path = tmp_path / "wide.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(ranks)))
    (tmp_path / "a.txt").write_text("abc top " * 50)
    index = prepare_data([str(tmp_path / "a.txt")], str(path), tmp_path / "out")
    assert index.vocab == 65792 and index.dtype == "uint32"
    assert int(stream(tmp_path / "out").max()) > 65535
    with pytest.raises(PrepareError, match="uint16 cannot hold"):
        prepare_data([str(tmp_path / "a.txt")], str(path), tmp_path / "out2", dtype="uint16")


def test_bad_inputs_are_refused(tokenizer, tmp_path, capsys):
    with pytest.raises(PrepareError, match="does not exist"):
        plan_chunks([str(tmp_path / "missing.txt")])
    (tmp_path / "x.csv").write_text("a")
    with pytest.raises(PrepareError, match=r"not \.txt, \.jsonl or \.parquet"):
        plan_chunks([str(tmp_path / "x.csv")])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"body": "no text"}\n')
    with pytest.raises(PrepareError, match="`text` field"):
        prepare_data([str(bad)], str(tokenizer), tmp_path / "o1")
    parquet = tmp_path / "x.parquet"
    parquet.write_bytes(b"PAR1")
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        assert cli.main(["prepare-data", str(parquet), "--tokenizer", str(tokenizer), "--out",
                         str(tmp_path / "o3")]) == cli.EXIT_BAD_INPUT
        assert "needs the `pyarrow` package" in capsys.readouterr().err


def job_doc(**data) -> dict:
    return {"apiVersion": "flywheel.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "j"},
            "spec": {"trainer": {"model": {"preset": "gpt-tiny"}, "data": data}}}


def test_model_vocab_must_cover_the_tokenizer(tokenizer, tmp_path):
    with pytest.raises(SpecError) as err:
        parse_job(job_doc(tokenizer=str(tokenizer)))
    assert "trainer.model.vocab" in str(err.value) and "300 tokens" in str(err.value)
    doc = job_doc(tokenizer=str(tokenizer))
    doc["spec"]["trainer"]["model"]["vocab"] = 320
    assert parse_job(doc).spec.trainer.data.tokenizer == str(tokenizer)
    # Not readable here: left to the worker's preflight.
    assert parse_job(job_doc(tokenizer=str(tmp_path / "elsewhere.json")))


def test_a_shard_directory_is_checked_where_the_job_runs(tokenizer, tmp_path):
    prepare_data([str(p) for p in write_corpus(tmp_path / "in")], str(tokenizer), tmp_path / "shards")
    ok = job_doc(source=str(tmp_path / "shards"))
    ok["spec"]["checkpoint"] = {"dir": str(tmp_path / "ckpt")}
    check_local_paths(parse_job(ok))
    assert source_problem(str(tmp_path / "shards")) is None
    empty = copy.deepcopy(ok)
    (tmp_path / "empty").mkdir()
    empty["spec"]["trainer"]["data"]["source"] = str(tmp_path / "empty")
    with pytest.raises(SpecError, match=r"spec.trainer.data.source: .*index.json: cannot read"):
        check_local_paths(parse_job(empty))
    index = json.loads((tmp_path / "shards" / "index.json").read_text())
    (tmp_path / "shards" / index["shards"][0]).write_bytes(b"\0\0")
    assert "missing or not" in str(source_problem(str(tmp_path / "shards")))
    assert "does not exist" in str(source_problem(str(tmp_path / "nowhere")))


def test_the_job_tokenizer_falls_back_to_pretrained_then_the_shards(tokenizer, tmp_path):
    prepare_data([str(p) for p in write_corpus(tmp_path / "in")], str(tokenizer), tmp_path / "shards")
    assert resolve_tokenizer("x.json", str(tokenizer.parent)) == "x.json"
    assert resolve_tokenizer(None, str(tokenizer.parent)) == str(tokenizer)
    assert resolve_tokenizer(None, None, str(tmp_path / "shards")) == str(tmp_path / "shards" / "tokenizer.json")
    assert resolve_tokenizer(None, str(tmp_path), "synthetic") is None
