"""`trainer.model.pretrained`: small random transformers models load into Flywheel's models and give the same
logits (fp32, <= 1e-5), sharded files included; unsupported configs are refused naming the key."""

from __future__ import annotations

import json

import pytest
import torch

from flywheel.layout.hf_config import HFConfigError
from flywheel.spec.job import ModelSpec
from flywheel.trainer.models.hf_weights import load_pretrained
from flywheel.trainer.models.registry import build_model, model_shape

from .hf_models import SEQ, hf_logits, save_hf_model

pytest.importorskip("transformers")
TOLERANCE = 1e-5


def flywheel_logits(directory, tokens):
    shape = model_shape(ModelSpec(pretrained=str(directory), seqLen=SEQ))
    model = build_model(shape, seed=1)  # other weights than the file's: loading must replace every one
    load_pretrained(model, directory, shape)
    with torch.no_grad():
        return model(tokens)


@pytest.mark.parametrize("kind, shard", [("llama", None), ("llama-untied", "20KB"), ("qwen2", None),
                                         ("gpt2", "20KB")])
def test_imported_model_gives_transformers_logits(tmp_path, kind, shard):
    directory = save_hf_model(kind, tmp_path / kind, max_shard_size=shard)
    if shard:
        assert (directory / "model.safetensors.index.json").exists()
    tokens = torch.randint(0, 96, (2, SEQ), generator=torch.Generator().manual_seed(0))
    expected = hf_logits(directory, tokens)
    got = flywheel_logits(directory, tokens)
    assert (got - expected).abs().max() / expected.abs().max() <= TOLERANCE


def test_architecture_comes_from_config(tmp_path):
    directory = save_hf_model("llama", tmp_path / "llama")
    shape = model_shape(ModelSpec(pretrained=str(directory), seqLen=SEQ))
    assert (shape.architecture, shape.kv_heads, shape.ffn, shape.tied_embeddings) == ("llama", 2, 48, True)
    assert shape.rope_scaling is not None and shape.rope_scaling.factor == 8.0 and shape.rope_theta == 500000.0


def test_unsupported_config_names_the_key(tmp_path):
    directory = save_hf_model("llama", tmp_path / "llama")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    with pytest.raises(HFConfigError, match='config.json: hidden_act "relu" is not supported \\(use silu\\)'):
        model_shape(ModelSpec(pretrained=str(directory)))
    (directory / "config.json").write_text(json.dumps({**config, "architectures": ["BertModel"]}))
    with pytest.raises(HFConfigError, match="architectures"):
        model_shape(ModelSpec(pretrained=str(directory)))


def test_pretrained_refuses_sizes_beside_it():
    with pytest.raises(ValueError, match="pretrained: the architecture and sizes come from"):
        ModelSpec(pretrained="/models/x", dim=64)


def test_pretrained_spec_survives_the_workers_round_trip():
    from flywheel.spec import parse_spec
    from flywheel.spec.parse import spec_to_env_json

    spec = parse_spec({"trainer": {"model": {"pretrained": "/models/llama", "seqLen": 32}}})
    assert spec.trainer.model.preset is None
    again = parse_spec(json.loads(spec_to_env_json(spec)))  # FLYWHEEL_SPEC, as the workers read it
    assert again.trainer.model == spec.trainer.model
    with pytest.raises(ValueError, match="remove preset"):
        ModelSpec(pretrained="/models/x", preset="llama-tiny")
