"""Native GGUF block decoders (kernels/gguf_decode.cpp) against gguf-py's gguf.quants.dequantize: random
blocks of every type, odd row counts, extreme and non-finite float16 scales, a row permutation, on every ISA."""
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from lowbit import _native
from lowbit.io import gguf_blocks

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning", "ignore:overflow:RuntimeWarning")

TYPES = [GGMLQuantizationType[n] for n in gguf_blocks.NATIVE_TYPES]
# byte offsets of each type's float16 scales in its block (d, and m / dmin)
SCALES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q2_K": (80, 82),
          "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "TQ1_0": (52,), "TQ2_0": (64,)}
EXTREME = np.array([0.0, -0.0, 6.1e-5, 5.96e-8, -5.96e-8, 65504.0, -65504.0, 1e-3, -2.5], np.float16)


def random_blocks(qtype, rows: int, blocks_per_row: int, rng, scales="normal") -> np.ndarray:
    """uint8 [rows, blocks_per_row * bytes]: random bytes with the scales set (normal / extreme / any bits)."""
    _, size = GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (rows * blocks_per_row, size), dtype=np.uint8)
    for off in SCALES[qtype.name]:
        if scales == "normal":
            v = (rng.standard_normal(len(b)) * 0.01).astype(np.float16)
        elif scales == "extreme":
            v = rng.choice(EXTREME, len(b))
        else:  # any bits: NaN and Inf scales included
            v = rng.integers(0, 1 << 16, len(b), dtype=np.uint16).view(np.float16)
            v[::7] = np.float16(np.inf)
            v[3::11] = np.float16(np.nan)
        b[:, off:off + 2] = v.view(np.uint8).reshape(-1, 2)
    return b.reshape(rows, -1)


def native(data, qtype, m, k, rows=None):
    out = np.empty(m * k, np.float32)
    finite = _native.gguf_dequantize(data, int(qtype), k, rows, m, out)
    return out.reshape(m, k), finite


def assert_same_bits(got, want):
    """Bit for bit, NaN where gguf-py has NaN (x86 keeps the first NaN operand's payload: not compared)."""
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint32)[~nan], want.view(np.uint32)[~nan])


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("scales", ["normal", "extreme", "any"])
def test_dequantize_matches_gguf_py(isa, qtype, scales):
    rng = np.random.default_rng([int(qtype), len(scales)])
    block, _ = GGML_QUANT_SIZES[qtype]
    for rows, nb in ((1, 1), (7, 3), (37, 2)):  # odd row counts: partial thread-pool tasks
        data = random_blocks(qtype, rows, nb, rng, scales)
        want = quants.dequantize(data, qtype).reshape(rows, nb * block)
        got, finite = native(data, qtype, rows, nb * block)
        assert_same_bits(got, want)
        assert finite == bool(np.isfinite(want).all())


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_row_index(isa, qtype):
    """Output row m is source row rows[m] (the Q/K un-permutation, done in the decode)."""
    rng = np.random.default_rng(int(qtype))
    block, _ = GGML_QUANT_SIZES[qtype]
    data = random_blocks(qtype, 24, 2, rng)
    perm = rng.permutation(24)
    want = quants.dequantize(data, qtype).reshape(24, 2 * block)[perm]
    got = gguf_blocks.dequantize(data, qtype, 24, 2 * block, perm)
    assert_same_bits(got, want)


@pytest.mark.parametrize("name", ["TQ1_0", "TQ2_0"])
@pytest.mark.parametrize("scales", ["normal", "extreme"])
def test_decode_ternary_is_dequantize_over_d(name, scales):
    """(t, d) is exactly the reference (x / d, t = 0 where d is 0); TQ2_0's code 3 is refused."""
    qtype = GGMLQuantizationType[name]
    rng = np.random.default_rng(5)
    data = random_blocks(qtype, 9, 2, rng, scales)
    if name == "TQ2_0":  # codes 0..2 only: 3 is refused below
        q = data.reshape(-1, 66)[:, :64]
        codes = np.unpackbits(q[..., None], axis=-1, bitorder="little").reshape(*q.shape, 4, 2)
        codes[..., 0] &= ~codes[..., 1]  # 11 -> 10
        q[:] = np.packbits(codes.reshape(*q.shape, 8), axis=-1, bitorder="little")[..., 0]
    x = quants.dequantize(data, qtype).reshape(9, 512)
    d = data.reshape(9, 2, -1)[:, :, -2:].copy().view(np.float16)[:, :, 0].astype(np.float32)
    dd = np.repeat(d, 256, axis=1)
    want = np.rint(np.divide(x, dd, out=np.zeros_like(x), where=dd != 0)).astype(np.int8)
    t, dn = gguf_blocks.decode_ternary(data, qtype, 9, 512)
    np.testing.assert_array_equal(t, want)
    np.testing.assert_array_equal(dn.view(np.uint32), d.view(np.uint32))
    if name == "TQ2_0":
        data[0, 0] = 0xFF  # four codes 3 in a block with a normal scale
        data[0, 64:66] = np.array([1.0], np.float16).view(np.uint8)
        with pytest.raises(ValueError, match="outside"):
            gguf_blocks.decode_ternary(data, qtype, 9, 512)


def test_bad_input_is_a_clear_error():
    data = np.zeros((4, 20), np.uint8)
    out = np.empty(4 * 32, np.float32)
    with pytest.raises(ValueError, match="unsupported GGML type"):
        _native.gguf_dequantize(data, 99, 32, None, 4, out)
    with pytest.raises(ValueError, match="multiple of the block size"):
        _native.gguf_dequantize(data, int(GGMLQuantizationType.Q4_1), 33, None, 4, out)
    with pytest.raises(ValueError, match="fewer than M rows"):
        _native.gguf_dequantize(data, int(GGMLQuantizationType.Q4_1), 32, None, 5, np.empty(5 * 32, np.float32))
    with pytest.raises(ValueError, match="out of range"):
        _native.gguf_dequantize(data, int(GGMLQuantizationType.Q4_1), 32, np.array([0, 1, 2, 4]), 4, out)
    with pytest.raises(ValueError, match="whole number of rows"):
        _native.gguf_dequantize(data[:, :19].copy(), int(GGMLQuantizationType.Q4_1), 32, None, 3, out[:96])
    with pytest.raises(ValueError, match="NaN or Inf"):
        bad = data.copy()
        bad[2, 0:2] = np.array([np.inf], np.float16).view(np.uint8)
        bad[2, 4] = 1
        gguf_blocks.dequantize(bad, GGMLQuantizationType.Q4_1, 4, 32)
