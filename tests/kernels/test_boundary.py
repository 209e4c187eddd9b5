"""Every native entry point refuses bad input with a clear ValueError before any arithmetic: wrong dtypes,
shapes, lengths, group sizes (group=0 used to be a SIGFPE), accumulator overflow, and arrays it would have
had to copy (a converted output was filled and thrown away; a converted array the decoder keeps dangled)."""
import gc

import numpy as np
import pytest

from lowbit import _native
from lowbit.formats import quantize
from lowbit.formats.base import Activations
from lowbit.model import Model
from lowbit.model.dummy import dummy_weights
from lowbit.model.kv_cache import kv_kind
from lowbit.model.native import NativeDecoder, linear_tuple

M, K = 70, 100  # odd shapes: one partial row block, K padded to 128


@pytest.fixture(scope="module")
def int4():
    w = np.random.default_rng(0).standard_normal((M, K)).astype(np.float32)
    pw = quantize(w, "int4")
    q, sx, sq = Activations(np.ones((3, K), np.float32)).int8(pw.kp, pw.group)
    return pw, q, sx, sq


@pytest.fixture(scope="module")
def tq1():
    w = np.random.default_rng(1).standard_normal((M, K)).astype(np.float32)
    pw = quantize(w, "tq1")
    q, sx, sq = Activations(np.ones((2, K), np.float32)).int8(pw.kp, pw.group)
    return pw, q, sx, sq


def y_for(n, m=M):
    return np.zeros((n, m), np.float32)


def gemm_int_args(pw, acts, **over):
    q, sx, sq = acts
    a = dict(codes=pw.codes, scale=pw._scale_u16, offset=pw._offset_u16, zc=float(pw.zc or 0.0), bits=pw.bits,
             M=pw.shape[0], Kp=pw.kp, group=pw.group, q=q, sx=sx, sumx=sq, y=y_for(q.shape[0]))
    a.update(over)
    return a


def test_gemm_int_accepts_good_input(int4):
    pw, q, sx, sq = int4
    a = gemm_int_args(pw, (q, sx, sq))
    _native.gemm_int(**a)
    np.testing.assert_allclose(a["y"], pw.matmul(np.ones((3, K), np.float32)), rtol=1e-6)


@pytest.mark.parametrize("over, msg", [
    (dict(group=0), "group must be a positive multiple of 32"),
    (dict(group=-32), "group must be a positive multiple of 32"),
    (dict(group=48), "group must be a positive multiple of 32"),
    (dict(bits=3), "bits must be 1, 2, 4 or 8"),
    (dict(M=0), "M must be"),
    (dict(M=M + 64), "packed codes have"),
    (dict(Kp=100), "Kp must be a positive multiple of 64"),
    (dict(Kp=0), "Kp must be a positive multiple of 64"),
    (dict(Kp=1 << 40), "Kp must be"),
    (dict(y=np.zeros((3, M), np.float64)), "output y must be a writable C-contiguous float32"),
    (dict(y=np.zeros((3, 2 * M), np.float32)[:, ::2]), "not C-contiguous"),
    (dict(y=np.zeros((3, M + 1), np.float32)), "output y must be \\[N, M\\]"),
    (dict(y=np.zeros((2, M), np.float32)), "output y must be \\[N, M\\]"),
    (dict(codes=np.zeros(10, np.uint8)), "packed codes have 10 bytes"),
    (dict(codes=np.zeros(10, np.int8)), "packed codes must be a C-contiguous uint8"),
    (dict(scale=np.zeros(3, np.uint16)), "scales have 3 values"),
    (dict(scale=np.zeros(3, np.float16)), "scales .* must be a C-contiguous uint16"),
    (dict(q=np.zeros((3, 64), np.int8)), "activations q must be \\[N, Kp=128\\]"),
    (dict(q=np.zeros((3, 128), np.float32)), "activations q must be a C-contiguous int8"),
    (dict(sx=np.zeros((3, 5), np.float32)), "activation scales and sums must be \\[N=3, G=4\\]"),
    (dict(sumx=np.zeros((2, 1), np.int32)), "activation scales and sums must be"),
    (dict(sumx=np.zeros((3, 1), np.int64)), "activation sums sumx must be a C-contiguous int32"),
    (dict(q=np.full((3, 128), -128, np.int8)), "activations q must lie in \\[-127, 127\\]"),
])
def test_gemm_int_rejects(int4, over, msg):
    pw, q, sx, sq = int4
    with pytest.raises(ValueError, match=msg):
        _native.gemm_int(**gemm_int_args(pw, (q, sx, sq), **over))


