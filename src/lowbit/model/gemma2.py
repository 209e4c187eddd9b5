"""Gemma 2 (model_type "gemma2"): the Llama decoder with
  - embeddings scaled by sqrt(hidden_size) (tied lm_head reads the unscaled table);
  - RMSNorm as x / rms(x) * (1 + w) everywhere (checkpoints store w);
  - four norms per layer: input_layernorm -> attn -> post_attention_layernorm -> + residual,
    pre_feedforward_layernorm -> MLP -> post_feedforward_layernorm -> + residual;
  - GeGLU MLP: down(gelu_tanh(gate(x)) * up(x)) (config hidden_activation);
  - attention scores scaled by query_pre_attn_scalar^-1/2 and soft-capped: s -> c * tanh(s / c)
    (attn_logit_softcapping), final logits likewise (final_logit_softcapping);
  - alternating sliding-window (even layers) and global attention (layer_types).
"""
from __future__ import annotations

import math

import numpy as np

from lowbit.model import llama


class Model(llama.Model):
    norm_names = {"ln1": "input_layernorm", "post_attn": "post_attention_layernorm",
                  "ln2": "pre_feedforward_layernorm", "post_ffn": "post_feedforward_layernorm"}
    features = frozenset({"attention_bias", "sliding_window", "attn_logit_softcapping", "final_logit_softcapping",
                          "query_pre_attn_scalar"})
    config_defaults = {**llama.Model.config_defaults, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
                       "query_pre_attn_scalar": 256, "sliding_window": 4096, "tie_word_embeddings": True,
                       "head_dim": 256, "max_position_embeddings": 8192}
    window_keys = ("sliding_window", "layer_types")  # transformers' Gemma2Config has no use_sliding_window

    def __init__(self, args, weights, **kw):
        cfg = args.extra
        args.hidden_act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh"
        self.embed_scale = math.sqrt(args.hidden_size)
        self.attn_softcap = cfg.get("attn_logit_softcapping") or None
        self.final_softcap = cfg.get("final_logit_softcapping") or None
        super().__init__(args, weights, **kw)

    def attention_scale(self) -> float:
        return float(self.args.extra.get("query_pre_attn_scalar") or self.args.head_dim) ** -0.5

    def rms_weight(self, w) -> np.ndarray:
        return self.norm_weight(w) + np.float32(1.0)

    def default_layer_types(self) -> list[str]:
        return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(self.args.num_hidden_layers)]
