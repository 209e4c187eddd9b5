"""Model definitions: one module per architecture, keyed by the Hugging Face model_type.

    from lowbit.model import Model
    model = Model.from_weights(config, weights)   # config: HF config dict; weights: name -> PackedWeight | array
    logits = model.prefill(ids)                   # [vocab] for the last prompt token (GEMM path)
    logits = model.decode(token)                  # [vocab] for the next token (GEMV path)
"""
from __future__ import annotations

import importlib

from lowbit.model.config import ARCH_ALIASES, ModelArgs
from lowbit.model.kv_cache import ContextOverflowError, KVCache
from lowbit.model.llama import Model


def get_model_class(model_type: str) -> type[Model]:
    """The Model class of the architecture module for a HF model_type (lowbit.model.<arch>.Model)."""
    try:
        arch = ARCH_ALIASES[model_type]
    except KeyError:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(sorted(ARCH_ALIASES))}") from None
    return importlib.import_module(f"lowbit.model.{arch}").Model


__all__ = ["ContextOverflowError", "KVCache", "Model", "ModelArgs", "get_model_class"]
