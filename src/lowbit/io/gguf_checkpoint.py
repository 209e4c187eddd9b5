"""GGUF checkpoints (llama.cpp), read with the `gguf` package and mapped to Hugging Face names and config.

Tensors: F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q5_*/Q4_K/Q6_K/... dequantize to float32 with gguf.quants;
TQ1_0/TQ2_0 decode losslessly to ternary t [M, K] + one float16 scale d per (row, 256-block) ->
TernaryWeight(group=256), or one scale per row (group = Kp) when each row's blocks share one d (a TQ2_0
export of a BitNet model, whose F16 export then converts to the very same codes and scales).

llama.cpp's converter permutes the rows of Q and K for its RoPE (arch "llama" only: "bitnet" uses the
NEOX rope and is not permuted). Per head, HF rows [0..hd/2) and [hd/2..hd) are interleaved:
    gguf = hf.reshape(n_head, 2, hd/2, K).swapaxes(1, 2).reshape(M, K)
and we undo it (as transformers' GGUF loader does):
    hf = gguf.reshape(n_head, hd/2, 2, K).swapaxes(1, 2).reshape(M, K)
with n_head = num_attention_heads for Q and num_key_value_heads for K.
"""
from __future__ import annotations

import numpy as np

from lowbit.formats.ternary import TernaryWeight, row_scales_if_uniform
from lowbit.io.checkpoint import LM_HEAD, Checkpoint, canonical_names, check_shape, expected_shape, normalize_config

TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
             "output.weight": LM_HEAD}
BLOCK_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_sub_norm": "self_attn.attn_sub_norm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "ffn_sub_norm": "mlp.ffn_sub_norm",
}
ARCHS = {"llama": "llama", "bitnet": "bitnet"}
TERNARY_TYPES = ("TQ1_0", "TQ2_0")  # an optional blk.N.<name>.scale (one float) multiplies the weight
QK_K = 256


