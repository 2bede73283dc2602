"""Hugging Face `config.json` <-> `ModelShape`, both ways. Pure: dicts in, dicts out (the caller reads the file).

Llama, Mistral and Qwen2 map to the llama architecture, GPT-2 to the gpt one. A setting the trainer cannot
represent is refused with the config key and what it supports, e.g. `config.json: hidden_act "relu" is not
supported (use silu)`. Both spellings of RoPE settings are read: transformers 5's `rope_parameters` and the older
`rope_theta` + `rope_scaling`.
"""

from __future__ import annotations

from typing import Any

from flywheel.layout.shape import ModelShape, RopeScaling

LLAMA_FAMILY = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
GPT2 = "GPT2LMHeadModel"
DEFAULT_SEQ_LEN = 2048  # when the spec gives no seqLen: at most this many of the model's positions


class HFConfigError(ValueError):
    """A config.json the trainer cannot represent; the message names the key."""


def _need(config: dict[str, Any], key: str) -> Any:
    if key not in config:
        raise HFConfigError(f"config.json: {key} is missing")
    return config[key]


def _expect(config: dict[str, Any], key: str, allowed: tuple[Any, ...], fix: str) -> None:
    value = config.get(key, allowed[0])
    if value not in allowed:
        raise HFConfigError(f"config.json: {key} {value!r} is not supported ({fix})".replace("'", '"'))


def architecture_of(config: dict[str, Any]) -> str:
    names = config.get("architectures") or []
    known = [n for n in names if n in LLAMA_FAMILY or n == GPT2]
    if not known:
        supported = ", ".join([*LLAMA_FAMILY, GPT2])
        raise HFConfigError(f"config.json: architectures {names} is not supported (use one of {supported})")
    return str(known[0])


def shape_from_config(config: dict[str, Any], seq_len: int | None = None) -> ModelShape:
    """The shape of the model `config` describes, trained at `seq_len` tokens (default: its positions, at most
    DEFAULT_SEQ_LEN)."""
    arch = architecture_of(config)
    if arch == GPT2:
        return _gpt2_shape(config, seq_len)
    return _llama_shape(config, LLAMA_FAMILY[arch], seq_len)


def _gpt2_shape(config: dict[str, Any], seq_len: int | None) -> ModelShape:
    _expect(config, "activation_function", ("gelu_new", "gelu", "gelu_pytorch_tanh"), "use gelu or gelu_new")
    _expect(config, "scale_attn_weights", (True,), "use true")
    _expect(config, "scale_attn_by_inverse_layer_idx", (False,), "use false")
    _expect(config, "reorder_and_upcast_attn", (False,), "use false")
    _expect(config, "tie_word_embeddings", (True,), "GPT-2 ties its head to the embedding")
    positions = int(_need(config, "n_positions"))
    dim = int(_need(config, "n_embd"))
    exact = config.get("activation_function", "gelu_new") == "gelu"
    return ModelShape(layers=int(_need(config, "n_layer")), dim=dim, heads=int(_need(config, "n_head")),
                      vocab=int(_need(config, "vocab_size")), seq_len=seq_len or min(positions, DEFAULT_SEQ_LEN),
                      architecture="gpt", ffn=int(config.get("n_inner") or 4 * dim), max_positions=positions,
                      norm_eps=float(config.get("layer_norm_epsilon", 1e-5)),
                      activation="gelu" if exact else "gelu_tanh")


