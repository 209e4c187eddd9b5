"""Qwen3 (model_type "qwen3"): Qwen2's decoder without the q/k/v biases (unless attention_bias, then on q, k,
v and o) and with an RMSNorm over each head of q and of k (self_attn.q_norm / k_norm, [head_dim]) before RoPE.
"""
from __future__ import annotations

from lowbit.model import qwen2
from lowbit.model.config import ModelArgs
from lowbit.model.llama import Model as Llama


class Model(qwen2.Model):
    qk_norm = True
    features = frozenset({"sliding_window", "attention_bias"})
    config_defaults = {**qwen2.Model.config_defaults, "head_dim": 128}

    @classmethod
    def attn_biases(cls, a: ModelArgs) -> tuple[str, ...]:
        return Llama.attn_biases.__func__(cls, a)
