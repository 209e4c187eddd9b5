"""Random weights for a config, so tests and benchmarks can build a model of any shape without files.

    weights = dummy_weights(config, seed=0)                    # name -> float32 array (HF names)
    model = Model.from_weights(config, weights, format="ternary")
"""
from __future__ import annotations

import numpy as np

from lowbit.model.config import ModelArgs


def weight_shapes(config: dict | ModelArgs) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape for a llama-family config (bitnet adds its sub-norms)."""
    a = config if isinstance(config, ModelArgs) else ModelArgs.from_config(config)
    d, f, hd = a.hidden_size, a.intermediate_size, a.head_dim
    qd, kvd = a.num_attention_heads * hd, a.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (a.vocab_size, d)}
    for i in range(a.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (d,),
            p + "post_attention_layernorm.weight": (d,),
            p + "self_attn.q_proj.weight": (qd, d),
            p + "self_attn.k_proj.weight": (kvd, d),
            p + "self_attn.v_proj.weight": (kvd, d),
            p + "self_attn.o_proj.weight": (d, qd),
            p + "mlp.gate_proj.weight": (f, d),
            p + "mlp.up_proj.weight": (f, d),
            p + "mlp.down_proj.weight": (d, f),
        })
        if a.arch == "bitnet":
            shapes[p + "self_attn.attn_sub_norm.weight"] = (qd,)
            shapes[p + "mlp.ffn_sub_norm.weight"] = (f,)
    shapes["model.norm.weight"] = (d,)
    if not a.tie_word_embeddings:
        shapes["lm_head.weight"] = (a.vocab_size, d)
    return shapes


def dummy_weights(config: dict | ModelArgs, seed: int = 0, std: float = 0.05) -> dict[str, np.ndarray]:
    """float32 weights ~ N(0, std) (norm weights ~ 1 +- 0.1), HF names."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes(config).items():
        if len(shape) == 1:
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (std * rng.standard_normal(shape)).astype(np.float32)
    return out
