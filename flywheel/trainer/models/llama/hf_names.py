"""The Llama's parameter names in a Hugging Face model (LlamaForCausalLM and its family)."""

# (Flywheel name, HF name, transposed), `{i}` the block index.
HF_NAMES = [
    ("tok_emb.weight", "model.embed_tokens.weight", False),
    ("blocks.{i}.ln_attn.weight", "model.layers.{i}.input_layernorm.weight", False),
    *[(f"blocks.{{i}}.attn.{p}.{kind}", f"model.layers.{{i}}.self_attn.{p}_proj.{kind}", False)
      for p in "qkv" for kind in ("weight", "bias")],
    ("blocks.{i}.attn.o.weight", "model.layers.{i}.self_attn.o_proj.weight", False),
    ("blocks.{i}.ln_mlp.weight", "model.layers.{i}.post_attention_layernorm.weight", False),
    *[(f"blocks.{{i}}.mlp.{p}.weight", f"model.layers.{{i}}.mlp.{p}_proj.weight", False)
      for p in ("gate", "up", "down")],
    ("ln_f.weight", "model.norm.weight", False),
    ("head.weight", "lm_head.weight", False),
]
# The embedding a tied LM head reads when the file has no lm_head.weight.
HF_TIED = "model.embed_tokens.weight"
