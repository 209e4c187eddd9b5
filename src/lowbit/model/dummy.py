"""Random weights for a config, so tests and benchmarks can build a model of any shape without files.

    weights = dummy_weights(config, seed=0)                    # name -> float32 array (HF names)
    model = Model.from_weights(config, weights, format="ternary")
"""
from __future__ import annotations

import numpy as np

from lowbit.model.config import ModelArgs


# the order dummy_weights draws a layer's tensors in (kept, so that a seed gives the same weights as before
# the architecture modules listed their tensors; tests of numerically sensitive formats depend on them)
DRAW_ORDER = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
              "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight", "mlp.gate_proj.weight",
              "mlp.up_proj.weight", "mlp.down_proj.weight", "self_attn.attn_sub_norm.weight", "mlp.ffn_sub_norm.weight")


def weight_shapes(config: dict | ModelArgs) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape for a config, as its architecture module lists them (Model.tensor_shapes),
    each layer's tensors in DRAW_ORDER (then the family's others)."""
    from lowbit.model import get_model_class

    a = config if isinstance(config, ModelArgs) else ModelArgs.from_config(config)
    shapes = get_model_class(a.model_type).tensor_shapes(a)

    def key(item):
        name = item[0]
        if not name.startswith("model.layers."):
            return (0 if name == "model.embed_tokens.weight" else 2, 0, 0)
        _, _, i, suffix = name.split(".", 3)
        return (1, int(i), DRAW_ORDER.index(suffix) if suffix in DRAW_ORDER else len(DRAW_ORDER))

    return dict(sorted(shapes.items(), key=key))


def dummy_weights(config: dict | ModelArgs, seed: int = 0, std: float = 0.05) -> dict[str, np.ndarray]:
    """float32 weights ~ N(0, std) (norm weights ~ 1 +- 0.1), HF names."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in weight_shapes(config).items():
        if name.endswith(".bias"):
            out[name] = (std * rng.standard_normal(shape)).astype(np.float32)
        elif len(shape) == 1:
            out[name] = (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        else:
            out[name] = (std * rng.standard_normal(shape)).astype(np.float32)
    return out
