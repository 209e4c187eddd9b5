"""Tiny checkpoints written by the io tests in each real layout: HF safetensors (sharded, bf16/f16/f32,
BitNet-packed ternary), GGUF (F32/F16/Q8_0/Q4_0/TQ1_0/TQ2_0), with a small byte-level BPE tokenizer."""
from __future__ import annotations

import hashlib
import json
import pathlib

import numpy as np

from lowbit.formats.floats import bf16_bits_to_f32, f32_to_bf16_bits
from lowbit.io.checkpoint import canonical_names, expected_shape, is_linear, normalize_config

CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def safetensors_digest(d: pathlib.Path) -> dict[str, str]:
    """sha256 of every .safetensors file in a model dir, by name: equal digests = byte-identical conversions."""
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir()) if f.suffix == ".safetensors"}


def tiny_config(**over) -> dict:
    cfg = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=96,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=300,
               max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
               bos_token_id=1, eos_token_id=2, hidden_act="silu")
    cfg.update(over)
    return cfg


def random_weights(cfg: dict, seed: int = 0, sub_norms: bool = False) -> dict[str, np.ndarray]:
    """HF name -> float32 array with the config's shapes (norms around 1)."""
    rng = np.random.default_rng(seed)
    full = normalize_config(cfg, "tiny")
    out = {}
    for name in canonical_names(full, sub_norms):
        shape = expected_shape(full, name)
        w = rng.standard_normal(shape).astype(np.float32)
        out[name] = (1.0 + 0.1 * w) if len(shape) == 1 else 0.05 * w
    return out


def random_ternary(shape, rng) -> np.ndarray:
    return rng.integers(-1, 2, size=shape).astype(np.int8)


# ---- tokenizer ----

def byte_bpe_parts(vocab_size: int = 300):
    """(tokens in the GPT-2 byte alphabet, merges "a b", token types) for a tiny byte-level BPE."""
    from lowbit.io.tokenizer_gguf import bytes_to_unicode
    alphabet = list(bytes_to_unicode().values())
    tokens = SPECIALS + alphabet
    merges = []
    for a, b in [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or"),
                 ("Ġwor", "l"), ("Ġworl", "d"), ("Ġ", "t"), ("Ġt", "h"), ("Ċ", "Ċ"), ("1", "2")]:
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    while len(tokens) < vocab_size:
        tokens.append(f"<|unused{len(tokens)}|>")
    types = [3 if t in SPECIALS else 1 for t in tokens]
    return tokens, merges, types


def write_tokenizer(d: pathlib.Path, vocab_size: int = 300, add_bos: bool | None = None) -> None:
    """tokenizer.json (byte-level BPE, specials), tokenizer_config.json (ChatML template)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    d.mkdir(parents=True, exist_ok=True)
    tokens, merges, _ = byte_bpe_parts(vocab_size)
    tk = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ")) for m in merges]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tk.save(str(d / "tokenizer.json"))
    tc = {"bos_token": "<|im_start|>", "eos_token": "<|endoftext|>", "chat_template": CHATML,
          "tokenizer_class": "PreTrainedTokenizerFast"}
    if add_bos is not None:
        tc["add_bos_token"] = add_bos
    (d / "tokenizer_config.json").write_text(json.dumps(tc))


# ---- HF safetensors ----

def _encode(w: np.ndarray, dtype: str):
    if dtype == "bf16":
        return f32_to_bf16_bits(w)
    return w.astype(np.float16 if dtype == "f16" else np.float32)


def pack_bitnet(t: np.ndarray) -> np.ndarray:
    """int8 [out, in] in {-1,0,1} -> uint8 [ceil(out/4), in] as transformers' pack_weights."""
    r = -(-t.shape[0] // 4)
    packed = np.zeros((r, t.shape[1]), np.uint8)
    codes = (t + 1).astype(np.uint8)
    for i in range(4):
        part = codes[i * r:(i + 1) * r]
        packed[: part.shape[0]] |= part << np.uint8(2 * i)
    return packed


def write_hf(d, cfg: dict, weights: dict[str, np.ndarray], dtype: str = "bf16", shards: int = 1,
             tokenizer: bool = True, extra: dict | None = None) -> pathlib.Path:
    """An HF folder: config.json, model.safetensors (or shards + index). bf16 is written as real BF16.

    extra: stored name -> np.ndarray written as is (packed uint8 weights, weight_scale, ...), replacing weights.
    """
    from safetensors.numpy import save_file
    d = pathlib.Path(d)
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    arrays = {n: _encode(w, dtype) for n, w in weights.items()}
    arrays.update(extra or {})
    names = list(arrays)
    parts = [names[i::shards] for i in range(shards)]
    weight_map = {}
    for i, part in enumerate(parts):
        fname = "model.safetensors" if shards == 1 else f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: np.ascontiguousarray(arrays[n]) for n in part}, str(d / fname))
        weight_map.update({n: fname for n in part})
    if dtype == "bf16":  # safetensors numpy has no bf16: patch the header's dtype for the uint16 arrays
        for fname in set(weight_map.values()):
            _patch_dtype(d / fname, {n for n in weight_map if weight_map[n] == fname and n in weights}, "U16", "BF16")
    if shards > 1:
        (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if tokenizer:
        write_tokenizer(d, cfg["vocab_size"])
    return d


def _patch_dtype(path: pathlib.Path, names: set[str], old: str, new: str) -> None:
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    for name in names:
        if header[name]["dtype"] == old:
            header[name]["dtype"] = new
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])


