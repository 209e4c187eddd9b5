"""The Llama decoder (Llama 2/3 with llama3 RoPE scaling, SmolLM2, Falcon3, MobileLLM), numpy float32.

    embed -> N x [x += attn(rms_norm(x)); x += mlp(rms_norm(x))] -> rms_norm -> lm_head

GQA (num_key_value_heads <= num_attention_heads), optional q/k/v/o and MLP biases, tied embeddings.
Variants set class flags instead of copying this file: BitNet b1.58 (bitnet.py) adds `sub_norms`
(an RMSNorm before o_proj and before down_proj) and uses hidden_act relu2.

Prefill (N tokens: GEMM path) and decode (one token: GEMV path) are separate methods so that their
speeds can be measured apart. Both write K/V into the static cache (kv_cache.py).
"""
from __future__ import annotations

import os
import warnings
from typing import Callable, Mapping

import numpy as np

from lowbit import _native
from lowbit._runtime import single_threaded_blas
from lowbit.formats import Activations, PackedWeight, matmul_many
from lowbit.model.config import ModelArgs
from lowbit.model.kv_cache import KVCache
from lowbit.model.layers import ACTIVATIONS, Embedding, Linear, Rope, as_packed, rms_norm

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
    """One decoder layer. Reads its K/V slice of the static cache: kc, vc: [kv_heads, max_ctx, head_dim]."""

    def __init__(self, model: "Model", i: int, get: Callable[[str], object]):
        a = model.args
        p = f"model.layers.{i}."
        self.n_heads, self.n_kv, self.hd = a.num_attention_heads, a.num_key_value_heads, a.head_dim
        self.group = self.n_heads // self.n_kv
        self.eps = a.rms_norm_eps
        self.rope = model.rope
        self.scale = np.float32(1.0 / np.sqrt(self.hd))
        self.act = model.act
        lin = model.linear
        self.ln1 = model.norm_weight(get(p + "input_layernorm.weight"))  # [hidden]
        self.ln2 = model.norm_weight(get(p + "post_attention_layernorm.weight"))  # [hidden]
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
            self.attn_sub = model.norm_weight(get(p + "self_attn.attn_sub_norm.weight"))  # [heads*hd]
            self.ffn_sub = model.norm_weight(get(p + "mlp.ffn_sub_norm.weight"))  # [inter]
        self.kc = model.cache.k[i]  # [kv_heads, max_ctx, hd], a view of the static cache
        self.vc = model.cache.v[i]

    def _mlp(self, x: np.ndarray) -> np.ndarray:
        """x: [n, hidden] (residual stream, updated in place)."""
        g, u = project(self.gate_up, rms_norm(x, self.ln2, self.eps))  # [n, inter] each
        g = self.act(g)
        g *= u
        if self.ffn_sub is not None:
            g = rms_norm(g, self.ffn_sub, self.eps)
        x += self.down(g)
        return x

    def _qkv(self, x: np.ndarray, pos: int):
        """x: [n, hidden] -> q [n, heads, hd] (scaled by 1/sqrt(hd)), k, v [n, kv_heads, hd], RoPE applied."""
        n = x.shape[0]
        q, k, v = project(self.qkv, rms_norm(x, self.ln1, self.eps))
        q = q.reshape(n, self.n_heads, self.hd)
        k = k.reshape(n, self.n_kv, self.hd)
        v = v.reshape(n, self.n_kv, self.hd)
        qk = self.rope.apply(np.concatenate((q, k), axis=1), *self.rope.tables(pos, n))  # [n, heads+kv, hd]
        q = qk[:, :self.n_heads]
        q *= self.scale
        return q, qk[:, self.n_heads:], v

    def _out(self, x: np.ndarray, o: np.ndarray) -> np.ndarray:
        """o: [n, heads*hd] attention output -> x += o_proj(o)."""
        if self.attn_sub is not None:
            o = rms_norm(o, self.attn_sub, self.eps)
        x += self.o(o)
        return x

    def _kv(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The filled cache, float32 [kv_heads, t, hd] each (a float16 cache is widened once: numpy's
        matmul on mixed dtypes would not use BLAS)."""
        kc, vc = self.kc[:, :t], self.vc[:, :t]
        if kc.dtype != np.float32:
            kc, vc = kc.astype(np.float32), vc.astype(np.float32)
        return kc, vc

    def decode(self, x: np.ndarray, pos: int) -> np.ndarray:
        """x: [1, hidden] at position pos -> [1, hidden]; writes K/V at pos."""
        q, k, v = self._qkv(x, pos)
        self.kc[:, pos] = k[0]
        self.vc[:, pos] = v[0]
        t = pos + 1
        qg = q.reshape(self.n_kv, self.group, self.hd)  # [kv, g, hd]
        kc, vc = self._kv(t)
        s = np.matmul(qg, kc.transpose(0, 2, 1))  # [kv, g, t]
        o = np.matmul(_softmax_(s), vc)  # [kv, g, hd]
        x = self._out(x, o.reshape(1, self.n_heads * self.hd))
        return self._mlp(x)

    def _qkv_cached(self, x: np.ndarray, pos: int) -> np.ndarray:
        """Projects x: [n, hidden] at positions pos..pos+n-1, writes K/V into the cache -> q [n, heads, hd]."""
        n = x.shape[0]
        q, k, v = self._qkv(x, pos)
        self.kc[:, pos:pos + n] = k.transpose(1, 0, 2)
        self.vc[:, pos:pos + n] = v.transpose(1, 0, 2)
        return q

    def prefill(self, x: np.ndarray, pos: int) -> np.ndarray:
        """x: [n, hidden] at positions pos..pos+n-1 -> [n, hidden] (causal over the cache and the new rows)."""
        n = x.shape[0]
        q = self._qkv_cached(x, pos)
        o = np.empty((n, self.n_heads * self.hd), np.float32)  # causal attention, heads x tokens on the pool
        kc, vc = (self.kc, self.vc) if self.kc.dtype == np.float32 else (self.kc.view(np.uint16), self.vc.view(np.uint16))
        _native.attention_prefill(np.ascontiguousarray(q), kc, vc, pos, o)
        x = self._out(x, o)
        return self._mlp(x)

    def prefill_numpy(self, x: np.ndarray, pos: int) -> np.ndarray:
        """prefill() with the attention in numpy: the reference the native attention is tested against."""
        n = x.shape[0]
        q = self._qkv_cached(x, pos)
        t = pos + n
        mask = np.triu(np.full((n, t), -np.inf, np.float32), k=pos + 1)  # [n, t]: causal
        qg = q.reshape(n, self.n_kv, self.group, self.hd).transpose(1, 2, 0, 3)  # [kv, g, n, hd]
        kc, vc = self._kv(t)
        s = np.matmul(qg, kc[:, None].transpose(0, 1, 3, 2))  # [kv, g, n, t]
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

    def __init__(self, args: ModelArgs, weights: Mapping[str, object], tokenizer=None,
                 max_context: int | None = None, format: str | None = None, native_decode: bool | None = None,
                 **quant_options):
        self.args = args
        self.tokenizer = tokenizer
        self._format, self._qopts = format, quant_options
        if args.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {args.hidden_act!r} is not supported ({', '.join(ACTIVATIONS)})")
        self.act = ACTIVATIONS[args.hidden_act]
        weights = self.sanitize(dict(weights))
        self._weights = weights
        self.max_context = int(max_context or min(args.max_position_embeddings, DEFAULT_MAX_CONTEXT))
        # float16 K/V for quantized models (half the bytes attention reads); float32 on the f32 reference path
        q0 = weights.get("model.layers.0.self_attn.q_proj.weight")
        q_format = q0.format if isinstance(q0, PackedWeight) else (format or "f32")
        kv_dtype = np.float32 if q_format == "f32" else np.float16
        self.cache = KVCache(args.num_hidden_layers, args.num_key_value_heads, args.head_dim, self.max_context,
                             kv_dtype)
        self.rope = Rope(args.head_dim, self.max_context, args.rope_theta, args.rope_scaling, args.rope_freq_factors)
        self.embed = Embedding(self._get("model.embed_tokens.weight"))  # [vocab, hidden]
        self.layers = [Block(self, i, self._get) for i in range(args.num_hidden_layers)]
        self.norm = self.norm_weight(self._get("model.norm.weight"))  # [hidden]
        self.tied = "lm_head.weight" not in weights
        if not self.tied:
            self.lm_head = self.linear("lm_head")  # [vocab, hidden]
        elif args.tie_word_embeddings:
            self.lm_head = self.embed.as_linear()  # shares the table's memory
        else:
            raise KeyError("lm_head.weight is missing and the config does not tie word embeddings")
        del self._weights  # the layers hold what they need
        # native_decode: run decode() as one C++ call (built on first use); LOWBIT_NATIVE_DECODE=0 turns it off
        self.native_decode = native_decode if native_decode is not None else os.environ.get("LOWBIT_NATIVE_DECODE", "1") != "0"
        self._native = None

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def from_weights(cls, config: dict | ModelArgs, weights: Mapping[str, object], tokenizer=None,
                     max_context: int | None = None, format: str | None = None, native_decode: bool | None = None,
                     **quant_options) -> "Model":
        """Builds the architecture named by config["model_type"] from in-memory weights.

        weights: HF name -> PackedWeight | float array; format: quantize float linears to it (default f32);
        native_decode: decode through the C++ step (default on unless LOWBIT_NATIVE_DECODE=0).
        """
        from lowbit.model import get_model_class

        args = config if isinstance(config, ModelArgs) else ModelArgs.from_config(config)
        return get_model_class(args.model_type)(args, weights, tokenizer=tokenizer, max_context=max_context,
                                                format=format, native_decode=native_decode, **quant_options)

    @classmethod
    def sanitize(cls, weights: dict) -> dict:
        """Renames/drops checkpoint tensors before use (HF's rotary inv_freq buffers are dropped)."""
        return {k: v for k, v in weights.items() if not k.endswith("rotary_emb.inv_freq")}

    def _get(self, name: str):
        try:
            return self._weights[name]
        except KeyError:
            raise KeyError(f"weight {name!r} is missing from the checkpoint") from None

    def linear(self, prefix: str) -> Linear:
        w = as_packed(self._get(prefix + ".weight"), self._format, **self._qopts)
        b = self._weights.get(prefix + ".bias")
        return Linear(w, None if b is None else self.norm_weight(b))

    @staticmethod
    def norm_weight(w) -> np.ndarray:
        if isinstance(w, PackedWeight):
            w = w.dequantize()
        return np.ascontiguousarray(np.asarray(w, np.float32).reshape(-1))

    # ---- running ---------------------------------------------------------------------------
    def reset(self) -> None:
        """Empties the KV cache (it stays allocated)."""
        self.cache.reset()

    def prefill(self, ids, all_logits: bool = False, chunk: int = PREFILL_CHUNK) -> np.ndarray:
        """Runs ids after the cached positions (GEMM path, `chunk` tokens at a time).

        ids: int [n] -> float32 logits [vocab] of the last token, or [n, vocab] if all_logits.
        """
        ids = [int(i) for i in ids]
        n = len(ids)
        if n == 0:
            raise ValueError("prefill needs at least one token")
        self.cache.check_room(n)
        outs = []
        with single_threaded_blas():  # numpy's attention matmuls must not fight lowbit's pool for the cores
            for s in range(0, n, chunk):
                part = ids[s:s + chunk]
                h = self._forward(part)  # [m, hidden], final-normed
                if all_logits:
                    outs.append(self.lm_head(h))
                elif s + chunk >= n:
                    outs.append(self.lm_head(h[-1:])[0])
        return np.concatenate(outs, axis=0) if all_logits else outs[-1]

    def _forward(self, ids: list[int]) -> np.ndarray:
        """ids: [m] at positions length.. -> normed hidden [m, hidden]; appends to the cache."""
        c = self.cache
        pos, m = c.length, len(ids)
        x = self.embed(ids)  # [m, hidden]
        for blk in self.layers:
            x = blk.prefill(x, pos)
        c.length += m
        c.tokens.extend(ids)
        return rms_norm(x, self.norm, self.args.rms_norm_eps)

    def decode(self, token: int) -> np.ndarray:
        """One token at the next position (GEMV path) -> float32 logits [vocab].

        Runs the native decode step (model/native.py: the whole stack in one C++ call) when every weight
        format has one and `native_decode` is on; else the numpy reference, decode_python.
        """
        c = self.cache
        pos = c.length
        if pos >= c.max_ctx:
            c.check_room(1)
        nat = self._native_decoder()
        if nat is None:
            return self.decode_python(token)
        logits = nat.decode(self.embed([token])[0], pos)  # embedding [hidden] -> [vocab]
        c.length = pos + 1
        c.tokens.append(int(token))
        return logits

    def decode_python(self, token: int) -> np.ndarray:
        """decode() in numpy around the matmul kernels: the reference for the native step."""
        c = self.cache
        pos = c.length
        c.check_room(1)
        x = self.embed([token])  # [1, hidden]
        for blk in self.layers:
            x = blk.decode(x, pos)
        c.length = pos + 1
        c.tokens.append(int(token))
        return self.lm_head(rms_norm(x, self.norm, self.args.rms_norm_eps))[0]

    def _native_decoder(self):
        if not self.native_decode:
            return None
        if self._native is None:
            from lowbit.model.native import NativeDecoder

            self._native = NativeDecoder.build(self) or False
            if self._native is False:
                warnings.warn("a weight format has no native decode step: decoding in numpy (slower)", stacklevel=3)
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
            n += sum(getattr(blk, a).size for a in ("attn_sub", "ffn_sub") if getattr(blk, a) is not None)
            for lin in (blk.q, blk.k, blk.v, blk.o, blk.gate, blk.up, blk.down):
                m, k = lin.shape
                n += m * k + (0 if lin.bias is None else lin.bias.size)
        if not (self.tied or self.args.tie_word_embeddings):
            m, k = self.lm_head.shape
            n += m * k
        return n
