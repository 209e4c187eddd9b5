"""Error feedback for codebook quantization (GPTQ over vectors, as GPTVQ and AQLM do): codes chosen input
segment by input segment, each segment's error pushed onto the inputs not yet quantized through the Cholesky
factor of the inverse input Hessian, so that the layer's output error ||(W - Wq) X^T||^2 is what is minimized.

    idx, scales = gptq_codes(w, H, books, group=128)   # w [M, K], H = X^T X / n [K, K], books [m, 2^b, v]

With U the upper Cholesky factor of H^-1 (dampened: H + damp * mean(diag H) * I), segment B (v columns) is
quantized with the metric ||(w_B - q_B) U_BB^-1||^2 (the OBQ cost of the block given that every later column
may still move) and the later columns take W[:, rest] -= (w_B - q_B) U_BB^-1 U[B, rest] (lazily, one scale
group at a time, as GPTQ does). Scales are the RMS of each (row, group) of the weights as updated when the
group is reached. The codebooks stay fixed (fit them first: codebook_quant.fit_codebooks).
"""
from __future__ import annotations

import numpy as np

from lowbit.formats.codebook_beam import assign, search_codes

DAMP = 0.01


def inverse_cholesky(h: np.ndarray, damp: float = DAMP) -> np.ndarray:
    """H [K, K] (symmetric PSD) -> U upper triangular with U^T U = (H + damp*mean(diag)*I)^-1 (float64).
    Dead inputs (H[k, k] == 0) get H[k, k] = 1 (their weights are then irrelevant to the output)."""
    h = np.array(h, np.float64, copy=True)
    if h.ndim != 2 or h.shape[0] != h.shape[1]:
        raise ValueError(f"the Hessian must be square [K, K], got {h.shape}")
    if not np.all(np.isfinite(h)):
        raise ValueError("the Hessian has non-finite entries")
    diag = np.diag(h).copy()
    dead = diag <= 0
    h[dead, :] = 0.0
    h[:, dead] = 0.0
    h[dead, dead] = 1.0
    mean = float(np.mean(np.diag(h)))
    h[np.diag_indices_from(h)] += damp * mean
    # U = P L'^-1 P with L' the Cholesky factor of P H P (P reverses the order): upper, and U^T U = H^-1
    # (one Cholesky and one triangular inverse instead of an inverse and two Cholesky factorizations)
    flip = h[::-1, ::-1]
    for extra in (0.0, 0.1, 1.0, 10.0):  # more dampening only if the factorization fails
        try:
            lower = np.linalg.cholesky(flip + extra * mean * np.eye(h.shape[0]))
            break
        except np.linalg.LinAlgError:
            continue
    else:
        raise ValueError("the Hessian is not positive definite even after dampening")
    return np.ascontiguousarray(_lower_inverse(lower)[::-1, ::-1])


def _lower_inverse(lower: np.ndarray) -> np.ndarray:
    try:
        from scipy.linalg.lapack import dtrtri
    except ImportError:  # numpy alone: a general inverse (slower, same result)
        return np.tril(np.linalg.inv(lower))
    inv, info = dtrtri(lower, lower=1)
    if info:
        raise ValueError(f"the Hessian's Cholesky factor is singular (LAPACK dtrtri info {info})")
    return np.tril(inv)


def _greedy(x: np.ndarray, books: np.ndarray) -> np.ndarray:
    """Residual (one codebook after the other) codes: the beam search's start. x [N, v] -> uint8 [N, m]."""
    idx = np.empty((x.shape[0], books.shape[0]), np.uint8)
    resid = x.copy()
    for i in range(books.shape[0]):
        idx[:, i] = assign(resid, books[i], None)
        resid -= books[i][idx[:, i]]
    return idx


def _code(x: np.ndarray, books: np.ndarray, beam: int) -> np.ndarray:
    if books.shape[0] == 1:
        return assign(x, books[0], None)[:, None]
    return search_codes(x, books, _greedy(x, books), None, beam)


def _rms(w: np.ndarray) -> np.ndarray:
    s = np.sqrt((w.astype(np.float64) ** 2).mean(axis=1))
    s = np.maximum(s, 1e-8 + 1e-3 * s.max(initial=0.0))
    return s.astype(np.float16).astype(np.float32)


def gptq_codes(w: np.ndarray, h: np.ndarray, books: np.ndarray, group: int, beam: int = 8,
               damp: float = DAMP) -> tuple[np.ndarray, np.ndarray]:
    """w float32 [M, K], h [K, K] the input Hessian (X^T X / n), books [m, 2^b, v] (float16-exact) ->
    (codes uint8 [M, Kp/v, m], scales float32 [M, G] float16-rounded), Kp = K rounded up to v."""
    rows, k = w.shape
    m, nc, v = books.shape
    if h.shape != (k, k):
        raise ValueError(f"the Hessian must be [{k}, {k}] for a weight of {k} inputs, got {h.shape}")
    if group % v:
        raise ValueError(f"group {group} must be a multiple of v={v}")
    kp = -(-k // v) * v
    wp = np.zeros((rows, kp), np.float64)
    wp[:, :k] = w
    hp = np.zeros((kp, kp), np.float64)
    hp[:k, :k] = h
    u = inverse_cholesky(hp, damp)
    dead = np.diag(hp) <= 0
    wp[:, dead] = 0.0
    nseg, ngroups = kp // v, -(-kp // group)
    idx = np.empty((rows, nseg, m), np.uint8)
    scales = np.empty((rows, ngroups), np.float32)
    books64 = books.astype(np.float64)
    for gi in range(ngroups):
        g0, g1 = gi * group, min(kp, (gi + 1) * group)
        blk = wp[:, g0:g1].copy()       # [M, g] updated within the group
        err = np.empty_like(blk)         # [M, g] the scaled errors (w - q) U_BB^-1
        s = _rms(blk)
        scales[:, gi] = s
        for c0 in range(g0, g1, v):
            c1 = c0 + v
            uinv = np.linalg.inv(u[c0:c1, c0:c1])  # [v, v] upper
            x = blk[:, c0 - g0:c1 - g0] / s[:, None]  # normalized [M, v]
            code = _code((x @ uinv).astype(np.float32), (books64 @ uinv).astype(np.float32), beam)
            idx[:, c0 // v] = code
            q = books64[0][code[:, 0]]
            for i in range(1, m):
                q = q + books64[i][code[:, i]]
            e = (blk[:, c0 - g0:c1 - g0] - s[:, None] * q) @ uinv  # [M, v]
            err[:, c0 - g0:c1 - g0] = e
            blk[:, c1 - g0:] -= e @ u[c0:c1, c1:g1]
        wp[:, g1:] -= err @ u[g0:g1, g1:]
    return idx, scales


def output_error(w: np.ndarray, wq: np.ndarray, h: np.ndarray) -> float:
    """tr((W - Wq) H (W - Wq)^T) = ||(W - Wq) X^T||^2 / n for H = X^T X / n."""
    d = (np.asarray(w, np.float64) - np.asarray(wq, np.float64))
    return float(((d @ np.asarray(h, np.float64)) * d).sum())