def write_bitnet_packed(d, cfg: dict, seed: int = 0, linear_class: str | None = "autobitlinear",
                        sub_norms: bool = True) -> tuple[pathlib.Path, dict]:
    """A microsoft/bitnet-b1.58-2B-4T-style (autobitlinear) or Falcon3-1.58bit-style (no linear_class) folder.

    Returns (folder, {name: (t int8 [out, in], weight_scale float)}).
    """
    rng = np.random.default_rng(seed)
    weights = random_weights(cfg, seed, sub_norms=sub_norms)
    truth, extra = {}, {}
    for name in [n for n in weights if is_linear(n)]:
        t = random_ternary(weights.pop(name).shape, rng)
        ws = float(bf16_bits_to_f32(f32_to_bf16_bits(np.array([rng.uniform(0.5, 2.0)], np.float32)))[0])  # bf16-exact
        truth[name] = (t, ws)
        extra[name] = pack_bitnet(t)
        extra[name[: -len("weight")] + "weight_scale"] = f32_to_bf16_bits(np.array([ws], np.float32))
    q = {"quant_method": "bitnet"}
    if linear_class:
        q.update(linear_class=linear_class, quantization_mode="offline")
    cfg = {**cfg, "quantization_config": q}
    path = write_hf(d, cfg, weights, dtype="bf16", extra=extra)
    scale_names = {n for n in extra if n.endswith("weight_scale")}
    _patch_dtype(path / "model.safetensors", scale_names, "U16", "BF16")
    return path, truth


# ---- GGUF ----

def llama3_rope_factors(head_dim: int, theta: float, scaling: dict) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's convert_hf_to_gguf.py writes it for rope_type llama3."""
    import math
    factor, lo, hi = scaling["factor"], scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old = scaling["original_max_position_embeddings"]
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < old / hi:
            out.append(1.0)
        elif wavelen > old / lo:
            out.append(factor)
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, np.float32)


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py's permute (HF rows -> GGUF rows)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
BLOCK = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
         "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
         "self_attn.attn_sub_norm": "attn_sub_norm", "mlp.ffn_sub_norm": "ffn_sub_norm"}


def gguf_name(name: str) -> str:
    if name in GGUF_NAMES:
        return GGUF_NAMES[name]
    _, _, i, rest = name.split(".", 3)
    base, _, kind = rest.rpartition(".")
    return f"blk.{i}.{BLOCK[base]}.{kind}"


