"""Small random Hugging Face models, built and saved locally with transformers (no hub access)."""

from __future__ import annotations

from pathlib import Path

import torch

SEQ = 16
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8}


def save_hf_model(kind: str, directory: Path, *, max_shard_size: str | None = None) -> Path:
    """kind: llama (GQA, llama3 RoPE, tied), llama-untied, qwen2 (q/k/v biases), gpt2 (tanh GELU)."""
    import transformers as tf

    torch.manual_seed(0)
    small = {"vocab_size": 96, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "max_position_embeddings": 64, "bos_token_id": None, "eos_token_id": None}
    if kind == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**small, intermediate_size=48, num_key_value_heads=2,
                                                   rope_theta=500000.0, rope_scaling=LLAMA3_ROPE,
                                                   tie_word_embeddings=True))
    elif kind == "llama-untied":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**small, intermediate_size=48, num_key_value_heads=4,
                                                   tie_word_embeddings=False))
    elif kind == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**small, intermediate_size=48, num_key_value_heads=2,
                                                   tie_word_embeddings=False))
    elif kind == "gpt2":
        model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                                 bos_token_id=None, eos_token_id=None))
    else:
        raise ValueError(kind)
    with torch.no_grad():  # norms away from 1 and biases away from 0, so a misplaced one shows
        for name, param in model.named_parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.1)
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(directory, **kwargs)
    return directory


def hf_logits(directory: Path, tokens: torch.Tensor) -> torch.Tensor:
    import transformers as tf

    model = tf.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        return model(tokens).logits
