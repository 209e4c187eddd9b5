"""Qwen2 / Qwen2.5 (model_type "qwen2"): the Llama decoder with biases on q_proj, k_proj and v_proj (always,
whatever attention_bias says; o_proj and the MLP have none). Sliding windows only when use_sliding_window
is set, in the layers from max_window_layers on (or as layer_types lists them).
"""
from __future__ import annotations

from lowbit.model import llama
from lowbit.model.config import ModelArgs


class Model(llama.Model):
    features = frozenset({"sliding_window"})
    config_defaults = {**llama.Model.config_defaults, "use_sliding_window": False, "max_window_layers": 28,
                       "max_position_embeddings": 32768}
    window_keys = ("sliding_window", "use_sliding_window", "layer_types")

    @classmethod
    def attn_biases(cls, a: ModelArgs) -> tuple[str, ...]:
        return ("q_proj", "k_proj", "v_proj")

    def default_layer_types(self) -> list[str]:
        first = int(self.args.extra.get("max_window_layers") or 0)
        return ["sliding_attention" if i >= first else "full_attention" for i in range(self.args.num_hidden_layers)]
