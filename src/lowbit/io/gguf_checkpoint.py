"""GGUF checkpoints (llama.cpp), read with the `gguf` package and mapped to Hugging Face names and config.

Tensors: F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q5_*/Q2_K..Q6_K/... dequantize to float32 natively (io.gguf_blocks,
bit-identical to gguf.quants; other types through gguf.quants); TQ1_0/TQ2_0 decode losslessly to ternary t [M, K] + one float16 scale d per (row, 256-block) ->
TernaryWeight(group=256), or one scale per row (group = Kp) when each row's blocks share one d (a TQ2_0
export of a BitNet model, whose F16 export then converts to the very same codes and scales).

llama.cpp's converter permutes the rows of Q and K for its RoPE (arch "llama" only: "bitnet" uses the
NEOX rope and is not permuted). Per head, HF rows [0..hd/2) and [hd/2..hd) are interleaved:
    gguf = hf.reshape(n_head, 2, hd/2, K).swapaxes(1, 2).reshape(M, K)
and we undo it (as transformers' GGUF loader does):
    hf = gguf.reshape(n_head, hd/2, 2, K).swapaxes(1, 2).reshape(M, K)
with n_head = num_attention_heads for Q and num_key_value_heads for K.

Families (llama.cpp's names, gguf.constants MODEL_TENSORS): qwen2 (attn_{q,k,v}.bias), qwen3
(attn_{q,k}_norm), phi3 (fused attn_qkv and ffn_up = [gate; up], rope_factors_{long,short}), gemma2
(post_attention_norm, ffn_norm = pre-MLP, post_ffw_norm; llama.cpp stores its norms as 1 + w, we give w
back). Mistral GGUFs are arch "llama". Metadata that changes the math (sliding window, soft-capping,
rope scaling, experts) becomes the HF config key, which lowbit.model.config.check_supported judges.
"""
from __future__ import annotations

import numpy as np

from lowbit.formats.ternary import TernaryWeight, row_scales_if_uniform
from lowbit.io import gguf_blocks
from lowbit.io.checkpoint import (
    LM_HEAD, Checkpoint, canonical_names, check_all_used, check_shape, expected_shape, fused_parts, fused_suffix,
    normalize_config,
)

TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": LM_HEAD}
BLOCK_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_sub_norm": "self_attn.attn_sub_norm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "ffn_sub_norm": "mlp.ffn_sub_norm",
}
ARCH_BLOCK_NAMES = {  # per-arch renames on top of BLOCK_NAMES
    "gemma2": {"post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"},
    "qwen3": {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
    "phi3": {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"},
}
ARCHS = {"llama": "llama", "bitnet": "bitnet", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3", "gemma2": "gemma2"}
HF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "bitnet": "BitNetForCausalLM", "qwen2": "Qwen2ForCausalLM",
                    "qwen3": "Qwen3ForCausalLM", "phi3": "Phi3ForCausalLM", "gemma2": "Gemma2ForCausalLM"}
# tensors read into the config rather than the weights
CONFIG_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight", "rope_freqs.weight")
CODE_TYPES = ("Q4_0", "Q4_1", "Q8_0")  # load_source keeps their codes (Int4Weight.from_gguf_q4, Int8Weight's)
TERNARY_TYPES = ("TQ1_0", "TQ2_0")  # an optional blk.N.<name>.scale (one float) multiplies the weight
QK_K = 256


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; None for tensors lowbit does not know."""
    if gguf_name in TOP_NAMES:
        return TOP_NAMES[gguf_name]
    parts = gguf_name.split(".")
    names = {**BLOCK_NAMES, **ARCH_BLOCK_NAMES.get(arch, {})}
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[3] in ("weight", "bias") \
            and parts[2] in names:
        return f"model.layers.{int(parts[1])}.{names[parts[2]]}.{parts[3]}"
    return None


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undoes llama.cpp's Q/K row permutation: [M, ...] -> [M, ...] (see the module docstring)."""
    m = w.shape[0]
    return np.ascontiguousarray(w.reshape(n_head, m // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def field_value(field):
    """A gguf-py GGUFReader field (tests that rewrite GGUFs with gguf's writer) as Python (str, int, float, bool, or a list of them)."""
    from gguf import GGUFValueType
    main = field.types[0]
    if main == GGUFValueType.ARRAY and field.types[-1] == GGUFValueType.STRING:
        return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
    if main == GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8", "replace")
    return field.contents()


class GGUFCheckpoint(Checkpoint):
    kind = "gguf"

    def __init__(self, path):
        super().__init__(path)
        from lowbit.io.gguf_file import GGUFFile
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such GGUF file")
        try:
            self.reader = GGUFFile(self.path)
        except Exception as e:  # mmap / struct / numpy errors on bad files
            raise ValueError(f"{self.path}: malformed or truncated GGUF file ({type(e).__name__}: {e})") from None
        self.meta = self.reader.fields
        self.arch = self.get("general.architecture")
        if self.arch not in ARCHS:
            raise ValueError(f"{self.path}: unsupported GGUF architecture {self.arch!r}; lowbit supports {', '.join(ARCHS)}")
        self.tensors = {}
        by_name = self._by_name = {t.name: t for t in self.reader.tensors}
        self.extra = {n: by_name[n] for n in ("rope_freqs.weight",) if n in by_name}  # model-wide, not weights
        unknown = []
        for t in self.reader.tensors:
            name = hf_name(t.name, self.arch)
            if name is not None:
                self.tensors[name] = t
            elif t.name not in CONFIG_TENSORS and not t.name.endswith(".scale"):
                unknown.append(t.name)
        if unknown:
            raise ValueError(f"{self.path}: tensors lowbit does not implement for arch {self.arch!r}: {unknown[:4]}"
                             + (f" and {len(unknown) - 4} more" if len(unknown) > 4 else ""))
        # optional per-tensor output scales of some BitNet GGUFs: blk.N.attn_q.scale (one float32)
        self.scales = {n: by_name[t.name[:-len("weight")] + "scale"] for n, t in self.tensors.items()
                       if t.name.endswith(".weight") and t.name[:-len("weight")] + "scale" in by_name}
        self.config = normalize_config(self._config(), self.path)
        if "rope_freqs.weight" in self.extra:  # Llama 3.1/3.2: llama3 scaling as per-frequency factors
            self.config["rope_freq_factors"] = self._rope_freq_factors(self.extra["rope_freqs.weight"])
        self.sub_norms = any(n.endswith("attn_sub_norm.weight") for n in self.tensors)
        self._names = canonical_names(self.config, self.sub_norms)
        self.parts: dict[str, tuple[str, int, int]] = {}  # canonical name -> (fused name, first row, end row)
        for fused in [n for n in self.tensors if fused_suffix(n)]:
            t = self.tensors[fused]
            check_shape(self.path, fused, tuple(int(s) for s in reversed(t.shape.tolist())),
                        expected_shape(self.config, fused))
            for name, start, stop in fused_parts(self.config, fused):
                self.parts[name] = (fused, start, stop)
        check_all_used(self.path, self.config, self.tensors, self._names + [p[0] for p in self.parts.values()])
        missing = [n for n in self._names if n not in self.tensors and n not in self.parts]
        if missing:
            raise ValueError(f"{self.path}: GGUF lacks {len(missing)} tensors the metadata implies, e.g. {missing[:3]}")
        for name in self._names:
            if name in self.parts:
                continue
            t = self.tensors[name]
            shape = tuple(int(s) for s in reversed(t.shape.tolist()))
            check_shape(self.path, name, shape, expected_shape(self.config, name))
            if t.data.nbytes != t.n_bytes:
                raise ValueError(f"{self.path}: tensor {t.name!r} is truncated ({t.data.nbytes} of {t.n_bytes} bytes)")

    def get(self, key: str, default=None):
        v = self.meta.get(key)
        if v is None:
            return default
        return v.tolist() if isinstance(v, np.ndarray) else v

    def _config(self) -> dict:
        a = self.arch
        g = lambda k, d=None: self.get(f"{a}.{k}", d)  # noqa: E731
        embd = self.tensors.get("model.embed_tokens.weight")
        vocab = int(embd.shape[1]) if embd is not None else g("vocab_size") or len(self.get("tokenizer.ggml.tokens", []))
        cfg = {
            "model_type": ARCHS[a], "architectures": [HF_ARCHITECTURES[a]],
            "hidden_size": g("embedding_length"), "intermediate_size": g("feed_forward_length"),
            "num_hidden_layers": g("block_count"), "num_attention_heads": g("attention.head_count"),
            "num_key_value_heads": g("attention.head_count_kv"),
            "head_dim": g("attention.key_length") or g("rope.dimension_count"),
            "rms_norm_eps": g("attention.layer_norm_rms_epsilon"), "rope_theta": g("rope.freq_base"),
            "max_position_embeddings": g("context_length"), "vocab_size": vocab,
            "tie_word_embeddings": LM_HEAD not in self.tensors, "hidden_act": "silu",
            "bos_token_id": self.get("tokenizer.ggml.bos_token_id"), "eos_token_id": self.get("tokenizer.ggml.eos_token_id"),
            "pad_token_id": self.get("tokenizer.ggml.padding_token_id"),
        }
        for key in ("num_key_value_heads", "num_attention_heads"):
            if isinstance(cfg[key], list):  # per-layer head counts: lowbit needs them uniform
                if len(set(cfg[key])) != 1:
                    raise ValueError(f"{self.path}: per-layer {key} {cfg[key]} is not supported")
                cfg[key] = cfg[key][0]
        # as llama.cpp reads them: the type defaults to linear, the factor to the older rope.scale_linear key
        kind = g("rope.scaling.type") or "linear"
        factor = g("rope.scaling.factor")
        if factor is None:
            factor = g("rope.scale_linear")
        if kind != "none" and factor and factor != 1.0:
            cfg["rope_scaling"] = {"rope_type": kind, "factor": float(factor)}
            if g("rope.scaling.original_context_length"):
                cfg["rope_scaling"]["original_max_position_embeddings"] = g("rope.scaling.original_context_length")
        # metadata that changes the math -> the HF key (check_supported refuses what the arch does not implement)
        rope_dims, hd = g("rope.dimension_count"), cfg["head_dim"]
        if rope_dims and hd and rope_dims != hd:
            cfg["partial_rotary_factor"] = rope_dims / hd
        for key, hf in (("attention.sliding_window", "sliding_window"), ("attn_logit_softcapping", "attn_logit_softcapping"),
                        ("final_logit_softcapping", "final_logit_softcapping"), ("expert_count", "num_local_experts")):
            if g(key) is not None:
                cfg[hf] = g(key)
        # llama.cpp loads each bias when present; transformers' attention_bias / mlp_bias mean all of them
        if any(n.endswith(("_proj.bias")) and ".self_attn." in n for n in self.tensors) and a != "qwen2":
            cfg["attention_bias"] = True
        if any(n.endswith("_proj.bias") and ".mlp." in n for n in self.tensors):
            cfg["mlp_bias"] = True
        if a == "llama" and cfg.get("sliding_window"):  # Mistral v0.1 is arch llama in GGUF; its window is Mistral's
            cfg["model_type"], cfg["architectures"] = "mistral", ["MistralForCausalLM"]
        if a == "gemma2":  # llama.cpp scales q by 1/sqrt(head_dim), or 1/sqrt(hidden/heads) for the 27B (46 layers)
            cfg["hidden_activation"] = "gelu_pytorch_tanh"
            cfg["query_pre_attn_scalar"] = (cfg["hidden_size"] // cfg["num_attention_heads"]
                                            if cfg["num_hidden_layers"] == 46 else cfg["head_dim"])
        if a == "phi3" and "rope_factors_long.weight" in self._by_name:
            original = g("rope.scaling.original_context_length") or cfg["max_position_embeddings"]
            cfg["rope_scaling"] = {
                "rope_type": "longrope", "original_max_position_embeddings": int(original),
                "long_factor": self._vector("rope_factors_long.weight"),
                "short_factor": self._vector("rope_factors_short.weight")}
            if g("rope.scaling.attn_factor") is not None:
                cfg["rope_scaling"]["attention_factor"] = float(g("rope.scaling.attn_factor"))
        return cfg

    def _vector(self, name: str) -> list[float]:
        from gguf import quants
        t = self._by_name[name]
        return [float(v) for v in quants.dequantize(t.data, t.tensor_type).reshape(-1)]

    def _rope_freq_factors(self, t) -> list[float]:
        """rope_freqs.weight: one float per rotary frequency (head_dim/2 of them); inv_freq is divided by it."""
        from gguf import quants
        hd = self.config["head_dim"]
        try:
            f = np.asarray(quants.dequantize(t.data, t.tensor_type), np.float64).reshape(-1)
        except (NotImplementedError, ValueError) as e:
            raise ValueError(f"{self.path}: rope_freqs.weight cannot be read ({e})") from None
        if f.size != hd // 2 or not np.all(np.isfinite(f)) or not np.all(f > 0):
            raise ValueError(f"{self.path}: rope_freqs.weight must hold head_dim/2 = {hd // 2} positive finite "
                             f"factors, got {f.size} values")
        return [float(v) for v in f]

    def tensor_names(self) -> list[str]:
        return list(self._names)

    @property
    def is_ternary(self) -> bool:
        return any(t.tensor_type.name in TERNARY_TYPES for t in self.tensors.values())

    def _n_head(self, name: str) -> int | None:
        """Heads to un-permute for Q/K of arch llama, else None."""
        if self.arch != "llama":
            return None
        if name.endswith(("self_attn.q_proj.weight", "self_attn.q_proj.bias")):  # llama.cpp permutes biases too
            return self.config["num_attention_heads"]
        if name.endswith(("self_attn.k_proj.weight", "self_attn.k_proj.bias")):
            return self.config["num_key_value_heads"]
        return None

    def load(self, name: str):
        if name not in self._names:
            raise self._unknown(name)
        if name in self.parts:  # a row slice of a fused tensor (Phi-3)
            fused, start, stop = self.parts[name]
            w = self._load(fused)
            if not isinstance(w, np.ndarray):  # packed ternary: rows cannot be sliced in place
                w = w.dequantize()
            return np.ascontiguousarray(w[start:stop])
        w = self._load(name)
        if self.arch == "gemma2" and name.endswith("norm.weight"):  # llama.cpp wrote 1 + w
            w = w - np.float32(1.0)
        return w

    def release(self) -> None:
        from lowbit.io.safetensors_file import release_pages

        release_pages(self.reader.data)

    def load_source(self, name: str):
        """F32/F16/BF16 matrices as SourceRows over the mmapped data (Q/K un-permuted by a row index); Q4_0 / Q4_1
        / Q8_0 matrices as Int4Weight / Int8Weight with the file's codes and scales (int4 / int8 keep them exactly,
        other formats dequantize them to the values load() gives)."""
        from lowbit.formats.base import SourceRows

        t = self.tensors.get(name)
        if t is not None and t.tensor_type.name in CODE_TYPES and name not in self.parts and name not in self.scales:
            shape = expected_shape(self.config, name)
            if len(shape) == 2 and shape[1] % 32 == 0:
                from lowbit.formats.int4 import Int4Weight
                from lowbit.formats.int8 import Int8Weight

                n_head = self._n_head(name)
                rows = unpermute_rows(np.arange(shape[0]), n_head) if n_head else None
                where = f"{self.path}: tensor {t.name!r}"
                if t.tensor_type.name == "Q8_0":
                    return Int8Weight.from_gguf_q8_0(t.data, *shape, rows, where=where)
                return Int4Weight.from_gguf_q4(t.tensor_type.name, t.data, *shape, rows, where=where)
        kind = {"F32": "f32", "F16": "f16", "BF16": "bf16"}.get(t.tensor_type.name) if t is not None else None
        shape = expected_shape(self.config, name) if kind else ()
        if (kind is None or len(shape) != 2 or name in self.parts or name in self.scales
                or (self.arch == "gemma2" and name.endswith("norm.weight"))):
            return self.load(name)
        data = np.asarray(t.data)
        data = data.view({"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[kind]).reshape(shape)
        n_head = self._n_head(name)
        rows = unpermute_rows(np.arange(shape[0]), n_head) if n_head else None
        return SourceRows(data, kind, rows)

    def _load(self, name: str):
        from gguf import quants
        t = self.tensors[name]
        shape = expected_shape(self.config, name)
        n_head = self._n_head(name)
        scale = 1.0
        if name in self.scales:
            scale = quants.dequantize(self.scales[name].data, self.scales[name].tensor_type).reshape(-1)
            if scale.size != 1:
                raise ValueError(f"{self.path}: {self.scales[name].name} has {scale.size} values; expected 1")
            scale = float(scale[0])
        m, k = shape if len(shape) == 2 else (1, int(np.prod(shape)))
        rows = unpermute_rows(np.arange(m), n_head) if n_head and len(shape) == 2 else None  # done in the decode
        where = f"{self.path}: tensor {t.name!r}"
        if t.tensor_type.name in TERNARY_TYPES:
            tern, d = gguf_blocks.decode_ternary(t.data, t.tensor_type, m, k, rows, where)
            d = d * np.float32(scale)
            if not np.isfinite(d).all():
                raise ValueError(f"{where} has NaN or Inf block scales")
            row_scales = row_scales_if_uniform(tern, d, QK_K)
            if row_scales is not None:
                return TernaryWeight.from_ternary(tern, row_scales, source=t.tensor_type.name)
            return TernaryWeight.from_ternary(tern, d, group=QK_K, source=t.tensor_type.name)
        w = gguf_blocks.dequantize(t.data, t.tensor_type, m, k, rows, where).reshape(shape)
        if scale != 1.0:
            w = w * np.float32(scale)
        return unpermute_rows(w, n_head) if n_head and len(shape) == 1 else w  # a Q/K bias

    def tokenizer(self):
        from lowbit.io.tokenizer_gguf import tokenizer_from_gguf
        return tokenizer_from_gguf(self)