def _rope(config: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        key = "rope_parameters" if "rope_parameters" in config else "rope_scaling"
        raise HFConfigError(f"config.json: {key}.rope_type \"{kind}\" is not supported (use default or llama3)")
    return theta, RopeScaling(factor=float(params["factor"]), low_freq_factor=float(params["low_freq_factor"]),
                              high_freq_factor=float(params["high_freq_factor"]),
                              original_max_positions=int(params["original_max_position_embeddings"]))


def _llama_shape(config: dict[str, Any], family: str, seq_len: int | None) -> ModelShape:
    _expect(config, "hidden_act", ("silu",), "use silu")
    _expect(config, "mlp_bias", (False,), "the MLP has no biases")
    _expect(config, "attention_dropout", (0.0, 0), "use 0.0")
    _expect(config, "pretraining_tp", (1,), "use 1")
    if family != "qwen2":  # Llama's attention_bias puts a bias on the output projection too
        _expect(config, "attention_bias", (False,), "use false; q/k/v biases alone are Qwen2ForCausalLM's")
    dim, heads = int(_need(config, "hidden_size")), int(_need(config, "num_attention_heads"))
    if config.get("head_dim") not in (None, dim // heads):
        raise HFConfigError(f"config.json: head_dim {config['head_dim']} is not supported (use hidden_size / "
                            f"num_attention_heads = {dim // heads})")
    positions = int(_need(config, "max_position_embeddings"))
    seq = seq_len or min(positions, DEFAULT_SEQ_LEN)
    window = config.get("sliding_window")
    if (family == "qwen2" and config.get("use_sliding_window")) or (family == "mistral" and window and window < seq):
        raise HFConfigError(f"config.json: sliding_window {window} is not supported (full causal attention only; "
                            "use null, or a seqLen within the window)")
    theta, scaling = _rope(config)
    bias = family == "qwen2"
    return ModelShape(layers=int(_need(config, "num_hidden_layers")), dim=dim, heads=heads,
                      vocab=int(_need(config, "vocab_size")), seq_len=seq, architecture="llama",
                      kv_heads=int(config.get("num_key_value_heads") or heads),
                      ffn=int(_need(config, "intermediate_size")), max_positions=positions,
                      norm_eps=float(config.get("rms_norm_eps", 1e-6)), activation="silu", rope_theta=theta,
                      rope_scaling=scaling, tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                      attention_bias=bias)


def config_from_shape(shape: ModelShape) -> dict[str, Any]:
    """A config.json for `shape` that transformers loads: LlamaForCausalLM (Qwen2ForCausalLM with q/k/v biases)
    or GPT2LMHeadModel. fp32 weights."""
    if shape.moe is not None:
        raise HFConfigError("trainer.model.moe: a mixture-of-experts GPT has no Hugging Face counterpart to export to")
    if shape.architecture == "gpt":
        return {"architectures": [GPT2], "model_type": "gpt2", "n_layer": shape.layers, "n_embd": shape.dim,
                "n_head": shape.heads, "n_inner": shape.ffn, "vocab_size": shape.vocab,
                "n_positions": shape.max_positions, "layer_norm_epsilon": shape.norm_eps,
                "activation_function": "gelu_new" if shape.activation == "gelu_tanh" else "gelu",
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True,
                "torch_dtype": "float32"}
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": shape.rope_theta}
    if shape.rope_scaling is not None:
        s = shape.rope_scaling
        rope = {"rope_type": "llama3", "rope_theta": shape.rope_theta, "factor": s.factor,
                "low_freq_factor": s.low_freq_factor, "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_positions}
    qwen = shape.attention_bias
    config: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"], "model_type": "qwen2" if qwen else
        "llama", "num_hidden_layers": shape.layers, "hidden_size": shape.dim, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim, "intermediate_size": shape.ffn,
        "vocab_size": shape.vocab, "max_position_embeddings": shape.max_positions, "rms_norm_eps": shape.norm_eps,
        "hidden_act": "silu", "tie_word_embeddings": shape.tied_embeddings, "attention_bias": shape.attention_bias,
        "mlp_bias": False, "attention_dropout": 0.0, "torch_dtype": "float32",
        # Both spellings: transformers 5 reads rope_parameters, older versions rope_theta and rope_scaling.
        "rope_parameters": rope, "rope_theta": shape.rope_theta,
        "rope_scaling": rope if shape.rope_scaling is not None else None}
    if qwen:
        config["use_sliding_window"] = False
    return config
