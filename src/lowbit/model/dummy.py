"""Random weights for a config, so tests and benchmarks can build a model of any shape without files.

    weights = dummy_weights(config, seed=0)                    # name -> float32 array (HF names)
    model = Model.from_weights(config, weights, format="ternary")
"""
from __future__ import annotations

import numpy as np

from lowbit.model.config import ModelArgs


def weight_shapes(config: dict | ModelArgs) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape for a config, as its architecture module lists them (Model.tensor_shapes)."""
    from lowbit.model import get_model_class

    a = config if isinstance(config, ModelArgs) else ModelArgs.from_config(config)
    return get_model_class(a.model_type).tensor_shapes(a)


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
