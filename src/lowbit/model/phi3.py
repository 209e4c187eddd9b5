"""Phi-3 / Phi-3.5-mini (model_type "phi3"): the Llama decoder whose checkpoints fuse q/k/v into
self_attn.qkv_proj [q + 2 kv, hidden] and gate/up into mlp.gate_up_proj [2 inter, hidden] (gate first); the
checkpoint readers split them into the usual names (io.checkpoint.FUSED). Sliding window over every layer
when the config sets one (Phi-3-mini-4k: 2047; sliding_window alone decides, as in transformers' Phi3Config). RoPE "longrope" (also spelled "su"): per-frequency
divisors, `short_factor` while the context stays within original_max_position_embeddings and `long_factor`
beyond it, with cos/sin scaled by sqrt(1 + ln(factor) / ln(original)) (transformers' attention_factor).
transformers picks the set from the current sequence length; lowbit's cache is static, so it picks by the
context it runs with: by default it caps that context at original_max_position_embeddings (exactly
transformers for every sequence); a larger max_context uses the long factors (exactly transformers for
sequences longer than the original context) and says so.
"""
from __future__ import annotations

import math
import warnings

from lowbit.model import llama
from lowbit.model.config import rope_parameters
from lowbit.model.layers import Rope


def longrope_settings(cfg: dict, max_context: int) -> tuple[dict, float]:
    """(scaling dict for rope_inv_freq, attention factor) of a longrope config for this context."""
    rp = rope_parameters(cfg)
    original = int(rp.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings")
                   or cfg["max_position_embeddings"])
    factor = rp.get("factor") or cfg["max_position_embeddings"] / original
    attention = rp.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    key = "long_factor" if max_context > original else "short_factor"
    return {"rope_type": "longrope", "factors": rp[key]}, float(attention)


class Model(llama.Model):
    features = frozenset({"sliding_window"})
    rope_types = ("default", "linear", "longrope", "su")
    config_defaults = {"rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "original_max_position_embeddings": 4096}
    window_keys = ("sliding_window",)

    def __init__(self, args, weights, tokenizer=None, max_context=None, **kw):
        rp = args.rope_scaling or {}
        if rp.get("rope_type", rp.get("type")) in ("longrope", "su"):
            original = int(rp.get("original_max_position_embeddings")
                           or args.extra.get("original_max_position_embeddings") or args.max_position_embeddings)
            if max_context is None:
                max_context = min(original, llama.DEFAULT_MAX_CONTEXT)
            elif max_context > original:
                warnings.warn(f"Phi-3 longrope: max_context {max_context} > original_max_position_embeddings "
                              f"{original}: using the long RoPE factors for every position, as transformers does "
                              f"only for sequences longer than {original}", stacklevel=3)
        super().__init__(args, weights, tokenizer=tokenizer, max_context=max_context, **kw)

    def make_rope(self) -> Rope:
        a = self.args
        rp = a.rope_scaling or {}
        if rp.get("rope_type", rp.get("type")) not in ("longrope", "su"):
            return super().make_rope()
        scaling, attention = longrope_settings({**a.extra, "rope_scaling": rp}, self.max_context)
        return Rope(a.head_dim, self.max_context, a.rope_theta, scaling, attention_factor=attention)
