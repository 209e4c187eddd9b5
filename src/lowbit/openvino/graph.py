"""OpenVINO graphs of lowbit's decoder, built op by op with the opset API (no tracing), static shapes.

One model per chunk (NITRO's layout):
    embed:   token int64 [1, T]                                   -> x float32 [1, T, hidden]
    layers:  x [1, T, hidden], mask [1, 1, T, S], cos, sin [1, T, 1, hd], pos int64 [T]
                                                                  -> x [1, T, hidden]
             K/V of each layer i are OpenVINO state (ReadValue/Assign) `cache_k_i`, `cache_v_i`:
             float32 [1, kv_heads, S, hd]; the T new rows are written with ScatterUpdate at the slots
             `pos` (an explicit position, not NITRO's slice + concat roll).
    head:    x [1, T, hidden]                                     -> logits float32 [1, T, vocab]
(The layers' output is the Result named `x`; OpenVINO keeps tensor names unique, so its tensor is `x_1`.)
S = max_seq_len + 1 cache slots: the last one is a scratch slot that padding tokens write to (it is
masked for every real token). cos/sin are lowbit's own RoPE tables (C = [cos, cos], S = [-sin, sin]).
Reshapes use 0 ("copy this dim") so a model built for T = 1 can be reshaped to T = P for prefill.

Weights become Constant -> Convert -> Subtract(zero point) -> Multiply(scale) -> Reshape, the
decompression pattern the CPU plugin keeps compressed inside its FullyConnected (u8, u4 and u2 stay
packed; u1 and u3 are folded into float32 at compile time, so 1-bit codes are stored as u2).
"""
from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as op

from lowbit.formats import PackedWeight
from lowbit.formats.floats import BF16Weight, F32Weight
from lowbit.formats.intcodes import IntCodeWeight

# lowbit code width -> the OpenVINO element type its codes are stored in
CODE_TYPES = {8: ov.Type.u8, 4: ov.Type.u4, 2: ov.Type.u2, 1: ov.Type.u2}
FLOAT_WEIGHTS = ("f32", "f16")
INT_WEIGHTS = ("int8", "int4", "int2", "ternary", "binary")
WEIGHT_TYPES = FLOAT_WEIGHTS + INT_WEIGHTS


def _i64(*v) -> ov.Output:
    return op.constant(np.array(v, np.int64)).output(0)


def as_weight(w, weights: str, group_size: int | None = None) -> PackedWeight | np.ndarray:
    """A checkpoint tensor in an export weight type: float32/float16 array, or an IntCodeWeight quantized
    exactly as `lowbit convert` does (a packed source already in that format keeps its codes)."""
    if weights in INT_WEIGHTS:
        from lowbit.io.convert import pack

        return pack(w, weights, group_size)
    if weights not in FLOAT_WEIGHTS:
        raise ValueError(f"unknown OpenVINO weight type {weights!r}; choose one of {', '.join(WEIGHT_TYPES)}")
    if isinstance(w, PackedWeight):
        w = w.w if isinstance(w, F32Weight) else w.dequantize()
    w = np.asarray(w, np.float32)
    return w if weights == "f32" else w.astype(np.float16)


def weight_const(w, name: str) -> ov.Output:
    """A float32 [M, K] weight node from a float array or a PackedWeight (integer codes stay compressed;
    their K is lowbit's padded K, a multiple of 64)."""
    if isinstance(w, IntCodeWeight):
        return _decompressed(w, name)
    if isinstance(w, BF16Weight):
        w = w.dequantize()
    elif isinstance(w, F32Weight):
        w = w.w
    w = np.asarray(w)
    if w.dtype == np.float16:
        c = op.constant(w, name=name)
        return op.convert(c, ov.Type.f32, name=name + "/decompress").output(0)
    return op.constant(np.ascontiguousarray(w, np.float32), name=name).output(0)


def _f16(v: np.ndarray, name: str) -> ov.Output:
    """float [M, G] -> a float16 Constant [M, G, 1]."""
    v = np.ascontiguousarray(np.asarray(v, np.float32).astype(np.float16)[:, :, None])
    return op.constant(v, dtype=ov.Type.f16, name=name).output(0)