def test_offsets_must_match_scales():
    w = np.random.default_rng(2).standard_normal((M, K)).astype(np.float32)
    pw = quantize(w, "int2")  # asymmetric: stores offsets
    assert pw._offset_u16 is not None
    q, sx, sq = Activations(np.ones((1, K), np.float32)).int8(pw.kp, pw.group)
    with pytest.raises(ValueError, match="offsets must match the scales"):
        _native.gemm_int(**gemm_int_args(pw, (q, sx, sq), offset=pw._offset_u16[:-1]))


def test_int32_accumulator_bound_is_checked_where_the_weight_is_built():
    """group * 255 * 127 must stay below 2^31 for 8-bit codes: a group of 66560 would overflow."""
    kp = 66560
    codes = np.zeros(kp * 64, np.uint8)
    scale = np.zeros(64, np.uint16)
    q, sx, sq = np.zeros((1, kp), np.int8), np.zeros((1, 1), np.float32), np.zeros((1, 1), np.int32)
    with pytest.raises(ValueError, match="overflows the int32 accumulators"):
        _native.gemm_int(codes, scale, None, 128.0, 8, 1, kp, kp, q, sx, sq, np.zeros((1, 1), np.float32))
    # 4-bit codes: the same group is far inside the bound (66560 * 15 * 127 < 2^31)
    _native.gemm_int(np.zeros(kp * 32, np.uint8), scale, None, 8.0, 4, 1, kp, kp, q, sx, sq, np.zeros((1, 1), np.float32))


def test_int8_groups_cannot_overflow_for_long_rows():
    """int8's default (blocks of 32) and its per-row option (one group per row up to K = 65536, then groups
    of 65536) both stay inside the bound: all-max codes times all-max activations over K = 70000 (the worst
    case, 70000 * 255 * 127 > 2^31 in one group) is exact."""
    k = 70000
    w = np.ones((1, k), np.float32)
    for group_size, want_group in ((-1, 32), (None, 65536)):
        pw = quantize(w, "int8", group_size=group_size)
        assert pw.group == want_group
        y = pw.matmul(np.ones((1, k), np.float32))
        np.testing.assert_allclose(y, [[k]], rtol=1e-3)
    with pytest.raises(ValueError, match="overflows the int32 accumulators"):
        quantize(w[:, :66600], "int8", group_size=66560)


def test_gemm_int_multi_rejects(int4):
    pw, q, sx, sq = int4
    y = y_for(3)
    _native.gemm_int_multi([pw.native_args()], pw.kp, pw.group, q, sx, sq, [y])
    with pytest.raises(ValueError, match="one output per weight"):
        _native.gemm_int_multi([pw.native_args()], pw.kp, pw.group, q, sx, sq, [])
    with pytest.raises(ValueError, match="group must be a positive multiple of 32"):
        _native.gemm_int_multi([pw.native_args()], pw.kp, 0, q, sx, sq, [y])
    with pytest.raises(ValueError, match="each weight \\(codes, scale, offset, zc, bits, M\\)"):
        _native.gemm_int_multi([pw.native_args()[:5]], pw.kp, pw.group, q, sx, sq, [y])
    with pytest.raises(ValueError, match="output y must be \\[N, M\\]"):
        _native.gemm_int_multi([pw.native_args()], pw.kp, pw.group, q, sx, sq, [y_for(3, M + 1)])
    with pytest.raises(ValueError, match="weights must be a list or tuple"):
        _native.gemm_int_multi(pw.native_args()[0], pw.kp, pw.group, q, sx, sq, [y])