def add_byte_bpe_tokenizer(w, vocab_size: int, pre: str = "gpt2", add_bos: bool | None = False,
                           add_eos: bool | None = None) -> None:
    """Writes byte_bpe_parts' tokenizer (gpt2 model, BOS 1, EOS 2, ChatML) into GGUFWriter w; add_bos / add_eos:
    the tokenizer.ggml.add_bos_token / add_eos_token keys (None: not written)."""
    tokens, merges, ttypes = byte_bpe_parts(vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(ttypes)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    w.add_chat_template(CHATML)


def write_gguf(path, cfg: dict, weights: dict[str, np.ndarray], types: dict[str, str] | None = None,
               arch: str = "llama", pre: str = "smollm", default_type: str = "F32",
               raw: dict | None = None, gguf_tensors: dict | None = None, add_bos: bool | None = False,
               add_eos: bool | None = None) -> pathlib.Path:
    """A GGUF as llama.cpp writes it: Q/K rows permuted (arch llama), tokenizer metadata, quantized tensors.

    types: HF name -> GGML type name (F32, F16, Q8_0, Q4_0, TQ1_0, TQ2_0) for 2-D tensors (default default_type).
    raw: HF name -> (uint8 blocks [rows, bytes], GGMLQuantizationType) written as is (not permuted).
    gguf_tensors: GGUF name -> float32 array written as F32 (rope_freqs.weight, ...).
    """
    import gguf
    from gguf import GGMLQuantizationType as T
    from gguf import quants
    path = pathlib.Path(path)
    full = normalize_config(cfg, "tiny")
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(full["num_hidden_layers"])
    w.add_context_length(full["max_position_embeddings"])
    w.add_embedding_length(full["hidden_size"])
    w.add_feed_forward_length(full["intermediate_size"])
    w.add_head_count(full["num_attention_heads"])
    w.add_head_count_kv(full["num_key_value_heads"])
    w.add_rope_dimension_count(full["head_dim"])
    w.add_layer_norm_rms_eps(full["rms_norm_eps"])
    w.add_rope_freq_base(full["rope_theta"])
    add_byte_bpe_tokenizer(w, full["vocab_size"], pre, add_bos, add_eos)
    for name, a in weights.items():
        if arch == "llama" and name.endswith("q_proj.weight"):
            a = permute_qk(a, full["num_attention_heads"])
        elif arch == "llama" and name.endswith("k_proj.weight"):
            a = permute_qk(a, full["num_key_value_heads"])
        qtype = T[(types or {}).get(name, default_type)] if a.ndim == 2 else T.F32
        if qtype == T.F32:
            w.add_tensor(gguf_name(name), np.ascontiguousarray(a, np.float32))
        elif qtype == T.F16:
            w.add_tensor(gguf_name(name), a.astype(np.float16))
        else:
            w.add_tensor(gguf_name(name), quants.quantize(np.ascontiguousarray(a, np.float32), qtype), raw_dtype=qtype)
    for name, (data, qtype) in (raw or {}).items():
        w.add_tensor(gguf_name(name), data, raw_dtype=qtype)
    for name, a in (gguf_tensors or {}).items():
        w.add_tensor(name, np.ascontiguousarray(a, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_spm_gguf(path, cfg: dict | None = None, add_eos: bool | None = None) -> pathlib.Path:
    """A GGUF with a tiny SentencePiece-BPE vocabulary (tokenizer.ggml.model = "llama", byte fallback); add_eos:
    the tokenizer.ggml.add_eos_token key (None: not written)."""
    import gguf
    pieces = ["\u2581", "h", "e", "l", "o", "w", "r", "d", "t", "\u2581h", "he", "ll", "llo", "hello", "\u2581hello",
              "\u2581w", "or", "\u2581wor", "ld", "\u2581world", "\u2581t", "th", "\u2581the", "a", "n", "\u2581a", "an",
              "\u2581an", "1", "2", "c", "f", "\u00e9", "caf\u00e9"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
    cfg = cfg or tiny_config(vocab_size=len(tokens))
    full = normalize_config(cfg, "tiny")
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(full["num_hidden_layers"])
    w.add_context_length(full["max_position_embeddings"])
    w.add_embedding_length(full["hidden_size"])
    w.add_feed_forward_length(full["intermediate_size"])
    w.add_head_count(full["num_attention_heads"])
    w.add_head_count_kv(full["num_key_value_heads"])
    w.add_layer_norm_rms_eps(full["rms_norm_eps"])
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    for name, a in random_weights(cfg).items():
        w.add_tensor(gguf_name(name), a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return pathlib.Path(path)
