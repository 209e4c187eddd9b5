"""Synthetic checkpoints for the conversion benchmark: a llama of a given shape with random weights, written
as llama.cpp would (F16 GGUF) or as Hugging Face does (bf16 safetensors), streamed to disk tensor by tensor
(the writer never holds the model). The values are a random pool tiled at random offsets: conversion speed
does not depend on them, and writing 1 B weights stays fast.

    path = write_synthetic("/tmp/lb", "llama-1b", "gguf-f16")
"""
from __future__ import annotations

import json
import pathlib

import numpy as np

from lowbit.io.checkpoint import canonical_names, expected_shape, normalize_config

SHAPES = {
    # Llama-3.2-1B's shape: 1.24 B weights (262 M of them in the tied embedding)
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    "tiny": dict(hidden_size=128, intermediate_size=320, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1000, tie_word_embeddings=True),
}
KINDS = ("gguf-f16", "hf-bf16")
GGUF_BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def synthetic_config(shape: str) -> dict:
    if shape not in SHAPES:
        raise ValueError(f"unknown synthetic shape {shape!r}; known: {', '.join(SHAPES)}")
    return normalize_config(dict(model_type="llama", architectures=["LlamaForCausalLM"], max_position_embeddings=4096,
                                 rms_norm_eps=1e-5, rope_theta=500000.0, bos_token_id=1, eos_token_id=2,
                                 hidden_act="silu", **SHAPES[shape]), shape)


def tensors(config: dict) -> list[tuple[str, tuple[int, ...]]]:
    return [(n, expected_shape(config, n)) for n in canonical_names(config, False)]


class _Values:
    """Random-looking float32 values of any size: a 4 M pool (std 0.02) tiled from a random offset."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.pool = (self.rng.standard_normal(1 << 22) * 0.02).astype(np.float32)

    def __call__(self, shape) -> np.ndarray:
        if len(shape) == 1:
            return (1.0 + 0.1 * self.rng.standard_normal(shape)).astype(np.float32)
        return np.resize(np.roll(self.pool, int(self.rng.integers(len(self.pool)))), shape)


_MERGE = "\u0120 \u0120"  # two spaces (byte-level "Ġ Ġ" -> "ĠĠ"): llama.cpp refuses a BPE vocabulary without merges


def _vocab(n: int) -> list[str]:
    from lowbit.io.tokenizer_gguf import bytes_to_unicode

    tokens = ["<|endoftext|>", "<|begin|>", "<|end|>"] + list(bytes_to_unicode().values()) + [_MERGE.replace(" ", "")]
    return tokens + [f"<|unused{i}|>" for i in range(len(tokens), n)]


def gguf_name(name: str) -> str:
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if name in top:
        return top[name]
    _, _, i, rest = name.split(".", 3)
    return f"blk.{i}.{GGUF_BLOCK[rest[:-len('.weight')]]}.weight"


def write_gguf_f16(path: pathlib.Path, config: dict, seed: int = 0, values=None) -> pathlib.Path:
    """values: a callable shape -> float32 array (default: _Values(seed), random std-0.02 weights)."""
    import gguf

    values = values or _Values(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_rope_dimension_count(config["head_dim"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(config["rope_theta"])
    vocab = _vocab(config["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab)
    w.add_token_types([3 if t.startswith("<|") else 1 for t in vocab])
    w.add_token_merges([_MERGE])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    specs = tensors(config)
    for name, shape in specs:
        dt = np.dtype(np.float16) if len(shape) == 2 else np.dtype(np.float32)
        w.add_tensor_info(gguf_name(name), shape, dt, int(np.prod(shape)) * dt.itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape in specs:
        a = values(shape)
        w.write_tensor_data(a.astype(np.float16) if len(shape) == 2 else a)
        del a
    w.close()
    return path


def write_hf_bf16(folder: pathlib.Path, config: dict, seed: int = 0) -> pathlib.Path:
    from tokenizers import Tokenizer, models

    from lowbit.io.safetensors_file import SafetensorsStreamWriter

    folder.mkdir(parents=True, exist_ok=True)
    values = _Values(seed)
    st = SafetensorsStreamWriter(folder / "model.safetensors", header_room=1 << 16)
    for name, shape in tensors(config):
        a = values(shape)
        st.add(name, (a.view(np.uint32) >> np.uint32(16)).astype(np.uint16), dtype="BF16")  # bf16 (truncated)
        del a
    st.close({"format": "pt"})
    cfg = {k: v for k, v in config.items() if k != "rope_scaling" or v}
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    vocab = _vocab(config["vocab_size"])
    Tokenizer(models.WordLevel({t: i for i, t in enumerate(vocab)}, unk_token="<|endoftext|>")).save(
        str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin|>", "eos_token": "<|end|>"}))
    return folder


def write_synthetic(root, shape: str, kind: str, seed: int = 0) -> pathlib.Path:
    """The synthetic checkpoint `shape` as `kind` under root (written once, then reused)."""
    if kind not in KINDS:
        raise ValueError(f"unknown source kind {kind!r}; known: {', '.join(KINDS)}")
    root = pathlib.Path(root)
    root.mkdir(parents=True, exist_ok=True)
    config = synthetic_config(shape)
    target = root / (f"{shape}-f16.gguf" if kind == "gguf-f16" else f"{shape}-hf-bf16")
    done = root / f".{target.name}.done"
    if not done.exists():
        tmp = root / f".{target.name}.tmp"
        if kind == "gguf-f16":
            write_gguf_f16(tmp, config, seed)
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
            write_hf_bf16(tmp, config, seed)
        if target.is_dir():
            import shutil

            shutil.rmtree(target)
        tmp.rename(target)
        done.touch()
    return target