def test_quantize_act_rejects():
    x = np.ones((2, 100), np.float32)
    q, s, sm = np.empty((2, 128), np.int8), np.empty((2, 1), np.float32), np.empty((2, 1), np.int32)
    _native.quantize_act(x, q, s, sm, 128)
    with pytest.raises(ValueError, match="group must be positive"):
        _native.quantize_act(x, q, s, sm, 0)
    with pytest.raises(ValueError, match="q must be \\[N, Kp >= K\\]"):
        _native.quantize_act(x, np.empty((2, 64), np.int8), s, sm, 64)
    with pytest.raises(ValueError, match="scale must be \\[N, G"):
        _native.quantize_act(x, q, np.empty((2, 2), np.float32), sm, 128)
    with pytest.raises(ValueError, match="sum must be \\[N, G"):
        _native.quantize_act(x, q, s, np.empty((1, 1), np.int32), 128)
    with pytest.raises(ValueError, match="x must be a C-contiguous float32"):
        _native.quantize_act(x.astype(np.float64), q, s, sm, 128)


def test_gemm_float_rejects():
    w = np.ones((10, 33), np.float32)
    x, y = np.ones((2, 33), np.float32), np.zeros((2, 10), np.float32)
    _native.gemm_float(w, x, y)
    np.testing.assert_allclose(y, 33.0)
    with pytest.raises(ValueError, match="float32 or bf16 stored as uint16"):
        _native.gemm_float(w.astype(np.float64), x, y)
    with pytest.raises(ValueError, match="x must be \\[N, K\\]"):
        _native.gemm_float(w, np.ones((2, 32), np.float32), y)
    with pytest.raises(ValueError, match="output y must be \\[N, M\\]"):
        _native.gemm_float(w, x, np.zeros((2, 9), np.float32))
    with pytest.raises(ValueError, match="must not be empty"):
        _native.gemm_float(np.ones((0, 33), np.float32), x, np.zeros((2, 0), np.float32))


def test_bench_entry_points_reject():
    w = np.random.default_rng(3).standard_normal((M, K)).astype(np.float32)
    pw = quantize(w, "int4")
    q, sx, sq = Activations(np.ones((1, K), np.float32)).int8(pw.kp, pw.group)
    copy = (pw.codes, pw._scale_u16, pw._offset_u16)
    assert _native.bench_int([copy], 8.0, 4, M, pw.kp, pw.group, q, sx, sq, y_for(1), 2) >= 0
    with pytest.raises(ValueError, match="group must be a positive multiple of 32"):  # was a SIGFPE
        _native.bench_int([copy], 8.0, 4, M, pw.kp, 0, q, sx, sq, y_for(1), 1)
    with pytest.raises(ValueError, match="output y must be \\[N, M\\]"):  # was unchecked
        _native.bench_int([copy], 8.0, 4, M, pw.kp, pw.group, q, sx, sq, y_for(1, 3), 1)
    with pytest.raises(ValueError, match="activations q must be"):
        _native.bench_int([copy], 8.0, 4, M, pw.kp, pw.group, q[:, :64].copy(), sx, sq, y_for(1), 1)
    with pytest.raises(ValueError, match="no weights"):
        _native.bench_int([], 8.0, 4, M, pw.kp, pw.group, q, sx, sq, y_for(1), 1)
    f = np.ones((M, K), np.float32)
    x = np.ones((1, K), np.float32)
    assert _native.bench_float([f], x, y_for(1), 1) >= 0
    with pytest.raises(ValueError, match="x must be \\[N, K\\]"):  # was unchecked
        _native.bench_float([f], np.ones((1, K - 1), np.float32), y_for(1), 1)
    with pytest.raises(ValueError, match="output y must be \\[N, M\\]"):
        _native.bench_float([f], x, y_for(1, 1), 1)
    with pytest.raises(ValueError, match="every copy must have the first one's shape"):
        _native.bench_float([f, np.ones((M - 1, K), np.float32)], x, y_for(1), 1)
    with pytest.raises(ValueError, match="float32 or bf16"):
        _native.bench_float([f.astype(np.float64)], x, y_for(1), 1)


