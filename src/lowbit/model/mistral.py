"""Mistral (model_type "mistral", e.g. Mistral-7B-v0.1/v0.3, Ministral): the Llama decoder with sliding-window
attention when the config gives `sliding_window` (v0.1: 4096; v0.2+ null). Each query attends to the last
`sliding_window` positions, itself included, in every layer; a window at least as long as the context the
model runs with changes nothing, or in the layers layer_types says (transformers' AutoConfig reads a Mistral
config.json with layer_types as Ministral's, which reads them). A use_sliding_window key (Qwen 2's) changes
nothing: neither config class has it. No biases (transformers' Mistral has none).
"""
from __future__ import annotations

from lowbit.model import llama


class Model(llama.Model):
    features = frozenset({"sliding_window"})
    config_defaults = {**llama.Model.config_defaults, "sliding_window": 4096, "max_position_embeddings": 131072}
    window_keys = ("sliding_window", "layer_types")
