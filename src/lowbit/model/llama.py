"""The Llama decoder (Llama 2/3 with llama3 RoPE scaling, SmolLM2, Falcon3, MobileLLM), numpy float32.

    embed -> N x [x += attn(rms_norm(x)); x += mlp(rms_norm(x))] -> rms_norm -> lm_head

GQA (num_key_value_heads <= num_attention_heads), optional q/k/v/o and MLP biases, tied embeddings.
Variants set class flags instead of copying this file: BitNet b1.58 (bitnet.py) adds `sub_norms`
(an RMSNorm before o_proj and before down_proj) and uses hidden_act relu2.

The runtime runs the whole stack natively (model/native.py: kernels/decoder.cpp): prefill of N tokens in
chunks (GEMMs over the chunk's rows) and decode of one token (GEMVs) are two entry points over one C++ step.
The numpy `Block.forward` below is its reference (prefill_python / decode_python: the oracle the tests
compare against, and the fallback when a format or activation has no native path, with a warning).
Both write K/V into the static cache (kv_cache.py).
"""
from __future__ import annotations

import os
import warnings
from typing import Callable, Mapping

import numpy as np

from lowbit._runtime import single_threaded_blas
from lowbit.formats import Activations, PackedWeight, matmul_many
from lowbit.model.config import WINDOW_KEYS, ModelArgs, check_supported, layer_types, sliding_window_active
from lowbit.model.kv_cache import KVCache, kv_dtype, kv_read, kv_write
from lowbit.model.layers import ACTIVATIONS, Embedding, Linear, Rope, as_packed, rms_norm, soft_cap_, token_ids

DEFAULT_MAX_CONTEXT = 8192  # cap on the cache when neither the config nor the user asks for less
PREFILL_CHUNK = 512  # prompt tokens per prefill step: bounds the [heads, n, ctx] score buffers


def _softmax_(s: np.ndarray) -> np.ndarray:
    """In-place softmax over the last axis. s: float32 [..., T]."""
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    return s


def project(lins: tuple[Linear, ...], x: np.ndarray) -> list[np.ndarray]:
    """[lin(x) for lin in lins] for projections reading the same x: [n, in]; the input is quantized once
    and, for integer formats, all of them run in one native call (one thread fork/join)."""
    ys = matmul_many([lin.weight for lin in lins], Activations(x))
    for y, lin in zip(ys, lins):
        if lin.bias is not None:
            y += lin.bias
    return ys