def hf_name(gguf_name: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; None for tensors lowbit does not use."""
    if gguf_name in TOP_NAMES:
        return TOP_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in BLOCK_NAMES:
        return f"model.layers.{int(parts[1])}.{BLOCK_NAMES[parts[2]]}.weight"
    return None


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undoes llama.cpp's Q/K row permutation: [M, ...] -> [M, ...] (see the module docstring)."""
    m = w.shape[0]
    return np.ascontiguousarray(w.reshape(n_head, m // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def field_value(field):
    """A GGUF metadata value as Python (str, int, float, bool, or a list of them)."""
    from gguf import GGUFValueType
    main = field.types[0]
    if main == GGUFValueType.ARRAY and field.types[-1] == GGUFValueType.STRING:
        return [bytes(field.parts[i]).decode("utf-8", "replace") for i in field.data]
    if main == GGUFValueType.STRING:
        return bytes(field.parts[-1]).decode("utf-8", "replace")
    return field.contents()


def decode_ternary(data: np.ndarray, qtype, rows: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """TQ1_0/TQ2_0 blocks uint8 [rows, k/256*bytes] -> (t int8 [rows, k] in {-1,0,1}, d float32 [rows, k/256]).

    Uses the reference dequantizer (x = t * d with d the block's fp16 absmax, stored in the block's last
    two bytes) and divides by d, which is exact since x was computed as (code - 1) * d.
    """
    from gguf import quants
    x = quants.dequantize(data, qtype).reshape(rows, k)
    nb = k // QK_K
    blocks = np.ascontiguousarray(data).reshape(rows, nb, -1)
    d = blocks[:, :, -2:].copy().view(np.float16)[:, :, 0].astype(np.float32)  # [rows, nb]
    dd = np.repeat(d, QK_K, axis=1)
    t = np.divide(x, dd, out=np.zeros_like(x), where=dd != 0)
    t = np.rint(t).astype(np.int8)
    if t.size and (t.min() < -1 or t.max() > 1):
        raise ValueError(f"{qtype.name} block decoded to values outside {{-1, 0, 1}}")
    return t, d


class GGUFCheckpoint(Checkpoint):
    kind = "gguf"

    def __init__(self, path):
        super().__init__(path)
        from gguf import GGUFReader
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such GGUF file")
        try:
            self.reader = GGUFReader(self.path)
        except Exception as e:  # the gguf package raises assorted errors on bad files
            raise ValueError(f"{self.path}: malformed or truncated GGUF file ({type(e).__name__}: {e})") from None
        self.meta = {k: f for k, f in self.reader.fields.items() if not k.startswith("GGUF.")}
        self.tensors = {}
        by_name = {t.name: t for t in self.reader.tensors}
        self.extra = {n: by_name[n] for n in ("rope_freqs.weight",) if n in by_name}  # model-wide, not weights
        for t in self.reader.tensors:
            name = hf_name(t.name)
            if name is not None:
                self.tensors[name] = t
        # optional per-tensor output scales of some BitNet GGUFs: blk.N.attn_q.scale (one float32)
        self.scales = {n: by_name[t.name[:-len("weight")] + "scale"] for n, t in self.tensors.items()
                       if t.name.endswith(".weight") and t.name[:-len("weight")] + "scale" in by_name}
        self.arch = self.get("general.architecture")
        if self.arch not in ARCHS:
            raise ValueError(f"{self.path}: unsupported GGUF architecture {self.arch!r}; lowbit supports {', '.join(ARCHS)}")
        self.config = normalize_config(self._config(), self.path)
        if "rope_freqs.weight" in self.extra:  # Llama 3.1/3.2: llama3 scaling as per-frequency factors
            self.config["rope_freq_factors"] = self._rope_freq_factors(self.extra["rope_freqs.weight"])
        self.sub_norms = any(n.endswith("attn_sub_norm.weight") for n in self.tensors)
        self._names = canonical_names(self.config, self.sub_norms)
        missing = [n for n in self._names if n not in self.tensors]
        if missing:
            raise ValueError(f"{self.path}: GGUF lacks {len(missing)} tensors the metadata implies, e.g. {missing[:3]}")
        for name in self._names:
            t = self.tensors[name]
            shape = tuple(int(s) for s in reversed(t.shape.tolist()))
            check_shape(self.path, name, shape, expected_shape(self.config, name))
            if t.data.nbytes != t.n_bytes:
                raise ValueError(f"{self.path}: tensor {t.name!r} is truncated ({t.data.nbytes} of {t.n_bytes} bytes)")

    def get(self, key: str, default=None):
        f = self.meta.get(key)
        return default if f is None else field_value(f)

    def _config(self) -> dict:
        a = self.arch
        g = lambda k, d=None: self.get(f"{a}.{k}", d)  # noqa: E731
        embd = self.tensors.get("model.embed_tokens.weight")
        vocab = int(embd.shape[1]) if embd is not None else g("vocab_size") or len(self.get("tokenizer.ggml.tokens", []))
        cfg = {
            "model_type": ARCHS[a], "architectures": ["BitNetForCausalLM" if a == "bitnet" else "LlamaForCausalLM"],
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
        kind, factor = g("rope.scaling.type"), g("rope.scaling.factor")
        if kind and kind != "none" and factor and factor != 1.0:
            cfg["rope_scaling"] = {"rope_type": kind, "factor": float(factor)}
            if g("rope.scaling.original_context_length"):
                cfg["rope_scaling"]["original_max_position_embeddings"] = g("rope.scaling.original_context_length")
        return cfg

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
        if name.endswith("self_attn.q_proj.weight"):
            return self.config["num_attention_heads"]
        if name.endswith("self_attn.k_proj.weight"):
            return self.config["num_key_value_heads"]
        return None

    def load(self, name: str):
        if name not in self._names:
            raise self._unknown(name)
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
        if t.tensor_type.name in TERNARY_TYPES:
            tern, d = decode_ternary(t.data, t.tensor_type, *shape)
            if n_head:
                tern, d = unpermute_rows(tern, n_head), unpermute_rows(d, n_head)
            d = d * np.float32(scale)
            rows = row_scales_if_uniform(tern, d, QK_K)
            if rows is not None:
                return TernaryWeight.from_ternary(tern, rows, source=t.tensor_type.name)
            return TernaryWeight.from_ternary(tern, d, group=QK_K, source=t.tensor_type.name)
        try:
            w = quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ValueError(f"{self.path}: tensor {t.name} has GGUF type {t.tensor_type.name}, "
                             "which the gguf package cannot dequantize") from None
        w = np.ascontiguousarray(w, dtype=np.float32).reshape(shape)
        if scale != 1.0:
            w = w * np.float32(scale)
        return unpermute_rows(w, n_head) if n_head else w

    def tokenizer(self):
        from lowbit.io.tokenizer_gguf import tokenizer_from_gguf
        return tokenizer_from_gguf(self)
