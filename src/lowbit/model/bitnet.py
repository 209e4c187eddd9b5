"""BitNet b1.58 (model_type "bitnet", e.g. microsoft/bitnet-b1.58-2B-4T): the Llama decoder with `subln`.

Differences from llama.py, all flags on it: an RMSNorm on the attention output before o_proj
(self_attn.attn_sub_norm) and on the gated FFN product before down_proj (mlp.ffn_sub_norm); the FFN
activation is squared ReLU (config hidden_act "relu2"); embeddings are tied. The ternary weights
arrive as PackedWeights from the checkpoint reader; activations are quantized per token to int8 by
the kernels, as BitNet was trained.
"""
from __future__ import annotations

from lowbit.model import llama


class Model(llama.Model):
    sub_norms = True
    config_defaults = {"rms_norm_eps": 1e-5, "rope_theta": 500000.0, "hidden_act": "relu2"}