class Block:
    """One decoder layer. Reads its K/V slice of the cache: kc, vc: [kv_heads, capacity, head_dim]."""

    def __init__(self, model: "Model", i: int, get: Callable[[str], object]):
        a = model.args
        p = f"model.layers.{i}."
        self.n_heads, self.n_kv, self.hd = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        self.group = self.n_heads // self.n_kv
        self.eps = a.rms_norm_eps
        self.rope = model.rope
        self.scale = np.float32(model.attn_scale)  # 1/sqrt(head_dim) unless the family says otherwise
        self.softcap = model.attn_softcap  # None, or c: scores -> c * tanh(scores / c) (Gemma 2)
        self.window = model.layer_window(i)  # None, or attend to the last `window` positions (self included)
        self.act = model.act
        lin = model.linear
        norms = model.norm_names  # role -> tensor name: ln1, ln2 (pre-attention, pre-MLP), post_attn, post_ffn
        self.ln1 = model.rms_weight(get(p + norms["ln1"] + ".weight"))  # [hidden]
        self.ln2 = model.rms_weight(get(p + norms["ln2"] + ".weight"))  # [hidden]
        self.post_attn = self.post_ffn = None  # Gemma 2: RMSNorm on the attention / MLP output before the residual add
        if "post_attn" in norms:
            self.post_attn = model.rms_weight(get(p + norms["post_attn"] + ".weight"))  # [hidden]
            self.post_ffn = model.rms_weight(get(p + norms["post_ffn"] + ".weight"))  # [hidden]
        self.q_norm = self.k_norm = None  # Qwen 3: RMSNorm over each head's q and k before RoPE
        if model.qk_norm:
            self.q_norm = model.rms_weight(get(p + "self_attn.q_norm.weight"))  # [hd]
            self.k_norm = model.rms_weight(get(p + "self_attn.k_norm.weight"))  # [hd]
        self.q = lin(p + "self_attn.q_proj")  # [heads*hd, hidden]
        self.k = lin(p + "self_attn.k_proj")  # [kv_heads*hd, hidden]
        self.v = lin(p + "self_attn.v_proj")  # [kv_heads*hd, hidden]
        self.o = lin(p + "self_attn.o_proj")  # [hidden, heads*hd]
        self.gate = lin(p + "mlp.gate_proj")  # [inter, hidden]
        self.up = lin(p + "mlp.up_proj")  # [inter, hidden]
        self.down = lin(p + "mlp.down_proj")  # [hidden, inter]
        self.qkv = (self.q, self.k, self.v)  # read one input: one native call, one int8 quantization
        self.gate_up = (self.gate, self.up)
        self.attn_sub = self.ffn_sub = None
        if model.sub_norms:
            self.attn_sub = model.rms_weight(get(p + "self_attn.attn_sub_norm.weight"))  # [heads*hd]
            self.ffn_sub = model.rms_weight(get(p + "mlp.ffn_sub_norm.weight"))  # [inter]
        self.kc = model.cache.k[i]  # [kv_heads, capacity, hd], a view of the cache (taken again when it grows)
        self.vc = model.cache.v[i]

    def _mlp(self, x: np.ndarray) -> np.ndarray:
        """x: [n, hidden] (residual stream, updated in place)."""
        g, u = project(self.gate_up, rms_norm(x, self.ln2, self.eps))  # [n, inter] each
        g = self.act(g)
        g *= u
        if self.ffn_sub is not None:
            g = rms_norm(g, self.ffn_sub, self.eps)
        y = self.down(g)
        x += y if self.post_ffn is None else rms_norm(y, self.post_ffn, self.eps)
        return x

    def _qkv(self, x: np.ndarray, pos: int):
        """x: [n, hidden] -> q [n, heads, hd] (scaled by 1/sqrt(hd)), k, v [n, kv_heads, hd], RoPE applied."""
        n = x.shape[0]
        q, k, v = project(self.qkv, rms_norm(x, self.ln1, self.eps))
        q = q.reshape(n, self.n_heads, self.hd)
        k = k.reshape(n, self.n_kv, self.hd)
        v = v.reshape(n, self.n_kv, self.hd)
        if self.q_norm is not None:
            q = rms_norm(q.reshape(-1, self.hd), self.q_norm, self.eps).reshape(n, self.n_heads, self.hd)
            k = rms_norm(k.reshape(-1, self.hd), self.k_norm, self.eps).reshape(n, self.n_kv, self.hd)
        qk = self.rope.apply(np.concatenate((q, k), axis=1), *self.rope.tables(pos, n))  # [n, heads+kv, hd]
        q = qk[:, :self.n_heads]
        q *= self.scale
        return q, qk[:, self.n_heads:], v

    def _out(self, x: np.ndarray, o: np.ndarray) -> np.ndarray:
        """o: [n, heads*hd] attention output -> x += o_proj(o)."""
        if self.attn_sub is not None:
            o = rms_norm(o, self.attn_sub, self.eps)
        y = self.o(o)
        x += y if self.post_attn is None else rms_norm(y, self.post_attn, self.eps)
        return x

    def _cap_(self, s: np.ndarray) -> np.ndarray:
        """Attention logit soft-capping in place (Gemma 2): s -> c * tanh(s / c)."""
        return soft_cap_(s, self.softcap)

    def _kv(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The filled cache, float32 [kv_heads, t, hd] each (a float16 or int8 cache is widened once: numpy's
        matmul on mixed dtypes would not use BLAS)."""
        return kv_read(self.kc, 0, t), kv_read(self.vc, 0, t)

    def forward(self, x: np.ndarray, pos: int) -> np.ndarray:
        """The numpy reference of the block. x: [n, hidden] at positions pos..pos+n-1 -> [n, hidden] (causal
        over the cache and the new rows, within the sliding window if any); writes K/V at those positions."""
        n = x.shape[0]
        q, k, v = self._qkv(x, pos)
        kv_write(self.kc, pos, k.transpose(1, 0, 2))
        kv_write(self.vc, pos, v.transpose(1, 0, 2))
        t = pos + n
        mask = np.triu(np.full((n, t), -np.inf, np.float32), k=pos + 1)  # [n, t]: causal
        if self.window is not None:  # query pos+i sees keys j with pos+i - j < window
            mask += np.tril(np.full((n, t), -np.inf, np.float32), k=pos - self.window)
        qg = q.reshape(n, self.n_kv, self.group, self.hd).transpose(1, 2, 0, 3)  # [kv, g, n, hd]
        kc, vc = self._kv(t)
        s = self._cap_(np.matmul(qg, kc[:, None].transpose(0, 1, 3, 2)))  # [kv, g, n, t]
        s += mask
        o = np.matmul(_softmax_(s), vc[:, None])  # [kv, g, n, hd]
        x = self._out(x, o.transpose(2, 0, 1, 3).reshape(n, self.n_heads * self.hd))
        return self._mlp(x)


class Model:
    """A decoder-only LM with its static KV cache.

    Build with `Model.from_weights(config, weights)` (weights: HF tensor name -> PackedWeight or
    float array; float linears become f32, or `format` if given) or through `lowbit.load`.
    """

    sub_norms = False  # BitNet: RMSNorm before o_proj and before down_proj
    qk_norm = False  # Qwen 3: per-head RMSNorm on q and k
    norm_names = {"ln1": "input_layernorm", "ln2": "post_attention_layernorm"}  # per-layer norms by role
    # what this architecture implements, checked against the config by config.check_supported (the one list)
    features = frozenset({"attention_bias", "mlp_bias"})
    rope_types = ("default", "linear", "llama3")
    # transformers' defaults for keys a config.json may leave out (config.with_defaults), where they change the math
    config_defaults = {"rms_norm_eps": 1e-6}
    # the config keys transformers reads for a sliding window (config.WINDOW_KEYS; all of them where, as here, the
    # architecture has none: check_supported refuses whichever asks for one)
    window_keys = WINDOW_KEYS
    embed_scale: float | None = None  # Gemma 2: embeddings times sqrt(hidden)
    final_softcap: float | None = None  # Gemma 2: logits -> c * tanh(logits / c)
    attn_softcap: float | None = None

    def __init__(self, args: ModelArgs, weights: Mapping[str, object], tokenizer=None,
                 max_context: int | None = None, format: str | None = None, native_decode: bool | None = None,
                 kv_cache: str | None = None, **quant_options):
        self.args = args
        check_supported({**args.extra, "model_type": args.model_type}, "config")
        self.tokenizer = tokenizer
        self._format, self._qopts = format, quant_options
        self.attn_scale = self.attention_scale()  # q is multiplied by it before q.k
        if args.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {args.hidden_act!r} is not supported ({', '.join(ACTIVATIONS)})")
        self.act = ACTIVATIONS[args.hidden_act]
        weights = self.sanitize(dict(weights))
        self._weights = weights
        self._used: set[str] = set()
        self._expected = set(self.tensor_shapes(args))  # what this architecture and config read
        if max_context is not None and int(max_context) < 1:
            raise ValueError(f"max_context must be >= 1, got {max_context}")
        self.max_context = int(max_context or min(args.max_position_embeddings, DEFAULT_MAX_CONTEXT))
        if self.max_context > args.max_position_embeddings:  # as llama.cpp's "n_ctx > n_ctx_train" warning
            warnings.warn(f"max_context {self.max_context} is past the {args.max_position_embeddings} positions the "
                          f"model was trained on (max_position_embeddings): expect worse output beyond them",
                          stacklevel=2)
        # float16 K/V for quantized models (half the bytes attention reads); float32 on the f32 reference path
        q0 = weights.get("model.layers.0.self_attn.q_proj.weight")
        q_format = q0.format if isinstance(q0, PackedWeight) else (format or "f32")
        self._new_cache(kv_cache or ("f32" if q_format == "f32" else "f16"))
        self.rope = self.make_rope()
        self.embed = Embedding(self._get("model.embed_tokens.weight"))  # [vocab, hidden]
        self.layers = [Block(self, i, self._get) for i in range(args.num_hidden_layers)]
        self.norm = self.rms_weight(self._get("model.norm.weight"))  # [hidden]
        self.tied = "lm_head.weight" not in weights
        if not self.tied:
            self.lm_head = self.linear("lm_head")  # [vocab, hidden]
        elif args.tie_word_embeddings:
            self.lm_head = self.embed.as_linear()  # shares the table's memory
        else:
            raise KeyError("lm_head.weight is missing and the config does not tie word embeddings")
        unused = sorted(set(weights) - self._used - ({"lm_head.weight"} if self.tied else set()))
        if unused:  # never drop a tensor silently (a bias, a norm the architecture does not have)
            raise ValueError(f"model_type {args.model_type!r} does not use {len(unused)} of the given tensors, "
                             f"e.g. {unused[:3]}")
        del self._weights  # the layers hold what they need
        # native_decode: run prefill() and decode() natively (built on first use); LOWBIT_NATIVE_DECODE=0 turns it off
        self.native_decode = native_decode if native_decode is not None else os.environ.get("LOWBIT_NATIVE_DECODE", "1") != "0"
        self._native = None

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_weights(cls, config: dict | ModelArgs, weights: Mapping[str, object], tokenizer=None,
                     max_context: int | None = None, format: str | None = None, native_decode: bool | None = None,
                     kv_cache: str | None = None, **quant_options) -> "Model":
        """Builds the architecture named by config["model_type"] from in-memory weights.

        weights: HF name -> PackedWeight | float array; format: quantize float linears to it (default f32);
        native_decode: prefill and decode through the C++ step (default on unless LOWBIT_NATIVE_DECODE=0);
        kv_cache: "f32", "f16" or "int8" (default: f32 for an f32 model, else f16).
        """
        from lowbit.model import get_model_class

        if not isinstance(config, ModelArgs):
            check_supported(config, "config")  # before ModelArgs, which cannot hold some of what it refuses
        args = config if isinstance(config, ModelArgs) else ModelArgs.from_config(config)
        return get_model_class(args.model_type)(args, weights, tokenizer=tokenizer, max_context=max_context,
                                                format=format, native_decode=native_decode, kv_cache=kv_cache,
                                                **quant_options)

    def attention_scale(self) -> float:
        return 1.0 / float(np.sqrt(self.args.head_dim))

    def make_rope(self) -> Rope:
        a = self.args
        return Rope(a.head_dim, self.max_context, a.rope_theta, a.rope_scaling, a.rope_freq_factors)

    def layer_window(self, i: int) -> int | None:
        """Layer i's sliding window (it attends to the last `window` positions), or None for full attention.

        A window at least as long as the context this model runs changes nothing and is dropped."""
        cfg = self.args.extra
        if not sliding_window_active(cfg, self.window_keys):
            return None
        types = layer_types(cfg, self.window_keys) or self.default_layer_types()
        if types[i] != "sliding_attention":
            return None
        w = int(cfg["sliding_window"])
        return w if w < self.max_context else None

    def default_layer_types(self) -> list[str]:
        """Layer kinds when the config has no layer_types (transformers 4 configs): every layer sliding."""
        return ["sliding_attention"] * self.args.num_hidden_layers

    @classmethod
    def attn_biases(cls, a: ModelArgs) -> tuple[str, ...]:
        """The attention projections that carry a bias."""
        return ("q_proj", "k_proj", "v_proj", "o_proj") if a.attention_bias else ()

    @classmethod
    def layer_shapes(cls, a: ModelArgs) -> dict[str, tuple[int, ...]]:
        """Tensor name inside a decoder layer -> shape, in checkpoint order (the one description of a layer)."""
        d, f, hd = a.hidden_size, a.intermediate_size, a.head_dim
        qd, kvd = a.num_attention_heads * hd, a.num_key_value_heads * hd
        rows = {"q_proj": qd, "k_proj": kvd, "v_proj": kvd, "o_proj": d, "gate_proj": f, "up_proj": f, "down_proj": d}
        s: dict[str, tuple[int, ...]] = {cls.norm_names["ln1"] + ".weight": (d,)}
        s.update({"self_attn.q_proj.weight": (qd, d), "self_attn.k_proj.weight": (kvd, d),
                  "self_attn.v_proj.weight": (kvd, d), "self_attn.o_proj.weight": (d, qd)})
        s.update({f"self_attn.{n}.bias": (rows[n],) for n in cls.attn_biases(a)})
        if cls.qk_norm:
            s.update({"self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,)})
        if cls.sub_norms:
            s["self_attn.attn_sub_norm.weight"] = (qd,)
        for role in ("post_attn", "ln2", "post_ffn"):
            if role in cls.norm_names:
                s[cls.norm_names[role] + ".weight"] = (d,)
        s.update({"mlp.gate_proj.weight": (f, d), "mlp.up_proj.weight": (f, d), "mlp.down_proj.weight": (d, f)})
        if a.mlp_bias:
            s.update({f"mlp.{n}.bias": (rows[n],) for n in ("gate_proj", "up_proj", "down_proj")})
        if cls.sub_norms:
            s["mlp.ffn_sub_norm.weight"] = (f,)
        return s

    @classmethod
    def tensor_shapes(cls, a: ModelArgs) -> dict[str, tuple[int, ...]]:
        """Every tensor of the model (HF names) -> shape, in checkpoint order; lm_head only when untied."""
        out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (a.vocab_size, a.hidden_size)}
        layer = cls.layer_shapes(a)
        for i in range(a.num_hidden_layers):
            out.update({f"model.layers.{i}.{k}": v for k, v in layer.items()})
        out["model.norm.weight"] = (a.hidden_size,)
        if not a.tie_word_embeddings:
            out["lm_head.weight"] = (a.vocab_size, a.hidden_size)
        return out

    @classmethod
    def sanitize(cls, weights: dict) -> dict:
        """Renames/drops checkpoint tensors before use (HF's rotary inv_freq buffers are dropped)."""
        return {k: v for k, v in weights.items() if not k.endswith("rotary_emb.inv_freq")}

    def _get(self, name: str):
        self._used.add(name)
        try:
            return self._weights[name]
        except KeyError:
            raise KeyError(f"weight {name!r} is missing from the checkpoint") from None

    def linear(self, prefix: str) -> Linear:
        w = as_packed(self._get(prefix + ".weight"), self._format, **self._qopts)
        b = self._get(prefix + ".bias") if prefix + ".bias" in self._expected else None
        return Linear(w, None if b is None else self.norm_weight(b))

    @staticmethod
    def norm_weight(w) -> np.ndarray:
        """A norm weight or bias as float32 [n]."""
        if isinstance(w, PackedWeight):
            w = w.dequantize()
        return np.ascontiguousarray(np.asarray(w, np.float32).reshape(-1))

    def rms_weight(self, w) -> np.ndarray:
        """An RMSNorm's multiplier as the runtime applies it (Gemma 2 overrides: 1 + w)."""
        return self.norm_weight(w)

    def embed_ids(self, ids) -> np.ndarray:
        """ids: int [n] -> float32 [n, hidden], scaled where the family scales embeddings."""
        x = self.embed(ids)
        if self.embed_scale is not None:
            x *= np.float32(self.embed_scale)
        return x

    def cap_logits(self, logits: np.ndarray) -> np.ndarray:
        """Final logit soft-capping in place where the family has it: logits -> c * tanh(logits / c)."""
        return soft_cap_(logits, self.final_softcap)

    # ---- running ---------------------------------------------------------------------------
    def reset(self) -> None:
        """Empties the KV cache (it stays allocated)."""
        self.cache.reset()

    def _new_cache(self, kind: str) -> None:
        a = self.args
        self.cache = KVCache(a.num_hidden_layers, a.num_key_value_heads, a.head_dim, self.max_context, kv_dtype(kind))
        self.kv_cache = kind

    def set_kv_cache(self, kind: str) -> None:
        """Re-allocates the KV cache as `kind` ("f32", "f16" or "int8"), empty; the native step is rebuilt on
        its next use. int8 keeps each row's values and its scale (kv_cache.py): half of float16's bytes."""
        self._new_cache(kind)
        self._cache_replaced()

    def _cache_replaced(self) -> None:
        """The layers' views of the cache taken again; the native step rebuilt on its next use."""
        for i, blk in enumerate(self.layers):
            blk.kc, blk.vc = self.cache.k[i], self.cache.v[i]
        self._native = None

    def _room(self, n_new: int) -> None:
        """Checks that n_new more positions fit the context, and grows the cache to hold them."""
        self.cache.check_room(n_new)
        self.reserve(self.cache.length + n_new)

    def reserve(self, n: int) -> None:
        """Grows the cache now to hold n positions (n <= max_context), so that no later call replaces it (and
        the native step with it) while a caller holds them."""
        if self.cache.grow(n):
            self._cache_replaced()

    def prefill(self, ids, all_logits: bool = False, chunk: int = PREFILL_CHUNK) -> np.ndarray:
        """Runs ids after the cached positions, `chunk` tokens per native forward (GEMMs over the chunk).

        ids: int [n] -> float32 logits [vocab] of the last token, or [n, vocab] if all_logits. Runs the
        numpy reference (prefill_python) only when the model has no native step (a warning says why).
        """
        ids = self._prompt_ids(ids)
        self._room(len(ids))
        nat = self._native_decoder()
        if nat is None:
            return self.prefill_python(ids, all_logits, chunk)
        return self.prefill_native(nat, self.cache, 0, ids, all_logits, chunk)

    def _prompt_ids(self, ids) -> list[int]:
        """Integer ids inside the vocabulary (layers.token_ids: floats and bools are refused), at least one."""
        ids = token_ids(ids, self.embed.shape[0]).tolist()
        if not ids:
            raise ValueError("prefill needs at least one token")
        return ids

    def prefill_native(self, nat, cache, slot: int, ids: list[int], all_logits: bool = False,
                       chunk: int = PREFILL_CHUNK) -> np.ndarray:
        """prefill() through the native step `nat` into `cache` (slot `slot` of a SlotKVCache for batching)."""
        n = len(ids)
        cache.check_room(n)
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        outs = []
        for s in range(0, n, chunk):
            part = ids[s:s + chunk]
            which = "all" if all_logits else ("last" if s + chunk >= n else "none")
            out = nat.forward(self.embed_ids(part), cache.length, which, slot)  # [m, hidden] -> logits or None
            cache.length += len(part)
            cache.tokens.extend(part)
            if out is not None:
                outs.append(self.cap_logits(out))
        return np.concatenate(outs, axis=0) if all_logits else outs[-1][0]

    def prefill_python(self, ids, all_logits: bool = False, chunk: int = PREFILL_CHUNK) -> np.ndarray:
        """prefill() in numpy around the matmul kernels: the reference the native forward is tested against."""
        ids = self._prompt_ids(ids)
        n = len(ids)
        self._room(n)
        c = self.cache
        outs = []
        with single_threaded_blas():  # numpy's attention matmuls must not fight lowbit's pool for the cores
            for s in range(0, n, chunk):
                part = ids[s:s + chunk]
                pos, m = c.length, len(part)
                x = self.embed_ids(part)  # [m, hidden]
                for blk in self.layers:
                    x = blk.forward(x, pos)
                c.length += m
                c.tokens.extend(part)
                h = rms_norm(x, self.norm, self.args.rms_norm_eps)  # [m, hidden]
                if all_logits:
                    outs.append(self.cap_logits(self.lm_head(h)))
                elif s + chunk >= n:
                    outs.append(self.cap_logits(self.lm_head(h[-1:])[0]))
        return np.concatenate(outs, axis=0) if all_logits else outs[-1]

    def decode(self, token: int) -> np.ndarray:
        """One token at the next position (GEMV path) -> float32 logits [vocab].

        Runs the native step (model/native.py: the whole stack in one C++ call) when every weight format
        has one and `native_decode` is on; else the numpy reference, decode_python.
        """
        token = self._token(token)
        c = self.cache
        pos = c.length
        if pos >= c.capacity:
            self._room(1)  # grows c in place
        nat = self._native_decoder()
        if nat is None:
            return self.decode_python(token)
        if nat.has_embedding:
            logits = nat.decode_token(token, pos)  # the embedding row gathered natively -> [vocab]
        else:
            logits = nat.decode(self.embed_ids([token])[0], pos)  # embedding [hidden] -> [vocab]
        logits = self.cap_logits(logits)
        c.length = pos + 1
        c.tokens.append(token)
        return logits

    def _token(self, token) -> int:
        """One id for decode(): an integer inside the vocabulary (as _prompt_ids)."""
        if type(token) is int and 0 <= token < self.embed.shape[0]:  # the sampler's ids: no numpy on the hot path
            return token
        return int(token_ids([token], self.embed.shape[0])[0])

    def decode_python(self, token: int) -> np.ndarray:
        """decode() in numpy around the matmul kernels: the reference for the native step."""
        return self.prefill_python([token])

    def _native_decoder(self):
        if not self.native_decode:
            return None
        if self._native is None:
            from lowbit.model.native import NativeDecoder

            built = NativeDecoder.build(self)
            self._native = built if not isinstance(built, str) else False
            if self._native is False:
                warnings.warn(f"{built}: running the numpy reference (slower)", stacklevel=3)
        return self._native or None

    def logits(self, ids) -> np.ndarray:
        """Teacher-forced logits of a whole sequence from an empty cache: int [n] -> float32 [n, vocab]."""
        self.reset()
        try:
            return self.prefill(ids, all_logits=True)
        finally:
            self.reset()

    # ---- description -----------------------------------------------------------------------
    def linears(self) -> dict[str, Linear]:
        """HF-style name -> Linear, in model order (lm_head last)."""
        names = ("q", "k", "v", "o", "gate", "up", "down")
        full = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
                "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}
        out = {}
        for i, blk in enumerate(self.layers):
            for n in names:
                out[f"model.layers.{i}.{full[n]}"] = getattr(blk, n)
        out["lm_head"] = self.lm_head
        return out

    @property
    def n_params(self) -> int:
        """Parameters, counting tied embeddings once."""
        v, d = self.embed.shape
        n = v * d + self.norm.size
        for blk in self.layers:
            n += blk.ln1.size + blk.ln2.size
            n += sum(getattr(blk, a).size for a in ("attn_sub", "ffn_sub", "post_attn", "post_ffn", "q_norm", "k_norm")
                     if getattr(blk, a) is not None)
            for lin in (blk.q, blk.k, blk.v, blk.o, blk.gate, blk.up, blk.down):
                m, k = lin.shape
                n += m * k + (0 if lin.bias is None else lin.bias.size)
        if not (self.tied or self.args.tie_word_embeddings):
            m, k = self.lm_head.shape
            n += m * k
        return n
