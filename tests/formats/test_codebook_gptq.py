"""Error feedback (codebook_gptq): U^T U = H^-1, and lower output error ||(W - Wq) X^T|| than without feedback."""
import numpy as np
import pytest

from lowbit.formats.codebook import CodebookWeight
from lowbit.formats.codebook_gptq import gptq_codes, inverse_cholesky, output_error
from lowbit.formats.codebook_quant import fit_codebooks, reconstruct


def correlated_inputs(n, k, seed):
    """Activations with correlated channels and a few large ones (like an LLM's), [n, k]."""
    rng = np.random.default_rng(seed)
    mix = rng.standard_normal((k, k)) / np.sqrt(k) + np.eye(k)
    x = rng.standard_normal((n, k)) @ mix
    x[:, rng.choice(k, size=max(1, k // 16), replace=False)] *= 6.0
    return x.astype(np.float32)


def test_inverse_cholesky_is_upper_and_inverts():
    x = correlated_inputs(300, 40, 1)
    h = x.T.astype(np.float64) @ x / 300
    h[7, :] = h[:, 7] = 0.0  # a dead input
    u = inverse_cholesky(h, 0.01)
    assert np.allclose(np.tril(u, -1), 0.0)
    hd = h.copy()
    hd[7, 7] = 1.0
    hd[np.diag_indices(40)] += 0.01 * np.mean(np.diag(hd))
    assert np.allclose(u.T @ u, np.linalg.inv(hd), rtol=1e-6, atol=1e-9)
    with pytest.raises(ValueError, match="square"):
        inverse_cholesky(h[:5])


@pytest.mark.parametrize("m,v,b,k", [(1, 4, 6, 100), (2, 4, 4, 96), (2, 8, 5, 64)])
def test_error_feedback_lowers_output_error(m, v, b, k):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, k)).astype(np.float32)
    x = correlated_inputs(400, k, 2)
    h = x.T.astype(np.float64) @ x / x.shape[0]
    idx, s, books = fit_codebooks(w, m, v, b, 32, seed=0, iters=2, importance=np.diag(h).copy())
    kp = idx.shape[1] * v

    def wq(i, sc):
        return (reconstruct(books, i.reshape(-1, m)).reshape(48, kp) * np.repeat(sc, 32, axis=1)[:, :kp])[:, :k]

    base = output_error(w, wq(idx, s), h)
    idx_f, s_f = gptq_codes(w, h, books, 32, beam=4)
    fed = output_error(w, wq(idx_f, s_f), h)
    assert fed < 0.95 * base  # same codebooks and bits: the feedback alone (real layers: 2-3x lower)
    idx_a, s_a = gptq_codes(w, h, books, 32, beam=4, act_order=True)
    assert output_error(w, wq(idx_a, s_a), h) < 0.95 * base
    assert np.isclose(base, np.sum(((w - wq(idx, s)) @ x.T.astype(np.float64)) ** 2) / x.shape[0], rtol=1e-6)
    # through the format: hessian= gives the fed-back codes, deterministic
    a = CodebookWeight.quantize(w, m=m, v=v, b=b, g=32, iters=2, hessian=h, beam=4)
    c = CodebookWeight.quantize(w, m=m, v=v, b=b, g=32, iters=2, hessian=h, beam=4)
    assert np.array_equal(a.codes, c.codes) and np.array_equal(a.scale, c.scale)
    assert output_error(w, a.dequantize(), h) < base
    # fixed scales (PV-tuning's discrete step): act-order's own scales give its codes back; others are kept as given
    idx_s, s_s = gptq_codes(w, h, books, 32, beam=4, act_order=True, scales=s_a)
    assert np.array_equal(idx_s, idx_a) and np.array_equal(s_s, s_a)
    other = (s_a * 1.25).astype(np.float16).astype(np.float32)
    idx_o, s_o = gptq_codes(w, h, books, 32, beam=4, act_order=True, scales=other)
    assert np.array_equal(s_o, other) and not np.array_equal(idx_o, idx_a)
    with pytest.raises(ValueError, match="scales"):
        gptq_codes(w, h, books, 32, scales=s_a[:, :1])


def test_bad_hessian_is_refused():
    w = np.ones((8, 16), np.float32)
    with pytest.raises(ValueError, match="hessian"):
        CodebookWeight.quantize(w, m=1, v=4, b=2, g=16, hessian=np.eye(15))
    with pytest.raises(ValueError, match="non-finite"):
        inverse_cholesky(np.full((4, 4), np.nan))


def test_refine_codebooks_never_raises_the_output_error():
    from lowbit.formats.codebook_gptq import refine_codebooks

    rng = np.random.default_rng(3)
    w = rng.standard_normal((40, 64)).astype(np.float32)
    x = correlated_inputs(300, 64, 4)
    h = x.T.astype(np.float64) @ x / 300
    idx, s, books = fit_codebooks(w, 2, 4, 3, 32, iters=1, importance=np.diag(h).copy())
    new = refine_codebooks(w, h, idx, s, books, 32, steps=6)

    def err(bk):
        return output_error(w, (reconstruct(bk, idx.reshape(-1, 2)).reshape(40, 64) * np.repeat(s, 32, axis=1)), h)
    assert new.shape == books.shape and np.array_equal(new, new.astype(np.float16).astype(np.float32))
    assert err(new) < err(books)  # the diagonal-weighted fit is not the output-error optimum