def _decompressed(w: IntCodeWeight, name: str) -> ov.Output:
    """w = a * (c - zp) per (row, group): codes u8/u4/u2 [M, G, group], a, zp float16 [M, G, 1]."""
    m, k = w.shape
    g, group = w.ngroups, w.group
    codes = np.zeros((m, g * group), np.uint8)
    codes[:, :k] = w.unpacked_codes()
    a, b = w.affine()  # float32 [M, G] (float16 values)
    if w.offset is None:
        zp = np.full_like(a, np.float32(w.zc))
    else:
        safe = np.where(a == 0, np.float32(1), a)
        zp = np.where(a == 0, np.float32(0), -b / safe)
    c = op.constant(codes.reshape(m, g, group), dtype=CODE_TYPES[w.bits], name=name)
    x = op.convert(c, ov.Type.f16)
    x = op.subtract(x, _f16(zp, name + "/zp"))
    x = op.multiply(x, _f16(a, name + "/scale"))
    x = op.reshape(x, _i64(m, g * group), False)  # [M, Kp]: lowbit pads K to a multiple of 64; linear()
    # pads the input to match (a Slice here would break the pattern and the plugin would fold it to float32)
    return op.convert(x, ov.Type.f32, name=name + "/decompress").output(0)


def linear(x: ov.Output, w, name: str, bias: np.ndarray | None = None) -> ov.Output:
    """x [1, T, K] @ W.T (+ b) -> [1, T, M] (x is zero-padded when the codes cover padded columns)."""
    x = x.output(0) if isinstance(x, ov.Node) else x
    wc = weight_const(w, name)
    extra = int(wc.get_shape()[1]) - int(x.get_shape()[2])
    if extra:
        x = op.pad(x, _i64(0, 0, 0), _i64(0, 0, extra), "constant", op.constant(np.float32(0))).output(0)
    y = op.matmul(x, wc, False, True)
    if bias is not None:
        y = op.add(y, op.constant(np.asarray(bias, np.float32)))
    return y.output(0)


def rms_norm(x: ov.Output, w: np.ndarray, eps: float) -> ov.Output:
    """x / sqrt(mean(x^2, last axis) + eps) * w, in float32."""
    ms = op.reduce_mean(op.multiply(x, x), _i64(-1), True)
    r = op.sqrt(op.add(ms, op.constant(np.float32(eps))))
    return op.multiply(op.divide(x, r), op.constant(np.asarray(w, np.float32))).output(0)


