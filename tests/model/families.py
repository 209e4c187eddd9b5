"""Tiny random checkpoints of each model family, written as transformers writes them (config class + model
class, random weights, save_pretrained in safetensors) and as llama.cpp writes them (GGUF, its tensor names
and metadata keys per arch), with a small byte-level BPE tokenizer and a ChatML template."""
from __future__ import annotations

import pathlib

import numpy as np

from tests.io.tiny import add_byte_bpe_tokenizer, permute_qk, write_tokenizer

VOCAB = 300
COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              vocab_size=VOCAB, max_position_embeddings=128, rms_norm_eps=1e-5, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
HD = 16
HALF_FREQS = HD // 2


def family_configs() -> dict[str, tuple[str, dict]]:
    """family -> (transformers config class name, kwargs): each exercises what makes the family different."""
    rng = np.random.default_rng(7)
    short = (1.0 + rng.random(HALF_FREQS)).round(3).tolist()
    long = (2.0 + 4 * rng.random(HALF_FREQS)).round(3).tolist()
    return {
        "qwen2": ("Qwen2Config", dict(COMMON)),
        "qwen3": ("Qwen3Config", dict(COMMON, head_dim=HD)),
        "mistral": ("MistralConfig", dict(COMMON, head_dim=HD, sliding_window=8)),
        "phi3": ("Phi3Config", dict(COMMON, sliding_window=12, original_max_position_embeddings=32,
                                    rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                     "short_factor": short, "long_factor": long})),
        "gemma2": ("Gemma2Config", dict(COMMON, head_dim=HD, query_pre_attn_scalar=HD, sliding_window=8,
                                        attn_logit_softcapping=2.0, final_logit_softcapping=3.0,
                                        tie_word_embeddings=True)),
    }


def randomize_(model, seed: int, gemma: bool) -> None:
    """Weights large enough that the tiny model's logits are far from uniform; norms around 1 (Gemma: w ~ 0)."""
    import torch
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                p.copy_((0.0 if gemma else 1.0) + 0.1 * noise)
            elif "embed_tokens" in name:
                p.copy_(0.5 * noise)
            else:
                p.copy_(0.12 * noise)


def write_hf_family(d, family: str, seed: int = 0, **over):
    """(folder, transformers model in float32 eval mode); family "llama" too; over: config overrides."""
    import torch
    import transformers
    cls_name, kw = family_configs()[family] if family != "llama" else ("LlamaConfig", dict(COMMON))
    kw = {**kw, **over}
    cfg = getattr(transformers, cls_name)(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg).float().eval()
    randomize_(model, seed, gemma=family == "gemma2")
    d = pathlib.Path(d)
    model.save_pretrained(d)
    write_tokenizer(d, VOCAB)
    if family.startswith("qwen"):  # Qwen's tokenizer.json splits with its own regex (transformers' Qwen2Tokenizer too)
        from tokenizers import Tokenizer

        from lowbit.io.tokenizer_gguf import byte_level_pre_tokenizer
        tk = Tokenizer.from_file(str(d / "tokenizer.json"))
        tk.pre_tokenizer = byte_level_pre_tokenizer("qwen2")
        tk.save(str(d / "tokenizer.json"))
    return d, model


# ---- GGUF, as llama.cpp's convert_hf_to_gguf.py writes each arch ----

BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
         "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
         "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up"}
GEMMA2_BLOCK = {"post_attention_layernorm": "post_attention_norm", "pre_feedforward_layernorm": "ffn_norm",
                "post_feedforward_layernorm": "post_ffw_norm"}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}


def gguf_tensor_name(name: str, arch: str) -> str:
    if name in TOP:
        return TOP[name]
    _, _, i, rest = name.split(".", 3)
    base, _, kind = rest.rpartition(".")
    return f"blk.{i}.{(GEMMA2_BLOCK if arch == 'gemma2' else {}).get(base, BLOCK.get(base))}.{kind}"


def write_gguf_family(path, family: str, model, qtype: str = "F32"):
    """The transformers model as a GGUF of llama.cpp's arch for this family (mistral: arch llama)."""
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import quants
    cfg = model.config
    arch = "llama" if family == "mistral" else family
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    if getattr(cfg, "sliding_window", None):
        w.add_sliding_window(cfg.sliding_window)
    if family == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    add_byte_bpe_tokenizer(w, VOCAB, "qwen2" if family.startswith("qwen") else "gpt2")
    if family == "phi3":
        rp = cfg.rope_parameters
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
        w.add_tensor("rope_factors_long.weight", np.asarray(rp["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(rp["short_factor"], np.float32))
    for name, t in model.state_dict().items():
        if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        a = t.detach().float().numpy().copy()
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):  # biases too, as llama.cpp
            a = permute_qk(a, cfg.num_attention_heads)
        elif arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            a = permute_qk(a, cfg.num_key_value_heads)
        if family == "gemma2" and name.endswith("norm.weight"):
            a = a + 1.0  # llama.cpp stores Gemma's norms as 1 + w
        gname = gguf_tensor_name(name, arch)
        if a.ndim == 2 and qtype != "F32":
            w.add_tensor(gname, quants.quantize(np.ascontiguousarray(a, np.float32), T[qtype]), raw_dtype=T[qtype])
        else:
            w.add_tensor(gname, np.ascontiguousarray(a, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return pathlib.Path(path)