def test_gemm_tq1_rejects(tq1):
    pw, q, sx, sq = tq1
    args = [pw.native_args()]
    path, _ = _native.gemm_tq1(args, M, pw.kp, pw.group, q, sx, sq, y_for(2))
    assert path in ("scalar", "avx2", "avx512-vbmi")
    for group in (0, -20, 30):
        with pytest.raises(ValueError, match="group must be a positive multiple of 20"):
            _native.gemm_tq1(args, M, pw.kp, group, q, sx, sq, y_for(2))
    with pytest.raises(ValueError, match="Kp must be a positive multiple of 20"):
        _native.gemm_tq1(args, M, pw.kp + 1, pw.group, q, sx, sq, y_for(2))
    with pytest.raises(ValueError, match="tq1 packed codes have"):
        _native.gemm_tq1([(pw.codes[:-1], pw._scale_u16)], M, pw.kp, pw.group, q, sx, sq, y_for(2))
    with pytest.raises(ValueError, match="tq1 scales have"):
        _native.gemm_tq1([(pw.codes, pw._scale_u16[:5])], M, pw.kp, pw.group, q, sx, sq, y_for(2))
    with pytest.raises(ValueError, match="output y must be"):
        _native.gemm_tq1(args, M, pw.kp, pw.group, q, sx, sq, y_for(3))
    with pytest.raises(ValueError, match="iters must be >= 1"):
        _native.gemm_tq1(args, M, pw.kp, pw.group, q, sx, sq, y_for(2), 0)


def test_attention_prefill_rejects():
    n, heads, kv, hd, ctx = 3, 4, 2, 8, 16
    q = np.ones((n, heads, hd), np.float32)
    kc, vc = np.zeros((kv, ctx, hd), np.float32), np.zeros((kv, ctx, hd), np.float32)
    out = np.zeros((n, heads * hd), np.float32)
    _native.attention_prefill(q, kc, vc, 0, out)
    with pytest.raises(ValueError, match="positions pos..pos\\+n-1 must lie inside the cache"):
        _native.attention_prefill(q, kc, vc, ctx - 2, out)
    with pytest.raises(ValueError, match="positions"):
        _native.attention_prefill(q, kc, vc, -1, out)
    with pytest.raises(ValueError, match="k and v caches must match"):
        _native.attention_prefill(q, kc, vc.astype(np.float16).view(np.uint16), 0, out)
    with pytest.raises(ValueError, match="heads % kv_heads == 0"):
        _native.attention_prefill(np.ones((n, 3, hd), np.float32), kc, vc, 0, np.zeros((n, 3 * hd), np.float32))
    with pytest.raises(ValueError, match="out must be \\[n, heads\\*hd\\]"):
        _native.attention_prefill(q, kc, vc, 0, np.zeros((n, heads * hd + 1), np.float32))
    with pytest.raises(ValueError, match="float32, float16 .* or int8"):
        _native.attention_prefill(q, kc.astype(np.float64), vc.astype(np.float64), 0, out)


def test_small_entry_points_reject():
    with pytest.raises(ValueError, match="out must have x's length"):
        _native.f32_to_f16(np.ones(4, np.float32), np.empty(3, np.uint16))
    ro = np.empty(4, np.uint16)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out must be a writable .* read-only"):
        _native.f32_to_f16(np.ones(4, np.float32), ro)
    with pytest.raises(ValueError, match="passes must be >= 0"):
        _native.read_bandwidth(np.zeros(1024, np.uint8), -1)
    with pytest.raises(ValueError, match="iters must be >= 1"):
        _native.pool_overhead(0)
    for n in (0, -1, 100000):
        with pytest.raises(ValueError, match="set_threads: n must be in"):
            _native.set_threads(n)