def rope(x: ov.Output, cos: ov.Output, sin: ov.Output, hd: int) -> ov.Output:
    """x [1, T, heads, hd] -> x*C + swap_halves(x)*S (lowbit's Rope.apply)."""
    halves = op.variadic_split(x, _i64(3), _i64(hd // 2, hd - hd // 2))
    swapped = op.concat([halves.output(1), halves.output(0)], 3)
    return op.add(op.multiply(x, cos), op.multiply(swapped, sin)).output(0)


def silu(x: ov.Output) -> ov.Output:
    return op.multiply(x, op.sigmoid(x)).output(0)


def relu2(x: ov.Output) -> ov.Output:
    r = op.relu(x)
    return op.multiply(r, r).output(0)


ACTIVATIONS = {"silu": silu, "swish": silu, "relu2": relu2}


def cache_update(var: str, new: ov.Output, pos: ov.Output, slots: int, sinks: list) -> ov.Output:
    """The cache state `var` [1, heads, S, hd] with rows pos[j] <- new[:, :, j] (new: [1, heads, T, hd]);
    returns the updated cache and appends its Assign to `sinks`. A ScatterUpdate at explicit slots, not
    NITRO's roll (slice + concat): the position is an input, so truncating the cache is free."""
    new = new.output(0) if isinstance(new, ov.Node) else new
    heads, hd = int(new.get_shape()[1]), int(new.get_shape()[3])
    init = op.constant(np.zeros((1, heads, slots, hd), np.float32))
    old = op.read_value(init, var, np.float32, [1, heads, slots, hd], name=var)
    cur = op.scatter_update(old, pos, new, _i64(2))
    sinks.append(op.assign(cur, var, name=var + "/assign"))
    return cur.output(0)


class LayerInputs:
    """The Parameters every decoder chunk reads (shared by its layers)."""

    def __init__(self, hidden: int, hd: int, slots: int, tokens: int = 1):
        t, s = tokens, slots
        self.x = op.parameter([1, t, hidden], np.float32, name="x")
        self.mask = op.parameter([1, 1, t, s], np.float32, name="mask")  # 0 = attend, -inf = not
        self.cos = op.parameter([1, t, 1, hd], np.float32, name="cos")
        self.sin = op.parameter([1, t, 1, hd], np.float32, name="sin")
        self.pos = op.parameter([t], np.int64, name="pos")  # the cache slot each token writes
        self.mask5 = op.unsqueeze(self.mask, _i64(1)).output(0)  # [1, 1, 1, T, S]

    def parameters(self) -> list:
        return [self.x, self.mask, self.cos, self.sin, self.pos]


# What decoder_layer() builds: the Llama decoder (BitNet's sub-norms and relu2, optional biases: Qwen 2's q/k/v,
# attention_bias, mlp_bias; Phi-3's fused projections arrive split by the checkpoint reader), full causal attention
# over the cache, RoPE default / linear / llama3. check_graph_supports refuses a model that needs anything else.
GRAPH_ARCHS = ("llama", "bitnet", "qwen2", "mistral", "phi3")
GRAPH_ROPE_TYPES = ("default", "linear", "llama3")
NOT_BUILT = {  # lowbit architecture -> what its decoder has that the graph does not build
    "gemma2": "attention and final logit soft-capping (attn_logit_softcapping, final_logit_softcapping), "
              "query_pre_attn_scalar, (1 + w) RMSNorms before and after attention and MLP, scaled embeddings, "
              "GeGLU, sliding-window layers",
    "qwen3": "RMSNorm of each q and k head (q_norm, k_norm)",
}


def check_graph_supports(cfg: dict, max_seq_len: int, where) -> None:
    """Raises ValueError naming what a model (its normalized config.json) needs that the OpenVINO graph does not
    build, rather than exporting or running it wrong: an architecture other than GRAPH_ARCHS (Gemma 2's
    soft-capping...), a sliding window shorter than the export's max_seq_len, another RoPE type, another activation."""
    from lowbit.model.config import ARCH_ALIASES, rope_type, sliding_window_active

    arch = ARCH_ALIASES.get(str(cfg.get("model_type", "")).lower(), cfg.get("model_type"))
    problems = []
    if arch not in GRAPH_ARCHS:
        problems.append(f"model_type {cfg.get('model_type')!r} ({NOT_BUILT.get(arch, 'not a Llama-style decoder')})")
    elif sliding_window_active(cfg) and int(cfg["sliding_window"]) < max_seq_len:
        problems.append(f"sliding_window {cfg['sliding_window']} (shorter than the {max_seq_len} tokens of the export; "
                        "the graph attends to the whole cache: export with --max-seq-len at most the window)")
    if rope_type(cfg) not in GRAPH_ROPE_TYPES:
        problems.append(f"RoPE type {rope_type(cfg)!r} (the graph has {', '.join(GRAPH_ROPE_TYPES)})")
    if arch in GRAPH_ARCHS and cfg.get("hidden_act", "silu") not in ACTIVATIONS:
        problems.append(f"hidden_act {cfg.get('hidden_act')!r} (the graph has {', '.join(ACTIVATIONS)})")
    if problems:
        raise ValueError(f"{where}: the OpenVINO backend does not build what this model needs: {'; '.join(problems)}. "
                         "Run it with lowbit's own backend")


def decoder_layer(inp: LayerInputs, x: ov.Output, i: int, get, cfg: dict, slots: int, sinks: list) -> ov.Output:
    """One decoder layer on x [1, T, hidden]; its cache Assigns are appended to `sinks`.

    get(name, required=True) returns a checkpoint tensor already in the export's weight type (None for a
    missing optional one: biases).
    """
    h, nh, nkv, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    g = nh // nkv
    eps = cfg["rms_norm_eps"]
    p = f"model.layers.{i}."
    sub_norms = cfg["model_type"] == "bitnet"  # BitNet: RMSNorm before o_proj and before down_proj

    def lin(x, sub):
        return linear(x, get(p + sub + ".weight"), p + sub, get(p + sub + ".bias", False))

    y = rms_norm(x, get(p + "input_layernorm.weight"), eps)
    q = op.reshape(lin(y, "self_attn.q_proj"), _i64(0, 0, nh, hd), True)  # [1, T, nh, hd]
    k = op.reshape(lin(y, "self_attn.k_proj"), _i64(0, 0, nkv, hd), True)  # [1, T, nkv, hd]
    v = op.reshape(lin(y, "self_attn.v_proj"), _i64(0, 0, nkv, hd), True)
    q = op.multiply(rope(q, inp.cos, inp.sin, hd), op.constant(np.float32(1.0 / np.sqrt(hd))))
    k = op.transpose(rope(k, inp.cos, inp.sin, hd), _i64(0, 2, 1, 3))  # [1, nkv, T, hd]
    v = op.transpose(v, _i64(0, 2, 1, 3))
    caches = [op.unsqueeze(cache_update(f"cache_{kind}_{i}", new, inp.pos, slots, sinks), _i64(2))
              for kind, new in (("k", k), ("v", v))]  # [1, nkv, 1, S, hd] each
    q5 = op.transpose(op.reshape(q, _i64(0, 0, nkv, g, hd), True), _i64(0, 2, 3, 1, 4))  # [1, nkv, g, T, hd]
    s = op.add(op.matmul(q5, caches[0], False, True), inp.mask5)  # [1, nkv, g, T, S]
    o = op.matmul(op.softmax(s, 4), caches[1], False, False)  # [1, nkv, g, T, hd]
    o = op.reshape(op.transpose(o, _i64(0, 3, 1, 2, 4)), _i64(0, 0, nh * hd), True)  # [1, T, nh*hd]
    if sub_norms:
        o = rms_norm(o, get(p + "self_attn.attn_sub_norm.weight"), eps)
    x = op.add(x, lin(o, "self_attn.o_proj")).output(0)
    y = rms_norm(x, get(p + "post_attention_layernorm.weight"), eps)
    act = ACTIVATIONS[cfg["hidden_act"]]
    m = op.multiply(act(lin(y, "mlp.gate_proj")), lin(y, "mlp.up_proj")).output(0)
    if sub_norms:
        m = rms_norm(m, get(p + "mlp.ffn_sub_norm.weight"), eps)
    return op.add(x, lin(m, "mlp.down_proj")).output(0)


def layers_model(layer_ids, get, cfg: dict, slots: int, tokens: int = 1) -> ov.Model:
    """Decoder layers `layer_ids` as one stateful model (inputs x, mask, cos, sin, pos -> x)."""
    inp = LayerInputs(cfg["hidden_size"], cfg["head_dim"], slots, tokens)
    x, sinks = inp.x.output(0), []
    for i in layer_ids:
        x = decoder_layer(inp, x, i, get, cfg, slots, sinks)
    out = op.result(x, name="x")
    out.output(0).get_tensor().set_names({"x"})
    return ov.Model([out], sinks, inp.parameters(), f"layers_{layer_ids[0]}_{layer_ids[-1]}")


def embed_model(table, hidden: int, tokens: int = 1) -> ov.Model:
    """token int64 [1, T] -> x float32 [1, T, hidden] (a Gather on the table)."""
    tok = op.parameter([1, tokens], np.int64, name="token")
    x = op.gather(weight_const(table, "model.embed_tokens.weight"), tok, _i64(0))
    out = op.result(x, name="x")
    out.output(0).get_tensor().set_names({"x"})
    return ov.Model([out], [tok], "embed")


def head_model(norm: np.ndarray, lm_head, hidden: int, eps: float, tokens: int = 1) -> ov.Model:
    """x [1, T, hidden] -> logits [1, T, vocab] (final RMSNorm + lm_head)."""
    x = op.parameter([1, tokens, hidden], np.float32, name="x")
    y = linear(rms_norm(x.output(0), norm, eps), lm_head, "lm_head")
    out = op.result(y, name="logits")
    out.output(0).get_tensor().set_names({"logits"})
    return ov.Model([out], [x], "head")