# ---- the native decoder ----

def cfg():
    return dict(model_type="llama", hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=50, max_position_embeddings=64, rms_norm_eps=1e-5,
                rope_theta=10000.0, hidden_act="silu", tie_word_embeddings=False)


@pytest.fixture(scope="module")
def model():
    c = cfg()
    return Model.from_weights(c, dummy_weights(c), format="int4", max_context=16)


def new_decoder(model, **over):
    a = model.args
    args = dict(hidden=a.hidden_size, n_heads=a.num_attention_heads, n_kv=a.num_key_value_heads, hd=a.head_dim,
                inter=a.intermediate_size, max_ctx=model.cache.max_ctx, eps=1e-5, act=0,
                C=np.ascontiguousarray(model.rope.C, np.float32), S=np.ascontiguousarray(model.rope.S, np.float32),
                kv=kv_kind(model.cache.k.dtype))
    args.update(over)
    return _native.Decoder(*args.values())


def layer_args(model, **over):
    blk = model.layers[0]
    lins = tuple(linear_tuple(getattr(blk, n)) for n in ("q", "k", "v", "o", "gate", "up", "down"))
    kv = (blk.kc.view(np.uint16), blk.vc.view(np.uint16)) if blk.kc.dtype == np.float16 else (blk.kc, blk.vc)
    a = dict(linears=lins, ln1=blk.ln1, ln2=blk.ln2, attn_sub=blk.attn_sub, ffn_sub=blk.ffn_sub, kc=kv[0], vc=kv[1])
    a.update(over)
    return a


@pytest.mark.parametrize("over, msg", [
    (dict(n_kv=0), "head counts must be positive"),  # was a SIGFPE (heads % 0)
    (dict(n_kv=3), "heads must be a multiple of kv heads"),
    (dict(hd=7), "head_dim must be even"),
    (dict(max_ctx=0), "max_ctx must be in"),
    (dict(max_ctx=17), "rope C must be \\[>= max_ctx, hd\\]"),
    (dict(act=5), "act must be 0"),
    (dict(kv=3), "kv must be 0 \\(float32 cache\\), 1 \\(float16\\) or 2 \\(int8"),
    (dict(C=np.ones((16, 16))), "rope C must be a C-contiguous float32"),
])
def test_decoder_init_rejects(model, over, msg):
    with pytest.raises(ValueError, match=msg):
        new_decoder(model, **over)


def test_decoder_refuses_to_decode_before_the_output_layer_is_set(model):
    dec = new_decoder(model)
    dec.add_layer(**layer_args(model))
    with pytest.raises(ValueError, match="output layer is not set"):
        dec.decode(np.zeros(64, np.float32), 0, np.zeros(50, np.float32))


def test_decoder_add_layer_rejects(model):
    dec = new_decoder(model)
    blk = model.layers[0]
    good = layer_args(model)
    lins = list(good["linears"])
    bad_bias = list(lins)
    bad_bias[0] = lins[0][:10] + (np.zeros(3, np.float32),)  # q_proj bias of 3 values for M = 64
    cases = [
        (dict(ln1=blk.ln1[:-1].copy()), "ln1 has 63 values, expected 64"),
        (dict(ln2=blk.ln2.astype(np.float64)), "ln2 must be a C-contiguous float32"),
        (dict(attn_sub=np.ones(5, np.float32)), "attn_sub has 5 values"),
        (dict(linears=tuple(bad_bias)), "q_proj: bias has 3 values, expected M = 64"),
        (dict(linears=tuple(lins[:6])), "linears \\(q, k, v, o, gate, up, down\\) must be a tuple of 7"),
        (dict(linears=(lins[1],) + tuple(lins[1:])), "q_proj must be \\[heads\\*hd, hidden\\]"),
        (dict(linears=tuple(lins[:5]) + (lins[0],) + (lins[6],)), "gate/up_proj must be"),
        (dict(linears=(("nope",),) + tuple(lins[1:])), "unknown projection kind 'nope'"),
        (dict(linears=(lins[0][:7],) + tuple(lins[1:])), "q_proj \\('int', codes"),
        (dict(kc=np.zeros((2, 16, 16), np.float64)), "k and v caches must be float16"),  # the decoder's KV dtype
        (dict(kc=np.zeros((2, 16, 16), np.float32)), "k and v caches must be float16"),
        (dict(kc=np.zeros((2, 16, 20), np.int8), vc=np.zeros((2, 16, 20), np.int8)), "must be float16"),
        (dict(kc=good["kc"][:, :8].copy()), "k and v caches must be \\[kv_heads, max_ctx, hd\\]"),
    ]
    for over, msg in cases:
        with pytest.raises(ValueError, match=msg):
            dec.add_layer(**layer_args(model, **over))
    assert dec.n_layers == 0  # nothing half-added


def test_decoder_set_output_and_decode_reject(model):
    dec = new_decoder(model)
    dec.add_layer(**layer_args(model))
    head = linear_tuple(model.lm_head)
    with pytest.raises(ValueError, match="final norm has 10 values, expected 64"):
        dec.set_output(np.ones(10, np.float32), head)
    with pytest.raises(ValueError, match="lm_head must be \\[vocab, hidden\\]"):
        dec.set_output(model.norm, linear_tuple(model.layers[0].down))  # K = intermediate
    dec.set_output(model.norm, head)
    x, logits = model.embed([3])[0].copy(), np.zeros(50, np.float32)
    with pytest.raises(ValueError, match="logits must be \\[vocab\\] = \\[50\\], got 49"):
        dec.decode(x, 0, np.zeros(49, np.float32))  # was an out-of-bounds write
    with pytest.raises(ValueError, match="logits must be a writable C-contiguous float32"):
        dec.decode(x, 0, np.zeros(50, np.float64))  # was written into a converted copy and lost
    with pytest.raises(ValueError, match="x must be \\[hidden\\]"):
        dec.decode(x[:-1].copy(), 0, logits)
    with pytest.raises(ValueError, match="position outside the cache"):
        dec.decode(x, 16, logits)
    dec.decode(x, 0, logits)
    assert np.isfinite(logits).all() and np.abs(logits).max() > 0


def test_decoder_keeps_the_arrays_it_points_into():
    """Built from temporaries that Python drops at once: the decoder's references keep them alive, and
    decoding gives what a decoder over arrays the caller kept gives."""
    c = cfg()
    model = Model.from_weights(c, dummy_weights(c), format="int4", max_context=16)
    ref = NativeDecoder.build(model)
    x = model.embed([5])[0]
    want = ref.decode(x.copy(), 0)

    dec = new_decoder(model, C=np.array(model.rope.C, np.float32, copy=True), S=np.array(model.rope.S, np.float32, copy=True))
    a = layer_args(model)
    lins = tuple(tuple(v.copy() if isinstance(v, np.ndarray) else v for v in t) for t in a["linears"])
    dec.add_layer(lins, a["ln1"].copy(), a["ln2"].copy(), None, None, a["kc"], a["vc"])
    head = linear_tuple(model.lm_head)
    dec.set_output(model.norm.copy(), tuple(v.copy() if isinstance(v, np.ndarray) else v for v in head))
    del lins, head
    gc.collect()
    junk = [np.full(4096, 7.0, np.float32) for _ in range(200)]  # reuse any freed memory
    got = np.zeros(50, np.float32)
    dec.decode(x.copy(), 0, got)
    del junk
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
